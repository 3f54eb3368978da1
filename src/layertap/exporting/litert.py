"""``lt.export(..., "m.tflite")``: a model to a LiteRT program, taps as named signature outputs.

The one tap mechanism of every export (:class:`~layertap.pytorch.wrapper.TapWrapper`: the method's result
flattened, then each tapped tensor, each value once) is converted by ``litert-torch`` with its outputs named by
layertap's names, and quantised by AI Edge Quantizer when asked (:mod:`layertap.pytorch.litert`). The program is
run in LiteRT's interpreter on the example and every output compared with PyTorch (a quantised program within a
few of each output's int8 quanta), then published atomically with its sidecar (``m.tflite.json``), its
calibration samples (``m.tflite.calib.npz``, static int8) and its AI Edge Quantizer recipe
(``m.tflite.aeq.json``), from which ``compare`` and ``fix`` convert the model again by the same recipe.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
from torch import nn

from ..files.signals import raise_if_stopped
from ..files.writes import check_output_path
from ..metrics import DEFAULT_ATOL, DEFAULT_RTOL
from ..pytorch.litert import Conversion, aeq_recipe, convert
from ..pytorch.lowering import CALIB_SAMPLES, as_args, tapped_wrapper, weight_record
from ..pytorch.wrapper import input_names
from ..runtimes.executorch import Sidecar, sidecar_path
from ..runtimes.litert import LiteRTEngine, publish
from ..selectors import Tap, parse_taps
from .program import calibration_samples, verify_program
from .verify import ExportReport, ExportRow, check_output

#: a quantised program is verified against the float model within this many of each output's int8 quanta
#: (``max|output| / 127``): the quantisation's own error, not a tolerance of the runtime
QUANTISED_QUANTA = 8.0


def export_litert(model: nn.Module, args: Any, path: str | os.PathLike, taps: Sequence[str | Tap] = (), *,
                  method: str | Callable[..., Any] = "forward", kwargs: dict | None = None,
                  conversion: Conversion | None = None, verify: bool = True, rtol: float = DEFAULT_RTOL,
                  atol: float = DEFAULT_ATOL) -> ExportReport:
    """Export ``model.<method>(*args)`` to the LiteRT program ``path`` with taps as named outputs.

    Example:
        >>> import torch, tempfile, os
        >>> m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()
        >>> path = os.path.join(tempfile.mkdtemp(), "m.tflite")
        >>> report = export_litert(m, torch.randn(2, 4), path, taps=["0"])  # doctest: +SKIP
        >>> report.ok, [r.name for r in report.rows]  # doctest: +SKIP
        (True, ['output', '0'])
    """
    out = check_output_path(path, suffixes=(".tflite",))
    conversion = (conversion or Conversion()).check()
    tapped = tapped_wrapper(model, method, parse_taps(taps), args, kwargs)
    if conversion.quantize == "int8" and not conversion.calibration:
        conversion.calibration = calibration_samples(model, tapped.example, CALIB_SAMPLES)
    rows = [ExportRow(o.name, o.selector if o.path is not None and o.selector else "model output", list(v.shape),
                      str(v.dtype).replace("torch.", "")) for o, v in zip(tapped.wrapper.outputs, tapped.reference)]
    notes: list[str] = []
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name[:120]}.") as work:
        built = Path(work) / "program.tflite"
        sidecar = _convert(model, method, args, kwargs, tapped, conversion, built)
        if verify:
            r, a = rtol, atol
            if conversion.quantize:
                notes.append(f"{conversion.quantize}: checked against the float model within {QUANTISED_QUANTA:g} "
                             f"int8 quanta of each output; layertap compare MODEL {out.name} judges it module by "
                             "module at int8")
            _verify(built, tapped, rows, r, a, quantized=bool(conversion.quantize))
        raise_if_stopped()
        publish(out, built.read_bytes(), sidecar, conversion,
                aeq_recipe(conversion.quantize, conversion.keep_float) if conversion.quantize else None)
    exporter = "litert-torch" + (f", AI Edge Quantizer {conversion.quantize}" if conversion.quantize else "")
    return ExportReport(rows, path=str(out), exporter=exporter, inputs={i["name"]: i["shape"] for i in sidecar.inputs},
                        rtol=rtol, atol=atol, verified=verify, notes=notes, runtime="LiteRT")


def _convert(model: nn.Module, method: Any, args: Any, kwargs: dict | None, tapped: Any, conversion: Conversion,
             built: Path) -> Sidecar:
    """The tapped model converted to ``built``; its sidecar (written when published)."""
    names_in = input_names(model, method, as_args(args), dict(kwargs or {}))
    kept = [o.name for o, s in zip(tapped.wrapper.outputs, tapped.same) if s is None]
    built.write_bytes(convert(tapped.wrapper, tapped.example, kept, conversion, names_in))
    sidecar = Sidecar(Sidecar.input_records(names_in, tapped.example), tapped.records(), conversion.record(),
                      weight_record(model))
    sidecar_path(built).write_text(sidecar.text())  # the check reads the outputs by their names
    return sidecar


def _verify(built: Path, tapped: Any, rows: list[ExportRow], rtol: float, atol: float, *, quantized: bool) -> None:
    """Each output of the program in LiteRT against the eager run (quantised: within its int8 quanta)."""
    engine = LiteRTEngine(built)
    if not quantized:
        verify_program(built, tapped.example, tapped.reference, rows, rtol, atol, engine=engine)
        return
    feed = {i.name: t.detach().cpu().numpy() for i, t in zip(engine.get_inputs(), tapped.example)}
    got = engine.run(None, feed)
    for row, name, want in zip(rows, engine.output_names(), tapped.reference):
        ref = want.detach().float().cpu().numpy()
        quantum = float(np.abs(ref).max(initial=0.0)) / 127.0
        row.add(check_output(got[name], ref, rtol=rtol, atol=max(atol, QUANTISED_QUANTA * quantum),
                             batch={i.name: int(t.shape[0]) if t.dim() else 1
                                    for i, t in zip(engine.get_inputs(), tapped.example)}))

