"""Samples as feeds of a file's declared inputs: ``Declared`` (a file's inputs) and ``as_feeds`` (samples
checked and cast against them: ``fix``'s samples and calibration samples, which
:func:`.for_reference.samples_for` gives)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ..errors import InputSpecError
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
