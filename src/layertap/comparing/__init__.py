"""``lt.compare``: PyTorch vs ONNX Runtime, module by module (see :mod:`.api`).

The parts, each importing the others by their public names:

* :mod:`.api` - ``compare`` itself: options, samples, the two sides;
* :mod:`.driver` - the one driver: samples in batches, rows, local errors, notes;
* :mod:`.torch_ref`, :mod:`.onnx_ref` - the two references (a hooked model; an ONNX file in ORT);
* :mod:`.rows` - :class:`CompareRow`, :class:`CompareReport`, row statuses, :func:`pair_tensors`;
* :mod:`.torch_side` - the hooked PyTorch run and the value store that spills to disk;
* :mod:`.onnx_side` - ONNX Runtime runs in batches, feeds, the file's scopes under the model's paths;
* :mod:`.align` - module calls <-> ONNX tensors (the plan), batches, rows;
* :mod:`.weights` - the weight check: the same model, or :class:`DifferentWeightsError`;
* :mod:`.words` - what a report says as plain text (explanation, threshold, chart points);
* :mod:`.plot` - ``--plot`` PNG.

Example:
    >>> from layertap.comparing import CompareRow, PASS
    >>> CompareRow("fc", "fc", 0, "Linear", [1, 10], 0.0, 0.0, PASS, True).status
    'pass'
"""

from __future__ import annotations

from ..metrics import DEFAULT_ATOL, DEFAULT_RTOL, ErrorStats, error_stats
from .api import DEFAULT_MEMORY_BUDGET, FUSION_NOTE, Progress, compare
from .rows import ABSORBED, FAIL, NO_COUNTERPART, PASS, STATISTIC, CompareReport, CompareRow, pair_tensors
from .weight_check import DifferentWeightsError, WeightCheck

__all__ = [
    "compare",
    "Progress",
    "CompareReport",
    "CompareRow",
    "pair_tensors",
    "DEFAULT_RTOL",
    "DEFAULT_ATOL",
    "DEFAULT_MEMORY_BUDGET",
    "error_stats",
    "ErrorStats",
    "PASS",
    "FAIL",
    "NO_COUNTERPART",
    "ABSORBED",
    "STATISTIC",
    "FUSION_NOTE",
    "DifferentWeightsError",
    "WeightCheck",
]
