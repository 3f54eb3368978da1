"""Samples as feeds of a file's declared inputs: ``Declared`` (a file's inputs), ``as_feeds`` (given
samples checked and cast against them), ``read_samples`` (``fix``'s ``--inputs``/``--calib``: a folder
read as ``extract --data`` reads it, through :mod:`.sources`, or one ``.npz``), ``read_inputs``
(``compare``'s ``--inputs``: read for the file whose inputs the samples feed, with its image recipe)
and ``random_feeds`` (:func:`.drawn.random_for_file` on a file's declared inputs)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence, cast

import numpy as np

from ..errors import InputSpecError, LayertapError
from ..files.writes import check_output_path
from ..onnxfile.feeds import declared_inputs, image_input_size, integer_bounds
from ..onnxfile.modelfile import model_file
from ..onnxfile.shapes import input_dims
from .drawn import random_for_file
from .images import choose_recipe, from_options
from .loading import load_samples
from .sources import Bad, MapSource, open_source

if TYPE_CHECKING:  # pragma: no cover
    import onnx

    from ..options import SampleOptions
    from .images import Preprocess

Feed = dict[str, np.ndarray]


@dataclass(frozen=True)
class Declared:
    """One input of the float32 file: its name, dims (an int, or a name/None when symbolic) and dtype."""

    name: str
    dims: tuple[Any, ...]
    dtype: str

    @classmethod
    def of(cls, model: "onnx.ModelProto") -> list["Declared"]:
        """The file's inputs (initializers listed as inputs left out)."""
        import onnx

        types = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
        return [cls(name, tuple(d if isinstance(d, int) else (d or None) for d in dims or ()),
                    str(onnx.helper.tensor_dtype_to_np_dtype(types[name])))
                for name, dims in input_dims(model.graph).items()]

    def fits(self, shape: tuple[int, ...]) -> bool:
        """Whether an array of ``shape`` can be fed (fixed dims equal, same rank)."""
        return len(shape) == len(self.dims) and all(not isinstance(d, int) or d == s for d, s in zip(self.dims, shape))

    def shown(self) -> str:
        return "x".join(str(d) if isinstance(d, int) else (d or "?") for d in self.dims) or "scalar"


def as_feeds(samples: Sequence[Any], declared: list[Declared], what: str) -> list[Feed]:
    """Samples (a dict by input name, one array, or arrays in input order; with or without the
    batch axis) as feeds; one that fits no input is an error naming it, the input and both shapes."""
    out = []
    for k, sample in enumerate(samples):
        if isinstance(sample, dict):
            missing = [d.name for d in declared if d.name not in sample]
            if missing:
                raise InputSpecError(f"{what} sample {k} has no input {missing[0]!r} (it holds {', '.join(map(str, sample))})")
            arrays = [sample[d.name] for d in declared]
        else:
            arrays = list(sample) if isinstance(sample, (tuple, list)) else [sample]
            if len(arrays) != len(declared):
                raise InputSpecError(f"{what} sample {k} holds {len(arrays)} arrays; the model takes {len(declared)} inputs")
        out.append({d.name: _fitted(np.asarray(_numpy(a)), d, k, what) for d, a in zip(declared, arrays)})
    return out


def _numpy(value: Any) -> Any:
    return value.detach().cpu().numpy() if type(value).__module__.startswith("torch") else value


def _fitted(a: np.ndarray, d: Declared, k: int, what: str) -> np.ndarray:
    if a.ndim == len(d.dims) - 1:
        a = a[None]  # a sample without its batch axis
    if not d.fits(a.shape):
        raise InputSpecError(f"{what} sample {k}: input {d.name!r} takes {d.shown()}, got an array of shape "
                             f"{'x'.join(map(str, a.shape)) or 'scalar'}; give samples of the model's input shape")
    return np.ascontiguousarray(a.astype(d.dtype, copy=False))


def read_samples(path: str | os.PathLike, declared: list[Declared], what: str, limit: int | None = None) -> list[Feed]:
    """Feeds from a folder (images, ``.npy``/``.npz`` files, a ``datasets`` folder) or one ``.npz``,
    at most ``limit``; images are resized and centre-cropped to the input's size (pixels in [0, 1])."""
    p = Path(path)
    if p.is_file() and p.suffix == ".npz":
        samples: list[Any] = load_samples(p, [d.name for d in declared], [len(d.dims) for d in declared])
        return as_feeds(samples[:limit], declared, what)
    if not p.exists():
        raise LayertapError(f"{what} '{p}' does not exist (give a folder of images, .npy/.npz files, a datasets folder, or one .npz)")

    source = cast(MapSource, open_source(p, lambda: _preprocess(declared)))  # a path always opens by index
    n = len(source) if limit is None else min(limit, len(source))
    loaded = [source.load(i) for i in range(n)]
    bad = next((s for s in loaded if isinstance(s, Bad)), None)
    if bad is not None:
        raise LayertapError(f"{what} '{p}': {bad.error}")
    return as_feeds(loaded, declared, what)


def _preprocess(declared: list[Declared]) -> Any:
    """Images fit the first 4-D input's height and width (``N,C,H,W`` with fixed H and W)."""
    for d in declared:
        if len(d.dims) == 4 and all(isinstance(x, int) and x > 0 for x in d.dims[2:]):
            return from_options(f"{d.dims[2]}x{d.dims[3]}", None, None)
    return None


def random_feeds(model: "onnx.ModelProto", declared: list[Declared], n: int, seed: int) -> list[Feed]:
    """``n`` seeded random samples of the file's inputs (other symbolic sizes 1; token ids below
    the table they index), as ``compare`` draws them (:func:`.drawn.random_for_file`)."""
    bounds = integer_bounds(model.graph, [d.name for d in declared])
    draw = random_for_file(seed)
    return draw([(d.name, d.dtype) for d in declared], {d.name: d.dims for d in declared}, bounds, n)


def read_inputs(ref: Any, cand: Any, onnx_ref: bool, args: Any, sampling: SampleOptions,
                zoo: Callable[[], Preprocess | None] = lambda: None) -> tuple[Any, Any, Any, Any]:
    """``(ref, cand, args, samples)`` with ``sampling.inputs`` read for the file whose inputs the
    samples feed (an ONNX reference's, else the candidate's), each sample a dict in that file's input
    order (``limit``, ``columns``, the image recipe of ``sampling``; ``zoo()``: the model's own recipe);
    the files come back read, so nothing reads them twice. ``sampling.save_inputs`` is checked."""
    inputs, save_inputs = sampling.inputs, sampling.save_inputs
    if save_inputs is not None:
        check_output_path(save_inputs, inputs=(inputs,) if inputs is not None else (), suffixes=(".npz",))
    if inputs is None:
        return ref, cand, args, sampling.samples
    if args is not None or sampling.samples is not None:
        raise LayertapError("give the samples one way: inputs=PATH (--inputs), or args/samples (--input/--samples)")

    cand = model_file(cand)
    ref = model_file(ref) if onnx_ref else ref
    graph = (ref if onnx_ref else cand).model.graph
    names, ranks = declared_inputs(graph)
    preprocess = _recipe(graph, zoo, sampling.image_size, sampling.mean, sampling.std)
    return ref, cand, None, load_samples(inputs, names, ranks, preprocess=preprocess, columns=sampling.columns,
                                         limit=sampling.limit)


def _recipe(graph: Any, zoo: Callable[[], Preprocess | None], image_size: Any, mean: Any, std: Any
            ) -> Callable[[], Preprocess | None]:
    """The image recipe, found only when images turn up: ``--image-size``, else ``zoo()`` (the model's
    own: ``preprocess=``, a zoo config), else the fixed image size of the file the images feed
    (``graph``); ``--mean``/``--std`` replace the normalisation."""
    def recipe() -> Preprocess | None:
        return choose_recipe(image_size, mean, std, zoo, lambda: image_input_size(graph))

    return recipe
