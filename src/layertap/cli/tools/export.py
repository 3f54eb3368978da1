"""``layertap export MODEL -o FILE.onnx``: taps become named, verified ONNX outputs."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from ...options import ExportOptions
from ..args import Args, InputArgs, JsonArgs, ModelArgs, OutputArgs, TapArgs, ToleranceArgs
from .base import Tool, running


@dataclass(frozen=True)
class ExportChoice:
    """``export``'s own options: the everyday ones, and the rest as the library's object."""

    static: bool
    exporter: str
    verify: bool
    options: ExportOptions


class ExportTool(Tool):
    """Export with taps, verify in ONNX Runtime, print the per-output table.

    Exit 0 when every output matches PyTorch, 1 when one does not (the file
    is still written, for inspection), 2 on bad input or an exporter failure
    (no file is written).
    """

    name = "export"
    help = "export a model to ONNX with taps as extra named outputs, verified in ONNX Runtime"
    examples = (
        "layertap export torchvision:resnet18 -o r18.onnx --tap layer1 --tap layer2.0.relu --tap feat=avgpool",
        "layertap export examples/mymodels.py:Net --input 8x3x32x32 --static --exporter torchscript -o net.onnx",
    )
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
        parser.add_argument("--dynamic-sequence", action="store_true",
                            help="symbolic sequence length too (axis 1 of token inputs), verified at another length")
        parser.add_argument("--kv-cache", action="store_true",
                            help="a transformers decoder with its KV cache: past_key_values.N.key/value in, "
                                 "present.N.key/value out (Optimum's names), verified over decode steps")
        g = parser.add_argument_group("advanced")
        g.add_argument("--opset", type=int, default=None, metavar="N", help="ONNX opset version (exporter default)")

    def parse_own(self, ns: argparse.Namespace, args: Args) -> ExportChoice:
        return ExportChoice(ns.static, ns.exporter, not ns.no_verify,
                            ExportOptions(opset=ns.opset, fallback=ns.fallback, dynamic_sequence=ns.dynamic_sequence,
                                          kv_cache=ns.kv_cache))

    def run(self, args: Args) -> int:
        # every option was checked by parse() before torch is imported
        opts: ExportChoice = args.own
        out = Path(args.output or "")
        model, info, sample_args, kwargs = args.model.load_with_inputs(args.inputs)
        method = args.model.method

        from ...exporting.export import export

        if sys.stderr.isatty():  # progress only for a person watching
            self.say(f"exporting {args.model.text} ({opts.exporter} exporter) to {out} ...")
        with running(info, method, sample_args, kwargs, spinner=False):  # export runs the model first: its errors, one line
            report = export(
                model,
                sample_args,
                out,
                args.taps,
                method=method,
                kwargs=kwargs,
                dynamic_batch=not opts.static,
                verify=opts.verify,
                exporter=opts.exporter,
                rtol=args.tolerance.rtol,
                atol=args.tolerance.atol,
                export_options=opts.options,
            )
        self.print_table(report, as_json=args.json)
        return 0 if report.ok else 1
