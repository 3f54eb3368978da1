"""Feature arrays: pooling, output dtypes, and how each dtype is stored.

Pooling and casting happen in numpy, after the backend, so PyTorch, ONNX
Runtime, local and Ray runs all go through the same arithmetic. bfloat16 uses
``ml_dtypes`` (an onnx dependency): safetensors stores BF16, an ``.npy`` names
``bfloat16`` in its header (``np.load`` reads it once ml_dtypes is imported),
zarr stores the raw 16 bits as uint16; the manifest says ``bfloat16`` and how
to read it (``batches.BFLOAT16_READ``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import LayertapError, unknown_name

POOLS = ("none", "mean", "max", "first")
DTYPES = ("float32", "float16", "bfloat16")


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype for a manifest dtype name (``bfloat16`` via ml_dtypes).

    Example:
        >>> numpy_dtype("bfloat16").name, numpy_dtype("float16").name
        ('bfloat16', 'float16')
    """
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def check_choice(flag: str, value: str, choices: tuple[str, ...]) -> str:
    """``value`` if it is one of ``choices``, else a one-line error with the close ones."""
    if value not in choices:
        raise LayertapError(unknown_name(f"{flag} value", str(value), choices, hint=f"use one of: {', '.join(choices)}"))
    return value


def pooled_axes(ndim: int, how: str) -> list[int]:
    """Axes ``how`` pools for an array with ``ndim`` dims (batch first).

    (N, C, H, W...) pools the spatial axes; (N, T, D) pools the token axis;
    (N, D) is left as it is.

    Example:
        >>> pooled_axes(4, "mean"), pooled_axes(3, "first"), pooled_axes(2, "max"), pooled_axes(4, "none")
        ([2, 3], [1], [], [])
    """
    if how == "none" or ndim <= 2:
        return []
    return [1] if ndim == 3 else list(range(2, ndim))


def pool(a: np.ndarray, how: str) -> np.ndarray:
    """Pool a batch of features over spatial or token axes.

    Example:
        >>> pool(np.arange(8, dtype=np.float32).reshape(1, 2, 2, 2), "mean")
        array([[1.5, 5.5]], dtype=float32)
    """
    axes = tuple(pooled_axes(a.ndim, how))
    if not axes:
        return a
    if how == "mean":
        return a.mean(axis=axes, dtype=np.float32 if a.dtype != np.float64 else np.float64)
    if how == "max":
        return a.max(axis=axes)
    index: tuple[Any, ...] = (slice(None), 0) if a.ndim == 3 else (slice(None), slice(None)) + (0,) * (a.ndim - 2)
    return a[index]


def cast(a: np.ndarray, dtype: str) -> np.ndarray:
    """Floating features to ``dtype``; integer and bool features keep theirs."""
    if a.dtype.kind != "f" and a.dtype.name != "bfloat16":
        return a
    return a.astype(numpy_dtype(dtype), copy=False)
