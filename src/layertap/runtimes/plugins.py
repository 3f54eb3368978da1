"""The candidate protocol: one :class:`RuntimePlugin` per runtime says everything that differs between
runtimes, and every command reaches a runtime through it (:func:`plugin`, :func:`plugin_for`,
:func:`~layertap.runtimes.open_runtime`); ``comparing``, ``fixing`` and ``reproducing`` never name a runtime.

A runtime runs its candidates in one of two *forms*:

* ``"graph"``: it runs an ONNX graph (or its own IR, read as one) with any tensor exposed as an output.
  Which module call a tensor stands for is read from the file's scopes (the ScopeMap), its format from
  the file's types (:mod:`layertap.onnxfile.formats`), a unit is kept at higher precision by the file
  converter's block list. ONNX Runtime and OpenVINO; its engines come from :meth:`RuntimePlugin.open`.
* ``"program"``: it runs a program lowered from the PyTorch model, which hands out only its outputs.
  The plug-in (a :class:`ProgramPlugin`) lowers the model again with a tap at every module
  (:meth:`ProgramPlugin.tapped`: which output stands for which module call, the formats it computes
  in, the ideal run of its recipe), keeps modules at higher precision by lowering them so
  (:meth:`ProgramPlugin.lower_kept`) and writes its artifact itself. ExecuTorch; compiled PyTorch
  (``inductor``: a ``torch.compile`` module, judged against the model in float64, or an AOTInductor package).

Beside the protocol's members a plug-in may declare what only some runtimes have, read where they are
used: ``short`` (its name where a column header has little room), ``claims(obj)`` (an in-memory object it
runs), ``candidate(model)`` (a candidate made from the model alone), and for ``fix`` ``fix_to``,
``fix_out``, ``kept_as`` and ``fix_settings``.

A runtime from outside registers itself (:func:`register_runtime`, or a ``layertap.runtimes`` entry
point naming the plug-in object) and is then a ``--runtime`` like the built-in ones.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence

from ..errors import LayertapError, one_line, unknown_name

if TYPE_CHECKING:  # pragma: no cover
    from ..inputs import InputSpec
    from ..onnxfile.formats import TensorFormats
    from ..onnxfile.tensor_table import OnnxLayers
    from .protocol import Engine, Runtime

#: the verbs of the runtime matrix (docs/runtimes.md), in the order it prints them
VERBS = ("export", "layers", "run", "extract --data", "compare", "compare --samples", "compare --local",
         "compare --steps", "weight check", "fix", "repro")
#: a matrix cell a runtime supports
YES = "yes"


@dataclass(frozen=True)
class RuntimeSettings:
    """The settings a runtime is opened with, each its own or refused by it: ONNX Runtime's ``providers`` and
    graph ``optimize``, OpenVINO's ``ov_precision`` and ``ov_device``, compiled PyTorch's ``autocast``
    (``bf16``, ``fp16``: both sides compute under it), ``compile_mode`` and ``compile_backend``. ``optimize``
    left ``None`` is the runtime's default."""

    providers: Sequence[str] | str | None = None
    optimize: bool | None = None
    ov_precision: str | None = None
    ov_device: str | None = None
    autocast: str | None = None
    compile_mode: str | None = None
    compile_backend: str | None = None

    def given(self) -> dict[str, Any]:
        """The settings set, by keyword name.

        Example:
            >>> RuntimeSettings(ov_device="GPU").given()
            {'ov_device': 'GPU'}
        """
        return {k: v for k, v in self.__dict__.items() if v is not None}

    def refuse(self, runtime: str, own: Sequence[str], why: str) -> None:
        """Refuse the settings given that are not in ``own``, saying ``why``.

        Example:
            >>> RuntimeSettings(providers="CUDA").refuse("openvino", ["ov_device"], "pick the device with --ov-device")
            Traceback (most recent call last):
            ...
            layertap.errors.LayertapError: --providers (providers=) does not apply to the openvino runtime: pick the device with --ov-device
        """
        for key in self.given():
            if key not in own and not (key == "optimize" and self.optimize):
                flag = "--no-ort-opt" if key == "optimize" else "--" + key.replace("_", "-")
                raise LayertapError(f"{flag} ({key}=) does not apply to the {runtime} runtime: {why}")


class RuntimePlugin(Protocol):
    """What one runtime is to layertap (see the module doc)."""

    #: the ``--runtime`` name
    name: str
    #: the runtime as a report names it (``ONNX Runtime``)
    title: str
    #: ``"graph"`` or ``"program"``
    form: str
    #: file suffixes only this runtime runs (``.pte``, ``.xml``); a file of another suffix is ONNX
    suffixes: tuple[str, ...]
    #: verb -> :data:`YES`, or why that cell cannot be: the rows of docs/runtimes.md
    matrix: Mapping[str, str]

    def open(self, settings: RuntimeSettings) -> "Runtime":
        """An engine opener with ``settings`` checked (those not its own refused)."""


class ProgramPlugin(RuntimePlugin, Protocol):
    """A ``"program"`` runtime: the parts of a compare, a run and a fix that only it can do."""

    #: the tool that quantises its programs, as fix's report names it
    quantizer: str

    def engine(self, path: Path) -> "Engine":
        """The program at ``path`` as it is (its outputs by name)."""

    def layers(self, path: Path) -> "OnnxLayers":
        """``layertap layers`` of a program: its inputs and outputs, each output's module path and call."""

    def input_specs(self, path: Path) -> "list[InputSpec]":
        """The inputs the program was lowered for (samples are drawn at these shapes)."""

    def run(self, path: Path, inputs: Any, taps: Sequence[str], *, seed: int,
            notify: Callable[[str], None] | None) -> dict[str, Any]:
        """``lt.run`` of a program: its outputs, then the taps asked for (those it was exported with)."""

    def tapped(self, model: Any, method: Any, path: Path, runs: list[tuple[tuple, dict]], work: Path,
               wanted: Callable[[str], bool]) -> "TappedProgram":
        """The program at ``path`` beside the model lowered again by the program's recipe with a tap at every
        module ``wanted`` (written under ``work``)."""

    def lower_kept(self, model: Any, method: Any, samples: list[tuple], calibration: list[tuple], to: str,
                   kept: Sequence[str], out: Path, memo: dict[str, Any] | None = None) -> "Engine":
        """Write the model lowered at ``to`` (``int8``; compiled PyTorch: the autocast dtype) with the modules
        ``kept`` at float32 (kept eager) to ``out``, as ``export`` writes it (with its record), for ``fix``;
        return the engine that runs it. ``memo``: a dict one ``fix`` hands to every set it lowers (the same
        model, samples and calibration), where the plug-in may keep what the sets share (a float export)."""

    def kept_recipe(self, kept: Sequence[str]) -> tuple[str, Any]:
        """The kept set in the toolchain's own form: a file name and its JSON, an object or a list as the
        toolchain reads it (``fix --config-out``)."""

    # A program runtime whose files Model Explorer reads also has ``explorer_nodes(path, paths) ->
    # list[ExplorerNode]`` (its ops as the adapter keys them, each with its module call among ``paths``):
    # ``compare --node-data`` for such a candidate.

    # A runtime that runs objects in memory (compiled PyTorch: a module) also has ``claims(source) -> bool``
    # (the objects it runs: :func:`plugin_for` asks it) and ``candidate(model)`` (the reference made a
    # candidate by the runtime: ``compare MODEL --cand-runtime NAME`` without a candidate file).


@dataclass
class TappedProgram:
    """A program candidate as a ``"program"`` runtime makes it for ``compare``.

    ``engine`` runs the program (its own outputs ``own``); ``tapped`` (``None`` when the program carries no
    record to lower it again by, nor tensors named by module) runs the model lowered with a tap at every module
    (or the program itself with its inner tensors kept: ``rows_from``): ``names`` maps
    ``(module path, call)`` to the outputs that hold that call's value (a tuple-returning module's, in
    order). ``formats`` (``None``: float32) is the
    format each tapped output is computed in, ``ideal(args)`` the recipe's arithmetic run in float on one
    sample's arguments (``None``: float32). ``runtime`` describes what ran; ``untapped`` says why a program has
    no module rows and how to get them; ``weights`` the program's parameters by module path (``None``: not
    read); ``held_weights()`` the weights inside the program against the model's, by parameter name (``None``
    where the program holds the model's value within its format, else the relative difference of what it
    holds; parameters it cannot tell are left out), for a runtime that reads them (``None``: only the record
    ``weights`` is checked).
    """

    path: Path
    engine: "Engine"
    runtime: "Runtime"
    own: list[str]
    tapped: "Engine | None" = None
    names: dict[tuple[str, int], tuple[str, ...]] = field(default_factory=dict)
    formats: "TensorFormats | None" = None
    ideal: Callable[..., dict[str, Any]] | None = None
    untapped: str = ""
    weights: Mapping[str, Any] | None = None
    held_weights: Callable[[], Mapping[str, float | None]] | None = None
    #: the reference run for this candidate, when it is not the model as given: ``(model, args, kwargs)`` from
    #: one sample's arguments (a compiled module: the model and the sample in float64)
    reference: Callable[[tuple, dict], tuple[Any, tuple, dict]] | None = None
    #: how rows name the three runs when the reference is more precise than the ideal run:
    #: ``("compiled", "eager float32", "float64")`` (``None``: an ideal run at the candidate's format)
    versus: tuple[str, str, str] | None = None
    #: a note for every call of a module, by module path (a graph break there)
    row_notes: dict[str, str] = field(default_factory=dict)
    #: the candidate as reports name it (default: the program's file name)
    shown: str = ""
    #: notes the report carries about the candidate
    notes: list[str] = field(default_factory=list)
    #: module calls the program holds no value of because the converter fused them into another module's op:
    #: ``(path, call)`` -> that module's path and call (their rows are ``absorbed`` there)
    absorbed: dict[tuple[str, int], tuple[str, int]] = field(default_factory=dict)
    #: what fused an absorbed call, and into what of the holder's (its row's note)
    fused_by: tuple[str, str] = ("the converter", "op")
    #: why a module call has no counterpart, by ``(path, call)``; ``unmatched``: the note of every other call
    #: without one (default: its output is not floating tensors)
    missing: dict[tuple[str, int], str] = field(default_factory=dict)
    unmatched: str = ""
    #: where the module rows come from, when not from the program made again with a tap at every module (a
    #: program's own tensors, read as it runs)
    rows_from: str = ""

    @property
    def name(self) -> str:
        """The candidate as reports name it."""
        return self.shown or self.path.name


@dataclass(frozen=True)
class ExplorerNode:
    """One node of a program as Model Explorer's adapter for it reads the file (``compare --node-data``): its id,
    the tensors it writes (by the names rows give them), and the module call it belongs to (``module``: one of the
    report's paths; ``None``: none).

    Example:
        >>> ExplorerNode("2", ("relu;bn1;conv1;1",), "relu", 0).id
        '2'
    """

    id: str
    outputs: tuple[str, ...]
    module: str | None
    call: int | None


# name -> "module:attribute" of a built-in plug-in, imported on first use
_BUILTIN = {"ort": "layertap.runtimes.ort:PLUGIN", "openvino": "layertap.runtimes.openvino:PLUGIN",
            "executorch": "layertap.runtimes.executorch:PLUGIN", "inductor": "layertap.runtimes.compiled:PLUGIN",
            "litert": "layertap.runtimes.litert:PLUGIN"}
#: the runtime an ONNX file runs in when no runtime is named
DEFAULT_RUNTIME = "ort"
_REGISTERED: dict[str, RuntimePlugin] = {}
_ENTRY_POINTS = "layertap.runtimes"


def register_runtime(runtime: RuntimePlugin) -> RuntimePlugin:
    """Make ``runtime`` a runtime every command can name (``--runtime NAME``, ``runtime="NAME"``); return it.

    A plug-in is an object with the attributes of :class:`RuntimePlugin` (a ``"program"`` one also those of
    :class:`ProgramPlugin`). Packages register theirs with an entry point in the ``layertap.runtimes`` group.

    Example:
        >>> from layertap.runtimes.ort import PLUGIN
        >>> register_runtime(PLUGIN) is PLUGIN, plugin("ort").title
        (True, 'ONNX Runtime')
    """
    missing = [a for a in ("name", "title", "form", "suffixes", "matrix", "open") if not hasattr(runtime, a)]
    if missing or getattr(runtime, "form", None) not in ("graph", "program"):
        raise LayertapError(f"{runtime!r} is not a runtime plug-in: it needs {', '.join(missing) or 'form'} "
                            "(see layertap.runtimes.plugins.RuntimePlugin)")
    _REGISTERED[runtime.name] = runtime
    return runtime


def runtime_names() -> list[str]:
    """Every runtime a command can name: the built-in ones, then those registered.

    Example:
        >>> runtime_names()[:3]
        ['ort', 'openvino', 'executorch']
    """
    _entry_points()
    return list(dict.fromkeys([*_BUILTIN, *_REGISTERED]))


def plugin(name: str) -> RuntimePlugin:
    """The plug-in of the runtime ``name``.

    Example:
        >>> plugin("executorch").form
        'program'
        >>> plugin("tensorrt")
        Traceback (most recent call last):
        ...
        layertap.errors.LayertapError: unknown runtime 'tensorrt' ...
    """
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name in _BUILTIN:
        return register_runtime(_load(_BUILTIN[name]))
    if name not in _entry_points():
        if name in _BROKEN:
            raise LayertapError(f"the runtime plug-in {name!r} failed to load: {_BROKEN[name]}")
        raise LayertapError(unknown_name("runtime", str(name), runtime_names(),
                                         hint="ONNX Runtime's execution providers are picked with --providers; a "
                                              "runtime of your own is added with lt.register_runtime"))
    return _REGISTERED[name]


def default_plugin() -> RuntimePlugin:
    """The plug-in of the runtime an ONNX file runs in when no runtime is named.

    Example:
        >>> default_plugin().title
        'ONNX Runtime'
    """
    return plugin(DEFAULT_RUNTIME)


def plugin_for(source: Any) -> RuntimePlugin | None:
    """The one runtime that runs ``source`` (a path, or an object with ``.path``) by its suffix (an OpenVINO IR,
    an ExecuTorch program), ``None`` for an ONNX file any graph runtime runs.

    Example:
        >>> plugin_for("m.pte").name, plugin_for("m.xml").name, plugin_for("m.onnx"), plugin_for(object())
        ('executorch', 'openvino', None, None)
    """
    if not isinstance(source, (str, os.PathLike)):
        if getattr(source, "path", None) is None:  # an object a runtime runs in memory (a PyTorch module)
            return next((p for p in map(plugin, runtime_names()) if callable(getattr(p, "claims", None))
                         and p.claims(source)), None)  # type: ignore[attr-defined]
        source = source.path
    suffix = os.path.splitext(str(source))[1].lower()
    if not suffix or suffix == ".onnx":
        return None
    for name in runtime_names():
        found = plugin(name)
        if suffix in found.suffixes:
            return found
    return None


def a_program(runtime: RuntimePlugin) -> str:
    """``an ExecuTorch program``: a program runtime's program, with its article, for messages.

    Example:
        >>> a_program(plugin("executorch"))
        'an ExecuTorch program'
    """
    return f"{'an' if runtime.title[:1].upper() in 'AEIOU' else 'a'} {runtime.title} program"


def runtime_for(source: Any) -> str | None:
    """The name of the one runtime that runs ``source`` (an OpenVINO IR: ``openvino``; an ExecuTorch program:
    ``executorch``), ``None`` for a file any graph runtime runs.

    Example:
        >>> runtime_for("m.xml"), runtime_for("m.pte"), runtime_for("m.onnx"), runtime_for(object())
        ('openvino', 'executorch', None, None)
    """
    found = plugin_for(source)
    return found.name if found is not None else None


def is_ir(source: Any) -> bool:
    """Whether a file argument names an OpenVINO IR (``.xml``, its weights in the ``.bin`` beside it).

    Example:
        >>> is_ir("m.xml"), is_ir("m.onnx")
        (True, False)
    """
    return isinstance(source, (str, os.PathLike)) and str(source).lower().endswith(".xml")


def _load(target: str) -> Any:
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)


_SCANNED: list[bool] = []


def _entry_points() -> dict[str, RuntimePlugin]:
    """The plug-ins installed packages declare (loaded once, on the first name not built in)."""
    if not _SCANNED:
        _SCANNED.append(True)
        for ep in entry_points(group=_ENTRY_POINTS):
            try:
                register_runtime(ep.load())
            except Exception as e:  # noqa: BLE001 - a broken plug-in must not stop the built-in runtimes
                _BROKEN[ep.name] = one_line(e)
    return _REGISTERED


_BROKEN: dict[str, str] = {}


def runtime_matrix() -> str:
    """docs/runtimes.md's matrix: every verb on every runtime, from the plug-ins' own declarations (a cell that
    cannot be says why, in a note under the table).

    Example:
        >>> print(runtime_matrix().splitlines()[5])
        | verb | ort | openvino | executorch | inductor | litert |
    """
    names = list(_BUILTIN)
    plugins = [plugin(n) for n in names]
    lines = ["## Every verb on every runtime", "",
             "Generated from the runtimes' own declarations (`layertap.runtimes.plugins.runtime_matrix`, `make "
             "runtimes-doc`);", "a runtime added with `lt.register_runtime` declares its column the same way.", "",
             "| verb | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    reasons: list[str] = []
    for verb in VERBS:
        cells = []
        for p in plugins:
            cell = p.matrix.get(verb, "not declared")
            if cell == YES:
                cells.append(YES)
            else:
                reasons.append(f"{p.name}, {verb}: {cell}")
                cells.append(f"no ({len(reasons)})")
        lines.append(f"| `{verb}` | " + " | ".join(cells) + " |")
    lines += ["", "Each runtime, its form and the files only it runs:", ""]
    lines += [f"- **{p.name}** ({p.title}): a {p.form} runtime" +
              (f", runs {', '.join(p.suffixes)} files" if p.suffixes else ", runs ONNX files") for p in plugins]
    lines += ["", "Why a cell is no:", ""] + [f"{i}. {r}" for i, r in enumerate(reasons, 1)] if reasons else []
    return "\n".join(lines) + "\n"
