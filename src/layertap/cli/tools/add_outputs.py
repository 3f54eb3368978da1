"""``layertap add-outputs IN.onnx -o OUT.onnx``: expose tensors or modules as outputs."""

from __future__ import annotations

import argparse
import sys
import warnings

from ...errors import LayertapError, printable
from ..args import OutputArgs
from .base import Tool


class AddOutputsTool(Tool):
    name = "add-outputs"
    help = "write a copy of an ONNX file with intermediate tensors (by name or module path) as outputs"
    output = OutputArgs(required=True, suffixes=(".onnx",), help="OUT.onnx (never the input)")
    groups = (output,)

    def add_own_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("src", metavar="IN.onnx", help="the ONNX file to copy (never modified)")
        parser.add_argument("--tensor", action="append", default=[], metavar="NAME", help="ONNX tensor name (repeatable)")
        parser.add_argument("--module", action="append", default=[], metavar="PATH",
                            help="PyTorch module tap, e.g. layer3.1 or layer2.0.relu#1 (repeatable)")
        parser.add_argument("--all", action="store_true", help="mark every tensor (blocks ORT fusions)")

    def run(self, ns: argparse.Namespace) -> int:
        from ...onnxfile.outputs import add_outputs

        if not (ns.tensor or ns.module or ns.all):
            raise LayertapError("nothing to add: give --tensor NAME, --module PATH or --all")
        self.output.check(ns, inputs=(ns.src,))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            added = add_outputs(ns.src, ns.output, tensors=ns.tensor, modules=ns.module, all=ns.all)
        for w in caught:
            sys.stderr.write(printable(f"layertap: warning: {w.message}") + "\n")
        shown = f"{', '.join(added[:20])}{' ...' if len(added) > 20 else ''}"
        sys.stderr.write(printable(f"wrote {ns.output} with {len(added)} new output(s): {shown}") + "\n")
        return 0
