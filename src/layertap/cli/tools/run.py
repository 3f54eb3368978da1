"""``layertap run FILE.onnx``: run in ONNX Runtime with intermediate taps."""

from __future__ import annotations

import argparse

from ..args import InputArgs, OutputArgs, TapArgs
from .base import Tool


class RunTool(Tool):
    name = "run"
    help = "run an ONNX file in ONNX Runtime, exposing tensors or module taps in memory"
    groups = (InputArgs(), TapArgs(), OutputArgs(required=False, suffixes=(".npz", ".safetensors"), help="FILE.npz"))

    def add_own_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("onnx", metavar="FILE.onnx")
        parser.add_argument("--json", action="store_true")

    def run(self, ns: argparse.Namespace) -> int:
        raise NotImplementedError("TODO(issue 4)")
