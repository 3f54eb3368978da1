"""``lt.repro``: a minimal package (the call's part of each file, its inputs, a standalone
``repro.py``) that reproduces one module call's mismatch.

Imports core, ``onnxfile/``, ``runtimes/`` and ``comparing/``; only ``cli/`` and
``layertap/__init__.py`` import it.
"""
