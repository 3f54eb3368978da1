"""layertap: what does layer X of my model output?

Tap any PyTorch module by its path, export the taps as named and verified ONNX
outputs, expose tensors of an existing ONNX file by name or module path, and
compare PyTorch with ONNX Runtime layer by layer.

Imports are lazy: ``import layertap`` is cheap, and the ONNX-only functions
(``onnx_layers``, ``add_outputs``, ``run``) never import torch.

Example:
    >>> import layertap as lt
    >>> sorted(n for n in lt.__all__ if not n[0].isupper())[:3]
    ['add_outputs', 'compare', 'export']
"""

from __future__ import annotations

import importlib
from typing import Any

from .heap import callers_objects_frozen

__version__ = "0.1.0"

# public name -> module that defines it (relative to this package)
_EXPORTS = {
    "tap": ".pytorch.taps",
    "extract": ".pytorch.taps",
    "layers": ".pytorch.module_table",
    "export": ".exporting.export",
    "compare": ".comparing",
    "repro": ".reproducing.repro",
    "onnx_layers": ".runtimes",
    "add_outputs": ".runtimes",
    "run": ".runtimes",
    "register_runtime": ".runtimes",
    "keep_eager": ".pytorch.compiled",
    "extract_dataset": ".dataset.extraction",
    "fix": ".fixing",
    "load_features": ".dataset.features",
    "Tap": ".selectors",
    "TapResult": ".pytorch.taps",
    "LayersTable": ".pytorch.module_table",
    "OnnxLayers": ".onnxfile.tensor_table",
    "ExportReport": ".exporting.verify",
    "CompareReport": ".comparing.rows",
    "ReproReport": ".reproducing.repro",
    "FixReport": ".fixing.fix",
    "LayertapError": ".errors",
    "Model": ".options",
    "Criterion": ".metrics",
    "RuntimeOptions": ".options",
    "SampleOptions": ".options",
    "ExportOptions": ".options",
    "DatasetOptions": ".options",
    "SearchOptions": ".options",
    "reporting": ".options",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        with callers_objects_frozen():  # a part's imports keep thousands of objects: no full collection for them
            value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'layertap' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
