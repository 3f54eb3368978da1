"""``layertap layers MODEL``: every module that ran (or every tensor of an ONNX file)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ...errors import LayertapError
from ...runtimes import is_ir, onnx_layers, open_runtime, plugin_for
from ..args import Args, InputArgs, JsonArgs, ModelArgs, ReportArgs, is_onnx_path
from .base import Tool, running

# ``layers`` without --input builds a model with more weights than this on the meta device.
META_ABOVE = 1 << 30


class LayersTool(Tool):
    name = "layers"
    help = "list the modules of a model (with shapes when inputs are known), or the tensors of an ONNX file"
    examples = (
        "layertap layers torchvision:resnet18  # every module call (default input 1x3x224x224)",
        "layertap layers resnet18.onnx  # every tensor: name, op, module, call, dtype, shape",
        "layertap layers timm:resnet10t --json",
    )
    groups = (ModelArgs(onnx_ok=True), InputArgs(), JsonArgs(), ReportArgs())

    def parse_own(self, ns: argparse.Namespace, args: Args) -> None:
        if is_onnx_path(ns.model):  # an HTML report never replaces the file listed
            args.reads = (ns.model,)

    def run(self, args: Args) -> int:
        m = args.model
        if m.is_onnx:
            return self.run_onnx(args)

        from ...pytorch.memory import ModelTooLargeError
        from ...pytorch.module_table import layers

        # Shapes need no weights: without --input/--weights a big model is listed from the meta device.
        shapes_only = not (args.inputs.specs or m.weights)
        on_meta = None
        try:
            model, info, sample_args, kwargs = m.load_with_inputs(
                args.inputs, need_inputs=False, max_bytes=META_ABOVE if shapes_only else None)
        except ModelTooLargeError as e:
            if not shapes_only:  # the user asked for real values: say what to change
                raise
            model, info, sample_args, kwargs = m.load_with_inputs(args.inputs, need_inputs=False, device="meta")
            on_meta = f"{e.need / 2**30:.1f} GiB of weights"
        if sample_args is None:
            table = layers(model, run=False)
        elif on_meta is not None:
            table = _meta_layers(model, sample_args, kwargs, m.method, on_meta)
        else:
            with running(info, m.method, sample_args, kwargs):
                table = layers(model, *sample_args, method=m.method, **kwargs)
        self.print_table(table, args.json)
        if args.report:
            inputs = ReportArgs.inputs_text(sample_args, kwargs) if sample_args is not None else "not run"
            self.write_report(args, table, [("model", m.text), ("method", m.method), ("inputs", inputs)])
        return 0

    @staticmethod
    def write_report(args: Args, table, summary: list) -> None:
        from ...reports import report_page

        ReportArgs.write(args, report_page(table, f"layers of {args.model.text}", summary=summary))

    def run_onnx(self, args: Args) -> int:
        """List an ONNX file's tensors; never imports torch."""
        m = args.model
        for flag, value in (("--weights", m.weights), ("--config", m.config), ("--input", args.inputs.specs)):
            if value:
                raise LayertapError(f"{flag} does not apply to an ONNX file ({m.text}); its tensors are listed without running it")
        if m.method != "forward":
            raise LayertapError(f"--method does not apply to an ONNX file ({m.text})")

        program = plugin_for(m.text)
        if program is not None and program.form == "program":  # what a program takes and hands out
            table = program.layers(Path(m.text))  # type: ignore[attr-defined]
        elif is_ir(m.text):  # an OpenVINO IR: its tensors as OpenVINO reads them
            from ...runtimes.openvino import ir_file

            table = onnx_layers(ir_file(open_runtime("openvino", ov_precision="f32"), m.text))
            table.notes.append("an OpenVINO IR: op types are OpenVINO's; its tensors align by name with the ONNX file "
                               "it came from (compare, run with --runtime openvino)")
        else:
            table = onnx_layers(m.text)
        self.print_table(table, args.json)
        if args.report:
            self.write_report(args, table, [("file", m.text)])
        return 0


def _meta_layers(model, args: tuple, kwargs: dict, method: str, why: str):
    """The layers table of a model built on the meta device: shapes from a forward on meta
    tensors, or the module list alone when the forward needs real values."""
    from ...pytorch.module_table import layers

    try:
        table = layers(model, *args, method=method, **kwargs)
        note = f"built on the meta device ({why}): no weights allocated, shapes from a forward on meta tensors"
    except Exception as e:  # noqa: BLE001 - any op may refuse meta tensors
        table = layers(model, run=False)
        note = f"built on the meta device ({why}); a forward on meta tensors failed ({type(e).__name__}), so no shapes"
    table.notes.append(note)
    return table
