"""The one PNG writer (numpy + zlib) and the colour maps of heat maps.

A hand-written encoder (filter 0 on every row, one IDAT chunk) keeps HTML
reports free of Pillow and matplotlib: report thumbnails are encoded here, and
so is the ``--plot`` chart (matplotlib draws it, this writes its pixels).
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
# Pictures are stored as palette indices (one byte a pixel): 0..LEVELS-1 the colour map,
# then NaN, +inf (also the white gap between tiles), -inf.
LEVELS = 250
NAN_INDEX, POSINF_INDEX, NEGINF_INDEX = LEVELS, LEVELS + 1, LEVELS + 2
GAP_INDEX = POSINF_INDEX


def _palette() -> np.ndarray:
    t = np.linspace(0.0, len(_VIRIDIS) - 1, LEVELS)
    i = np.minimum(t.astype(np.int64), len(_VIRIDIS) - 2)
    frac = (t - i)[:, None]
    ramp = np.rint(_VIRIDIS[i] * (1 - frac) + _VIRIDIS[i + 1] * frac)
    return np.concatenate([ramp, [NAN_RGB, POSINF_RGB, NEGINF_RGB]]).astype(np.uint8)


PALETTE = _palette()


def encode_png(image: np.ndarray, palette: np.ndarray | None = None) -> bytes:
    """PNG bytes for an ``H x W x 3`` uint8 image, or ``H x W`` indices into ``palette`` (default :data:`PALETTE`).

    Example:
        >>> data = encode_png(np.zeros((2, 3, 3), dtype=np.uint8))
        >>> data[:8] == b"\\x89PNG\\r\\n\\x1a\\n", len(encode_png(np.zeros((2, 3), dtype=np.uint8))) > 40
        (True, True)
    """
    img = np.ascontiguousarray(image, dtype=np.uint8)
    indexed = img.ndim == 2
    if not (indexed or (img.ndim == 3 and img.shape[2] == 3)) or img.shape[0] < 1 or img.shape[1] < 1:
        raise ValueError(f"expected an HxWx3 image or HxW palette indices, got shape {img.shape}")
    h, w = img.shape[:2]
    raw = np.concatenate([np.zeros((h, 1), dtype=np.uint8), img.reshape(h, -1)], axis=1)
    header = struct.pack(">IIBBBBB", w, h, 8, 3 if indexed else 2, 0, 0, 0)  # 8-bit palette or RGB
    chunks = _chunk(b"IHDR", header)
    if indexed:
        chunks += _chunk(b"PLTE", np.ascontiguousarray(PALETTE if palette is None else palette, dtype=np.uint8).tobytes())
    return b"\x89PNG\r\n\x1a\n" + chunks + _chunk(b"IDAT", zlib.compress(raw.tobytes(), 6)) + _chunk(b"IEND", b"")


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def data_uri(png: bytes) -> str:
    """``data:image/png;base64,...`` for an ``<img src>``."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def levels(values: np.ndarray, lo: float | None = None, hi: float | None = None) -> np.ndarray:
    """Palette indices for a 2-D array: viridis between ``lo`` and ``hi`` (default: its finite range).

    NaN, +inf and -inf get their own entries (magenta, white, black), so bad values stand out.

    Example:
        >>> levels(np.array([[0.0, 1.0], [np.nan, -np.inf]])).tolist()
        [[0, 249], [250, 252]]
    """
    v = np.asarray(values, dtype=np.float64)
    finite = np.isfinite(v)
    if lo is None or hi is None:
        lo, hi = (float(v[finite].min()), float(v[finite].max())) if finite.any() else (0.0, 1.0)
    span = hi - lo if hi > lo else 1.0
    idx = np.rint(np.clip((np.where(finite, v, lo) - lo) / span, 0.0, 1.0) * (LEVELS - 1)).astype(np.uint8)
    idx[np.isnan(v)] = NAN_INDEX
    idx[np.isposinf(v)] = POSINF_INDEX
    idx[np.isneginf(v)] = NEGINF_INDEX
    return idx


def colorize(values: np.ndarray, lo: float | None = None, hi: float | None = None) -> np.ndarray:
    """RGB (``H x W x 3``) for a 2-D array: :func:`levels` through :data:`PALETTE`.

    Example:
        >>> img = colorize(np.array([[0.0, 1.0], [np.nan, np.inf]]))
        >>> img.shape, img[1, 0].tolist(), img[0, 1].tolist()
        ((2, 2, 3), [255, 0, 255], [253, 231, 37])
    """
    return PALETTE[levels(values, lo, hi)]
