"""``lt.repro``: a minimal package that reproduces one module call's mismatch.

One ``local=True`` comparison keeps the part of the call (the asked-for one, else the first
failing one) with the reference's values fed to it (:func:`layertap.comparing.local_errors.keep_part`):
the candidate's nodes of that call, cut by the same :class:`~layertap.onnxfile.parts.PartCutter`
``compare --local`` runs. The package is written to a temporary folder next to DIR, checked
(``repro.py`` run in a fresh interpreter must exit 1; the reference's part must agree with
``expected.npz``) and renamed to DIR at the end. A DIR that already exists is replaced only
when it is a previous repro package (it holds ``repro.json``).
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..comparing.api import compare
from ..comparing.local_errors import keep_part
from ..errors import LayertapError, printable, unknown_name
from ..files.signals import raise_if_stopped
from ..metrics import DEFAULT_ATOL, DEFAULT_RTOL, FORMAT_MULTIPLE, Criterion
from ..onnxfile.modelfile import ModelFile, is_onnx_source, model_file, read_model
from ..onnxfile.scopemap import ScopeMap
from ..options import UNSET, Model, RuntimeOptions, SampleOptions, given, merged_criterion
from ..samples.for_reference import samples_for
from .repro_files import MARKER, check_package, finish_package, write_package


@dataclass
class ReproReport:
    """What :func:`repro` packaged.

    Attributes:
        module: the module call (``PATH`` or ``PATH#k``).
        error: the rel error of the candidate's part on the package's inputs (``repro.py``'s figure).
        reproduced: ``repro.py`` exits 1 in a fresh interpreter (and the reference's part, when
            packaged, agrees with ``expected.npz``).
        files: the package's files, relative to ``out``.
        out: the package folder.
        ref_error: the reference's part against ``expected.npz`` (``None`` without ``ref.onnx``).
        notes: what the package lacks, or why it does not reproduce.
        sample: of several samples, the one packaged (where the call's error is worst).

    Example:
        >>> r = ReproReport("layer3.1", 4.9e-4, True, ["cand.onnx", "repro.py"], Path("pkg"))
        >>> r.ok, r.lines()[0]
        (True, "wrote pkg: layer3.1 alone, fed the reference's inputs: rel error 0.00049")
    """

    module: str
    error: float | None
    reproduced: bool
    files: list[str]
    out: Path
    ref_error: float | None = None
    notes: list[str] = field(default_factory=list)
    sample: int | None = None

    @property
    def ok(self) -> bool:
        """The package reproduces the mismatch."""
        return self.reproduced

    def lines(self) -> list[str]:
        """The report in a few lines, as the CLI prints it."""
        err = "n/a" if self.error is None else f"{self.error:.3g}"
        shown = _shown(self.out)
        head = ([f"wrote {shown}: {printable(self.module)} alone, fed the reference's inputs: rel error {err}"]
                if self.reproduced else
                [f"{printable(self.module)} alone does not reproduce the mismatch (rel error {err})",
                 f"package kept in {shown}, marked in README.md"])
        picked = [] if self.sample is None else [f"sample {self.sample} packaged: the call's error is worst there"]
        # lines that fit 80 columns (file names are never split)
        files = textwrap.wrap(f"files: {', '.join(self.files)}", 80, subsequent_indent="  ", break_long_words=False,
                              break_on_hyphens=False)
        return [*head, *files, *picked, *self.notes]

    def __str__(self) -> str:
        return "\n".join(self.lines())


def repro(ref: Any, args: Any = None, cand: str | os.PathLike | ModelFile | None = None, *, out: str | os.PathLike = "repro",
          module: str | None = None, rtol: float | None = UNSET, atol: float | None = UNSET,
          samples: Sequence[Any] | None = UNSET, command: str | None = None, criterion: Criterion | None = None,
          runtime_options: RuntimeOptions | None = None, sample_options: SampleOptions | None = None) -> ReproReport:
    """Write a minimal package that reproduces one module call's mismatch between ``ref`` and ``cand``.

    Args:
        ref: the PyTorch model the candidate was exported from (an ``nn.Module``, a MODEL spec, or a
            :class:`~layertap.options.Model` with its weights and method), or the reference ONNX file.
        args: one sample, or ``--input`` specs, as for :func:`layertap.compare`.
        cand: the candidate ONNX file (never modified).
        out: the package folder (created; a previous repro package there is replaced).
        module: ``PATH`` or ``PATH#CALL``; default the first divergence. Where neither file carries
            module scopes, a tensor name of the reference (or the name of the node that makes it).
        rtol, atol: the tolerance ``repro.py`` holds the part to (default 1e-3, 1e-5). Left out, a candidate
            below float32 is judged at its precision (as ``lt.compare`` judges it): the first divergence is
            the first fault, and ``repro.py`` allows the call what its format explains there (``rtol`` plus
            :data:`~layertap.metrics.FORMAT_MULTIPLE` times the call's format error; the README says so).
        command: the command line the README names (default: this call).
        samples: several samples instead of ``args``: all are compared, and the one where the
            call's error is worst is packaged (README.md and repro.json name it).
        criterion: the comparisons' rule (:class:`~layertap.metrics.Criterion`; ``allow_different_weights``
            compares a candidate with other weights); ``rtol``/``atol`` given replace its fields.
        runtime_options: what runs each file in the comparisons (:class:`~layertap.options.RuntimeOptions`).
        sample_options: the samples as an object (:class:`~layertap.options.SampleOptions`): its
            ``samples`` as ``samples=``, or ``inputs``, a folder / ``.npz`` read as ``lt.compare`` reads
            it (``limit`` its first N); ``samples=`` given replaces its field.

    A keyword given explicitly wins over an object's field. Progress goes to the receiver of
    :func:`layertap.options.reporting`.

    Returns:
        A :class:`ReproReport` (``.module``, ``.error``, ``.files``, ``.reproduced``).

    Example:
        >>> import os, tempfile, torch, layertap as lt
        >>> from onnxconverter_common import float16
        >>> import onnx
        >>> torch.manual_seed(0) and None
        >>> model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.LayerNorm(32)).eval()
        >>> with torch.no_grad():
        ...     _ = model[0].weight.mul_(3e5)
        >>> d = tempfile.mkdtemp(); f32, f16 = os.path.join(d, "m.onnx"), os.path.join(d, "m16.onnx")
        >>> torch.onnx.export(model, (torch.randn(2, 32),), f32, dynamo=False)
        >>> onnx.save(float16.convert_float_to_float16(onnx.load(f32), keep_io_types=True), f16)
        >>> r = lt.repro(model, torch.randn(2, 32), f16, out=os.path.join(d, "pkg"))
        >>> r.module, r.reproduced, r.files
        ('0', True, ['README.md', 'cand.onnx', 'cand.onnx.data', 'expected.npz', 'inputs.npz', 'repro.py'])
    """
    if cand is None:
        raise LayertapError("repro needs a candidate ONNX file (the third argument)")
    path, call = _parse_module(module)
    called = _call_text(ref, cand, module)
    ref, cand = _read_onnx(ref), _read_onnx(cand)
    target = _check_out(out, [p for p in (_source_path(ref), _source_path(cand)) if p is not None])
    rule, chosen = merged_criterion(criterion, rtol=rtol, atol=atol)
    ref, loaded = _loaded(ref)
    if path is not None:
        path = _check_known(ref, cand, path)
    samples = _samples(loaded or ref, cand, args, SampleOptions.merged(sample_options, samples=samples))
    options = dict(criterion=rule, runtime_options=runtime_options, **given(rtol=rtol, atol=atol))
    rtol, atol = (rule.rtol, rule.atol) if chosen else (None, None)
    sample = None
    if len(samples) > 1:
        ref, cand, path, call, sample = _worst_sample(compare, ref, cand, samples, path, call, options)
    args = samples[sample or 0]
    report, part = _kept(compare, ref, args, cand, path, call, options)
    first = report.first_divergence_row
    if path is None and (part is None or (part.path, part.call) != _call_of(first)):
        if first is None:
            raise LayertapError(_agree_message(report))
        # a file compare read holds no inline weights after it: the second run reads it again
        again = [_source_path(x) if isinstance(x, ModelFile) else x for x in (ref, cand)]
        path, call = first.path, first.call
        report, part = _kept(compare, again[0], args, again[1], path, call, options)
    if part is None:
        raise LayertapError(_no_part_message(report, path, call))
    row = next(r for r in report.rows if (r.path, r.call) == (part.path, part.call))
    worst = None if sample is None or samples is None else (sample, len(samples))
    rtol, atol, why = package_tolerance(report, row, rtol, atol)
    return _package(ref, cand, part, row, target, rtol, atol, command or called, worst, why)


def package_tolerance(report: Any, row: Any, rtol: float | None, atol: float | None) -> tuple[float, float, list[str]]:
    """``(rtol, atol, notes)`` ``repro.py`` holds the part to: the user's, else, for a comparison judged at the
    candidate's precision, what the format explains at this call (the default ``rtol`` plus
    ``FORMAT_MULTIPLE`` times the row's format error; none where the format cannot carry the value), said
    in a note.

    Example:
        >>> from layertap.comparing import CompareReport, CompareRow
        >>> row = CompareRow("fc", "fc", 0, "Linear", [1], 0.3, 0.3, "FAIL", False, format_rel=0.002)
        >>> package_tolerance(CompareReport([row]), row, None, None)[:2]
        (0.001, 1e-05)
    """
    chosen = rtol is not None or atol is not None
    rtol = DEFAULT_RTOL if rtol is None else rtol
    atol = DEFAULT_ATOL if atol is None else atol
    own = getattr(row, "local_format_rel", None)  # the part alone at the format: what repro.py runs
    fmt = own if own is not None else getattr(row, "format_rel", None)
    # a value the format cannot carry (an overflow, a range that clips) is the fault itself: no allowance for it
    if chosen or not getattr(report, "judged_at_format", False) or fmt is None or not math.isfinite(fmt) or row.limit:
        return rtol, atol, []
    what = "its own part's format error" if own is not None else "its format error"
    wider = rtol + FORMAT_MULTIPLE * fmt
    seen = getattr(row, "local_rel", None)
    if own is not None and seen is not None and math.isfinite(seen) and seen <= wider:
        # judged by the root mean square or the gain, its largest difference is within that: hold the part halfway
        # between the format's own error and the candidate's, which the fault passes and a sound part does not
        half = (own + seen) / 2
        return half, atol, [f"judged at {report.precision}: its values differ everywhere, not by much at any one "
                            f"(rel err {seen:.3g} against {what} {own:.3g}): repro.py holds the part halfway, rtol "
                            f"{half:.3g}; pass --rtol to hold it to another tolerance"]
    return wider, atol, [f"judged at {report.precision}: repro.py allows what {report.precision} explains at this call, "
                         f"rtol {rtol:g} + {FORMAT_MULTIPLE:g} x {what} {fmt:.3g} (an ideal {report.precision} run "
                         f"against the reference) = {wider:.3g}; pass --rtol to hold it to another tolerance"]


def _loaded(ref: Any) -> tuple[Any, Any]:
    """``(ref, loaded)``: a PyTorch reference loaded once for every comparison repro runs, as a
    :class:`~layertap.options.Model` of the loaded module (and the :class:`~layertap.pytorch.reference.Loaded`
    its samples come from); an ONNX reference as it is."""
    if is_onnx_source(ref):
        return ref, None
    from ..pytorch.reference import load

    loaded = load(ref)
    return Model(loaded.module, method=loaded.method, kwargs=loaded.kwargs), loaded


def _samples(ref: Any, cand: Any, args: Any, sampling: SampleOptions) -> list[Any]:
    """The samples compared, as ``lt.compare`` takes them (:func:`~layertap.samples.for_reference.samples_for`:
    given, read from ``sampling.inputs`` for the reference's inputs, drawn from ``--input`` specs); an ONNX
    reference's number of random samples is refused (one sample is packaged)."""
    onnx_ref = is_onnx_source(ref)
    if onnx_ref and isinstance(sampling.samples, int):
        raise LayertapError("repro packages one sample; pass it as args (--input) or as samples= (--inputs)")
    shapes = ref if onnx_ref else cand
    return samples_for(ref, args, sampling, shapes_from=lambda: model_file(shapes).model).given()


def _worst_sample(compare: Any, ref: Any, cand: Any, samples: Sequence[Any], path: str | None, call: int,
                  options: dict) -> tuple[Any, Any, str | None, int, int]:
    """Compare over every sample; the call to package (``path#call``, else the first divergence) and the
    sample where its error is worst (the row's ``worst_sample``). The files are read again afterwards."""
    report = compare(ref, None, cand, samples=list(samples), **options)
    row = (next((r for r in report.rows if (r.path, r.call) == (path, call)), None) if path is not None
           else report.first_divergence_row)
    if row is None and path is None:
        raise LayertapError(_agree_message(report))
    if row is None:
        raise LayertapError(_no_part_message(report, path, call))
    # a file compare read holds no inline weights after it: the next run reads it again
    again = [_source_path(x) if isinstance(x, ModelFile) else x for x in (ref, cand)]
    return again[0], again[1], row.path, row.call, row.worst_sample or 0


def _read_onnx(source: Any) -> Any:
    """An ONNX file given as a path, read once (graph only), so its module paths are known before any run."""
    if isinstance(source, (str, os.PathLike)) and str(source).lower().endswith(".onnx"):
        return read_model(source)
    return source


def _kept(compare: Any, ref: Any, args: Any, cand: Any, path: str | None, call: int, options: dict) -> tuple[Any, Any]:
    """One ``local=True`` comparison keeping the part of ``path#call`` (``None``: the first failing call)."""
    with keep_part(path, call) as keeper:
        report = compare(ref, args, cand, local=True, **options)
    if keeper.part is None and keeper.why is not None:
        raise LayertapError(f"cannot cut the candidate's part of {printable(keeper.where)}: {keeper.why}")
    return report, keeper.part


def _package(ref: Any, cand: Any, part: Any, row: Any, target: Path, rtol: float, atol: float, command: str,
             sample: tuple[int, int] | None = None, why: Sequence[str] = ()) -> ReproReport:
    """Write the package in a temporary folder next to ``target``, check it, then move it into place."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # the package folder as a plain mkdir makes it (mkdtemp's is private)
    try:
        notes = [*why, *write_package(tmp, cand, ref, part, row, rtol=rtol, atol=atol)]
        check = check_package(tmp, rtol=rtol, atol=atol)
        notes += check.notes
        finish_package(tmp, part, row, check, notes, command, sample)
        files = sorted(p.name for p in tmp.iterdir() if p.name != MARKER)
        _move_into_place(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ReproReport(row.name, check.error, check.reproduced, files, target, check.ref_error, notes,
                       None if sample is None else sample[0])


def _move_into_place(tmp: Path, target: Path) -> None:
    """Rename ``tmp`` to ``target``; a previous package there is moved aside first, then removed
    (nothing moves once a signal has stopped the command, see files.signals)."""
    raise_if_stopped()
    old = None
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
        os.rename(target, old / "pkg")
    try:
        os.rename(tmp, target)
    except BaseException:
        if old is not None:
            os.rename(old / "pkg", target)
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def _parse_module(module: str | None) -> tuple[str | None, int]:
    """``PATH[#CALL]`` -> (path, call)."""
    if module is None:
        return None, 0
    path, sep, k = str(module).partition("#")
    if not path or (sep and not k.isdigit()):
        raise LayertapError(f"--module {module!r} is not PATH or PATH#CALL (CALL a number from 0), e.g. layer1.0#0")
    return path, int(k) if sep else 0


def _check_known(ref: Any, cand: Any, path: str) -> str:
    """An unknown ``--module`` fails before any run: the PyTorch model's modules, else the module
    scopes of the reference file (of the candidate when the reference has none). Where neither file
    has module scopes the rows are the reference's tensors: ``path`` is a tensor name, or the name
    of the node that makes it (returned as that tensor's name)."""
    module = ref.source if isinstance(ref, Model) else ref
    if hasattr(module, "named_modules"):
        known = [name for name, _ in module.named_modules() if name]
    else:
        maps = (ScopeMap.from_model(f.model) for f in (ref, cand) if isinstance(f, ModelFile))  # the candidate's only if needed
        known = next((m.modules() for m in maps if m.source != "none"), [])
        if not known:
            return _tensor_of(ref.model, path) if isinstance(ref, ModelFile) else path
    if path not in known and not any(k.startswith(path + ".") for k in known):
        raise LayertapError(unknown_name("module", path, known, "a PyTorch module path; `layertap layers` lists them"))
    return path


def _tensor_of(model: Any, name: str) -> str:
    """A tensor of a file without module scopes: ``name`` itself, or the one tensor node ``name`` makes."""
    made = [t for n in model.graph.node for t in n.output if t]
    if name in made:
        return name
    outs = [[t for t in n.output if t] for n in model.graph.node if n.name == name]
    if len(outs) == 1 and len(outs[0]) == 1:
        return outs[0][0]
    if len(outs) == 1 and outs[0]:
        raise LayertapError(f"--module {name!r}: node {name!r} makes {len(outs[0])} tensors ({', '.join(outs[0])}); "
                            "give one of them")
    raise LayertapError(unknown_name("tensor", name, made + [n.name for n in model.graph.node if n.name],
                                     "the file carries no module scopes: give a tensor name, or the name of the node "
                                     "that makes it; `layertap layers FILE` lists the tensors"))


def _check_out(out: str | os.PathLike, inputs: Sequence[Path]) -> Path:
    """DIR may be new, empty, or a previous repro package that holds none of the inputs."""
    target = Path(out).absolute()
    if target.exists() and not target.is_dir():
        raise LayertapError(f"-o {out}: it is a file; give a folder for the repro package")
    if target.is_dir() and any(target.iterdir()) and not (target / MARKER).is_file():
        raise LayertapError(f"-o {out}: the folder exists and is not a repro package (no {MARKER}); "
                            "give a new folder, or remove it first")
    for p in inputs:
        if target.resolve() in p.resolve().parents:
            raise LayertapError(f"-o {out}: the input {p} lies inside it; give another folder for the package")
    if not target.parent.is_dir():
        raise LayertapError(f"-o {out}: its folder {target.parent} does not exist")
    return target


def _shown(folder: Path) -> str:
    """The package folder as the user would type it: relative when it lies under the working folder."""
    try:
        return str(Path(folder).absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(folder)


def _source_path(source: Any) -> Path | None:
    if isinstance(source, ModelFile):
        return source.path
    return Path(source) if isinstance(source, (str, os.PathLike)) else None


def _call_of(row: Any) -> tuple[str, int] | None:
    return None if row is None else (row.path, row.call)


def _agree_message(report: Any) -> str:
    worst = max((r.rel_err for r in report.rows if r.rel_err is not None), default=None)
    figure = f" (worst rel error {worst:.3g})" if worst is not None else ""
    return (f"the reference and the candidate agree at every module{figure}: there is no mismatch to reproduce; "
            "pass --module PATH to package one module anyway")


def _no_part_message(report: Any, path: str | None, call: int) -> str:
    """Why ``--module`` has no part: unknown, a call it never made, absorbed, or no counterpart."""
    rows = [r for r in report.rows if r.path == path]
    if not rows:
        return unknown_name("module", str(path), [r.path for r in report.rows if r.path],
                            "a PyTorch module path; `layertap layers` lists them")
    row = next((r for r in rows if r.call == call), None)
    if row is None:
        return (f"module {printable(str(path))} ran {len(rows)} time(s) here; give a call from 0 to {len(rows) - 1}"
                f" (PATH#CALL)")
    if row.fused_into:
        return (f"module {printable(row.name)} has no nodes of its own in the candidate: absorbed into "
                f"{printable(row.fused_into)}; give --module {printable(row.fused_into)}")
    return (f"module {printable(row.name)} has no nodes of its own in the candidate ({row.status}"
            f"{': ' + row.note if row.note else ''}); give a module that has, or its parent")


def _call_text(ref: Any, cand: Any, module: str | None) -> str:
    """The Python call that made the package, as the README names it."""
    shown = ref.source if isinstance(ref, Model) else ref
    ref_text = str(_source_path(shown) or (shown if isinstance(shown, str) else type(shown).__name__))
    mod = f", module={module!r}" if module else ""
    return f"lt.repro({ref_text!r}, args, {str(_source_path(cand))!r}{mod})"
