"""``lt.compare``'s report: :class:`CompareRow`, :class:`CompareReport`, row statuses
and :func:`pair_tensors` (which ONNX tensor answers which PyTorch tensor).

Used by :mod:`layertap.comparing`, which re-exports the public names.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..metrics import DEFAULT_ATOL, DEFAULT_RTOL, FORMAT_MULTIPLE, Criterion, ErrorStats
from ..tables import Column, ToleranceReport
from ..text import fmt_db, fmt_float, fmt_shape, grid_lines
from . import words
from .plot import write_plot
from .words import ideal_line

PASS, FAIL, NO_COUNTERPART, ABSORBED = "pass", "FAIL", "no counterpart", "absorbed"
# the note of a row whose tensor the candidate computes by name inside an If branch its runtime does not hand out
IN_BRANCH = "the candidate computes it inside an If branch, and its runtime (OpenVINO) does not hand that out"
STATISTIC = "rel_err = max|cand - torch| / max|torch|; pass when max_abs <= atol + rtol * max|torch|"
#: the same rule when the reference is an ONNX file
STATISTIC_ONNX = "rel_err = max|cand - ref| / max|ref|; pass when max_abs <= atol + rtol * max|ref|"


@dataclass
class CompareRow:
    """One PyTorch module call and how its ONNX counterpart compares.

    Attributes:
        name: ``PATH`` (``PATH#k`` when the module ran more than once);
            ``output`` for the model's own result.
        path, call: module path and 0-based call index.
        type: the module's class name.
        shape: shape of the (first) PyTorch tensor compared.
        max_abs: ``max |onnx - torch|``.
        rel_err: ``max_abs / max |torch|`` (see the module docstring).
        status: ``pass``, ``FAIL``, ``no counterpart`` or ``absorbed``.
        ok: True/False for compared calls, ``None`` when nothing was compared.
        onnx: ONNX tensor names compared.
        note: why a call was not compared, or where a fused value was compared.
        cosine, sqnr_db: cosine similarity and SQNR (dB) of the candidate against the reference.
        worst_sample: over several samples, the index of the sample the row's values come from
            (the worst one by the deciding metric).
        local_rel: with ``local=True``, the rel error the candidate's part for this call makes
            when fed the reference's own inputs (``None`` when its boundary cannot be matched).
        local_format_rel, local_impl_rel: with ``local=True``, judged at the candidate's precision: the
            reference's own part for this call run alone at the candidate's format on the same inputs,
            against the reference (what the format costs this call alone), and the candidate's part against
            it (what the file adds here); they decide the row (``None`` where there is no such part).
        local_impl_gain: the part of the call's own part's implementation error that scales the value:
            ``<cand - ideal, ideal> / <ideal, ideal>`` (0.02: 2% larger). A changed weight scales what its
            module makes, rounding does not; a gain beyond the format's own noise there fails the row.
        finite: every candidate value was finite (``None`` when not compared).
        ref_max: ``max|ref|`` over the finite reference values compared.
        fused_into: for an ``absorbed`` call, the name of the row whose value holds it (the
            BatchNorm a Conv was fused into); ``None`` when unknown or not absorbed.
        weights: the module's parameters whose values differ between the two sides
            (``fc.weight differs (rel 0.5)``), else ``None``.
        token, tokens: with decode steps (``steps=``), the first token position the call computed
            and how many (the prompt's call covers all its tokens; a decode step one)
        format_rel, impl_rel: judged at the candidate's precision (a float16, bfloat16 or int8
            candidate), ``max|ideal - ref| / max|ref|`` (what the format costs here: an ideal run at
            that format against the reference) and ``max|cand - ideal| / max|ref|`` (what the file or
            its runtime adds); ``None`` at float32 or without an ideal value.
        format_cosine: the ideal run's cosine against the reference.
        format_rms, impl_rms, ref_rms: the root mean square of the same two differences (``ideal - ref``,
            ``cand - ideal``) and of the reference, over every element: an error a file makes everywhere (a
            changed weight scales every value it makes) stands out here, where rounding averages out.
        precision: the format the candidate holds this value in (``float16``, ``bfloat16``, ``int8``), or
            ``None`` for float32.
        limit: what that format cannot carry here (``float16 overflow: |x| up to 9.8e+04 > 65504``, an
            underflow that zeroes the value, an int8 range that clips); a row with a limit fails.
    """

    name: str
    path: str
    call: int
    type: str
    shape: list[int] | None
    max_abs: float | None
    rel_err: float | None
    status: str
    ok: bool | None
    onnx: list[str] = field(default_factory=list)
    note: str | None = None
    cosine: float | None = None
    sqnr_db: float | None = None
    worst_sample: int | None = None
    local_rel: float | None = None
    finite: bool | None = None
    ref_max: float | None = None
    fused_into: str | None = None
    weights: str | None = None
    token: int | None = None
    tokens: int | None = None
    format_rel: float | None = None
    impl_rel: float | None = None
    format_cosine: float | None = None
    precision: str | None = None
    limit: str | None = None
    format_rms: float | None = None
    impl_rms: float | None = None
    ref_rms: float | None = None
    local_format_rel: float | None = None
    local_impl_rel: float | None = None
    local_impl_gain: float | None = None

    @property
    def remarks(self) -> str | None:
        """The Note column: what the format cannot carry first, then differing weights, then the note."""
        return "; ".join(t for t in (self.limit, self.weights, self.note) if t) or None


class CompareReport(ToleranceReport):
    """Result of :func:`compare`: one row per module call, in PyTorch execution order.

    Attributes:
        ok: True when no compared call failed (absorbed / no-counterpart calls never fail).
        first_divergence: name of the first failing module call (``None`` when all agree).
        first_divergence_row: that row.
        rtol, atol: the tolerances used.

    Example:
        >>> r = CompareReport([CompareRow("fc", "fc", 0, "Linear", [1, 2], 1.0, 0.5, FAIL, False)], rtol=1e-3, atol=1e-5)
        >>> r.ok, r.first_divergence, r.to_dict()["first_divergence"]
        (False, 'fc', 'fc')
    """

    title = "PyTorch vs ONNX Runtime, module by module"
    report_kind = "compare"
    columns: Sequence[Column] = (
        Column("name", "Module", name=True),
        Column("type", "Type", drop=2),
        Column("shape", "Shape", fmt_shape, no_wrap=True, drop=3),
        Column("max_abs", "Max abs err", fmt_float, "right", no_wrap=True, drop=1),
        Column("rel_err", "Rel err", fmt_float, "right", no_wrap=True),
        Column("status", "Status", no_wrap=True),
        Column("remarks", "Note"),
    )

    def __init__(
        self,
        rows: Sequence[CompareRow] = (),
        notes: Sequence[str] = (),
        *,
        rtol: float = DEFAULT_RTOL,
        atol: float = DEFAULT_ATOL,
        onnx_path: str | None = None,
        ort_optimizations: bool = True,
        ort_runs: int = 0,
        criterion: Criterion | None = None,
        reference: str | None = None,
        samples: int = 1,
        first_divergence_counts: dict[str, int] | None = None,
        local: bool = False,
        weights: Any = None,
        runtimes: dict[str, dict[str, str]] | None = None,
        scope_map: Any = None,
        judging: Any = None,
    ) -> None:
        self.criterion = criterion or Criterion(rtol=rtol, atol=atol)
        #: the format the candidate was judged at (``float32``, ``float16``, ``bfloat16``, ``int8``)
        self.precision: str = judging.precision if judging is not None else "float32"
        #: the precision rule decided the rows (not the user's tolerances or metric)
        self.judged_at_format: bool = bool(judging is not None and judging.decides and not judging.lost)
        #: the candidate, its ideal run and the reference by name when the reference is more precise than the ideal
        #: run (``("compiled", "eager float32", "float64")``), else ``None``
        self.versus: tuple[str, str, str] | None = getattr(judging, "versus", None)
        if judging is not None and judging.decides and judging.lost:
            self.criterion = judging.fallback  # no ideal run: the fixed rule at the format's rounding judged
        super().__init__(rows, notes, rtol=self.criterion.rtol, atol=self.criterion.atol)
        self.onnx_path = onnx_path
        self.ort_optimizations = ort_optimizations
        self.ort_runs = ort_runs
        self.reference = reference
        self.samples = samples
        self.first_divergence_counts = dict(first_divergence_counts or {})
        self.local = local
        self.weights = weights  # the weight check (a WeightCheck), when one ran
        # side -> runtime, version, device, precision (RuntimeInfo.to_dict) of each side a runtime ran
        self.runtimes = dict(runtimes or {})
        # the candidate's ScopeMap this comparison read (None: none was read), so that what runs
        # after it on the same file (--node-data) does not read the file's scopes again
        self.scope_map = scope_map
        if reference is not None:
            self.__dict__["title"] = f"{reference} vs {onnx_path}, layer by layer"
        elif self.runtimes.get("candidate", {}).get("runtime", "ONNX Runtime") != "ONNX Runtime":
            self.__dict__["title"] = f"PyTorch vs {self.runtimes['candidate']['runtime']}, module by module"
        extra = [_metric_column(c, self.criterion.metric) for c in _EXTRA_COLUMNS if c.key != "local_rel" or local]
        base = list(type(self).columns)
        if judging is not None:
            extra[:0] = _FORMAT_COLUMNS
            if self.judged_at_format:  # what decides stays on a narrow terminal; the plain error gives way

                extra[0] = dataclasses.replace(extra[0], drop=0)
                base = [dataclasses.replace(c, drop=1) if c.key == "rel_err" else c for c in base]
        if judging is not None and local:  # the local split decides: the plain local error gives way first
            extra = [dataclasses.replace(c, drop=7) if c.key == "local_rel" else c for c in extra] + list(_LOCAL_SPLIT_COLUMNS)
        if samples > 1:
            extra.append(Column("worst_sample", "Worst sample", justify="right", no_wrap=True, drop=8))
        # per report: the local and worst-sample columns only when they hold something
        self.__dict__["columns"] = (*base[:5], *extra, *base[5:])

    @property
    def first_nonfinite(self) -> CompareRow | None:
        """The first compared row whose candidate values are not all finite (NaN/inf)."""
        return next((r for r in self.rows if r.finite is False), None)

    @property
    def first_divergence_row(self) -> CompareRow | None:
        """The first row that failed (every compared row before it passed)."""
        for row in self.rows:
            if row.ok is False:
                return row
        return None

    @property
    def first_divergence(self) -> str | None:
        """Name (``PATH`` or ``PATH#k``) of the first failing module call, or ``None``."""
        row = self.first_divergence_row
        return row.name if row is not None else None

    @property
    def explanation(self) -> list[str]:
        """The first divergence in words, one paragraph a string (what the HTML report's
        "what happened" says): where, how big, what before and after, local vs carried error.

        Example:
            >>> r = CompareReport([CompareRow("fc", "fc", 0, "Linear", [1, 2], 0.5, 0.5, FAIL, False)])
            >>> r.explanation[1]
            'It is the first module compared: the inputs themselves may already differ.'
        """
        return words.explanation(self)

    @property
    def threshold_text(self) -> str:
        """The line a row must stay on the right side of: ``rtol 0.001``, ``cosine threshold 0.999``."""
        return words.threshold_text(self)

    def plot(self, path: str | os.PathLike) -> None:
        """Write the error-per-module PNG (log scale, first divergence marked) atomically."""
        write_plot(self, path)

    def counts(self) -> dict[str, int]:
        """How many rows have each status."""
        out = {PASS: 0, FAIL: 0, ABSORBED: 0, NO_COUNTERPART: 0}
        for row in self.rows:
            out[row.status] = out.get(row.status, 0) + 1
        return out

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "ok": self.ok,
            "first_divergence": self.first_divergence,
            "first_divergence_token": self.first_divergence_row.token if self.first_divergence_row else None,
            "onnx": self.onnx_path,
            "rtol": self.rtol,
            "atol": self.atol,
            "statistic": self._statistic(),
            "ort_optimizations": self.ort_optimizations,
            "ort_runs": self.ort_runs,
            "counts": self.counts(),
            "metric": self.criterion.metric,
            "rule": self._rule() if self.judged_at_format else self.criterion.describe(),
            "reference": self.reference,
            "samples": self.samples,
            "first_divergence_counts": self.first_divergence_counts,
            "first_nonfinite": self.first_nonfinite.name if self.first_nonfinite else None,
            "precision": self.precision,
            "judged_at_format": self.judged_at_format,
        }
        if self.versus is not None:
            out["versus"] = dict(zip(("candidate", "ideal", "reference"), self.versus))
        if self.precision != "float32":
            out.update(output_cosine=self.output_cosine, ideal_output_cosine=self.ideal_output_cosine,
                       format_multiple=FORMAT_MULTIPLE)
        if self.runtimes:
            out["runtimes"] = self.runtimes
        if self.weights is not None:
            out["weights"] = self.weights.to_dict()
        if self.notes:
            out["notes"] = list(self.notes)
        return out

    def footer(self) -> list[str]:
        c = self.counts()
        lines = [f"note: {n}" for n in self.notes]
        lines.append(
            f"{c[PASS]} pass, {c[FAIL]} FAIL, {c[ABSORBED]} absorbed, {c[NO_COUNTERPART]} without counterpart "
            f"({self._rule()})"
        )
        lines.extend(grid_lines(self.rows))  # decode steps: rel err by layer and token
        bad = self.first_nonfinite
        if bad is not None:
            lines.append(f"first non-finite values: {bad.name} ({bad.type}) holds NaN or inf in the candidate")
        if self.samples > 1 and self.first_divergence_counts:
            ranked = sorted(self.first_divergence_counts.items(), key=lambda kv: -kv[1])
            lines.append("first divergence over {} samples: {}".format(
                self.samples, ", ".join(f"{n} ({k}x)" for n, k in ranked[:5])))
        row = self.first_divergence_row
        if self.versus is not None:
            lines += words.closer_lines(self.rows, self.versus)
        if row is None and self.versus is not None:
            lines.append(f"no divergence: every compared module stays as close to {self.versus[2]} as "
                         f"{self.versus[1]} does")
        elif row is None and self.precision != "float32":
            lines.append(ideal_line(self.precision, self.output_cosine, self.ideal_output_cosine))
        elif row is None:
            lines.append("no divergence: every compared module agrees")
        else:
            n = row.tokens or 1
            at = ("" if row.token is None else f" at token {row.token}" if n == 1
                  else f" in the prompt (tokens {row.token}..{row.token + n - 1})")
            lines.append(f"first divergence: {row.name} ({row.type}){at}: {self._size(row)}; "
                         f"{self._before_divergence(row)}{self._weights_before(row)}")
        return lines

    @property
    def output_cosine(self) -> float | None:
        """The model output's cosine against the reference (the ``output`` row's; ``None`` when not compared)."""
        row = self._output_row()
        return row.cosine if row is not None else None

    @property
    def ideal_output_cosine(self) -> float | None:
        """An ideal run at the candidate's format: its output's cosine against the reference."""
        row = self._output_row()
        return row.format_cosine if row is not None else None

    def _output_row(self) -> CompareRow | None:
        return next((r for r in reversed(self.rows) if r.path == "" and r.ok is not None), None)

    def _size(self, row: CompareRow) -> str:
        """The deciding value first, then the errors."""
        errors = f"max abs err {fmt_float(row.max_abs)}, rel err {fmt_float(row.rel_err)}"
        if self.judged_at_format and self.versus is not None and row.format_rel is not None:
            return words.versus_size(row, self.versus, self.rtol, self.atol)
        if self.judged_at_format and (row.limit or row.impl_rel is not None):
            return words.format_size(row, self.precision, self.rtol, self.atol)
        if self.criterion.metric == "rel":
            return errors
        value = row.cosine if self.criterion.metric == "cosine" else row.sqnr_db
        return f"{words.metric_text(value, self.criterion.metric)} ({self.threshold_text}), {errors}"

    def _rule(self) -> str:
        if self.judged_at_format and self.versus is not None:
            return words.versus_rule(self.versus, self.criterion)
        if self.judged_at_format:
            return words.format_rule(self.precision, self.criterion, self.local)
        if self.criterion.metric == "rel":
            return f"rtol {self.rtol:g}, atol {self.atol:g}; {self._statistic()}"
        return self.criterion.describe()

    def _statistic(self) -> str:
        return STATISTIC_ONNX if self.reference else STATISTIC

    def uncompared_before(self, row: CompareRow) -> list[CompareRow]:
        """Rows not compared between ``row`` and the last compared row before it.

        A divergence found at ``row`` may have started in any of them.
        """
        return words.uncompared_before(self.rows, row)

    def weights_before(self, row: CompareRow) -> list[CompareRow]:
        """Rows up to ``row`` (included) whose module holds a parameter that differs: the likely cause."""
        return [r for r in self.rows[: self.rows.index(row) + 1] if r.weights]

    def _weights_before(self, row: CompareRow) -> str:
        found = self.weights_before(row)
        if not found:
            return ""
        return "; weights that differ at or before it, the likely cause: " + "; ".join(r.weights or "" for r in found)

    def _before_divergence(self, row: CompareRow) -> str:
        """What the HTML explanation says of the calls just before ``row``, in the same words."""
        gap, fused = words.gap_words(self.rows, row), words.fused_words(self.rows, row)
        said = f"every compared module before it agrees, but {gap}" if gap else "every module before it agrees"
        return f"{said}; {fused}" if fused else said


# judged at the candidate's precision: what the format costs and what the file adds, beside the plain error
_FORMAT_COLUMNS = (
    Column("format_rel", "Format rel", fmt_float, "right", no_wrap=True, drop=6),
    Column("impl_rel", "Impl rel", fmt_float, "right", no_wrap=True),
)

# with local=True, judged at the candidate's precision: each call's own part split the same way
_LOCAL_SPLIT_COLUMNS = (
    Column("local_format_rel", "Local fmt", fmt_float, "right", no_wrap=True, drop=6),
    Column("local_impl_rel", "Local impl", fmt_float, "right", no_wrap=True),
)

# the statistics that do not decide pass/fail give way first on a narrow terminal
_EXTRA_COLUMNS = (
    Column("cosine", "Cosine", lambda v: "-" if v is None else f"{v:.6f}", "right", no_wrap=True, drop=4),
    Column("sqnr_db", "SQNR dB", fmt_db, "right", no_wrap=True, drop=5),
    Column("local_rel", "Local rel", fmt_float, "right", no_wrap=True),
)


def _metric_column(col: Column, metric: str) -> Column:
    """The deciding metric's column never gives way."""
    deciding = {"cosine": "cosine", "sqnr": "sqnr_db"}.get(metric)
    return dataclasses.replace(col, drop=0) if col.key == deciding else col


def merge_stats(stats: Sequence[ErrorStats]) -> ErrorStats:
    """Worst case over several tensors of one module call."""
    if len(stats) == 1:
        return stats[0]

    def worst(key: str, pick: Any = max) -> Any:
        found = [getattr(s, key) for s in stats if getattr(s, key) is not None]
        return pick(found) if found else None

    return ErrorStats(
        max(s.max_abs for s in stats),
        max(s.scale for s in stats),
        max(s.rel_err for s in stats),
        all(s.ok for s in stats),
        min(s.cosine for s in stats),
        min(s.sqnr_db for s in stats),
        all(s.finite for s in stats),
        worst("format_abs"),
        worst("impl_abs"),
        worst("format_cosine", min),
        next((s.limit for s in stats if s.limit), None),
        worst("format_rms"),
        worst("impl_rms"),
        worst("ref_rms"),
        max((s.impl_gain for s in stats if s.impl_gain is not None), key=abs, default=None),
        worst("ideal_rms"),
    )


def relative(value: float | None, scale: float) -> float | None:
    """An absolute difference relative to the reference's largest magnitude ``scale`` (0 of 0, else inf where
    ``scale`` is 0).

    Example:
        >>> relative(0.5, 2.0), relative(0.0, 0.0), relative(1e-9, 0.0), relative(None, 1.0)
        (0.25, 0.0, inf, None)
    """
    if value is None:
        return None
    return value / scale if scale > 0 else (0.0 if value == 0 else math.inf)


def stat_fields(stats: ErrorStats) -> dict[str, Any]:
    """The row fields one comparison fills."""
    def rel(v: float | None) -> float | None:
        return relative(v, stats.scale)

    return dict(max_abs=stats.max_abs, rel_err=stats.rel_err, cosine=stats.cosine, sqnr_db=stats.sqnr_db,
                finite=stats.finite, ref_max=stats.scale, format_rel=rel(stats.format_abs), impl_rel=rel(stats.impl_abs),
                format_cosine=stats.format_cosine, limit=stats.limit, format_rms=stats.format_rms, impl_rms=stats.impl_rms,
                ref_rms=stats.ref_rms)


def pair_tensors(torch_shapes: Sequence[tuple], onnx_shapes: Sequence[tuple]) -> list[tuple[int, int]]:
    """Pair ONNX tensors with PyTorch tensors of one module call.

    By position when the counts agree and every shape matches. Otherwise
    matching runs from the end: an ONNX call can leak extra boundary tensors
    *before* its real outputs (an inner value that a tap, or a shared
    subexpression, uses outside the module), while a module's results are the
    last values it computes. Each PyTorch tensor, last first, takes the last
    unused ONNX tensor of the same shape. Returns ``(torch_index, onnx_index)``
    pairs in ONNX order; unpaired tensors are left out.

    Example:
        >>> pair_tensors([(2, 4), (2, 4, 4)], [(2, 4, 4)])
        [(1, 0)]
        >>> pair_tensors([(2, 4), (2, 4)], [(2, 4), (2, 4)])
        [(0, 0), (1, 1)]
        >>> pair_tensors([(1, 5, 8)], [(1, 5, 8), (1, 5, 8)])  # an inner value leaked first
        [(0, 1)]
    """
    if len(torch_shapes) == len(onnx_shapes) and all(same_shape(t, o) for t, o in zip(torch_shapes, onnx_shapes)):
        return [(i, i) for i in range(len(onnx_shapes))]
    used: set[int] = set()
    pairs: list[tuple[int, int]] = []
    for i in reversed(range(len(torch_shapes))):
        for j in reversed(range(len(onnx_shapes))):
            if j not in used and same_shape(torch_shapes[i], onnx_shapes[j]):
                used.add(j)
                pairs.append((i, j))
                break
    return sorted(pairs, key=lambda p: p[1])


def same_shape(a: tuple, b: tuple) -> bool:
    """Equal shapes, or equal after dropping size-1 dimensions (same element order)."""
    a, b = tuple(a), tuple(b)
    return a == b or tuple(d for d in a if d != 1) == tuple(d for d in b if d != 1)
