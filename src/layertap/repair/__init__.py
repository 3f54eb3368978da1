"""Repairs: ``lt.fix`` (keep the fewest modules in float32 that make a float16/int8 conversion
meet a target)."""

from __future__ import annotations

from .fix import FixReport, fix
from .search import FixStep

__all__ = ["fix", "FixReport", "FixStep"]
