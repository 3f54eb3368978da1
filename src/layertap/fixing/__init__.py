"""``lt.fix``: keep the fewest modules in float32 that make a float16/int8 conversion meet a
target (the search, the converters, the configurations each toolchain reads).

Imports core, ``pytorch/``, ``onnxfile/``, ``runtimes/``, ``exporting/`` and ``comparing/``;
only ``cli/`` and ``layertap/__init__.py`` import it.
"""

from __future__ import annotations

from .fix import FixReport, fix
from .search import FixStep

__all__ = ["fix", "FixReport", "FixStep"]
