"""``layertap layers MODEL``: every module that ran (or every tensor of an ONNX file)."""

from __future__ import annotations

import argparse

from ...errors import LayertapError
from ..args import InputArgs, JsonArgs, ModelArgs
from .base import Tool


class LayersTool(Tool):
    name = "layers"
    help = "list the modules of a model (with shapes when inputs are known), or the tensors of an ONNX file"
    groups = (ModelArgs(onnx_ok=True), InputArgs(), JsonArgs())

    def run(self, ns: argparse.Namespace) -> int:
        if ns.model.lower().endswith(".onnx"):
            return self.run_onnx(ns)
        from ...pytorch.layers import layers
        from .base import running

        model, info, args, kwargs = ModelArgs.load_with_inputs(ns, need_inputs=False)
        if args is None:
            table = layers(model, run=False)
        else:
            with running(info, ns.method, args, kwargs):
                table = layers(model, *args, method=ns.method, **kwargs)
        self.print_table(table, ns.json)
        return 0

    def run_onnx(self, ns: argparse.Namespace) -> int:
        """List an ONNX file's tensors; never imports torch."""
        for flag, value in (("--weights", ns.weights), ("--config", ns.config), ("--input", ns.input)):
            if value:
                raise LayertapError(f"{flag} does not apply to an ONNX file ({ns.model}); its tensors are listed without running it")
        if ns.method != "forward":
            raise LayertapError(f"--method does not apply to an ONNX file ({ns.model})")
        from ...onnxfile.layers import onnx_layers

        self.print_table(onnx_layers(ns.model), ns.json)
        return 0
