"""``layertap layers MODEL``: every module that ran (or every tensor of an ONNX file)."""

from __future__ import annotations

import argparse

from ...errors import LayertapError
from ..args import InputArgs, JsonArgs, ModelArgs, ReportArgs
from .base import Tool


class LayersTool(Tool):
    name = "layers"
    help = "list the modules of a model (with shapes when inputs are known), or the tensors of an ONNX file"
    groups = (ModelArgs(onnx_ok=True), InputArgs(), JsonArgs(), ReportArgs())

    def run(self, ns: argparse.Namespace) -> int:
        if ns.model.lower().endswith(".onnx"):
            return self.run_onnx(ns)
        ReportArgs.check(ns)
        model, info, args, kwargs = ModelArgs.load_with_inputs(ns, need_inputs=False)  # checks first

        from ...pytorch.layers import layers
        from .base import running

        if args is None:
            table = layers(model, run=False)
        else:
            with running(info, ns.method, args, kwargs):
                table = layers(model, *args, method=ns.method, **kwargs)
        self.print_table(table, ns.json)
        if ns.report:
            self.write_report(ns, table, [("model", ns.model), ("method", ns.method),
                                          ("inputs", ReportArgs.inputs_text(args, kwargs) if args is not None else "not run")])
        return 0

    @staticmethod
    def write_report(ns: argparse.Namespace, table, summary: list) -> None:
        from ...reports import report_page

        ReportArgs.write(ns, report_page(table, f"layers of {ns.model}", summary=summary))

    def run_onnx(self, ns: argparse.Namespace) -> int:
        """List an ONNX file's tensors; never imports torch."""
        for flag, value in (("--weights", ns.weights), ("--config", ns.config), ("--input", ns.input)):
            if value:
                raise LayertapError(f"{flag} does not apply to an ONNX file ({ns.model}); its tensors are listed without running it")
        if ns.method != "forward":
            raise LayertapError(f"--method does not apply to an ONNX file ({ns.model})")
        ReportArgs.check(ns, inputs=(ns.model,))
        from ...onnxfile.layers import onnx_layers

        table = onnx_layers(ns.model)
        self.print_table(table, ns.json)
        if ns.report:
            self.write_report(ns, table, [("file", ns.model)])
        return 0
