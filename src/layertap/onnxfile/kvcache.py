"""Decoder files with a KV cache: which inputs are the past, which outputs the present, and the
feeds a prefill (or a decode step) needs.

Three conventions are read from a file's declared inputs:

- ``past_key_values.N.key`` / ``.value`` in, ``present.N.key`` / ``.value`` out (Optimum's
  ``text-generation-with-past``, ONNX Runtime GenAI's model builder, ``lt.export`` with a cache);
- ``past_key_values_I`` in (``torch.onnx.export(dynamo=True)`` with a ``DynamicCache``: the
  cache's tensors in pytree order, layer-major key then value), the 4-D outputs after the first out;
- ``past.N.key`` / ``past_key.N`` spellings of the first.

The KV head count and head size come from the file's declared shapes (the past's, the present's,
else its ``GroupQueryAttention`` node: ``kv_num_heads`` and the packed QKV width), else a model config
(``transformers`` config, ``config.json`` or GenAI's ``genai_config.json`` next to the file).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import InputSpecError
from .shapes import declared_dims

if TYPE_CHECKING:  # pragma: no cover
    import onnx

_NAMED = re.compile(r"^(?:past_key_values|past)[._](\d+)[._](key|value)$")
_NAMED_ALT = re.compile(r"^past_(key|value)[._](\d+)$")
_DYNAMO = re.compile(r"^past_key_values_(\d+)$")
_PRESENT = re.compile(r"^present[._](\d+)[._](key|value)$")
_PRESENT_ALT = re.compile(r"^present_(key|value)[._](\d+)$")
IDS_NAMES = ("input_ids",)
MASK_NAMES = ("attention_mask",)
POSITION_NAMES = ("position_ids",)


@dataclass
class KvLayout:
    """A decoder file's cache inputs and outputs.

    ``past``: the past inputs in layer-major order (layer 0 key, layer 0 value, layer 1 key, ...);
    ``present``: the output that carries each past input's next value (``{}`` when unknown);
    ``ids`` / ``mask`` / ``positions``: the token, mask and position inputs (``None`` when absent);
    ``dtype``: the past's element type; ``dims``: the declared past shape (ints or names; the KV head
    count and head size taken from the declared present output where the past leaves them symbolic).

    Example:
        >>> lay = KvLayout(["past_key_values.0.key", "past_key_values.0.value"], {}, "input_ids", None, None,
        ...                "float32", (1, 2, "past", 16))
        >>> lay.layers, lay.empty_past(batch=1, kv_heads=2, head_dim=16)["past_key_values.0.key"].shape
        (1, (1, 2, 0, 16))
    """

    past: list[str]
    present: dict[str, str]
    ids: str | None
    mask: str | None
    positions: str | None
    dtype: str
    dims: tuple[int | str, ...]

    @property
    def layers(self) -> int:
        """How many decoder layers the cache holds (one key and one value each)."""
        return len(self.past) // 2

    @property
    def names(self) -> set[str]:
        """Every input the cache convention feeds (past, mask, positions)."""
        return {*self.past, *(n for n in (self.mask, self.positions) if n)}

    def empty_past(self, batch: int, kv_heads: int, head_dim: int, length: int = 0) -> dict[str, np.ndarray]:
        """Zero past tensors ``batch x kv_heads x length x head_dim`` (length 0: a prefill)."""
        shape = (batch, kv_heads, length, head_dim)
        return {n: np.zeros(shape, np.dtype(self.dtype)) for n in self.past}


def kv_layout(graph: "onnx.GraphProto") -> KvLayout | None:
    """The cache layout of a decoder file, or ``None`` when its inputs hold no KV cache.

    Example:
        >>> import onnx.helper as h
        >>> ins = [h.make_tensor_value_info(n, 1, [1, 2, "p", 8]) for n in ("past_key_values_0", "past_key_values_1")]
        >>> ids = h.make_tensor_value_info("input_ids", 7, [1, "s"])
        >>> outs = [h.make_tensor_value_info(n, 1, None) for n in ("logits", "cat", "cat_1")]
        >>> lay = kv_layout(h.make_graph([], "g", [ids, *ins], outs))
        >>> lay.past, lay.present, lay.dims
        (['past_key_values_0', 'past_key_values_1'], {'past_key_values_0': 'cat', 'past_key_values_1': 'cat_1'}, (1, 2, 'p', 8))
    """
    inits = {i.name for i in graph.initializer}
    inputs = [i for i in graph.input if i.name not in inits]
    names = [i.name for i in inputs]
    past = _ordered_past(names)
    if not past:
        return None
    outs = [o.name for o in graph.output]
    present = _present_for(past, outs)
    first = next(i for i in inputs if i.name == past[0])
    tt = first.type.tensor_type
    dims = _dims(first)
    if present and len(dims) == 4:  # a symbolic past: the present (the same heads and head size) may say more
        shown = next((v for v in [*graph.output, *graph.value_info] if v.name == present[past[0]]), None)
        more = _dims(shown) if shown is not None else ()
        if len(more) == 4:
            dims = tuple(more[k] if k in (1, 3) and not _known(d) and _known(more[k]) else d for k, d in enumerate(dims))
    if len(dims) == 4 and not (_known(dims[1]) and _known(dims[3])):
        dims = _attention_dims(graph, dims)
    import onnx

    dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type).name if tt.elem_type else "float32"

    def pick(options: tuple[str, ...]) -> str | None:
        return next((n for n in names if n in options), None)

    return KvLayout(past, present, pick(IDS_NAMES), pick(MASK_NAMES), pick(POSITION_NAMES), dtype, dims)


def _attention_dims(graph: "onnx.GraphProto", dims: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """The past's KV head count and head size where its declared shape leaves them symbolic (GenAI's
    builder: ``kv_cache_dim``), read from the first ``GroupQueryAttention`` node, whose past is
    batch x kv_num_heads x length x head size (:func:`attention_heads`)."""
    attn = next((n for n in graph.node if n.op_type == "GroupQueryAttention"), None)
    found = attention_heads(graph, attn) if attn is not None else None
    if found is None:
        return dims
    _, kv_heads, head = found
    return dims[0], dims[1] if _known(dims[1]) else kv_heads, dims[2], dims[3] if _known(dims[3]) else head


def attention_heads(graph: "onnx.GraphProto", attn: "onnx.NodeProto",
                    producer: "onnx.NodeProto | None" = None) -> tuple[int, int, int] | None:
    """``(num_heads, kv_num_heads, head_size)`` of a ``GroupQueryAttention`` / ``MultiHeadAttention`` node:
    the head counts are its attributes; the head size is the width of its first input over the
    heads it holds (a packed QKV input, key empty: ``num_heads + 2 kv_num_heads`` heads), that width
    read from the node that makes it (``producer``, else found in ``graph``: ``MatMulNBits``' ``N``, a
    ``MatMul``'s weight, through a bias ``Add`` or a ``Cast``). ``None`` where it cannot be read.

    Example:
        >>> import onnx.helper as h
        >>> mm = h.make_node("MatMulNBits", ["x", "w", "s"], ["qkv"], N=128, K=64)
        >>> gqa = h.make_node("GroupQueryAttention", ["qkv", "", "", "pk", "pv"], ["y", "k", "v"], domain="com.microsoft",
        ...                   num_heads=4, kv_num_heads=2)
        >>> attention_heads(h.make_graph([mm, gqa], "g", [], []), gqa)
        (4, 2, 16)
    """
    attrs = {a.name: a.i for a in attn.attribute}
    heads, kv_heads = attrs.get("num_heads", 0), attrs.get("kv_num_heads", attrs.get("num_heads", 0))
    packed = len(attn.input) < 2 or not attn.input[1]
    width = _width(graph, attn.input[0], producer) if attn.input else 0
    split = heads + 2 * kv_heads if packed else heads
    if not heads or not width or width % split:
        return None
    return heads, kv_heads, width // split


def _width(graph: "onnx.GraphProto", name: str, producer: "onnx.NodeProto | None" = None, depth: int = 4) -> int:
    """The last dimension of tensor ``name`` as the node making it says (0: unknown)."""
    node = producer or next((n for n in graph.node if name in n.output), None)
    if node is None or depth == 0:
        return 0
    if node.op_type == "MatMulNBits":
        return next((a.i for a in node.attribute if a.name == "N"), 0)
    inits = {i.name: i for i in graph.initializer}
    if node.op_type == "MatMul" and len(node.input) > 1 and node.input[1] in inits:
        dims = inits[node.input[1]].dims
        return int(dims[-1]) if dims else 0
    if node.op_type in ("Add", "Cast"):
        made = [i for i in node.input if i and i not in inits]
        return _width(graph, made[0], None, depth - 1) if made else 0
    return 0


def _known(dim: int | str) -> bool:
    return isinstance(dim, int) and dim > 0


def _dims(value: "onnx.ValueInfoProto") -> tuple[int | str, ...]:
    """A value's declared dims: ints where known, else their names (none when it declares no shape)."""
    return declared_dims(value) or ()


def _by_layer(names: list[str], forms: Sequence[tuple[Any, Callable[[Any], tuple[int, bool]]]]) -> dict[tuple[int, bool], str]:
    """(layer, is value) -> name, for the names one of ``forms`` (pattern, key of its match) matches."""
    keyed: dict[tuple[int, bool], str] = {}
    for n in names:
        for pattern, key in forms:
            if m := pattern.match(n):
                keyed[key(m)] = n
                break
    return keyed


def _layer_kind(m: Any) -> tuple[int, bool]:  # past_key_values.3.key
    return int(m.group(1)), m.group(2) == "value"


def _kind_layer(m: Any) -> tuple[int, bool]:  # past_key.3: the kind first
    return int(m.group(2)), m.group(1) == "value"


def _ordered_past(names: list[str]) -> list[str]:
    keyed = _by_layer(names, ((_NAMED, _layer_kind), (_NAMED_ALT, _kind_layer),
                              (_DYNAMO, lambda m: (int(m.group(1)) // 2, int(m.group(1)) % 2 == 1))))
    if len(keyed) % 2:
        return []
    return [keyed[k] for k in sorted(keyed)]


def _present_for(past: list[str], outs: list[str]) -> dict[str, str]:
    keyed = _by_layer(outs, ((_PRESENT, _layer_kind), (_PRESENT_ALT, _kind_layer)))
    if len(keyed) == len(past):
        return dict(zip(past, [keyed[k] for k in sorted(keyed)]))
    if len(outs) == len(past) + 1:  # dynamo: the logits, then the cache in its input order
        return dict(zip(past, outs[1:]))
    return {}


def cache_dims(layout: KvLayout, config: Any = None, folder: Path | None = None) -> tuple[int, int]:
    """KV head count and head size: the file's declared past shape, else ``config`` (a transformers
    config or a dict), else ``config.json`` / ``genai_config.json`` in ``folder``.

    Example:
        >>> lay = KvLayout(["past_key_values_0", "past_key_values_1"], {}, "input_ids", None, None, "float32",
        ...                ("b", "h", "p", "d"))
        >>> cache_dims(lay, {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2})
        (2, 16)
    """
    heads = layout.dims[1] if len(layout.dims) == 4 else None
    size = layout.dims[3] if len(layout.dims) == 4 else None
    if isinstance(heads, int) and heads > 0 and isinstance(size, int) and size > 0:
        return heads, size
    found = _config_dims(config) if config is not None else None
    if found is None and folder is not None:
        found = _folder_dims(folder)
    if found is None:
        shape = "x".join(str(d or "?") for d in layout.dims)
        raise InputSpecError(
            f"cannot tell the KV head count and head size of the cache inputs ({', '.join(layout.past[:2])}, ... "
            f"declared {shape}): pass the model (lt.compare) or its config.json next to the file, or give the past "
            f"with --input {layout.past[0]}=1xHEADSx0xHEAD_DIM"
        )
    return (heads if isinstance(heads, int) and heads > 0 else found[0],
            size if isinstance(size, int) and size > 0 else found[1])


def _config_dims(config: Any) -> tuple[int, int] | None:
    get = config.get if isinstance(config, Mapping) else (lambda k, d=None: getattr(config, k, d))
    heads = get("num_attention_heads")
    kv = get("num_key_value_heads") or heads
    size = get("head_dim") or get("head_size")
    if not size and heads and get("hidden_size"):
        size = get("hidden_size") // heads
    return (int(kv), int(size)) if kv and size else None


def _folder_dims(folder: Path) -> tuple[int, int] | None:
    genai = folder / "genai_config.json"
    try:
        if genai.is_file():
            dec = json.loads(genai.read_text()).get("model", {}).get("decoder", {})
            return _config_dims(dec)
        plain = folder / "config.json"
        if plain.is_file():
            return _config_dims(json.loads(plain.read_text()))
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    return None


def step_feeds(layout: KvLayout, ids: np.ndarray, past: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The mask and positions for ``ids`` after ``past`` (its third axis is the past length).

    Example:
        >>> lay = KvLayout(["k", "v"], {}, "input_ids", "attention_mask", "position_ids", "float32", ())
        >>> f = step_feeds(lay, np.zeros((1, 3), np.int64), {"k": np.zeros((1, 2, 4, 8), np.float32)})
        >>> f["attention_mask"].shape, f["position_ids"].tolist()
        ((1, 7), [[4, 5, 6]])
    """
    batch, seq = ids.shape[0], ids.shape[-1]
    first = past.get(layout.past[0]) if layout.past else None
    length = int(first.shape[2]) if first is not None and first.ndim == 4 else 0
    out: dict[str, np.ndarray] = {}
    if layout.mask:
        out[layout.mask] = np.ones((batch, length + seq), np.int64)
    if layout.positions:
        out[layout.positions] = np.broadcast_to(np.arange(length, length + seq, dtype=np.int64), (batch, seq)).copy()
    return out


def complete_feeds(layout: KvLayout, arrays: Mapping[str, np.ndarray], *, config: Any = None,
                   folder: Path | None = None) -> tuple[dict[str, np.ndarray], str | None]:
    """The cache inputs ``arrays`` lacks: an empty past (a prefill) unless a past is given, the mask
    and positions that fit the tokens after it; with one line saying what was made (``None``: nothing).

    Example:
        >>> lay = KvLayout(["past_key_values.0.key", "past_key_values.0.value"], {}, "input_ids", "attention_mask",
        ...                None, "float32", (1, 2, "past", 16))
        >>> made, note = complete_feeds(lay, {"input_ids": np.zeros((1, 5), np.int64)})
        >>> sorted(made)
        ['attention_mask', 'past_key_values.0.key', 'past_key_values.0.value']
        >>> note
        'prefill: empty past (past_key_values.*: 1x2x0x16 float32), attention_mask ones 1x5'
    """
    if layout.ids is None or layout.ids not in arrays:
        return {}, None
    ids = arrays[layout.ids]
    given = [n for n in layout.past if n in arrays]
    if given and len(given) != len(layout.past):
        missing = [n for n in layout.past if n not in arrays]
        raise InputSpecError(f"the past is given only in part: {', '.join(missing[:4])} missing (give all "
                             f"{len(layout.past)} cache inputs, or none for a prefill)")
    made: dict[str, np.ndarray] = {}
    words = []
    if not given:
        made.update(layout.empty_past(ids.shape[0], *cache_dims(layout, config, folder)))
        first = made[layout.past[0]]
        stem = _stem(layout.past[0])
        words.append(f"empty past ({stem}*: {'x'.join(map(str, first.shape))} {first.dtype.name})")
    past = {n: arrays.get(n, made.get(n)) for n in layout.past}
    for name, arr in step_feeds(layout, ids, past).items():  # type: ignore[arg-type]
        if name not in arrays:
            made[name] = arr
            kind = "ones" if name == layout.mask else f"{int(arr.min())}..{int(arr.max())}"
            words.append(f"{name} {kind} {'x'.join(map(str, arr.shape))}")
    return made, ("prefill: " if not given else "decode step: ") + ", ".join(words) if words else None


def _stem(name: str) -> str:
    m = re.match(r"^(.*?)(\d+)", name)
    return m.group(1) if m else name


def check_config(layout: KvLayout, config: Any) -> None:
    """Refuse a model whose config cannot fill the file's cache (layers, KV heads, head size differ).

    Example:
        >>> lay = KvLayout(["a", "b", "c", "d"], {}, "input_ids", None, None, "float32", (1, 2, "p", 16))
        >>> check_config(lay, {"num_hidden_layers": 3, "num_attention_heads": 4, "hidden_size": 64})
        Traceback (most recent call last):
        ...
        layertap.errors.InputSpecError: the model's config has 3 layers, 4 KV heads of size 16 but the file's cache ...
    """
    if config is None:
        return
    get = config.get if isinstance(config, Mapping) else (lambda k, d=None: getattr(config, k, d))
    layers = get("num_hidden_layers")
    dims = _config_dims(config)
    if layers is None or dims is None:
        return
    heads = layout.dims[1] if len(layout.dims) == 4 and isinstance(layout.dims[1], int) else dims[0]
    size = layout.dims[3] if len(layout.dims) == 4 and isinstance(layout.dims[3], int) else dims[1]
    if (int(layers), *dims) != (layout.layers, heads, size):
        raise InputSpecError(
            f"the model's config has {layers} layers, {dims[0]} KV heads of size {dims[1]} but the file's cache "
            f"({', '.join(layout.past[:2])}, ...) holds {layout.layers} layers, {heads} KV heads of size {size}: "
            "compare the file with the model it was exported from")
