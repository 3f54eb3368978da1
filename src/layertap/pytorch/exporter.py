"""The dynamo exporter as the PyTorch side uses it: quietly (:func:`quiet`, for every export layertap runs),
and in memory for the scopes it writes (:func:`dynamo_graph`, which a file a tool stripped of them borrows
through :mod:`layertap.onnxfile.scopemap.lent`)."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch
from torch import nn

from .lowering import as_args
from .wrapper import TapWrapper

if TYPE_CHECKING:  # pragma: no cover
    import onnx


def dynamo_graph(model: nn.Module, args: Any, kwargs: dict | None = None,
                 method: str | Callable[..., Any] = "forward") -> "onnx.ModelProto":
    """The graph the default (dynamo) exporter writes for ``model``, without its weights: its nodes' scopes,
    names and the shapes of its values, which a file of the same model that a tool stripped of scopes lacks.

    Exported in memory as ``torch.onnx.export(model, args, dynamo=True)`` exports it by default (another
    ``method`` through the tap wrapper, whose attribute then prefixes every scope, as in a file exported so);
    nothing is written. Kept per model and call signature (shapes and dtypes), so a model compared again is
    not exported again. Raises what the exporter raises.

    Example:
        >>> m = nn.Sequential(nn.Linear(4, 3), nn.ReLU()).eval()
        >>> g = dynamo_graph(m, (torch.ones(2, 4),)).graph
        >>> relu = next(n for n in g.node if n.op_type == "Relu")
        >>> relu.output[0], [p.value for p in relu.metadata_props if p.key == "pkg.torch.onnx.name_scopes"]
        ('relu', ["['', '1', 'relu']"])
    """
    key = (method if isinstance(method, str) else id(method), _signature((as_args(args), kwargs or {})))
    held = _EXPORTED.setdefault(model, {})
    if key not in held:  # several comparisons of one model (fix's, a sweep's) export it once
        held[key] = _dynamo_graph(model, args, kwargs, method)
    return held[key]


#: dynamo_graph's exports, per model (gone with it) and call signature
_EXPORTED: "weakref.WeakKeyDictionary[nn.Module, dict[tuple, onnx.ModelProto]]" = weakref.WeakKeyDictionary()


def _signature(value: Any) -> tuple:
    """What decides an export's graph in a call's arguments: each tensor's shape and dtype, other values as such."""
    leaves, spec = torch.utils._pytree.tree_flatten(value)
    return (str(spec),) + tuple((tuple(v.shape), str(v.dtype)) if isinstance(v, torch.Tensor) else repr(v)[:200]
                                for v in leaves)


def _dynamo_graph(model: nn.Module, args: Any, kwargs: dict | None, method: str | Callable[..., Any]) -> "onnx.ModelProto":
    import onnx_ir as ir  # noqa: PLC0415 -- only for a file without scopes

    if method == "forward":  # as the user exported it: the wrapper would rename the last tensors (``detach``)
        target, traced, named = model, as_args(args), kwargs or None
    else:
        target = TapWrapper(model, method, [], as_args(args), dict(kwargs or {}))
        traced, named = tuple(target.example_tensors), None
    with quiet():
        program = torch.onnx.export(target, traced, kwargs=named, dynamo=True, verbose=False)
    if program is None:  # pragma: no cover - torch returns the program when no file is given
        raise RuntimeError("the dynamo exporter returned no program")
    program.model.graph.initializers.clear()  # the structure is what is read: no copy of the weights
    return ir.to_proto(program.model)


def _no_onnx_log(*_args: Any) -> None:
    """Stand-in for ``torch._C._jit_onnx_log`` while exporting (see :func:`quiet`)."""


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence the exporters' chatter; real problems still raise.

    torch.export logs guards and prints graph dumps on stderr (pages of them
    when it fails), which would bury the one-line error; the exception itself
    keeps the details (``--debug`` shows them). The TorchScript exporter
    turns its C++ log on for every export (its ``setup_onnx_logging`` tests
    the function ``_jit_is_onnx_log_enabled`` instead of calling it) and, on
    failure, writes the whole TorchScript graph to C++ stdout, where it would
    corrupt ``--json``; its log function is swapped for a no-op meanwhile.

    Grad mode is left as it is: under ``torch.no_grad()``,
    ``nn.MultiheadAttention`` takes its fused fast path
    (``aten::_native_multi_head_attention``), which the TorchScript exporter
    cannot export.
    """
    previous = logging.root.manager.disable
    logging.disable(max(previous, logging.WARNING))
    onnx_log = getattr(torch._C, "_jit_onnx_log", None)
    if onnx_log is not None:
        torch._C._jit_onnx_log = _no_onnx_log
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            yield
    finally:
        logging.disable(previous)
        if onnx_log is not None:
            torch._C._jit_onnx_log = onnx_log


