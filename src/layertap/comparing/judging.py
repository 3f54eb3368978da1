"""The verdict at the candidate's precision (:class:`Judging`): a row passes while the candidate's error against
the ideal run at its format (what the file or runtime adds) stays within
:data:`~layertap.metrics.FORMAT_MULTIPLE` times the format's own error against the reference (what the format
costs), and fails where the format cannot carry the value. The ideal runs that give those errors are
:mod:`.ideal`'s; rows (:mod:`.align`) and sides read this rule alone.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..errors import one_line
from ..metrics import Criterion, ErrorStats, ideal_stats
from ..numformats import Format
from ..onnxfile.formats import TensorFormats


@dataclass(frozen=True)
class Judging:
    """How rows are judged against an ideal run at the candidate's format.

    Attributes:
        formats: the candidate's tensors' formats.
        decides: the precision rule decides pass/fail (``False`` when the user set ``rtol``, ``atol``
            or ``metric``: the ideal run's numbers are still shown).
        fallback: the rule for a row the ideal run has no value for (``rtol`` fitted to the format's rounding).

    Example:
        >>> from layertap.onnxfile.formats import TensorFormats
        >>> from layertap.numformats import Format
        >>> j = Judging(TensorFormats(default=Format("float16")), True, Criterion())
        >>> s = j.judge(Criterion(), np.array([1.0, 2.0], np.float32), np.array([1.001, 2.0], np.float32),
        ...             np.array([1.0005, 2.0], np.float32), Format("float16"))
        >>> s.ok, round(s.format_abs, 6), j.precision
        (True, 0.0005, 'float16')
    """

    formats: TensorFormats
    decides: bool
    fallback: Criterion
    #: why the ideal run could not be built or run, once it could not (it is an aid, never a gate: the rows
    #: it has no value for are judged by :attr:`fallback`)
    lost: list[str] = field(default_factory=list, compare=False)
    #: the three runs by name where the reference is more precise than the ideal run (a compiled module against
    #: the model in float64, the ideal run eager): ``("compiled", "eager float32", "float64")``; ``None``: an
    #: ideal run at the candidate's format against the reference
    versus: tuple[str, str, str] | None = None

    @property
    def precision(self) -> str:
        """The format the comparison is judged at."""
        return self.formats.precision

    def give_up(self, error: BaseException) -> None:
        """Record that the ideal run failed (``error``); the comparison goes on by :attr:`fallback`."""
        if not self.lost:
            self.lost.append(one_line(error, limit=300))

    def lost_note(self) -> str | None:
        """The note that says the ideal run was lost, why, and which rule judged instead."""
        if not self.lost:
            return None
        return (f"no ideal {self.precision} run ({self.lost[0]}): rows judged by the fixed rule at {self.precision}'s "
                f"rounding, rtol {self.fallback.rtol:g}, atol {self.fallback.atol:g}")

    def row_format(self, tensors: Sequence[str]) -> Format | None:
        """The lowest format among a row's candidate tensors (``None``: float32)."""
        found = [f for f in (self.formats.of(t) for t in tensors) if f is not None]
        order = {"int8": 0, "bfloat16": 1, "float16": 2}
        return min(found, key=lambda f: order.get(f.family, 3)) if found else None

    def judge(self, criterion: Criterion, ref: np.ndarray, got: np.ndarray, ideal: np.ndarray | None,
              fmt: Format | None) -> ErrorStats:
        """All statistics of ``got`` against ``ref`` and ``ideal``; ``ok`` by the precision rule when it decides."""
        base = criterion.judge(ref, got)
        limit = fmt.limit(ref, base.scale) if fmt is not None and fmt.low else None
        if ideal is None or np.shape(ideal) != np.shape(ref):
            ok = self.fallback.judge(ref, got).ok if self.decides else base.ok
            return dataclasses.replace(base, ok=bool(ok), limit=limit)
        st = ideal_stats(ref, got, ideal)
        stats = dataclasses.replace(base, format_abs=st.format_abs, impl_abs=st.impl_abs, format_cosine=st.format_cosine,
                                    limit=limit, format_rms=st.format_rms, impl_rms=st.impl_rms, ref_rms=st.ref_rms)
        if not self.decides:
            return stats
        # the implementation error decides here; a limit fails the row only where it matters (weigh_limits)
        ok = dataclasses.replace(stats, limit=None).within_format(criterion.rtol, criterion.atol)
        if criterion.check_finite and not base.finite:
            ok = False
        return dataclasses.replace(stats, ok=bool(ok))


def judging(formats: TensorFormats, criterion: Criterion, chosen: bool) -> Judging | None:
    """The precision rule for a candidate below float32 (``None`` for float32, or when the user forced fp32);
    ``chosen``: the user set the tolerances or the metric, which then decide."""
    if not formats.low:
        return None
    fallback = criterion.for_precision(formats.precision if formats.precision != "int8" else "bfloat16")
    return Judging(formats, not chosen and criterion.metric == "rel", fallback)
