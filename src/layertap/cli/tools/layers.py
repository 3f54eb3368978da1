"""``layertap layers MODEL``: every module that ran (or every tensor of an ONNX file)."""

from __future__ import annotations

import argparse

from ..args import InputArgs, JsonArgs, ModelArgs
from .base import Tool


class LayersTool(Tool):
    name = "layers"
    help = "list the modules of a model (with shapes when inputs are known), or the tensors of an ONNX file"
    groups = (ModelArgs(onnx_ok=True), InputArgs(), JsonArgs())

    def run(self, ns: argparse.Namespace) -> int:
        raise NotImplementedError("TODO(issue 2/4)")
