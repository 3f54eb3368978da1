"""Repair: ``lt.repro`` (a minimal package that reproduces one module's mismatch).

Imports core, ``pytorch/``, ``onnxfile/``, ``exporting/`` and ``comparing/``; only ``cli/``
and ``layertap/__init__.py`` import it.
"""
