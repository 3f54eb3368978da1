"""A tiny PNG encoder (numpy + zlib) and colour maps for heat maps.

Thumbnails are small, so a hand-written encoder (filter 0 on every row, one
IDAT chunk) is enough and keeps reports free of Pillow and matplotlib.
"""

from __future__ import annotations

import base64
import struct
import zlib

import numpy as np

# Viridis at 9 evenly spaced stops (from matplotlib's table); interpolated linearly.
_VIRIDIS = np.array(
    [
        [68, 1, 84], [71, 44, 122], [59, 81, 139], [44, 113, 142], [33, 144, 141],
        [39, 173, 129], [92, 200, 99], [170, 220, 50], [253, 231, 37],
    ],
    dtype=np.float64,
)
NAN_RGB = (255, 0, 255)  # magenta: never produced by the colour map
POSINF_RGB = (255, 255, 255)
NEGINF_RGB = (0, 0, 0)


def encode_png(rgb: np.ndarray) -> bytes:
    """PNG bytes for an ``H x W x 3`` uint8 image.

    Example:
        >>> data = encode_png(np.zeros((2, 3, 3), dtype=np.uint8))
        >>> data[:8] == b"\\x89PNG\\r\\n\\x1a\\n", len(data) > 40
        (True, True)
    """
    img = np.ascontiguousarray(rgb, dtype=np.uint8)
    if img.ndim != 3 or img.shape[2] != 3 or img.shape[0] < 1 or img.shape[1] < 1:
        raise ValueError(f"expected an HxWx3 image, got shape {img.shape}")
    h, w = img.shape[:2]
    raw = np.concatenate([np.zeros((h, 1), dtype=np.uint8), img.reshape(h, w * 3)], axis=1)
    header = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)  # 8-bit RGB, no interlace
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(raw.tobytes(), 9)) + _chunk(b"IEND", b"")


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def data_uri(png: bytes) -> str:
    """``data:image/png;base64,...`` for an ``<img src>``."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def colorize(values: np.ndarray, lo: float | None = None, hi: float | None = None) -> np.ndarray:
    """Map a 2-D array to RGB with viridis between ``lo`` and ``hi`` (default: its finite range).

    NaN becomes magenta, +inf white and -inf black, so bad values stand out.

    Example:
        >>> img = colorize(np.array([[0.0, 1.0], [np.nan, np.inf]]))
        >>> img.shape, img[1, 0].tolist(), img[0, 1].tolist()
        ((2, 2, 3), [255, 0, 255], [253, 231, 37])
    """
    v = np.asarray(values, dtype=np.float64)
    finite = np.isfinite(v)
    if lo is None or hi is None:
        lo, hi = (float(v[finite].min()), float(v[finite].max())) if finite.any() else (0.0, 1.0)
    span = hi - lo if hi > lo else 1.0
    t = np.clip((np.where(finite, v, lo) - lo) / span, 0.0, 1.0) * (len(_VIRIDIS) - 1)
    i = np.minimum(t.astype(np.int64), len(_VIRIDIS) - 2)
    frac = (t - i)[..., None]
    rgb = _VIRIDIS[i] * (1 - frac) + _VIRIDIS[i + 1] * frac
    rgb = np.rint(rgb).astype(np.uint8)
    rgb[np.isnan(v)] = NAN_RGB
    rgb[np.isposinf(v)] = POSINF_RGB
    rgb[np.isneginf(v)] = NEGINF_RGB
    return rgb


def upscale(rgb: np.ndarray, min_side: int) -> np.ndarray:
    """Nearest-neighbour enlarge so the shorter side is at least ``min_side`` pixels.

    Example:
        >>> upscale(np.zeros((2, 4, 3), dtype=np.uint8), 8).shape
        (8, 16, 3)
    """
    h, w = rgb.shape[:2]
    k = max(1, -(-min_side // max(1, min(h, w))))
    return rgb if k == 1 else np.repeat(np.repeat(rgb, k, axis=0), k, axis=1)
