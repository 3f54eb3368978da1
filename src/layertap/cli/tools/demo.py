"""``layertap demo``: the main jobs on a built-in default (torchvision resnet18)."""

from __future__ import annotations

import argparse

from .base import Tool


class DemoTool(Tool):
    name = "demo"
    help = "show layertap end to end on torchvision resnet18 (random weights)"

    def run(self, ns: argparse.Namespace) -> int:
        raise NotImplementedError("TODO(issue 2)")
