"""``layertap export MODEL -o FILE.onnx``: taps become named, verified ONNX outputs."""

from __future__ import annotations

import argparse
import sys

from ..args import InputArgs, JsonArgs, ModelArgs, OutputArgs, TapArgs, ToleranceArgs
from .base import Tool, running


class ExportTool(Tool):
    """Export with taps, verify in ONNX Runtime, print the per-output table.

    Exit 0 when every output matches PyTorch, 1 when one does not (the file
    is still written, for inspection), 2 on bad input or an exporter failure
    (no file is written).
    """

    name = "export"
    help = "export a model to ONNX with taps as extra named outputs, verified in ONNX Runtime"
    output = OutputArgs(required=True, suffixes=(".onnx",), help="FILE.onnx")
    groups = (
        ModelArgs(),
        TapArgs(),
        InputArgs(),
        output,
        ToleranceArgs(),
        JsonArgs(),
    )

    def add_own_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--static", action="store_true", help="fixed batch size (default: symbolic batch)")
        parser.add_argument("--exporter", choices=("dynamo", "torchscript"), default="dynamo",
                            help="torch.export-based exporter (default) or the TorchScript one")
        parser.add_argument("--fallback", action="store_true",
                            help="if the dynamo exporter fails, use the TorchScript exporter instead of stopping")
        parser.add_argument("--no-verify", action="store_true", help="skip the ONNX Runtime check")
        g = parser.add_argument_group("advanced")
        g.add_argument("--opset", type=int, default=None, metavar="N", help="ONNX opset version (exporter default)")

    def run(self, ns: argparse.Namespace) -> int:
        # Cheap checks first: a bad path or tap fails before torch is imported.
        out = self.output.check(ns)
        taps = TapArgs.taps(ns)
        model, info, args, kwargs = ModelArgs.load_with_inputs(ns)  # parses --input first

        from ...exporting.export import export

        if sys.stderr.isatty():  # progress only for a person watching
            self.say(f"exporting {ns.model} ({ns.exporter} exporter) to {out} ...")
        with running(info, ns.method, args, kwargs, spinner=False):  # export runs the model first: its errors, one line
            report = export(
                model,
                args,
                out,
                taps,
                method=ns.method,
                kwargs=kwargs,
                dynamic_batch=not ns.static,
                verify=not ns.no_verify,
                exporter=ns.exporter,
                fallback=ns.fallback,
                opset=ns.opset,
                rtol=ns.rtol,
                atol=ns.atol,
            )
        self.print_table(report, as_json=ns.json)
        return 0 if report.ok else 1
