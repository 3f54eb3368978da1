"""Where samples come from: folders of images or arrays, ``datasets`` folders, Python iterables.

A *map-style* source has ``ids`` and ``load(i)``; it can be split into shards
and batches by index (DataLoader workers, Ray actors, ``--resume``). A Python
iterator or a ``DataLoader`` is an *iterable* source: read in order, once.

A sample is one array (the model's single input, no batch axis) or a dict
name -> array (named inputs). A sample that cannot be read or does not fit
comes back as :class:`Bad`, so the caller decides: stop naming it, or skip it.

Labels are kept beside the samples, never fed: an image folder's class
folders (``classes`` are the folder names, sorted) or a ``datasets`` ``label``
column (a ``ClassLabel``'s names are the classes).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from ..errors import LayertapError, one_line, unknown_name
from .images import IMAGE_SUFFIXES, Preprocess

ARRAY_SUFFIXES = (".npy", ".npz")


@dataclass(frozen=True)
class Bad:
    """A sample that could not be used: its source index, id and the reason."""

    index: int
    id: Any
    error: str


@dataclass(frozen=True)
class Reference:
    """Shape and dtype every sample must have (those of the first one)."""

    id: Any
    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, str]

    def to_dict(self) -> dict:
        return {"id": self.id, "shapes": {k: list(v) for k, v in self.shapes.items()}, "dtypes": dict(self.dtypes)}


class MapSource:
    """Base of the sources that can be read by index.

    Subclasses set ``kind``, ``path``, ``ids`` and implement ``_read(i)``.
    """

    kind = "sequence"
    path: str | None = None
    preprocess: Preprocess | None = None
    labels: list[int] | None = None  # per sample, when the source has them
    classes: list[str] | None = None  # label -> class name, when known

    def __init__(self, ids: Sequence[Any]) -> None:
        self.ids = list(ids)

    def __len__(self) -> int:
        return len(self.ids)

    def _read(self, i: int) -> Any:
        raise NotImplementedError

    def load(self, i: int) -> Any:
        """Sample ``i`` as an array / dict of arrays, or :class:`Bad`."""
        try:
            return as_input(self._read(i), self.preprocess, self.ids[i])
        except LayertapError as e:
            return Bad(i, self.ids[i], str(e))
        except Exception as e:  # noqa: BLE001 - a corrupt file makes readers raise anything
            return Bad(i, self.ids[i], f"cannot read sample {self.ids[i]!r}: {type(e).__name__}: {one_line(e, first=True)}")

    def describe(self) -> dict:
        """The source as the manifest records it (its classes when it has labels)."""
        d: dict[str, Any] = {"kind": self.kind, "path": self.path}
        if self.labels is not None:
            d["classes"] = self.classes
        return d


def folder_labels(files: Sequence[str]) -> tuple[list[int] | None, list[str] | None]:
    """Labels of files that all lie in class folders (the first folder of each path), and the
    class names (sorted); ``(None, None)`` when they lie loose.

    Example:
        >>> folder_labels(["dogs/a.png", "cats/b.png", "cats/x/c.png"]), folder_labels(["a.png"])
        (([1, 0, 0], ['cats', 'dogs']), (None, None))
    """
    if not files or not all("/" in f for f in files):
        return None, None
    classes = sorted({f.split("/", 1)[0] for f in files})
    index = {c: i for i, c in enumerate(classes)}
    return [index[f.split("/", 1)[0]] for f in files], classes


class ImageFolder(MapSource):
    """PNG/JPEG/... files under a folder (recursively), ids = paths relative to it.

    Images all in sub-folders are labelled by their first folder (:func:`folder_labels`).
    """

    kind = "images"

    def __init__(self, root: Path, files: list[str], preprocess: Preprocess) -> None:
        super().__init__(files)
        self.root = root
        self.path = str(root)
        self.preprocess = preprocess
        self.labels, self.classes = folder_labels(files)

    def _read(self, i: int) -> Any:
        from PIL import Image

        with Image.open(self.root / self.ids[i]) as img:
            img.load()  # decode now: a truncated file fails here, inside the guard
            return self.preprocess.apply(img)  # type: ignore[union-attr]


class ArrayFolder(MapSource):
    """``.npy``/``.npz`` files, one sample each; an ``.npz`` with several arrays gives named inputs."""

    kind = "arrays"

    def __init__(self, root: Path, files: list[str]) -> None:
        super().__init__(files)
        self.root = root
        self.path = str(root)
        self.labels, self.classes = folder_labels(files)

    def _read(self, i: int) -> Any:
        file = self.root / self.ids[i]
        if file.suffix.lower() == ".npy":
            return np.load(file, allow_pickle=False)
        with np.load(file, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        if not arrays:
            raise LayertapError(f"sample {self.ids[i]!r} is an empty .npz")
        return next(iter(arrays.values())) if len(arrays) == 1 else arrays


class HFDataset(MapSource):
    """A Hugging Face ``datasets`` folder written by ``save_to_disk`` (or a ``datasets.Dataset``
    in memory: ``root`` None); ids are row indices.

    One column is the model's single input; several (``input_ids``, ``attention_mask``, ...)
    are named inputs, by column name. Text columns (a caption) are never inputs; the
    ``label`` column gives the labels.
    """

    kind = "datasets"

    def __init__(self, root: Path | None, ds: Any, columns: list[str], images: bool, preprocess: Preprocess | None) -> None:
        super().__init__(range(len(ds)))
        self.root = root
        self.path = None if root is None else str(root)
        self.columns = columns
        self.preprocess = preprocess if images else None
        # images as PIL (whatever format a Dataset given in memory was set to), arrays as numpy
        self.ds = ds.with_format(None) if images else ds.with_format("numpy", columns=columns)
        self.label_column = _label_column(ds, columns)
        if self.label_column is not None:
            self.labels = [int(v) for v in ds.data.column(self.label_column).to_pylist()]
            self.classes = getattr(ds.features[self.label_column], "names", None)

    def _read(self, i: int) -> Any:
        row = self.ds[i]
        return row[self.columns[0]] if len(self.columns) == 1 else {c: row[c] for c in self.columns}

    def describe(self) -> dict:
        d = {**super().describe(), "column": self.columns[0] if len(self.columns) == 1 else self.columns}
        if self.label_column is not None:
            d["label_column"] = self.label_column
        return d


class SequenceSource(MapSource):
    """A Python sequence (list, ``torch.utils.data.Dataset`` with ``len``); ids are indices."""

    kind = "sequence"

    def __init__(self, items: Any, preprocess: Preprocess | None) -> None:
        super().__init__(range(len(items)))
        self.items = items
        self.preprocess = preprocess

    def _read(self, i: int) -> Any:
        return self.items[i]


class IterSource:
    """An iterator or ``DataLoader``: read in order; ids are running indices.

    ``batched`` is True for a DataLoader: each item it yields is one batch.
    """

    path = None

    def __init__(self, items: Iterable, preprocess: Preprocess | None, batched: bool) -> None:
        self.items = items
        self.preprocess = preprocess
        self.batched = batched
        self.kind = "dataloader" if batched else "iterable"

    def describe(self) -> dict:
        return {"kind": self.kind, "path": None}

    def samples(self) -> Iterator[tuple[int, Any]]:
        """(index, sample or Bad) in order; a DataLoader's batches are split into samples."""
        index = 0
        for item in self.items:
            for sample in (_unbatch(item) if self.batched else [item]):
                try:
                    yield index, as_input(sample, self.preprocess, index)
                except LayertapError as e:
                    yield index, Bad(index, index, str(e))
                index += 1


def _unbatch(batch: Any) -> list[Any]:
    """The samples of one DataLoader batch (tensor, (inputs, labels) pair or dict)."""
    if isinstance(batch, (tuple, list)):
        batch = batch[0]
    if isinstance(batch, dict):
        n = len(next(iter(batch.values())))
        return [{k: v[i] for k, v in batch.items()} for i in range(n)]
    return list(batch)


def as_input(item: Any, preprocess: Preprocess | None, sample_id: Any) -> Any:
    """One sample as the model's input: an array, or a dict of arrays.

    Tensors become arrays, PIL images are preprocessed, and a ``(input, label)``
    pair gives its first element.

    Example:
        >>> as_input((np.zeros(2), 1), None, 0)
        array([0., 0.])
    """
    if isinstance(item, (tuple, list)) and item:
        item = item[0]
    if isinstance(item, dict):
        return {k: _array(v, preprocess, sample_id) for k, v in item.items()}
    return _array(item, preprocess, sample_id)


def _array(value: Any, preprocess: Preprocess | None, sample_id: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    if type(value).__module__.startswith("torch"):
        return value.detach().cpu().numpy()
    if type(value).__module__.startswith("PIL"):
        if preprocess is None:
            raise LayertapError(f"sample {sample_id!r} is an image but no preprocessing is known; pass image_size=... (--image-size)")
        return preprocess.apply(value)
    try:
        arr = np.asarray(value)
    except Exception:  # noqa: BLE001 - any object may be handed in
        arr = np.asarray(None)
    if arr.dtype == object:
        raise LayertapError(f"sample {sample_id!r} is a {type(value).__name__}, not an array, tensor or image")
    return arr


def reference(source: MapSource | None, first: Any = None, first_id: Any = None) -> Reference | None:
    """The first sample that loads defines the shape and dtype of all (None: none loads)."""
    if source is not None:
        for i in range(min(len(source), 64)):
            sample = source.load(i)
            if not isinstance(sample, Bad):
                return _reference_of(sample, source.ids[i])
        return None
    return None if first is None or isinstance(first, Bad) else _reference_of(first, first_id)


def _reference_of(sample: Any, sample_id: Any) -> Reference:
    items = sample if isinstance(sample, dict) else {"": sample}
    return Reference(sample_id, {k: tuple(v.shape) for k, v in items.items()}, {k: v.dtype.name for k, v in items.items()})


def check_sample(sample: Any, ref: Reference, index: int, sample_id: Any, any_shape: bool) -> Any:
    """``sample`` or :class:`Bad` when its dtype (or, unless ``any_shape``, its shape) differs from the first."""
    if isinstance(sample, Bad):
        return sample
    items = sample if isinstance(sample, dict) else {"": sample}
    if set(items) != set(ref.shapes):
        why = f"has inputs {sorted(items)}, unlike the first sample {ref.id!r} ({sorted(ref.shapes)})"
        return Bad(index, sample_id, f"sample {sample_id!r} {why}")
    for k, v in items.items():
        what = f"sample {sample_id!r}" + (f" input {k!r}" if k else "")
        if v.dtype.name != ref.dtypes[k]:
            return Bad(index, sample_id, f"{what} has dtype {v.dtype.name}, unlike the first sample {ref.id!r} ({ref.dtypes[k]})")
        if not any_shape and tuple(v.shape) != ref.shapes[k]:
            return Bad(
                index, sample_id,
                f"{what} has shape {_shape(v.shape)}, unlike the first sample {ref.id!r} ({_shape(ref.shapes[k])}); "
                "samples must share one shape, or pass --pool mean|max|first to pool features of any size",
            )
    return sample


def _shape(shape: Sequence[int]) -> str:
    return "x".join(str(d) for d in shape) or "scalar"


# -- opening ------------------------------------------------------------------
def open_source(data: Any, preprocess: Callable[[], Preprocess | None], *, columns: Sequence[str] | None = None,
                same_shape: bool = False, flag: str = "--data") -> MapSource | IterSource:
    """The source for ``data``: a folder path, a sequence, an iterable or a DataLoader.

    ``preprocess`` is called only when images are found (it may need the model).
    ``columns`` picks a ``datasets`` folder's input columns; ``same_shape``
    refuses token columns of ragged length up front; ``flag`` names the option in messages.

    Example:
        >>> import tempfile, os
        >>> d = tempfile.mkdtemp()
        >>> for c in ("cats", "dogs"):
        ...     os.mkdir(os.path.join(d, c)); np.save(os.path.join(d, c, "a.npy"), np.zeros(2))
        >>> src = open_source(d, lambda: None)
        >>> src.ids, src.load(1)
        (['cats/a.npy', 'dogs/a.npy'], array([0., 0.]))
    """
    if isinstance(data, (str, os.PathLike)):
        return _open_folder(Path(data), preprocess, _Opening(flag, list(columns) if columns else None, same_shape))
    if columns:
        raise LayertapError(f"columns={list(columns)!r} picks columns of a datasets folder, and data is a {type(data).__name__}")
    if type(data).__name__ == "Dataset" and type(data).__module__.startswith("datasets"):
        return _hf_source(data, None, preprocess, _Opening("data", None, same_shape))
    if type(data).__name__ == "DataLoader" and type(data).__module__.startswith("torch"):
        return IterSource(data, _maybe(preprocess), batched=True)
    if hasattr(data, "__len__") and hasattr(data, "__getitem__") and not isinstance(data, (dict, np.ndarray)):
        return SequenceSource(data, _maybe(preprocess))
    if isinstance(data, np.ndarray) or hasattr(data, "__iter__"):
        return IterSource(data, _maybe(preprocess), batched=False)
    raise LayertapError(f"data must be a folder, a sequence or an iterable of samples, got a {type(data).__name__}")


@dataclass(frozen=True)
class _Opening:
    flag: str
    columns: list[str] | None
    same_shape: bool


def _maybe(preprocess: Callable[[], Preprocess | None]) -> Preprocess | None:
    try:
        return preprocess()
    except LayertapError:
        return None  # only needed if the items turn out to be images


def _open_folder(root: Path, preprocess: Callable[[], Preprocess | None], how: _Opening) -> MapSource:
    flag = how.flag
    if not root.exists():
        raise LayertapError(f"{flag} '{root}' does not exist")
    if not root.is_dir():
        raise LayertapError(f"{flag} '{root}' is a file; give a folder of images, .npy/.npz files or a datasets folder")
    if (root / "dataset_dict.json").is_file():
        splits = sorted(p.name for p in root.iterdir() if p.is_dir())
        raise LayertapError(f"{flag} '{root}' is a DatasetDict; pick a split folder: {', '.join(str(root / s) for s in splits)}")
    if (root / "state.json").is_file() and (root / "dataset_info.json").is_file():
        return _open_hf(root, preprocess, how)
    if how.columns:
        raise LayertapError(f"--columns picks columns of a datasets folder, and {flag} '{root}' is a folder of files")
    files = sorted(
        p.relative_to(root).as_posix() for p in root.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
    )
    images = [f for f in files if f.lower().endswith(IMAGE_SUFFIXES)]
    arrays = [f for f in files if f.lower().endswith(ARRAY_SUFFIXES)]
    if images and arrays:
        raise LayertapError(f"{flag} '{root}' holds both images ({images[0]}) and arrays ({arrays[0]}); put them in separate folders")
    found = arrays or images
    _check_classes(root, found, flag)
    if arrays:
        return ArrayFolder(root, arrays)
    if images:
        recipe = preprocess()
        if recipe is None:
            raise LayertapError("no preprocessing is known for this model; pass --image-size SIZE (and --mean/--std)")
        return ImageFolder(root, images, recipe)
    raise LayertapError(
        f"{flag} '{root}' is empty: no images ({', '.join(IMAGE_SUFFIXES[:3])}...), .npy/.npz files or datasets folder"
    )


def _check_classes(root: Path, files: list[str], flag: str) -> None:
    """Samples in class folders, or all loose: a mix would give some samples no label."""
    loose = [f for f in files if "/" not in f]
    if loose and len(loose) < len(files):
        folders = sorted({f.split("/", 1)[0] + "/" for f in files if "/" in f})
        raise LayertapError(
            f"{flag} '{root}' mixes class folders ({', '.join(folders[:3])}{', ...' if len(folders) > 3 else ''}) with loose "
            f"files ({', '.join(loose[:3])}{', ...' if len(loose) > 3 else ''}); move every sample into a class folder, or none"
        )


def _open_hf(root: Path, preprocess: Callable[[], Preprocess | None], how: _Opening) -> HFDataset:
    try:
        import datasets
    except ImportError:
        raise LayertapError(f"{how.flag} '{root}' is a Hugging Face datasets folder; pip install datasets") from None
    try:
        ds = datasets.load_from_disk(str(root))
    except Exception as e:  # noqa: BLE001
        raise LayertapError(f"cannot read datasets folder '{root}': {one_line(e, first=True)}") from None
    return _hf_source(ds, root, preprocess, how)


def _hf_source(ds: Any, root: Path | None, preprocess: Callable[[], Preprocess | None], how: _Opening) -> HFDataset:
    """A ``datasets.Dataset`` (read from ``root``, or given in memory) as a source: its input
    columns picked, ragged token columns refused when samples must share a shape."""
    where = "the datasets.Dataset" if root is None else f"datasets folder '{root}'"
    if len(ds) == 0:
        raise LayertapError(f"{how.flag} '{root}' is an empty dataset (0 rows)" if root is not None
                            else "the datasets.Dataset given as data has no rows")
    columns, images = _pick_columns(ds, where, how.columns)
    if how.same_shape:
        _check_lengths(ds, where, columns)
    recipe = preprocess() if images else None
    if images and recipe is None:
        raise LayertapError("no preprocessing is known for this model; pass --image-size SIZE (and --mean/--std)")
    return HFDataset(root, ds, columns, images, recipe)


_PREFERRED = ("pixel_values", "image", "img", "input", "inputs", "x", "array")
_LABELS = ("label", "labels")


def _pick_columns(ds: Any, where: str, wanted: list[str] | None) -> tuple[list[str], bool]:
    """The input columns: those asked for; else an Image column, else an array-valued one
    (preferred names first), else every array-valued one (tokenised text: named inputs).
    Text columns (a caption, a list of captions) are never picked: a model takes numbers."""
    import datasets

    feats = ds.features
    if wanted:
        for name in wanted:
            if name not in feats:
                raise LayertapError(unknown_name("column", name, list(feats), hint=f"{where} has the columns "
                                                 f"{', '.join(feats)}; pass --columns with some of them"))
            if holds_text(feats[name]):
                raise LayertapError(f"column {name!r} of {where} holds text, and a model takes arrays: tokenise it into "
                                    "columns of ids (input_ids, attention_mask) and pick those, or leave it out of --columns")
        images = [c for c in wanted if isinstance(feats[c], datasets.Image)]
        if images and len(wanted) > 1:
            raise LayertapError(f"--columns {','.join(wanted)}: an image column ({images[0]}) is fed alone; pick it only")
        return list(wanted), bool(images)
    images = [c for c, f in feats.items() if isinstance(f, datasets.Image)]
    arrays = [c for c, f in feats.items() if not isinstance(f, (datasets.Value, datasets.ClassLabel, datasets.Image))
              and c not in _LABELS and not holds_text(f)]
    for pool, is_image in ((images, True), (arrays, False)):
        for name in _PREFERRED:
            if name in pool:
                return [name], is_image
        if len(pool) == 1:
            return pool, is_image
    if arrays:
        return arrays, False
    raise LayertapError(
        f"{where} has no image or array column to feed the model (columns: {', '.join(feats)}); "
        "pass --columns NAME[,NAME]"
    )


def holds_text(feature: Any) -> bool:
    """Whether a ``datasets`` column holds strings anywhere (``Value("string")``, a list of captions).

    Example:
        >>> import datasets
        >>> holds_text(datasets.List(datasets.Value("string"))), holds_text(datasets.List(datasets.Value("int64")))
        (True, False)
    """
    if isinstance(feature, dict):
        return any(holds_text(f) for f in feature.values())
    if isinstance(feature, (list, tuple)):
        return any(holds_text(f) for f in feature)
    inner = getattr(feature, "feature", None)
    if inner is not None:
        return holds_text(inner)
    return getattr(feature, "dtype", "") in ("string", "large_string")


def _label_column(ds: Any, inputs: list[str]) -> str | None:
    """The ``label``/``labels`` column (class ids), unless it is fed to the model."""
    import datasets

    for name in _LABELS:
        f = ds.features.get(name)
        if name not in inputs and (isinstance(f, datasets.ClassLabel) or getattr(f, "dtype", "").startswith(("int", "uint"))):
            return name
    return None


def _check_lengths(ds: Any, where: str, columns: list[str]) -> None:
    """Token columns whose rows differ in length cannot be stacked: say so before any run."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for name in columns:
        col = ds.data.column(name)
        if not (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)):
            continue
        lo, hi = (v.as_py() for v in pc.min_max(pc.list_value_length(col)).values())
        if lo != hi:
            raise LayertapError(
                f"column {name!r} of {where} holds rows of different lengths ({lo} to {hi}) and samples "
                "must share one shape: pad when tokenising (tokenizer(..., padding='max_length', max_length=N))"
                " or pass --pool mean|max|first (extract)"
            )
