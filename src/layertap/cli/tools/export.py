"""``layertap export MODEL -o FILE.onnx``: taps become named, verified ONNX outputs."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace
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
    #: calibration samples of an int8 program (``--calib PATH`` / ``--inputs PATH``), read once the model is known
    calib: str | None = None


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
        "layertap export torchvision:resnet18 --input 1x3x64x64 -o r18.pte --tap layer1  # ExecuTorch, XNNPACK",
        "layertap export torchvision:resnet18 --input 1x3x64x64 -o r18-int8.pte --quantize int8 --samples 16",
        "layertap export torchvision:resnet18 --input 1x3x64x64 -o r18.pt2 --tap layer1  # AOTInductor package",
        "layertap export torchvision:resnet18 --input 1x3x64x64 -o r18.tflite --tap layer1  # LiteRT, litert-torch",
        "layertap export torchvision:resnet18 --input 1x3x64x64 -o r18-int8.tflite --quantize int8 --samples 16",
    )
    output = OutputArgs(required=True, suffixes=(".onnx", ".pte", ".pt2", ".tflite"),
                        help="FILE.onnx, FILE.pte (an ExecuTorch program), FILE.pt2 (an AOTInductor package) or "
                             "FILE.tflite (a LiteRT program)")
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
        et = parser.add_argument_group("ExecuTorch and LiteRT programs (-o FILE.pte, -o FILE.tflite)")
        et.add_argument("--backend", choices=("xnnpack", "portable"), default=None,
                        help="lower for XNNPACK (default) or ExecuTorch's portable kernels (.pte only)")
        et.add_argument("--quantize", choices=("int8", "dynamic"), default=None,
                        help="int8: the XNNPACK quantizer (pt2e; .pte) or AI Edge Quantizer's static int8 (.tflite), "
                             "calibrated on --calib/--inputs or --samples; dynamic (.tflite): int8 weights, "
                             "activations quantised as the kernels run")
        et.add_argument("--calib", "--inputs", dest="calib", default=None, metavar="PATH",
                        help="calibration samples: one .npz or a folder of .npy/.npz/images (as compare --inputs)")
        et.add_argument("--samples", type=int, default=None, metavar="N",
                        help="calibrate on N random samples drawn like the example (default 16)")

    def parse_own(self, ns: argparse.Namespace, args: Args) -> ExportChoice:
        from ...errors import LayertapError

        suffix = Path(str(ns.output or "")).suffix.lower()
        program = suffix in (".pte", ".tflite")
        asked = [f for f, v in (("--backend", ns.backend), ("--quantize", ns.quantize), ("--calib", ns.calib),
                                ("--samples", ns.samples)) if v is not None]
        if asked and not program:
            raise LayertapError(f"{asked[0]} applies to ExecuTorch programs (-o FILE.pte) and LiteRT programs "
                                "(-o FILE.tflite)")
        if suffix == ".tflite" and ns.backend is not None:
            raise LayertapError("--backend picks an ExecuTorch backend (-o FILE.pte); a LiteRT program runs on "
                                "LiteRT's own delegate")
        if suffix == ".pte" and ns.quantize == "dynamic":
            raise LayertapError("--quantize dynamic makes a LiteRT program (-o FILE.tflite); ExecuTorch programs are "
                                "quantised with --quantize int8")
        if (ns.calib is not None or ns.samples is not None) and ns.quantize != "int8":
            raise LayertapError("--calib/--inputs and --samples calibrate an int8 program: add --quantize int8")
        if ns.calib is not None and ns.samples is not None:
            raise LayertapError("give --calib/--inputs PATH or --samples N, not both")
        if ns.samples is not None and ns.samples < 1:
            raise LayertapError(f"--samples must be a positive number, got {ns.samples}")
        et = dict(backend=ns.backend or "xnnpack", quantize=ns.quantize, calibration=ns.samples) if program else {}
        return ExportChoice(ns.static, ns.exporter, not ns.no_verify,
                            ExportOptions(opset=ns.opset, fallback=ns.fallback, dynamic_sequence=ns.dynamic_sequence,
                                          kv_cache=ns.kv_cache, **et), calib=ns.calib)

    def run(self, args: Args) -> int:
        # every option was checked by parse() before torch is imported
        opts: ExportChoice = args.own
        out = Path(args.output or "")
        model, info, sample_args, kwargs = args.model.load_with_inputs(args.inputs)
        method = args.model.method

        from ...exporting.export import export

        if opts.calib is not None:  # lt.export reads it, at the example's ranks
            opts = replace(opts, options=replace(opts.options, calibration=opts.calib))
        if sys.stderr.isatty():  # progress only for a person watching
            how = {".pte": "ExecuTorch", ".pt2": "AOTInductor", ".tflite": "LiteRT"}.get(out.suffix.lower(), f"{opts.exporter} exporter")
            self.say(f"exporting {args.model.text} ({how}) to {out} ...")
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
