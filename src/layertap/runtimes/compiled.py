"""Compiled PyTorch as a runtime plug-in (``inductor``): a ``torch.compile`` result (any backend, mode and
options), any other ``nn.Module`` run eagerly (another checkpoint, a quantised copy), or an AOTInductor package
(``.pt2``), each a ``"program"`` candidate (:class:`~.plugins.ProgramPlugin`).

A module candidate is judged against float64: the reference is the model run in float64, the ideal run the
model run eagerly at the candidate's dtype (float32, or the ``--autocast`` dtype on both sides), so a row
passes while the compiled kernels stay as close to float64 as eager does (within
:data:`~layertap.metrics.FORMAT_MULTIPLE` times eager's own error, plus the tolerance), and one fails where
they lose far more. Module rows come from a copy of the candidate's module compiled with a tap at every
module (:class:`~layertap.pytorch.compiled.HookTaps`); its outputs are checked against the untapped
candidate's on every sample. Graph breaks are notes on the rows of the modules they happened in.

``fix --runtime inductor`` keeps modules eager (``torch.compiler.disable`` on their ``forward``) and writes
the kept set as ``keep-eager.json`` (:func:`layertap.keep_eager` applies it). The PyTorch side lives in
:mod:`layertap.pytorch.compiled` and :mod:`layertap.pytorch.aoti`, imported when a candidate is made.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import LayertapError, OnnxFileError, one_line, unknown_name
from ..files.writes import atomic_write_bytes
from ..inputs import InputSpec
from ..numformats import PRECISIONS, Format
from ..onnxfile.formats import TensorFormats
from ..onnxfile.tensor_table import OnnxLayers
from .executorch import Sidecar, names_by_call, program_layers, retapped, run_program, with_repeats
from .plugins import VERBS, YES, RuntimeSettings, TappedProgram
from .protocol import InputInfo, RuntimeInfo

#: a module candidate's name in reports: ``torch.compile (inductor)``, ``PyTorch eager``
TITLE = "compiled PyTorch"


def is_module(source: Any) -> bool:
    """Whether ``source`` is an ``nn.Module`` (a compiled one included), without importing torch."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(source, torch.nn.Module)


class CallForm:
    """How a module is called: its positional and keyword arguments, the tensors among them (in
    :func:`~layertap.pytorch.wrapper.input_names`' order: positional, then keyword) filled from a feed, everything
    else (a flag, ``None``) as the first sample gave it.

    Example:
        >>> form = CallForm((1, None), {"mask": 2, "causal": True}, is_tensor=lambda v: type(v) is int)
        >>> form.fill([10, 20])
        ((10, None), {'mask': 20, 'causal': True})
    """

    def __init__(self, args: tuple, kwargs: dict, is_tensor: Callable[[Any], bool] | None = None) -> None:
        self.args, self.kwargs = tuple(args), dict(kwargs)
        self.is_tensor = is_tensor or (lambda v: hasattr(v, "detach") and hasattr(v, "shape"))

    def tensors(self, args: tuple, kwargs: dict) -> list[Any]:
        """The tensors of one call's arguments, in fill order."""
        return [v for v in (*args, *kwargs.values()) if self.is_tensor(v)]

    def fill(self, tensors: Sequence[Any]) -> tuple[tuple, dict]:
        """The arguments of a call on ``tensors`` (one per tensor argument, in order)."""
        it = iter(tensors)
        args = tuple(next(it) if self.is_tensor(a) else a for a in self.args)
        return args, {k: next(it) if self.is_tensor(v) else v for k, v in self.kwargs.items()}


class ModuleEngine:
    """A module run as a candidate (an :class:`~.protocol.Engine`): a feed by input name in, its flattened
    tensors by name out (``named``: the names of one call's values, from a :class:`HookTaps`); ``form``: how its
    arguments are made from the feed (default: the inputs in order, positionally)."""

    def __init__(self, module: Any, inputs: list[InputInfo], compilation: Any, named: Callable[[Any], dict] | None,
                 own: list[str], form: CallForm | None = None) -> None:
        self.module, self._inputs, self.compilation, self.named, self.own = module, inputs, compilation, named, own
        self.form = form
        self.runs = 0
        self.candidate: Any = module

    def get_inputs(self) -> list[InputInfo]:
        return list(self._inputs)

    def output_names(self) -> list[str]:
        return list(self.own)

    def run(self, names: Sequence[str] | None, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from ..pytorch.taps import output_tensors
        from ..pytorch.values import tensor_to_numpy

        tensors = _tensors(feed, self._inputs)
        args, kwargs = self.form.fill(tensors) if self.form is not None else (tuple(tensors), {})
        try:
            with self.compilation.running():
                got = self.module(*args, **kwargs)
        except Exception as e:
            from ..pytorch.compiled import compile_error

            found = compile_error(e, getattr(self.module, "_orig_mod", self.module))
            if found is None:
                raise
            raise found from e
        self.runs += 1
        values = self.named(got) if self.named is not None else output_tensors(got)
        out = {n: tensor_to_numpy(v, copy=True) for n, v in values.items()}
        return out if names is None else {n: out[n] for n in names if n in out}


def _tensors(feed: dict[str, np.ndarray], inputs: list[InputInfo]) -> list[Any]:
    import torch

    missing = [i.name for i in inputs if i.name not in feed]
    if missing:
        raise LayertapError(f"the candidate needs the input {missing[0]!r}; it takes {', '.join(i.name for i in inputs)}")
    return [torch.from_numpy(np.ascontiguousarray(feed[i.name])) for i in inputs]


class CompiledRuntime:
    """What ran a compiled candidate, for reports (:class:`~.protocol.Runtime`'s describing half); files,
    parts and exposed tensors are refused with what to do instead."""

    name = "inductor"
    optimize = True
    carries_branches = False

    def __init__(self, what: str = "torch.compile (inductor)", precision: str = "float32") -> None:
        self.what, self.precision = what, precision

    def open(self, model: Any, outputs: Sequence[Any] = (), *, only: bool = False) -> Any:
        raise LayertapError("the inductor runtime runs PyTorch modules and AOTInductor packages (.pt2), not ONNX "
                            "files: compare MODEL with torch.compile(MODEL) (layertap compare MODEL --cand-runtime "
                            "inductor), or run the ONNX file in ort")

    def open_tapped(self, source: Any, tensors: Sequence[str]) -> Any:
        return self.open(source)

    def open_part(self, source: Any, part: Any) -> Any:
        raise LayertapError("--local (local=True) runs parts of an ONNX graph; a compiled module runs whole: "
                            "compare it without --local")

    def open_file(self, path: Path, *, timing: bool = False) -> Any:
        return PLUGIN.engine(path)

    def settings(self) -> str:
        return ""

    def rounding_note(self) -> str:
        return ""

    def exposable(self, model: Any) -> set[str] | None:
        return set()

    def describe(self) -> RuntimeInfo:
        import torch

        return RuntimeInfo(self.what, torch.__version__, "CPU", self.precision)


class _CompiledPlugin:
    """Compiled PyTorch as a runtime plug-in (see the module doc)."""

    name = "inductor"
    title = TITLE
    form = "program"
    suffixes = (".pt2",)
    matrix = {**{verb: YES for verb in VERBS},
              "compare --local": "a compiled module runs whole: its kernels fuse across modules, and a part run "
                                 "alone would be another compile",
              "compare --steps": "not yet: decode steps feed a KV cache the ONNX decoder files name",
              "repro": "a repro package is a part of an ONNX graph run alone; for a compiled module, torch's own "
                       "accuracy minifier (TORCHDYNAMO_REPRO_LEVEL=4) cuts the graph"}
    quantizer = "torch.compile (modules kept eager with torch.compiler.disable)"
    #: what ``fix`` makes: the autocast dtype the model is compiled at (``fp32``: none), and the file it writes
    fix_to = ("fp32", "bf16", "fp16")
    fix_out = "keep-eager.json"
    kept_as = "kept eager"

    def __init__(self) -> None:
        self.settings = RuntimeSettings()

    def claims(self, source: Any) -> bool:
        """An in-memory candidate this runtime runs: any ``nn.Module``."""
        return is_module(source)

    def open(self, settings: RuntimeSettings) -> CompiledRuntime:
        settings.refuse(self.name, ("autocast", "compile_mode", "compile_backend"),
                        "a compiled module runs in PyTorch, on the model's device")
        self.settings = settings
        if settings.autocast not in (None, "bf16", "fp16"):
            raise LayertapError(unknown_name("autocast dtype", str(settings.autocast), ["bf16", "fp16"]))
        return CompiledRuntime(precision=PRECISIONS[settings.autocast or "fp32"])

    def fix_settings(self, to: str, settings: dict[str, Any]) -> dict[str, Any]:
        """The settings a fix at ``to`` runs with: ``to`` is the autocast dtype."""
        return {**settings, "autocast": None if to == "fp32" else to}

    def candidate(self, model: Any) -> Any:
        """The reference ``model`` compiled as the settings say (``--cand-runtime inductor``)."""
        from ..pytorch.compiled import compiled

        backend = self.settings.compile_backend or "inductor"
        return compiled(model, backend=backend, mode=self.settings.compile_mode)

    def engine(self, path: Any) -> PackageEngine:
        return PackageEngine(Path(path))

    def input_specs(self, path: Any) -> list[InputSpec]:
        if is_module(path):
            return []
        engine = self.engine(path)
        return [InputSpec(None, tuple(int(d) if isinstance(d, int) else 1 for d in i.shape or ()),
                          _DTYPES.get(i.type, "float32")) for i in engine.get_inputs()]

    def layers(self, path: Path) -> OnnxLayers:
        return program_layers(path, self.engine(path), "AOTInductor package", PACKAGE_UNTAPPED)

    def run(self, path: Path, inputs: Any, taps: Sequence[str], *, seed: int,
            notify: Callable[[str], None] | None) -> dict[str, Any]:
        return run_program(path, inputs, taps, seed=seed, notify=notify, engine=self.engine(path))

    def tapped(self, model: Any, method: Any, path: Any, runs: list[tuple[tuple, dict]], work: Path,
               wanted: Callable[[str], bool]) -> TappedProgram:
        if not is_module(path):
            return tapped_package(model, method, Path(path), runs, work, wanted)
        return tapped_module(model, method, path, runs, wanted, self.settings.autocast)

    def lower_kept(self, model: Any, method: Any, samples: list[tuple], calibration: list[tuple], to: str,
                   kept: Sequence[str], out: Path, memo: dict[str, Any] | None = None) -> Any:
        """The model with the modules ``kept`` eager, compiled as the settings say, as an engine (``out``: its
        ``keep-eager.json``)."""
        from ..pytorch.compiled import Compilation, copy_with, kept_json
        from ..pytorch.wrapper import input_names

        if to not in ("fp32", "bf16", "fp16"):
            raise LayertapError(f"the inductor runtime keeps modules eager at fp32, bf16 or fp16 (--autocast), not "
                                f"{to}: use --to fp32 (or bf16/fp16: the autocast dtype)")
        autocast = None if to == "fp32" else to
        trial = self.candidate(copy_with(model, kept))
        compilation = Compilation(trial.dynamo_ctx, autocast)
        atomic_write_bytes(out, (json.dumps(kept_json(kept, compilation), indent=1) + "\n").encode())
        names = input_names(model, method, tuple(samples[0]), {})
        inputs = [InputInfo(n, "tensor(float)", list(t.shape)) for n, t in zip(names, samples[0])]
        engine = ModuleEngine(trial, inputs, compilation, None, ["output"])
        engine.candidate = trial  # what compare takes for this set
        return engine

    def kept_recipe(self, kept: Sequence[str]) -> tuple[str, dict[str, Any]]:
        """The kept set as ``keep-eager.json`` (what :func:`layertap.keep_eager` reads)."""
        from ..pytorch.compiled import Compilation, kept_json

        return "keep-eager.json", kept_json(kept, Compilation(None, self.settings.autocast))


PLUGIN = _CompiledPlugin()


def tapped_module(model: Any, method: Any, candidate: Any, runs: list[tuple[tuple, dict]],
                  wanted: Callable[[str], bool], autocast: str | None) -> TappedProgram:
    """A module candidate with a value for every module ``wanted``: the reference is ``model`` in float64, the
    ideal run a copy of the candidate's module with a tap at every such module, run eagerly at the candidate's
    dtype. Under inductor the rows are the buffers the compiled program writes (:func:`_rows_from_buffers`:
    one compile); under another backend, or where dynamo broke the graph, a copy compiled with the taps inside
    (:func:`_rows_from_hooks`)."""
    # the PyTorch side loads with a compiled candidate only
    from ..pytorch.compiled import HookTaps, compilation_of, own_frames, tappable
    from ..pytorch.lowering import weight_record
    from ..pytorch.wrapper import input_names

    module, compilation = compilation_of(candidate, autocast)
    args, kwargs = runs[0]
    form = CallForm(tuple(args), kwargs)
    names = input_names(module, method, tuple(args), kwargs)
    inputs = [InputInfo(n, "tensor(float)", list(a.shape)) for n, a in zip(names, form.tensors(tuple(args), kwargs))]
    twin = own_frames(copy.deepcopy(module))
    paths = tappable(twin, wanted)
    taps = HookTaps(twin, method, paths)
    with compilation.running():
        eager = taps.named(taps(*args, **kwargs))  # the eager run names the calls
    feed = {i.name: t.detach().cpu().numpy() for i, t in zip(inputs, form.tensors(tuple(args), kwargs))}
    rows = _rows_from_buffers(module, method, compilation, taps, eager, paths, inputs, form, feed)
    if rows is None or rows.tapped is None:
        rows = _rows_from_hooks(candidate, module, compilation, taps, inputs, form, feed, rows)

    def ideal(sample: tuple, sample_kwargs: dict | None = None) -> dict[str, np.ndarray]:
        from ..pytorch.values import tensor_to_numpy

        with compilation.running():
            values = taps.named(taps(*sample, **(sample_kwargs or {})))
        return {n: tensor_to_numpy(v, copy=True) for n, v in values.items()}

    notes: dict[str, str] = {}
    for b in rows.breaks:
        for path in b.modules:
            notes[path] = f"graph break in its forward ({b.reason}): the op there ran eager, between compiled graphs"
    program = TappedProgram(Path(compilation.describe()), rows.plain, CompiledRuntime(compilation.describe(),
                            compilation.precision), list(taps._own), rows.tapped, rows.names,
                            formats=TensorFormats(default=Format(compilation.precision)), ideal=ideal,
                            weights=weight_record(module) if module is not model else None,
                            absorbed=rows.absorbed, missing=rows.missing, rows_from=rows.rows_from,
                            fused_by=("inductor", "kernel"))
    _judge_against_float64(program, model, method, tuple(args), kwargs, compilation)
    program.row_notes = notes
    program.shown = type(module).__name__
    program.notes = [*([_breaks_note(rows.breaks)] if rows.breaks else []), *rows.notes, *program.notes]
    return program


@dataclass
class _Rows:
    """Where a module candidate's rows come from: the program (``plain``), the program that hands out module
    values (``tapped``; ``None`` until made), their names by module call, and the calls without one."""

    plain: ModuleEngine
    tapped: ModuleEngine | None = None
    names: dict[tuple[str, int], tuple[str, ...]] = field(default_factory=dict)
    breaks: list[Any] = field(default_factory=list)
    absorbed: dict[tuple[str, int], tuple[str, int]] = field(default_factory=dict)
    missing: dict[tuple[str, int], str] = field(default_factory=dict)
    rows_from: str = ""
    notes: list[str] = field(default_factory=list)


#: what a report says when dynamo compiled no graph of the candidate's module at all
NOTHING_COMPILED = ("dynamo compiled no graph of the model: it ran eagerly, so the compiled rows are eager PyTorch's "
                    "(dynamo skips nn.RNN/LSTM/GRU modules unless torch._dynamo.config.allow_rnn = True, and frames "
                    "it cannot trace)")


#: how rows read an inductor program's own buffers
ROWS_FROM_BUFFERS = ("module rows are the buffers the compiled program itself writes, read as it runs (its kernels "
                     "are those of a plain compile: compiled once); a module inductor fused into a later kernel is "
                     "absorbed there; the output row is the candidate's own")


def _rows_from_buffers(module: Any, method: Any, compilation: Any, taps: Any, eager: dict[str, Any], paths: set[str],
                       inputs: list[InputInfo], form: CallForm, feed: dict[str, np.ndarray]) -> _Rows | None:
    """Rows from the buffers of ``module`` compiled once by inductor, its wrapper storing each module's value
    (``None``: another backend, or a torch whose inductor this cannot read); with graph breaks, only the
    program (``tapped`` is ``None``: the breaks' modules ran eager, outside any buffer)."""
    from ..pytorch import inductor_taps
    from ..pytorch.compiled import breaks_in

    if compilation.ctx is None or compilation.backend() != "inductor" or not inductor_taps.available():
        return None
    made = inductor_taps.BufferTaps(module, method, compilation, paths)
    own = list(taps._own)
    plain = ModuleEngine(made.runner(record=False), inputs, compilation, made.wrapper.named, own, form)
    tapped = ModuleEngine(made.runner(record=True), inputs, compilation, made.named, own, form)
    tapped.run(None, feed)  # compiled here, once: the plain engine runs the same program
    breaks = breaks_in(made.wrapper.model, made.collected()) if made.collected is not None else []
    if breaks or made.plan.unread or (taps.names and not made.last):  # rows from hooks, beside this program
        return _Rows(plain, breaks=breaks, notes=[] if made.plan.graphs else [NOTHING_COMPILED])
    rows = _Rows(plain, tapped, rows_from=ROWS_FROM_BUFFERS)
    _buffer_rows(rows, taps.names, eager, made)
    return rows


def _buffer_rows(rows: _Rows, calls: dict[tuple[str, int], tuple[str, ...]], eager: dict[str, Any], made: Any) -> None:
    """Name each module call's value among the buffers ``made`` stored (one the module's shape, or a reshape of
    one); a call that computes nothing in the program (an ``Identity``) reads the last earlier call whose eager
    value it is; the others are absorbed into the call whose buffer the kernel that computed them writes, or
    missing, with why."""
    import torch

    for key, names in calls.items():
        got, shape = made.last.get(key), tuple(eager[names[0]].shape)
        items = _tuple_items(key, names, eager, made.last) if len(names) > 1 else {}
        if items:
            made.items.update(items)
            rows.names[key] = names
        if len(names) != 1 or got is None:
            continue
        if key in made.plan.reshaped and got.numel() == eager[names[0]].numel():
            made.shapes[key] = shape
        if tuple(got.shape) == shape or key in made.shapes:
            rows.names[key] = names
    order = list(calls)
    for i, (key, names) in enumerate(calls.items()):
        if key in rows.names:
            continue
        holder = made.plan.absorbed.get(key)
        if holder in rows.names:
            rows.absorbed[key] = holder
            continue
        value = eager[names[0]]
        same = None if len(names) != 1 or key in made.plan.seen else next(
            (k for k in reversed(order[:i]) if k in rows.names and eager[rows.names[k][0]].shape == value.shape
             and torch.equal(eager[rows.names[k][0]], value)), None)
        if same is not None:
            rows.names[key] = rows.names[same]
        else:
            rows.missing[key] = _no_buffer(names, made.last.get(key), eager, key in made.plan.seen)


def _tuple_items(call: tuple[str, int], names: tuple[str, ...], eager: dict[str, Any],
                 last: dict[tuple, Any]) -> dict[tuple, str]:
    """The name of each value a call returning several stored (``(path, call, k)`` -> ``PATH#CALL[i]``): matched
    by shape where the module's values differ in shape, else in order where the shapes agree in order; none
    where a value has no buffer or the match is not certain."""
    got = sorted(((k, v) for k, v in last.items() if len(k) == 3 and k[:2] == call), key=lambda kv: kv[0][2])
    shapes = [tuple(eager[n].shape) for n in names]
    if len(got) != len(names):
        return {}
    if len(set(shapes)) == len(shapes):
        by_shape = {tuple(v.shape): k for k, v in got}
        return {by_shape[s]: n for s, n in zip(shapes, names)} if set(by_shape) == set(shapes) else {}
    if [tuple(v.shape) for _, v in got] == shapes:
        return {k: n for (k, _), n in zip(got, names)}
    return {}


def _no_buffer(names: tuple[str, ...], got: Any, eager: dict[str, Any], seen: bool) -> str:
    """Why a module call has no buffer of an inductor program to read."""
    if len(names) != 1:
        return "it returns several tensors: an inductor program's buffers are read for modules returning one"
    if got is not None:
        return (f"the buffer inductor wrote for it has shape {list(got.shape)}, not the module's "
                f"{list(eager[names[0]].shape)}")
    if not seen:
        return "it computes nothing in the compiled program: it returns its input (as Identity, and Dropout in eval)"
    return ("no buffer of the compiled program holds its value: it is a view of another value, or inductor computed "
            "it inside a kernel that writes no module's value")


def _rows_from_hooks(candidate: Any, module: Any, compilation: Any, taps: Any, inputs: list[InputInfo],
                     form: CallForm, feed: dict[str, np.ndarray], rows: _Rows | None) -> _Rows:
    """Rows from a copy of the candidate compiled with ``taps`` inside its graph (a second compile), beside the
    program ``rows`` already made (default: the candidate itself)."""
    from ..pytorch.compiled import breaks_in, explained, graph_breaks

    own = list(taps._own)
    plain = rows.plain if rows is not None else ModuleEngine(candidate if compilation.ctx is not None else module,
                                                             inputs, compilation, None, own, form)
    made, collected = explained(compilation, taps)
    tapped = ModuleEngine(made, inputs, compilation, taps.named, own, form)
    if rows is not None and rows.breaks:
        breaks = rows.breaks
    elif collected is not None:  # its compile collects the graph breaks: compiled now, before the rows are planned
        tapped.run(None, feed)
        breaks = breaks_in(taps.model, collected())
    else:
        args, _ = form.fill(_tensors(feed, inputs))
        breaks = graph_breaks(taps.model, taps, tuple(args), compilation.ctx)
    return _Rows(plain, tapped, dict(taps.names), breaks, notes=rows.notes if rows is not None else [])


def _judge_against_float64(program: TappedProgram, model: Any, method: Any, args: tuple, kwargs: dict,
                           compilation: Any) -> None:
    """The reference run of a module candidate: the model in float64 (``versus`` names the three runs). A model
    that does not run in float64 (a cast to float32 inside it) is the reference as given, and a note says so."""
    import torch

    from ..pytorch.compiled import float64_args, float64_twin
    from ..pytorch.taps import (
        bound_method,
        output_tensors,
    )

    reference = float64_twin(model)
    try:
        with torch.no_grad():
            a, k = float64_args(args, kwargs)
            out = output_tensors(bound_method(reference, method)(*a, **k))
        lower = [n for n, t in out.items() if t.is_floating_point() and t.dtype != torch.float64]
        why = f"its float64 run returns {', '.join(lower[:2])} in {out[lower[0]].dtype}: it casts inside" if lower else ""
    except (RuntimeError, TypeError, ValueError) as e:
        why = one_line(e, limit=160)
    if why:
        program.notes.append(f"the model does not run in float64 ({why}): the reference is the model as given, and "
                             "rows are judged against it")
        if compilation.precision == "float32":
            program.formats, program.ideal = None, None
        return
    program.reference = lambda a, k: (reference, *float64_args(a, k))
    program.versus = ("compiled" if compilation.ctx is not None else "the candidate", f"eager {compilation.precision}",
                      "float64")


def _breaks_note(breaks: list[Any]) -> str:
    where = sorted({p for b in breaks for p in b.modules})
    at = f" (in {', '.join(where[:5])}{'...' if len(where) > 5 else ''})" if where else ""
    return (f"dynamo split the model into graphs at {len(breaks)} graph break{'s' if len(breaks) != 1 else ''}{at}; "
            "those rows say why. torch.compile(model, fullgraph=True) names the first as an error")


def pt2_suffix(path: str | os.PathLike) -> bool:
    return str(path).lower().endswith(".pt2")


# -- AOTInductor packages --------------------------------------------------------------------------

#: why a package from elsewhere has no module rows, and how to get them
PACKAGE_UNTAPPED = ("the package carries no layertap record (in its metadata), so only its outputs are compared; "
                    "export it with layertap export MODEL -o m.pt2 (lt.export(model, args, 'm.pt2')) for module rows")
_DTYPES = {"tensor(float)": "float32", "tensor(double)": "float64", "tensor(float16)": "float16",
           "tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(bool)": "bool"}
_TYPE_TEXT = {v: k for k, v in _DTYPES.items()}


class PackageEngine:
    """An AOTInductor package (``.pt2``) loaded in PyTorch (an :class:`~.protocol.Engine`): a feed by input name
    in, every output by name out, named by layertap's record in the package's metadata (a package from
    elsewhere: ``output_0``, ``output_1``, ...)."""

    def __init__(self, path: str | os.PathLike) -> None:
        from ..pytorch.compiled import PACKAGE_RECORD, load_package

        self.path = Path(path)
        if not self.path.is_file():
            raise LayertapError(f"no such AOTInductor package: '{path}'")
        try:
            self.loader = load_package(self.path)
            meta = dict(self.loader.get_metadata())
        except Exception as e:  # noqa: BLE001 - the loader's own error, as one line
            raise OnnxFileError(f"PyTorch cannot load '{path}' as an AOTInductor package: "
                                f"{one_line(e, first=True, limit=300)}") from None
        record = meta.get(PACKAGE_RECORD)
        try:
            self.sidecar = Sidecar.from_text(record) if record else None
        except (ValueError, KeyError, TypeError) as e:
            raise OnnxFileError(f"'{path}' carries a layertap record that cannot be read ({one_line(e)})") from None
        self._inputs = [InputInfo(i["name"], _TYPE_TEXT.get(str(i.get("dtype")), "tensor(float)"),
                                  [int(d) for d in i["shape"]]) for i in (self.sidecar.inputs if self.sidecar else [])]
        self._outputs = self.sidecar.program_outputs if self.sidecar is not None else []
        self.runs = 0

    def get_inputs(self) -> list[InputInfo]:
        if self.sidecar is None:
            raise LayertapError(f"'{self.path.name}' carries no layertap record of its inputs: give them in order "
                                "(layertap run m.pt2 --input ...), or export it with layertap export MODEL -o m.pt2")
        return list(self._inputs)

    def output_infos(self) -> list[InputInfo]:
        records = self.sidecar.outputs if self.sidecar is not None else []
        return [InputInfo(str(r["name"]), "tensor(float)", r.get("shape")) for r in records
                if "same_as" not in r and "input" not in r]

    def output_names(self) -> list[str]:
        return self.sidecar.output_names if self.sidecar is not None else list(self._outputs)

    def run(self, names: Sequence[str] | None, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch

        from ..pytorch.values import tensor_to_numpy

        tensors = _tensors(feed, self.get_inputs())
        try:
            with torch.no_grad():
                got = self.loader(*tensors)
        except Exception as e:  # noqa: BLE001
            shapes = ", ".join(f"{i.name}={list(i.shape or [])}" for i in self._inputs)
            raise OnnxFileError(f"the AOTInductor package '{self.path}' failed to run: {one_line(e, first=True)} "
                                f"(it was compiled for {shapes})") from None
        self.runs += 1
        got = got if isinstance(got, (list, tuple)) else [got]
        own = self._outputs or [f"output_{i}" for i in range(len(got))]
        values = {n: tensor_to_numpy(t, copy=True) for n, t in zip(own, got)}
        return with_repeats(values, self.sidecar, feed, self._inputs, names)


def package_record(names: Sequence[str], example: Sequence[Any], outputs: list[dict[str, Any]],
                   weights: dict[str, Any], values: Sequence[Any] = ()) -> str:
    """The record a package carries in its metadata (as an ExecuTorch program's sidecar holds it), each output
    with the shape of its value in ``values`` (the eager run's)."""
    records = [dict(o, **({"shape": list(v.shape)} if hasattr(v, "shape") else {}))
               for o, v in zip(outputs, [*values, *[None] * (len(outputs) - len(values))])]
    return Sidecar(Sidecar.input_records(names, example), records, {"compiler": "aotinductor"}, weights).text()


def tapped_package(model: Any, method: Any, path: Path, runs: list[tuple[tuple, dict]], work: Path,
                   wanted: Callable[[str], bool]) -> TappedProgram:
    """The package at ``path`` and, where it carries layertap's record, the model compiled again by AOTInductor
    in ``work`` with a tap at every module ``wanted``."""
    from ..pytorch.compiled import aoti_package

    engine = PackageEngine(path)
    sidecar = engine.sidecar
    runtime = CompiledRuntime("AOTInductor")
    if sidecar is None:
        return TappedProgram(path, engine, runtime, engine.output_names(), untapped=PACKAGE_UNTAPPED)
    own = [n for n in engine.output_names() if n not in set(sidecar.taps)]
    tapped, records = retapped(engine, model, method, runs, wanted, own)
    tapped_path = work / "tapped.pt2"
    aoti_package(tapped.wrapper, tapped.example, tapped_path,
                 package_record([i["name"] for i in sidecar.inputs], tapped.example, records, {}))
    return TappedProgram(path, engine, runtime, own, PackageEngine(tapped_path), names_by_call(records),
                         weights=sidecar.weights or None)
