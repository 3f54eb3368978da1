"""``layertap run FILE.onnx``: run in ONNX Runtime with intermediate taps."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from ...runtimes import plugin, run, runtime_for
from ...tables import Column, Table
from ...text import fmt_float, fmt_shape
from ..args import Args, InputArgs, JsonArgs, OutputArgs, RuntimeArgs, TapArgs
from .base import Tool


@dataclass(frozen=True)
class ValueRow:
    name: str
    shape: list[int]
    dtype: str
    min: float | None
    max: float | None
    mean: float | None


class RunTable(Table):
    title = "ONNX Runtime outputs"
    columns = [
        Column("name", "Name", name=True),
        Column("shape", "Shape", fmt=fmt_shape, no_wrap=True),
        Column("dtype", "Dtype", drop=3),
        Column("min", "Min", fmt=fmt_float, justify="right", drop=2),
        Column("max", "Max", fmt=fmt_float, justify="right", drop=1),
        Column("mean", "Mean", fmt=fmt_float, justify="right"),
    ]


class RunTool(Tool):
    name = "run"
    help = "run an ONNX file in ONNX Runtime, exposing tensors or module taps in memory"
    examples = (
        "layertap run r18.onnx --input 5x3x224x224 --tap layer2.0.relu#1 -o acts.npz  # any batch size",
        "layertap run resnet18.onnx --tap layer3.1 --input 1x3x224x224 -o acts.npz",
        "layertap run r18.pte -o acts.npz  # an ExecuTorch program: its outputs and the taps it was exported with",
    )
    output = OutputArgs(required=False, suffixes=(".npz", ".safetensors"), help="FILE.npz")
    groups = (InputArgs(), TapArgs(selectors=False), output, JsonArgs(), RuntimeArgs())

    def add_own_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("onnx", metavar="FILE.onnx", help="the ONNX file (or OpenVINO IR, or ExecuTorch program .pte) "
                                                              "to run (never modified)")

    def parse_own(self, ns: argparse.Namespace, args: Args) -> str:
        args.reads = (ns.onnx,)
        return ns.onnx

    def run(self, args: Args) -> int:
        from ...files.arrays import save_arrays
        from ...runtimes.runner import flatten_sequences

        inputs = _inputs(args.inputs.specs)
        notes: list[str] = []  # said once the run succeeded: an error names generated inputs itself
        values = flatten_sequences(run(args.own, inputs, taps=args.tap_texts, seed=args.inputs.seed, notify=notes.append,
                                       **args.runtime.one_file()), notes.append)
        if args.output:
            save_arrays(args.output, values, notify=notes.append)
        for note in notes:
            self.say(note)
        table = RunTable([_row(k, v) for k, v in values.items()])
        ran = args.runtime.runtime or runtime_for(args.own)
        if ran not in (None, "ort"):
            table.__dict__["title"] = f"{plugin(ran).title} outputs"
        self.print_table(table, as_json=args.json)
        if args.output and not args.json:
            self.say(f"wrote {args.output}")
        return 0


def _inputs(specs) -> Any:
    """The specs themselves: lt.run makes their data knowing the model (scalars, embedding sizes)."""
    if not specs:
        return None
    if specs[0].name is not None:
        return {s.name: s for s in specs}
    return list(specs)


def _row(name: str, v) -> ValueRow:
    import numpy as np

    v = np.asarray(v)
    numeric = v.size and (np.issubdtype(v.dtype, np.number) or v.dtype == np.bool_)
    if not numeric:
        return ValueRow(name, list(v.shape), v.dtype.name, None, None, None)
    f = v.astype(np.float64)
    return ValueRow(name, list(v.shape), v.dtype.name, float(f.min()), float(f.max()), float(f.mean()))
