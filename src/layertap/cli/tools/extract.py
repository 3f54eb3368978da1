"""``layertap extract MODEL --tap ... -o FILE``: save tapped tensors to .npz/.safetensors."""

from __future__ import annotations

import argparse

from ..args import InputArgs, ModelArgs, OutputArgs, TapArgs
from .base import Tool


class ExtractTool(Tool):
    name = "extract"
    help = "run a model once and save the tapped tensors to .npz or .safetensors"
    groups = (
        ModelArgs(),
        TapArgs(required=True),
        InputArgs(),
        OutputArgs(required=True, suffixes=(".npz", ".safetensors"), help="FILE.npz or FILE.safetensors"),
    )

    def add_own_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--stop-early", action="store_true", help="stop the forward once every tap is captured")

    def run(self, ns: argparse.Namespace) -> int:
        raise NotImplementedError("TODO(issue 2)")
