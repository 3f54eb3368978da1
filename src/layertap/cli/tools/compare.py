"""``layertap compare MODEL FILE.onnx``: PyTorch vs ONNX Runtime, module by module."""

from __future__ import annotations

import argparse

from ..args import InputArgs, JsonArgs, ModelArgs
from .base import Tool


class CompareTool(Tool):
    name = "compare"
    help = "compare PyTorch and ONNX Runtime layer by layer and name the first diverging module"
    groups = (ModelArgs(), InputArgs(), JsonArgs())

    def add_own_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("onnx", metavar="FILE.onnx")
        parser.add_argument("--rtol", type=float, default=None)
        parser.add_argument("--atol", type=float, default=None)
        parser.add_argument("--plot", metavar="FILE.png")

    def run(self, ns: argparse.Namespace) -> int:
        raise NotImplementedError("TODO(issue 5)")
