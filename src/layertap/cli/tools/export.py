"""``layertap export MODEL -o FILE.onnx``: taps become named, verified ONNX outputs."""

from __future__ import annotations

import argparse

from ..args import InputArgs, ModelArgs, OutputArgs, TapArgs
from .base import Tool


class ExportTool(Tool):
    name = "export"
    help = "export a model to ONNX with taps as extra named outputs, verified in ONNX Runtime"
    groups = (
        ModelArgs(),
        TapArgs(),
        InputArgs(),
        OutputArgs(required=True, suffixes=(".onnx",), help="FILE.onnx"),
    )

    def add_own_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--static", action="store_true", help="fixed batch size (default: symbolic batch)")
        parser.add_argument("--exporter", choices=("dynamo", "torchscript"), default="dynamo")
        parser.add_argument("--no-verify", action="store_true", help="skip the ONNX Runtime check")
        parser.add_argument("--json", action="store_true", help="print the verification report as JSON")

    def run(self, ns: argparse.Namespace) -> int:
        raise NotImplementedError("TODO(issue 3)")
