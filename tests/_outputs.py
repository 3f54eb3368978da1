"""What a file computes in plain ONNX Runtime, as a user would run it: its first output on each feed, and the
worst cosine of one file's outputs against another's (a FIXED file checked against its reference)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / math.sqrt((a @ a) * (b @ b)))


def ort_outputs(path: Path, feeds: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    """The file's first output on each feed, in ONNX Runtime on the CPU."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return [sess.run(None, f)[0] for f in feeds]


def worst_cosine(ref: Path, cand: Path, feeds: list[dict[str, np.ndarray]]) -> float:
    """The lowest cosine of ``cand``'s first output against ``ref``'s over the feeds."""
    return min(cosine(a, b) for a, b in zip(ort_outputs(ref, feeds), ort_outputs(cand, feeds)))
