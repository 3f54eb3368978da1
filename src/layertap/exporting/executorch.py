"""``lt.export(..., "m.pte")``: a model to an ExecuTorch program, taps as named outputs.

The one tap mechanism of the ONNX export (:class:`~.wrapper.TapWrapper`: the method's result
flattened, then each tapped tensor) is exported with ``torch.export`` at the example's sizes
(ExecuTorch programs have static shapes), optionally quantised to int8 with the XNNPACK quantizer
(pt2e: prepare, calibrate, convert; modules named in ``keep_float`` stay float32), lowered by
``to_edge_transform_and_lower`` for a backend (``xnnpack``: its partitioner; ``portable``: ExecuTorch's
portable kernels) and serialized. The program is run in ExecuTorch's runtime on the example and
every output compared with PyTorch (an int8 program with the quantised model in PyTorch, which is
what it should compute); then it is published atomically with its sidecar (``m.pte.json``: names
and recipe, :mod:`layertap.runtimes.executorch`) and, when quantised, its calibration samples
(``m.pte.calib.npz``), from which ``compare`` and ``fix`` lower the model again by the same recipe.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

from ..errors import LayertapError, one_line, unknown_name
from ..files.writes import atomic_path, atomic_write_bytes, check_output_path
from ..runtimes.executorch import BACKENDS, INSTALL, ProgramEngine, Sidecar, sidecar_path
from ..selectors import Tap, parse_taps
from .verify import ExportReport, ExportRow, check_output
from .wrapper import MODEL_ATTRIBUTES, TapWrapper, input_names

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


def export_program(
    model: nn.Module,
    args: Any,
    path: str | os.PathLike,
    taps: Sequence[str | Tap] = (),
    *,
    method: str | Callable[..., Any] = "forward",
    kwargs: dict | None = None,
    recipe: Recipe | None = None,
    verify: bool = True,
    rtol: float = 1e-3,
    atol: float = 1e-5,
) -> ExportReport:
    """Export ``model.<method>(*args)`` to the ExecuTorch program ``path`` with taps as named outputs.

    Example:
        >>> import torch, tempfile, os
        >>> m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()
        >>> path = os.path.join(tempfile.mkdtemp(), "m.pte")
        >>> report = export_program(m, torch.randn(2, 4), path, taps=["0"])
        >>> report.ok, [r.name for r in report.rows], os.path.exists(path + ".json")
        (True, ['output', '0'], True)
    """
    out = check_output_path(path, suffixes=(".pte",))
    recipe = (recipe or Recipe()).check()
    wrapper, example, reference = tapped_wrapper(model, method, parse_taps(taps), args, kwargs)
    if recipe.quantize and not recipe.calibration:
        recipe.calibration = drawn_calibration(example, CALIB_SAMPLES)
    lowered = lower(wrapper, example, recipe)
    names_in = input_names(model, method, _as_args(args), dict(kwargs or {}))
    sidecar = Sidecar([{"name": n, "shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", "")}
                       for n, t in zip(names_in, example)],
                      [o.record() for o in wrapper.outputs], recipe.record())
    rows = [ExportRow(o.name, o.selector if o.path is not None and o.selector else "model output", list(v.shape),
                      str(v.dtype).replace("torch.", "")) for o, v in zip(wrapper.outputs, reference)]
    notes: list[str] = []
    publish_program(out, lowered.buffer, sidecar, recipe)
    if verify:
        expected = reference
        if lowered.quantized is not None:
            with torch.no_grad():
                expected = list(lowered.quantized(*example))
            notes.append("int8: checked against the quantised model in PyTorch (pt2e convert: what the program should "
                         f"compute) within {INT8_QUANTA:g} quanta of each output; layertap compare MODEL "
                         f"{out.name} judges it against the float model")
        verify_program(out, example, expected, rows, rtol, atol, quantized=lowered.quantized is not None)
    report = ExportReport(rows, path=str(out), exporter=f"ExecuTorch {recipe.backend}"
                          + (f", {recipe.quantize}" if recipe.quantize else ""),
                          inputs={i["name"]: i["shape"] for i in sidecar.inputs}, rtol=rtol, atol=atol,
                          verified=verify, notes=notes)
    report.__dict__["title"] = "Export verification (ExecuTorch vs PyTorch)"
    return report


def tapped_wrapper(model: nn.Module, method: str | Callable[..., Any], taps: Sequence[Tap], args: Any,
                   kwargs: dict | None) -> tuple[TapWrapper, tuple, list[torch.Tensor]]:
    """The model wrapped with its taps, the example tensors and the eager run's values (which fix the
    output names; a bad tap fails here, in a second)."""
    wrapper = TapWrapper(model, method, taps, _as_args(args), dict(kwargs or {}))
    example = wrapper.example_tensors
    with torch.no_grad():
        reference = [v.detach().clone() for v in wrapper.run(example)]
    return wrapper, example, reference


def drawn_calibration(example: tuple, n: int, seed: int = 0) -> list[tuple]:
    """``n`` seeded random samples shaped like ``example`` (the example first)."""
    from ..pytorch.values import random_like

    return [tuple(example)] + [tuple(random_like(example, seed + i)) for i in range(1, n)]


def lower(module: nn.Module, example: tuple, recipe: Recipe) -> Lowered:
    """``module(*example)`` exported, quantised as ``recipe`` says, lowered and serialized.

    Raises:
        LayertapError: ExecuTorch is missing, or a step failed (one line naming the step, the
            module the failing operator came from where the error says, and the error).
    """
    try:
        from executorch.exir import to_edge_transform_and_lower
    except ImportError:
        raise LayertapError(f"ExecuTorch programs (.pte) need ExecuTorch, which is not installed: {INSTALL}") from None
    with torch.no_grad():
        program = _step("torch.export", lambda: torch.export.export(module, example, strict=False))
        quantized = None
        if recipe.quantize:
            quantized = _step("int8 quantisation (pt2e)", lambda: quantize_int8(program.module(), recipe))
            program = _step("torch.export of the quantised model",
                            lambda: torch.export.export(quantized, example, strict=False))
        partitioner = _partitioners(recipe.backend)
        edge = _step(f"lowering to ExecuTorch ({recipe.backend})",
                     lambda: to_edge_transform_and_lower(program, partitioner=partitioner))
        buffer = _step("serializing the program", lambda: edge.to_executorch().buffer)
    return Lowered(bytes(buffer), quantized)


def quantize_int8(graph: Any, recipe: Recipe) -> Any:
    """An exported graph quantised to int8 by the XNNPACK quantizer (symmetric, per channel), calibrated on
    ``recipe.calibration``; nodes of the modules in ``recipe.keep_float`` (model paths) stay float32."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    if recipe.keep_float:
        quantizer.set_filter_function(_not_in(recipe.keep_float))
    prepared = prepare_pt2e(graph, quantizer)
    for sample in recipe.calibration:
        prepared(*sample)
    return convert_pt2e(prepared)


def _not_in(paths: Sequence[str]) -> Callable[[Any], bool]:
    """A quantizer filter: True for nodes outside every module of ``paths`` (the model seen through the
    wrapper, ``model.PATH``, and its own paths)."""
    from torchao.quantization.pt2e.quantizer.utils import get_module_name_filter

    names = [f"{MODEL_ATTRIBUTES[0]}.{p}" if p else MODEL_ATTRIBUTES[0] for p in paths]
    filters = [get_module_name_filter(n) for n in names]
    return lambda node: not any(f(node) for f in filters)


def _partitioners(backend: str) -> list[Any]:
    if backend == "portable":
        return []
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    return [XnnpackPartitioner()]


def _step(what: str, fn: Callable[[], Any]) -> Any:
    """Run one step of the lowering; a failure becomes one line naming it and the module at fault."""
    try:
        return fn()
    except LayertapError:
        raise
    except Exception as e:  # torch.export / ExecuTorch errors of every kind
        where = _module_of(e)
        raise LayertapError(f"ExecuTorch export failed in {what}{where}: {type(e).__name__}: "
                            f"{one_line(e, first=True, limit=300)}") from e


def _module_of(error: BaseException) -> str:
    """`` at module PATH`` when the error's traceback passes through a module's forward."""
    tb = error.__traceback__
    found = ""
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if isinstance(owner, nn.Module) and not isinstance(owner, TapWrapper):
            found = type(owner).__name__
            path = getattr(owner, "_layertap_path", None)
            found = f"{path} ({found})" if path else found
        tb = tb.tb_next
    return f" at module {found}" if found else ""


def publish_program(out: Path, buffer: bytes, sidecar: Sidecar, recipe: Recipe) -> None:
    """The program, its sidecar and (int8) its calibration samples, each written atomically; the sidecar
    last but one, so a program is never beside another program's record for long."""
    atomic_write_bytes(out, buffer)
    atomic_write_bytes(sidecar_path(out), sidecar.text().encode())
    calib = calibration_path(out)
    if recipe.quantize:
        with atomic_path(calib) as tmp, open(tmp, "wb") as f:
            np.savez(f, **{f"s{i}_{j}": t.detach().cpu().numpy() for i, s in enumerate(recipe.calibration)
                           for j, t in enumerate(s)})
    elif calib.exists():
        calib.unlink()


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


def verify_program(path: Path, example: tuple, expected: list[torch.Tensor], rows: list[ExportRow], rtol: float,
                   atol: float, *, quantized: bool = False) -> None:
    """Run the program in ExecuTorch on ``example``; one check per output against ``expected``."""
    engine = ProgramEngine(path)
    feed = {i.name: t.detach().cpu().numpy() for i, t in zip(engine.get_inputs(), example)}
    got = engine.run(None, feed)
    batch = {i.name: int(t.shape[0]) if t.dim() else 1 for i, t in zip(engine.get_inputs(), example)}
    for row, name, want in zip(rows, engine.output_names(), expected):
        ref = want.detach().float().cpu().numpy() if want.is_floating_point() else want.cpu().numpy()
        value = got[name]
        r, a = rtol, atol
        if quantized and ref.size:
            quantum = float(np.abs(ref).max()) / 127.0
            r, a = rtol, max(atol, INT8_QUANTA * quantum)
        row.add(check_output(value, ref, rtol=r, atol=a, batch=batch))


def _as_args(args: Any) -> tuple:
    if isinstance(args, torch.Tensor):
        return (args,)
    if isinstance(args, (list, tuple)):
        return tuple(args)
    raise LayertapError(f"args must be a tensor or a tuple of arguments, got {type(args).__name__}")


def module_taps(model: nn.Module, method: str | Callable[..., Any], args: Any, kwargs: dict | None,
                wanted: Callable[[str], bool] = lambda p: True) -> list[Tap]:
    """A tap on every module whose calls each return one floating tensor (what a program can hand out as
    an output), in the order the modules first return."""
    from ..pytorch.callhooks import CallHooks
    from ..pytorch.taps import bound_method
    from ..pytorch.values import flatten

    single: dict[str, bool] = {}

    class _Shapes(CallHooks):
        def on_return(self, mod: Any, path: str, call: int, output: Any) -> None:
            tensors = [t for _, t in flatten(output)]
            ok = isinstance(output, torch.Tensor) and output.is_floating_point() and len(tensors) == 1
            single[path] = single.get(path, True) and ok

    hooks = _Shapes(model)
    with hooks.hooks(), torch.no_grad():
        bound_method(model, method)(*_as_args(args), **dict(kwargs or {}))
    return [Tap.parse(p) for p, ok in single.items() if ok and p and wanted(p)]
