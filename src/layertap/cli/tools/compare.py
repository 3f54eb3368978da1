"""``layertap compare REF CAND``: a reference (MODEL spec or FILE.onnx) vs an ONNX candidate,
module by module. With an ONNX reference nothing imports torch."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ...errors import LayertapError, OnnxFileError, printable
from ...options import SampleOptions
from ...runtimes import is_ir
from ..args import (
    Args,
    InputArgs,
    JsonArgs,
    ModelArgs,
    ReportArgs,
    RuntimeArgs,
    ToleranceArgs,
    add_sample_options,
    is_onnx_path,
    positive_int,
)
from ..console import StepProgress
from .base import Tool


@dataclass
class CompareOptions:
    """``compare``'s own options, checked: the candidate, the samples, the extra outputs, and the
    library's keyword options (whether REF is an ONNX file is ``args.model.is_onnx``)."""

    cand: str
    inputs: str | None  # --inputs: a samples folder or .npz
    samples: int | None
    outputs: dict[str, Path]  # "plot", "fp16", "inputs" (--save-inputs): checked paths
    node_data: str | None
    library: dict[str, Any]  # compare()'s keyword options (the rule, modules, memory)
    sampling: SampleOptions = field(default_factory=SampleOptions)  # --inputs, --limit, ..., --save-inputs


class CompareTool(Tool):
    """Exit 0 when every compared module agrees, 1 on a divergence, 2 on bad input."""

    name = "compare"
    help = "compare a model or ONNX file with an ONNX file layer by layer and name the first diverging module"
    examples = (
        "layertap compare torchvision:resnet18 r18.onnx --input 1x3x224x224",
        "layertap compare torchvision:resnet18 r18.onnx --inputs images --limit 8 --save-inputs used.npz"
        "  # real images, preprocessed as the model's weights say; --inputs used.npz repeats it",
        "layertap compare resnet18.onnx resnet18.onnx --no-ort-opt --samples 2  # ORT with vs without graph optimisations",
    )
    groups = (ModelArgs(onnx_ok=True), InputArgs(), ToleranceArgs(), JsonArgs(), ReportArgs(), RuntimeArgs(cand=True))

    def add_own_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("onnx", metavar="CAND.onnx",
                            help="the candidate file: an export, a float16/int8 conversion, an optimised copy, or REF "
                                 "itself run another way (never modified)")
        g = parser.add_argument_group("comparison")
        g.add_argument("--module", action="append", default=None, metavar="PATH",
                       help="compare only this module and its submodules (repeatable)")
        g.add_argument("--inputs", metavar="PATH",
                       help="samples: any folder extract --data reads (images preprocessed as the model's config says, "
                            ".npy/.npz files, a datasets folder) or one .npz (one sample per leading index)")
        g.add_argument("--limit", type=positive_int, metavar="N", help="with --inputs: only the first N samples")
        g.add_argument("--save-inputs", metavar="FILE.npz",
                       help="write the samples compared to FILE.npz, an array per input named after it: samples of "
                            "batch 1 joined on the batch axis (4 samples of 1x3x224x224: 4x3x224x224, one per row), "
                            "others stacked (4 samples of 2x7: 4x2x7); --inputs FILE.npz repeats the comparison exactly")
        add_sample_options(g)
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
                       help="write the ONNX node names that should stay float32, for onnxconverter_common's "
                            "float16 converter (convert_float_to_float16's node_block_list)")
        g.add_argument("--memory-budget", type=positive_int, default=1024, metavar="MB",
                       help="MB of intermediates held at once on each side; PyTorch values beyond it spill to a "
                            "temporary folder and ONNX Runtime runs in more, smaller batches (default 1024)")
        g.add_argument("--batch-outputs", type=positive_int, default=None, metavar="N",
                       help="expose at most N ONNX tensors per ONNX Runtime run (default: as memory allows)")
        g.add_argument("--steps", type=int, default=None, metavar="N",
                       help="decoder files with a KV cache: the prompt, then N greedy decode steps on both sides (the "
                            "reference's tokens, each side its own cache); rows per module and token, a layer x token grid")
        g.add_argument("--plot", metavar="FILE.png", help="write a PNG of the error per module (log scale)")
        g.add_argument("--node-data", metavar="FILE.json",
                       help="write Model Explorer node data keyed by the ONNX file's node names: the error in FILE.json, "
                            "status in FILE.status.json, module path in FILE.module.json")

    def parse_own(self, ns: argparse.Namespace, args: Args) -> CompareOptions:
        # Cheap checks first: a typo in a path should not cost a model load.
        ref_onnx = is_onnx_path(ns.model)
        _check_order(ns.model, ns.onnx, ref_onnx)
        if not Path(ns.onnx).is_file():
            raise OnnxFileError(f"ONNX file '{ns.onnx}' does not exist")
        if ref_onnx and not Path(ns.model).is_file():
            raise OnnxFileError(f"ONNX file '{ns.model}' does not exist")
        if ns.inputs is not None and ns.samples is not None:
            raise LayertapError("give --inputs or --samples, not both")
        for flag, value in (("--limit", ns.limit), ("--columns", ns.columns), ("--image-size", ns.image_size)):
            if value is not None and ns.inputs is None:
                raise LayertapError(f"{flag} applies to the samples of --inputs PATH; give --inputs too")
        args.reads = (ns.onnx, ns.model) if ref_onnx else (ns.onnx,)
        outputs = _check_outputs(ns, args.reads)
        sampling = SampleOptions(inputs=ns.inputs, limit=ns.limit, columns=ns.columns, image_size=ns.image_size,
                                 mean=ns.mean, std=ns.std, save_inputs=ns.save_inputs, seed=ns.seed)
        return CompareOptions(ns.onnx, ns.inputs, ns.samples, outputs, ns.node_data, _options(ns), sampling)

    def run(self, args: Args) -> int:
        opts: CompareOptions = args.own
        cand, ref, sample_args, kwargs, samples = sides(args, opts)
        tol = args.tolerance  # not given: compare may fit rtol to a side's reduced precision

        from ...comparing import compare

        sampling, used = _keeping_inputs(opts)
        try:
            with StepProgress(enabled=sys.stderr.isatty()) as progress:
                report = compare(ref, sample_args, cand, samples=samples, kwargs=kwargs, progress=progress,
                                 method=args.model.method, rtol=tol.rtol if tol.given else None,
                                 atol=tol.atol if tol.given else None, runtime_options=args.runtime,
                                 sample_options=sampling, **opts.library)
            _write_outputs(args, report, cand)
            self.print_table(report, as_json=args.json)
            if "fp16" in opts.outputs:
                given = (sample_args, samples) if used is None else (None, used.load(ref, cand, args.model.is_onnx))
                _block_list(args, report, cand, ref, given)
        finally:
            if used is not None:
                used.close()
        if not args.json:
            for path in opts.outputs.values():
                self.say(f"wrote {path}")
        self.write_visuals(args, report, cand)
        return 0 if report.ok else 1

    @staticmethod
    def write_visuals(args: Args, report: Any, cand: Any) -> None:
        """``--report`` and ``--node-data``, once the numbers are in (``cand``: the candidate file read)."""
        opts: CompareOptions = args.own
        if args.report:
            from ...reports import report_page

            summary = [("reference", args.model.text), ("candidate", opts.cand)]
            ReportArgs.write(args, report_page(report, f"compare {args.model.text} vs {Path(opts.cand).name}", summary=summary))
        if opts.node_data:
            from ...reports.nodedata import write_node_data

            written = write_node_data(report, cand, opts.node_data)
            sys.stderr.write(f"wrote Model Explorer node data {', '.join(map(str, written))}\n")


def sides(args: Args, opts: CompareOptions) -> tuple[Any, Any, Any, dict, Any]:
    """``(candidate file, reference, args, kwargs, samples)`` for ``compare`` (and ``repro``): each ONNX
    file read once, a PyTorch REF loaded first, the samples from ``--inputs``, ``--input`` or ``--samples``."""
    cand = _Candidate(opts.cand)
    if args.model.is_onnx:
        ref: Any = _read(args.model.text)
        sample_args, kwargs, samples = _onnx_inputs(args, opts, ref)
    else:
        ref, sample_args, kwargs, samples = _torch_inputs(args, opts, cand)
    return cand.file(), ref, sample_args, kwargs, samples


class _Candidate:
    """The candidate file, read once, when first needed (after the model loaded: a model error comes first)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file: Any = None

    def file(self) -> Any:
        if self._file is None:
            self._file = _read(self.path)
        return self._file


def _read(path: str) -> Any:
    """An ONNX file read once (graph only); an OpenVINO IR stays a path, for OpenVINO to read."""
    from ...onnxfile.modelfile import read_model

    return path if is_ir(path) else read_model(path)


def _check_outputs(ns: argparse.Namespace, inputs: tuple[str, ...]) -> dict[str, Path]:
    from ...files.writes import check_output_path

    if ns.node_data is not None:
        from ...reports.nodedata import check_node_data_path

        check_node_data_path(ns.node_data, inputs=inputs)
    out = {}
    if ns.plot is not None:
        out["plot"] = check_output_path(ns.plot, inputs=inputs, suffixes=(".png",))
    if ns.fp16_block_list is not None:
        out["fp16"] = check_output_path(ns.fp16_block_list, inputs=inputs, suffixes=(".json",))
    if ns.save_inputs is not None:
        out["inputs"] = check_output_path(ns.save_inputs, inputs=inputs + ((ns.inputs,) if ns.inputs else ()), suffixes=(".npz",))
    return out


def _write_outputs(args: Args, report: Any, cand: Any) -> None:
    opts: CompareOptions = args.own
    if "plot" in opts.outputs:
        report.plot(opts.outputs["plot"])


class _UsedInputs:
    """The samples ``--inputs`` fed to the comparison, kept (in a temporary ``.npz`` unless
    ``--save-inputs`` names one) so that ``--fp16-block-list`` judges its conversions on the same values."""

    def __init__(self, saved: str | None) -> None:
        import tempfile

        self.folder = None if saved is not None else tempfile.mkdtemp(prefix="layertap-inputs-")
        self.path = saved if saved is not None else str(Path(self.folder or ".") / "inputs.npz")

    def load(self, ref: Any, cand: Any, onnx_ref: bool) -> list[Any]:
        """The samples as compare's ``inputs=`` reads them (dicts by input name for an ONNX
        reference, else arguments in the candidate's input order)."""
        from ...comparing.api import reference_samples

        return list(reference_samples(ref, cand, onnx_ref, None, SampleOptions(inputs=self.path))[3])

    def close(self) -> None:
        if self.folder is not None:
            import shutil

            shutil.rmtree(self.folder, ignore_errors=True)


def _keeping_inputs(opts: CompareOptions) -> tuple[SampleOptions, _UsedInputs | None]:
    """The sample options, with the samples read from ``--inputs`` kept when ``--fp16-block-list`` needs them."""
    sampling = opts.sampling
    if "fp16" not in opts.outputs or sampling.inputs is None:
        return sampling, None
    used = _UsedInputs(None if sampling.save_inputs is None else str(sampling.save_inputs))
    return replace(sampling, save_inputs=used.path), used


def _block_list(args: Args, report: Any, cand: Any, ref: Any, samples: tuple[Any, Any]) -> None:
    """--fp16-block-list: the first step of ``fix --to fp16`` (ranked by this comparison), so the list
    written is one a float16 conversion was verified with; says when no list meets the target."""
    from ...fixing.configs import Target
    from ...fixing.fix import fmt_metric, write_block_list

    lib = args.own.library
    target = {"cosine": Target("cosine", lib["min_cosine"]), "sqnr": Target("sqnr", lib["min_sqnr_db"])}.get(
        lib["metric"], Target("cosine", 0.999))
    path = args.own.outputs["fp16"]
    found = write_block_list(args.model.text if args.model.is_onnx else ref, samples[0], samples[1], report, cand, path,
                             target=target, seed=args.inputs.seed)
    first, best = found.steps[0], found.best
    shown = f"{target.metric} {fmt_metric(first.metric)} -> {fmt_metric(best.metric if best else None)}"
    verdict = (f"a float16 conversion with it meets {target} ({shown})" if found.ok else
               f"no list meets {target} ({len(found.steps)} conversions tried; this is the best found: {shown})")
    for note in found.notes:
        sys.stderr.write(f"note: {printable(note)}\n")
    sys.stderr.write(f"fp16 block list: {len(found.nodes)} nodes ({', '.join(found.kept) or 'none'}): {verdict}; convert "
                     f"with {_options_text()} (the default max_finite_val, 1e4, clamps larger weights)\n")


def _options_text() -> str:
    from ...fixing.convert import FP16_OPTIONS

    return ", ".join(f"{k}={v!r}" for k, v in FP16_OPTIONS.items())


def _options(ns: argparse.Namespace) -> dict[str, Any]:
    """compare()'s keyword options beside its option objects: the rule, modules, memory, decode steps."""
    from ...metrics import DEFAULT_MIN_COSINE, DEFAULT_MIN_SQNR_DB

    return dict(
        metric=ns.metric,
        min_cosine=DEFAULT_MIN_COSINE if ns.min_cosine is None else ns.min_cosine,
        min_sqnr_db=DEFAULT_MIN_SQNR_DB if ns.min_sqnr is None else ns.min_sqnr,
        check_finite=ns.check_finite,
        local=ns.local,
        modules=ns.module,
        batch_outputs=ns.batch_outputs,
        memory_budget=ns.memory_budget << 20,
        allow_different_weights=ns.allow_different_weights,
        **({"steps": ns.steps} if ns.steps is not None else {}),
    )


def _onnx_inputs(args: Args, opts: CompareOptions, ref: Any) -> tuple[Any, dict, Any]:
    """``(args, kwargs, samples)`` for an ONNX reference: --inputs, --input specs, or random from its shapes."""
    from ...inputs import spec_arrays

    if opts.inputs is not None:
        return None, {}, None  # compare reads --inputs (options.library)
    specs = args.inputs.specs
    if not specs:
        return None, {}, opts.samples
    draws = []
    for i in range(opts.samples or 1):
        arrays = spec_arrays(specs, args.inputs.seed + i)
        draws.append({s.name: a for s, a in zip(specs, arrays)} if specs[0].name is not None else arrays)
    return None, {}, draws


def _torch_inputs(args: Args, opts: CompareOptions, cand: _Candidate) -> tuple[Any, Any, dict, Any]:
    """``(model, args, kwargs, samples)`` for a PyTorch reference."""
    if opts.inputs is not None:  # compare reads --inputs, with the zoo's image recipe
        from ...pytorch.preprocessing import zoo_recipe

        spec = args.model.text
        preprocess = zoo_recipe(spec) if spec.startswith("torchvision:") else None  # timm: the module's
        opts.sampling = replace(opts.sampling, preprocess=preprocess)
        from ..console import status

        with status(f"loading {spec}"):
            model, _ = args.model.load()
        return model, None, {}, None
    model, info, first, kwargs = args.model.load_with_inputs(args.inputs)
    if opts.samples is not None and opts.samples > 1:
        from ...pytorch.example_inputs import make_inputs

        seed, method = args.inputs.seed, args.model.method
        drawn: list[tuple[Any, Any]] = [(first, kwargs)]
        drawn += [make_inputs(info, args.inputs.specs, model=model, method=method, seed=seed + i) for i in range(1, opts.samples)]
        return model, None, {}, [_as_sample(a, k) for a, k in drawn]
    return model, first, kwargs, None


def _as_sample(args: tuple, kwargs: dict) -> Any:
    """A sample for ``compare``: positional args, or a dict when the model takes keywords."""
    if kwargs and not args:
        return dict(kwargs)
    if kwargs:
        raise LayertapError("--samples with both positional and named inputs: name every --input, or none")
    return tuple(args)


def _check_order(ref: str, cand: str, ref_onnx: bool) -> None:
    """``compare r18.onnx torchvision:resnet18``: the candidate must be the ONNX file, second."""
    if ref_onnx and not is_onnx_path(cand):
        raise LayertapError(
            f"the arguments look swapped: CAND {cand!r} is not an ONNX file but REF {ref!r} is; "
            f"the reference comes first, the candidate .onnx second: layertap compare {cand} {ref}"
        )
