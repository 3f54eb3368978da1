"""Rows over samples: one row per module call, the worst sample's (by the deciding metric), and how
often each call was the first divergence."""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any, Sequence

from ..metrics import Criterion
from .rows import CompareRow


def badness(row: CompareRow, metric: str) -> float:
    """How bad a compared row is by the deciding metric (higher is worse; NaN is worst)."""
    value = {"cosine": row.cosine, "sqnr": row.sqnr_db}.get(metric, row.rel_err)
    if value is None:
        return -math.inf
    if isinstance(value, float) and math.isnan(value):
        return math.inf
    return -value if metric in ("cosine", "sqnr") else value


def merge_samples(per_sample: Sequence[Sequence[CompareRow]], criterion: Criterion) -> tuple[list[CompareRow], dict[str, int]]:
    """One row per module call over all samples, and how often each was the first divergence.

    A row is the worst sample's row (by ``criterion.metric``) with ``worst_sample`` set;
    it fails when any sample failed (a failing sample beats a passing one). Rows keep the
    order of the first sample that has them.

    Example:
        >>> from layertap.comparing.rows import PASS, FAIL
        >>> a = [CompareRow("fc", "fc", 0, "Linear", [1], 0.0, 0.0, PASS, True)]
        >>> b = [CompareRow("fc", "fc", 0, "Linear", [1], 1.0, 0.5, FAIL, False)]
        >>> rows, counts = merge_samples([a, b], Criterion())
        >>> rows[0].status, rows[0].worst_sample, counts
        ('FAIL', 1, {'fc': 1})
    """
    order: list[str] = []
    best: dict[str, tuple[CompareRow, int]] = {}
    local: dict[str, float] = {}
    firsts: collections.Counter[str] = collections.Counter()
    for s, rows in enumerate(per_sample):
        first = next((r.name for r in rows if r.ok is False), None)
        if first is not None:
            firsts[first] += 1
        for r in rows:
            if r.name not in best:
                order.append(r.name)
                best[r.name] = (r, s)
            elif _worse(r, best[r.name][0], criterion.metric):
                best[r.name] = (r, s)
            if r.local_rel is not None:
                local[r.name] = max(local.get(r.name, -math.inf), r.local_rel)
    merged = []
    for name in order:
        row, s = best[name]
        fields: dict[str, Any] = {"worst_sample": s if len(per_sample) > 1 and row.ok is not None else None}
        if name in local:
            fields["local_rel"] = local[name]
        # a copy only where a field changes (with one sample, none does)
        changed = any(getattr(row, k) != v for k, v in fields.items())
        merged.append(dataclasses.replace(row, **fields) if changed else row)
    return merged, dict(firsts)


def _worse(a: CompareRow, b: CompareRow, metric: str) -> bool:
    if (a.ok is False) != (b.ok is False):
        return a.ok is False
    if b.ok is None and a.ok is not None:
        return True
    return badness(a, metric) > badness(b, metric)
