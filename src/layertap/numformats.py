"""Number formats below float32: what a value looks like when a format holds it, and what a format
cannot carry at all.

A :class:`Format` is a reduced float type (``float16``, ``bfloat16``) or a quantised integer with its
scale and zero point (``int8``, ``uint8``, ...). It rounds values as the format does
(:meth:`Format.rounded`, numpy) and says where a value does not fit it
(:meth:`Format.limit`: an overflow, an underflow that zeroes a tensor, a quantiser's range that clips).
Which tensors of a file are held in which format is read by :mod:`layertap.onnxfile.formats`; the
ideal runs that round a whole computation live in :mod:`layertap.onnxfile.rounded` (ONNX) and
:mod:`layertap.pytorch.rounding` (PyTorch). numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

#: the user's names of the formats a comparison can be judged at, and their full names
PRECISIONS = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "int8": "int8"}
#: largest finite value and smallest positive (subnormal) value of each reduced float format
FLOAT_LIMITS = {"float16": (65504.0, 2.0**-24), "bfloat16": (3.3895313892515355e38, 2.0**-133)}
#: float32 values this large stand for infinity (masks: ``torch.finfo(float32).min``); a format that
#: turns them into its own infinity or largest value keeps their meaning
SENTINEL = 1e30
#: a tensor is zeroed by underflow when at least this share of its energy (sum of squares) lies in
#: values the format rounds to zero
UNDERFLOW_SHARE = 0.5
#: a quantiser's range clips (a fault, not rounding) when at least this share of a tensor's values lie
#: outside it by more than :data:`CLIP_MARGIN` of its width: a range calibrated on representative data
#: leaves out a few outliers, and those only just (under 1% of the values here, MinMax on other samples),
#: a scale 10x too small leaves out most values, by up to 10x
CLIP_SHARE = 0.05
CLIP_MARGIN = 0.1
#: onnxconverter-common's float16 conversion caps every weight's magnitude at ``max_finite_val``, by default
#: 1e4 (``convert_float_to_float16``): a file whose largest float16 weight is exactly this was capped so
CONVERTER_MAX = 1e4


@dataclass(frozen=True, eq=False)
class Format:
    """How one tensor is held: a reduced float type, or a quantised integer with its scale.

    Attributes:
        name: ``float32``, ``float16``, ``bfloat16``, or the integer type (``int8``, ``uint8``,
            ``int16``, ...).
        scale, zero_point: a quantised format's step and zero point (shape ``()`` per tensor, or one
            per channel along ``axis``).
        axis: the channel axis of per-channel scales.
        qmin, qmax: the integer range.
        clamp: a float format's weights capped at this magnitude by the converter that wrote them
            (onnxconverter-common's ``max_finite_val``, :data:`CONVERTER_MAX`), else ``None``; values the
            format can carry are held at the cap, those beyond its largest value are not (:func:`capped`).

    Example:
        >>> Format("float16").rounded(np.array([1.0 + 2**-12], np.float32)).tolist()
        [1.0]
        >>> q = Format.quantised("int8", np.float32(0.5), np.int8(0))
        >>> q.rounded(np.array([0.74, 100.0], np.float32)).tolist(), q.text()
        ([0.5, 63.5], 'int8 (scale 0.5, zero point 0)')
    """

    name: str
    scale: np.ndarray | None = None
    zero_point: np.ndarray | None = None
    axis: int | None = None
    qmin: int = 0
    qmax: int = 0
    clamp: float | None = None

    @classmethod
    def quantised(cls, qtype: str, scale: Any, zero_point: Any, axis: int | None = None) -> "Format":
        """A quantised integer format (``qtype`` a numpy integer type name)."""
        info = np.iinfo(np.dtype(qtype))
        s = np.asarray(scale, np.float32)
        z = np.asarray(zero_point if zero_point is not None else 0).astype(np.float32)
        return cls(qtype, s, z, axis if s.ndim else None, int(info.min), int(info.max))

    def __repr__(self) -> str:
        return f"Format({self.text()!r})"

    @property
    def is_quantised(self) -> bool:
        return self.scale is not None

    @property
    def family(self) -> str:
        """The precision the report names: ``int8`` for every quantised integer, else :attr:`name`."""
        return "int8" if self.is_quantised else self.name

    @property
    def low(self) -> bool:
        """Below float32."""
        return self.name != "float32"

    def text(self) -> str:
        """``float16``; ``int8 (scale 0.0123, zero point 3)``; ``int8 (per channel, 64 scales)``."""
        if not self.is_quantised:
            return self.name if self.clamp is None else f"{self.name} (weights capped at {self.clamp:g})"
        s, z = np.asarray(self.scale), np.asarray(self.zero_point)
        if s.ndim:
            return f"{self.name} (per channel, {s.size} scales)"
        return f"{self.name} (scale {float(s):.3g}, zero point {int(z)})"

    def _along(self, a: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Per-channel parameter ``v`` shaped to broadcast against ``a``."""
        if not np.ndim(v) or self.axis is None:
            return np.reshape(v, ())
        shape = [1] * a.ndim
        axis = self.axis % a.ndim if a.ndim else 0
        if a.ndim == 0 or a.shape[axis] != np.size(v):
            return np.reshape(v, ()) if np.size(v) == 1 else np.float32(np.mean(v))
        shape[axis] = -1
        return np.reshape(v, shape)

    def range(self, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The quantised range ``[lo, hi]`` (per channel, shaped against ``a``)."""
        s, z = self._along(a, np.asarray(self.scale)), self._along(a, np.asarray(self.zero_point))
        return (self.qmin - z) * s, (self.qmax - z) * s

    def rounded(self, a: np.ndarray) -> np.ndarray:
        """``a`` (float32) as the format holds it, read back as float32 (round half to even)."""
        a = np.asarray(a, np.float32)
        if self.clamp is not None:
            a = capped(a, self.clamp, FLOAT_LIMITS.get(self.name, (np.inf,))[0])
        if self.name == "float16":
            with np.errstate(over="ignore"):
                return _sentinels_kept(a, a.astype(np.float16).astype(np.float32))
        if self.name == "bfloat16":
            import ml_dtypes

            return _sentinels_kept(a, a.astype(ml_dtypes.bfloat16).astype(np.float32))
        if not self.is_quantised:
            return a
        s, z = self._along(a, np.asarray(self.scale)), self._along(a, np.asarray(self.zero_point))
        q = np.clip(np.rint(a / s) + z, self.qmin, self.qmax)
        return ((q - z) * s).astype(np.float32)

    def limit(self, ref: np.ndarray, scale: float | None = None) -> str | None:
        """Where ``ref`` (the reference's value) does not fit this format at all, in words; ``None`` when
        it fits (rounding is not a limit). ``scale``: ``max|ref|`` when the caller has it.

        Example:
            >>> Format("float16").limit(np.array([1.0, 9.8e4], np.float32))
            'float16 overflow: |x| up to 9.8e+04 > 65504'
            >>> Format("float16").limit(np.array([1e-9, -2e-9], np.float32))
            'float16 underflow: 100% of its values (|x| < 3e-08) become zero'
            >>> Format.quantised("int8", 0.01, 0).limit(np.linspace(-10, 10, 101, dtype=np.float32))
            'int8 clipping: 85% of its values lie well outside the quantised range [-1.28, 1.27] (scale 0.01); |x| up to 10'
        """
        a = np.asarray(ref)
        if a.size == 0 or not np.issubdtype(a.dtype, np.floating):
            return None
        if self.is_quantised:
            return self._clipping(a)
        limits = FLOAT_LIMITS.get(self.name)
        if limits is None:
            return None
        if scale is None:
            finite = a[np.isfinite(a)]
            scale = float(np.abs(finite).max()) if finite.size else 0.0
        return _overflow(a, self.name, scale, limits[0]) or _underflow(a, self.name, scale, limits[1])

    def _clipping(self, a: np.ndarray) -> str | None:
        scale = np.asarray(self.scale, np.float64).ravel()
        bad = scale[~np.isfinite(scale) | (scale <= 0)]
        if bad.size:
            return (f"{self.name} quantiser with scale {float(bad[0]):g}: no value it quantises comes back (a range "
                    "calibrated on values that were not finite)")
        lo, hi = self.range(a)
        step = self._along(a, np.abs(np.asarray(self.scale, np.float32)))
        margin = np.maximum(CLIP_MARGIN * (hi - lo), step / 2)
        # a range that starts at zero is a ReLU the quantiser folded into its clipping: its low side is the op
        low = np.where(lo == 0, -np.inf, lo - margin)
        with np.errstate(invalid="ignore", over="ignore"):
            out = (a < low) | (a > hi + margin)
        share = float(np.count_nonzero(out)) / a.size
        if share < CLIP_SHARE:
            return None
        mean_step = float(np.mean(step))
        top = float(np.nanmax(np.abs(a)))
        lo_t, hi_t = float(np.min(lo)), float(np.max(hi))
        per = " per channel" if np.ndim(np.asarray(self.scale)) else ""
        return (f"{self.name} clipping: {share:.0%} of its values lie well outside the quantised range{per} "
                f"[{lo_t:.3g}, {hi_t:.3g}] (scale {mean_step:.3g}); |x| up to {top:.3g}")


def _sentinels_kept(a: np.ndarray, rounded: np.ndarray) -> np.ndarray:
    """``rounded`` with float32's stand-ins for infinity (``|x| >= 1e30``: ``torch.finfo(float32).min`` in an
    attention mask) kept as they were: the format's own infinity would turn ``0 * min`` into NaN, which a mask
    never means."""
    big = np.abs(a) >= SENTINEL
    return np.where(big, a, rounded) if big.any() else rounded


def capped(a: np.ndarray, cap: float, top: float) -> np.ndarray:
    """``a`` with every magnitude between ``cap`` and ``top`` (the format's largest value) held at ``cap``, as
    a converter that caps weights at ``cap`` stores them; a value beyond ``top`` the format cannot carry
    whatever the converter does: left to overflow, so that the ideal run shows what the format costs there.

    Example:
        >>> capped(np.array([5.0, -2e4, 9.8e7], np.float32), 1e4, 65504.0).tolist()
        [5.0, -10000.0, 98000000.0]
    """
    mag = np.abs(a)
    return np.where((mag > cap) & (mag <= top), np.copysign(np.float32(cap), a), a).astype(np.float32)


def _overflow(a: np.ndarray, name: str, scale: float, top: float) -> str | None:
    """Finite values beyond the format's largest, other than float32's stand-ins for infinity and
    one repeated fill value (a mask)."""
    if scale <= top:
        return None
    mag = np.abs(a[np.isfinite(a)])
    over = mag[(mag > top) & (mag < SENTINEL)]
    if over.size == 0 or (over.size > 1 and float(over.min()) == float(over.max())):
        return None
    return f"{name} overflow: |x| up to {float(over.max()):.3g} > {top:g}"


def _underflow(a: np.ndarray, name: str, scale: float, tiny: float) -> str | None:
    """Most of the tensor's energy in values the format rounds to zero."""
    half = tiny / 2
    if scale == 0.0 or scale >= half * 1e4:  # its largest value alone outweighs every value that could vanish
        return None
    x = a[np.isfinite(a)].astype(np.float64).ravel()
    total = float(np.dot(x, x))
    small = x[np.abs(x) <= half]
    lost = float(np.dot(small, small))
    if total == 0.0 or lost < UNDERFLOW_SHARE * total:
        return None
    return f"{name} underflow: {lost / total:.0%} of its values (|x| < {half:.1g}) become zero"


def round_on_grid(w: np.ndarray, fmt: Format, levels: np.ndarray) -> np.ndarray:
    """A weight rounded on a quantiser's grid of ``levels`` steps each side of zero per channel (a
    symmetric format; else with the format's own scale), as float32. The same number of levels as the
    file's own integers, whatever the weight's values: a weight a BatchNorm was folded into in the file
    is rounded as finely as the file rounds it (:func:`layertap.pytorch.rounding.round_on_grid` is the
    same in torch).

    Example:
        >>> round_on_grid(np.array([[1.0, 0.3], [2.0, 0.9]], np.float32), Format.quantised("int8", [0.1, 0.2], [0, 0], 0),
        ...               np.array([2.0, 2.0])).tolist()
        [[1.0, 0.5], [2.0, 1.0]]
    """
    if np.any(np.asarray(fmt.zero_point)) or w.ndim == 0:
        return fmt.rounded(w)
    n = np.size(levels)
    axis = None
    if n > 1:
        fits = [i for i, d in enumerate(w.shape) if d == n]
        own = (fmt.axis or 0) % w.ndim
        axis = own if w.shape[own] == n else (fits[0] if fits else None)
        if axis is None:
            return w
    lv = np.asarray(levels, np.float32)
    if axis is None:
        top = np.abs(w).max(keepdims=True)
    else:
        top = np.abs(w).max(axis=tuple(i for i in range(w.ndim) if i != axis), keepdims=True)
        shape = [1] * w.ndim
        shape[axis] = -1
        lv = lv.reshape(shape)
    step = np.where(top > 0, top / lv, 1.0).astype(np.float32)
    return (np.rint(w / step) * step).astype(np.float32)
