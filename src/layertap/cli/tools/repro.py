"""``layertap repro REF CAND -o DIR``: a minimal package that reproduces one module's mismatch.
With an ONNX reference nothing imports torch."""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from ...errors import OnnxFileError
from ...options import reporting
from ..args import Args, InputArgs, ModelArgs, SampleArgs, ToleranceArgs, is_onnx_path
from ..console import StepProgress
from .base import Tool
from .compare import reference


@dataclass(frozen=True)
class ReproOptions:
    """``repro``'s own options, checked (the samples are ``args.sampling``)."""

    cand: str
    out: Path
    module: str | None


class ReproTool(Tool):
    """Exit 0 when the package reproduces the mismatch, 1 when it does not (kept, marked), 2 on bad input."""

    name = "repro"
    help = "write a minimal package that reproduces one module call's mismatch"
    description = ("write a minimal package that reproduces one module call's mismatch (the first divergence, or "
                   "--module): that call's nodes of each file, the tensors entering it, the reference's output, and "
                   "repro.py (numpy, onnx and onnxruntime only). Exit 0: it reproduces; 1: the call alone does not "
                   "(the package is kept, marked); 2: bad input")
    examples = (
        "layertap repro resnet18.onnx resnet18-fp16.onnx -o r18-repro --module layer3.1 --rtol 1e-4",
        "layertap repro torchvision:resnet18 r18-int8.onnx -o repro  # the first divergence, PyTorch vs the file",
        "layertap repro m.onnx m-fp16.onnx -o pkg --inputs samples.npz  # packages the sample where the call is worst",
    )
    groups = (ModelArgs(onnx_ok=True), InputArgs(),
              ToleranceArgs("repro.py exits 1 while max|cand-ref| > atol + rtol*max|ref|"),
              SampleArgs(inputs_help="samples: a folder of .npy/.npz files or one .npz; the one where the call's "
                                     "error is worst is packaged"))

    def add_own_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("onnx", metavar="CAND.onnx", help="the candidate file (never modified)")
        g = parser.add_argument_group("repro")
        g.add_argument("-o", "--out", required=True, metavar="DIR",
                       help="the package folder: new, empty, or a previous repro package (replaced)")
        g.add_argument("--module", default=None, metavar="PATH[#CALL]",
                       help="the module call to package, e.g. layer3.1 or act#1 (its second call); in files "
                            "without module scopes (paddle2onnx, tf2onnx) a tensor name, or the node that makes it; "
                            "default: the first divergence")

    def parse_own(self, ns: argparse.Namespace, args: Args) -> ReproOptions:
        ref_onnx = is_onnx_path(ns.model)
        for path, onnx_file in ((ns.onnx, True), (ns.model, ref_onnx)):
            if onnx_file and not Path(path).is_file():
                raise OnnxFileError(f"ONNX file '{path}' does not exist")
        args.reads = (ns.onnx, ns.model) if ref_onnx else (ns.onnx,)
        return ReproOptions(ns.onnx, Path(ns.out), ns.module)

    def run(self, args: Args) -> int:
        opts: ReproOptions = args.own
        from ...reproducing.repro import repro

        with StepProgress(enabled=sys.stderr.isatty()) as progress, reporting(progress):
            report = repro(reference(args), args.inputs.specs or None, opts.cand, out=opts.out, module=opts.module,
                           command=_command(args), sample_options=args.sampling, **args.tolerance.chosen())
        for line in report.lines():
            print(line)
        return 0 if report.reproduced else 1


def _command(args: Args) -> str:
    """The command line as the README shows it."""
    return shlex.join(["layertap", *args.argv]) if args.argv else "layertap repro"
