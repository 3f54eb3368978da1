"""``lt.compare``: a reference (a PyTorch model or an ONNX file) vs an ONNX candidate in ONNX
Runtime, module by module. This module checks the options and builds the two sides; both kinds
of reference run through the one driver (:mod:`.driver`; ONNX reference: :mod:`.onnx_ref`).

The PyTorch model runs once with hooks on every module; each module call's
output is moved to numpy as soon as the call returns. The ONNX file's
counterpart of each call (from :class:`~layertap.onnxfile.scopemap.ScopeMap`)
is exposed as an extra graph output of an in-memory copy of the graph (the
file is never written) and fetched from ONNX Runtime. Both sides are aligned
by ``(module path, call index)`` and compared in PyTorch execution order.

Error statistic: :mod:`layertap.metrics` (per module call, over
every element compared: ``max|onnx - torch| <= atol + rtol * max|torch|``).

Alignment rules:

* Rows come in the order PyTorch module calls *return* (children before their
  parent), so the first failing row is the deepest, earliest module whose
  output differs: that is ``first_divergence``.
* A call aligns with the ONNX call of the same index. When the two sides
  count a different number of calls for a module, its calls are listed as
  ``no counterpart`` rather than guessed.
* A module whose output is a tuple/list/dict is flattened; its ONNX tensors
  pair with the PyTorch tensors by position when count and shapes agree,
  otherwise each ONNX tensor pairs with the first unused PyTorch tensor of the
  same shape. Shapes that only differ by size-1 dimensions are compared after
  reshaping.
* A module folded into another (a Conv whose BatchNorm the exporter fused
  into it) is ``absorbed``: it is never a failure. The fused ONNX value is
  compared where PyTorch computes the same value, the BatchNorm's output.
  When the file's scopes do not say so, a failing call whose ONNX value
  matches the output of one of the next sibling modules is recognised as such
  a fusion too.
* The model's own result is the last row, named ``output``.

Memory stays bounded: PyTorch values beyond ``memory_budget`` bytes spill to
a temporary folder, and ONNX Runtime runs in batches, each session exposing
only the tensors that fit the budget (ORT keeps every exposed output of a run
alive, fetched or not), so each batch's arrays are compared and dropped before
the next run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from ..errors import LayertapError, unknown_name
from ..heap import frozen_callers_objects
from ..metrics import METRICS, ROUNDING_RTOL, Criterion
from ..numformats import PRECISIONS
from ..onnxfile.modelfile import ModelFile, is_onnx_source
from ..options import DEFAULT_MEMORY_BUDGET, UNSET, RuntimeOptions, SampleOptions, current_progress, merged_criterion
from ..runtimes import runtime_for
from ..runtimes.choice import side_runtimes
from ..runtimes.ort import FUSION_NOTE
from ..runtimes.plugins import ProgramPlugin, RuntimeSettings, a_program, plugin, plugin_for, runtime_names
from ..samples.for_reference import samples_for
from .driver import Progress, compare_sides
from .ideal import candidate_formats
from .judging import Judging, judging
from .onnx_side import OrtSide
from .rows import CompareReport
from .torch_ref import TorchReference

if TYPE_CHECKING:  # pragma: no cover
    from ..pytorch.reference import Loaded

__all__ = ["compare", "Progress", "FUSION_NOTE", "DEFAULT_MEMORY_BUDGET"]


# ---------------------------------------------------------------------------
# public entry
# ---------------------------------------------------------------------------
@frozen_callers_objects  # a process's first compare would otherwise pay the full collection its model's build left due
def compare(
    ref: Any,
    args: Any = None,
    cand: str | os.PathLike | ModelFile | None = None,
    *,
    samples: int | Sequence[Any] | None = UNSET,
    modules: Sequence[str] | None = None,
    metric: str = UNSET,
    rtol: float | None = UNSET,
    atol: float | None = UNSET,
    local: bool = False,
    criterion: Criterion | None = None,
    runtime_options: RuntimeOptions | None = None,
    sample_options: SampleOptions | None = None,
) -> CompareReport:
    """Compare a reference with a candidate file layer by layer.

    Args:
        ref: the PyTorch model the candidate was exported from: an ``nn.Module`` (eval mode), a MODEL spec
            (``torchvision:resnet18``, ``path/file.py:Net``) or a :class:`~layertap.options.Model` (a spec with
            its weights, or a module with the method to call: ``Model(clip, method="encode_image")``); or the
            path of a reference ONNX file (then torch is never imported).
        args: one sample: the positional arguments (a tensor/array or a tuple of them; a dict of named inputs
            for an ONNX reference). For a PyTorch reference also ``--input`` specs (``["1x3x224x224"]``,
            drawn as the model accepts them); ``None``: a spec's default input, or random data from an ONNX
            reference's input shapes.
        cand: the candidate file (a float16/int8 conversion, an optimised copy, another exporter's file, an
            OpenVINO IR, or ``ref`` itself run another way); read only, never modified. An ONNX ``ref`` or
            ``cand`` may also be the file already read (:func:`~layertap.onnxfile.modelfile.read_model`): it is
            not read again.
        samples: several samples: a list/iterable of samples like ``args``, or ``N`` for N seeded random
            samples shaped like ``args`` (or like the reference file's inputs). Rows then hold each call's
            worst sample.
        modules: compare only these modules and their submodules.
        metric: what decides pass/fail: ``rel`` (the default: ``max_abs <= atol + rtol * max|ref|``),
            ``cosine`` (``>= min_cosine``) or ``sqnr`` (``>= min_sqnr_db``).
        rtol, atol: the ``rel`` rule (default 1e-3, 1e-5). Given (or a ``metric`` other than ``rel``), they
            decide every row; left out, a candidate below float32 is judged at its precision
            (``criterion.precision``): every row carries ``format_rel`` (an ideal run at that format against
            the reference: what the format costs there) and ``impl_rel`` (the candidate against that ideal run:
            what the file or the runtime adds); a row fails when ``impl_rel`` exceeds
            :data:`~layertap.metrics.FORMAT_MULTIPLE` times ``format_rel`` (plus the float32 tolerance), or
            where the format cannot carry the value (see :mod:`layertap.comparing.ideal`).
        local: also run each compared call's candidate nodes on the reference's own inputs; ``local_rel``
            is the error the call makes by itself.
        criterion: the rule as an object (:class:`~layertap.metrics.Criterion`: ``metric``, ``rtol``,
            ``atol``, ``min_cosine``, ``min_sqnr_db``, ``check_finite``, ``precision`` (``auto``, ``fp32``,
            ``fp16``, ``bf16``, ``int8``), ``allow_different_weights``: compare even when most parameters
            found on both sides by name differ; without it that raises
            :class:`~layertap.comparing.weight_check.DifferentWeightsError`).
        runtime_options: what runs each file and the memory held (:class:`~layertap.options.RuntimeOptions`:
            ``runtime``/``cand_runtime`` ``"ort"`` or ``"openvino"`` (an OpenVINO IR runs in OpenVINO),
            ``providers``/``cand_providers``, ``ort_optimizations``/``ref_ort_optimizations``,
            ``ov_precision``, ``ov_device``, ``batch_outputs``, ``memory_budget``).
        sample_options: the samples as an object (:class:`~layertap.options.SampleOptions`: ``inputs`` (a path
            any ``lt.extract_dataset`` reads, or one ``.npz``), ``limit``, ``columns``, the image recipe
            (``image_size``, ``mean``, ``std``, ``preprocess``; default the model's zoo's), ``save_inputs``
            (write the samples compared to one ``.npz``: ``inputs=`` of it repeats the comparison),
            ``seed``, and ``steps``: with a decoder file (a KV cache), the prompt and then this many greedy
            decode steps on both sides, rows per call and token).

    A keyword given explicitly wins over an object's field, whatever its value. Progress goes to the
    receiver of :func:`layertap.options.reporting`.

    Returns:
        A :class:`CompareReport`: ``.ok``, ``.rows`` (one per module call, in
        execution order), ``.first_divergence``, ``.first_divergence_counts``.

    Example:
        >>> import torch, layertap as lt
        >>> from layertap.options import RuntimeOptions
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
        >>> x = torch.randn(2, 4)
        >>> import tempfile, os; path = os.path.join(tempfile.mkdtemp(), "m.onnx")
        >>> torch.onnx.export(model, (x,), path, dynamo=False)
        >>> report = lt.compare(model, x, path, samples=3)
        >>> report.ok, report.first_divergence, report.samples
        (True, None, 3)
        >>> lt.compare(path, None, path, runtime_options=RuntimeOptions(ref_ort_optimizations=False)).ok
        True
    """
    runs = RuntimeOptions.merged(runtime_options)
    if cand is None and not callable(getattr(_named_plugin(runs.cand_runtime), "candidate", None)):
        makers = [n for n in runtime_names() if callable(getattr(plugin(n), "candidate", None))]
        raise LayertapError("compare needs a candidate: a file (the third argument), a module (torch.compile(model)), "
                            + "".join(f"or cand_runtime='{n}' (--cand-runtime {n}) " for n in makers)
                            + "to make one from the reference")
    sampling = SampleOptions.merged(sample_options, samples=samples)
    rule, tolerance_chosen = merged_criterion(criterion, metric=metric, rtol=rtol, atol=atol)
    _check_memory(runs.batch_outputs, runs.memory_budget)
    plan = _Plan(_checked(rule), modules, runs.batch_outputs, runs.memory_budget, rule.allow_different_weights, local,
                 sampling.seed, sampling.save_inputs, current_progress(), tolerance_chosen)
    return _compare(ref, args, cand, runs, sampling, plan, tolerance_chosen=tolerance_chosen)


@dataclass(frozen=True)
class _Plan:
    """How one comparison runs, its options checked: the rule rows are judged by, the modules
    compared, the memory held, and what else is done beside the rows."""

    criterion: Criterion
    modules: Sequence[str] | None
    batch_outputs: int | None
    memory_budget: int
    allow_different_weights: bool
    local: bool
    seed: int  # of random samples
    save_inputs: str | os.PathLike | None
    progress: Progress | None
    chosen: bool = False  # the user set the tolerances or the metric: they decide, not the candidate's precision

    def judging(self, cand: OrtSide) -> Judging | None:
        """How rows are judged at the candidate's precision (``None``: at float32, by the criterion)."""
        return judging(candidate_formats(cand, self.criterion.precision), self.criterion, self.chosen)

    def sides(self) -> dict[str, Any]:
        """The keywords both kinds of reference take."""
        return dict(criterion=self.criterion, modules=self.modules, batch_outputs=self.batch_outputs,
                    memory_budget=self.memory_budget, allow_different_weights=self.allow_different_weights)

    def driver(self) -> dict[str, Any]:
        """The keywords of :func:`.driver.compare_sides`."""
        return dict(criterion=self.criterion, local=self.local, memory_budget=self.memory_budget, progress=self.progress)


def _compare(ref: Any, args: Any, cand: Any, runs: RuntimeOptions, sampling: SampleOptions, plan: _Plan, *,
             tolerance_chosen: bool) -> CompareReport:
    """``compare`` on its options as objects: the runtimes opened, a PyTorch reference loaded and its
    example call made, the samples read, the rows' rule fitted to a reduced precision, then the sides
    built for the kind of reference."""
    program = next((p for p in (plugin_for(cand) if cand is not None else _named_plugin(runs.cand_runtime),
                                plugin_for(ref) if isinstance(ref, (str, os.PathLike)) else None)  # a program as REF
                    if p is not None and p.form == "program"), None)
    if program is not None:
        return _compare_program(program, ref, args, cand, runs, sampling, plan)  # type: ignore[arg-type]
    onnx_ref = is_onnx_source(ref)
    ref_rt, cand_rt = side_runtimes(onnx_ref, runs, own=(runtime_for(ref) if onnx_ref else None, runtime_for(cand)))
    criterion, precision_note = rounding_criterion(plan.criterion, tolerance_chosen, ref_rt)
    plan = replace(plan, criterion=criterion)
    _check_steps_use(sampling.steps, onnx_ref or sampling.samples is not None or sampling.inputs is not None)
    if onnx_ref:
        report = _compare_files(ref, cand, args, sampling, ref_rt, cand_rt, plan)
    else:
        from ..pytorch.reference import load

        report = _compare_torch(load(ref), cand, args, sampling, cand_rt, plan, ort_optimizations=runs.ort_optimizations)
    report.notes[:0] = [precision_note] if precision_note else []
    return report


def _compare_program(runtime: ProgramPlugin, ref: Any, args: Any, cand: Any, runs: RuntimeOptions,
                     sampling: SampleOptions, plan: _Plan) -> CompareReport:
    """A PyTorch model against a program ``runtime`` runs (:mod:`.mapped`), on the samples given or drawn."""
    from ..pytorch.reference import load

    if (cand is not None and plugin_for(cand) is not runtime) or is_onnx_source(ref):
        raise LayertapError(f"{a_program(runtime)} ({', '.join(runtime.suffixes)}) is compared with the PyTorch "
                            f"model it came from: layertap compare MODEL m{runtime.suffixes[0]} (lt.compare(model, "
                            f"args, 'm{runtime.suffixes[0]}'))")
    for flag, verb in ((plan.local, "compare --local"), (sampling.steps is not None, "compare --steps")):
        if flag and runtime.matrix.get(verb) != "yes":
            raise LayertapError(f"{verb.split()[1]} is not available for {runtime.title} programs: "
                                f"{runtime.matrix.get(verb)}; compare without it")
    if runs.runtime not in (None, runtime.name) or runs.cand_runtime not in (None, runtime.name):
        raise LayertapError(f"--runtime does not apply to {a_program(runtime)}: it runs in {runtime.title}")
    if runs.cand_providers is not None:
        raise LayertapError(f"--cand-providers does not apply to {a_program(runtime)}: it runs in "
                            f"{runtime.title}, on the backend it was lowered for")
    runtime.open(RuntimeSettings(providers=runs.providers, ov_precision=runs.ov_precision, ov_device=runs.ov_device,
                                 autocast=runs.autocast, compile_mode=runs.compile_mode,
                                 compile_backend=runs.compile_backend))
    loaded = load(ref)
    if cand is None:  # the reference made a candidate by the runtime (compiled)
        cand = runtime.candidate(loaded.module)  # type: ignore[attr-defined]
    # drawn at the shapes the program was lowered for, not the zoo's; --inputs read as it declares its inputs (a
    # module in memory declares none: its samples are the model's own)
    shapes = (lambda: runtime.engine(Path(cand)).get_inputs()) if isinstance(cand, (str, os.PathLike)) else None
    samples = samples_for(loaded, args, sampling, shapes_from=shapes)
    runs_ = samples.calls()
    from .mapped import compare_mapped  # noqa: PLC0415 -- a program's compare only: a file's first call skips it

    report = compare_mapped(runtime, loaded.module, cand, runs_, plan, loaded.method)
    if sampling.save_inputs is not None:
        from ..samples.loading import save_samples  # noqa: PLC0415 -- only when the samples are saved

        save_samples(sampling.save_inputs, [{f"input_{i}": a.numpy() for i, a in enumerate(r[0])} for r in runs_])
    return report


def _named_plugin(name: str | None) -> Any:
    """The plug-in of a runtime named by ``cand_runtime`` (``None``: none named)."""
    from ..runtimes.plugins import plugin  # noqa: PLC0415 -- a named candidate runtime only

    return plugin(name) if name is not None else None


def rounding_criterion(criterion: Criterion, given: bool, ref_runtime: Any) -> tuple[Criterion, str]:
    """The rule the rows are judged by when the *reference* file's runtime computes at a reduced precision
    (OpenVINO at bfloat16/float16) and the user set no tolerance: ``rtol`` fitted to that precision's
    rounding (:meth:`Criterion.for_precision`), and the note saying so. (A reduced-precision candidate is
    judged against an ideal run at its format instead: :mod:`.ideal`.)

    Example:
        >>> from layertap.runtimes import open_runtime
        >>> rounding_criterion(Criterion(), False, open_runtime("ort"))[1]
        ''
    """
    info = ref_runtime.describe() if ref_runtime is not None else None
    if given or criterion.metric != "rel" or info is None or info.precision not in ROUNDING_RTOL:
        return criterion, ""
    fitted = criterion.for_precision(info.precision)
    return fitted, (f"the reference ran in {info.runtime} at {info.precision}: rows judged at rtol {fitted.rtol:g} "
                    "(its rounding); pass --rtol (rtol=) to judge tighter")


def _compare_files(ref: str | os.PathLike | ModelFile, cand: str | os.PathLike | ModelFile, args: Any,
                   sampling: SampleOptions, ref_rt: Any, cand_rt: Any, plan: _Plan) -> CompareReport:
    """An ONNX reference: both files in their runtimes, aligned by :func:`.onnx_ref.align_files`, on the samples
    for the reference file's inputs. Never imports torch."""
    from .onnx_ref import OnnxReference, refuse_same_run  # noqa: PLC0415 -- an ONNX reference only: a model's first call skips it

    refuse_same_run(_path(ref), _path(cand), ref_rt, cand_rt)
    ref_side = OrtSide(ref, ref_rt)
    cand_side = OrtSide(cand, cand_rt)
    judged = plan.judging(cand_side)
    samples = samples_for(ref, args, sampling, shapes_from=ref_side.proto, folder=ref_side.path.parent)
    reference = OnnxReference(ref_side, cand_side, samples.given(), judging=judged, **plan.sides())
    if plan.save_inputs is not None:
        from ..samples.loading import save_samples  # noqa: PLC0415 -- only when the samples are saved

        save_samples(plan.save_inputs, reference.feeds)
    report = compare_sides(reference, cand_side, onnx_path=_shown(cand), ort_optimizations=cand_rt.optimize,
                           reference=_shown(ref), judging=judged, **plan.driver(),
                           runtimes={"reference": ref_side.describe().to_dict(), "candidate": cand_side.describe().to_dict()})
    # again after the runs: what each side ran on (ORT leaves out a provider that fails to load)
    report.runtimes.update(reference=ref_side.describe().to_dict(), candidate=cand_side.describe().to_dict())
    return report


def _check_steps_use(steps: int | None, other_samples: bool) -> None:
    """``steps=`` decodes one prompt against a PyTorch reference; anything else is refused."""
    if steps is not None and other_samples:
        raise LayertapError("steps= decodes one prompt with a PyTorch reference: give the model and one input "
                            "(input_ids), without samples= or inputs=")


def _checked(criterion: Criterion) -> Criterion:
    """The rule with its numbers checked, each as a one-line user error."""
    c = criterion
    if c.metric not in METRICS:
        raise LayertapError(f"unknown metric {c.metric!r}; use one of {', '.join(METRICS)}")
    if not isinstance(c.min_cosine, (int, float)) or not -1 <= c.min_cosine <= 1:
        raise LayertapError(f"min_cosine must be a number in [-1, 1], got {c.min_cosine!r}")
    if not isinstance(c.min_sqnr_db, (int, float)):
        raise LayertapError(f"min_sqnr_db must be a number of dB, got {c.min_sqnr_db!r}")
    if not (isinstance(c.rtol, (int, float)) and c.rtol >= 0 and isinstance(c.atol, (int, float)) and c.atol >= 0):
        raise LayertapError(f"tolerances must be numbers >= 0, got rtol={c.rtol!r}, atol={c.atol!r}")
    if c.precision not in ("auto", *PRECISIONS):
        raise LayertapError(unknown_name("precision", str(c.precision), ["auto", *PRECISIONS],
                                         hint="auto reads it from the candidate file and its runtime"))
    return replace(c, rtol=float(c.rtol), atol=float(c.atol), min_cosine=float(c.min_cosine),
                   min_sqnr_db=float(c.min_sqnr_db), check_finite=bool(c.check_finite),
                   allow_different_weights=bool(c.allow_different_weights))


def _compare_torch(loaded: Loaded, cand: str | os.PathLike | ModelFile, args: Any, sampling: SampleOptions,
                   runtime: Any, plan: _Plan, *, ort_optimizations: bool) -> CompareReport:
    """PyTorch reference: one hooked forward per sample (or decode step), the candidate's tensors in ORT batches;
    the samples are the model's calls, ``--inputs`` read for the candidate's inputs."""
    from ..pytorch.taps import bound_method

    model, method, steps = loaded.module, loaded.method, sampling.steps
    bound_method(model, method)  # a non-module or an unknown method fails before any work
    cand_side = OrtSide(cand, runtime)
    runs = samples_for(loaded, args, sampling, shapes_from=cand_side.proto).calls()
    judged = plan.judging(cand_side)
    reference: TorchReference
    candidate: Any = cand_side
    options = dict(method=method, progress=plan.progress, local=plan.local, judging=judged, **plan.sides())
    if steps is not None:  # decode steps fill the model's cache in place: no second, rounded forward
        from .steps import StepReference, check_steps  # noqa: PLC0415 -- decode steps only

        reference = StepReference(model, runs, cand_side, steps=check_steps(steps), ideal=False, **options)
        candidate = reference.candidate
    else:
        reference = TorchReference(model, runs, cand_side, **options)
    if plan.save_inputs is not None:
        from ..samples.loading import save_samples  # noqa: PLC0415 -- only when the samples are saved

        save_samples(plan.save_inputs, reference.feeds)
    report = compare_sides(reference, candidate, onnx_path=_shown(cand), ort_optimizations=ort_optimizations,
                           runtimes={"candidate": cand_side.describe().to_dict()}, judging=judged, **plan.driver())
    report.runtimes.update(candidate=cand_side.describe().to_dict())  # after the runs: what they ran on
    return report


def _path(source: str | os.PathLike | ModelFile) -> Path:
    """Where an ONNX source lives: its path, or the path of the file already read."""
    return source.path if isinstance(source, ModelFile) else Path(source)


def _shown(source: str | os.PathLike | ModelFile) -> str:
    """An ONNX source as the report names it: the path as given."""
    return str(source.path if isinstance(source, ModelFile) else source)


def _check_memory(batch_outputs: Any, memory_budget: Any) -> None:
    """User errors in the memory options, as one-line messages."""
    if batch_outputs is not None and (not isinstance(batch_outputs, int) or batch_outputs < 1):
        raise LayertapError(f"batch_outputs must be a positive integer, got {batch_outputs!r}")
    if not isinstance(memory_budget, int) or memory_budget < 1:
        raise LayertapError(f"memory_budget must be a positive number of bytes, got {memory_budget!r}")
