"""LiteRT (TensorFlow Lite) programs (``.tflite``): run in LiteRT's interpreter (``ai-edge-litert``), outputs by
name.

A LiteRT program, like an ExecuTorch one, hands out only its signature's outputs, so layertap converts taps in
as named outputs when it writes the program (``lt.export(..., "m.tflite", taps=[...])``: ``litert-torch``
names each signature output by layertap's name) and records them beside it in the same *sidecar* an ExecuTorch
program has (``m.tflite.json``: inputs, each output's module path and call, the recipe, the weights' digests).
``compare`` converts the model again by that recipe with a tap at every module (:func:`tapped_program`); an
int8 program is judged at int8: the formats are the program's own output scales and zero points, the ideal run
the model in PyTorch with those outputs fake-quantised and its Conv/Linear weights on the int8 grid per channel
(:mod:`layertap.pytorch.rounding`). A ``.tflite`` from elsewhere runs by its signature's names, and its inner
tensors are read by the module paths litert-torch writes into their names (:mod:`.litert_foreign`).

A static int8 program takes and returns int8 tensors: the engine quantises float inputs and dequantises
outputs with the interpreter's scale and zero point, so every caller sees float values. Outputs keep the
layout the model returns (litert-torch transposes inside the program, NCHW at its outputs).

LiteRT's packages (``layertap[litert]``) are imported only when a program runs; this module reaches torch only
through the conversion (:mod:`layertap.pytorch.litert`), inside functions.
"""

from __future__ import annotations

import json
import os
import warnings
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Collection, Mapping, Sequence

import numpy as np

from ..errors import InputSpecError, LayertapError, OnnxFileError, missing_litert, one_line
from ..files.writes import atomic_write_bytes
from ..inputs import InputSpec
from ..noise import quiet_native_stderr
from ..numformats import Format
from ..onnxfile.formats import TensorFormats
from ..onnxfile.tensor_table import OnnxLayers
from .executorch import (
    ExecuTorchRuntime,
    Sidecar,
    names_by_call,
    program_layers,
    publish_program,
    read_sidecar,
    retapped,
    run_program,
    sidecar_path,
    with_repeats,
)
from .litert_foreign import (
    ModelCalls,
    chain_locator,
    dequantised,
    explorer_nodes,
    foreign_layers,
    foreign_program,
    quantised_format,
    run_foreign,
)
from .plugins import VERBS, YES, ExplorerNode, RuntimeSettings, TappedProgram
from .protocol import InputInfo, RuntimeInfo

#: numpy dtype names -> the type text engines name inputs by
_TYPE_TEXT = {"float32": "tensor(float)", "float16": "tensor(float16)", "int64": "tensor(int64)",
              "int32": "tensor(int32)", "int8": "tensor(int8)", "uint8": "tensor(uint8)", "bool": "tensor(bool)",
              "int16": "tensor(int16)"}
#: the flatbuffer file identifier of a TFLite model (bytes 4..8)
_IDENTIFIER = b"TFL3"
#: why a program from elsewhere has no module rows, and how to get them
UNTAPPED = ("the program carries no layertap record (m.tflite.json beside it), so only its outputs are compared; "
            "export it with layertap export MODEL -o m.tflite (lt.export(model, args, 'm.tflite')) for a row per "
            "module (litert-torch converts the model again with a tap at every module)")


def litert_version() -> str:
    """The installed LiteRT runtime's version (``""`` when it is not installed)."""
    try:
        return version("ai-edge-litert")
    except PackageNotFoundError:
        return ""


def recipe_path(path: str | os.PathLike) -> Path:
    """Where the AI Edge Quantizer recipe of a quantised program is kept: ``m.tflite`` -> ``m.tflite.aeq.json``.

    Example:
        >>> recipe_path("out/m.tflite").name
        'm.tflite.aeq.json'
    """
    return Path(str(path) + ".aeq.json")


def _interpreter(path: Path, preserve_all: bool = False, allocate: bool = True) -> Any:
    """LiteRT's interpreter on the program at ``path`` (one-line errors: no such file, not a program, no extra);
    ``preserve_all``: every tensor kept after a run (LiteRT's ``experimental_preserve_all_tensors``);
    ``allocate=False``: tensors left unallocated, so only the constants have data."""
    if not path.is_file():
        raise LayertapError(f"no such LiteRT program: '{path}'")
    with open(path, "rb") as f:
        head = f.read(8)
    if len(head) < 8 or head[4:8] != _IDENTIFIER:
        raise OnnxFileError(f"'{path}' is not a LiteRT (TensorFlow Lite) program: it lacks the TFL3 flatbuffer "
                            "identifier (a truncated or other file)")
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        raise missing_litert() from None
    try:
        with quiet_native_stderr(), warnings.catch_warnings():  # the XNNPACK delegate's INFO line
            # keeping every tensor is what reading a program's inner tensors asks for; LiteRT warns about it
            warnings.filterwarnings("ignore", message=".*experimental_preserve_all_tensors.*")
            interpreter = Interpreter(model_path=str(path), experimental_preserve_all_tensors=preserve_all)
            if allocate:
                interpreter.allocate_tensors()
    except Exception as e:  # noqa: BLE001 - the runtime's own error, as one line
        raise OnnxFileError(f"LiteRT cannot load '{path}': {one_line(e, first=True)}") from None
    return interpreter


def _order(names: Sequence[str]) -> list[str]:
    """Signature input names in argument order (``args_0``, ``args_1``, ..., ``args_10``)."""
    def key(n: str) -> tuple[int, str]:
        tail = n.rsplit("_", 1)[-1]
        return (int(tail) if tail.isdigit() else 0, n)

    return sorted(names, key=key)


class LiteRTEngine:
    """One LiteRT program's signature in LiteRT's interpreter (an :class:`~.protocol.Engine`): a feed by input
    name in, every output by name out, float (int8 values quantised in and dequantised out)."""

    def __init__(self, path: str | os.PathLike, *, preserve_all: bool = False) -> None:
        self.path = Path(path)
        self.interpreter = _interpreter(self.path, preserve_all)
        signatures = self.interpreter.get_signature_list()
        if not signatures:
            raise OnnxFileError(f"'{path}' has no signature to run (LiteRT programs layertap runs have one)")
        self.signature = "serving_default" if "serving_default" in signatures else next(iter(signatures))
        self.runner = self.interpreter.get_signature_runner(self.signature)
        ins, outs = self.runner.get_input_details(), self.runner.get_output_details()
        self._in_keys = _order(list(ins))
        self._in_details = [ins[k] for k in self._in_keys]
        self.sidecar = read_sidecar(self.path)
        names = self.sidecar.program_outputs if self.sidecar is not None else []
        if sorted(names) != sorted(outs):
            names = list(signatures[self.signature]["outputs"])
            self.sidecar = None  # not this program's record
        self._outputs = names
        self._out_details = dict(outs)
        records = self.sidecar.inputs if self.sidecar is not None else []
        # an int8 input or output is float to callers: quantised in, dequantised out
        self._inputs = [InputInfo(records[i]["name"] if i < len(records) else k, _type_text(d),
                                  [int(s) for s in d["shape"]])
                        for i, (k, d) in enumerate(zip(self._in_keys, self._in_details))]
        self.runs = 0

    def get_inputs(self) -> list[InputInfo]:
        return list(self._inputs)

    def output_infos(self) -> list[InputInfo]:
        """The program's own outputs (repeats aside): name, type text, shape."""
        return [InputInfo(n, _type_text(self._out_details[n]), [int(s) for s in self._out_details[n]["shape"]])
                for n in self._outputs]

    def output_names(self) -> list[str]:
        return list(self._outputs) if self.sidecar is None else self.sidecar.output_names

    def output_format(self, name: str) -> Format | None:
        """The int8 format an output is held in (its scale and zero point), ``None`` for a float output."""
        return quantised_format(self._out_details[name])

    def input_format(self, index: int) -> Format | None:
        return quantised_format(self._in_details[index])

    def run(self, names: Sequence[str] | None, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One run of the program on ``feed`` (by input name); ``names``: the outputs to hand back."""
        missing = [i.name for i in self._inputs if i.name not in feed]
        if missing:
            raise InputSpecError(f"the program needs the input {missing[0]!r}; it takes "
                                 f"{', '.join(i.name for i in self._inputs)}")
        args = {k: _to_program(np.asarray(feed[i.name]), d)
                for k, i, d in zip(self._in_keys, self._inputs, self._in_details)}
        try:
            got = self.runner(**args)
        except Exception as e:  # noqa: BLE001
            shapes = ", ".join(f"{i.name}={list(i.shape or [])}" for i in self._inputs)
            raise OnnxFileError(f"LiteRT failed to run '{self.path}': {one_line(e, first=True)} "
                                f"(it was converted for {shapes})") from None
        self.runs += 1
        values = {n: dequantised(got[n], self._out_details[n]) for n in self._outputs}
        return with_repeats(values, self.sidecar, feed, self._inputs, names)


def _type_text(details: Mapping[str, Any]) -> str:
    """The type a value has for callers: float for a quantised one (the engine converts it both ways)."""
    if quantised_format(details) is not None:
        return "tensor(float)"
    return _TYPE_TEXT.get(np.dtype(details["dtype"]).name, "tensor(float)")


def _to_program(value: np.ndarray, details: Mapping[str, Any]) -> np.ndarray:
    """A value as the program takes it: float quantised with the input's scale and zero point for an int8 input."""
    fmt = quantised_format(details)
    dtype = np.dtype(details["dtype"])
    if fmt is not None and value.dtype.kind == "f":
        info = np.iinfo(dtype)
        q = np.round(value / np.float32(fmt.scale)) + np.float32(fmt.zero_point)
        return np.clip(q, info.min, info.max).astype(dtype)
    return np.ascontiguousarray(value.astype(dtype, copy=False))


class LiteRTRuntime(ExecuTorchRuntime):
    """LiteRT's interpreter behind the one protocol (:class:`~.protocol.Runtime`): it runs a program as it was
    converted (:meth:`open_file`); ONNX graphs, part graphs and tensors exposed after conversion are refused with
    what to do instead, as for an ExecuTorch program.

    Example:
        >>> LiteRTRuntime().describe().runtime
        'LiteRT'
    """

    name = "litert"

    def open(self, model: Any, outputs: Sequence[Any] = (), *, only: bool = False) -> Any:
        raise LayertapError("LiteRT runs LiteRT programs (.tflite), not ONNX files; run ONNX files in ort or "
                            "openvino, or export the model to a .tflite (layertap export MODEL -o m.tflite)")

    def open_part(self, source: Any, part: Any) -> Any:
        raise LayertapError("--local (local=True) runs parts of an ONNX graph; a LiteRT program cannot be cut into "
                            "parts: compare it without --local")

    def open_file(self, path: Path, *, timing: bool = False) -> Any:
        engine = LiteRTEngine(path)
        recipe = engine.sidecar.recipe if engine.sidecar is not None else {}
        self.precision = precision_of(recipe.get("quantize"))
        return engine

    def settings(self) -> str:
        return ""

    def describe(self) -> RuntimeInfo:
        return RuntimeInfo("LiteRT", litert_version() or "(not installed)", "CPU", self.precision)


# -- the plug-in ----------------------------------------------------------------------------------


class _LiteRTPlugin:
    """LiteRT as a runtime plug-in (:class:`~.plugins.ProgramPlugin`): programs converted from the PyTorch
    model by litert-torch (``.tflite``), which hand out only their outputs; module rows come from the model
    converted again by the program's recipe with a tap at every module."""

    name = "litert"
    title = "LiteRT"
    form = "program"
    suffixes = (".tflite",)
    matrix = {**{verb: YES for verb in VERBS},
              "compare --local": "a program cannot be cut into parts: the converter fuses ops across modules and "
                                 "the interpreter runs its signature whole",
              "compare --steps": "not yet: decode steps feed a KV cache the ONNX decoder files name; a program "
                                 "is converted at fixed sizes",
              "repro": "a repro package is a part of an ONNX graph run alone; a program cannot be cut into parts"}

    quantizer = "AI Edge Quantizer"
    fix_to = ("int8",)
    fix_out = "FIXED.tflite"

    def __init__(self) -> None:
        #: the recipe each kept set was converted by (``fix``'s trials), for ``kept_recipe``
        self._recipes: dict[tuple[str, ...], list[dict[str, Any]]] = {}

    def open(self, settings: RuntimeSettings) -> LiteRTRuntime:
        settings.refuse(self.name, (), "a LiteRT program runs in LiteRT's interpreter as it was converted")
        return LiteRTRuntime()

    def engine(self, path: Path) -> LiteRTEngine:
        return LiteRTEngine(path)

    def input_specs(self, path: Path) -> list[InputSpec]:
        return [InputSpec(None, tuple(d if isinstance(d, int) else 1 for d in i.shape or ()), _dtype_of(i.type))
                for i in LiteRTEngine(path).get_inputs()]

    def run(self, path: Path, inputs: Any, taps: Sequence[str], *, seed: int,
            notify: Callable[[str], None] | None) -> dict[str, Any]:
        engine = LiteRTEngine(path)
        if engine.sidecar is None and taps:  # a program from elsewhere: its tensors by name or module path
            return run_foreign(LiteRTEngine(path, preserve_all=True), inputs, taps, seed=seed, notify=notify)
        return run_program(path, inputs, taps, seed=seed, notify=notify, engine=engine)

    def layers(self, path: Path) -> OnnxLayers:
        engine = LiteRTEngine(path)
        if engine.sidecar is None:  # a program from elsewhere: every tensor, by the module call it holds
            return foreign_layers(path, engine)
        table = program_layers(path, engine, "LiteRT program", UNTAPPED)
        table.notes[:] = [n.replace("lowers the model", "converts the model") for n in table.notes]
        return table

    def tapped(self, model: Any, method: Any, path: Path, runs: list[tuple[tuple, dict]], work: Path,
               wanted: Callable[[str], bool]) -> TappedProgram:
        return tapped_program(model, method, path, runs, work, wanted)

    def lower_kept(self, model: Any, method: Any, samples: list[tuple], calibration: list[tuple], to: str,
                   kept: Sequence[str], out: Path, memo: dict[str, Any] | None = None) -> LiteRTEngine:
        from ..pytorch.litert import Conversion, aeq_recipe, convert, output_owners
        from ..pytorch.lowering import tapped_wrapper, weight_record
        from ..pytorch.wrapper import input_names

        if to != "int8":
            raise LayertapError(f"LiteRT programs are made at int8 (AI Edge Quantizer), not {to}: use --to int8")
        tapped = tapped_wrapper(model, method, [], samples[0], None)
        conversion = Conversion("int8", list(calibration), list(kept), output_owners(model, method, tuple(samples[0])))
        names = input_names(model, method, tuple(samples[0]), {})
        kept_out = [o.name for o, s in zip(tapped.wrapper.outputs, tapped.same) if s is None]
        sidecar = Sidecar(Sidecar.input_records(names, tapped.example), tapped.records(), conversion.record(),
                          weight_record(model))
        # with its record, calibration and recipe beside it, as lt.export writes it: compare converts it again
        recipe = aeq_recipe("int8", kept, conversion.outputs)
        publish(out, convert(tapped.wrapper, tapped.example, kept_out, conversion, names), sidecar, conversion, recipe)
        self._recipes[tuple(kept)] = recipe
        return LiteRTEngine(out)

    def explorer_nodes(self, path: Path, paths: Sequence[str]) -> list[ExplorerNode]:
        """The program's ops as Model Explorer's TFLite adapter keys them, each with its module call."""
        return explorer_nodes(path, paths)

    def kept_recipe(self, kept: Sequence[str]) -> tuple[str, Any]:
        """The kept set as an AI Edge Quantizer recipe (its own JSON: ``Quantizer.load_quantization_recipe``)."""
        from ..pytorch.litert import aeq_recipe

        return "ai_edge_quantizer_recipe.json", self._recipes.get(tuple(kept)) or aeq_recipe("int8", kept)


PLUGIN = _LiteRTPlugin()


def precision_of(quantize: str | None) -> str:
    """The precision a program of this quantisation computes in, as reports name it.

    Example:
        >>> precision_of(None), precision_of("int8"), precision_of("dynamic")
        ('float32', 'int8', 'dynamic int8')
    """
    return {"int8": "int8", "dynamic": "dynamic int8"}.get(quantize or "", "float32")


def _dtype_of(type_text: str) -> str:
    return next((k for k, v in _TYPE_TEXT.items() if v == type_text), "float32")


def publish(out: Path, buffer: bytes, sidecar: Sidecar, conversion: Any, recipe: list[dict[str, Any]] | None) -> None:
    """The program, its sidecar, its calibration samples (static int8) and its AI Edge Quantizer recipe
    (quantised), each written atomically."""
    static = conversion.quantize == "int8"  # only a static int8 program keeps its calibration samples
    publish_program(out, buffer, sidecar, SimpleNamespace(quantize=static, calibration=conversion.calibration))
    if recipe is not None:
        atomic_write_bytes(recipe_path(out), (json.dumps(recipe, indent=1) + "\n").encode())
    elif recipe_path(out).exists():
        recipe_path(out).unlink()


def tapped_program(model: Any, method: Any, path: str | Path, runs: list[tuple[tuple, dict]], work: Path,
                   wanted: Callable[[str], bool]) -> TappedProgram:
    """The program at ``path`` and, where it carries layertap's record, the model converted again by its recipe
    in ``work`` with a tap at every module ``wanted`` (:class:`~.plugins.TappedProgram`)."""
    from ..pytorch.litert import Conversion, convert
    from ..pytorch.lowering import read_calibration

    engine = LiteRTEngine(path)
    sidecar = engine.sidecar
    own = [n for n in engine.output_names() if sidecar is None or n not in set(sidecar.taps)]
    recipe = sidecar.recipe if sidecar is not None else {}
    quantize = recipe.get("quantize")
    runtime = LiteRTRuntime(precision_of(quantize))
    if sidecar is None:  # a program from elsewhere: its own tensors, by the module locations in their names
        program = foreign_program(path, runs, wanted, (engine, lambda: LiteRTEngine(path, preserve_all=True)), runtime,
                                  own, lambda args, kwargs: _model_calls(model, method, args, kwargs))
        params = [n for n, p in model.named_parameters() if p.is_floating_point()]
        program.held_weights = _held(model, Path(path), params, chain_locator([p for p, _ in model.named_modules()]))
        return program
    tapped, records = retapped(engine, model, method, runs, wanted, own)
    kept = [r["name"] for r, s in zip(records, tapped.same) if s is None]
    conversion = Conversion(quantize, read_calibration(path) or [tuple(tapped.example)], recipe.get("keep_float", []))
    tapped_path = work / "tapped.tflite"
    tapped_path.write_bytes(convert(tapped.wrapper, tapped.example, kept, conversion.check(),
                                    [i["name"] for i in sidecar.inputs]))
    sidecar_path(tapped_path).write_text(Sidecar(sidecar.inputs, records, sidecar.recipe).text())
    tapped_engine = LiteRTEngine(tapped_path)
    side = TappedProgram(Path(path), engine, runtime, own, tapped_engine, names_by_call(records),
                         weights=sidecar.weights or None, held_weights=_held(model, Path(path), sidecar.weights))
    if quantize:
        side.formats, side.ideal = int8_judging(model, tapped, records, tapped_engine, quantize)
    return side


def _held(model: Any, path: Path, names: Collection[str],
          locate: Callable[[str], list[str]] | None = None) -> Callable[[], Mapping[str, float | None]] | None:
    """The weight check of the constants inside the program against the model's parameters ``names`` (those recorded
    as the ones it was converted from; a program from elsewhere: all, its constants' names read by ``locate``):
    :func:`layertap.pytorch.litert_weights.held_weights`, run when compare asks."""
    if not names:
        return None

    def check() -> Mapping[str, float | None]:
        from ..pytorch.litert_weights import held_weights

        return held_weights(model, program_constants(path), names, locate)

    return check


def program_constants(path: str | os.PathLike) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """The constant tensors of a LiteRT program (its weights among them), each as its name (litert-torch names it
    by the locations of the op reading it), its values as float32 and the rounding its format allows each value:
    half a step of the scale (per channel or per tensor) of an integer tensor with one, which is dequantised;
    float16's rounding; none for float32. Integer tensors without a scale (shapes, indices) are left out.

    Example:
        >>> program_constants("missing.tflite")
        Traceback (most recent call last):
        ...
        layertap.errors.LayertapError: no such LiteRT program: 'missing.tflite'
    """
    interpreter = _interpreter(Path(path), allocate=False)
    out = []
    for details in interpreter.get_tensor_details():
        try:
            raw = interpreter.get_tensor(details["index"])
        except ValueError:
            continue  # no data before tensors are allocated: not a constant
        held = _constant_values(raw, details)
        if held is not None:
            out.append((str(details["name"]), *held))
    return out


def _constant_values(raw: np.ndarray, details: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """A constant's values as float32 and the rounding its format allows each (broadcast against the values);
    ``None`` for an integer tensor without a scale."""
    if raw.dtype.kind == "f":
        value = raw.astype(np.float32)
        if raw.dtype != np.float16:
            return value, np.zeros(1, np.float32)
        return value, np.abs(value) * np.float32(2.0 ** -11)  # half a float16 ulp
    quant = details.get("quantization_parameters") or {}
    scales = np.asarray(quant.get("scales", ()), np.float32)
    if raw.dtype.kind not in "iu" or not scales.size or not np.all(scales > 0):
        return None
    zeros = np.asarray(quant.get("zero_points", ()), np.float32)
    shape = [1] * raw.ndim
    if scales.size > 1:  # per channel of one axis
        shape[int(quant.get("quantized_dimension", 0))] = scales.size
    zero = zeros.reshape(shape) if zeros.size == scales.size else np.float32(0)
    step = scales.reshape(shape)
    return (raw.astype(np.float32) - zero) * step, step / np.float32(2)


def _model_calls(model: Any, method: Any, args: tuple, kwargs: dict) -> ModelCalls:
    """The model's forward on one sample, as a program from elsewhere is matched against it."""
    from ..pytorch.litert import module_outputs

    return ModelCalls(*module_outputs(model, method, args, kwargs))


def int8_judging(model: Any, tapped: Any, records: list[dict[str, Any]], engine: LiteRTEngine,
                 quantize: str) -> tuple[TensorFormats, Callable[[tuple], dict[str, Any]]]:
    """The formats of a quantised tapped program's outputs and its ideal run: static int8, the model with each
    tapped output fake-quantised at the program's own scale and zero point; dynamic int8 (activations quantised
    as the kernels run), every operator's output on 8 bits over its own range. Conv/Linear weights on the int8
    grid per channel in both."""
    from ..pytorch.litert import weight_grid
    from ..pytorch.rounding import RoundingPlan

    grid = weight_grid(model)
    if quantize == "dynamic":
        return TensorFormats(default=Format("int8")), _ideal_run(model, tapped, records,
                                                                 RoundingPlan(weights=grid, dynamic=True))
    formats = {r["name"]: f for r in records if "same_as" not in r and "input" not in r
               for f in [engine.output_format(r["name"])] if f is not None}
    outputs: dict[tuple[str, int], list[Format | None]] = {}
    for r in sorted((r for r in records if r.get("path") is not None and r.get("call") is not None),
                    key=lambda r: (r.get("index") or [0])[0] if r.get("index") else 0):
        outputs.setdefault((r["path"], int(r["call"])), []).append(formats.get(r.get("same_as", r["name"])))
    plan = RoundingPlan(outputs=outputs, weights=grid, model_inputs=[engine.input_format(0)])
    final = {r["name"]: formats[r["name"]] for r in records if r.get("path") is None and r["name"] in formats}
    return TensorFormats(dict(formats)), _ideal_run(model, tapped, records, plan, final)


def _ideal_run(model: Any, tapped: Any, records: list[dict[str, Any]], plan: Any,
               final: Mapping[str, Format] | None = None) -> Callable[[tuple], dict[str, Any]]:
    """The recipe's arithmetic in float: the tapped model run inside ``plan``'s rounding, by output name (the
    model's own outputs rounded to their formats in ``final``)."""

    def ideal(args: tuple, kwargs: dict | None = None) -> dict[str, np.ndarray]:
        import torch

        from ..pytorch.rounding import rounded
        from ..pytorch.values import tensor_to_numpy

        with torch.no_grad(), rounded(model, plan) as (round_inputs, _):
            values = tapped.wrapper.run(list(round_inputs(tuple(args))))  # a program is converted on positional tensors
        out = {r["name"]: tensor_to_numpy(v, copy=True) for r, v in zip(records, values) if hasattr(v, "detach")}
        for name, fmt in (final or {}).items():
            out[name] = fmt.rounded(out[name])
        return out

    return ideal
