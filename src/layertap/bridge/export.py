"""``lt.export``: a model (or any method of it) to ONNX, with taps as named outputs.

How it works:

1. :class:`~layertap.bridge._wrapper.TapWrapper` runs the method with a
   :class:`~layertap.pytorch.capture.Capture` attached and returns the
   method's own result flattened (``output``, ``output[0]``,
   ``output[logits]``...) followed by every tapped tensor, in the order the
   taps were given. One eager run fixes the names.
2. The wrapper is exported (torch.export-based exporter by default, the
   TorchScript exporter on request or as a fallback). With a dynamic batch,
   each input's first dimension gets its own symbol (``torch.export.Dim.DYNAMIC``,
   so inputs the model ties together share one); an example batch of 1 is
   repeated to 2 first, because torch.export specialises sizes 0 and 1.
3. The graph is edited without loading its weights: inputs and outputs get
   their names, every output becomes a distinct tensor (an ``Identity`` for an
   output that repeats another or is a graph input, pytorch#167848), batch
   symbols are named ``batch`` / ``batch_<input>``, and the tap list is written
   to the model's ``metadata_props`` under ``layertap.taps``.
4. ONNX Runtime runs the file on the example inputs and, with a dynamic
   batch, on a second batch size different from the exported one; every
   output is compared with PyTorch (see :mod:`layertap.bridge._verify` for
   the error measures).
5. The file appears only when all of that worked: it is built in a hidden
   folder beside the target and renamed into place (the external data file
   first, then the ``.onnx`` that refers to it by its final name).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import onnx
import torch
from torch import nn

from ..errors import InputSpecError, LayertapError
from ..files import check_output_path
from ..selectors import Tap, parse_taps
from . import _onnxedit as edit
from ._verify import ExportReport, ExportRow, compare
from .tolerance import DEFAULT_ATOL, DEFAULT_RTOL
from ._wrapper import TapWrapper, input_names as signature_names

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
    dynamic_batch: bool = True,
    verify: bool = True,
    exporter: str = "dynamo",
    opset: int | None = None,
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
    input_names: Sequence[str] | None = None,
    kwargs: dict | None = None,
    fallback: bool = False,
    external_data: bool | None = None,
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
        verify: run the file in ONNX Runtime and compare with PyTorch.
        exporter: ``"dynamo"`` (torch.export-based, default) or ``"torchscript"``.
        opset: ONNX opset version (exporter default when ``None``).
        rtol, atol: verification tolerances (see :mod:`layertap.bridge._verify`).
        input_names: names for the tensor inputs; default from the method's
            signature (``x``, ``pixel_values``, ``input_ids``...).
        kwargs: keyword arguments of the call.
        fallback: when the dynamo exporter fails, try the TorchScript one
            (the report says so) instead of raising.
        external_data: store weights in ``<path>.data``; default: only when
            they exceed 1.9 GiB.

    Returns:
        An :class:`~layertap.bridge._verify.ExportReport`: one row per graph
        output (model outputs first, then taps) with the declared shape, the
        batch sizes run, max abs/rel error and pass/fail; ``.ok`` is False
        when any output is out of tolerance (the file is still written).

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
    out = check_output_path(path, suffixes=(".onnx",))
    if exporter not in EXPORTERS:
        raise LayertapError(f"unknown exporter {exporter!r}; use one of: {', '.join(EXPORTERS)}")
    if not isinstance(model, nn.Module):
        raise LayertapError(f"expected a torch.nn.Module, got {type(model).__name__}")
    args = _as_args(args)
    kwargs = dict(kwargs or {})
    parsed = parse_taps(taps)
    wrapper = TapWrapper(model, method, parsed, args, kwargs)
    names_in = _input_names(input_names, model, method, args, kwargs, len(wrapper.example_tensors))
    notes: list[str] = []
    if model.training:
        notes.append("the model is in training mode (dropout, batch statistics); call model.eval() before export")

    example = wrapper.example_tensors
    export_tensors = _widen_batch(example) if dynamic_batch else example
    if export_tensors is not example and any(a.shape != b.shape for a, b in zip(example, export_tensors)):
        notes.append("example batch of 1 was repeated to 2 for export, so the batch dimension stays symbolic")
    external = external_data if external_data is not None else _weight_bytes(model) > EXTERNAL_DATA_BYTES

    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as work:
        raw = Path(work, "export", out.name)
        final = Path(work, "final", out.name)
        raw.parent.mkdir()
        final.parent.mkdir()
        # The exporter's trace is the wrapper's first run: it fixes the output
        # names, so no separate eager run is needed when not verifying.
        used = _run_exporter(wrapper, export_tensors, raw, names_in, exporter, fallback, dynamic_batch, opset, external, notes)
        names_out = [o.name for o in wrapper.outputs]
        clash = set(names_in) & set(names_out)
        if clash:
            raise LayertapError(
                f"input name {sorted(clash)[0]!r} is also an output name; rename the input (input_names=) or alias the tap"
            )

        proto = onnx.load(str(raw), load_external_data=False)
        edit.name_inputs(proto.graph, names_in)
        n_identity = edit.name_outputs(proto.graph, names_out)
        if n_identity:
            notes.append(f"{n_identity} output(s) repeat another output or an input; each got its own Identity node")
        if dynamic_batch:
            edit.name_batch_symbols(proto, names_in)
        edit.set_taps_metadata(proto, [o.record() for o in wrapper.outputs])
        _save(proto, raw, final, external)

        rows = _rows(proto, wrapper)
        if verify:
            _verify(final, wrapper, names_in, names_out, example, export_tensors, rows, rtol, atol, dynamic_batch)
        _publish(final, out)

    inputs = {vi.name: edit.shape_of(vi) for vi in edit._real_inputs(proto.graph)}
    return ExportReport(rows, path=str(out), exporter=used, inputs=inputs, rtol=rtol, atol=atol,
                        verified=verify, notes=notes)


# -- preparation -------------------------------------------------------------
def _as_args(args: Any) -> tuple:
    if isinstance(args, torch.Tensor):
        return (args,)
    if isinstance(args, list):
        return tuple(args)
    if isinstance(args, tuple):
        return args
    raise InputSpecError(f"args must be a tensor or a tuple of arguments, got {type(args).__name__}")


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
    g = torch.Generator().manual_seed(seed)
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
            noise = torch.randn(extra.shape, generator=g).to(device=t.device, dtype=t.dtype)
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
def _run_exporter(wrapper, tensors, raw: Path, names_in, exporter, fallback, dynamic, opset, external, notes) -> str:
    if exporter == "torchscript":
        _export_torchscript(wrapper, tensors, raw, names_in, dynamic, opset)
        return "torchscript"
    try:
        _export_dynamo(wrapper, tensors, raw, dynamic, opset, external)
        return "dynamo"
    except Exception as e:  # noqa: BLE001 - any exporter failure is reported in one line
        _reraise_own(e)
        why = _reason(e)
        if not fallback:
            raise LayertapError(
                f"the dynamo exporter (torch.export) failed: {why}; try --exporter torchscript "
                "(exporter='torchscript'), or --fallback to try it automatically"
            ) from e
        notes.append(f"the dynamo exporter failed ({why}); fell back to the TorchScript exporter")
    for leftover in raw.parent.iterdir():
        leftover.unlink()
    _export_torchscript(wrapper, tensors, raw, names_in, dynamic, opset)
    return "torchscript"


def _export_dynamo(wrapper, tensors, raw: Path, dynamic: bool, opset, external: bool) -> None:
    options: dict[str, Any] = {}
    if dynamic:
        # forward(*tensors): one spec per tensor, nested in the varargs slot.
        dims = tuple({0: torch.export.Dim.DYNAMIC} if t.dim() > 0 else None for t in tensors)
        options["dynamic_shapes"] = (dims,)
    if opset is not None:
        options["opset_version"] = opset
    with _quiet():
        torch.onnx.export(wrapper, tuple(tensors), str(raw), dynamo=True, verbose=False,
                          external_data=external, **options)


def _export_torchscript(wrapper, tensors, raw: Path, names_in, dynamic: bool, opset) -> None:
    options: dict[str, Any] = {"input_names": list(names_in)}
    if dynamic:
        options["dynamic_axes"] = {n: {0: f"batch_{n}"} for n, t in zip(names_in, tensors) if t.dim() > 0}
    if opset is not None:
        options["opset_version"] = opset
    try:
        with _quiet():
            torch.onnx.export(wrapper, tuple(tensors), str(raw), dynamo=False, **options)
    except Exception as e:  # noqa: BLE001
        _reraise_own(e)
        raise LayertapError(f"the torchscript exporter failed: {_reason(e)}") from e


def _reraise_own(e: BaseException) -> None:
    """A bad tap found while the exporter traced is the user's error, not the exporter's."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, LayertapError):
            raise e
        seen.add(id(e))
        e = e.__cause__ or e.__context__


@contextlib.contextmanager
def _quiet():
    """Silence the exporters' chatter; real problems still raise.

    torch.export logs guards and prints graph dumps on stderr (pages of them
    when it fails), which would bury the one-line error; the exception itself
    keeps the details (``--debug`` shows them).
    """
    previous = logging.root.manager.disable
    logging.disable(max(previous, logging.WARNING))
    try:
        with warnings.catch_warnings(), torch.no_grad(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            yield
    finally:
        logging.disable(previous)


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


# -- files -------------------------------------------------------------------
def _save(proto: onnx.ModelProto, raw: Path, final: Path, external: bool) -> None:
    """Write the edited graph; external data ends up in ``<final>.data``."""
    data_name = final.name + ".data"
    locations = edit.external_locations(proto)
    if not locations and not external:
        onnx.save_model(proto, str(final))
    elif locations == {data_name} and (raw.parent / data_name).is_file():
        # The exporter already wrote one data file under the final name: move
        # it; the graph refers to it by that relative name.
        os.replace(raw.parent / data_name, final.parent / data_name)
        onnx.save_model(proto, str(final))
    else:
        onnx.load_external_data_for_model(proto, str(raw.parent))
        onnx.save_model(proto, str(final), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data_name, size_threshold=1024)


def _publish(final: Path, out: Path) -> None:
    data = final.parent / (final.name + ".data")
    if data.exists():
        # The data file first, so the .onnx never points at a missing file.
        os.replace(data, out.parent / data.name)
    os.replace(final, out)


# -- verification ------------------------------------------------------------
_ONNX_DTYPES = {v: k for k, v in onnx.TensorProto.DataType.items()}


def _rows(proto: onnx.ModelProto, wrapper: TapWrapper) -> list[ExportRow]:
    rows = []
    for vi, info in zip(proto.graph.output, wrapper.outputs):
        elem = vi.type.tensor_type.elem_type
        rows.append(ExportRow(
            name=vi.name,
            source=info.selector if info.path is not None else "model output",
            shape=edit.shape_of(vi),
            dtype=_ONNX_DTYPES.get(elem, str(elem)).lower(),
        ))
    return rows


def _verify(final, wrapper, names_in, names_out, example, exported, rows, rtol, atol, dynamic) -> None:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    try:
        sess = ort.InferenceSession(str(final), opts, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001
        raise LayertapError(f"ONNX Runtime cannot load the exported model: {_reason(e)}") from e
    runs = [example]
    if dynamic and any(t.dim() > 0 for t in example):
        runs.append(_other_batch(example, exported))
    for tensors in runs:
        with torch.no_grad():
            expected = wrapper.run(tensors)
        feeds = {n: _numpy(t) for n, t in zip(names_in, tensors)}
        batch = {n: int(t.shape[0]) for n, t in zip(names_in, tensors) if t.dim() > 0}
        got = sess.run(names_out, feeds)
        for row, a, b in zip(rows, got, expected):
            row.add(compare(a, _numpy(b), rtol=rtol, atol=atol, batch=batch))


def _numpy(t: torch.Tensor):
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.numpy()
