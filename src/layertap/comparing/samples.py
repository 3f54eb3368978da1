"""Many inputs for ``lt.compare``: reading ``--inputs`` and
merging per-sample rows into one row per module call (worst sample kept).

numpy only: an ONNX-vs-ONNX comparison never imports torch.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import InputSpecError, LayertapError
from ..metrics import Criterion
from .rows import CompareRow

Sample = dict[str, np.ndarray] | list[np.ndarray]


def load_samples(path: str | Path, input_names: Sequence[str], input_ranks: Sequence[int | None]) -> list[Sample]:
    """Samples from a folder of ``.npy``/``.npz`` files (one sample per file, sorted by name)
    or from one ``.npz`` (one sample per leading index of its arrays).

    A ``.npz`` names its arrays after the inputs (or ``arr_0``.. in input order); a ``.npy``
    is the single input of a one-input model. In a single ``.npz``, an array with one more
    dimension than the input holds one sample per leading index; an array of the input's own
    rank holds one sample per row (each kept with a batch of 1). Raises
    :class:`InputSpecError` naming an unreadable file or an array that fits no input.

    Example:
        >>> import tempfile, os
        >>> d = tempfile.mkdtemp()
        >>> np.savez(os.path.join(d, "all.npz"), x=np.zeros((3, 1, 4), np.float32))
        >>> [s["x"].shape for s in load_samples(os.path.join(d, "all.npz"), ["x"], [2])]
        [(1, 4), (1, 4), (1, 4)]
    """
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.suffix in (".npy", ".npz"))
        if not files:
            raise InputSpecError(f"--inputs folder '{p}' holds no .npy or .npz file")
        return [_one_file(f, input_names) for f in files]
    if not p.is_file():
        raise InputSpecError(f"--inputs '{p}' does not exist (give a folder of .npy/.npz samples or one .npz)")
    if p.suffix == ".npy":
        return [_one_file(p, input_names)]
    arrays = _named(_read(p), input_names, p)
    counts = set()
    for name in input_names:
        a = arrays[name]
        counts.add(a.shape[0] if a.ndim else 1)
    if len(counts) != 1:
        raise InputSpecError(f"--inputs '{p}': its arrays hold different numbers of samples ({sorted(counts)})")
    n = counts.pop()
    out: list[Sample] = []
    for i in range(n):
        sample = {}
        for name, rank in zip(input_names, input_ranks):
            a = arrays[name]
            sample[name] = a[i] if rank is not None and a.ndim == rank + 1 else a[i:i + 1]
        out.append(sample)
    return out


def _read(path: Path) -> dict[str, np.ndarray]:
    try:
        if path.suffix == ".npy":
            return {"arr_0": np.load(path, allow_pickle=False)}
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (ValueError, OSError, EOFError) as e:
        raise InputSpecError(f"cannot read sample file '{path}': {' '.join(str(e).split())[:200]}") from None


def _named(arrays: dict[str, np.ndarray], input_names: Sequence[str], path: Path) -> dict[str, np.ndarray]:
    """Arrays keyed by input name: by name, else ``arr_0``.. / a lone array in input order."""
    if set(input_names) <= set(arrays):
        return {n: arrays[n] for n in input_names}
    values = list(arrays.values())
    if len(values) == len(input_names) and all(k.startswith("arr_") for k in arrays) or len(values) == len(input_names) == 1:
        return dict(zip(input_names, values))
    missing = [n for n in input_names if n not in arrays]
    raise InputSpecError(
        f"sample file '{path}' holds {', '.join(sorted(arrays)) or 'nothing'} but the model's inputs are "
        f"{', '.join(input_names)} (missing {', '.join(missing)}); name the arrays after the inputs"
    )


def _one_file(path: Path, input_names: Sequence[str]) -> Sample:
    return _named(_read(path), input_names, path)


def given_samples(args: Any, samples: Any) -> tuple[list[Any], int]:
    """``compare``'s ``args`` and ``samples`` as the samples given and how many more to draw at
    random: ``samples=N`` adds ``N - 1`` to ``args`` (``N`` without ``args``), a list replaces
    ``args``. Raises :class:`~layertap.errors.LayertapError` for ``N < 1`` or an empty list.

    Example:
        >>> given_samples("x", 3), given_samples(None, None), given_samples("x", ["a", "b"])
        ((['x'], 2), ([], 1), (['a', 'b'], 0))
    """
    given = [] if args is None else [args]
    if isinstance(samples, int) and not isinstance(samples, bool):
        if samples < 1:
            raise LayertapError(f"samples must be a positive number, got {samples!r}")
        return given, samples - len(given)
    if samples is not None:
        given = list(samples)
        if not given:
            raise LayertapError("samples is empty: give at least one sample")
        return given, 0
    return given, 0 if given else 1


# ---------------------------------------------------------------------------
# merging rows over samples
# ---------------------------------------------------------------------------
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
