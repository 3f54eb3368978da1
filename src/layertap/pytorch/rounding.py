"""A PyTorch forward rounded as a reduced-precision candidate holds its values: the *ideal run*
of a PyTorch reference at the candidate's format (``lt.compare(..., precision="auto")``).

What is rounded comes from a :class:`RoundingPlan` (built from the candidate file by
:mod:`layertap.comparing.ideal`; plain data, no torch):

* float16/bfloat16: every floating-point input and output of every operator (at the level of
  PyTorch's dispatcher, so the ops inside a module's ``forward`` too) run inside a module whose
  nodes the candidate computes at that type: weights, activations, the model's inputs. A module
  the candidate keeps in float32 runs unrounded (its inputs arrive rounded from the modules before);
* a quantised candidate: each module call's output (and single input) the candidate quantises is
  fake-quantised with the candidate's scale and zero point; each weight it quantises is rounded on
  the candidate's integer grid (the same number of levels per channel, so a weight a BatchNorm was
  folded into in the file is rounded as finely as the file rounds it); a call whose own operators
  the candidate quantises between them (attention's matmuls and softmax) has those rounded too, with
  the file's formats in the file's order (:attr:`RoundingPlan.inside`).

The model is never changed: parameters are swapped for rounded copies only as operators read them,
and every hook goes when the forward returns.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import torch

from ..numformats import SENTINEL, Format
from .callhooks import CallCounter, CallHooks

_TORCH_TYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class RoundingPlan:
    """What the ideal forward rounds (see the module doc).

    Attributes:
        regions: module path -> the float format its own operators round to (``None``: float32);
            a module not listed takes its nearest listed ancestor's, the root ``""`` included.
        outputs: ``(path, call)`` -> a format per flattened output tensor (``None``: kept); ``("", 0)``: the
            forward's own result.
        inputs: ``(path, call)`` -> the format of the call's single tensor input.
        weights: parameter name -> ``(format, levels)``: a quantised weight's grid (levels per channel).
        model_inputs: a format per flattened tensor argument of the forward (``None``: kept).
        dynamic: for a quantised candidate whose quantisers sit in no module's scope (an optimiser dropped
            them), ``True`` rounds every operator's floating-point output to 8 bits over its own range (per
            tensor, affine): the candidate quantises nearly every activation, on calibrated ranges at least as
            wide, so this ideal is as fine as the file's or finer.
        clamp: the magnitude the converter capped the candidate's float16 weights at (onnxconverter-common's
            ``max_finite_val``), else ``None``: parameters rounded in a float16 region are capped there first.
        inside: ``(path, call)`` -> the candidate's own operators of that call (not its children's), in
            graph order, each as ``(kind, format)``: a call whose values a quantised candidate quantises
            between its operators (an attention block's ``q @ k``, softmax and ``attn @ v``). The call's own
            operators of those kinds (:func:`op_kind`) take the formats in that order, an operator of another
            kind or one not found a few places on keeping its value; ``scaled_dot_product_attention`` runs as
            its math (its matmuls and softmax apart) to be so rounded.

    Example:
        >>> RoundingPlan(regions={"": "float16", "head": None}).region("head.fc"), RoundingPlan().quantises
        (None, False)
    """

    regions: dict[str, str | None] = field(default_factory=dict)
    outputs: dict[tuple[str, int], list[Format | None]] = field(default_factory=dict)
    inputs: dict[tuple[str, int], Format] = field(default_factory=dict)
    weights: dict[str, tuple[Format, np.ndarray]] = field(default_factory=dict)
    model_inputs: list[Format | None] = field(default_factory=list)
    dynamic: bool = False
    clamp: float | None = None
    inside: dict[tuple[str, int], tuple[tuple[str, Format | None], ...]] = field(default_factory=dict)

    def region(self, path: str) -> str | None:
        """The float format of the operators module ``path`` runs itself."""
        while True:
            if path in self.regions:
                return self.regions[path]
            if not path:
                return None
            path = path.rpartition(".")[0]

    @property
    def quantises(self) -> bool:
        return bool(self.outputs or self.inputs or self.weights or any(self.model_inputs))

    @property
    def empty(self) -> bool:
        return not self.quantises and not any(self.regions.values()) and not self.dynamic


def round_tensor(t: torch.Tensor, fmt: Format) -> torch.Tensor:
    """``t`` as ``fmt`` holds it, read back in ``t``'s type (float formats: a round trip; quantised:
    the quantiser's arithmetic, round half to even).

    Example:
        >>> round_tensor(torch.tensor([1.0 + 2**-12]), Format("float16")).tolist()
        [1.0]
        >>> round_tensor(torch.tensor([0.26, 9.0]), Format.quantised("int8", 0.5, 0)).tolist()
        [0.5, 9.0]
    """
    if not t.is_floating_point():
        return t
    low = _TORCH_TYPES.get(fmt.name)
    if low is not None:
        return _round_to(t, low)
    if not fmt.is_quantised:
        return t
    s = _along(t, np.asarray(fmt.scale), fmt.axis)
    z = _along(t, np.asarray(fmt.zero_point), fmt.axis)
    q = torch.clamp(torch.round(t / s) + z, fmt.qmin, fmt.qmax)
    return ((q - z) * s).to(t.dtype)


def round_dynamic(t: torch.Tensor, bits: int = 8) -> torch.Tensor:
    """``t`` rounded to ``bits`` bits over its own range (per tensor, affine, the range widened to hold 0).

    Example:
        >>> round_dynamic(torch.tensor([0.0, 0.1, 1.0]), bits=2).tolist()
        [0.0, 0.0, 1.0]
    """
    if not t.is_floating_point() or t.numel() == 0:
        return t
    lo, hi = torch.clamp(t.min(), max=0.0), torch.clamp(t.max(), min=0.0)
    step = (hi - lo) / (2**bits - 1)
    if not torch.isfinite(step) or step <= 0:
        return t
    zero = torch.round(-lo / step)
    return ((torch.clamp(torch.round(t / step) + zero, 0, 2**bits - 1) - zero) * step).to(t.dtype)


def _round_to(t: torch.Tensor, low: torch.dtype) -> torch.Tensor:
    """``t`` rounded to ``low`` and back, float32's stand-ins for infinity (``|x| >= 1e30``, a mask's
    ``finfo.min``) kept as they were, as :meth:`layertap.numformats.Format.rounded` keeps them."""
    out = t.to(low).to(t.dtype)
    if torch.isinf(out).any():
        big = t.abs() >= SENTINEL
        if big.any():
            out = torch.where(big, t, out)
    return out


def _capped(t: torch.Tensor, cap: float | None, low: torch.dtype) -> torch.Tensor:
    """A weight as a converter that caps stored weights at ``cap`` holds it (:func:`layertap.numformats.capped`:
    values beyond ``low``'s range left to overflow)."""
    if cap is None:
        return t
    mag = t.abs()
    return torch.where((mag > cap) & (mag <= torch.finfo(low).max), torch.full_like(t, cap).copysign(t), t)


def _maybe_round(t: torch.Tensor, fmt: Format | None) -> torch.Tensor:
    return round_tensor(t, fmt) if fmt is not None else t


def round_on_grid(w: torch.Tensor, fmt: Format, levels: np.ndarray) -> torch.Tensor:
    """A weight rounded on a quantiser's grid with ``levels`` steps each side of zero per channel
    (symmetric formats), else with the format's own scale.

    Example:
        >>> round_on_grid(torch.tensor([[1.0, 0.3], [2.0, 0.9]]), Format.quantised("int8", [0.1, 0.2], [0, 0], 0),
        ...               np.array([2.0, 2.0])).tolist()
        [[1.0, 0.5], [2.0, 1.0]]
    """
    if np.any(np.asarray(fmt.zero_point)) or not w.is_floating_point() or w.ndim == 0:
        return round_tensor(w, fmt)
    axis = _channel_axis(w, np.size(levels), fmt.axis)
    if np.size(levels) > 1 and axis is None:
        return w
    lv = torch.as_tensor(np.asarray(levels, np.float32), dtype=w.dtype)
    if axis is None:
        top = w.abs().max()
    else:
        top = w.abs().amax(dim=tuple(i for i in range(w.ndim) if i != axis), keepdim=True)
        shape = [1] * w.ndim
        shape[axis] = -1
        lv = lv.reshape(shape)
    step = torch.where(top > 0, top / lv, torch.ones_like(top))
    return torch.round(w / step) * step


def _channel_axis(w: torch.Tensor, n: int, axis: int | None) -> int | None:
    """The axis of ``w`` that holds ``n`` channels: the format's own first, else the one that fits (a
    PyTorch ``Linear`` weight is the transpose of the file's ``MatMul`` one)."""
    if n <= 1:
        return None
    if axis is not None and w.ndim and w.shape[axis % w.ndim] == n:
        return axis % w.ndim
    fits = [i for i, d in enumerate(w.shape) if d == n]
    return fits[0] if fits else None


def _along(t: torch.Tensor, v: np.ndarray, axis: int | None) -> torch.Tensor:
    value = torch.tensor(np.asarray(v, np.float32), dtype=t.dtype, device=t.device)  # a copy: the file's arrays are read-only
    if value.ndim == 0 or axis is None or t.ndim == 0:
        return value.reshape(()) if value.numel() == 1 else value.mean()
    axis = axis % t.ndim
    if t.shape[axis] != value.numel():
        return value.mean()
    shape = [1] * t.ndim
    shape[axis] = -1
    return value.reshape(shape)


def map_tensors(value: Any, fn: Any) -> Any:
    """``value`` with its i-th flattened tensor replaced by ``fn(i, tensor)`` (tensors, tuples, lists
    and dicts rebuilt; other containers returned as they are)."""
    counter = iter(range(1 << 30))

    def walk(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return fn(next(counter), v)
        if isinstance(v, tuple) and not hasattr(v, "_fields"):
            return tuple(walk(x) for x in v)
        if isinstance(v, list):
            return [walk(x) for x in v]
        if type(v) is dict:
            return {k: walk(x) for k, x in v.items()}
        return v

    return walk(value)


#: aten operators by the ONNX op kind they compute (:func:`op_kind`)
_ATEN_KINDS = {"mm": "matmul", "bmm": "matmul", "matmul": "matmul", "addmm": "gemm", "linear": "gemm",
               "_softmax": "softmax", "softmax": "softmax", "_safe_softmax": "softmax", "mul": "mul", "add": "add",
               "sub": "sub", "div": "div", "gelu": "gelu", "native_layer_norm": "layernorm", "mean": "mean"}
#: how far on in a call's list an operator's kind is looked for (a graph may order a scale before its matmul)
_LOOKAHEAD = 3


def op_kind(name: str) -> str | None:
    """The kind of computation an aten operator or ONNX op is (``None``: not one an ideal run follows).

    Example:
        >>> op_kind("bmm.default"), op_kind("MatMul"), op_kind("Softmax"), op_kind("Transpose")
        ('matmul', 'matmul', 'softmax', None)
    """
    onnx = {"MatMul": "matmul", "Gemm": "gemm", "Softmax": "softmax", "Mul": "mul", "Add": "add", "Sub": "sub",
            "Div": "div", "Gelu": "gelu", "LayerNormalization": "layernorm", "ReduceMean": "mean"}
    return onnx.get(name) or _ATEN_KINDS.get(name.split(".")[0])


class _Regions(CallHooks):
    """Hooks that track the innermost running module (for the dispatcher's rounding) and fake-quantise
    the calls the plan names."""

    def __init__(self, model: Any, plan: RoundingPlan) -> None:
        super().__init__(model)
        self.plan = plan
        self.calls: list[tuple[str, int]] = [("", 0)]  # the running calls, innermost last
        self.cursor: dict[tuple[str, int], int] = {}  # how far each call got in plan.inside
        self.wants_inputs = bool(plan.inputs)
        self.paused = False  # the hooks' own arithmetic and the values copied out are not rounded

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        before, self.paused = self.paused, True
        try:
            yield
        finally:
            self.paused = before

    def on_start(self, mod: Any, path: str, call: int) -> None:
        self.calls.append((path, call))
        self.cursor[(path, call)] = 0

    def inside_format(self, func_name: str) -> Format | None:
        """The format the running call's next own operator of this kind is held in (``plan.inside``)."""
        key = self.calls[-1]
        ops = self.plan.inside.get(key)
        kind = op_kind(func_name) if ops else None
        if not ops or kind is None:
            return None
        at = self.cursor.get(key, 0)
        for j in range(at, min(at + _LOOKAHEAD, len(ops))):
            if ops[j][0] == kind:
                self.cursor[key] = j + 1
                return ops[j][1]
        return None

    def on_inputs(self, mod: Any, path: str, call: int, args: tuple, kwargs: dict) -> Any:
        fmt = self.plan.inputs.get((path, call))
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if fmt is None or len(tensors) != 1 or kwargs and any(isinstance(v, torch.Tensor) for v in kwargs.values()):
            return None
        with self.pause():
            return tuple(round_tensor(a, fmt) if isinstance(a, torch.Tensor) else a for a in args), kwargs

    def on_return(self, mod: Any, path: str, call: int, output: Any) -> Any:
        if len(self.calls) > 1 and self.calls[-1][0] == path:
            self.calls.pop()
        formats = self.plan.outputs.get((path, call))
        if not formats:
            return None
        with self.pause():
            return map_tensors(output, lambda i, t: _maybe_round(t, formats[i] if i < len(formats) else None))

    @property
    def current(self) -> str:
        return self.calls[-1][0]


# operators that only move or view a value: rounding them would round nothing new
_PASSIVE = {"detach", "alias", "clone", "_to_copy", "copy_", "lift_fresh", "view", "_unsafe_view", "t", "transpose",
            "permute", "expand", "reshape", "squeeze", "unsqueeze", "slice", "select", "split", "chunk", "contiguous"}


def _mode_class() -> type:
    from torch.utils._python_dispatch import TorchDispatchMode  # noqa: PLC0415 -- torch's private modules, read when the mode is made
    from torch.utils._pytree import tree_map  # noqa: PLC0415 -- as above

    class RoundingMode(TorchDispatchMode):
        """Rounds the floating-point inputs and outputs of every operator run in a rounded region;
        replaces a quantised weight by its rounded copy wherever an operator reads it."""

        def __init__(self, regions: _Regions, weights: dict[int, torch.Tensor], params: set[int]) -> None:
            super().__init__()
            self.regions = regions
            self.weights = weights
            self.params = params  # ids of the model's parameters and buffers: rounded once, then reused
            self.memo: dict[tuple[int, torch.dtype], torch.Tensor] = {}
            self.done: dict[tuple[int, torch.dtype], tuple[Any, int]] = {}  # tensors rounded already (see _mark)

        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            kwargs = kwargs or {}
            if self.regions.paused:
                return func(*args, **kwargs)
            if self.weights:
                args = tree_map(lambda a: self.weights.get(id(a), a) if isinstance(a, torch.Tensor) else a, args)
            plan = self.regions.plan
            name = plan.region(self.regions.current)
            low = _TORCH_TYPES.get(name) if name else None
            passive = func.__name__.split(".")[0] in _PASSIVE
            # the candidate's own format for this operator where the plan follows the call's operators, else
            # (dynamic) 8 bits over the value's own range
            fmt = self.regions.inside_format(func.__name__) if plan.inside and not passive else None
            if (fmt is not None or plan.dynamic) and not passive and not func._schema.is_mutable:
                out = func(*args, **kwargs)
                return tree_map(lambda t: (round_tensor(t, fmt) if fmt is not None else round_dynamic(t))
                                if isinstance(t, torch.Tensor) and t.is_floating_point() else t, out)
            if low is None or passive:
                return func(*args, **kwargs)

            def rounded(t: Any) -> Any:
                if not isinstance(t, torch.Tensor) or t.dtype not in (torch.float32, torch.float64):
                    return t
                key = (id(t), low)
                if id(t) in self.params:
                    if key not in self.memo:
                        self.memo[key] = _round_to(_capped(t, plan.clamp, low), low)
                    return self.memo[key]
                seen = self.done.get(key)
                if seen is not None and seen[0]() is t and seen[1] == t._version:
                    return t  # rounded when an operator made it, and unchanged since
                out = _round_to(t, low)
                self._mark(out, key=(id(out), low))
                return out

            if func._schema.is_mutable:  # in place: round what it wrote, in place too
                out = func(*args, **kwargs)
                tree_map(lambda t: t.copy_(rounded(t)) if isinstance(t, torch.Tensor) and t.is_floating_point() else t, out)
                return out
            return tree_map(rounded, func(*tree_map(rounded, args), **tree_map(rounded, kwargs)))

        def _mark(self, t: torch.Tensor, key: tuple[int, Any]) -> None:
            """Remember a tensor this mode rounded (a weak reference and its version): as the next operator's
            input it is not rounded again."""
            try:
                self.done[key] = (weakref.ref(t), t._version)
            except TypeError:  # a tensor subclass without weak references: rounded again, which changes nothing
                pass

    return RoundingMode


@contextlib.contextmanager
def rounded(model: Any, plan: RoundingPlan) -> Iterator[Any]:
    """Run ``model`` (any of its methods) inside: its operators and calls are rounded as ``plan`` says.
    Yields two functions: one rounds the forward's own tensor arguments (``plan.model_inputs``), the other
    its result (``plan.outputs[("", 0)]``).

    Enter it before other hooks that should see the rounded values (forward hooks run in the order
    they were added).

    Example:
        >>> m = torch.nn.Linear(2, 1).eval()
        >>> with torch.no_grad():
        ...     _ = m.weight.fill_(1.0), m.bias.fill_(0.0)
        ...     with rounded(m, RoundingPlan(regions={"": "float16"})):
        ...         y = m(torch.tensor([[1.0, 2.0**-12]]))
        >>> y.item(), m.weight.dtype
        (1.0, torch.float32)
    """
    with _rounding(model, plan) as (_, inputs, result):
        yield inputs, result


@contextlib.contextmanager
def rounded_calls(model: Any, plan: RoundingPlan) -> Iterator[Callable[[Any, tuple, dict, Mapping[int, int]], Any]]:
    """Inside, the yielded ``call(module, args, kwargs, counts)`` runs one of ``model``'s modules alone, rounded as
    ``plan`` says (its hooks and rounded weights made once for every call): ``counts``, how many calls of each
    module (by :func:`~layertap.pytorch.callhooks.module_key`) had started before it in the whole forward,
    numbers its calls as the forward did (the plan's formats are per call).

    Example:
        >>> m = torch.nn.Sequential(torch.nn.Identity()).eval()
        >>> with rounded_calls(m, RoundingPlan(regions={"": "float16"})) as call:
        ...     call(m[0], (torch.tensor([1.0 + 2**-12]),), {}, {}).item()
        1.0
    """
    with _rounding(model, plan) as (regions, _, _):
        def call(module: Any, args: tuple, kwargs: dict, counts: Mapping[int, int]) -> Any:
            regions.counter = CallCounter()
            regions.counter.started.update(counts)
            regions.calls = [("", 0)]
            return module(*args, **kwargs)

        yield call


@contextlib.contextmanager
def _rounding(model: Any, plan: RoundingPlan) -> Iterator[tuple[Any, Any, Any]]:
    """:func:`rounded`'s hooks and dispatch mode; yields ``(the hooks' state, round inputs, round result)``."""
    regions = _Regions(model, plan)
    weights = _rounded_weights(model, plan)
    params = {id(p) for p in model.parameters()} | {id(b) for b in model.buffers()}
    mode = (_mode_class()(regions, weights, params)
            if (any(plan.regions.values()) or weights or plan.dynamic or plan.inside) else None)

    def inputs(args: tuple) -> tuple:
        if not any(plan.model_inputs):
            return args
        return map_tensors(args, lambda i, t: _maybe_round(t, plan.model_inputs[i] if i < len(plan.model_inputs) else None))

    def result(value: Any) -> Any:
        formats = plan.outputs.get(("", 0))
        if not formats or not any(formats):
            return value
        with regions.pause():
            return map_tensors(value, lambda i, t: _maybe_round(t, formats[i] if i < len(formats) else None))

    with regions.hooks(), _sdpa_as_math(bool(plan.inside)):
        if mode is None:
            yield regions, inputs, result
            return
        with mode:
            yield regions, inputs, result


@contextlib.contextmanager
def _sdpa_as_math(wanted: bool) -> Iterator[None]:
    """``scaled_dot_product_attention`` as its math (matmul, softmax, matmul: operators the dispatcher sees
    apart) while ``wanted``; a fused kernel would be one operator, rounded only at its end."""
    if not wanted:
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415 -- only for a plan that rounds inside

    with sdpa_kernel(SDPBackend.MATH):
        yield


def _rounded_weights(model: Any, plan: RoundingPlan) -> dict[int, torch.Tensor]:
    """id(parameter) -> its copy rounded on the candidate's grid (the parameters stay as they are)."""
    out: dict[int, torch.Tensor] = {}
    if not plan.weights:
        return out
    with torch.no_grad():
        for name, p in model.named_parameters():
            hit = plan.weights.get(name)
            if hit is not None:
                out[id(p)] = round_on_grid(p.detach(), *hit)
    return out
