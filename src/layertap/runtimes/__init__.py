"""The runtimes, each a plug-in behind one candidate protocol (:mod:`.plugins`): ONNX Runtime and OpenVINO run
ONNX graphs (or an OpenVINO IR) with chosen tensors exposed (engines: :mod:`.protocol`), ExecuTorch runs
programs lowered from the model; :func:`open_runtime` opens any of them by name, and every session and
every run layertap makes of a file goes through them. Here too the public functions
that need a runtime: ``lt.run``, and ``lt.add_outputs`` / ``lt.onnx_layers`` (file edits and reads of
:mod:`layertap.onnxfile`, with ONNX Runtime typing the tensors shape inference leaves open).
Never imports torch.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from ..errors import LayertapError
from .plugins import (
    DEFAULT_RUNTIME,
    ProgramPlugin,
    RuntimePlugin,
    RuntimeSettings,
    TappedProgram,
    a_program,
    default_plugin,
    is_ir,
    plugin,
    plugin_for,
    register_runtime,
    runtime_for,
    runtime_names,
)
from .protocol import Engine, InputInfo, Runtime, RuntimeInfo

if TYPE_CHECKING:  # pragma: no cover
    from ..onnxfile.modelfile import ModelFile
    from ..onnxfile.tensor_table import OnnxLayers

__all__ = ["DEFAULT_RUNTIME", "Engine", "InputInfo", "ProgramPlugin", "Runtime", "RuntimeInfo", "RuntimePlugin",
           "RuntimeSettings", "TappedProgram", "add_outputs", "default_plugin", "exact_runtime", "is_ir", "onnx_layers",
           "open_runtime", "plugin", "plugin_for", "register_runtime", "run", "runtime_for", "runtime_names"]


def exact_runtime() -> Runtime:
    """The runtime an ideal run computes a graph in: every node as the file writes it, no fusion
    (ONNX Runtime with its graph optimisations off), so that the ideal's only rounding is the one
    it was given.

    Example:
        >>> exact_runtime().settings()
        'with graph optimisations disabled (ORT_DISABLE_ALL)'
    """
    return open_runtime(DEFAULT_RUNTIME, optimize=False)


def open_runtime(runtime: str = DEFAULT_RUNTIME, *, providers: Sequence[str] | str | None = None, optimize: bool | None = None,
                 ov_precision: str | None = None, ov_device: str | None = None) -> Runtime:
    """The runtime named ``runtime`` (``ort``, ``openvino``, ``executorch``: ExecuTorch programs, or one
    registered with :func:`register_runtime`) with its settings checked by its plug-in.

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
    return plugin(runtime).open(RuntimeSettings(providers, optimize, ov_precision, ov_device))


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

    own = plugin_for(path)
    chosen = plugin(runtime) if runtime is not None else own
    if (chosen is not None and chosen.form == "program") or (own is not None and own.form == "program"):
        return _run_program(path, own, chosen, inputs, taps, seed, notify, (providers, ov_precision, ov_device))
    runtime = runtime or (own.name if own is not None else "ort")
    engine = open_runtime(runtime, providers=providers, ov_precision=ov_precision, ov_device=ov_device)
    if is_ir(path):
        from .openvino import ir_file

        session = TappedSession(ir_file(engine, path), engine, taps, file=Path(path))
    else:
        session = TappedSession(path, engine, taps)
    return session.run(inputs, seed=seed, notify=notify, flatten=False)


def _run_program(path: str | os.PathLike, own: RuntimePlugin | None, chosen: RuntimePlugin | None, inputs: Any,
                 taps: Sequence[str], seed: int, notify: Callable[[str], None] | None, settings: tuple) -> dict[str, Any]:
    """``run`` of a program: in the runtime that made it, which alone runs it (its taps: those it was exported with)."""
    if own is None:
        assert chosen is not None  # a program runtime was asked for by name
        raise LayertapError(f"{chosen.title} runs {chosen.title} programs ({', '.join(chosen.suffixes)}); '{path}' "
                            "is not one: run it with --runtime ort or openvino")
    if chosen is not own or any(v is not None for v in settings):
        raise LayertapError(f"'{path}' is {a_program(own)}: it runs in {own.title} only (drop --runtime, "
                            "--providers, --ov-precision and --ov-device)")
    return own.run(Path(path), inputs, taps, seed=seed, notify=notify)  # type: ignore[attr-defined]


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
    OpenVINO IR's tensors as :func:`~layertap.runtimes.openvino.ir_file` reads them; a program's inputs and
    outputs as its runtime lists them: an ExecuTorch program, an AOTInductor package); tensors
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

    found = plugin_for(path)
    if found is not None and found.form == "program":  # a program lists its inputs and outputs itself
        return found.layers(Path(str(path)))  # type: ignore[attr-defined]
    return tensor_table.onnx_layers(path, typer=ort_typer())
