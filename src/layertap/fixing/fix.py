"""``lt.fix``: convert a float32 model to float16 or int8 and keep in float32 the fewest modules
that make the conversion meet a target on the model's outputs (:mod:`.search`), every set
converted and run for real. Writes FIXED.onnx atomically and, on request, the kept set in each
toolchain's form. With an ONNX reference nothing imports torch."""

from __future__ import annotations

import json
import math
import os
import tempfile
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar, Sequence

from ..comparing import compare
from ..errors import LayertapError, OnnxFileError, one_line
from ..files.reads import note_input
from ..files.writes import atomic_path, atomic_write_bytes, check_output_path, copy_data
from ..onnxfile.modelfile import is_onnx_source, read_model
from ..options import UNSET, RuntimeOptions, SampleOptions, SearchOptions
from ..runtimes.plugins import (
    DEFAULT_RUNTIME,
    YES,
    ProgramPlugin,
    RuntimePlugin,
    RuntimeSettings,
    a_program,
    default_plugin,
    plugin,
    plugin_for,
)
from ..samples.declared import Declared
from ..samples.for_reference import Samples, samples_for
from ..tables import Column, Report
from .configs import Target, check_config_out, check_script, write_configs
from .convert import FORMATS, Converter
from .search import FixStep, Trials, beyond_range, constants_beyond, graph_order, out_of_range, rank, search
from .units import Units, units_of

RANK_SAMPLES = 8  # samples of the layer-by-layer comparison that ranks the modules


def _size(n: Any) -> str:
    return "-" if n is None else f"{n / 1e6:.2f} MB"


def fmt_metric(v: Any) -> str:
    """An output metric with the digits a target like ``cosine:0.9995`` needs.

    Example:
        >>> fmt_metric(0.99987654), fmt_metric(None)
        ('0.999877', '-')
    """
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.6g}"


def _names(xs: Any) -> str:
    xs = list(xs or ())
    return ", ".join(xs[:3]) + (f" (+{len(xs) - 3})" if len(xs) > 3 else "") if xs else "-"


class FixReport(Report):
    """Every set tried (``steps``): modules kept in float32, output metric, size, ONNX Runtime
    latency. ``ok``: the target is met; ``kept`` (module paths) and ``nodes`` (the float32 file's
    node names) are the set FIXED.onnx holds; ``float32`` is the unconverted file run the same way.

    Example:
        >>> r = FixReport([FixStep(0, "plain", [], [], 0, 0.98, False, 100, 1.0)], target="cosine:0.999", to="fp16")
        >>> r.ok, r.kept, "no set" in str(r)
        (False, [], True)
    """

    report_kind: ClassVar[str] = "fix"
    unit: ClassVar[str] = "module"  # what the search keeps (NodeFixReport: ONNX nodes)
    title = "modules kept in float32, step by step"
    columns = [
        Column("step", "Step", justify="right"),
        Column("action", "Action"),
        Column("changed", "Modules", fmt=_names, name=True),
        Column("n_kept", "Kept", justify="right"),
        Column("nodes", "Nodes", justify="right", drop=2),
        Column("metric", "Metric", fmt=fmt_metric, justify="right", no_wrap=True),
        Column("verdict", "Target"),
        Column("size", "MB", fmt=lambda n: "-" if n is None else f"{n / 1e6:.2f}", justify="right", no_wrap=True,
               drop=1),
        Column("latency_ms", "ms", fmt=lambda v: f"{v:.2f}", justify="right", no_wrap=True, drop=1),
    ]

    def __init__(self, steps: Sequence[FixStep], *, target: Any, to: str, nodes: Sequence[str] = (),
                 float32: FixStep | None = None, notes: Sequence[str] = (), tool: str = "", runtime: str = "",
                 out_name: str = "FIXED.onnx", kept_as: str = "kept in float32") -> None:
        super().__init__(steps, notes)
        self.out_name = out_name  # the file the footer speaks of
        self.kept_as = kept_as  # what keeping a module means here (compiled PyTorch: "kept eager")
        if kept_as != "kept in float32":
            self.__dict__["title"] = f"modules {kept_as}, step by step"
        if runtime:  # the trials' latency is measured in the runtime they ran in
            self.columns = [replace(c, header=f"{runtime} ms") if c.key == "latency_ms" else c for c in self.columns]
        self.target, self.to, self.tool, self.float32 = Target.parse(target), to, tool, float32
        self.best = next((s for s in steps if s.chosen), steps[0] if steps else None)
        self.nodes = list(nodes)

    @property
    def ok(self) -> bool:
        return bool(self.best is not None and self.best.ok)

    @property
    def kept(self) -> list[str]:
        return list(self.best.kept) if self.best else []

    @property
    def steps(self) -> list[FixStep]:
        return list(self.rows)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ok": self.ok, "to": self.to, "target": str(self.target), "converter": self.tool,
                               "unit": self.unit, "kept": self.kept, "nodes": self.nodes, "conversions": len(self.rows),
                               "metric": None if self.best is None else self.best.metric,
                               "failed": {s.step: s.error for s in self.rows if s.error}}
        if self.float32 is not None:
            out["float32"] = {"size": self.float32.size, "latency_ms": self.float32.latency_ms}
        if self.notes:
            out["notes"] = list(self.notes)
        return out

    def footer(self) -> list[str]:
        lines = list(self.notes)
        lines += [f"step {s.step} failed, not measured: {s.error}" for s in self.rows if s.error]
        b = self.best
        if b is None:
            return lines
        # short lines: each fits an 80-column terminal but for the module names
        n = len(self.rows)
        tried = f"{n} conversion{'s' if n != 1 else ''}; {self.target.metric} {fmt_metric(self.rows[0].metric)} -> " \
                f"{fmt_metric(b.metric)}"
        what = (f"{self._counted(b)}: {_names(b.kept)}" if b.n_kept else "none (the plain conversion)")
        if self.float32 is not None:
            lines.append(f"float32 file: {_size(self.float32.size)}, {self.float32.latency_ms:.2f} ms")
        if self.ok:
            lines += [f"target {self.target} met ({tried})", f"{self.kept_as}: {what}"]
        else:
            lines += [f"no set within the limit meets target {self.target} ({tried})",
                      f"{self.out_name} holds the best set found, {self.kept_as}: {what}"]
        return lines

    def _counted(self, step: FixStep) -> str:
        return f"{step.n_kept} module{'s' if step.n_kept != 1 else ''} ({step.nodes} nodes)"

    def write_nodes(self, path: str | os.PathLike) -> None:
        """Write :attr:`nodes`, the float32 file's nodes the chosen set keeps, as a JSON list (atomically): the
        ``node_block_list`` onnxconverter-common's ``convert_float_to_float16`` takes (``compare --fp16-block-list``).

        Example:
            >>> import tempfile, os, json
            >>> r = FixReport([FixStep(1, "add", ["fc"], ["fc"], 1, 0.9995, True, 100, 1.0)], target="cosine:0.999",
            ...               to="fp16", nodes=["/fc/Gemm"])
            >>> path = os.path.join(tempfile.mkdtemp(), "block.json"); r.write_nodes(path)
            >>> json.load(open(path))
            ['/fc/Gemm']
        """
        atomic_write_bytes(path, (json.dumps(self.nodes, indent=1) + "\n").encode())


class NodeFixReport(FixReport):
    """A :class:`FixReport` of a file without module scopes: the units kept are its ONNX nodes
    (``kept`` and ``nodes`` are the same node names).

    Example:
        >>> r = NodeFixReport([FixStep(0, "add", ["p2o.Conv.0"], ["p2o.Conv.0"], 1, 0.9999, True, 100, 1.0)],
        ...                   target="cosine:0.999", to="fp16", nodes=["p2o.Conv.0"])
        >>> r.summary()["unit"], str(r).splitlines()[-1]
        ('node', 'kept in float32: 1 ONNX node: p2o.Conv.0')
    """

    unit: ClassVar[str] = "node"
    title = "ONNX nodes kept in float32 (the file has no module scopes), step by step"
    columns = [Column("changed", "Nodes", fmt=_names, name=True) if c.key == "changed" else c
               for c in FixReport.columns if c.key != "nodes"]

    def _counted(self, step: FixStep) -> str:
        return f"{step.n_kept} ONNX node{'s' if step.n_kept != 1 else ''}"


def fix(ref: Any, args: Any = None, *, to: str = "fp16", out: str | os.PathLike | None = "fixed.onnx",
        target: str | Target = "cosine:0.999", samples: int | Sequence[Any] | None = UNSET,
        calib: str | os.PathLike | Sequence[Any] | None = None, keep: Sequence[str] = (), max_float: int | None = None,
        config_out: str | os.PathLike | None = None, sample_options: SampleOptions | None = None,
        search_options: SearchOptions | None = None) -> FixReport:
    """Convert ``ref`` to ``to`` (``fp16`` or ``int8``) keeping the fewest modules in float32 that meet ``target``.

    Args:
        ref: a float32 ONNX file, or a PyTorch model (an ``nn.Module``, a MODEL spec, or a
            :class:`~layertap.options.Model` with its weights and method), exported first as ``lt.export``
            does, with ``args``.
        args: one sample (a dict by input name, an array, or arrays in input order; ``--input`` specs for a
            PyTorch ``ref``); a PyTorch ``ref`` without it is exported with its spec's default input, else
            the first of ``samples`` (a folder / ``.npz``).
        samples: ``N`` seeded random samples, or a list of samples, or a folder / ``.npz``
            (images, ``.npy``/``.npz`` files, a ``datasets`` folder); the target is judged over all.
        calib: int8 calibration samples (a folder / ``.npz`` or a list); default the comparison samples.
        target: ``cosine:0.999``, ``rel:1e-2``, ``sqnr:30``, ``top1:0.99`` or ``max_abs:1e-3`` on the model's
            outputs (where they are near zero on every sample and the target is not met, a cosine is float16's
            noise there: the report says so).
        keep: module paths always kept in float32. ``max_float``: at most this many modules kept. In a
            file without module scopes the units are its ONNX nodes: ``keep`` takes node names (or the
            tensor names they make), ``.kept`` holds node names and the report is a :class:`NodeFixReport`.
        config_out: a folder for the kept set in each toolchain's form (:func:`.configs.write_configs`);
            for float16 also ``convert.py``, which makes FIXED.onnx again (run once here to check it).
        out: where FIXED.onnx goes (``None``: no file, the report only).
        sample_options: ``samples`` and ``seed`` as an object (:class:`~layertap.options.SampleOptions`;
            its ``inputs`` is a folder / ``.npz`` of samples, ``limit`` reads its first N); ``samples=``
            given replaces its field.
        search_options: how the search runs (:class:`~layertap.options.SearchOptions`: ``naive``,
            ``rank_report``, ``exporter`` of a PyTorch ``ref``, ``on_step`` called with each step as it is
            measured, ``runtime="executorch"``: an int8 ExecuTorch program, each set lowered and run in ExecuTorch
            (also when ``out`` ends in ``.pte``; :mod:`.program_fix`)).

    Returns:
        A :class:`FixReport` (``.ok``, ``.kept``, ``.nodes``, ``.steps``).

    Example:
        >>> import layertap as lt, tempfile, os
        >>> from layertap.onnxfile.samples import write_tiny_model
        >>> d = tempfile.mkdtemp(); src = write_tiny_model(d)
        >>> r = lt.fix(src, to="fp16", out=os.path.join(d, "fixed.onnx"), samples=2)
        >>> r.ok, r.kept, len(r.steps)
        (True, [], 1)
    """
    goal = Target.parse(target)
    sampling = SampleOptions.merged(sample_options, samples=samples)
    if isinstance(sampling.samples, (str, os.PathLike)):  # samples= may name a folder / .npz, as inputs= does
        sampling = replace(sampling, inputs=sampling.samples, samples=None)
    search_by = search_options or SearchOptions()
    runtime = _runtime(search_by, out)
    if runtime.form == "program":
        return _fix_program(runtime, ref, args, to, out, goal, sampling, calib, keep, max_float, config_out,  # type: ignore[arg-type]
                            search_by)
    if to not in FORMATS:
        raise LayertapError(f"unknown conversion --to {to!r}; use one of {', '.join(FORMATS)}")
    if max_float is not None and (not isinstance(max_float, int) or max_float < 0):
        raise LayertapError(f"--max-float must be a number of modules (nodes, in a file without module scopes) >= 0, "
                            f"got {max_float!r}")
    with tempfile.TemporaryDirectory(prefix="layertap-fix-") as tmp:
        folder = Path(tmp)
        ref_path, args = _reference_file(ref, args, sampling, folder, search_by.exporter)
        out_path = _check_out(out, ref_path, config_out)
        model = _load(ref_path)
        declared = Declared.of(model)
        feeds = _samples(model, ref_path, args, sampling).feeds(declared, "--inputs" if sampling.inputs else "input")
        calib_feeds = _calib(calib, model, declared, feeds) if to == "int8" else []
        modules = units_of(model)
        notes = _unit_notes(modules)
        forced = modules.check(list(keep))
        trials = Trials(model, Converter(to, folder, calib_feeds), modules, feeds, goal, folder, search_by.on_step,
                        runtime.open(RuntimeSettings(**search_by.runtime_settings)))
        base = trials.baseline()
        plain = trials.trial(forced, "keep" if forced else "plain", forced)
        if not plain.ok or to == "fp16":
            report = search_by.rank_report or _rank_report(ref_path, trials.files[plain.step], feeds, runtime.name,
                                                           search_by.runtime_settings)
            constants = constants_beyond(model, modules) if to == "fp16" else set()
            groups = rank(report, to, modules, constants)
            required = beyond_range(report, to, modules, constants)
            trials.require(required)
            if required:
                notes.append(f"kept in float32 in every set (values beyond float16's range): {', '.join(required)}")
            forced = list(dict.fromkeys(forced + required))
            naive = search_by.naive
            search(trials, graph_order(modules, groups) if naive else groups, forced, max_float, naive=naive,
                   start=out_of_range(report, to, modules, constants))
        best = trials.best()
        best.chosen = True
        notes += _search_notes(trials, modules, best, to)
        nodes = modules.names(best.kept)
        if out_path is not None:
            _publish(trials.files[best.step], out_path)
        if config_out is not None:
            write_configs(config_out, best.kept, nodes, to, unit=modules.kind)
            if to == "fp16":
                notes.append(check_script(config_out, ref_path, trials.files[best.step], folder))
        kind = NodeFixReport if modules.kind == "node" else FixReport
        return kind(trials.steps, target=goal, to=to, nodes=nodes, float32=base, tool=trials.converter.tool, notes=notes,
                    runtime=getattr(runtime, "short", runtime.title))


def _runtime(search_by: SearchOptions, out: Any) -> RuntimePlugin:
    """The runtime the conversions run in: the one named, else the one that runs ``out`` (a ``.pte``), else
    ONNX Runtime; a runtime that declares no fix is refused with why."""
    runtime = plugin(search_by.runtime) if search_by.runtime is not None else plugin_for(out) or default_plugin()
    if runtime.matrix.get("fix") != YES:
        raise LayertapError(f"fix does not run in {runtime.title}: {runtime.matrix.get('fix', 'not declared')}")
    return runtime


def _fix_program(runtime: ProgramPlugin, ref: Any, args: Any, to: str, out: Any, goal: Target, sampling: SampleOptions,
                 calib: Any, keep: Sequence[str], max_float: int | None, config_out: Any,
                 search_by: SearchOptions) -> FixReport:
    """A program ``runtime`` makes from the model at ``to`` with the fewest modules kept (:mod:`.programs`)."""
    from .programs import fix_program  # noqa: PLC0415 -- it loads torch, for a program only

    formats = getattr(runtime, "fix_to", ("int8",))
    if to not in formats:
        raise LayertapError(f"--runtime {runtime.name} makes programs at {', '.join(formats)} ({runtime.quantizer}): "
                            f"use --to {formats[0]}")
    if is_onnx_source(ref):
        raise LayertapError(f"{a_program(runtime)} is lowered from the PyTorch model: give MODEL, not an ONNX file")
    settings = dict(search_by.runtime_settings)
    fitted = getattr(runtime, "fix_settings", None)  # a runtime whose settings follow --to (compiled: autocast)
    settings = fitted(to, settings) if fitted is not None else settings
    runtime.open(RuntimeSettings(**settings))
    steps, notes, tool = fix_program(runtime, ref, args, to=to, out=out, target=goal, sampling=sampling, calib=calib,
                                     keep=keep, max_float=max_float, config_out=config_out, on_step=search_by.on_step,
                                     settings=settings)
    return FixReport(steps, target=goal, to=to, nodes=[], notes=notes, tool=tool, runtime=getattr(runtime, "short", runtime.title),
                     out_name=getattr(runtime, "fix_out", f"FIXED{runtime.suffixes[0]}"),
                     kept_as=getattr(runtime, "kept_as", "kept in float32"))


def _unit_notes(units: Units) -> list[str]:
    """What the report says of the units of a file without module scopes: its nodes."""
    if units.kind != "node":
        return []
    notes = ["the file carries no module scopes: the units kept in float32 are its ONNX nodes, by node name"]
    unnamed = getattr(units, "unnamed", 0)
    if unnamed:
        notes.append(f"{unnamed} node(s) have no name: no converter can keep them in float32, so none is tried")
    return notes


def _search_notes(trials: Trials, modules: Units, best: FixStep, to: str) -> list[str]:
    """What the search changed in the converter's files, and why a target it did not meet cannot judge these
    outputs (:meth:`~.configs.Target.noise`)."""
    notes = []
    if trials.converter.retyped:
        notes.append(_retyped_note(list(trials.converter.retyped)))
    if trials.converter.unshared:
        shared = list(trials.converter.unshared)
        notes.append(f"weights the kept {modules.kind}s share with others, copied for them (each side keeps its own "
                     f"type): {', '.join(shared[:3])}{f' (+{len(shared) - 3})' if len(shared) > 3 else ''}")
    noise = None if best.ok else trials.target.noise(trials.refs, to)
    return notes + ([noise] if noise else [])


def _retyped_note(names: list[str]) -> str:
    """What layertap changed in the converter's files so that ONNX Runtime loads them."""
    more = f" (+{len(names) - 3})" if len(names) > 3 else ""
    return f"types onnxconverter-common wrote and ONNX Runtime refuses, repaired (as by convert.py): {', '.join(names[:3])}{more}"


def _reference_file(ref: Any, args: Any, sampling: SampleOptions, folder: Path, exporter: str) -> tuple[Path, Any]:
    """The float32 ONNX file and the sample ``args`` stand for: ``ref`` itself, or a PyTorch model loaded and
    exported into ``folder`` (with ``args``, ``--input`` specs drawn, a spec's default input, else the first
    of the samples ``sampling.inputs`` holds, then not a sample of its own)."""
    if is_onnx_source(ref):
        path = Path(ref)
        if not path.is_file():
            raise LayertapError(f"ONNX file '{path}' does not exist")
        return path, args
    from ..exporting.export import export
    from ..pytorch.reference import example_call, load

    loaded = load(ref)
    kwargs = loaded.kwargs
    if args is None and sampling.inputs is not None:
        from ..pytorch.example_inputs import example_from_samples

        args = example_from_samples(loaded.module, sampling.inputs)
    elif args is None and loaded.info is None:
        raise LayertapError("a PyTorch reference needs one sample to export with (args=...)")
    else:
        args, kwargs, _ = example_call(loaded, args, SampleOptions(seed=sampling.seed))
        if set(kwargs) - set(loaded.kwargs):
            raise LayertapError("fix exports the model with positional inputs only; give unnamed --input specs")
    path = folder / "reference.onnx"
    export(loaded.module, args, path, method=loaded.method, kwargs=kwargs or None, exporter=exporter)
    return path, (None if sampling.inputs is not None else args)


def _check_out(out: str | os.PathLike | None, ref: Path, config_out: Any) -> Path | None:
    note_input(ref)
    if config_out is not None:
        check_config_out(config_out)
    return None if out is None else check_output_path(out, inputs=(str(ref),), suffixes=(".onnx",))


def _load(path: Path) -> Any:
    """The float32 file with its weights (read once: the checks every command makes, then its external data)."""
    from onnx.external_data_helper import load_external_data_for_model

    mf = read_model(path)
    try:
        load_external_data_for_model(mf.model, str(mf.folder))
    except Exception as e:  # noqa: BLE001
        raise OnnxFileError(f"cannot read the weights of ONNX file '{path}': {one_line(e, first=True)}") from None
    return mf.model


def _samples(model: Any, path: Path, args: Any, sampling: SampleOptions) -> Samples:
    """The samples for the float32 file (:func:`~layertap.samples.for_reference.samples_for`): given (``args``, then
    a list of samples after it), read from ``sampling.inputs`` (its first ``sampling.limit``), drawn from
    ``--input`` specs, or ``N`` random at its declared inputs (default 1, seeds after ``sampling.seed``)."""
    listed = sampling.samples
    if args is not None and listed is not None and not isinstance(listed, int):
        # the sample a PyTorch REF was exported with comes first: compare --fp16-block-list hands the rest after it
        args, sampling = None, replace(sampling, samples=[args, *listed])
    return samples_for(path, args, sampling, shapes_from=model, folder=path.parent)


def _calib(calib: Any, model: Any, declared: list[Declared], feeds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """int8 calibration feeds: a folder / ``.npz`` read as ``--inputs`` is, or samples given; default ``feeds``."""
    if calib is None:
        return feeds
    source = SampleOptions(inputs=calib) if isinstance(calib, (str, os.PathLike)) else SampleOptions(samples=list(calib))
    return samples_for(None, None, source, shapes_from=model).feeds(declared, "--calib")


def _rank_report(ref: Path, plain: Path, feeds: list[dict[str, Any]], runtime: str, settings: dict[str, Any]) -> Any:
    """The plain conversion (run in ``runtime`` with its ``settings``) vs REF (in the default runtime), module by
    module, with each module's own error (``local_rel``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # float16 overflow in the parts run locally: expected here
        return compare(ref, None, plain, samples=feeds[:RANK_SAMPLES], local=True,
                       runtime_options=RuntimeOptions(runtime=DEFAULT_RUNTIME, cand_runtime=runtime,
                                                      ov_precision=settings.get("ov_precision"),
                                                      ov_device=settings.get("ov_device")))


def _publish(src: Path, out: Path) -> None:
    with atomic_path(out) as tmp:
        copy_data(src, tmp)
