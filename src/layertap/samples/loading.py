"""Samples from a path and to one: ``--inputs`` (``inputs=``: one ``.npz``/``.npy``, or any folder
``extract --data`` reads, through :mod:`.sources`) and ``--save-inputs`` (``save_inputs=``: the
feeds compared, as one ``.npz`` that ``--inputs`` reads back the same).

numpy only: an ONNX-vs-ONNX comparison never imports torch.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from ..errors import InputSpecError, LayertapError
from ..files.arrays import save_arrays
from ..files.reads import note_input
from .sources import Bad, MapSource, open_source

if TYPE_CHECKING:  # pragma: no cover
    from .images import Preprocess


def load_samples(path: str | os.PathLike, input_names: Sequence[str], input_ranks: Sequence[int | None], *,
                 preprocess: Callable[[], Preprocess | None] = lambda: None, columns: Sequence[str] | None = None,
                 limit: int | None = None) -> list[dict[str, np.ndarray]]:
    """The samples of ``--inputs PATH`` (at most ``limit``), as dicts by input name.

    PATH is one ``.npz`` (one sample per leading index of its arrays) or ``.npy``, or any
    folder ``extract --data`` reads (:func:`layertap.samples.sources.open_source`): ``.npy``/``.npz``
    files (one sample each), images (``preprocess()`` gives the recipe) or a ``datasets``
    folder (``columns`` picks its input columns). A ``.npz`` names its arrays after the inputs
    (or ``arr_0``.. in input order); a ``.npy`` or a lone column is the single input of a
    one-input model. In a single ``.npz``, an array with one more dimension than the input
    holds one sample per leading index; an array of the input's own rank holds one sample per
    row (each kept with a batch of 1). A sample one dimension short of its input (an image,
    a token row) gets a batch axis of 1. Raises :class:`InputSpecError` naming an unreadable
    file or an array that fits no input.

    Example:
        >>> import tempfile, os
        >>> d = tempfile.mkdtemp()
        >>> np.savez(os.path.join(d, "all.npz"), x=np.zeros((3, 1, 4), np.float32))
        >>> [s["x"].shape for s in load_samples(os.path.join(d, "all.npz"), ["x"], [2], limit=2)]
        [(1, 4), (1, 4)]
    """
    p = Path(path)
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise LayertapError(f"limit must be a positive integer, got {limit!r}")
    if p.is_dir():
        return _folder_samples(p, input_names, input_ranks, preprocess, columns, limit)
    if not p.is_file():
        raise InputSpecError(f"--inputs '{p}' does not exist (give a folder of samples, images or a datasets folder, or one .npz)")
    if columns:
        raise LayertapError(f"--columns picks columns of a datasets folder, and --inputs '{p}' is a file")
    note_input(p, "--inputs")
    if p.suffix == ".npy":
        return [_fit(_named(_read(p), input_names, p), input_ranks)]
    arrays = _named(_read(p), input_names, p)
    counts = set()
    for name in input_names:
        a = arrays[name]
        counts.add(a.shape[0] if a.ndim else 1)
    if len(counts) != 1:
        raise InputSpecError(f"--inputs '{p}': its arrays hold different numbers of samples ({sorted(counts)})")
    n = min(counts.pop(), limit or math.inf)
    out: list[dict[str, np.ndarray]] = []
    for i in range(int(n)):
        sample = {}
        for name, rank in zip(input_names, input_ranks):
            a = arrays[name]
            sample[name] = a[i] if rank is not None and a.ndim == rank + 1 else a[i:i + 1]
        out.append(sample)
    return out


def _read(path: Path) -> dict[str, np.ndarray]:
    try:
        if path.suffix == ".npy":
            return {"arr_0": np.load(path, allow_pickle=False)}
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (ValueError, OSError, EOFError) as e:
        raise InputSpecError(f"cannot read sample file '{path}': {' '.join(str(e).split())[:200]}") from None


def _named(arrays: dict[str, np.ndarray], input_names: Sequence[str], path: Path | str) -> dict[str, np.ndarray]:
    """Arrays keyed by input name: by name, else ``arr_0``.. / a lone array in input order."""
    if set(input_names) <= set(arrays):
        return {n: arrays[n] for n in input_names}
    values = list(arrays.values())
    if len(values) == len(input_names) and all(k.startswith("arr_") for k in arrays) or len(values) == len(input_names) == 1:
        return dict(zip(input_names, values))
    missing = [n for n in input_names if n not in arrays]
    raise InputSpecError(
        f"{path if isinstance(path, str) else f'sample file {str(path)!r}'} holds {', '.join(sorted(arrays)) or 'nothing'} "
        f"but the model's inputs are "
        f"{', '.join(input_names)} (missing {', '.join(missing)}); name the arrays (or --columns) after the inputs"
    )


def _folder_samples(root: Path, input_names: Sequence[str], input_ranks: Sequence[int | None],
                    preprocess: Callable[[], Preprocess | None], columns: Sequence[str] | None,
                    limit: int | None) -> list[dict[str, np.ndarray]]:
    """Every sample of a folder, read as ``extract --data`` reads it, fitted to the inputs."""
    source = open_source(root, preprocess, columns=columns, same_shape=True, flag="--inputs")
    assert isinstance(source, MapSource)  # a path opens as a folder
    out = []
    for i in range(len(source) if limit is None else min(limit, len(source))):
        sample = source.load(i)
        if isinstance(sample, Bad):
            raise InputSpecError(sample.error)
        arrays = sample if isinstance(sample, dict) else {"arr_0": sample}
        what = f"sample file '{root / source.ids[i]}'" if source.kind != "datasets" else f"row {source.ids[i]} of '{root}'"
        out.append(_fit(_named(arrays, input_names, what), input_ranks))
    return out


def _fit(sample: dict[str, np.ndarray], ranks: Sequence[int | None]) -> dict[str, np.ndarray]:
    """A sample one dimension short of an input (no batch axis) gets a batch of 1."""
    return {k: a[None] if rank is not None and a.ndim == rank - 1 else a for (k, a), rank in zip(sample.items(), ranks)}


def save_samples(path: str | os.PathLike, feeds: Sequence[dict[str, np.ndarray]]) -> Path:
    """Write the samples a comparison ran as one ``.npz`` that ``--inputs FILE.npz`` (``inputs=``)
    reads back as the same samples, with the same values.

    Layout, per input (an array named after it): samples of batch 1 are joined on the batch
    axis, so 4 samples of a ``1x3x224x224`` input are one ``4x3x224x224`` array, one sample per
    row, as a dataset's own ``.npz`` holds them; samples with another batch are stacked on a
    new leading axis (4 samples of ``2x7`` are ``4x2x7``, one sample per leading index).

    Example:
        >>> import tempfile, os
        >>> f = os.path.join(tempfile.mkdtemp(), "in.npz")
        >>> _ = save_samples(f, [{"x": np.zeros((1, 4), np.float32)}, {"x": np.ones((1, 4), np.float32)}])
        >>> np.load(f)["x"].shape
        (2, 4)
        >>> [s["x"].tolist() for s in load_samples(f, ["x"], [2])]
        [[[0.0, 0.0, 0.0, 0.0]], [[1.0, 1.0, 1.0, 1.0]]]
    """
    stacked = {}
    for name in feeds[0]:
        values = [np.asarray(f[name]) for f in feeds]
        shapes = {v.shape for v in values}
        if len(shapes) > 1:
            raise LayertapError(f"--save-inputs: input {name!r} has samples of different shapes "
                                f"({', '.join('x'.join(map(str, s)) for s in sorted(shapes)[:3])}); one .npz holds samples of one shape")
        batch_of_one = values[0].ndim > 0 and values[0].shape[0] == 1
        stacked[name] = np.concatenate(values) if batch_of_one else np.stack(values)
    return save_arrays(path, stacked)
