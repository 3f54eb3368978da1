"""``layertap compare REF CAND``: a reference (MODEL spec or FILE.onnx) vs an ONNX candidate,
module by module. With an ONNX reference nothing imports torch."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ...errors import LayertapError, OnnxFileError
from ..args import InputArgs, JsonArgs, ModelArgs, ReportArgs, ToleranceArgs, positive_int
from ..console import StepProgress
from .base import Tool


class CompareTool(Tool):
    """Exit 0 when every compared module agrees, 1 on a divergence, 2 on bad input."""

    name = "compare"
    help = "compare a model or ONNX file with an ONNX file layer by layer and name the first diverging module"
    groups = (ModelArgs(onnx_ok=True), InputArgs(), ToleranceArgs(), JsonArgs(), ReportArgs())

    def add_own_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("onnx", metavar="CAND.onnx",
                            help="the candidate file: an export, a float16/int8 conversion, an optimised copy, or REF "
                                 "itself run another way (never modified)")
        g = parser.add_argument_group("comparison")
        g.add_argument("--module", action="append", default=None, metavar="PATH",
                       help="compare only this module and its submodules (repeatable)")
        g.add_argument("--inputs", metavar="PATH",
                       help="samples: a folder of .npy/.npz files (one sample each) or one .npz (one sample per leading index)")
        g.add_argument("--samples", type=positive_int, default=None, metavar="N",
                       help="N seeded random samples from the input specs; rows show each module's worst sample")
        g.add_argument("--metric", choices=("rel", "cosine", "sqnr"), default="rel",
                       help="what decides pass/fail: rel (--rtol/--atol, default), cosine (--min-cosine), sqnr (--min-sqnr)")
        g.add_argument("--min-cosine", type=float, default=None, metavar="C",
                       help="with --metric cosine: pass when cosine similarity >= C (default 0.999)")
        g.add_argument("--min-sqnr", type=float, default=None, metavar="DB",
                       help="with --metric sqnr: pass when SQNR >= DB decibels (default 30)")
        g.add_argument("--check-finite", action="store_true",
                       help="fail any module whose candidate values hold NaN/inf, and name the first one")
        g.add_argument("--local", action="store_true",
                       help="also run each module's candidate nodes on the reference's own inputs (local_rel: the "
                            "error the module makes by itself)")
        g.add_argument("--allow-different-weights", action="store_true",
                       help="compare even when most parameters differ from the reference's (another checkpoint or "
                            "seed); without it that is refused")
        g.add_argument("--fp16-block-list", metavar="FILE.json",
                       help="write the ONNX node names that should stay float32, for "
                            "onnxconverter_common.float16.convert_float_to_float16(node_block_list=...)")
        g.add_argument("--providers", metavar="EP[,EP]", default=None,
                       help="ONNX Runtime execution providers of an ONNX reference (CUDA, TensorRT, OpenVINO, CoreML; default CPU)")
        g.add_argument("--cand-providers", metavar="EP[,EP]", default=None,
                       help="execution providers of the candidate (default CPU)")
        g.add_argument("--no-ort-opt", action="store_true",
                       help="run the candidate with ORT graph optimisations disabled (exposed outputs can change its fusions)")
        g.add_argument("--ref-no-ort-opt", action="store_true",
                       help="run an ONNX reference with ORT graph optimisations disabled")
        g.add_argument("--memory-budget", type=positive_int, default=1024, metavar="MB",
                       help="MB of intermediates held at once on each side; PyTorch values beyond it spill to a "
                            "temporary folder and ONNX Runtime runs in more, smaller batches (default 1024)")
        g.add_argument("--batch-outputs", type=positive_int, default=None, metavar="N",
                       help="expose at most N ONNX tensors per ONNX Runtime run (default: as memory allows)")
        g.add_argument("--plot", metavar="FILE.png", help="write a PNG of the error per module (log scale)")
        g.add_argument("--node-data", metavar="FILE.json",
                       help="write Model Explorer node data keyed by the ONNX file's node names: the error in FILE.json, "
                            "status in FILE.status.json, module path in FILE.module.json")

    def run(self, ns: argparse.Namespace) -> int:
        # Cheap checks first: a typo in a path should not cost a model load.
        _check_order(ns.model, ns.onnx)
        onnx_path = Path(ns.onnx)
        if not onnx_path.is_file():
            raise OnnxFileError(f"ONNX file '{onnx_path}' does not exist")
        onnx_ref = ns.model.lower().endswith(".onnx")
        if onnx_ref and not Path(ns.model).is_file():
            raise OnnxFileError(f"ONNX file '{ns.model}' does not exist")
        if ns.inputs is not None and ns.samples is not None:
            raise LayertapError("give --inputs or --samples, not both")
        outputs = _check_outputs(ns, onnx_path)
        options = _options(ns)
        if onnx_ref:
            ref: Any = ns.model
            args, kwargs, samples = _onnx_inputs(ns, Path(ns.model))
        else:
            ref, args, kwargs, samples = _torch_inputs(ns, onnx_path)

        from ...comparing import compare

        with StepProgress(enabled=sys.stderr.isatty()) as progress:
            report = compare(ref, args, onnx_path, samples=samples, kwargs=kwargs, progress=progress, **options)
        _write_outputs(ns, report, outputs)
        self.print_table(report, as_json=ns.json)
        if not ns.json:
            for path in outputs.values():
                self.say(f"wrote {path}")
        self.write_visuals(ns, report)
        return 0 if report.ok else 1

    @staticmethod
    def write_visuals(ns: argparse.Namespace, report: Any) -> None:
        """``--report`` and ``--node-data``, once the numbers are in."""
        if ns.report:
            from ...reports import report_page

            summary = [("reference", ns.model), ("candidate", ns.onnx)]
            ReportArgs.write(ns, report_page(report, f"compare {ns.model} vs {Path(ns.onnx).name}", summary=summary))
        if ns.node_data:
            from ...reports.nodedata import write_node_data

            written = write_node_data(report, ns.onnx, ns.node_data)
            sys.stderr.write(f"wrote Model Explorer node data {', '.join(map(str, written))}\n")


def _check_outputs(ns: argparse.Namespace, onnx_path: Path) -> dict[str, Path]:
    from ...files.writes import check_output_path

    inputs = (ns.onnx, ns.model) if ns.model.lower().endswith(".onnx") else (ns.onnx,)
    ReportArgs.check(ns, inputs=inputs)
    if ns.node_data is not None:
        from ...reports.nodedata import check_node_data_path

        check_node_data_path(ns.node_data, inputs=inputs)
    out = {}
    if ns.plot is not None:
        out["plot"] = check_output_path(ns.plot, inputs=inputs, suffixes=(".png",))
    if ns.fp16_block_list is not None:
        out["fp16"] = check_output_path(ns.fp16_block_list, inputs=inputs, suffixes=(".json",))
    return out


def _write_outputs(ns: argparse.Namespace, report: Any, outputs: dict[str, Path]) -> None:
    if "plot" in outputs:
        report.plot(outputs["plot"])
    if "fp16" in outputs:
        from ...comparing.fp16 import write_block_list

        write_block_list(report, ns.model if ns.model.lower().endswith(".onnx") else None, ns.onnx, outputs["fp16"])


def _options(ns: argparse.Namespace) -> dict[str, Any]:
    from ...metrics import DEFAULT_MIN_COSINE, DEFAULT_MIN_SQNR_DB

    return dict(
        method=getattr(ns, "method", "forward"),
        rtol=ns.rtol,
        atol=ns.atol,
        metric=ns.metric,
        min_cosine=DEFAULT_MIN_COSINE if ns.min_cosine is None else ns.min_cosine,
        min_sqnr_db=DEFAULT_MIN_SQNR_DB if ns.min_sqnr is None else ns.min_sqnr,
        check_finite=ns.check_finite,
        local=ns.local,
        modules=ns.module,
        providers=ns.providers,
        cand_providers=ns.cand_providers,
        ort_optimizations=not ns.no_ort_opt,
        ref_ort_optimizations=not ns.ref_no_ort_opt,
        batch_outputs=ns.batch_outputs,
        memory_budget=ns.memory_budget << 20,
        seed=ns.seed,
        allow_different_weights=ns.allow_different_weights,
    )


def _declared(path: Path) -> tuple[list[str], list[int | None]]:
    """Input names and ranks of an ONNX file (graph only)."""
    from ...onnxfile.modelfile import read_model

    model = read_model(path).model
    inits = {i.name for i in model.graph.initializer}
    names, ranks = [], []
    for i in model.graph.input:
        if i.name in inits:
            continue
        names.append(i.name)
        tt = i.type.tensor_type
        ranks.append(len(tt.shape.dim) if tt.HasField("shape") else None)
    return names, ranks


def _onnx_inputs(ns: argparse.Namespace, ref_path: Path) -> tuple[Any, dict, Any]:
    """``(args, kwargs, samples)`` for an ONNX reference: --inputs, --input specs, or random from its shapes."""
    import numpy as np

    if ns.inputs is not None:
        from ...comparing.samples import load_samples

        return None, {}, load_samples(ns.inputs, *_declared(ref_path))
    specs = InputArgs.specs(ns)
    if not specs:
        return None, {}, ns.samples
    draws = []
    for i in range(ns.samples or 1):
        rng = np.random.default_rng(ns.seed + i)
        arrays = [s.array(rng) for s in specs]
        draws.append({s.name: a for s, a in zip(specs, arrays)} if specs[0].name is not None else arrays)
    return None, {}, draws


def _torch_inputs(ns: argparse.Namespace, cand: Path) -> tuple[Any, Any, dict, Any]:
    """``(model, args, kwargs, samples)`` for a PyTorch reference."""
    model, info, args, kwargs = ModelArgs.load_with_inputs(ns)  # parses --input first
    if ns.inputs is not None:
        import torch

        from ...comparing.samples import load_samples

        names, ranks = _declared(cand)
        loaded = load_samples(ns.inputs, names, ranks)
        tensors = [tuple(torch.from_numpy(np_array(s, n)) for n in names) for s in loaded]
        return model, None, {}, tensors
    if ns.samples is not None and ns.samples > 1:
        from ...pytorch.example_inputs import make_inputs

        specs = InputArgs.specs(ns)
        drawn: list[tuple[Any, Any]] = [(args, kwargs)]
        drawn += [make_inputs(info, specs, model=model, method=ns.method, seed=ns.seed + i) for i in range(1, ns.samples)]
        return model, None, {}, [_as_sample(a, k) for a, k in drawn]
    return model, args, kwargs, None


def np_array(sample: Any, name: str) -> Any:
    import numpy as np

    return np.ascontiguousarray(sample[name])


def _as_sample(args: tuple, kwargs: dict) -> Any:
    """A sample for ``compare``: positional args, or a dict when the model takes keywords."""
    if kwargs and not args:
        return dict(kwargs)
    if kwargs:
        raise LayertapError("--samples with both positional and named inputs: name every --input, or none")
    return tuple(args)


def _check_order(ref: str, cand: str) -> None:
    """``compare r18.onnx torchvision:resnet18``: the candidate must be the ONNX file, second."""
    if ref.lower().endswith(".onnx") and not cand.lower().endswith(".onnx"):
        raise LayertapError(
            f"the arguments look swapped: CAND {cand!r} is not an ONNX file but REF {ref!r} is; "
            f"the reference comes first, the candidate .onnx second: layertap compare {cand} {ref}"
        )
