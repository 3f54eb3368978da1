"""``layertap add-outputs IN.onnx -o OUT.onnx``: expose tensors or modules as outputs."""

from __future__ import annotations

import argparse
import sys
import warnings
from dataclasses import dataclass

from ...errors import LayertapError, printable
from ...runtimes import add_outputs
from ..args import Args, OutputArgs
from .base import Tool


@dataclass(frozen=True)
class AddOutputsOptions:
    """What to expose: tensor names, module taps, or every tensor."""

    src: str
    tensors: list[str]
    modules: list[str]
    all: bool


class AddOutputsTool(Tool):
    name = "add-outputs"
    help = "write a copy of an ONNX file with intermediate tensors (by name or module path) as outputs"
    examples = (
        "layertap add-outputs resnet18.onnx -o tapped.onnx --module layer3.1 --module layer2.0.relu#1",
        "layertap add-outputs resnet18.onnx -o tapped.onnx --tensor relu_5",
    )
    output = OutputArgs(required=True, suffixes=(".onnx",), help="OUT.onnx (never the input)")
    groups = (output,)

    def add_own_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("src", metavar="IN.onnx", help="the ONNX file to copy (never modified)")
        parser.add_argument("--tensor", action="append", default=[], metavar="NAME", help="ONNX tensor name (repeatable)")
        parser.add_argument("--module", action="append", default=[], metavar="PATH",
                            help="PyTorch module tap, e.g. layer3.1 or layer2.0.relu#1 (repeatable)")
        parser.add_argument("--all", action="store_true", help="mark every tensor (blocks ORT fusions)")

    def parse_own(self, ns: argparse.Namespace, args: Args) -> AddOutputsOptions:
        if not (ns.tensor or ns.module or ns.all):
            raise LayertapError("nothing to add: give --tensor NAME, --module PATH or --all")
        args.reads = (ns.src,)
        return AddOutputsOptions(ns.src, ns.tensor, ns.module, ns.all)

    def run(self, args: Args) -> int:
        opts: AddOutputsOptions = args.own
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            added = add_outputs(opts.src, args.output or "", tensors=opts.tensors, modules=opts.modules, all=opts.all)
        for w in caught:
            sys.stderr.write(printable(f"layertap: warning: {w.message}") + "\n")
        shown = f"{', '.join(added[:20])}{' ...' if len(added) > 20 else ''}"
        sys.stderr.write(printable(f"wrote {args.output} with {len(added)} new output(s): {shown}") + "\n")
        return 0
