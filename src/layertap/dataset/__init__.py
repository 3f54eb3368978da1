"""Extraction over a whole dataset: batched, sharded, resumable, local or on Ray Data.

``api`` (``lt.extract_dataset``) resolves the pieces, :mod:`layertap.data` reads and
preprocesses samples, ``backends`` runs PyTorch or ONNX Runtime,
``batches`` turns batches into shard rows, ``shards`` and ``manifest`` write
OUT_DIR, ``local`` and ``ray_engine`` drive the run, ``features``
(``lt.load_features``) reads it back.
"""
