"""The engines that run an ONNX file (or an OpenVINO IR) with chosen tensors exposed: ONNX Runtime
and OpenVINO behind one small protocol (:mod:`.base`), opened by :func:`open_runtime`; every
session and every run layertap makes of a file goes through them. Here too the public functions
that need a runtime: ``lt.run``, and ``lt.add_outputs`` / ``lt.onnx_layers`` (file edits and reads of
:mod:`layertap.onnxfile`, with ONNX Runtime typing the tensors shape inference leaves open).
Never imports torch.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from ..errors import LayertapError, unknown_name
from .protocol import Engine, InputInfo, Runtime, RuntimeInfo, is_ir, runtime_for

if TYPE_CHECKING:  # pragma: no cover
    from ..onnxfile.modelfile import ModelFile
    from ..onnxfile.tensor_table import OnnxLayers

__all__ = ["RUNTIMES", "Engine", "InputInfo", "Runtime", "RuntimeInfo", "add_outputs", "is_ir", "onnx_layers",
           "open_runtime", "run", "runtime_for"]

#: the runtimes ``--runtime`` names
RUNTIMES = ("ort", "openvino", "executorch")


def open_runtime(runtime: str = "ort", *, providers: Sequence[str] | str | None = None, optimize: bool = True,
                 ov_precision: str | None = None, ov_device: str | None = None) -> Runtime:
    """The runtime named ``runtime`` (``ort``, ``openvino``, or ``executorch``: ExecuTorch programs) with its
    settings checked.

    ``providers``/``optimize`` are ONNX Runtime's (execution providers, graph optimisations);
    ``ov_precision`` (``f32``, ``bf16``, ``f16``; default the device's) and ``ov_device`` (``CPU``,
    ``GPU``, ``NPU``) are OpenVINO's, and refused with ONNX Runtime.

    Example:
        >>> open_runtime("ort").describe().runtime
        'ONNX Runtime'
        >>> open_runtime("tensorrt")
        Traceback (most recent call last):
        ...
        layertap.errors.LayertapError: unknown runtime 'tensorrt' ...
    """
    if runtime not in RUNTIMES:
        raise LayertapError(unknown_name("runtime", str(runtime), list(RUNTIMES),
                                         hint="use ort, openvino or executorch; ONNX Runtime's execution providers are "
                                              "picked with --providers"))
    if runtime == "executorch":
        if providers is not None or ov_precision is not None or ov_device is not None:
            raise LayertapError("--providers, --ov-precision and --ov-device apply to ONNX Runtime and OpenVINO; an "
                                "ExecuTorch program runs on the backend it was lowered for")
        from .executorch import ExecuTorchRuntime

        return ExecuTorchRuntime()
    if runtime == "ort":
        if ov_precision is not None or ov_device is not None:
            raise LayertapError("--ov-precision and --ov-device (ov_precision=, ov_device=) apply to the OpenVINO "
                                "runtime; add --runtime openvino (runtime='openvino')")
        from .ort import OrtRuntime

        return OrtRuntime(providers, optimize)
    if providers is not None:
        raise LayertapError("--providers (providers=) picks ONNX Runtime's execution providers; with --runtime "
                            "openvino pick the device with --ov-device")
    from .openvino import OpenVinoRuntime

    return OpenVinoRuntime(ov_device or "CPU", ov_precision)


def run(
    path: str | os.PathLike,
    inputs: Mapping[str, Any] | Sequence[Any] | None = None,
    taps: Sequence[str] = (),
    *,
    seed: int = 0,
    notify: Callable[[str], None] | None = None,
    runtime: str | None = None,
    providers: Sequence[str] | str | None = None,
    ov_precision: str | None = None,
    ov_device: str | None = None,
) -> dict[str, Any]:
    """Run ``path`` in ONNX Runtime (CPU; ``runtime="openvino"``: OpenVINO, the default for an OpenVINO
    IR, which nothing else runs; an ExecuTorch program ``.pte`` in ExecuTorch, its taps the outputs it was
    exported with: :func:`.executorch.run_program`); return the model outputs and the taps.

    ``inputs``: dict name -> array (or :class:`~layertap.inputs.InputSpec`), a
    list in input order, or ``None``. Inputs left out are generated as the model
    accepts them (:mod:`layertap.onnxfile.feeds`); ``notify`` receives one line
    saying what was generated. ``taps``: module selectors (``layer3.1``,
    ``layer2.0.relu#1``), tensor names, or names recorded by ``lt.export``;
    repeats count once. The result holds the model's outputs first (a single
    output is named ``output``), then each tap; a sequence-valued one (``SequenceConstruct``,
    ``SplitToSequence``) is the list of its tensors, as ONNX Runtime gives it (``run -o FILE`` saves its
    elements as ``NAME[0]``, ``NAME[1]``, ...).
    ``providers`` (ONNX Runtime), ``ov_precision``/``ov_device`` (OpenVINO): see :func:`open_runtime`.

    Example:
        >>> import tempfile
        >>> from layertap.onnxfile.samples import write_tiny_model
        >>> path = str(write_tiny_model(tempfile.mkdtemp()))  # y = -relu(x); modules act, neg
        >>> import layertap as lt
        >>> acts = lt.run(path, taps=["act"])
        >>> list(acts), acts["act"].shape, bool((acts["act"] == -acts["output"]).all())
        (['output', 'act'], (1, 4), True)
        >>> bool((lt.run(path, taps=["act"], runtime="openvino")["act"] == acts["act"]).all())
        True
    """
    from .runner import TappedSession

    own = runtime_for(path)
    if own == "executorch" or runtime == "executorch":
        if own != "executorch":
            raise LayertapError(f"ExecuTorch runs ExecuTorch programs (.pte); '{path}' is not one: run it with "
                                "--runtime ort or openvino")
        if runtime not in (None, "executorch") or providers is not None or ov_precision is not None or ov_device:
            raise LayertapError(f"'{path}' is an ExecuTorch program: it runs in ExecuTorch only (drop --runtime, "
                                "--providers, --ov-precision and --ov-device)")
        from .executorch import run_program

        return run_program(path, inputs, taps, seed=seed, notify=notify)
    runtime = runtime or own or "ort"
    engine = open_runtime(runtime, providers=providers, ov_precision=ov_precision, ov_device=ov_device)
    if is_ir(path):
        from .openvino import ir_file

        session = TappedSession(ir_file(engine, path), engine, taps, file=Path(path))
    else:
        session = TappedSession(path, engine, taps)
    return session.run(inputs, seed=seed, notify=notify, flatten=False)


def add_outputs(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    tensors: Sequence[str] = (),
    modules: Sequence[str] = (),
    all: bool = False,  # noqa: A002 - the public keyword (add_outputs(all=True)) is part of the API
) -> list[str]:
    """Write a copy of ``src`` to ``dst`` with extra graph outputs; return their names.

    ``tensors`` are ONNX tensor names (node outputs, graph inputs, initializers);
    ``modules`` are tap selectors of PyTorch module paths (``layer3.1``,
    ``layer2.0.relu#1``, ``fc:input``), resolved through the exporter's scope
    information; ``all=True`` marks every node output (and warns: it blocks ORT
    fusions). The original outputs stay first and unchanged; ``src`` is never
    modified and ``dst`` is written atomically. Tensors shape inference cannot type
    (ops ONNX does not know) are typed by ONNX Runtime
    (:func:`layertap.onnxfile.outputs.add_outputs` with :func:`.ort.ort_typer`).

    Example:
        >>> import tempfile
        >>> from layertap.onnxfile.samples import write_tiny_model
        >>> path = str(write_tiny_model(tempfile.mkdtemp()))  # y = -relu(x); modules act, neg
        >>> import layertap as lt
        >>> lt.add_outputs(path, path.replace("m.onnx", "tapped.onnx"), modules=["act"])
        ['act']
    """
    from ..onnxfile import outputs
    from .ort import ort_typer

    return outputs.add_outputs(src, dst, tensors, modules, all, typer=ort_typer())


def onnx_layers(path: "str | os.PathLike | ModelFile") -> "OnnxLayers":
    """List the tensors of an ONNX file (weights are not read), or of a file already read (an
    OpenVINO IR's tensors as :func:`~layertap.runtimes.openvino.ir_file` reads them); tensors
    shape inference cannot type are typed by ONNX Runtime, as :func:`add_outputs` types them
    (:func:`layertap.onnxfile.tensor_table.onnx_layers` with :func:`.ort.ort_typer`).

    Example:
        >>> import tempfile, layertap as lt
        >>> from layertap.onnxfile.samples import write_tiny_model
        >>> path = str(write_tiny_model(tempfile.mkdtemp()))  # y = -relu(x); modules act, neg
        >>> [(r.name, r.op, r.module) for r in lt.onnx_layers(path)]
        [('x', 'input', None), ('/act/Relu_output_0', 'Relu', 'act'), ('y', 'Neg', 'neg')]
    """
    from ..onnxfile import tensor_table
    from .ort import ort_typer

    return tensor_table.onnx_layers(path, typer=ort_typer())
