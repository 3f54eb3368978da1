"""Walking the values modules return: pick by ``[index]``, describe structure.

Modules return tensors, tuples, lists, dicts, dataclasses and HF
``ModelOutput``s (an ordered dict whose ``[int]`` skips ``None`` fields).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from ..errors import LayertapError, SelectorError, close_matches
from ..inputs import DEFAULT_INT_HIGH, random_array
from ..selectors import Index, index_text

#: what ``method=`` takes: a method name (``"encode_image"``) or a callable ``fn(model, *args, **kwargs)``
Method = str | Callable[..., Any]


def is_model_output(value: Any) -> bool:
    """True for HF ``ModelOutput`` (duck-typed: no transformers import)."""
    return hasattr(value, "to_tuple") and isinstance(value, dict)


def pick(value: Any, index: Sequence[Index], *, where: str = "value") -> Any:
    """Apply an index chain to a value; errors show what was there.

    Example:
        >>> pick((torch.zeros(2), {"a": torch.ones(3)}), (1, "a")).shape
        torch.Size([3])
    """
    for depth, key in enumerate(index):
        value = _pick_one(value, key, where + index_text(index[:depth]))
    return value


class CallArgs(dict):
    """Arguments of one module call: ``[i]`` is positional ``i``, ``[key]`` a keyword.

    ``names`` are the parameter names of the called function, in order: with
    them ``[hidden_states]`` also finds an argument that was passed by
    position (HF blocks are called as ``layer(hidden_states, mask, ...)``).

    Example:
        >>> a = CallArgs((torch.zeros(1), torch.ones(2)), {"mask": None}, names=("x", "y", "mask"))
        >>> pick(a, (-1,)).shape, pick(a, ("y",)).shape, describe(a)
        (torch.Size([2]), torch.Size([2]), 'args(x=Tensor[1], y=Tensor[2], mask=None)')
    """

    def __init__(self, args: tuple, kwargs: dict, names: Sequence[str] = ()) -> None:
        super().__init__({**dict(enumerate(args)), **kwargs})
        self.nargs = len(args)
        # parameter name -> position, for the arguments that were passed by position
        self.positional = {n: i for i, n in enumerate(names[: len(args)]) if n not in kwargs}

    def label(self, key: Index) -> str:
        """How an entry is shown: ``name=`` for a positional argument with a known name."""
        if isinstance(key, int):
            name = next((n for n, i in self.positional.items() if i == key), None)
            return f"{name}=" if name else ""
        return f"{key}="


def tensor_to_numpy(t: torch.Tensor, *, copy: bool = False) -> np.ndarray:
    """A tensor as a CPU numpy array, detached.

    Dtypes numpy lacks (bfloat16, float8) become float32; sparse tensors
    become dense. ``copy=True`` never shares memory with ``t``, so a later
    in-place op (``ReLU(inplace=True)``) cannot change the array.

    Example:
        >>> tensor_to_numpy(torch.ones(2, dtype=torch.bfloat16)).dtype
        dtype('float32')
    """
    t = t.detach()
    if t.layout != torch.strided:
        t = t.to_dense()
    if t.dtype == torch.bfloat16 or (t.is_floating_point() and t.element_size() < 2):
        t = t.float()
    if t.device.type != "cpu":
        return t.cpu().numpy()  # a copy already
    # torch's copy, on every core: a process's first copies fault in fresh pages, which numpy's copy,
    # on one thread, does alone (a resnet50's module outputs, 160 MB: 25 ms against 37 in a fresh
    # process, 14 against 18 warm)
    return t.clone().numpy() if copy else t.numpy()


#: the backends whose float32 work PyTorch may do in TF32 on a GPU (its newer switches, one per backend)
_FP32_BACKENDS = ("cudnn.conv", "cudnn.rnn", "cuda.matmul")


@contextlib.contextmanager
def exact_float32() -> Iterator[None]:
    """Full float32 for the block's CUDA convolutions and matrix products, PyTorch's switches set back after.

    PyTorch computes CUDA convolutions in TF32 by default (a 10-bit mantissa): a model on a GPU then
    differs from any float32 computation of it by about 1e-3, its own rounding, which a compare would
    report as a divergence of every layer. A reference forward runs in full float32 instead. Nothing
    changes on a CPU.

    Example:
        >>> with exact_float32():
        ...     float(torch.ones(2, 2).matmul(torch.ones(2, 2)).sum())
        8.0
    """
    if not torch.cuda.is_available():
        yield
        return
    saved: list[tuple[Any, str, Any]] = []
    try:
        for path in _FP32_BACKENDS:
            owner: Any = torch.backends
            for part in path.split("."):
                owner = getattr(owner, part, None)
            if owner is None or not hasattr(owner, "fp32_precision"):
                continue
            saved.append((owner, "fp32_precision", owner.fp32_precision))
            owner.fp32_precision = "ieee"
        if not saved:  # a PyTorch before the per-backend switches (2.9): the global ones
            for owner in (torch.backends.cudnn, torch.backends.cuda.matmul):
                saved.append((owner, "allow_tf32", owner.allow_tf32))
                owner.allow_tf32 = False
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


def gpu_device(model: Any, args: tuple = (), kwargs: dict | None = None) -> torch.device | None:
    """The CUDA device ``model`` (its first parameter or buffer) or a tensor among its arguments is on, else ``None``.

    Example:
        >>> gpu_device(torch.nn.Linear(2, 2), (torch.zeros(1, 2),)) is None
        True
    """
    first = next(iter((*model.parameters(), *model.buffers())), None) if isinstance(model, torch.nn.Module) else None
    tensors = ([first] if first is not None else []) + [t for _, t in flatten((args, kwargs or {}))]
    return next((t.device for t in tensors if t.is_cuda), None)


def random_tensor(shape: Sequence[int], dtype: torch.dtype, rng: np.random.Generator,
                  int_high: int = DEFAULT_INT_HIGH) -> torch.Tensor:
    """Seeded random data (:func:`layertap.inputs.random_array`) as a CPU tensor of ``dtype``.

    Dtypes numpy lacks (bfloat16, float8) are drawn as float32 and converted.

    Example:
        >>> t = random_tensor((2, 3), torch.bfloat16, np.random.default_rng(0))
        >>> t.shape, t.dtype
        (torch.Size([2, 3]), torch.bfloat16)
    """
    kind = np.bool_ if dtype == torch.bool else np.int64 if not dtype.is_floating_point else (
        np.float64 if dtype == torch.float64 else np.float32)
    return torch.from_numpy(random_array(tuple(shape), kind, rng, int_high)).to(dtype)


def random_like(args: Sequence[Any], seed: int) -> tuple:
    """Seeded random tensors shaped and typed like ``args``, drawn from one generator seeded ``seed``.

    Integers stay in the range ``args`` uses (below its largest value plus one);
    bool tensors (masks) and non-tensors are kept as given.

    Example:
        >>> x, ids, mask = random_like((torch.zeros(2, 3), torch.tensor([4, 1]), torch.ones(2, dtype=torch.bool)), 0)
        >>> x.shape, bool(ids.max() < 5), mask.tolist()
        (torch.Size([2, 3]), True, [True, True])
    """
    rng = np.random.default_rng(seed)
    out = []
    for a in args:
        if isinstance(a, torch.Tensor) and a.dtype != torch.bool:
            high = 1 if a.is_floating_point() or not a.numel() else int(a.max()) + 1
            out.append(random_tensor(a.shape, a.dtype, rng, high))
        else:
            out.append(a)
    return tuple(out)


def method_name(method: Method) -> str:
    """How messages name a ``method=`` value: the name itself, or the callable's name.

    Example:
        >>> method_name("encode_image"), method_name(lambda m, x: m(x))
        ('encode_image', '<lambda>')
    """
    if isinstance(method, str):
        return method
    return getattr(method, "__qualname__", None) or getattr(method, "__name__", None) or type(method).__name__


def check_method(method: Any) -> Method:
    """``method`` itself if it is a method name or a callable, else a one-line error.

    Example:
        >>> check_method(3)
        Traceback (most recent call last):
        ...
        layertap.errors.LayertapError: method=3 (int) is neither a method name nor a callable; pass a name ...
    """
    if isinstance(method, str) or callable(method):
        return method
    raise LayertapError(
        f"method={method!r:.80} ({type(method).__name__}) is neither a method name nor a callable; "
        "pass a name such as 'encode_image' or a function fn(model, *args, **kwargs)"
    )


def param_names(fn: Any) -> tuple[str, ...]:
    """Names of the parameters a callable takes by position (``self`` excluded).

    Example:
        >>> param_names(torch.nn.Linear(2, 2).forward)
        ('input',)
    """
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return ()
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return tuple(p.name for p in params if p.kind in kinds)


def first_tensor_index(value: Any) -> str | None:
    """The ``[index]`` text of the first tensor inside a structure, if any.

    Used to suggest an index that works when a selected value is not a tensor.

    Example:
        >>> first_tensor_index({"aux": None, "out": torch.zeros(1)})
        '[out]'
        >>> first_tensor_index((None,)) is None
        True
        >>> first_tensor_index(CallArgs((None, torch.zeros(1)), {}, names=("mask", "hidden")))
        '[hidden]'

    """
    if isinstance(value, CallArgs):
        # name the argument when its parameter name is known: [query], not [0]
        names = {i: n for n, i in value.positional.items()}
        for key, arg in value.items():
            inner = first_tensor_index(arg)
            if inner is not None:
                return f"[{names.get(key, key)}]{inner}"
        return None
    for suffix, _ in flatten(value):
        return suffix
    return None


def not_a_tensor(where: str, value: Any, selector: str) -> SelectorError:
    """The error for a selected value that is not a tensor, with an index that works.

    Example:
        >>> str(not_a_tensor("tap 'm'", (None, torch.zeros(2)), "m"))
        "tap 'm' is tuple(None, Tensor[2]), not a tensor; pick one with an index, e.g. m[1]"
        >>> str(not_a_tensor("tap 'm[b]'", None, "m[b]"))
        "tap 'm[b]' is None, not a tensor; there is no tensor to capture there"
    """
    msg = f"{where} is {describe(value)}, not a tensor"
    hint = first_tensor_index(value)
    if hint is not None:
        return SelectorError(f"{msg}; pick one with an index, e.g. {selector}{hint}")
    return SelectorError(f"{msg}; there is no tensor to capture there")


def _pick_one(value: Any, key: Index, where: str) -> Any:
    if isinstance(value, CallArgs):
        return _pick_argument(value, key, where)
    if is_model_output(value):
        if isinstance(key, int):
            return _seq_item(value.to_tuple(), key, where, value)
        return _map_item(value, key, where)
    if isinstance(value, dict):
        if key not in value and isinstance(key, int) and str(key) in value:
            key = str(key)
        return _map_item(value, key, where)
    if isinstance(value, (tuple, list)):
        if isinstance(key, str):
            fields = getattr(value, "_fields", None)  # namedtuple
            if fields and key in fields:
                return getattr(value, key)
            raise SelectorError(f"{where} is {describe(value)}; index it by position like [0], not [{key}]")
        return _seq_item(value, key, where, value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        names = [f.name for f in dataclasses.fields(value)]
        if isinstance(key, int):
            return _seq_item([getattr(value, n) for n in names], key, where, value)
        return _map_item({n: getattr(value, n) for n in names}, key, where)
    if isinstance(value, torch.Tensor) and key in (0, -1):
        # A module that returns one tensor returns a 1-tuple: [0] is the tensor
        # itself (not its first batch row). This keeps selectors written for
        # ``(hidden,)``-returning layers working where a library version returns
        # a bare tensor, and matches the ONNX side, where [0] on a module with
        # one output tensor is that tensor.
        return value
    if isinstance(value, torch.Tensor):
        raise SelectorError(
            f"{where} is {describe(value)}, one tensor: only [0] applies to it "
            "(selectors pick module results, not slices; slice the saved array instead)"
        )
    raise SelectorError(f"{where} is {describe(value)}; it cannot be indexed by [{key}]")


def _pick_argument(call: CallArgs, key: Index, where: str) -> Any:
    """``[i]``: positional argument ``i``; ``[name]``: keyword, or positional by parameter name."""
    if isinstance(key, int):
        if not -call.nargs <= key < call.nargs:
            raise SelectorError(
                f"{where} is {describe(call)}; positional argument [{key}] is out of range ({call.nargs} given)"
            )
        return call[key % call.nargs]
    by_name = {**{n: call[i] for n, i in call.positional.items()}, **{k: v for k, v in call.items() if isinstance(k, str)}}
    return _map_item(by_name, key, where, whole=call)


def _seq_item(items: Sequence[Any], key: int, where: str, whole: Any) -> Any:
    if not -len(items) <= key < len(items):
        raise SelectorError(f"{where} is {describe(whole)}; index [{key}] is out of range (length {len(items)})")
    return items[key]


def _map_item(mapping: Any, key: Index, where: str, whole: Any = None) -> Any:
    if key not in mapping:
        keys = [str(k) for k in mapping.keys()]
        hint = close_matches(str(key), keys)
        msg = f"{where} is {describe(mapping if whole is None else whole)}; it has no key [{key}]"
        if hint:
            msg += "; did you mean: " + ", ".join(hint)
        raise SelectorError(msg)
    return mapping[key]


def describe(value: Any, depth: int = 0) -> str:
    """One-line structure: ``tuple(Tensor[2,17,64], None)``.

    Example:
        >>> describe((torch.zeros(2, 3), None, {"a": 1}))
        'tuple(Tensor[2,3], None, dict(a=int))'
    """
    if isinstance(value, torch.Tensor):
        dt = "" if value.dtype == torch.float32 else f":{str(value.dtype).replace('torch.', '')}"
        return f"Tensor[{','.join(str(d) for d in value.shape)}]{dt}"
    if value is None:
        return "None"
    if depth > 3:
        return "..."
    if isinstance(value, CallArgs):
        inner = ", ".join(f"{value.label(k)}{describe(v, depth + 1)}" for k, v in value.items())
        return f"args({inner})"
    if isinstance(value, dict):
        name = type(value).__name__ if is_model_output(value) else "dict"
        inner = ", ".join(f"{k}={describe(v, depth + 1)}" for k, v in list(value.items())[:8])
        more = ", ..." if len(value) > 8 else ""
        return f"{name}({inner}{more})"
    if isinstance(value, (tuple, list)):
        inner = ", ".join(describe(v, depth + 1) for v in value[:8])
        more = ", ..." if len(value) > 8 else ""
        return f"{type(value).__name__}({inner}{more})"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        inner = ", ".join(f"{f.name}={describe(getattr(value, f.name), depth + 1)}" for f in dataclasses.fields(value))
        return f"{type(value).__name__}({inner})"
    return type(value).__name__


def flatten(value: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in a structure with its ``[index]`` suffix, in order.

    ``ModelOutput`` fields are keyed by name; ``None`` fields are skipped.

    Example:
        >>> [k for k, _ in flatten((torch.zeros(1), {"a": torch.ones(1)}), "output")]
        ['output[0]', 'output[1][a]']
    """
    if isinstance(value, torch.Tensor):
        yield prefix, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from flatten(v, f"{prefix}[{k}]")
    elif isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            yield from flatten(v, f"{prefix}[{i}]")
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from flatten(getattr(value, f.name), f"{prefix}[{f.name}]")


def summarize(value: Any) -> tuple[list, list]:
    """(shapes, dtypes) of every tensor in a value, in flatten order."""
    shapes, dtypes = [], []
    for _, t in flatten(value):
        shapes.append(list(t.shape))
        dtypes.append(str(t.dtype).replace("torch.", ""))
    return shapes, dtypes
