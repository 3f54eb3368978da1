"""A transformers KV cache on the PyTorch side: its tensors in the order decoder files take them.

A ``Cache`` (``DynamicCache`` and its kin: ``.layers[i].keys/.values``, or the older
``key_cache``/``value_cache`` lists) and the legacy tuple of ``(key, value)`` pairs both
flatten layer-major, key then value: the order of ``past_key_values.N.key/value`` inputs and of
a dynamo export's ``past_key_values_I`` (the cache's pytree leaves).
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import InputSpecError


def is_cache(value: Any) -> bool:
    """True for a transformers ``Cache`` (duck-typed: no transformers import).

    Example:
        >>> is_cache(torch.zeros(1)), is_cache(((torch.zeros(1), torch.zeros(1)),))
        (False, False)
    """
    return hasattr(value, "get_seq_length") and (hasattr(value, "layers") or hasattr(value, "key_cache"))


def cache_tensors(past: Any) -> list[torch.Tensor]:
    """The past's tensors, layer-major: layer 0 key, layer 0 value, layer 1 key, ...

    ``past``: a transformers ``Cache`` or a tuple of ``(key, value)`` per layer.

    Example:
        >>> k, v = torch.zeros(1, 2, 3, 4), torch.ones(1, 2, 3, 4)
        >>> [float(t[0, 0, 0, 0]) for t in cache_tensors(((k, v), (v, k)))]
        [0.0, 1.0, 1.0, 0.0]
    """
    if is_cache(past):
        if hasattr(past, "layers"):
            pairs = [(layer.keys, layer.values) for layer in past.layers]
        else:
            pairs = list(zip(past.key_cache, past.value_cache))
    elif isinstance(past, (tuple, list)) and all(isinstance(p, (tuple, list)) and len(p) >= 2 for p in past):
        pairs = [(p[0], p[1]) for p in past]
    else:
        raise InputSpecError(f"past_key_values must be a transformers Cache or a tuple of (key, value) per layer, "
                             f"got {type(past).__name__}")
    out = [t for pair in pairs for t in pair]
    if not all(isinstance(t, torch.Tensor) for t in out):
        raise InputSpecError("the past holds a layer without keys or values (an empty cache layer): give a filled "
                             "cache, or none for a prefill")
    return out


def to_dynamic_cache(model: Any, tensors: list[torch.Tensor]) -> Any:
    """A ``DynamicCache`` for ``model`` holding ``tensors`` (layer-major key, value), as a decode step feeds it."""
    import transformers  # noqa: PLC0415 -- optional, heavy

    cache = transformers.DynamicCache(config=getattr(model, "config", None))
    for i in range(0, len(tensors), 2):
        cache.update(tensors[i], tensors[i + 1], i // 2)
    return cache
