"""``layertap extract MODEL --tap ... -o FILE``: save tapped tensors to .npz/.safetensors.

With ``--data PATH`` it runs over a whole dataset into ``-o OUT_DIR`` (see ``extract_dataset``)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from ...errors import LayertapError
from ...tables import Column, Table
from ...text import fmt_shape
from ..args import Args, DatasetArgs, InputArgs, ModelArgs, OutputArgs, ReportArgs, RuntimeArgs, TapArgs
from ..console import status
from .base import Tool, running
from .extract_dataset import run_dataset


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
    examples = (
        "layertap extract torchvision:resnet18 --tap layer4.0.conv1 --tap layer2.0.relu#1 -o acts.npz",
        "layertap extract torchvision:resnet18 --tap layer4 --data images -o feats --pool mean  # a whole dataset",
        "layertap extract r18.onnx --tap layer3 --data images -o onnx-feats --pool max --format zarr --limit 12",
    )
    output = OutputArgs(
        required=True, suffixes=(".npz", ".safetensors"), help="FILE.npz or FILE.safetensors"
        " (keys are the tap names); with --data: OUT_DIR", when=lambda ns: ns.data is None,
    )
    # over a dataset the library checks taps and OUT_DIR itself (an ONNX file's taps may be tensor names)
    groups = (ModelArgs(onnx_ok=True), TapArgs(required=True, selectors=lambda ns: ns.data is None), InputArgs(), output,
              ReportArgs(), DatasetArgs(), RuntimeArgs())

    def add_own_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--stop-early", action="store_true", help="stop the forward once every tap is captured (no 'output' then)")

    def parse_own(self, ns: argparse.Namespace, args: Args) -> bool:
        """``--stop-early``; with ``--data``, -o must name OUT_DIR."""
        if ns.data is None and (ns.runtime or ns.ov_precision or ns.ov_device):
            raise LayertapError("--runtime, --ov-precision and --ov-device apply to an .onnx MODEL with --data; "
                                "to run an ONNX file once use: layertap run FILE.onnx --runtime openvino")
        if ns.data is not None:
            args.reads = (ns.data,)
            if not ns.output:
                raise LayertapError("--data needs -o OUT_DIR (a new or empty folder, or one to --resume)")
        return bool(ns.stop_early)

    def run(self, args: Args) -> int:
        if args.dataset is not None:
            return run_dataset(args)
        from ...files.arrays import save_arrays
        from ...pytorch.taps import extract

        out, method = Path(args.output or ""), args.model.method
        model, info, sample_args, kwargs = args.model.load_with_inputs(args.inputs)
        with running(info, method, sample_args, kwargs):
            values = extract(model, *sample_args, taps=args.taps, method=method, stop_early=args.own, **kwargs)
        arrays, notes = to_numpy(values)
        with status(f"writing {out}"):
            save_arrays(out, arrays, notify=notes.append)
        self.print_saved(arrays, notes)
        # plain write: rich would wrap a long path when stderr is a pipe
        sys.stderr.write(f"wrote {len(arrays)} array(s) to {out}\n")
        if args.report:
            from ...reports import tensors_page

            summary = [("model", args.model.text), ("inputs", ReportArgs.inputs_text(sample_args, kwargs)),
                       ("tapped tensors", len(arrays)), ("saved to", str(out))]
            ReportArgs.write(args, tensors_page(f"extract from {args.model.text}", arrays, summary=summary, notes=notes))
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
