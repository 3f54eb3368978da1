"""ExecuTorch programs (``.pte``): run in ExecuTorch's own Python runtime, outputs by name.

A program runs as it was lowered: its outputs are all it can hand out (no tensor can be exposed
after lowering), so layertap bakes taps in as named outputs when it writes the program
(``lt.export(..., "m.pte", taps=[...])``) and records the names beside it in a *sidecar*,
``m.pte.json`` (:func:`sidecar_path`): the inputs (names, shapes, dtypes), each output's name and
source (the ``layertap.taps`` record an ONNX export carries), and the recipe it was lowered by
(backend, quantisation, calibration), from which ``compare`` lowers the model again with taps at
every module. A program from elsewhere (no sidecar) names its outputs ``output_0``, ``output_1``...

ExecuTorch is imported only when a program runs; its Python runtime takes and hands out torch
tensors, so this is the one module of :mod:`layertap.runtimes` that reaches torch (through
ExecuTorch, never for layertap's own use).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import InputSpecError, LayertapError, OnnxFileError, missing_executorch, one_line, unknown_name
from ..files.writes import atomic_path, atomic_write_bytes
from ..inputs import InputSpec, random_input
from ..noise import quiet_native_stderr, quiet_registrations
from ..numformats import Format
from ..onnxfile.formats import TensorFormats
from ..onnxfile.tensor_table import OnnxLayers, TensorRow
from .plugins import VERBS, YES, RuntimeSettings, TappedProgram
from .protocol import Engine, InputInfo, RuntimeInfo

#: the sidecar's format version
SIDECAR_VERSION = 1
#: ExecuTorch's ScalarType codes (c10 numbering) -> numpy dtype names
_SCALAR_TYPES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16", 6: "float32",
                 7: "float64", 11: "bool"}
#: numpy dtype names -> the type text engines name inputs by (as ONNX Runtime's ``NodeArg.type``)
_TYPE_TEXT = {"float32": "tensor(float)", "float16": "tensor(float16)", "float64": "tensor(double)",
              "int64": "tensor(int64)", "int32": "tensor(int32)", "int8": "tensor(int8)", "uint8": "tensor(uint8)",
              "int16": "tensor(int16)", "bool": "tensor(bool)"}


def is_program(source: Any) -> bool:
    """Whether a path names an ExecuTorch program (``.pte``).

    Example:
        >>> is_program("m.pte"), is_program("m.onnx"), is_program(None)
        (True, False, False)
    """
    return isinstance(source, (str, os.PathLike)) and str(source).lower().endswith(".pte")


def sidecar_path(path: str | os.PathLike) -> Path:
    """Where layertap records a program's names and recipe: ``m.pte`` -> ``m.pte.json``.

    Example:
        >>> sidecar_path("out/m.pte").name
        'm.pte.json'
    """
    return Path(str(path) + ".json")


@dataclass
class Sidecar:
    """What layertap wrote beside a program: its inputs, its outputs (model outputs first, then taps:
    ``layertap.taps`` records), and the recipe it was lowered by.

    Example:
        >>> s = Sidecar([{"name": "x", "shape": [1, 4], "dtype": "float32"}],
        ...             [{"name": "output", "path": None}, {"name": "act", "path": "act"}], {"backend": "xnnpack"})
        >>> s.output_names, s.taps, Sidecar.from_text(s.text()).recipe
        (['output', 'act'], ['act'], {'backend': 'xnnpack'})
    """

    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    recipe: dict[str, Any] = field(default_factory=dict)
    #: each parameter the program was lowered from: its shape, largest magnitude and a digest of its values
    #: (:func:`layertap.pytorch.lowering.weight_record`): compare's weight check of a program
    weights: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def output_names(self) -> list[str]:
        """Every output's name, repeats too (an output that is an earlier one, or an input)."""
        return [o["name"] for o in self.outputs]

    @property
    def program_outputs(self) -> list[str]:
        """The names of the program's own outputs, in order (repeats are handed out from them)."""
        return [o["name"] for o in self.outputs if "same_as" not in o and "input" not in o]

    @property
    def taps(self) -> list[str]:
        """The names of the tapped outputs (those with a module path)."""
        return [o["name"] for o in self.outputs if o.get("path") is not None]

    @staticmethod
    def input_records(names: Sequence[str], example: Sequence[Any]) -> list[dict[str, Any]]:
        """The record of each input: its name and the shape and dtype of its example tensor.

        Example:
            >>> Sidecar.input_records(["x"], [np.zeros((1, 4), np.float32)])
            [{'name': 'x', 'shape': [1, 4], 'dtype': 'float32'}]
        """
        return [{"name": n, "shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", "")}
                for n, t in zip(names, example)]

    def text(self) -> str:
        """The sidecar's JSON text."""
        return json.dumps({"layertap_program": SIDECAR_VERSION, "inputs": self.inputs, "outputs": self.outputs,
                           "recipe": self.recipe, "weights": self.weights}, indent=1) + "\n"

    @classmethod
    def from_text(cls, text: str) -> "Sidecar":
        data = json.loads(text)
        return cls(list(data["inputs"]), list(data["outputs"]), dict(data.get("recipe") or {}),
                   dict(data.get("weights") or {}))


def program_input_specs(path: str | os.PathLike) -> list[InputSpec]:
    """The inputs a program was lowered for, as positional ``--input`` specs (ExecuTorch programs have
    static shapes): from layertap's record beside it, else from the program itself.

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> _ = (folder / "m.pte.json").write_text(Sidecar([{"name": "x", "shape": [1, 3, 8, 8], "dtype": "float32"}],
        ...                                              []).text())
        >>> program_input_specs(folder / "m.pte")
        [InputSpec(name=None, shape=(1, 3, 8, 8), dtype='float32', path=None)]
    """
    sidecar = read_sidecar(path)
    if sidecar is not None:
        return [InputSpec(None, tuple(int(d) for d in i["shape"]), str(i.get("dtype", "float32")))
                for i in sidecar.inputs]
    return [InputSpec(None, tuple(d if isinstance(d, int) else 1 for d in i.shape or ()), _dtype_of(i.type))
            for i in ProgramEngine(path).get_inputs()]


def read_sidecar(path: str | os.PathLike) -> Sidecar | None:
    """The sidecar beside ``path`` (``None``: a program from elsewhere); an unreadable one is an error."""
    side = sidecar_path(path)
    if not side.is_file():
        return None
    try:
        return Sidecar.from_text(side.read_text())
    except (ValueError, KeyError, TypeError) as e:
        raise OnnxFileError(f"'{side}' is not layertap's record of '{path}' ({one_line(e)}); remove it to run the "
                            "program with outputs named output_0, output_1, ...") from None


def executorch_version() -> str:
    """The installed ExecuTorch's version (``""`` when it is not installed)."""

    try:
        return version("executorch")
    except PackageNotFoundError:
        return ""


class ProgramEngine:
    """One program's ``forward`` loaded in ExecuTorch's runtime (an :class:`~.protocol.Engine`): a feed by
    input name in, every output by name out."""

    def __init__(self, path: str | os.PathLike, method: str = "forward") -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise LayertapError(f"no such ExecuTorch program: '{path}'")
        try:
            with quiet_registrations():  # ExecuTorch imports torchao
                from executorch.runtime import Runtime as EtRuntime
        except ImportError:
            raise missing_executorch() from None
        self.sidecar = read_sidecar(path)
        try:
            with quiet_native_stderr():  # XNNPACK's CPU probe writes C++ log lines to stderr as it loads
                program = EtRuntime.get().load_program(str(self.path))
                self.method = program.load_method(method)
        except Exception as e:  # noqa: BLE001 - the runtime's own error, as one line
            raise OnnxFileError(f"ExecuTorch cannot load '{path}': {one_line(e, first=True)}") from None
        if self.method is None:
            raise OnnxFileError(f"'{path}' has no method {method!r}")
        meta = self.method.metadata
        self._inputs = [_input_info(meta.input_tensor_meta(i), i, self.sidecar) for i in range(meta.num_inputs())]
        n_out = meta.num_outputs()
        names = self.sidecar.program_outputs if self.sidecar is not None else []
        if len(names) != n_out:
            names = ["output" if n_out == 1 else f"output_{i}" for i in range(n_out)]
            self.sidecar = None  # not this program's record
        self._outputs = names
        self._output_infos = [_input_info(meta.output_tensor_meta(i), i, None)._replace(name=n)
                              for i, n in enumerate(names)]
        self.runs = 0

    def get_inputs(self) -> list[InputInfo]:
        return list(self._inputs)

    def output_infos(self) -> list[InputInfo]:
        """The program's own outputs (repeats aside) as it declares them: name, type text, shape."""
        return list(self._output_infos)

    def output_names(self) -> list[str]:
        return list(self._outputs) if self.sidecar is None else self.sidecar.output_names

    def run(self, names: Sequence[str] | None, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One run of the program on ``feed`` (by input name); ``names``: the outputs to hand back."""
        import torch  # ExecuTorch's Python runtime takes torch tensors

        missing = [i.name for i in self._inputs if i.name not in feed]
        if missing:
            raise InputSpecError(f"the program needs the input {missing[0]!r}; it takes "
                                 f"{', '.join(i.name for i in self._inputs)}")
        tensors = [torch.from_numpy(np.ascontiguousarray(feed[i.name])) for i in self._inputs]
        try:
            got = self.method.execute(tensors)
        except Exception as e:  # noqa: BLE001
            shapes = ", ".join(f"{i.name}={list(i.shape or [])}" for i in self._inputs)
            raise OnnxFileError(f"ExecuTorch failed to run '{self.path}': {one_line(e, first=True)} "
                                f"(it was lowered for {shapes})") from None
        self.runs += 1
        # copies: the runtime reuses its planned memory on the next run
        values = {n: np.array(t.detach().numpy(), copy=True) for n, t in zip(self._outputs, got)}
        return with_repeats(values, self.sidecar, feed, self._inputs, names)


def with_repeats(values: dict[str, np.ndarray], sidecar: Sidecar | None, feed: dict[str, np.ndarray],
                 inputs: Sequence[InputInfo], names: Sequence[str] | None) -> dict[str, np.ndarray]:
    """A program's outputs by name with the repeats its record names filled in (an output that is an earlier
    one, or an input), in the record's order; ``names``: those asked for."""
    for record in sidecar.outputs if sidecar is not None else ():  # repeats, in order
        if "same_as" in record:
            values[record["name"]] = values[record["same_as"]]
        elif "input" in record:
            values[record["name"]] = np.array(feed[inputs[record["input"]].name], copy=True)
    if sidecar is not None:
        values = {n: values[n] for n in sidecar.output_names}
    return values if names is None else {n: values[n] for n in names}


def _input_info(meta: Any, index: int, sidecar: Sidecar | None) -> InputInfo:
    """An input as engines describe one: its name (the sidecar's, else ``input_i``), type text, shape."""
    dtype = _SCALAR_TYPES.get(int(meta.dtype()), "float32")
    name = f"input_{index}"
    if sidecar is not None and index < len(sidecar.inputs):
        name = sidecar.inputs[index]["name"]
    return InputInfo(name, _TYPE_TEXT.get(dtype, "tensor(float)"), [int(d) for d in meta.sizes()])


class ExecuTorchRuntime:
    """ExecuTorch's runtime behind the one protocol (:class:`~.protocol.Runtime`): it runs a program as it
    was lowered (:meth:`open_file`); ONNX graphs, part graphs and tensors exposed after lowering are
    refused with what to do instead.

    Example:
        >>> ExecuTorchRuntime().describe().runtime
        'ExecuTorch'
    """

    name = "executorch"
    optimize = True  # its backend's own graph: no switch to turn off
    carries_branches = False

    def __init__(self, precision: str = "float32", backend: str | None = None) -> None:
        self.precision, self.backend = precision, backend

    def open(self, model: Any, outputs: Sequence[Any] = (), *, only: bool = False) -> Engine:
        raise LayertapError("ExecuTorch runs ExecuTorch programs (.pte), not ONNX files; run ONNX files in ort or "
                            "openvino, or export the model to a .pte (layertap export MODEL -o m.pte)")

    def open_tapped(self, source: Any, tensors: Sequence[str]) -> Engine:
        return self.open(source)

    def open_part(self, source: Any, part: Any) -> Engine:
        raise LayertapError("--local (local=True) runs parts of an ONNX graph; an ExecuTorch program cannot be cut "
                            "into parts: compare it without --local")

    def open_file(self, path: Path, *, timing: bool = False) -> Engine:
        engine = ProgramEngine(path)
        recipe = engine.sidecar.recipe if engine.sidecar is not None else {}
        self.backend = self.backend or recipe.get("backend")
        if recipe.get("quantize"):
            self.precision = str(recipe["quantize"])
        return engine

    def settings(self) -> str:
        return f"{self.backend} backend" if self.backend else ""

    def rounding_note(self) -> str:
        return ""

    def exposable(self, model: Any) -> set[str] | None:
        return set()

    def describe(self) -> RuntimeInfo:
        return RuntimeInfo("ExecuTorch", executorch_version() or "(not installed)", "CPU", self.precision)


def run_program(
    path: str | os.PathLike,
    inputs: Mapping[str, Any] | Sequence[Any] | None = None,
    taps: Sequence[str] = (),
    *,
    seed: int = 0,
    notify: Callable[[str], None] | None = None,
    engine: Any = None,
) -> dict[str, np.ndarray]:
    """Run a program once: the model's outputs, then the taps asked for (every tap baked in when
    ``taps`` is empty). Inputs left out are drawn as the program declares them. ``engine``: the program
    already opened (another program runtime's engine: an AOTInductor package's).

    Example:
        >>> run_program("missing.pte")
        Traceback (most recent call last):
        ...
        layertap.errors.LayertapError: no such ExecuTorch program: 'missing.pte'
    """
    engine = ProgramEngine(path) if engine is None else engine
    feed = program_feed(engine, inputs, seed, notify)
    values = engine.run(None, feed)
    taps_in = set(engine.sidecar.taps) if engine.sidecar is not None else set()
    own = [n for n in values if n not in taps_in]
    wanted = [str(t) for t in taps]
    for t in wanted:
        if t not in values:
            raise LayertapError(unknown_name("tap", t, sorted(taps_in),
                                             hint="a program hands out the taps it was exported with; export again "
                                                  "with --tap (lt.export(..., taps=[...]))" if taps_in else
                                                  "this program has no taps layertap recorded; export the model with "
                                                  "layertap export MODEL -o m.pte --tap ..."))
    keep = own + ([t for t in values if t in taps_in] if not wanted else list(dict.fromkeys(wanted)))
    return {k: values[k] for k in keep}


def program_feed(engine: ProgramEngine, inputs: Mapping[str, Any] | Sequence[Any] | None, seed: int,
                 notify: Callable[[str], None] | None = None) -> dict[str, np.ndarray]:
    """The feed of one run: inputs given (arrays or ``InputSpec`` s, by name or in order), the rest drawn
    at the sizes the program was lowered for (``notify`` says which)."""

    declared = engine.get_inputs()
    given: dict[str, Any] = {}
    if isinstance(inputs, Mapping):
        unknown = [k for k in inputs if k not in {i.name for i in declared}]
        if unknown:
            raise InputSpecError(unknown_name("input", unknown[0], [i.name for i in declared]))
        given = dict(inputs)
    elif inputs is not None:
        if len(inputs) > len(declared):
            raise InputSpecError(f"{len(inputs)} inputs given; the program takes {len(declared)}")
        given = {i.name: v for i, v in zip(declared, inputs)}
    rng = np.random.default_rng(seed)
    feed, drawn = {}, []
    for info in declared:
        dtype = _dtype_of(info.type)
        value = given.get(info.name)
        if isinstance(value, InputSpec):
            value = value.array(rng)
        if value is None:
            value, how = random_input(info.name, info.shape or [], dtype, rng)
            drawn.append(how)
        arr = np.asarray(value.detach().numpy() if hasattr(value, "detach") else value)
        check_static_shape(info, list(arr.shape), engine.path.name, "export again with that --input")
        feed[info.name] = arr.astype(dtype, copy=False)
    if drawn and notify is not None:
        notify("generated inputs: " + ", ".join(drawn))
    return feed


def check_static_shape(info: InputInfo, shape: Sequence[int], program: str, remedy: str) -> None:
    """A program has static shapes: a value for input ``info`` must have the size it was lowered for
    (``remedy``: what the user does instead).

    Example:
        >>> check_static_shape(InputInfo("x", "tensor(float)", [1, 4]), [2, 4], "m.pte", "give --input 1x4")
        Traceback (most recent call last):
        ...
        layertap.errors.InputSpecError: input 'x' has shape [2, 4]; m.pte was lowered for [1, 4] (ExecuTorch ...
    """
    if info.shape is not None and list(shape) != list(info.shape):
        raise InputSpecError(f"input {info.name!r} has shape {list(shape)}; {program} was lowered for "
                             f"{list(info.shape)} (ExecuTorch programs have static shapes): {remedy}")


def _dtype_of(type_text: str) -> str:
    return next((k for k, v in _TYPE_TEXT.items() if v == type_text), "float32")


# -- the plug-in ----------------------------------------------------------------------------------


class _ExecuTorchPlugin:
    """ExecuTorch as a runtime plug-in (:class:`~.plugins.ProgramPlugin`): it runs programs lowered from the
    PyTorch model (``.pte``), which hand out only their outputs; module rows come from the model lowered again
    by the program's recipe with a tap at every module. The lowering is the PyTorch side's
    (:mod:`layertap.pytorch.lowering`), imported only when a program is made."""

    name = "executorch"
    title = "ExecuTorch"
    form = "program"
    suffixes = (".pte",)
    matrix = {**{verb: YES for verb in VERBS},
              "compare --local": "a program cannot be cut into parts: its nodes are fused into backend kernels "
                                 "(XNNPACK) that run only whole",
              "compare --steps": "not yet: decode steps feed a KV cache the ONNX decoder files name; a program "
                                 "is lowered at fixed sizes",
              "repro": "a repro package is a part of an ONNX graph run alone; a program cannot be cut into parts"}

    quantizer = "ExecuTorch XNNPACK quantizer (pt2e)"
    fix_to = ("int8",)
    fix_out = "FIXED.pte"

    def open(self, settings: RuntimeSettings) -> "ExecuTorchRuntime":
        settings.refuse(self.name, (), "an ExecuTorch program runs on the backend it was lowered for")
        return ExecuTorchRuntime()

    def engine(self, path: Path) -> ProgramEngine:
        return ProgramEngine(path)

    def input_specs(self, path: Path) -> list[InputSpec]:
        return program_input_specs(path)

    def run(self, path: Path, inputs: Any, taps: Sequence[str], *, seed: int,
            notify: Callable[[str], None] | None) -> dict[str, Any]:
        return run_program(path, inputs, taps, seed=seed, notify=notify)

    def tapped(self, model: Any, method: Any, path: Path, runs: list[tuple[tuple, dict]], work: Path,
               wanted: Callable[[str], bool]) -> TappedProgram:
        return tapped_program(model, method, path, runs, work, wanted)

    def layers(self, path: Path) -> OnnxLayers:
        return program_layers(path)

    def lower_kept(self, model: Any, method: Any, samples: list[tuple], calibration: list[tuple], to: str,
                   kept: Sequence[str], out: Path, memo: dict[str, Any] | None = None) -> ProgramEngine:
        from ..pytorch.lowering import Recipe, lower, weight_record
        from ..pytorch.wrapper import input_names

        if to != "int8":
            raise LayertapError(f"ExecuTorch programs are made at int8 (XNNPACK quantizer), not {to}: use --to int8")
        tapped, exported = _float_program(model, method, samples[0], {} if memo is None else memo)
        recipe = Recipe("xnnpack", "int8", calibration, list(kept))
        names = input_names(model, method, tuple(samples[0]), {})
        sidecar = Sidecar(Sidecar.input_records(names, tapped.example), tapped.records(), recipe.record(),
                          weight_record(model))
        # with its record and calibration beside it, as lt.export writes it: compare lowers it again
        publish_program(out, lower(tapped.wrapper, tapped.example, recipe, exported).buffer, sidecar, recipe)
        return ProgramEngine(out)

    def kept_recipe(self, kept: Sequence[str]) -> tuple[str, dict[str, Any]]:
        """The kept set as the XNNPACK quantizer's filter (the file ``fix --config-out`` writes, and its JSON)."""
        return "executorch_xnnpack.json", {
            "quantizer": "executorch.backends.xnnpack.quantizer.xnnpack_quantizer.XNNPACKQuantizer",
            "global": "get_symmetric_quantization_config(is_per_channel=True)",
            "keep_float32_modules": list(kept),
            "how": "quantizer.set_filter_function(lambda node: not any(module_name_filter(m)(node) for m in "
                   "keep_float32_modules)) with torchao.quantization.pt2e.quantizer.utils.get_module_name_filter"}


PLUGIN = _ExecuTorchPlugin()


def _float_program(model: Any, method: Any, sample: tuple, memo: dict[str, Any]) -> tuple[Any, Any]:
    """The model's wrapper without taps and its float export, made once per ``fix`` (``memo``) for every set
    it lowers: each set only quantises that export anew."""
    from ..pytorch.lowering import export_float, tapped_wrapper

    if "float" not in memo:
        tapped = tapped_wrapper(model, method, [], sample, None)
        memo["float"] = (tapped, export_float(tapped.wrapper, tapped.example))
    return memo["float"]


def program_layers(path: str | os.PathLike, engine: Any = None, title: str = "ExecuTorch program",
                   untapped: str = "") -> OnnxLayers:
    """``layertap layers m.pte``: what a program takes and hands out, each output with the module path and call
    layertap recorded for it (a program from elsewhere: its outputs by position), dtype and shape. ``engine``:
    the program already opened (an AOTInductor package's), ``title`` what it is."""
    engine = ProgramEngine(path) if engine is None else engine
    declared = {i.name: i for i in engine.output_infos()}
    inputs = {i.name: i for i in engine.get_inputs()}
    rows = [TensorRow(i.name, "input", None, _dtype_of(i.type), i.shape, None, None) for i in inputs.values()]
    records = engine.sidecar.outputs if engine.sidecar is not None else [{"name": n} for n in declared]
    for r in records:
        info = declared.get(str(r.get("same_as", r["name"]))) or list(inputs.values())[int(r.get("input", 0))]
        op = "tap" if r.get("path") is not None else "output"
        call = r.get("call")
        rows.append(TensorRow(str(r["name"]), op, None, _dtype_of(info.type), info.shape, r.get("path") or None,
                              int(call) if call is not None else None))
    table = OnnxLayers(rows, source="layertap" if engine.sidecar is not None else "none")
    table.__dict__["title"] = f"{title}: inputs and outputs"
    suffix = Path(path).suffix
    table.notes.append(f"a program hands out only its outputs; layertap compare MODEL m{suffix} lowers the model "
                       "again with a tap at every module for module rows" if engine.sidecar is not None else
                       untapped or UNTAPPED)
    return table


def publish_program(out: Path, buffer: bytes, sidecar: Sidecar, recipe: Any) -> None:
    """The program, its sidecar and (int8) its calibration samples, each written atomically; the sidecar
    last but one, so a program is never beside another program's record for long."""
    from ..pytorch.lowering import calibration_path

    atomic_write_bytes(out, buffer)
    atomic_write_bytes(sidecar_path(out), sidecar.text().encode())
    calib = calibration_path(out)
    if recipe.quantize:
        with atomic_path(calib) as tmp, open(tmp, "wb") as f:
            np.savez(f, **{f"s{i}_{j}": t.detach().cpu().numpy() for i, s in enumerate(recipe.calibration)
                           for j, t in enumerate(s)})
    elif calib.exists():
        calib.unlink()


def tapped_program(model: Any, method: Any, path: str | Path, runs: list[tuple[tuple, dict]], work: Path,
                   wanted: Callable[[str], bool]) -> TappedProgram:
    """The program at ``path`` and, where it carries layertap's record, the model lowered again by its recipe
    in ``work`` with a tap at every module ``wanted`` (:class:`~.plugins.TappedProgram`)."""
    from ..pytorch.lowering import Recipe, lower, read_calibration

    engine = ProgramEngine(path)
    sidecar = engine.sidecar
    own = [n for n in engine.output_names() if sidecar is None or n not in set(sidecar.taps)]
    recipe = sidecar.recipe if sidecar is not None else {}
    runtime = ExecuTorchRuntime(recipe.get("quantize") or "float32", recipe.get("backend"))
    if sidecar is None:
        return TappedProgram(Path(path), engine, runtime, own, untapped=UNTAPPED)

    tapped_model, records = retapped(engine, model, method, runs, wanted, own)
    plan = Recipe(recipe.get("backend", "xnnpack"), recipe.get("quantize"),
                  read_calibration(path) or [tuple(tapped_model.example)], recipe.get("keep_float", []))
    lowered = lower(tapped_model.wrapper, tapped_model.example, plan.check())
    tapped_path = work / "tapped.pte"
    tapped_path.write_bytes(lowered.buffer)
    sidecar_path(tapped_path).write_text(Sidecar(sidecar.inputs, records, sidecar.recipe).text())
    side = TappedProgram(Path(path), engine, runtime, own, ProgramEngine(tapped_path), names_by_call(records),
                         weights=sidecar.weights or None)
    if lowered.quantized is not None:
        kept = [r["name"] for r, s in zip(records, tapped_model.same) if s is None]
        side.formats = int8_formats(lowered.quantized, kept)
        side.ideal = _ideal_run(lowered.quantized, kept, records)
    return side


def retapped(engine: Any, model: Any, method: Any, runs: list[tuple[tuple, dict]], wanted: Callable[[str], bool],
             own: Sequence[str]) -> tuple[Any, list[dict[str, Any]]]:
    """The model wrapped with a tap at every module ``wanted`` (what a program runtime lowers again for module
    rows; :func:`layertap.pytorch.lowering.tapped_wrapper`) and its output records, the model's outputs under the
    program's own names ``own``; the first sample checked against the shapes ``engine`` was made for."""
    from ..pytorch.lowering import module_taps, tapped_wrapper

    args, kwargs = runs[0]
    for info, a in zip(engine.get_inputs(), args):
        check_static_shape(info, list(getattr(a, "shape", [])), engine.path.name,
                           f"give --input {'x'.join(str(d) for d in info.shape or [])}")
    tapped = tapped_wrapper(model, method, module_taps(model, method, args, kwargs, wanted), args, kwargs)
    records = tapped.records()
    for r in records:
        r["name"] = own[0] if r["path"] is None and len(own) == 1 else r["name"]
    return tapped, records


def names_by_call(records: list[dict[str, Any]]) -> dict[tuple[str, int], tuple[str, ...]]:
    """A tapped program's output names by the module call they hold (a tuple-returning module's, in order).

    Example:
        >>> names_by_call([{"name": "output", "path": None, "call": None}, {"name": "fc", "path": "fc", "call": 0}])
        {('fc', 0): ('fc',)}
    """
    by_call: dict[tuple[str, int], list[tuple[int, str]]] = {}
    for r in records:
        if r.get("path") is not None and r.get("call") is not None:
            index = r.get("index") or [0]
            by_call.setdefault((r["path"], r["call"]), []).append((index[0] if isinstance(index, list) else index,
                                                                   r["name"]))
    return {k: tuple(n for _, n in sorted(v)) for k, v in by_call.items()}


#: why a program from elsewhere has no module rows, and how to get them
UNTAPPED = ("the program carries no layertap record (m.pte.json beside it), so only its outputs are compared; export "
            "it with layertap export MODEL -o m.pte (lt.export(model, args, 'm.pte')) for module rows")


def _ideal_run(quantized: Any, kept: list[str], records: list[dict[str, Any]]) -> Callable[[tuple], dict[str, Any]]:
    """The int8 recipe's arithmetic in float (the pt2e-quantised model run in PyTorch) on one sample's arguments,
    by the tapped program's output names."""

    def ideal(args: tuple, kwargs: dict | None = None) -> dict[str, np.ndarray]:
        import torch

        with torch.no_grad():
            got = dict(zip(kept, quantized(*args)))  # a program is lowered on positional tensors
        for r in records:  # repeats, from what they repeat
            if "same_as" in r:
                got[r["name"]] = got[r["same_as"]]
        return {n: np.array(v.detach().cpu().numpy(), copy=True) for n, v in got.items() if hasattr(v, "detach")}

    return ideal


def int8_formats(graph: Any, names: list[str]) -> TensorFormats:
    """The int8 format of each output of a quantised graph: the scale and zero point of the dequantize that
    makes it (outputs made otherwise: float32)."""
    from ..pytorch.lowering import value_source

    out = next(n for n in graph.graph.nodes if n.op == "output")
    tensors = {}
    for name, node in zip(names, out.args[0]):
        node = value_source(node)
        target = str(getattr(node, "target", ""))
        if "dequantize_per_tensor" in target and len(node.args) >= 5:
            scale, zero, qmin, qmax = node.args[1:5]
            if all(isinstance(v, (int, float)) for v in (scale, zero, qmin, qmax)):
                tensors[name] = Format("int8", np.array(float(scale), np.float32), np.array(int(zero), np.int64), None,
                                       int(qmin), int(qmax))
    return TensorFormats(tensors)
