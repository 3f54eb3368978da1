"""``lt.export``: a model (or any method of it) to ONNX, with taps as named outputs.

How it works:

1. :class:`~layertap.pytorch.wrapper.TapWrapper` runs the method with a
   :class:`~layertap.pytorch.capture.Capture` attached and returns the
   method's own result flattened (``output``, ``output[0]``,
   ``output[logits]``...) followed by every tapped tensor, in the order the
   taps were given. One eager run fixes the names.
2. The wrapper is exported (torch.export-based exporter by default, the
   TorchScript exporter on request or as a fallback). With a dynamic batch,
   each input's first dimension gets its own symbol (``torch.export.Dim.DYNAMIC``,
   so inputs the model ties together share one); an example batch of 1 is
   repeated to 2 first, because torch.export specialises sizes 0 and 1.
3. The graph is edited in memory in onnx-ir (the dynamo exporter's own
   ``ONNXProgram.model``; the TorchScript file loaded with its weights left
   on disk) and saved once: inputs and outputs get
   their names, every output becomes a distinct tensor (an ``Identity`` for an
   output that repeats another or is a graph input, pytorch#167848), batch
   symbols are named ``batch`` / ``batch_<input>``, the wrapper's level is
   dropped from module scopes and weight names (so the file reads
   ``layer1.0.conv1``, as ``model.named_modules()`` does), and the tap list is written
   to the model's ``metadata_props`` under ``layertap.taps``.
4. ONNX Runtime runs the file on the example inputs and, with a dynamic
   batch, on a second batch size different from the exported one; every
   output is compared with PyTorch (see :mod:`layertap.exporting.verify` for
   the error measures).
5. The file appears only when all of that worked: it is built in a hidden
   folder beside the target and published with its data file as one unit
   (:func:`layertap.onnxfile.publish.publish`: the data under a fresh name,
   the ``.onnx`` renamed last, the replaced file's data removed after).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import onnx
import onnx_ir as ir
import torch
from torch import nn

from ..errors import InputSpecError, LayertapError
from ..files.signals import Terminated, raise_if_stopped
from ..files.writes import check_output_path
from ..metrics import DEFAULT_ATOL, DEFAULT_RTOL
from ..onnxfile.metadata import TAPS_KEY
from ..onnxfile.publish import external_locations, publish, publish_file
from ..onnxfile.shape_inputs import SHAPE_INPUTS
from ..options import ExportOptions
from ..pytorch.exporter import quiet
from ..pytorch.lowering import Recipe, as_args
from ..pytorch.values import random_tensor, tensor_to_numpy
from ..pytorch.wrapper import MODEL_ATTRIBUTES, TapWrapper
from ..pytorch.wrapper import input_names as signature_names
from ..runtimes import open_runtime
from ..selectors import Tap, parse_taps
from . import _onnxedit as edit
from . import llm
from ._branches import branch_note, contrasting, traced_branches
from .program import calibration_samples, export_program
from .verify import Check, ExportReport, ExportRow, check_output

EXPORTERS = ("dynamo", "torchscript")
#: weights above this size go to an external data file (protobuf's hard limit is 2 GiB)
EXTERNAL_DATA_BYTES = int(1.9 * 1024**3)


def export(
    model: nn.Module,
    args: Any,
    path: str | os.PathLike,
    taps: Sequence[str | Tap] = (),
    *,
    method: str | Callable[..., Any] = "forward",
    kwargs: dict | None = None,
    dynamic_batch: bool = True,
    verify: bool = True,
    exporter: str = "dynamo",
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
    export_options: ExportOptions | None = None,
) -> ExportReport:
    """Export ``model.<method>(*args, **kwargs)`` to ONNX with taps as extra outputs.

    Args:
        model: the module (put it in eval mode first).
        args: the example arguments: a tensor or a tuple of arguments.
            Tensors become graph inputs; other values are fixed into the graph.
        path: the ``.onnx`` file to write.
        taps: selectors such as ``"layer2.0.relu"`` (a module that ran k
            times gives outputs ``PATH#0``..``PATH#k-1``), ``"fc:input"``,
            ``"emb=vision_model.encoder.layers.0[0]"``.
        method: a method name (``"encode_image"``) or a callable
            ``fn(model, *args, **kwargs)`` that may call several methods and
            return anything made of tensors, tuples, lists and dicts.
        dynamic_batch: make each input's first dimension symbolic (and every
            output that follows it); ``False`` fixes all sizes.
        kwargs: keyword arguments of the call.
        verify: run the file in ONNX Runtime and compare with PyTorch.
        exporter: ``"dynamo"`` (torch.export-based, default) or ``"torchscript"``.
        rtol, atol: verification tolerances (see :mod:`layertap.metrics`).
        export_options: the rest, as an object (:class:`~layertap.options.ExportOptions`):
            ``opset`` (the exporter's default when ``None``); ``input_names`` for the tensor inputs (default
            from the method's signature: ``x``, ``pixel_values``, ``input_ids``...); ``fallback``: when the
            dynamo exporter fails, try the TorchScript one (the report says so) instead of raising;
            ``external_data``: store weights in ``<path>.data`` (default: only when they exceed 1.9 GiB);
            ``dynamic_sequence``: also make the sequence axis symbolic (axis 1 of every input of rank 2 or
            more; axis 2 of a cache input), verified at another length; ``kv_cache``: a transformers
            decoder with its KV cache (implies ``dynamic_sequence``): ``args`` is ``input_ids``; inputs
            ``input_ids``, ``attention_mask``, ``past_key_values.N.key/value``, outputs ``logits``,
            ``present.N.key/value`` (Optimum's names), verified also over a prefill and greedy decode
            steps (:mod:`layertap.exporting.llm`).

    Returns:
        An :class:`~layertap.exporting.verify.ExportReport`: one row per graph
        output (model outputs first, then taps) with the declared shape, the
        batch sizes run, max abs/rel error and pass/fail; ``.ok`` is False
        when any output is out of tolerance or ONNX Runtime cannot run the
        file at some batch size (the file is still written, for inspection).

    Raises:
        LayertapError: bad taps, inputs or path, or an exporter failure (the
            message says why in one line and which exporter to try).

    Example:
        >>> import torch, torchvision, tempfile, os, layertap as lt
        >>> model = torchvision.models.resnet18().eval()
        >>> path = os.path.join(tempfile.mkdtemp(), "r18.onnx")
        >>> report = lt.export(model, torch.randn(2, 3, 64, 64), path,
        ...                    taps=["layer1", "layer2.0.relu"], exporter="torchscript")
        >>> report.ok, [r.name for r in report.rows]
        (True, ['output', 'layer1', 'layer2.0.relu#0', 'layer2.0.relu#1'])
    """
    opts = ExportOptions.merged(export_options)
    if str(path).lower().endswith(".pte"):
        return _export_program(model, args, path, taps, method, kwargs, verify, rtol, atol, opts)
    if str(path).lower().endswith(".pt2"):  # an AOTInductor package: it loads inductor, so only here
        from .package import export_package  # noqa: PLC0415

        return export_package(model, args, path, taps, method=method, kwargs=kwargs, verify=verify, rtol=rtol,
                              atol=atol)
    if str(path).lower().endswith(".tflite"):
        return _export_litert(model, args, path, taps, method, kwargs, verify, rtol, atol, opts)
    out = check_output_path(path, suffixes=(".onnx", ".pte", ".pt2", ".tflite"))
    _check_options(model, exporter)
    input_names, kv_cache = opts.input_names, opts.kv_cache
    if kv_cache:
        args, input_names, method, kwargs = *llm.cache_example(model, as_args(args), dict(kwargs or {})), \
            llm.cache_method(model), None
    plan = _plan(model, args, kwargs, taps, method, input_names, dynamic_batch, opts.external_data)
    if opts.dynamic_sequence or kv_cache:
        plan.sequence = llm.sequence_axes(plan.input_names, plan.traced)
    plan.cache = kv_cache
    if not kv_cache and method == "forward" and llm.returns_cache(model):
        plan.notes.append(llm.DROPPED_CACHE_NOTE)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name[:120]}.") as work:
        raw, final = _work_paths(Path(work), "model.onnx")  # short: any output name fits NAME_MAX
        used, graph = _run_exporter(plan, raw, exporter, opts.fallback, opts.opset)
        _finish_graph(plan, graph)
        _save(graph, final, plan.external)
        rows, inputs = _rows(graph, plan.wrapper), _declared_inputs(graph)
        del graph
        if verify:
            _verify(final, plan, rows, rtol, atol)
        _publish(final, out)
    return ExportReport(rows, path=str(out), exporter=used, inputs=inputs, rtol=rtol,
                        atol=atol, verified=verify, notes=plan.notes)


def _export_program(model: nn.Module, args: Any, path: str | os.PathLike, taps: Sequence[str | Tap],
                    method: str | Callable[..., Any], kwargs: dict | None, verify: bool, rtol: float, atol: float,
                    opts: ExportOptions) -> ExportReport:
    """An ExecuTorch program (``.pte``): :func:`.executorch.export_program` by the options' recipe."""
    source = opts.calibration
    calibration = [] if source is None else calibration_samples(model, as_args(args), source)
    recipe = Recipe(opts.backend, opts.quantize, calibration)
    return export_program(model, args, path, taps, method=method, kwargs=kwargs, recipe=recipe, verify=verify,
                          rtol=rtol, atol=atol)


def _export_litert(model: nn.Module, args: Any, path: str | os.PathLike, taps: Sequence[str | Tap],
                   method: str | Callable[..., Any], kwargs: dict | None, verify: bool, rtol: float, atol: float,
                   opts: ExportOptions) -> ExportReport:
    """A LiteRT program (``.tflite``): converted by litert-torch, quantised by AI Edge Quantizer as the options say
    (imported only here: the litert extra)."""
    from ..pytorch.litert import Conversion  # noqa: PLC0415 -- optional: the litert extra
    from .litert import export_litert  # noqa: PLC0415 -- optional: the litert extra

    if opts.backend not in (None, "xnnpack"):
        raise LayertapError("--backend picks an ExecuTorch backend; a LiteRT program runs on LiteRT's own delegate")
    source = opts.calibration if opts.quantize == "int8" else None
    calibration = [] if source is None else calibration_samples(model, as_args(args), source)
    return export_litert(model, args, path, taps, method=method, kwargs=kwargs,
                         conversion=Conversion(opts.quantize, calibration), verify=verify, rtol=rtol, atol=atol)


# -- preparation -------------------------------------------------------------
@dataclass
class _Plan:
    """Everything fixed before the exporter runs."""

    wrapper: TapWrapper
    #: graph input names, one per tensor argument
    input_names: list[str]
    #: the user's example tensors (what verification runs first)
    example: tuple[torch.Tensor, ...]
    #: what the exporter traces: ``example`` with a batch of 1 widened to 2
    traced: tuple[torch.Tensor, ...]
    #: PyTorch's values on ``example``, one per output (the eager run)
    reference: list[torch.Tensor]
    dynamic: bool
    external: bool
    notes: list[str]
    #: source lines where the TorchScript tracer turned a tensor into a Python value
    branches: list[str] = field(default_factory=list)
    #: input index -> its symbolic sequence axis (dynamic_sequence)
    sequence: dict[int, int] = field(default_factory=dict)
    #: a decoder exported with its KV cache: model outputs are named ``logits``, ``present.N.key``...
    cache: bool = False

    @property
    def output_names(self) -> list[str]:
        return [self.output_name(o) for o in self.wrapper.outputs]

    def output_name(self, info: Any) -> str:
        """A cache export's model outputs by their own names (``logits``, not ``output[logits]``)."""
        bare = self.cache and info.path is None and info.name.startswith("output[") and info.name.endswith("]")
        return info.name[7:-1] if bare else info.name


def _check_options(model: Any, exporter: str) -> None:
    if exporter not in EXPORTERS:
        raise LayertapError(f"unknown exporter {exporter!r}; use one of: {', '.join(EXPORTERS)}")
    if not isinstance(model, nn.Module):
        raise LayertapError(f"expected a torch.nn.Module, got {type(model).__name__}")


def _plan(model, args, kwargs, taps, method, input_names, dynamic: bool, external_data: bool | None) -> _Plan:
    """Wrap the model and run it once eagerly.

    The eager run resolves every tap on real tensors before the (slow)
    exporter starts: a bad tap fails in a second, with real shapes in the
    message instead of tracer symbols (``Tensor[s95,9,32]``), and its values
    are the reference for the first verification run.
    """
    args = as_args(args)
    kwargs = dict(kwargs or {})
    wrapper = TapWrapper(model, method, parse_taps(taps), args, kwargs)
    example = wrapper.example_tensors
    names_in = _input_names(input_names, model, method, args, kwargs, len(example))
    with torch.no_grad():
        reference = wrapper.run(example)
    clash = set(names_in) & {o.name for o in wrapper.outputs}
    if clash:
        raise LayertapError(
            f"input name {sorted(clash)[0]!r} is also an output name; rename the input (input_names=) or alias the tap"
        )
    notes: list[str] = []
    if model.training:
        notes.append("the model is in training mode (dropout, batch statistics); call model.eval() before export")
    traced = _widen_batch(example) if dynamic else example
    if any(a.shape != b.shape for a, b in zip(example, traced)):
        notes.append("example batch of 1 was repeated to 2 for export, so the batch dimension stays symbolic")
    external = external_data if external_data is not None else _weight_bytes(model) > EXTERNAL_DATA_BYTES
    return _Plan(wrapper, names_in, example, traced, reference, dynamic, external, notes)


def _input_names(given, model, method, args, kwargs, n: int) -> list[str]:
    if given is None:
        return signature_names(model, method, args, kwargs)
    names = [str(x) for x in given]
    if len(names) != n:
        raise InputSpecError(f"input_names has {len(names)} names but the call has {n} tensor inputs")
    if len(set(names)) != len(names):
        raise InputSpecError(f"input_names are not unique: {names}")
    return names


def _widen_batch(tensors: tuple) -> tuple:
    """Repeat a batch of 1 to 2: torch.export would specialise a size-1 dim."""
    if not any(t.dim() > 0 and t.shape[0] == 1 for t in tensors):
        return tensors
    return tuple(torch.cat([t, t]) if t.dim() > 0 and t.shape[0] == 1 else t for t in tensors)


def _other_batch(example: tuple, exported: tuple, seed: int = 1) -> tuple:
    """Inputs with a batch size unlike both the example's and the exported one.

    New rows are fresh random data of the same scale for floats, and rows of
    the example shifted along the last dimension for integers (so token ids
    stay in the vocabulary and masks stay masks).
    """
    rng = np.random.default_rng(seed)
    out = []
    for t, e in zip(example, exported):
        if t.dim() == 0:
            out.append(t)
            continue
        b = t.shape[0]
        n = b + 1 if b + 1 != e.shape[0] else b + 2
        extra = t[torch.arange(n - b, device=t.device) % max(b, 1)] if b else t.new_zeros((n,) + t.shape[1:])
        if t.is_floating_point():
            std = float(t.float().std()) if t.numel() > 1 else 1.0
            noise = random_tensor(extra.shape, torch.float32, rng).to(device=t.device, dtype=t.dtype)
            extra = float(t.float().mean()) + noise * (std or 1.0)
        elif extra.dim() > 1:
            extra = extra.roll(1, dims=-1)
        out.append(torch.cat([t, extra]))
    return tuple(out)


def _weight_bytes(model: nn.Module) -> int:
    seen: set[int] = set()
    total = 0
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


# -- export ------------------------------------------------------------------
def _work_paths(work: Path, name: str) -> tuple[Path, Path]:
    """``export/<name>`` for the exporter's file, ``final/<name>`` for the edited one.

    Two folders, so both files keep the final name and an external data file
    is ``<name>.data`` in either.
    """
    raw, final = work / "export" / name, work / "final" / name
    raw.parent.mkdir()
    final.parent.mkdir()
    return raw, final


def _run_exporter(plan: _Plan, raw: Path, exporter: str, fallback: bool, opset: int | None) -> tuple[str, ir.Model]:
    """The exported model in onnx-ir, and the exporter that produced it.

    The dynamo exporter's own ``ONNXProgram.model`` is used as it is (nothing
    is written: its weights stay the model's torch tensors); the TorchScript
    exporter writes ``raw``, which is loaded with its weights left on disk.
    """
    if exporter == "torchscript":
        return "torchscript", _export_torchscript(plan, raw, opset)
    try:
        graph = _export_dynamo(plan, opset)
        # torch.onnx.export moves on to its next way of capturing the model when one fails with any error,
        # also one it turned an interrupt into: a signal it dropped stops the command here, not after verifying
        raise_if_stopped()
        return "dynamo", graph
    except Exception as e:
        _reraise_own(e)
        why = _reason(e)
        if not fallback:
            raise LayertapError(
                f"the dynamo exporter (torch.export) failed: {why}; try --exporter torchscript "
                "(exporter='torchscript'), or --fallback to try it automatically"
            ) from e
        plan.notes.append(f"the dynamo exporter failed ({why}); fell back to the TorchScript exporter")
    return "torchscript", _export_torchscript(plan, raw, opset)


def _export_dynamo(plan: _Plan, opset: int | None) -> ir.Model:
    options: dict[str, Any] = {}
    if plan.dynamic:
        # forward(*tensors): one spec per tensor, nested in the varargs slot.
        # Dim.DYNAMIC gives each input its own symbol unless the model ties
        # them, and fails loudly instead of silently fixing the size.
        dims = tuple(({0: torch.export.Dim.DYNAMIC} | _sequence_dim(plan, i)) if t.dim() > 0 else None
                     for i, t in enumerate(plan.traced))
        options["dynamic_shapes"] = (dims,)
    if opset is not None:
        options["opset_version"] = opset
    with quiet():
        program = torch.onnx.export(plan.wrapper, tuple(plan.traced), dynamo=True, verbose=False, **options)
    if program is None:  # pragma: no cover - torch returns the program when no file is given
        raise LayertapError("the dynamo exporter returned no program")
    return program.model


def _sequence_dim(plan: _Plan, index: int) -> dict[int, Any]:
    axis = plan.sequence.get(index)
    return {} if axis is None else {axis: torch.export.Dim.DYNAMIC}


def _export_torchscript(plan: _Plan, raw: Path, opset: int | None) -> ir.Model:
    options: dict[str, Any] = {"input_names": list(plan.input_names)}
    if plan.dynamic:
        options["dynamic_axes"] = {n: {0: f"batch_{n}", **{a: f"sequence_{n}" for a in _sequence_dim(plan, i)}}
                                   for i, (n, t) in enumerate(zip(plan.input_names, plan.traced)) if t.dim() > 0}
    if opset is not None:
        options["opset_version"] = opset
    try:
        with quiet(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", torch.jit.TracerWarning)
            torch.onnx.export(plan.wrapper, tuple(plan.traced), str(raw), dynamo=False, verbose=False, **options)
    except Exception as e:
        _reraise_own(e)
        raise LayertapError(f"the torchscript exporter failed: {_reason(e)}") from e
    raise_if_stopped()  # a signal the exporter dropped
    own_code = [str(Path(torch.__file__).resolve().parent) + os.sep, str(Path(__file__).resolve().parents[1]) + os.sep]
    plan.branches = traced_branches(caught, skip=own_code)
    if plan.branches:
        plan.notes.append(branch_note(plan.branches))
    return ir.load(str(raw))  # external tensors stay on disk until saved


def _reraise_own(e: BaseException) -> None:
    """A bad tap found while the exporter traced is the user's error, not the exporter's; an interrupt the
    exporter turned into an error of its own (SIGINT inside torch.export) is an interrupt, also when the
    error no longer names it."""
    raise_if_stopped()
    seen = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, (LayertapError, KeyboardInterrupt, Terminated)):
            raise cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _reason(e: BaseException) -> str:
    """The one line of an exporter error that says what went wrong."""
    text = _ANSI.sub("", str(e))
    m = re.search(r"## Exception summary\s*\n\s*(\S.*)", text)
    if m:
        line = m.group(1)
    else:
        inner = e.__cause__ or e
        line = next((ln for ln in _ANSI.sub("", str(inner)).splitlines() if ln.strip()), type(inner).__name__)
    line = re.sub(r"<class '(?:[\w]+\.)*(\w+)'>", r"\1", line).strip()
    return line if len(line) <= 300 else line[:297] + "..."


# -- graph edits and files -----------------------------------------------------
def _finish_graph(plan: _Plan, model: ir.Model) -> None:
    """Name inputs, outputs and batch symbols, drop the wrapper from scopes, record the taps (in memory)."""
    graph = model.graph
    edit.name_inputs(graph, plan.input_names)
    n_identity = edit.name_outputs(graph, plan.output_names)
    if n_identity:
        plan.notes.append(f"{n_identity} output(s) repeat another output or an input; each got its own Identity node")
    if plan.dynamic:
        edit.name_batch_symbols(graph, plan.input_names)
    edit.strip_wrapper_scope(graph, MODEL_ATTRIBUTES)
    written = [v.name for v in graph.outputs]
    if written != plan.output_names:  # verification and the report ask for these names
        raise LayertapError(f"internal error: the file's outputs {written} are not the taps' names {plan.output_names}")
    model.metadata_props[TAPS_KEY] = json.dumps([{**o.record(), "name": plan.output_name(o)} for o in plan.wrapper.outputs])


def _declared_inputs(model: ir.Model) -> dict[str, list | None]:
    return {v.name or "": edit.shape_of(v) for v in edit.graph_inputs(model.graph)}


def _save(model: ir.Model, final: Path, external: bool) -> None:
    """Write the edited model once; with ``external`` its weights go to ``<final>.data``.

    Weights still on disk (TorchScript's one file per tensor) are read one
    tensor at a time while writing, never all at once.
    """
    on_disk = any(isinstance(v.const_value, ir.ExternalTensor) for v in model.graph.initializers.values())
    data = _data_name(final) if external or on_disk else None
    # Asked for external data: every weight goes there but those whose data shape inference reads (a few
    # bytes each: ONNX Runtime cannot load a Reshape whose shape is on disk); streamed only: small ones stay inline.
    ir.save(model, str(final), external_data=data, size_threshold_bytes=_shape_bytes(model) if external else 1024)


def _shape_bytes(model: ir.Model) -> int:
    """The size of the largest initializer some node reads as a shape (:mod:`layertap.onnxfile.shape_inputs`)."""
    sizes = [0]
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        for k in SHAPE_INPUTS.get(node.op_type, ()) if node.domain in ("", "ai.onnx") else ():
            value = node.inputs[k] if k < len(node.inputs) else None
            if value is not None and value.const_value is not None and value.is_initializer():
                sizes.append(value.const_value.nbytes)
    return max(sizes)


def _data_name(onnx_path: Path) -> str:
    """The external data file layertap writes beside ``m.onnx``: ``m.onnx.data``."""
    return onnx_path.name + ".data"


def _publish(final: Path, out: Path) -> None:
    """Move the finished ``.onnx`` and its data file into place as one unit (see onnxfile.publish).

    Without a data file the finished file is renamed as it is; with one, the
    graph (weights left on disk) is read to point it at the data's new name.
    """
    data = final.parent / _data_name(final)
    if not data.exists():
        publish_file(final, out)
        return
    proto = onnx.load(str(final), load_external_data=False)
    referenced = data.name in external_locations(proto)  # ir.save may leave it empty, unused
    publish(proto, out, {data.name: data} if referenced else {})


# -- verification ------------------------------------------------------------


def _rows(model: ir.Model, wrapper: TapWrapper) -> list[ExportRow]:
    rows = []
    for v, info in zip(model.graph.outputs, wrapper.outputs):
        rows.append(ExportRow(
            name=v.name or "",
            source=info.selector if info.path is not None and info.selector is not None else "model output",
            shape=edit.shape_of(v),
            dtype=v.dtype.name.lower() if v.dtype is not None else "undefined",
        ))
    return rows


def _verify(final: Path, plan: _Plan, rows: list[ExportRow], rtol: float, atol: float) -> None:
    """Run ``final`` in ONNX Runtime and add one check per run to every row.

    Runs the example inputs (against the eager run's values) and, with a
    dynamic batch, a batch size unlike both the example's and the traced
    one. A run ONNX Runtime refuses (a size baked into a ``Reshape``) fails
    every row with ORT's message rather than stopping the export: the file
    is written, the report says what broke, the CLI exits 1.
    """
    # the runtime's engines keep ORT's log lines off stderr: a failing kernel logs
    # its error besides raising it, and the report already carries the message
    try:
        engine = open_runtime("ort").open_file(final)
    except Exception as e:
        raise LayertapError(f"ONNX Runtime cannot load the exported model: {_reason(e)}") from e
    runs: list[tuple[tuple, list, str | None]] = [(plan.example, plan.reference, None)]
    if plan.dynamic and any(t.dim() > 0 for t in plan.example):
        other = _other_batch(plan.example, plan.traced)
        with torch.no_grad():
            runs.append((other, plan.wrapper.run(other), None))
    if plan.sequence:  # another number of tokens (a past keeps its length)
        longer = llm.other_sequence(plan.example, plan.sequence, plan.input_names)
        with torch.no_grad():
            runs.append((longer, plan.wrapper.run(longer), None))
    flipped = contrasting(plan.example) if plan.branches else None
    if flipped is not None:  # may take the other branch of a traced ``if``
        with torch.no_grad():
            runs.append((flipped, plan.wrapper.run(flipped), "differs from PyTorch on the example's negated inputs, "
                         "which take another branch: the traced branch is baked into the file"))
        plan.notes.append("verified also on the example's negated inputs, which may take the other branch")
    for tensors, expected, why in runs:
        feeds = {n: tensor_to_numpy(t) for n, t in zip(plan.input_names, tensors)}
        batch = {n: int(t.shape[0]) for n, t in zip(plan.input_names, tensors) if t.dim() > 0}
        try:
            ran = engine.run(plan.output_names, feeds)
            got = [ran[n] for n in plan.output_names]
        except Exception as e:  # noqa: BLE001 - reported per row, see above
            problem = f"ONNX Runtime failed at batch {_batch_words(batch)}: {_reason(e)}"
            for row in rows:
                row.add(Check(batch, None, None, None, False, problem))
            continue
        for row, a, b in zip(rows, got, expected):
            check = check_output(a, tensor_to_numpy(b), rtol=rtol, atol=atol, batch=batch)
            if why and not check.ok and check.problem is None:
                check.problem = why
            row.add(check)
    if plan.cache:
        _verify_decode(engine, plan, rows, rtol, atol)


def _verify_decode(engine: Any, plan: _Plan, rows: list[ExportRow], rtol: float, atol: float) -> None:
    """A cache export decodes: a prefill from an empty past, then greedy steps fed their own cache."""
    logits = next(r for r in rows if r.name == "logits")
    ids = plan.example[0]
    try:
        calls = llm.verify_decode(engine, plan.wrapper.model, ids)
    except Exception as e:  # noqa: BLE001 - reported on the row, as a refused run is
        logits.add(Check({"input_ids": int(ids.shape[0])}, None, None, None, False,
                         f"ONNX Runtime failed to decode from an empty past: {_reason(e)}"))
        return
    worst = 0.0
    for position, got, ref in calls:
        check = check_output(got, ref, rtol=rtol, atol=atol, batch={"input_ids": int(ids.shape[0])})
        if not check.ok and check.problem is None:
            check.problem = f"differs from PyTorch at token {position} of the decode"
        logits.add(check)
        worst = max(worst, check.rel_err or 0.0)
    plan.notes.append(f"decoded in ONNX Runtime from an empty past: a prefill of {ids.shape[1]} tokens and "
                      f"{len(calls) - 1} greedy steps fed their own present.* as past_key_values.* (logits rel err "
                      f"up to {worst:.3g})")


def _batch_words(batch: dict[str, int]) -> str:
    """``3`` or ``pixel_values=3, input_ids=4``."""
    sizes = set(batch.values())
    if len(sizes) == 1:
        return str(next(iter(sizes)))
    return ", ".join(f"{k}={v}" for k, v in batch.items())


