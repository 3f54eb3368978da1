"""``layertap extract MODEL --tap ... -o FILE``: save tapped tensors to .npz/.safetensors.

With ``--data PATH`` it runs over a whole dataset into ``-o OUT_DIR`` (see ``extract_dataset``)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from ...formats import fmt_shape
from ...tables import Column, Table
from ..args import InputArgs, ModelArgs, OutputArgs, ReportArgs, TapArgs
from ..console import status
from .base import Tool, running
from .extract_dataset import DatasetArgs, run_dataset


def to_numpy(tensors: dict) -> tuple[dict, list[str]]:
    """name -> ndarray; dtypes numpy lacks (bfloat16) become float32, with a note."""
    import torch

    from ...pytorch.values import tensor_to_numpy

    arrays, notes = {}, []
    for name, t in tensors.items():
        if t.dtype == torch.bfloat16:
            notes.append(f"{name}: bfloat16 saved as float32")
        arrays[name] = tensor_to_numpy(t)
    return arrays, notes


class ExtractTool(Tool):
    name = "extract"
    help = "run a model once (or over a dataset with --data) and save the tapped tensors"
    output = OutputArgs(
        required=True, suffixes=(".npz", ".safetensors"), help="FILE.npz or FILE.safetensors"
        " (keys are the tap names); with --data: OUT_DIR",
    )
    groups = (ModelArgs(onnx_ok=True), TapArgs(required=True), InputArgs(), output, ReportArgs(), DatasetArgs())

    def add_own_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--stop-early", action="store_true", help="stop the forward once every tap is captured (no 'output' then)")

    def run(self, ns: argparse.Namespace) -> int:
        if ns.data is not None:
            return run_dataset(ns)
        taps = TapArgs.taps(ns)  # cheap checks first: nothing is built for a typo
        out = self.output.check(ns)
        ReportArgs.check(ns, inputs=(out,))
        from ...files.arrays import save_arrays
        from ...pytorch.taps import extract

        model, info, args, kwargs = ModelArgs.load_with_inputs(ns)
        with running(info, ns.method, args, kwargs):
            values = extract(model, *args, taps=taps, method=ns.method, stop_early=ns.stop_early, **kwargs)
        arrays, notes = to_numpy(values)
        with status(f"writing {out}"):
            save_arrays(out, arrays, notify=notes.append)
        self.print_saved(arrays, notes)
        # plain write: rich would wrap a long path when stderr is a pipe
        sys.stderr.write(f"wrote {len(arrays)} array(s) to {out}\n")
        if ns.report:
            from ...reports import tensors_page

            summary = [("model", ns.model), ("inputs", ReportArgs.inputs_text(args, kwargs)), ("tapped tensors", len(arrays)),
                       ("saved to", str(out))]
            ReportArgs.write(ns, tensors_page(f"extract from {ns.model}", arrays, summary=summary, notes=notes))
        return 0

    def print_saved(self, arrays: dict, notes: list[str]) -> None:
        """What was saved: one line per array (name, shape, dtype) on stdout."""
        rows = [SavedRow(name, list(a.shape), str(a.dtype)) for name, a in arrays.items()]
        self.print_table(SavedTable(rows, notes=notes))


@dataclass(frozen=True)
class SavedRow:
    name: str
    shape: list[int]
    dtype: str


class SavedTable(Table):
    """The arrays ``extract`` wrote: key, shape, dtype."""

    title = "Saved"
    columns = [
        Column("name", "Name", name=True),
        Column("shape", "Shape", fmt_shape, no_wrap=True),
        Column("dtype", "Dtype"),
    ]
