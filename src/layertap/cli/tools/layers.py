"""``layertap layers MODEL``: every module that ran (or every tensor of an ONNX file)."""

from __future__ import annotations

import argparse

from ...errors import LayertapError
from ..args import InputArgs, JsonArgs, ModelArgs, ReportArgs
from .base import Tool

# ``layers`` without --input builds a model with more weights than this on the meta device.
META_ABOVE = 1 << 30


class LayersTool(Tool):
    name = "layers"
    help = "list the modules of a model (with shapes when inputs are known), or the tensors of an ONNX file"
    groups = (ModelArgs(onnx_ok=True), InputArgs(), JsonArgs(), ReportArgs())

    def run(self, ns: argparse.Namespace) -> int:
        if ns.model.lower().endswith(".onnx"):
            return self.run_onnx(ns)
        ReportArgs.check(ns)
        InputArgs.specs(ns)
        ModelArgs.check(ns)  # before torch is imported

        from ...pytorch.layers import layers
        from ...pytorch.memory import ModelTooLargeError
        from .base import running

        # Shapes need no weights: without --input/--weights a big model is listed from the meta device.
        shapes_only = not (ns.input or ns.weights)
        on_meta = None
        try:
            model, info, args, kwargs = ModelArgs.load_with_inputs(
                ns, need_inputs=False, max_bytes=META_ABOVE if shapes_only else None)
        except ModelTooLargeError as e:
            if not shapes_only:  # the user asked for real values: say what to change
                raise
            model, info, args, kwargs = ModelArgs.load_with_inputs(ns, need_inputs=False, device="meta")
            on_meta = f"{e.need / 2**30:.1f} GiB of weights"
        if args is None:
            table = layers(model, run=False)
        elif on_meta is not None:
            table = _meta_layers(model, args, kwargs, ns.method, on_meta)
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


def _meta_layers(model, args: tuple, kwargs: dict, method: str, why: str):
    """The layers table of a model built on the meta device: shapes from a forward on meta
    tensors, or the module list alone when the forward needs real values."""
    from ...pytorch.layers import layers

    try:
        table = layers(model, *args, method=method, **kwargs)
        note = f"built on the meta device ({why}): no weights allocated, shapes from a forward on meta tensors"
    except Exception as e:  # noqa: BLE001 - any op may refuse meta tensors
        table = layers(model, run=False)
        note = f"built on the meta device ({why}); a forward on meta tensors failed ({type(e).__name__}), so no shapes"
    table.notes.append(note)
    return table
