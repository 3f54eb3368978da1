"""Tapped tensors as pictures: feature-map thumbnails, heat maps, histograms, NaN/Inf counts.

Numpy only. Layouts by rank: ``N x C x H x W`` -> a grid of the first
channels of sample 0 (each tile scaled to its own range); ``N x T x D`` ->
a token x hidden heat map of sample 0; ``N x F`` -> samples x features;
1-D -> one strip. Big tensors are cut (first rows/columns) and the card says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ..files.png import GAP_INDEX, data_uri, encode_png, levels
from .html import esc
from .svg import histogram

MAX_TENSORS = 32       # tensors drawn per report; the rest get a stats row only
MAX_CHANNELS = 16      # channels per feature-map grid
MAX_TILE = 40          # pixels per tile side (larger maps are subsampled)
MAX_ROWS, MAX_COLS = 128, 384  # heat maps: tokens x hidden (or samples x features)
_HIST_SAMPLE = 1_000_000  # values fed to the histogram at most (evenly strided)


@dataclass(frozen=True)
class ValueStats:
    """Summary of one array: finite range and moments, and how many values are not finite."""

    shape: tuple[int, ...]
    dtype: str
    size: int
    min: float | None
    max: float | None
    mean: float | None
    std: float | None
    nan: int
    posinf: int
    neginf: int
    zeros: int = 0

    @property
    def finite_ok(self) -> bool:
        return self.nan == 0 and self.posinf == 0 and self.neginf == 0


def value_stats(a: np.ndarray) -> ValueStats:
    """Stats of the finite values plus NaN / +inf / -inf counts.

    Example:
        >>> s = value_stats(np.array([1.0, np.nan, np.inf, 3.0]))
        >>> (s.min, s.max, s.mean, s.nan, s.posinf, s.neginf)
        (1.0, 3.0, 2.0, 1, 1, 0)
    """
    a = np.asarray(a)
    if not _numeric(a):
        return ValueStats(tuple(a.shape), a.dtype.name, int(a.size), None, None, None, None, 0, 0, 0)
    f = a.astype(np.float64, copy=False)
    finite = np.isfinite(f)
    good = f[finite]
    nan = int(np.isnan(f).sum())
    pinf, ninf = int(np.isposinf(f).sum()), int(np.isneginf(f).sum())
    if not good.size:
        return ValueStats(tuple(a.shape), a.dtype.name, int(a.size), None, None, None, None, nan, pinf, ninf)
    return ValueStats(tuple(a.shape), a.dtype.name, int(a.size), float(good.min()), float(good.max()),
                      float(good.mean()), float(good.std()), nan, pinf, ninf, int(np.count_nonzero(good == 0)))


def _numeric(a: np.ndarray) -> bool:
    return a.size > 0 and (np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating) or a.dtype == np.bool_)


def thumbnail(a: np.ndarray, max_channels: int = MAX_CHANNELS) -> tuple[np.ndarray | None, str]:
    """A picture of ``a`` (palette indices, see :mod:`.png`) and a caption saying what it shows
    (``None`` when there is nothing to draw).

    Example:
        >>> img, caption = thumbnail(np.random.default_rng(0).normal(size=(2, 20, 8, 8)))
        >>> img.ndim, caption
        (2, 'first 16 of 20 channels of sample 0 (4 x 4 grid; each tile scaled to its own range)')
    """
    a = np.asarray(a)
    if not _numeric(a) or a.ndim == 0:
        return None, ""
    f = a.astype(np.float64, copy=False)
    if f.ndim >= 5:
        f = f.reshape(f.shape[:2] + (-1,) + f.shape[-1:])[:, :, : f.shape[-2]]
        extra = " (first slice of the middle dimensions)"
    else:
        extra = ""
    if f.ndim == 4 and f.shape[2] * f.shape[3] > 1:
        img, caption = _channel_grid(f[0], max_channels)
        return img, caption + extra
    if f.ndim == 4:
        f = f.reshape(f.shape[0], -1)
    if f.ndim == 3:
        return _heat(f[0], "token x hidden heat map of sample 0 (rows: positions, columns: features)")
    if f.ndim == 2:
        return _heat(f, "samples x features heat map (rows: samples)")
    return _heat(f[None, :], "values as one strip")


def _channel_grid(chw: np.ndarray, max_channels: int) -> tuple[np.ndarray, str]:
    c, h, w = chw.shape
    k = min(c, max_channels)
    step = max(1, math.ceil(max(h, w) / MAX_TILE))
    tiles = [levels(chw[i, ::step, ::step]) for i in range(k)]
    cols = math.ceil(math.sqrt(k))
    grow = max(1, math.ceil(16 / min(tiles[0].shape[:2])))  # tiny maps (4x4) grow so the 1 px gaps stay thin
    tiles = [np.repeat(np.repeat(t, grow, axis=0), grow, axis=1) for t in tiles]
    th, tw = tiles[0].shape[:2]
    rows = math.ceil(k / cols)
    gap = 1
    grid = np.full((rows * th + (rows - 1) * gap, cols * tw + (cols - 1) * gap), GAP_INDEX, dtype=np.uint8)
    for i, t in enumerate(tiles):
        r, q = divmod(i, cols)
        grid[r * (th + gap): r * (th + gap) + th, q * (tw + gap): q * (tw + gap) + tw] = t
    shown = f"first {k} of {c} channels" if k < c else f"all {c} channels"
    sub = f", subsampled 1:{step}" if step > 1 else ""
    return grid, f"{shown} of sample 0 ({rows} x {cols} grid{sub}; each tile scaled to its own range)"


def _heat(m: np.ndarray, what: str) -> tuple[np.ndarray, str]:
    r, c = m.shape
    cut = m[:MAX_ROWS, :MAX_COLS]
    img = levels(cut)
    cropped = []
    if r > MAX_ROWS:
        cropped.append(f"first {MAX_ROWS} of {r} rows")
    if c > MAX_COLS:
        cropped.append(f"first {MAX_COLS} of {c} columns")
    return img, what + (f"; {', '.join(cropped)}" if cropped else "")


def display_size(h: int, w: int) -> tuple[int, int]:
    """CSS pixels to show an ``h x w`` picture at: about 280 px wide, short heat maps at least 16 px a row
    (96 px in all).

    PNGs are stored at their own resolution (small files) and enlarged by the
    browser without smoothing, so each value stays a sharp block.

    Example:
        >>> display_size(8, 8), display_size(1, 384), display_size(8, 512), display_size(17, 64)
        ((280, 280), (384, 16), (512, 96), (256, 96))
    """
    dw = w * max(1, min(35, 280 // max(1, w)))
    dh = max(round(h * dw / max(1, w)), min(16 * h, 96))
    return dw, dh


def stats_line(s: ValueStats) -> str:
    """The stats as short HTML text; non-finite counts in red when present."""
    if s.min is None and s.nan == s.posinf == s.neginf == 0:
        return f"{esc(s.dtype)}, {s.size} values, nothing numeric to show"
    parts = [f"min {_g(s.min)}", f"max {_g(s.max)}", f"mean {_g(s.mean)}", f"std {_g(s.std)}"]
    if s.zeros:
        parts.append(f"zeros {100 * s.zeros / s.size:.3g}%")
    bad = f"NaN {s.nan}, +Inf {s.posinf}, -Inf {s.neginf}"
    flag = f'<b class="bad">{bad}</b>' if not s.finite_ok else f'<span class="ok">{bad}</span>'
    return esc(", ".join(parts)) + "<br>" + flag


def _g(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def tensor_card(name: str, a: np.ndarray, *, draw: bool = True) -> str:
    """One tensor: name, shape, thumbnail (when ``draw``), histogram and stats.

    Example:
        >>> html = tensor_card("layer1", np.ones((1, 4, 8, 8), dtype=np.float32))
        >>> "data:image/png;base64," in html and "NaN 0" in html
        True
    """
    a = np.asarray(a)
    s = value_stats(a)
    shape = "x".join(str(d) for d in a.shape) or "scalar"
    body = [f'<h3 class="mono">{esc(name)}</h3>', f'<div class="muted">{esc(shape)} {esc(a.dtype.name)}</div>']
    if draw:
        img, caption = thumbnail(a)
        if img is not None:
            dw, dh = display_size(*img.shape[:2])
            body.append(f'<img alt="{esc(name)}: {esc(caption)}" src="{data_uri(encode_png(img))}" '
                        f'width="{dw}" height="{dh}" style="aspect-ratio:{dw}/{dh}">')
            body.append(f'<div class="muted" style="font-size:.8em">{esc(caption)}</div>')
    if _numeric(a):
        flat = a.ravel()
        step = max(1, flat.size // _HIST_SAMPLE)
        body.append(histogram(flat[::step]))
    body.append(f'<div class="stats">{stats_line(s)}</div>')
    return f'<div class="tensor">{"".join(body)}</div>'


def tensors_fragment(arrays: Mapping[str, np.ndarray], *, max_tensors: int = MAX_TENSORS) -> str:
    """Cards for the first ``max_tensors`` arrays; the cap and what it hid are said in the report.

    Example:
        >>> out = tensors_fragment({f"t{i}": np.zeros((1, 2, 2, 2)) for i in range(3)}, max_tensors=2)
        >>> out.count('class="tensor"'), "first 2 of 3 tensors" in out
        (2, True)
    """
    names = list(arrays)
    shown = names[:max_tensors]
    note = (f'<p class="muted">Thumbnails for the first {len(shown)} of {len(names)} tensors '
            f"(cap {max_tensors}); at most {MAX_CHANNELS} channels each. NaN is drawn magenta, +Inf white, -Inf black.</p>")
    cards = "".join(tensor_card(n, arrays[n]) for n in shown)
    rest = ""
    if len(names) > len(shown):
        rows = []
        for n in names[len(shown):]:
            s = value_stats(arrays[n])
            rows.append(f"<li><code>{esc(n)}</code> {esc('x'.join(map(str, s.shape)))}: {stats_line(s).replace('<br>', '; ')}</li>")
        rest = f'<p>{len(names) - len(shown)} more tensors (first {len(shown)} of {len(names)} tensors drawn):</p><ul>{"".join(rows)}</ul>'
    return note + f'<div class="tensors">{cards}</div>' + rest
