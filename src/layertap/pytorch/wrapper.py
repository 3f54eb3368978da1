"""The module that ``lt.export`` hands to the exporter (ONNX, and torch.export for ExecuTorch programs).

:class:`TapWrapper` runs the user's method with a :class:`Capture` attached
and returns a flat tuple: the method's own result (flattened like
``lt.extract`` names it) followed by every tapped tensor in the order the taps
were given. The first eager run fixes the output names; exported graphs are
then named position by position from them.
"""

from __future__ import annotations

import inspect
import itertools
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import nn

from ..errors import LayertapError, SelectorError
from ..selectors import Tap
from .capture import Capture
from .taps import bound_method, is_model_output, output_tensors, root_input, root_value, served_at_root

#: the wrapper attributes through which exporters reach the user's model; they
#: prefix every module scope in the raw export (``model.layer1``, ``/model/layer1``;
#: ``_fn.layer1`` when the model was also registered as ``_fn``, as it once was)
MODEL_ATTRIBUTES = ("model", "_fn")

_TOKENS = itertools.count()
_OUTPUTS: dict[int, list] = {}


@dataclass(frozen=True)
class OutputInfo:
    """Where one graph output comes from (the ``layertap.taps`` record)."""

    name: str
    selector: str | None
    path: str | None
    call: int | None
    port: str | None
    index: list

    def record(self) -> dict:
        return {
            "name": self.name,
            "selector": self.selector,
            "path": self.path,
            "call": self.call,
            "port": self.port,
            "index": list(self.index),
        }


class TapWrapper(nn.Module):
    """``forward(*tensors)`` -> (model outputs..., taps...) as one flat tuple.

    Args:
        model: the user's module (registered as a child, so its parameters
            become the graph's initializers under their usual names).
        method: a method name or a callable ``fn(model, *args, **kwargs)``.
        taps: parsed selectors, in output order.
        args, kwargs: the example call; tensors become graph inputs, anything
            else is fixed into the graph as a constant.

    Example:
        >>> m = nn.Sequential(nn.Linear(4, 3), nn.ReLU()).eval()
        >>> w = TapWrapper(m, "forward", [Tap.parse("0")], (torch.ones(2, 4),), {})
        >>> _ = w(*w.example_tensors)
        >>> [o.name for o in w.outputs]
        ['output', '0']
    """

    #: runs the method on the model (see :func:`~layertap.pytorch.taps.bound_method`)
    _fn: Callable[..., Any]

    def __init__(
        self,
        model: nn.Module,
        method: str | Callable[..., Any],
        taps: Sequence[Tap],
        args: tuple,
        kwargs: dict,
    ) -> None:
        super().__init__()
        self.model = model
        # Mirror the model's mode without .train()/.eval(), which would recurse
        # into (and change) the user's model.
        self.training = model.training
        self.method = method
        # The root's own output under its default name is the model output,
        # already exported as ``output`` (lt.extract merges it the same way).
        self.taps = [t for t in taps if not is_model_output(t)]
        # Past nn.Module.__setattr__: for ``forward`` this is the model itself, and a
        # second registration would hand the exporter every weight twice (as many
        # graph inputs again to trace and decompose: lt.export ran 1.5x a plain export).
        self.__dict__["_fn"] = bound_method(model, method)
        self._root_taps = served_at_root(self.taps, method)
        self._hooked = [t for t in self.taps if t not in self._root_taps]
        # Rebuild the call from the flat tensor list: ("t", i) or ("c", value).
        self._arg_slots, self._kw_slots, self.example_tensors = _split_tensors(args, kwargs)
        # The exporter may trace a copy of this module (and restores its
        # attributes), so the names recorded by the traced run live outside it,
        # under a token that copies share.
        self._token = next(_TOKENS)
        _OUTPUTS[self._token] = []
        weakref.finalize(self, _OUTPUTS.pop, self._token, None)

    @property
    def outputs(self) -> list[OutputInfo]:
        """Name and source of each output, known after the first run."""
        return _OUTPUTS[self._token]

    #: the outputs returned, by position (``None``: all); an ExecuTorch program returns each tensor once
    #: (:func:`~layertap.pytorch.lowering.tapped_wrapper`)
    keep: list[int] | None = None

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values = self.run(tensors)
        return tuple(values) if self.keep is None else tuple(values[i] for i in self.keep)

    def run(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """One call; the first one records :attr:`outputs` (names and sources)."""
        args = tuple(tensors[v] if k == "t" else v for k, v in self._arg_slots)
        kwargs = {name: (tensors[v] if k == "t" else v) for name, (k, v) in self._kw_slots.items()}
        cap = Capture(self.model, self._hooked, method=self.method)
        with cap:
            out = self._fn(*args, **kwargs)
        captured = cap.results()
        model_out = output_tensors(out)
        infos: list[OutputInfo] = [OutputInfo(n, None, None, None, None, []) for n in model_out]
        values = list(model_out.values())
        for tap in self.taps:
            if tap in self._root_taps:
                src = root_input(args, kwargs, tap, self._fn) if tap.port == "input" else out
                values.append(root_value(tap, src, detach=True))
                infos.append(_info(tap, tap.name, 0))
                continue
            for name, call in _names_of(tap, cap):
                values.append(captured[name])
                infos.append(_info(tap, name, call))
        if not self.outputs:
            _check_unique(infos)
            self.outputs[:] = infos
        elif [i.name for i in infos] != [o.name for o in self.outputs]:
            raise LayertapError(
                "the model returned a different set of outputs for another input (e.g. a module ran a "
                "different number of times); export with --static or pin calls with #CALL"
            )
        return values


def input_names(
    model: nn.Module,
    method: str | Callable[..., Any],
    args: tuple,
    kwargs: dict,
) -> list[str]:
    """Names for the tensor arguments, from the method's signature.

    Positional tensors take their parameter's name (``pixel_values``,
    ``input_ids``, ``x``); ``*args`` give ``args_0``..; keyword tensors keep
    their keyword; anything unnamed is ``input_<i>``.

    Example:
        >>> input_names(nn.Linear(2, 2), "forward", (torch.ones(1, 2),), {})
        ['input']
    """
    params: list[inspect.Parameter] = []
    try:
        target = getattr(model, method) if isinstance(method, str) else method
        params = list(inspect.signature(target).parameters.values())
        if not isinstance(method, str):
            params = params[1:]  # fn(model, *args): the first parameter is the model
    except (TypeError, ValueError, AttributeError):
        params = []
    names: list[str] = []
    pos = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    var = next((p for p in params if p.kind == p.VAR_POSITIONAL), None)
    for i, a in enumerate(args):
        if i < len(pos):
            name = pos[i].name
        elif var is not None:
            name = f"{var.name}_{i - len(pos)}"
        else:
            name = f"input_{i}"
        if isinstance(a, torch.Tensor):
            names.append(name)
    names.extend(k for k, v in kwargs.items() if isinstance(v, torch.Tensor))
    # Two parameters cannot share a name, but the fallbacks could.
    seen: dict[str, int] = {}
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n}_{seen[n] - 1}")
    return out


# -- internals ---------------------------------------------------------------
def _split_tensors(args: tuple, kwargs: dict):
    tensors: list[torch.Tensor] = []

    def slot(v: Any):
        if isinstance(v, torch.Tensor):
            tensors.append(v)
            return ("t", len(tensors) - 1)
        return ("c", v)

    arg_slots = [slot(a) for a in args]
    kw_slots = {k: slot(v) for k, v in kwargs.items()}
    if not tensors:
        raise LayertapError("export needs at least one tensor argument; pass the example inputs as tensors")
    return arg_slots, kw_slots, tuple(tensors)


def _names_of(tap: Tap, cap: Capture) -> list[tuple[str, int]]:
    """(name, call) of each tensor one tap yields, in call order."""
    ran = cap.calls(tap.path)
    if tap.call is not None:
        call = tap.call if tap.call >= 0 else ran + tap.call
        return [(tap.name, call)]
    if ran == 1:
        return [(tap.name, 0)]
    return [(tap.name_for_call(c), c) for c in range(ran)]


def _info(tap: Tap, name: str, call: int) -> OutputInfo:
    return OutputInfo(
        name=name,
        selector=tap.with_call(call).canonical if tap.call is not None or name != tap.name else tap.canonical,
        path=tap.path,
        call=call,
        port=tap.port,
        index=list(tap.index),
    )


def _check_unique(infos: list[OutputInfo]) -> None:
    seen: dict[str, OutputInfo] = {}
    for info in infos:
        if info.name in seen:
            raise SelectorError(
                f"two outputs are both named {info.name!r} (a tap name clashes with the model's output or "
                "with another tap's PATH#k name); give the tap an alias (NAME=selector)"
            )
        seen[info.name] = info
