"""``layertap fix REF --to fp16|int8 -o FIXED.onnx``: the fewest modules kept in float32 that make
the conversion meet a target, every set converted and run for real. With an ONNX REF nothing
imports torch."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import LayertapError, OnnxFileError, printable
from ...options import SearchOptions
from ...runtimes.plugins import plugin, plugin_for
from ..args import Args, InputArgs, JsonArgs, ModelArgs, OutputArgs, ReportArgs, RuntimeArgs, SampleArgs, is_onnx_path, nonneg_int
from .base import Tool


@dataclass(frozen=True)
class FixOptions:
    """``fix``'s own options, checked (the samples judged on are ``args.sampling``)."""

    to: str
    calib: str | None
    target: Any  # fixing.configs.Target
    max_float: int | None
    keep: list[str]
    config_out: str | None
    runtime: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)  # the runtime's own (--compile-mode)


class FixTool(Tool):
    """Exit 0 when the target is met, 1 when no set within --max-float meets it (FIXED.onnx then
    holds the best set found), 2 on bad input."""

    name = "fix"
    help = "convert to float16/int8 keeping the fewest modules in float32 that meet a target, each set verified"
    description = ("convert to float16/int8 keeping the fewest modules in float32 that meet a target, each set "
                   "verified. Exit 0: the target is met; 1: no set tried meets it (FIXED.onnx then holds the best "
                   "one); 2: bad input")
    examples = (
        "layertap fix resnet18.onnx --to fp16 -o resnet18-fixed.onnx --samples 2 --config-out fix-cfg",
        "layertap fix torchvision:resnet50 --to int8 -o r50-int8.onnx --calib images/ --target top1:0.99",
        "layertap fix m.onnx --to fp16 -o m16.onnx --keep layer4.2 --max-float 8  # layer4.2 always kept in float32",
        "layertap fix torchvision:mobilenet_v3_small --input 1x3x64x64 --to int8 --runtime executorch -o m.pte",
        "layertap fix torchvision:resnet18 --input 1x3x64x64 --to int8 --runtime litert -o r18.tflite --config-out cfg"
        "  # + cfg/ai_edge_quantizer_recipe.json",
        "layertap fix torchvision:resnet18 --runtime inductor --autocast bf16 --target cosine:0.9999 -o keep-eager.json"
        "  # the fewest modules kept eager in torch.compile",
    )
    groups = (ModelArgs(onnx_ok=True), InputArgs(),
              OutputArgs(required=True, suffixes=(".onnx", ".pte", ".tflite", ".json"),
                         help="FIXED.onnx (FIXED.pte with --runtime executorch, FIXED.tflite with --runtime litert, "
                              "keep-eager.json with --runtime inductor): the conversion with the kept set"),
              JsonArgs(), ReportArgs(),
              SampleArgs(inputs_help="samples to judge on: a folder of images, .npy/.npz files or a datasets folder, "
                                     "or one .npz",
                         samples_help="N seeded random samples (default 8 when no --inputs)", default_samples=8,
                         check_exists=True))

    def add_own_arguments(self, parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("repair")
        g.add_argument("--to", choices=("fp16", "int8"), default=None,
                       help="fp16: onnxconverter-common (keep_io_types); int8: onnxruntime.quantization QDQ, "
                            "calibrated on --calib (--runtime inductor: the --autocast dtype, none for float32)")
        g.add_argument("--calib", metavar="PATH", help="int8 calibration samples (as --inputs; default the samples judged on)")
        g.add_argument("--target", default="cosine:0.999", metavar="METRIC:VALUE",
                       help="what the model's outputs must reach on every sample: cosine:0.999 (default), "
                            "rel:1e-2, sqnr:30, top1:0.99 (arg-max agreement), max_abs:1e-3 (largest difference)")
        g.add_argument("--max-float", type=nonneg_int, default=None, metavar="N",
                       help="keep at most N modules (ONNX nodes, in a file without module scopes) in float32")
        g.add_argument("--keep", action="append", default=[], metavar="PATH",
                       help="module path always kept in float32 (repeatable), e.g. layer4.2; in a file without "
                            "module scopes (paddle2onnx, tf2onnx) a node name or the tensor name it makes")
        g.add_argument("--runtime", default=None, metavar="NAME",
                       help="ort (default): an ONNX file, run in ONNX Runtime; executorch: an int8 ExecuTorch program "
                            "(XNNPACK quantizer), each set lowered and run in ExecuTorch (-o FIXED.pte); litert: an int8 LiteRT "
                            "program (AI Edge Quantizer), each set converted and run in LiteRT (-o FIXED.tflite); openvino: "
                            "an ONNX file, each set converted and run in OpenVINO (--ov-precision, --ov-device); "
                            "inductor: "
                            "modules kept eager in torch.compile (-o keep-eager.json); or a runtime plug-in's name")
        RuntimeArgs.add_openvino(g)
        RuntimeArgs.add_compiled(parser)
        g.add_argument("--config-out", metavar="DIR",
                       help="write the kept set for each toolchain: modules.json (nodes.json in a file without "
                            "module scopes), onnxconverter_common.json, "
                            "ort_quantization.json, polygraphy.txt, modelopt.json; fp16: also convert.py, which "
                            "makes FIXED.onnx again (checked)")

    def parse_own(self, ns: argparse.Namespace, args: Args) -> FixOptions:
        from ...fixing.configs import Target

        target = Target.parse(ns.target)
        to = ns.to
        if ns.runtime == "inductor" and to is None:
            to = ns.autocast or "fp32"
        elif to is None:
            raise LayertapError("--to fp16 or --to int8: what the model is converted to (--runtime inductor needs "
                                "none: it compiles at the --autocast dtype)")
        elif ns.autocast is not None or ns.compile_mode is not None or ns.compile_backend is not None:
            raise LayertapError("--autocast, --compile-mode and --compile-backend go with --runtime inductor")
        if ns.calib is not None and to != "int8":
            raise LayertapError("--calib calibrates int8 quantisation; float16 (--to fp16) needs none")
        if is_onnx_path(ns.model) and not Path(ns.model).is_file():
            raise OnnxFileError(f"ONNX file '{ns.model}' does not exist")
        if ns.calib is not None and not Path(ns.calib).exists():
            raise LayertapError(f"--calib '{ns.calib}' does not exist")
        if ns.config_out is not None:
            from ...fixing.configs import check_config_out

            check_config_out(ns.config_out)
        args.reads = tuple(p for p in (ns.model if is_onnx_path(ns.model) else None, ns.inputs, ns.calib) if p)
        chosen = plugin(ns.runtime) if ns.runtime is not None else plugin_for(ns.output)
        if chosen is not None and chosen.form == "program":
            out_name = getattr(chosen, "fix_out", f"FIXED{chosen.suffixes[0]}")
            if not str(ns.output).lower().endswith(Path(out_name).suffix):
                raise LayertapError(f"--runtime {chosen.name} writes {out_name}: give -o {out_name}")
        settings = {k: v for k, v in (("compile_mode", ns.compile_mode), ("compile_backend", ns.compile_backend),
                                      ("ov_precision", ns.ov_precision), ("ov_device", ns.ov_device)) if v is not None}
        return FixOptions(to, ns.calib, target, ns.max_float, ns.keep, ns.config_out,
                          chosen.name if chosen is not None else None, settings)

    def run(self, args: Args) -> int:
        opts: FixOptions = args.own
        from ...fixing import fix

        ref = args.model.text if args.model.is_onnx else args.model.model
        report = fix(ref, args.inputs.specs or None, to=opts.to, out=str(args.output), target=opts.target,
                     calib=opts.calib, keep=opts.keep, max_float=opts.max_float, config_out=opts.config_out,
                     sample_options=args.sampling, search_options=SearchOptions(on_step=None if args.json else _say_step,
                                                   runtime=opts.runtime, runtime_settings=opts.settings))
        self.print_table(report, as_json=args.json)
        if not args.json:
            self.say(f"wrote {args.output}" + ("" if report.ok else " (the best set found; the target is not met)"))
            if opts.config_out:
                self.say(f"wrote the kept set for each toolchain in {opts.config_out}")
        if args.report:
            from ...reports import report_page

            summary = [("reference", args.model.text), ("converted to", opts.to), ("target", str(opts.target)),
                       ("fixed file", str(args.output))]
            ReportArgs.write(args, report_page(report, f"fix {args.model.text} --to {opts.to}", summary=summary))
        return 0 if report.ok else 1


def _say_step(step: Any) -> None:
    from ...fixing.fix import fmt_metric

    changed = ", ".join(step.changed[:4]) + (f" (+{len(step.changed) - 4})" if len(step.changed) > 4 else "")
    # no verdict here: a set that meets the metric may still lack a module every set must keep
    # (values beyond float16's range), which the search learns later; the table says which sets qualify
    sys.stderr.write(printable(f"step {step.step} {step.action} {changed or '-'}: {step.n_kept} kept, metric "
                               f"{fmt_metric(step.metric)}, {step.size / 1e6:.2f} MB, {step.latency_ms:.2f} ms") + "\n")
