"""``layertap compare MODEL FILE.onnx``: PyTorch vs ONNX Runtime, module by module."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ...errors import OnnxFileError
from ..args import InputArgs, JsonArgs, ModelArgs, ReportArgs, ToleranceArgs, positive_int
from ..console import StepProgress
from .base import Tool


class CompareTool(Tool):
    """Exit 0 when every compared module agrees, 1 on a divergence, 2 on bad input."""

    name = "compare"
    help = "compare PyTorch and ONNX Runtime layer by layer and name the first diverging module"
    groups = (ModelArgs(), InputArgs(), ToleranceArgs(), JsonArgs(), ReportArgs())

    def add_own_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("onnx", metavar="FILE.onnx", help="the exported file (never modified)")
        g = parser.add_argument_group("comparison")
        g.add_argument("--module", action="append", default=None, metavar="PATH",
                       help="compare only this module and its submodules (repeatable)")
        g.add_argument("--no-ort-opt", action="store_true",
                       help="run ONNX Runtime with graph optimisations disabled (exposed outputs can change its fusions)")
        g.add_argument("--memory-budget", type=positive_int, default=1024, metavar="MB",
                       help="MB of intermediates held at once on each side; PyTorch values beyond it spill to a "
                            "temporary folder and ONNX Runtime runs in more, smaller batches (default 1024)")
        g.add_argument("--batch-outputs", type=positive_int, default=None, metavar="N",
                       help="expose at most N ONNX tensors per ONNX Runtime run (default: as memory allows)")
        g.add_argument("--plot", metavar="FILE.png", help="write a PNG of the error per module (log scale)")
        g.add_argument("--node-data", metavar="FILE.json",
                       help="write Model Explorer node data keyed by the ONNX file's node names: the error in FILE.json, "
                            "status in FILE.status.json, module path in FILE.module.json")

    def run(self, ns: argparse.Namespace) -> int:
        from ...files import check_output_path

        # Cheap checks first: a typo in a path should not cost a model load.
        onnx_path = Path(ns.onnx)
        if not onnx_path.is_file():
            raise OnnxFileError(f"ONNX file '{onnx_path}' does not exist")
        if ns.plot is not None:
            check_output_path(ns.plot, inputs=(ns.onnx,), suffixes=(".png",))
        ReportArgs.check(ns, inputs=(ns.onnx,))
        if ns.node_data is not None:
            from ...reports.nodedata import check_node_data_path

            check_node_data_path(ns.node_data, inputs=(ns.onnx,))
        model, info, args, kwargs = ModelArgs.load_with_inputs(ns)  # parses --input first

        from ...bridge.compare import compare

        with StepProgress(enabled=sys.stderr.isatty()) as progress:
            report = compare(
                model,
                args,
                onnx_path,
                kwargs=kwargs,
                method=ns.method,
                rtol=ns.rtol,
                atol=ns.atol,
                modules=ns.module,
                ort_optimizations=not ns.no_ort_opt,
                batch_outputs=ns.batch_outputs,
                memory_budget=ns.memory_budget << 20,
                progress=progress,
            )
        if ns.plot is not None:
            report.plot(ns.plot)
        self.print_table(report, as_json=ns.json)
        if ns.plot is not None and not ns.json:
            self.say(f"wrote {ns.plot}")
        self.write_visuals(ns, report)
        return 0 if report.ok else 1

    @staticmethod
    def write_visuals(ns: argparse.Namespace, report) -> None:
        """``--report`` and ``--node-data``, once the numbers are in."""
        if ns.report:
            from ...reports import report_page

            summary = [("reference", ns.model), ("candidate", ns.onnx)]
            ReportArgs.write(ns, report_page(report, f"compare {ns.model} vs {Path(ns.onnx).name}", summary=summary))
        if ns.node_data:
            from ...reports.nodedata import write_node_data

            written = write_node_data(report, ns.onnx, ns.node_data)
            sys.stderr.write(f"wrote Model Explorer node data {', '.join(map(str, written))}\n")
