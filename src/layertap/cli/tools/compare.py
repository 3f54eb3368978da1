"""``layertap compare REF CAND``: a reference (MODEL spec or FILE.onnx) vs an ONNX candidate,
module by module. With an ONNX reference nothing imports torch."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ...errors import LayertapError, OnnxFileError, printable
from ...files.writes import check_output_path
from ...options import Model, SampleOptions, SearchOptions, reporting
from ..args import (
    Args,
    InputArgs,
    JsonArgs,
    ModelArgs,
    ReportArgs,
    RuntimeArgs,
    SampleArgs,
    ToleranceArgs,
    is_onnx_path,
    positive_int,
)
from ..console import StepProgress
from .base import Tool


@dataclass(frozen=True)
class CompareOptions:
    """``compare``'s own options, checked: the candidate, the extra outputs, the modules compared, and the
    option objects with this command's own flags in them (``--allow-different-weights`` in the rule,
    ``--memory-budget``/``--batch-outputs`` in the runtime options, ``--steps`` in the samples)."""

    cand: str | None  # None: the reference made the candidate by --cand-runtime (compiled)
    outputs: dict[str, Path]  # "plot", "fp16", "inputs" (--save-inputs): checked paths
    node_data: str | None
    modules: list[str] | None
    local: bool


class CompareTool(Tool):
    """Exit 0 when every compared module agrees, 1 on a divergence, 2 on bad input."""

    name = "compare"
    help = "compare a model or ONNX file with an ONNX file layer by layer and name the first diverging module"
    examples = (
        "layertap compare torchvision:resnet18 r18.onnx --input 1x3x224x224",
        "layertap compare torchvision:resnet18 r18.onnx --inputs images --limit 8 --save-inputs used.npz"
        "  # real images, preprocessed as the model's weights say; --inputs used.npz repeats it",
        "layertap compare resnet18.onnx resnet18.onnx --no-ort-opt --samples 2  # ORT with vs without graph optimisations",
        "layertap compare torchvision:resnet18 --cand-runtime inductor --autocast bf16  # torch.compile vs eager, "
        "judged against float64",
    )
    groups = (ModelArgs(onnx_ok=True), InputArgs(), ToleranceArgs(metrics=True), JsonArgs(), ReportArgs(),
              RuntimeArgs(cand=True),
              SampleArgs(inputs_help="samples: any folder extract --data reads (images preprocessed as the model's "
                                     "config says, .npy/.npz files, a datasets folder) or one .npz (one sample per "
                                     "leading index)",
                         samples_help="N seeded random samples from the input specs; rows show each module's worst "
                                      "sample", reading=True))

    def add_own_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("onnx", metavar="CAND.onnx", nargs="?", default=None,
                            help="the candidate file: an export, a float16/int8 conversion, an optimised copy, REF "
                                 "itself run another way, an IR, a program (never modified); left out with "
                                 "--cand-runtime inductor: MODEL compiled")
        g = parser.add_argument_group("comparison")
        g.add_argument("--module", action="append", default=None, metavar="PATH",
                       help="compare only this module and its submodules (repeatable)")
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
                       help="write Model Explorer node data keyed by the candidate's node ids (an ONNX file's node names, "
                            "a LiteRT program's op indices): the error in FILE.json, status in FILE.status.json, "
                            "module path in FILE.module.json")

    def parse_own(self, ns: argparse.Namespace, args: Args) -> CompareOptions:
        # Cheap checks first: a typo in a path should not cost a model load.
        ref_onnx = is_onnx_path(ns.model)
        if ns.onnx is None:
            return self._compiled(ns, args, ref_onnx)
        _check_order(ns.model, ns.onnx, ref_onnx)
        if not Path(ns.onnx).is_file():
            raise OnnxFileError(f"ONNX file '{ns.onnx}' does not exist")
        if ref_onnx and not Path(ns.model).is_file():
            raise OnnxFileError(f"ONNX file '{ns.model}' does not exist")
        args.reads = (ns.onnx, ns.model) if ref_onnx else (ns.onnx,)
        if ns.node_data is not None:
            _explorer_nodes(ns.onnx, None)  # a candidate Model Explorer reads no nodes of is refused before any work
        return CompareOptions(ns.onnx, _check_outputs(ns, args.reads), ns.node_data, ns.module, ns.local)

    def _compiled(self, ns: argparse.Namespace, args: Args, ref_onnx: bool) -> CompareOptions:
        """``compare MODEL --cand-runtime inductor``: no candidate file, MODEL compiled is the candidate."""
        from ...runtimes.plugins import plugin

        if ns.cand_runtime is None or not callable(getattr(plugin(ns.cand_runtime), "candidate", None)):
            raise LayertapError("compare needs a candidate: CAND.onnx (or an IR, a program), or --cand-runtime "
                                "inductor to compare MODEL with MODEL compiled")
        if ref_onnx:
            raise LayertapError(f"--cand-runtime {ns.cand_runtime} compiles a PyTorch MODEL; {ns.model} is a file")
        if ns.node_data is not None or ns.fp16_block_list is not None:
            raise LayertapError("--node-data and --fp16-block-list name ONNX nodes; a compiled candidate has none")
        args.reads = ()
        return CompareOptions(None, _check_outputs(ns, ()), None, ns.module, ns.local)

    def finish(self, ns: argparse.Namespace, args: Args) -> None:
        args.tolerance = replace(args.tolerance, criterion=replace(args.tolerance.criterion,
                                                                   allow_different_weights=ns.allow_different_weights))
        args.runtime = replace(args.runtime, batch_outputs=ns.batch_outputs, memory_budget=ns.memory_budget << 20)
        args.sampling = replace(args.sampling, steps=ns.steps)

    def run(self, args: Args) -> int:
        opts: CompareOptions = args.own
        from ...comparing import compare

        ref, cand = reference(args), _read(opts.cand) if opts.cand is not None else None
        sampling, used = _keeping_inputs(args.sampling, opts)
        try:
            with StepProgress(enabled=sys.stderr.isatty()) as progress, reporting(progress):
                report = compare(ref, args.inputs.specs or None, cand, modules=opts.modules, local=opts.local,
                                 criterion=args.tolerance.criterion, runtime_options=args.runtime,
                                 sample_options=sampling, **args.tolerance.chosen())
            _write_outputs(args, report, cand)
            self.print_table(report, as_json=args.json)
            if used is not None:
                _block_list(args, report, cand, ref, used.load(ref, cand))
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

            shown = opts.cand or str(report.onnx_path)
            summary = [("reference", args.model.text), ("candidate", shown)]
            ReportArgs.write(args, report_page(report, f"compare {args.model.text} vs {Path(shown).name}", summary=summary))
        if opts.node_data:
            from ...reports.nodedata import write_node_data

            paths = sorted({str(p) for p in (getattr(r, "path", None) for r in report.rows) if p})
            written = write_node_data(report, cand, opts.node_data, _explorer_nodes(cand, paths))
            sys.stderr.write(f"wrote Model Explorer node data {', '.join(map(str, written))}\n")


def _explorer_nodes(cand: Any, paths: list[str] | None) -> list[Any] | None:
    """The candidate's nodes as Model Explorer's adapter for it keys them, each with its module call among ``paths``
    (``None`` for an ONNX file: its node names); a candidate whose nodes Model Explorer does not read is refused
    (``paths`` ``None``: only checked)."""
    from ...runtimes.plugins import a_program, plugin_for

    runtime = plugin_for(cand)
    if runtime is None:
        return None
    explorer = getattr(runtime, "explorer_nodes", None)
    if explorer is None:
        what = a_program(runtime) if runtime.form == "program" else f"a file {runtime.title} runs"
        raise LayertapError(f"--node-data keys Model Explorer's nodes of an ONNX file or a LiteRT program (.tflite); "
                            f"{cand} is {what}, whose nodes it does not read")
    return None if paths is None else explorer(Path(cand), paths)


def reference(args: Args) -> Any:
    """REF as the library takes it: an ONNX file read once (graph only), else the PyTorch model (a MODEL
    spec with its files and method; loaded once here when ``--fp16-block-list`` searches with it too)."""
    if args.model.is_onnx:
        return _read(args.model.text)
    model = args.model.model
    if isinstance(args.own, CompareOptions) and "fp16" in args.own.outputs:
        from ...pytorch.reference import load

        return Model(load(model).module, method=model.method)
    return model


def _read(path: str) -> Any:
    """An ONNX file read once (graph only), its weights handed over to the runtime that runs it (the
    command reads only the graph afterwards); an OpenVINO IR or an ExecuTorch program stays a path, for its
    own runtime to read."""
    from ...onnxfile.modelfile import read_model
    from ...runtimes import plugin_for

    return path if plugin_for(path) is not None else read_model(path).hand_over()


def _check_outputs(ns: argparse.Namespace, inputs: tuple[str, ...]) -> dict[str, Path]:
    if ns.node_data is not None:
        from ...reports.nodedata import check_node_data_path

        check_node_data_path(ns.node_data, inputs=inputs)
    out = {}
    if ns.plot is not None:
        out["plot"] = check_output_path(ns.plot, inputs=inputs, suffixes=(".png",))
    if ns.fp16_block_list is not None:
        out["fp16"] = check_output_path(ns.fp16_block_list, inputs=inputs, suffixes=(".json",))
    if ns.save_inputs is not None:
        out["inputs"] = check_output_path(ns.save_inputs, inputs=inputs + ((ns.inputs,) if ns.inputs else ()),
                                          suffixes=(".npz",))
    return out


def _write_outputs(args: Args, report: Any, cand: Any) -> None:
    opts: CompareOptions = args.own
    if "plot" in opts.outputs:
        report.plot(opts.outputs["plot"])


class _UsedInputs:
    """The samples ``--inputs`` fed to the comparison, kept (in a temporary ``.npz`` unless
    ``--save-inputs`` names one) so that ``--fp16-block-list`` judges its conversions on the same values."""

    def __init__(self, saved: str | None) -> None:
        self.folder = None if saved is not None else tempfile.mkdtemp(prefix="layertap-inputs-")
        self.path = saved if saved is not None else str(Path(self.folder or ".") / "inputs.npz")

    def load(self, ref: Any, cand: Any) -> list[Any]:
        """The samples as compare's ``inputs=`` reads them (dicts by input name for an ONNX
        reference, else arguments in the candidate's input order)."""
        from ...onnxfile.modelfile import is_onnx_source, model_file
        from ...samples.for_reference import samples_for

        onnx_ref = is_onnx_source(ref)
        read = samples_for(ref, None, SampleOptions(inputs=self.path), shapes_from=model_file(ref if onnx_ref else cand))
        if onnx_ref:
            return read.given()
        from ...pytorch.reference import as_tensors  # a PyTorch REF: the model is loaded by fix, not here

        return [as_tensors(list(s.kwargs.values())) for s in read]

    def close(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


def _keeping_inputs(sampling: SampleOptions, opts: CompareOptions) -> tuple[SampleOptions, _UsedInputs | None]:
    """The sample options, with the samples compared kept when ``--fp16-block-list`` needs them: its
    conversions are judged on the same values."""
    if "fp16" not in opts.outputs:
        return sampling, None
    used = _UsedInputs(None if sampling.save_inputs is None else str(sampling.save_inputs))
    return replace(sampling, save_inputs=used.path), used


def _block_list(args: Args, report: Any, cand: Any, ref: Any, samples: list[Any]) -> None:
    """--fp16-block-list: ``lt.fix --to fp16`` ranked by this comparison (REF a float32 ONNX file, or the PyTorch
    model exported as CAND was: the same exporter, so the same node names), so the list written is one a float16
    conversion was verified with; says when no list meets the target the comparison's rule names (its cosine or
    SQNR threshold, else cosine 0.999)."""
    from ...fixing import fix
    from ...fixing.configs import Target
    from ...fixing.convert import FP16_OPTIONS
    from ...fixing.fix import fmt_metric
    from ...onnxfile.modelfile import model_file
    from ...onnxfile.scopemap import ScopeMap

    rule = args.tolerance.criterion
    target = {"cosine": Target("cosine", rule.min_cosine), "sqnr": Target("sqnr", rule.min_sqnr_db)}.get(
        rule.metric, Target("cosine", 0.999))
    reference, first = (args.model.text, None) if args.model.is_onnx else (ref.source, samples[0])
    file = model_file(cand)
    smap = report.scope_map or ScopeMap.from_model(file.model)  # the comparison's, when it read one
    exporter = "torchscript" if smap.source == "torchscript" else "dynamo"
    found = fix(reference, first, to="fp16", out=None, target=target, samples=samples if first is None else samples[1:],
                sample_options=SampleOptions(seed=args.inputs.seed),
                search_options=SearchOptions(rank_report=report, exporter=exporter))
    found.write_nodes(args.own.outputs["fp16"])
    names = {n.name for n in file.model.graph.node}
    missing = [n for n in found.nodes if n not in names]
    if missing:
        found.notes.append(f"{len(missing)} of the listed nodes are not in '{file.path}' ({missing[0]}, "
                           "...): the list names the float32 file's nodes")
    best = found.best
    shown = f"{target.metric} {fmt_metric(found.steps[0].metric)} -> {fmt_metric(best.metric if best else None)}"
    verdict = (f"a float16 conversion with it meets {target} ({shown})" if found.ok else
               f"no list meets {target} ({len(found.steps)} conversions tried; this is the best found: {shown})")
    options = ", ".join(f"{k}={v!r}" for k, v in FP16_OPTIONS.items())
    for line in [f"note: {n}" for n in found.notes] + [
            f"fp16 block list: {len(found.nodes)} nodes ({', '.join(found.kept) or 'none'}): {verdict}; convert with "
            f"{options} (the default max_finite_val, 1e4, clamps larger weights)"]:
        sys.stderr.write(printable(line) + "\n")


def _check_order(ref: str, cand: str, ref_onnx: bool) -> None:
    """``compare r18.onnx torchvision:resnet18``: the candidate must be the ONNX file, second."""
    if ref_onnx and not is_onnx_path(cand):
        raise LayertapError(
            f"the arguments look swapped: CAND {cand!r} is not an ONNX file but REF {ref!r} is; "
            f"the reference comes first, the candidate .onnx second: layertap compare {cand} {ref}"
        )
