"""The PyTorch-side API: ``lt.tap`` and ``lt.extract``."""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import nn

from ..errors import LayertapError, SelectorError, unique_names, unknown_name
from ..selectors import Tap, index_text, parse_taps
from .capture import Capture, StopForward, _input_value, eager
from .values import Method, check_method, describe, flatten, not_a_tensor, param_names, pick, tensor_to_numpy


class TapResult:
    """What ``lt.tap`` yields: ``outputs`` is filled when the block exits.

    Attributes:
        outputs: dict name -> tensor, in the order the values were captured.

    Example:
        >>> import torch, layertap as lt
        >>> net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
        >>> with lt.tap(net, ["0", "1:input"]) as taps:
        ...     _ = net(torch.ones(1, 4))
        >>> isinstance(taps, lt.TapResult), list(taps.outputs), taps["0"].shape
        (True, ['0', '1:input'], torch.Size([1, 3]))
    """

    def __init__(self, capture: Capture) -> None:
        self._capture = capture
        self.outputs: dict[str, torch.Tensor] = {}
        self._stopped = False

    @property
    def stopped(self) -> bool:
        """True if ``stop_early`` cut the forward short."""
        return self._stopped

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.outputs:
            raise KeyError(unknown_name("tap", name, self.outputs))
        return self.outputs[name]

    def __repr__(self) -> str:
        return f"TapResult({', '.join(f'{k}: {describe(v)}' for k, v in self.outputs.items())})"


@contextlib.contextmanager
def tap(
    model: nn.Module,
    taps: Sequence[str | Tap],
    *,
    detach: bool = True,
    stop_early: bool = False,
    method: Method = "forward",
) -> Iterator[TapResult]:
    """Capture module inputs/outputs while the ``with`` block runs.

    Hooks exist only inside the block and are removed on every exit path,
    exceptions included. Calls accumulate across several forwards in one
    block (a second forward's ``layer1`` is ``layer1#1``).

    Args:
        model: the root module; tap paths are relative to it.
        taps: selectors such as ``"layer1"``, ``"layer2.0.relu#1"``, ``"fc:input"``.
        detach: store detached clones (default) or clones that keep autograd.
        stop_early: end the forward once every tap is captured; the block's
            forward call then does not return (the ``with`` swallows the stop).
        method: the root method the block will run, a name or a callable
            ``fn(model, *args, **kwargs)`` (``stop_early`` reads a named
            method's source to know when a tapped module cannot run again).

    Returns:
        A :class:`TapResult`; its ``outputs`` dict is filled on exit.

    Example:
        >>> import torchvision, torch
        >>> model = torchvision.models.resnet18().eval()
        >>> with tap(model, ["layer4.0.conv1", "fc:input"]) as taps:
        ...     y = model(torch.randn(1, 3, 64, 64))
        >>> {k: tuple(v.shape) for k, v in taps.outputs.items()}
        {'layer4.0.conv1': (1, 512, 2, 2), 'fc:input': (1, 512)}
    """
    cap = Capture(model, taps, detach=detach, stop_early=stop_early, method=method)
    result = TapResult(cap)
    cap.attach()
    try:
        yield result
    except StopForward:
        result._stopped = True
    finally:
        cap.remove()
    result.outputs = cap.results()


def extract(
    model: nn.Module,
    *args: Any,
    taps: Sequence[str | Tap],
    method: Method = "forward",
    stop_early: bool = False,
    detach: bool = True,
    memory_budget: int | None = None,
    **kwargs: Any,
) -> "Extraction":
    """Run ``model.<method>(*args, **kwargs)`` once and return the tapped values.

    Args:
        model: the root module.
        *args, **kwargs: the method's arguments.
        taps: selectors (see SPEC: ``[ALIAS=]PATH[#CALL][:input][INDEX]...``).
        method: the method to run (``"forward"``, ``"encode_image"``, ...) or a
            callable ``fn(model, *args, **kwargs)`` that may call several
            methods; root taps (``":input"``, ``"[0]"``) then read its
            arguments and result, as in ``lt.export``.
        stop_early: stop as soon as every tap is complete, so later layers
            never run; ``"output"`` is then absent. A tap without ``#CALL`` is
            complete once no further call of its module can follow (layertap
            reads the callers' source to know; when unsure it waits longer,
            never returns fewer calls).
        detach: return detached tensors (default) or keep autograd.
        memory_budget: bytes of captured values held in memory; beyond it they go to a
            temporary file and come back as memory-mapped tensors (a long ``generate``
            with many taps). ``None`` (default): all in memory.

    Returns:
        :class:`Extraction` (a dict) name -> tensor in capture order, then ``"output"`` (or
        ``"output[0]"``, ``"output[logits]"``... for structured results).

    Example:
        >>> import torchvision, torch
        >>> model = torchvision.models.resnet18().eval()
        >>> out = extract(model, torch.randn(1, 3, 64, 64), taps=["layer2.0.relu"], stop_early=True)
        >>> list(out)
        ['layer2.0.relu#0', 'layer2.0.relu#1']
    """
    if memory_budget is not None and (isinstance(memory_budget, bool) or not isinstance(memory_budget, int)
                                      or memory_budget < 0):
        raise LayertapError(f"memory_budget must be a number of bytes >= 0, got {memory_budget!r}")
    parsed = parse_taps(taps)
    # `""` names the model's result, which is always returned: hooked too, it would be saved twice
    whole_result = any(is_model_output(t) for t in parsed)
    parsed = [t for t in parsed if not is_model_output(t)]
    stop_early = stop_early and not whole_result  # the root finishes last: nothing to cut
    model = eager(model)  # a torch.compile wrapper: tap the original module (compiled graphs run no hooks)
    fn = bound_method(model, method)
    root_taps = served_at_root(parsed, method)
    hooked = [t for t in parsed if t not in root_taps]
    inputs = [(t.name, root_value(t, root_input(args, kwargs, t, fn), detach)) for t in root_taps if t.port == "input"]
    cap = Capture(model, hooked, detach=detach, stop_early=stop_early, method=method, memory_budget=memory_budget)
    out: Any = None
    stopped = False
    grad = contextlib.nullcontext() if not detach else torch.no_grad()
    with grad, cap:
        try:
            out = fn(*args, **kwargs)
        except StopForward:
            stopped = True
    try:
        captured = list(cap.results().items())
    finally:
        cap.release_disk()
    if stopped:
        return Extraction(unique_names(inputs, captured), spilled=cap.spilled)
    outputs = [(t.name, root_value(t, out, detach)) for t in root_taps if t.port == "output"]
    return Extraction(unique_names(inputs, captured, outputs, output_tensors(out, detach=detach).items()),
                      spilled=cap.spilled)


class Extraction(dict):
    """What :func:`extract` returns: a plain ``dict`` name -> tensor that a notebook
    shows as feature-map thumbnails, histograms and NaN/Inf counts.

    Example:
        >>> e = Extraction({"x": torch.ones(1, 2, 4, 4)})
        >>> isinstance(e, dict), "data:image/png;base64," in e._repr_html_(), e.spilled
        (True, True, 0)
    """

    def __init__(self, values: Any = (), *, spilled: int = 0) -> None:
        super().__init__(values)
        #: bytes of captured values held on disk (memory-mapped) beyond ``memory_budget``
        self.spilled = spilled

    def _repr_html_(self) -> str:
        from ..reports import tensors_html  # noqa: PLC0415 -- reports draw lazily (docs/ARCHITECTURE.md)

        return tensors_html({k: tensor_to_numpy(v) for k, v in self.items() if isinstance(v, torch.Tensor)})


def is_model_output(tap: Tap) -> bool:
    """``""`` (the root's output, no alias, no index): the model's result, ``output``.

    Example:
        >>> is_model_output(Tap.parse("")), is_model_output(Tap.parse("y=")), is_model_output(Tap.parse(":input"))
        (True, False, False)
    """
    return tap.path == "" and tap.port == "output" and not tap.index and tap.alias is None and tap.call in (None, 0, -1)


def bound_method(model: nn.Module, method: Method) -> Callable[..., Any]:
    """What runs ``method`` on ``model``: ``model`` itself for ``forward`` (so
    hooks fire), the bound method for another name, and a callable
    ``fn(model, *args, **kwargs)`` with the model bound as its first argument.

    Example:
        >>> bound_method(nn.Linear(2, 2), lambda m, x: m(x) * 2)(torch.ones(1, 2)).shape
        torch.Size([1, 2])
        >>> bound_method(nn.Linear(2, 2), "encode")
        Traceback (most recent call last):
        ...
        layertap.errors.LayertapError: unknown method of Linear 'encode' (Linear's own methods: extra_repr, forward, reset_parameters)
    """
    if not isinstance(model, nn.Module):
        raise LayertapError(f"expected a torch.nn.Module, got {type(model).__name__}")
    method = check_method(method)
    if not isinstance(method, str):
        return functools.partial(method, model)
    if method == "forward":
        return model
    fn = getattr(model, method, None)
    if not callable(fn) or method.startswith("_"):
        cls = type(model)
        names = [n for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n, None))]
        # The class's own methods (not nn.Module's) are the likely candidates.
        own = [n for n in names if getattr(cls, n, None) is not getattr(nn.Module, n, None)]
        hint = f"{cls.__name__}'s own methods: {', '.join(own[:10])}" if own else ""
        raise LayertapError(unknown_name(f"method of {cls.__name__}", method, names, hint=hint))
    return fn


def served_at_root(taps: Sequence[Tap], method: Method) -> list[Tap]:
    """The root taps that the method's own arguments and result serve.

    Hooks on the root module fire only when it is called, which a method
    other than ``forward`` (or a callable) need not do; such taps read the
    call itself instead (:func:`root_input`, :func:`root_value`).

    Example:
        >>> taps = [Tap.parse(":input"), Tap.parse("0")]
        >>> served_at_root(taps, "forward"), [t.name for t in served_at_root(taps, lambda m, x: m(x))]
        ([], [':input'])
    """
    return [t for t in taps if t.path == "" and not (isinstance(method, str) and method == "forward")]


def output_tensors(out: Any, *, detach: bool = True, name: str = "output") -> dict[str, torch.Tensor]:
    """The model's result as ``{"output": t}`` or flattened ``output[...]`` keys.

    Example:
        >>> list(output_tensors((torch.zeros(1), {"a": torch.ones(1)})))
        ['output[0]', 'output[1][a]']
    """
    items = unique_names(flatten(out, name), what="parts of the model's result",
                         hint="its keys print the same (e.g. 1 and '1'); return distinct keys")
    if detach:
        items = {k: v.detach() for k, v in items.items()}
    return items


def root_input(args: tuple, kwargs: dict, tap: Tap, fn: Any = None) -> Any:
    """The arguments of the root method as an ``:input`` tap sees them
    (``fn``, the bound method, names positional arguments)."""
    return _input_value(args, kwargs, tap, param_names(fn) if fn is not None else ())


def root_value(tap: Tap, value: Any, detach: bool) -> torch.Tensor:
    """The tensor a root tap (``""``, ``:input``, ``[index]``) selects from the
    method's arguments or result, cloned (and detached unless ``detach=False``).

    Example:
        >>> root_value(Tap.parse("[1]"), (torch.zeros(1), torch.ones(2)), detach=True)
        tensor([1., 1.])
    """
    if tap.call not in (None, 0, -1):
        raise SelectorError(f"tap {str(tap)!r}: the root method runs once; call #{tap.call} is out of range")
    where = f"tap {tap.name!r}: root {tap.port}"
    value = pick(value, tap.index, where=where)
    if not isinstance(value, torch.Tensor):
        raise not_a_tensor(f"{where}{index_text(tap.index)}", value, tap.canonical)
    return value.detach().clone() if detach else value.clone()
