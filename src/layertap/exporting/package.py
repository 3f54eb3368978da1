"""``lt.export(..., "m.pt2")``: a model to an AOTInductor package, taps as named outputs.

The one tap mechanism of every export (:class:`~layertap.pytorch.wrapper.TapWrapper`: the method's result
flattened, then each tapped tensor) is exported by ``torch.export`` at the example's sizes and compiled by
AOTInductor (:func:`layertap.pytorch.compiled.aoti_package`); layertap's record of the package (its inputs,
each output's module path and call, its weights' digests) goes into the package's own metadata, so the file
carries it. The package is compiled into a temporary file beside the output, loaded and run on the example
(every output compared with PyTorch), then renamed into place.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

from torch import nn

from ..files.signals import raise_if_stopped
from ..files.writes import check_output_path
from ..metrics import DEFAULT_ATOL, DEFAULT_RTOL
from ..pytorch.compiled import aoti_package
from ..pytorch.lowering import as_args, tapped_wrapper, weight_record
from ..pytorch.wrapper import input_names
from ..runtimes.compiled import PackageEngine, package_record
from ..selectors import Tap, parse_taps
from .program import verify_program
from .verify import ExportReport, ExportRow


def export_package(model: nn.Module, args: Any, path: str | os.PathLike, taps: Sequence[str | Tap] = (), *,
                   method: str | Callable[..., Any] = "forward", kwargs: dict | None = None, verify: bool = True,
                   rtol: float = DEFAULT_RTOL, atol: float = DEFAULT_ATOL) -> ExportReport:
    """Export ``model.<method>(*args)`` to the AOTInductor package ``path`` with taps as named outputs.

    Example:
        >>> import torch, tempfile, os
        >>> m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()
        >>> path = os.path.join(tempfile.mkdtemp(), "m.pt2")
        >>> report = export_package(m, torch.randn(2, 4), path, taps=["0"])  # doctest: +SKIP
        >>> report.ok, [r.name for r in report.rows]  # doctest: +SKIP
        (True, ['output', '0'])
    """
    out = check_output_path(path, suffixes=(".pt2",))
    tapped = tapped_wrapper(model, method, parse_taps(taps), args, kwargs)
    names = input_names(model, method, as_args(args), dict(kwargs or {}))
    record = package_record(names, tapped.example, tapped.records(), weight_record(model), tapped.reference)
    rows = [ExportRow(o.name, o.selector if o.path is not None and o.selector else "model output", list(v.shape),
                      str(v.dtype).replace("torch.", "")) for o, v in zip(tapped.wrapper.outputs, tapped.reference)]
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name[:120]}.") as work:
        built = Path(work) / "package.pt2"
        aoti_package(tapped.wrapper, tapped.example, built, record)
        if verify:
            verify_program(built, tapped.example, tapped.reference, rows, rtol, atol, engine=PackageEngine(built))
        raise_if_stopped()
        os.replace(built, out)
    return ExportReport(rows, path=str(out), exporter="torch.export + AOTInductor", inputs={n: list(t.shape) for n, t in
                        zip(names, tapped.example)}, rtol=rtol, atol=atol, verified=verify, runtime="AOTInductor")

