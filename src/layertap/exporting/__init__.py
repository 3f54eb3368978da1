"""``lt.export``: a PyTorch model with its taps as named ONNX outputs, verified in ONNX Runtime.

The parts:

* :mod:`.export` - ``export`` itself, in steps (plan, run the exporter, finish the graph, verify, publish);
* :mod:`.verify` - :class:`ExportReport` and the per-output checks against PyTorch;
* :mod:`.wrapper` - the ``nn.Module`` that runs a method or callable with a capture and returns outputs and taps;
* :mod:`._onnxedit` - graph edits on onnx-ir (names, aliases, batch symbols, scopes);
* :mod:`._branches` - the TorchScript tracer's data-dependent ``if`` warnings, turned into one note.

Example:
    >>> from layertap.exporting import ExportReport
    >>> ExportReport.__module__
    'layertap.exporting.verify'
"""

from __future__ import annotations

from .verify import ExportReport, ExportRow

__all__ = ["ExportReport", "ExportRow"]
