"""Small ONNX Runtime programs layertap runs for arithmetic: float16 widened and float32 rounded on
every core (one ``Cast``, or a pair), and the channel block of ORT's NCHWc layout on this machine.

Each is a one- or two-node graph opened once per process (:func:`~.ort.open_session`); the
callers that need them outside this folder get them as arguments (the file readers of
:mod:`layertap.onnxfile` run nothing). ``onnxruntime`` is imported inside functions only.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

from ..numformats import Format
from .ort import source_session
from .source import SessionSource

#: the domain of ONNX Runtime's blocked-layout kernels (``ORT_ENABLE_ALL`` on x86 writes them into saved files)
NCHWC_DOMAIN = "com.microsoft.nchwc"


@functools.lru_cache(maxsize=1)
def nchwc_block_size() -> int | None:
    """The channel block of ONNX Runtime's NCHWc layout on this machine (8 with AVX2, 16 with
    AVX-512), read off one ``ReorderInput`` of a known tensor; ``None`` where ORT has no NCHWc
    kernels (a file that uses them does not run there either).

    Example:
        >>> nchwc_block_size() in (None, 4, 8, 16, 32)
        True
    """
    import onnx.helper as h

    node = h.make_node("ReorderInput", ["x"], ["y"], domain=NCHWC_DOMAIN)
    graph = h.make_graph([node], "probe", [h.make_tensor_value_info("x", 1, [1, 64, 1, 2])],
                         [h.make_empty_tensor_value_info("y")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(NCHWC_DOMAIN, 1)])
    x = np.arange(128, dtype=np.float32).reshape(1, 64, 1, 2)
    try:
        y = _session(model).run(None, {"x": x})[0].ravel()
    except Exception:  # noqa: BLE001 - no NCHWc kernels in this build or on this CPU
        return None
    # NCHW keeps x[0, c, 0, 1] (= 2c + 1) after x[0, c, 0, 0]; a block of b channels puts b values first
    at = np.flatnonzero(y == 1.0)
    return int(at[0]) if at.size and at[0] > 1 else None


def as_float32(a: np.ndarray) -> np.ndarray:
    """A float16 array as float32 through one ONNX Runtime ``Cast`` (vectorised, on every core:
    5-10x numpy's one-thread cast, which was most of the cost of judging a float16 file).
    Exact, like numpy's; small arrays, and any ORT refuses, take numpy.

    Example:
        >>> out = as_float32(np.full(5000, 1.5, np.float16))
        >>> out.dtype, float(out.sum())
        (dtype('float32'), 7500.0)
    """
    if a.dtype == np.float16 and a.size >= 4096:
        try:
            return _half_to_float().run(None, {"x": np.ascontiguousarray(a)})[0]
        except Exception:  # noqa: BLE001 - numpy below gives the same values
            pass
    return a.astype(np.float32)


@functools.lru_cache(maxsize=1)
def _half_to_float() -> Any:
    """A session of one ``Cast`` float16 -> float32 for tensors of any shape."""
    import onnx.helper as h

    graph = h.make_graph([h.make_node("Cast", ["x"], ["y"], to=1)], "widen",
                         [h.make_tensor_value_info("x", 10, None)], [h.make_tensor_value_info("y", 1, None)])
    return _session(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]))


def rounded_through(a: np.ndarray, low: str) -> np.ndarray:
    """A float32 array rounded to ``low`` (``float16`` or ``bfloat16``) and back, through one ONNX Runtime
    ``Cast`` pair (vectorised, on every core; an ideal run's weights); small arrays, and any ORT refuses,
    take numpy (:meth:`layertap.numformats.Format.rounded`), which gives the same values.

    Example:
        >>> rounded_through(np.full(5000, 1.0 + 2**-12, np.float32), "float16")[:2].tolist()
        [1.0, 1.0]
    """
    if a.dtype == np.float32 and a.size >= 4096 and low in ("float16", "bfloat16"):
        try:
            return _round_trip(low).run(None, {"x": np.ascontiguousarray(a)})[0]
        except Exception:  # noqa: BLE001 - numpy below gives the same values
            pass
    return Format(low).rounded(a)


@functools.lru_cache(maxsize=2)
def _round_trip(low: str) -> Any:
    """A session of ``Cast`` float32 -> ``low`` -> float32 for tensors of any shape."""
    import onnx.helper as h

    to = {"float16": 10, "bfloat16": 16}[low]
    graph = h.make_graph([h.make_node("Cast", ["x"], ["y"], to=to), h.make_node("Cast", ["y"], ["z"], to=1)], "round",
                         [h.make_tensor_value_info("x", 1, None)], [h.make_tensor_value_info("z", 1, None)])
    return _session(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]))


def _session(model: Any) -> Any:
    """A session on a small program, its nodes as written (no graph optimisations)."""
    return source_session(SessionSource(model, Path(".")), optimize=False)
