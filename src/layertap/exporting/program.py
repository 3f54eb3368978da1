"""``lt.export(..., "m.pte")``: a model to an ExecuTorch program, taps as named outputs.

The one tap mechanism of the ONNX export (:class:`~layertap.pytorch.wrapper.TapWrapper`: the method's result
flattened, then each tapped tensor) is lowered by :func:`layertap.pytorch.lowering.lower` (torch.export at
the example's sizes, int8 by the XNNPACK quantizer, XNNPACK or portable kernels). The program is run in
ExecuTorch's runtime on the example and every output compared with PyTorch (an int8 program with the quantised model in PyTorch, which is
what it should compute); then it is published atomically with its sidecar (``m.pte.json``: names
and recipe, :mod:`layertap.runtimes.executorch`) and, when quantised, its calibration samples
(``m.pte.calib.npz``), from which ``compare`` and ``fix`` lower the model again by the same recipe.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

from ..files.writes import check_output_path
from ..metrics import DEFAULT_ATOL, DEFAULT_RTOL
from ..options import SampleOptions
from ..pytorch.lowering import CALIB_SAMPLES, INT8_QUANTA, Recipe, as_args, lower, tapped_wrapper, weight_record
from ..pytorch.reference import load
from ..pytorch.wrapper import input_names
from ..runtimes.executorch import ProgramEngine, Sidecar, publish_program
from ..samples.for_reference import samples_for
from ..selectors import Tap, parse_taps
from .verify import ExportReport, ExportRow, check_output


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
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
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
    tapped = tapped_wrapper(model, method, parse_taps(taps), args, kwargs)
    wrapper, example, reference = tapped.wrapper, tapped.example, tapped.reference
    if recipe.quantize and not recipe.calibration:
        recipe.calibration = calibration_samples(model, example, CALIB_SAMPLES)
    lowered = lower(wrapper, example, recipe)
    names_in = input_names(model, method, as_args(args), dict(kwargs or {}))
    sidecar = Sidecar(Sidecar.input_records(names_in, example), tapped.records(), recipe.record(),
                      weight_record(model))
    rows = [ExportRow(o.name, o.selector if o.path is not None and o.selector else "model output", list(v.shape),
                      str(v.dtype).replace("torch.", "")) for o, v in zip(wrapper.outputs, reference)]
    notes: list[str] = []
    publish_program(out, lowered.buffer, sidecar, recipe)
    if verify:
        expected = reference
        if lowered.quantized is not None:
            with torch.no_grad():
                kept = iter(lowered.quantized(*example))
                expected = [next(kept) if s is None else v for s, v in zip(tapped.same, reference)]
            notes.append("int8: checked against the quantised model in PyTorch (pt2e convert: what the program should "
                         f"compute) within {INT8_QUANTA:g} quanta of each output; layertap compare MODEL "
                         f"{out.name} judges it against the float model")
        verify_program(out, example, expected, rows, rtol, atol, quantized=lowered.quantized is not None)
    report = ExportReport(rows, path=str(out), exporter=f"ExecuTorch {recipe.backend}"
                          + (f", {recipe.quantize}" if recipe.quantize else ""),
                          inputs={i["name"]: i["shape"] for i in sidecar.inputs}, rtol=rtol, atol=atol,
                          verified=verify, notes=notes, runtime="ExecuTorch")
    return report


def calibration_samples(model: nn.Module, example: tuple, source: int | str | os.PathLike | Sequence[Any]) -> list[tuple]:
    """An int8 program's calibration samples as the model's positional arguments, through
    :func:`~layertap.samples.for_reference.samples_for`: ``N`` (the example, then random tensors like it, seeded
    ``1 .. N-1``), a path read as ``--inputs`` reads it at the example's ranks (``export --calib``), or the
    samples themselves.

    Example:
        >>> m = torch.nn.Linear(4, 3)
        >>> [s[0].shape for s in calibration_samples(m, (torch.zeros(2, 4),), 3)]
        [torch.Size([2, 4]), torch.Size([2, 4]), torch.Size([2, 4])]
    """
    loaded = load(model)
    if isinstance(source, int):
        samples = samples_for(loaded, tuple(example), SampleOptions(samples=source))
    elif isinstance(source, (str, os.PathLike)):
        ranks = [a.dim() if isinstance(a, torch.Tensor) else None for a in example]
        samples = samples_for(loaded, None, SampleOptions(inputs=source), shapes_from=ranks)
    else:
        samples = samples_for(loaded, None, SampleOptions(samples=[as_args(s) for s in source]))
    return [s.args for s in samples]


def verify_program(path: Path, example: tuple, expected: list[torch.Tensor], rows: list[ExportRow], rtol: float,
                   atol: float, *, quantized: bool = False, engine: Any = None) -> None:
    """Run the program in ExecuTorch (``engine``: the program already opened in another program runtime, an
    AOTInductor package) on ``example``; one check per output against ``expected``."""
    engine = ProgramEngine(path) if engine is None else engine
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


