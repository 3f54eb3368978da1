"""``lt.export`` of decoder LLMs: symbolic sequence lengths and a KV cache named as Optimum names it.

``kv_cache=True`` exports ``model(input_ids, attention_mask, past_key_values)`` through a
function that builds a ``DynamicCache`` from flat tensors: inputs ``input_ids``,
``attention_mask``, ``past_key_values.N.key/value``; outputs ``logits``, ``present.N.key/value``
(Optimum's ``text-generation-with-past`` names, which :mod:`layertap.onnxfile.kvcache` reads).
The file is verified, beyond the example, over a prefill from an empty past and several greedy
decode steps fed their own ``present.*`` (:func:`verify_decode`).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..errors import LayertapError
from ..pytorch.caches import cache_tensors
from ..pytorch.values import tensor_to_numpy

#: past tokens in the example a cache export traces (a size of 0 or 1 would be specialised)
EXAMPLE_PAST = 2
#: greedy decode steps a cache export is verified over
DECODE_STEPS = 3


#: said when a decoder is exported without its cache
DROPPED_CACHE_NOTE = ("the model also returns its KV cache (past_key_values), which the file does not output: export "
                      "with --kv-cache (kv_cache=True) for past_key_values.N / present.N inputs and outputs")


def returns_cache(model: Any) -> bool:
    """Whether ``model.forward`` is a transformers decoder that returns a KV cache (``use_cache``)."""
    config = getattr(model, "config", None)
    return (bool(getattr(config, "use_cache", False)) and not getattr(config, "is_encoder_decoder", False)
            and callable(getattr(model, "generate", None)) and getattr(config, "num_hidden_layers", None) is not None)


def past_names(layers: int) -> list[str]:
    """Optimum's past input names, layer-major.

    Example:
        >>> past_names(1)
        ['past_key_values.0.key', 'past_key_values.0.value']
    """
    return [f"past_key_values.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]


def _cache_arg(model: Any) -> str:
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def cache_method(model: Any) -> Callable[..., dict[str, torch.Tensor]]:
    """``fn(model, input_ids, attention_mask, *past)`` -> ``{"logits", "present.N.key", ...}``."""
    import transformers  # noqa: PLC0415 -- optional, heavy

    name = _cache_arg(model)

    def with_cache(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, *past: torch.Tensor) -> dict:
        cache = transformers.DynamicCache(config=model.config)
        for i in range(0, len(past), 2):
            cache.update(past[i], past[i + 1], i // 2)
        out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=True, **{name: cache})
        present = cache_tensors(out.past_key_values)
        return {"logits": out.logits, **dict(zip(_present_names(len(present) // 2), present))}

    return with_cache


def _present_names(layers: int) -> list[str]:
    return [n.replace("past_key_values", "present") for n in past_names(layers)]


def cache_example(model: Any, args: tuple, kwargs: dict) -> tuple[tuple, list[str]]:
    """The traced call of a cache export: ``input_ids``, a mask over past and tokens, a random past
    of :data:`EXAMPLE_PAST` tokens shaped by the model's config; and the input names."""
    ids = args[0] if args else kwargs.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or len(args) > 1 or set(kwargs) - {"input_ids"}:
        raise LayertapError("kv_cache=True exports model(input_ids, attention_mask, past_key_values): give the "
                            "input_ids alone (a batch x tokens tensor) as the example")
    config = getattr(model, "config", None)
    layers = getattr(config, "num_hidden_layers", None)
    heads = getattr(config, "num_attention_heads", None)
    if config is None or not layers or not heads:
        raise LayertapError("kv_cache=True needs a transformers decoder model (its config names the layers and heads)")
    kv = getattr(config, "num_key_value_heads", None) or heads
    size = getattr(config, "head_dim", None) or config.hidden_size // heads
    gen = torch.Generator().manual_seed(0)
    past = [torch.randn(ids.shape[0], kv, EXAMPLE_PAST, size, generator=gen) for _ in range(2 * layers)]
    mask = torch.ones(ids.shape[0], EXAMPLE_PAST + ids.shape[1], dtype=torch.long)
    return (ids, mask, *past), ["input_ids", "attention_mask", *past_names(layers)]


def sequence_axes(names: Sequence[str], tensors: Sequence[torch.Tensor]) -> dict[int, int]:
    """Input index -> its sequence axis: 2 for a cache input, else 1 for inputs of rank 2 or more.

    Example:
        >>> sequence_axes(["input_ids", "past_key_values.0.key", "x"], [torch.ones(1, 3), torch.ones(1, 2, 4, 8),
        ...                                                              torch.ones(3)])
        {0: 1, 1: 2}
    """
    out = {}
    for i, (name, t) in enumerate(zip(names, tensors)):
        if name.startswith("past_key_values"):
            out[i] = 2
        elif t.dim() >= 2:
            out[i] = 1
    return out


def other_sequence(example: Sequence[torch.Tensor], axes: dict[int, int], names: Sequence[str]) -> tuple:
    """The example with two more tokens along each sequence axis (a past keeps its length): token ids
    rolled (still in the vocabulary), masks ones, floats fresh normal values."""
    out = []
    gen = torch.Generator().manual_seed(1)
    for i, t in enumerate(example):
        axis = axes.get(i)
        if axis is None or names[i].startswith("past_key_values"):
            out.append(t)
            continue
        extra_shape = list(t.shape)
        extra_shape[axis] = 2
        if t.is_floating_point():
            extra = torch.randn(extra_shape, generator=gen).to(t.dtype)
        elif "mask" in names[i]:
            extra = torch.ones(extra_shape, dtype=t.dtype)
        else:
            extra = t.narrow(axis, 0, 1).roll(1, dims=0).expand(extra_shape).clone()
        out.append(torch.cat([t, extra], dim=axis))
    return tuple(out)


def verify_decode(engine: Any, model: Any, ids: torch.Tensor,
                  steps: int = DECODE_STEPS) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """A prefill from an empty past and ``steps`` greedy decode steps in ONNX Runtime (``engine``: a
    :class:`~layertap.runtimes.protocol.Engine` on the file; ``present.*`` fed back as ``past_key_values.*``)
    and in PyTorch; per call, its first token position and the two sides' logits. Both sides take
    PyTorch's tokens."""
    import transformers  # noqa: PLC0415 -- optional, heavy

    layers = model.config.num_hidden_layers
    kv = len(past_names(layers))
    heads = model.config.num_key_value_heads or model.config.num_attention_heads
    size = getattr(model.config, "head_dim", None) or model.config.hidden_size // model.config.num_attention_heads
    past = [np.zeros((ids.shape[0], heads, 0, size), np.float32) for _ in range(kv)]
    cache = transformers.DynamicCache(config=model.config)
    tokens, position, out = ids, 0, []
    for _ in range(steps + 1):
        feed = {"input_ids": tensor_to_numpy(tokens),
                "attention_mask": np.ones((ids.shape[0], position + tokens.shape[1]), np.int64),
                **dict(zip(past_names(layers), past))}
        got = engine.run(None, feed)
        with torch.no_grad():
            ref = model(input_ids=tokens, use_cache=True, **{_cache_arg(model): cache}).logits
        out.append((position, got["logits"], tensor_to_numpy(ref)))
        past = [got[n] for n in _present_names(layers)]
        position += tokens.shape[1]
        tokens = ref[:, -1:].argmax(-1)
    return out
