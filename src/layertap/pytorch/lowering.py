"""ExecuTorch lowering of a PyTorch model (imported only for a ``.pte``): the recipe a program is lowered by,
and the lowering itself, shared by ``lt.export`` (:mod:`layertap.exporting.executorch`), ``compare`` (the
model lowered again with a tap at every module) and ``fix`` (int8 with modules kept float32).

The model, wrapped with its taps (:class:`~.wrapper.TapWrapper`: the method's result flattened, then each
tapped tensor), is exported with ``torch.export`` at the example's sizes (ExecuTorch programs have static
shapes), optionally quantised to int8 by the XNNPACK quantizer (pt2e: prepare, calibrate, convert; modules
in ``keep_float`` excluded by a quantizer filter), lowered by ``to_edge_transform_and_lower`` for a backend
(``xnnpack``: its partitioner; ``portable``: ExecuTorch's portable kernels) and serialized. An int8
lowering also returns the quantised model (fake-quant arithmetic in float), what the program should compute.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.fx
from torch import nn
from torch.export.graph_signature import InputKind

from ..errors import InputSpecError, LayertapError, missing_executorch, one_line, unknown_name
from ..noise import quiet_registrations
from ..selectors import Tap
from .callhooks import CallHooks
from .taps import bound_method
from .wrapper import MODEL_ATTRIBUTES, TapWrapper

#: backends a program is lowered for
BACKENDS = ("xnnpack", "portable")
#: the quantisations ``--quantize`` names
QUANTIZE = ("int8",)
#: random calibration samples drawn when none are given
CALIB_SAMPLES = 16
#: an int8 program is verified against the quantised model in PyTorch within this many of its
#: output's quanta (XNNPACK's requantisation rounds where PyTorch's fake-quant arithmetic does not)
INT8_QUANTA = 2.0


@dataclass
class Recipe:
    """How a program is lowered: its backend, quantisation, the calibration samples and the modules
    kept float32 in an int8 program.

    Example:
        >>> Recipe().record()
        {'backend': 'xnnpack', 'quantize': None, 'keep_float': []}
    """

    backend: str = "xnnpack"
    quantize: str | None = None
    #: calibration samples, each a tuple of tensors as the example (int8 only)
    calibration: list[tuple] = field(default_factory=list)
    keep_float: Sequence[str] = ()

    def record(self) -> dict[str, Any]:
        """The sidecar's ``recipe``."""
        return {"backend": self.backend, "quantize": self.quantize, "keep_float": list(self.keep_float)}

    def check(self) -> "Recipe":
        """The recipe, its names checked (one-line errors naming the known ones)."""
        if self.backend not in BACKENDS:
            raise LayertapError(unknown_name("backend", str(self.backend), list(BACKENDS)))
        if self.quantize is not None and self.quantize not in QUANTIZE:
            raise LayertapError(unknown_name("quantisation", str(self.quantize), list(QUANTIZE)))
        if self.quantize and self.backend != "xnnpack":
            raise LayertapError("--quantize int8 lowers through the XNNPACK quantizer: use --backend xnnpack")
        return self


@dataclass
class Lowered:
    """A lowered program: its bytes, and for an int8 one the quantised model in PyTorch (fake-quant
    arithmetic in float: what the program should compute)."""

    buffer: bytes
    quantized: Any = None


@dataclass
class Tapped:
    """A model wrapped with its taps for lowering: the example tensors, the eager run's values (one per
    output name) and, per output, what it repeats (``None``: a value of its own; ``{"same_as": NAME}``: the
    very tensor of an earlier output; ``{"input": I}``: input ``I`` itself). A program returns each tensor
    once (XNNPACK refuses an output that is an input or another output), so repeats are not program outputs."""

    wrapper: TapWrapper
    example: tuple
    reference: list[torch.Tensor]
    same: list[dict[str, Any] | None]

    def records(self) -> list[dict[str, Any]]:
        """The sidecar's output records: ``layertap.taps`` records, with what a repeat repeats."""
        return [{**o.record(), **(s or {})} for o, s in zip(self.wrapper.outputs, self.same)]


def tapped_wrapper(model: nn.Module, method: str | Callable[..., Any], taps: Sequence[Tap], args: Any,
                   kwargs: dict | None) -> Tapped:
    """The model wrapped with its taps, run once eagerly (which fixes the output names; a bad tap fails
    here, in a second), set to return each tensor once.

    Example:
        >>> m = nn.Sequential(nn.Linear(4, 3), nn.ReLU()).eval()
        >>> t = tapped_wrapper(m, "forward", [Tap.parse("0"), Tap.parse("1")], (torch.ones(2, 4),), None)
        >>> [o.name for o in t.wrapper.outputs], t.same, t.wrapper.keep
        (['output', '0', '1'], [None, None, {'same_as': 'output'}], [0, 1])
    """
    wrapper = TapWrapper(model, method, taps, as_args(args), dict(kwargs or {}))
    example = wrapper.example_tensors
    with torch.no_grad():
        values = [v.detach().clone() for v in wrapper.run(example)]
        program = _step("torch.export", lambda: torch.export.export(wrapper, example, strict=False))
    same = repeats(program, [o.name for o in wrapper.outputs])
    wrapper.keep = [i for i, s in enumerate(same) if s is None]
    return Tapped(wrapper, example, values, same)


#: ops that hand on their input's value (a tap's clone, taken against in-place modules)
_COPIES = ("aten.clone.default", "aten.alias.default", "aten.detach.default", "aten.lift_fresh_copy.default")


def repeats(program: Any, names: list[str]) -> list[dict[str, Any] | None]:
    """Per output of an exported program: ``None``, or what it repeats (an earlier output's value, an input),
    seen through copies (a tap's clone of a value another output or an input already is)."""
    inputs = [s.arg.name for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    out = next(n for n in program.graph.nodes if n.op == "output")
    seen: dict[Any, str] = {}
    same: list[dict[str, Any] | None] = []
    for name, node in zip(names, out.args[0]):
        node = value_source(node)
        if getattr(node, "op", None) == "placeholder" and node.name in inputs:
            same.append({"input": inputs.index(node.name)})
        elif node in seen:
            same.append({"same_as": seen[node]})
        else:
            seen[node] = name
            same.append(None)
    return same


def lower(module: nn.Module, example: tuple, recipe: Recipe, exported: Any = None) -> Lowered:
    """``module(*example)`` exported (``exported``: that export, made already), quantised as ``recipe`` says,
    lowered and serialized.

    Raises:
        LayertapError: ExecuTorch is missing, or a step failed (one line naming the step, the
            module the failing operator came from where the error says, and the error).
    """
    try:
        with quiet_registrations():  # ExecuTorch imports torchao
            from executorch.exir import to_edge_transform_and_lower  # noqa: PLC0415 -- optional: ExecuTorch's extra
    except ImportError:
        raise missing_executorch() from None
    with torch.no_grad():
        program = exported if exported is not None else export_float(module, example)
        quantized = None
        if recipe.quantize:
            quantized = _step("int8 quantisation (pt2e)", lambda: quantize_int8(program.module(), recipe))
            program = _step("torch.export of the quantised model",
                            lambda: torch.export.export(quantized, example, strict=False))
        partitioner = _partitioners(recipe.backend)
        edge = _step(f"lowering to ExecuTorch ({recipe.backend})",
                     lambda: to_edge_transform_and_lower(program, partitioner=partitioner),
                     "--backend portable (ExecuTorch's portable kernels) lowers without XNNPACK"
                     if recipe.backend == "xnnpack" and not recipe.quantize else "")
        buffer = _step("serializing the program", lambda: edge.to_executorch().buffer)
    return Lowered(bytes(buffer), quantized)


def export_float(module: nn.Module, example: tuple) -> Any:
    """``torch.export`` of ``module(*example)`` as :func:`lower` exports it before quantising (its
    ``.module()`` is a fresh graph each call, so one export serves every recipe)."""
    with torch.no_grad():
        return _step("torch.export", lambda: torch.export.export(module, example, strict=False))


def quantize_int8(graph: Any, recipe: Recipe) -> Any:
    """An exported graph quantised to int8 by the XNNPACK quantizer (symmetric, per channel), calibrated on
    ``recipe.calibration``; nodes of the modules in ``recipe.keep_float`` (model paths) stay float32."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (  # noqa: PLC0415 -- optional: ExecuTorch's extra
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e  # noqa: PLC0415 -- optional: ExecuTorch's extra

    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    if recipe.keep_float:
        quantizer.set_filter_function(_not_in(recipe.keep_float))
    prepared = prepare_pt2e(graph, quantizer)
    for sample in recipe.calibration:
        prepared(*sample)
    return own_outputs(convert_pt2e(prepared))


def value_source(node: Any) -> Any:
    """The node whose value ``node`` hands on unchanged (through copies and :func:`own_outputs`' ``x * 1``)."""
    while getattr(node, "op", None) == "call_function" and (
            str(node.target) in _COPIES or (str(node.target) == "aten.mul.Tensor" and node.args[1:] == (1.0,))):
        node = node.args[0]
    return node


def own_outputs(graph: Any) -> Any:
    """A quantised graph (in place) whose outputs that are a dequantized value other nodes read too (a tap
    inside the model) are each a node of their own (``x * 1``, exact): XNNPACK refuses a delegate output that is
    also one of its inputs."""
    out = next(n for n in graph.graph.nodes if n.op == "output")
    values = list(out.args[0])
    for i, node in enumerate(values):
        source = value_source(node)
        if "dequantize" not in str(getattr(source, "target", "")) or len(source.users) < 2:
            continue
        with graph.graph.inserting_before(out):
            values[i] = graph.graph.call_function(torch.ops.aten.mul.Tensor, (source, 1.0))
    out.args = (tuple(values),)
    graph.recompile()
    return graph


def _not_in(paths: Sequence[str]) -> Callable[[Any], bool]:
    """A quantizer filter: True for nodes outside every module of ``paths`` (the model seen through the
    wrapper, ``model.PATH``, and its own paths)."""
    from torchao.quantization.pt2e.quantizer.utils import get_module_name_filter  # noqa: PLC0415 -- optional: ExecuTorch's extra

    names = [f"{MODEL_ATTRIBUTES[0]}.{p}" if p else MODEL_ATTRIBUTES[0] for p in paths]
    filters = [get_module_name_filter(n) for n in names]
    return lambda node: not any(f(node) for f in filters)


def _partitioners(backend: str) -> list[Any]:
    if backend == "portable":
        return []
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner  # noqa: PLC0415 -- optional: ExecuTorch's extra

    return [XnnpackPartitioner()]


def _step(what: str, fn: Callable[[], Any], hint: str = "") -> Any:
    """Run one step of the lowering; a failure becomes one line naming it and the module at fault (and
    ``hint``: what to try instead)."""
    try:
        return fn()
    except LayertapError:
        raise
    except Exception as e:  # torch.export / ExecuTorch errors of every kind
        where = _module_of(e)
        inner: BaseException = e
        while inner.__cause__ is not None:  # a pass wrapper's message hides the real one
            inner = inner.__cause__
        said = inner if str(inner) else e
        raise LayertapError(f"ExecuTorch export failed in {what}{where}: {type(said).__name__}: "
                            f"{one_line(said, first=True, limit=300)}{'; ' + hint if hint else ''}") from e


def _module_of(error: BaseException) -> str:
    """`` at module PATH (Class)``: the module whose graph node a failing pass or kernel check was handling (the
    deepest frame, over the error's chain, holding a node with a module stack), else the module whose forward
    raised; ``""`` when neither is found."""
    found = ""
    chain: BaseException | None = error
    while chain is not None:
        tb = chain.__traceback__
        while tb is not None:
            for value in tb.tb_frame.f_locals.values():
                stack = value.meta.get("nn_module_stack") if isinstance(value, torch.fx.Node) else None
                if stack:
                    path, kind = list(stack.values())[-1]
                    path = path.removeprefix(f"{MODEL_ATTRIBUTES[0]}.") if path != MODEL_ATTRIBUTES[0] else ""
                    found = f"{path or '(root)'} ({getattr(kind, '__name__', str(kind).rsplit('.', 1)[-1])})"
            owner = tb.tb_frame.f_locals.get("self")
            if not found and isinstance(owner, nn.Module) and not isinstance(owner, TapWrapper):
                found = type(owner).__name__
            tb = tb.tb_next
        chain = chain.__cause__ or chain.__context__
    return f" at module {found}" if found else ""


def calibration_path(path: str | os.PathLike) -> Path:
    """Where an int8 program's calibration samples are kept: ``m.pte`` -> ``m.pte.calib.npz``."""
    return Path(str(path) + ".calib.npz")


def read_calibration(path: str | os.PathLike) -> list[tuple]:
    """The calibration samples kept beside an int8 program (``[]`` when there are none)."""
    calib = calibration_path(path)
    if not calib.is_file():
        return []
    with np.load(calib) as data:
        samples: dict[int, dict[int, torch.Tensor]] = {}
        for key in data.files:
            i, j = (int(p) for p in key[1:].split("_"))
            samples.setdefault(i, {})[j] = torch.from_numpy(data[key])
    return [tuple(s[j] for j in sorted(s)) for _, s in sorted(samples.items())]


def as_args(args: Any) -> tuple:
    """A call's positional arguments as a tuple (a tensor alone is one argument)."""
    if isinstance(args, torch.Tensor):
        return (args,)
    if isinstance(args, (list, tuple)):
        return tuple(args)
    raise InputSpecError(f"args must be a tensor or a tuple of arguments, got {type(args).__name__}")


def weight_record(model: nn.Module) -> dict[str, dict[str, Any]]:
    """Each parameter of ``model`` as a program's record keeps it: shape, largest magnitude and a digest of its
    float32 values (what a later comparison checks the model's weights against).

    Example:
        >>> rec = weight_record(nn.Linear(2, 3))
        >>> sorted(rec), rec["weight"]["shape"], len(rec["weight"]["digest"])
        (['bias', 'weight'], [3, 2], 32)
    """
    out = {}
    for name, p in model.named_parameters():
        a = p.detach().to(torch.float32).cpu().contiguous().numpy()
        out[name] = {"shape": list(a.shape), "absmax": float(np.abs(a).max(initial=0.0)),
                     "digest": hashlib.sha256(a.tobytes()).hexdigest()[:32]}
    return out


def module_taps(model: nn.Module, method: str | Callable[..., Any], args: Any, kwargs: dict | None,
                wanted: Callable[[str], bool] = lambda p: True) -> list[Tap]:
    """A tap on every module whose calls each return floating tensors a program can hand out as outputs: one
    tensor (``PATH``), or a flat tuple of them, the same count on every call (``PATH[0]``, ``PATH[1]``, ...), in
    the order the modules first return.

    Example:
        >>> m = nn.Sequential(nn.Linear(4, 3), nn.ReLU()).eval()
        >>> [t.canonical for t in module_taps(m, "forward", (torch.ones(2, 4),), None)]
        ['0', '1']
    """
    counts: dict[str, int | None] = {}  # path -> tensors per call (0: a tensor alone; None: not tappable)

    class _Shapes(CallHooks):
        def on_return(self, mod: Any, path: str, call: int, output: Any) -> None:
            if isinstance(output, torch.Tensor):
                n: int | None = 0 if output.is_floating_point() else None
            elif isinstance(output, (tuple, list)) and output and all(
                    isinstance(t, torch.Tensor) and t.is_floating_point() for t in output):
                n = len(output)
            else:
                n = None
            counts[path] = n if counts.get(path, n) == n else None

    hooks = _Shapes(model)
    with hooks.hooks(), torch.no_grad():
        bound_method(model, method)(*as_args(args), **dict(kwargs or {}))
    taps = []
    for p, n in counts.items():
        if n is not None and p and wanted(p):
            taps += [Tap.parse(p)] if n == 0 else [Tap.parse(f"{p}[{i}]") for i in range(n)]
    return taps
