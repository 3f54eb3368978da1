"""Samples for ``layertap fix``: the comparison samples and the calibration samples, as feeds of
the float32 file (input name -> array with its batch axis), checked against the file's declared
inputs before any conversion. Folders are read as ``extract --data`` reads them
(:mod:`layertap.data.sources`: images, ``.npy``/``.npz`` files, ``datasets`` folders); one
``.npz`` holds one sample per leading index."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence, cast

import numpy as np

from ..errors import InputSpecError, LayertapError
from ..onnxfile.shapes import input_dims

if TYPE_CHECKING:  # pragma: no cover
    import onnx

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
        from ..comparing.samples import load_samples

        samples: list[Any] = load_samples(p, [d.name for d in declared], [len(d.dims) for d in declared])
        return as_feeds(samples[:limit], declared, what)
    if not p.exists():
        raise LayertapError(f"{what} '{p}' does not exist (give a folder of images, .npy/.npz files, a datasets folder, or one .npz)")
    from ..data.sources import Bad, MapSource, open_source

    source = cast(MapSource, open_source(p, lambda: _preprocess(declared)))  # a path always opens by index
    n = len(source) if limit is None else min(limit, len(source))
    loaded = [source.load(i) for i in range(n)]
    bad = next((s for s in loaded if isinstance(s, Bad)), None)
    if bad is not None:
        raise LayertapError(f"{what} '{p}': {bad.error}")
    return as_feeds(loaded, declared, what)


def example_from_samples(model: Any, path: str | os.PathLike) -> tuple[Any, ...]:
    """The first sample of ``--inputs PATH`` as the tensors a PyTorch model is exported with, when no
    ``--input`` gives its shape: its arrays fill ``forward``'s parameters that have no default, in
    order (or by name). No file says the inputs' ranks yet, so the sample is tried with a batch axis
    of 1 before it (a ``.npz`` row, an image), then as stored (a row that holds its own batch axis):
    the first layout the model runs on is taken, and the samples are then read against the
    exported file's inputs as for any file.

    Raises:
        LayertapError: the file holds no sample, or the model runs on neither layout (naming both).
    """
    import inspect

    import torch

    from ..comparing.samples import load_samples
    from ..errors import first_line

    p = Path(path)
    params = inspect.signature(model.forward).parameters.values()
    names = [q.name for q in params if q.kind in (q.POSITIONAL_ONLY, q.POSITIONAL_OR_KEYWORD) and q.default is q.empty]
    names = names or ["input"]
    first = load_samples(p, names, [None] * len(names), limit=1)
    if not first:
        raise LayertapError(f"--inputs '{p}' holds no sample to export the model with; give --input SHAPE")
    rows = p.is_file() and p.suffix == ".npz"  # a .npz row keeps its leading axis: its own layout is a[i]
    stored = [first[0][n][0] if rows else first[0][n] for n in names]
    errors: list[str] = []
    for layout in ([a[None] for a in stored], stored):
        args = tuple(torch.from_numpy(np.array(a)) for a in layout)
        try:
            with torch.no_grad():
                model(*args)
        except Exception as e:  # noqa: BLE001 - the model's own error, said in one line below
            errors.append(f"{' '.join('x'.join(map(str, a.shape)) for a in layout)} ({type(e).__name__}: {first_line(e)})")
            continue
        return args
    raise LayertapError(f"--inputs '{p}': the model runs on its first sample neither with a batch axis nor as stored: "
                        f"{'; '.join(errors)}; give --input SHAPE")


def _preprocess(declared: list[Declared]) -> Any:
    """Images fit the first 4-D input's height and width (``N,C,H,W`` with fixed H and W)."""
    from ..data.images import from_options

    for d in declared:
        if len(d.dims) == 4 and all(isinstance(x, int) and x > 0 for x in d.dims[2:]):
            return from_options(f"{d.dims[2]}x{d.dims[3]}", None, None)
    return None


def random_feeds(model: "onnx.ModelProto", declared: list[Declared], n: int, seed: int) -> list[Feed]:
    """``n`` seeded random samples of the file's inputs (other symbolic sizes 1; token ids below
    the table they index), as ``compare`` draws them."""
    from ..inputs import random_samples
    from ..onnxfile.feeds import integer_bounds

    bounds = integer_bounds(model.graph, [d.name for d in declared])
    return random_samples(n, [(d.name, list(d.dims), d.dtype) for d in declared], seed + 1, symbolic=1, int_high=bounds)
