"""``layertap add-outputs IN.onnx -o OUT.onnx``: expose tensors or modules as outputs."""

from __future__ import annotations

import argparse

from ..args import OutputArgs
from .base import Tool


class AddOutputsTool(Tool):
    name = "add-outputs"
    help = "write a copy of an ONNX file with intermediate tensors (by name or module path) as outputs"
    groups = (OutputArgs(required=True, suffixes=(".onnx",), help="OUT.onnx (never the input)"),)

    def add_own_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("src", metavar="IN.onnx")
        parser.add_argument("--tensor", action="append", default=[], metavar="NAME")
        parser.add_argument("--module", action="append", default=[], metavar="PATH")
        parser.add_argument("--all", action="store_true", help="mark every tensor (blocks ORT fusions)")

    def run(self, ns: argparse.Namespace) -> int:
        raise NotImplementedError("TODO(issue 4)")
