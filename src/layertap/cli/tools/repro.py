"""``layertap repro REF CAND -o DIR``: a minimal package that reproduces one module's mismatch.
With an ONNX reference nothing imports torch."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from ...errors import LayertapError, OnnxFileError
from ...options import SampleOptions
from ..args import Args, InputArgs, ModelArgs, ToleranceArgs, is_onnx_path
from ..console import StepProgress
from .base import Tool
from .compare import CompareOptions, sides


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
              ToleranceArgs("repro.py exits 1 while max|cand-ref| > atol + rtol*max|ref|"))

    def add_own_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("onnx", metavar="CAND.onnx", help="the candidate file (never modified)")
        g = parser.add_argument_group("repro")
        g.add_argument("-o", "--out", required=True, metavar="DIR",
                       help="the package folder: new, empty, or a previous repro package (replaced)")
        g.add_argument("--module", default=None, metavar="PATH[#CALL]",
                       help="the module call to package, e.g. layer3.1 or act#1 (its second call); in files "
                            "without module scopes (paddle2onnx, tf2onnx) a tensor name, or the node that makes it; "
                            "default: the first divergence")
        g.add_argument("--inputs", metavar="PATH",
                       help="samples: a folder of .npy/.npz files or one .npz; the one where the call's error "
                            "is worst is packaged")

    def parse_own(self, ns: argparse.Namespace, args: Args) -> CompareOptions:
        ref_onnx = is_onnx_path(ns.model)
        for path, onnx_file in ((ns.onnx, True), (ns.model, ref_onnx)):
            if onnx_file and not Path(path).is_file():
                raise OnnxFileError(f"ONNX file '{path}' does not exist")
        args.reads = (ns.onnx, ns.model) if ref_onnx else (ns.onnx,)
        return CompareOptions(ns.onnx, ns.inputs, None, {"out": Path(ns.out)}, None, {"module": ns.module})

    def run(self, args: Args) -> int:
        opts: CompareOptions = args.own
        cand, ref, sample_args, kwargs, samples = sides(args, opts)
        if opts.inputs is not None:  # every sample of --inputs, read as compare reads them
            from ...comparing.api import reference_samples

            sampling = SampleOptions(inputs=opts.inputs, preprocess=opts.sampling.preprocess)
            ref, cand, _, samples = reference_samples(ref, cand, args.model.is_onnx, None, sampling)
        if samples is not None:
            samples = _given(samples)
        from ...reproducing.repro import repro

        with StepProgress(enabled=sys.stderr.isatty()) as progress:
            report = repro(ref, sample_args, cand, out=opts.outputs["out"], module=opts.library["module"],
                           kwargs=kwargs, method=args.model.method, rtol=args.tolerance.rtol, atol=args.tolerance.atol,
                           command=_command(args), progress=progress, samples=samples)
        for line in report.lines():
            print(line)
        return 0 if report.reproduced else 1


def _given(samples: Any) -> list:
    """The samples of ``--inputs``: all are compared, the worst one for the call is packaged."""
    if isinstance(samples, int):
        raise LayertapError("repro packages one sample; pass it with --input or --inputs")
    return list(samples)


def _command(args: Args) -> str:
    """The command line as the README shows it."""
    return shlex.join(["layertap", *args.argv]) if args.argv else "layertap repro"
