"""The engines that run an ONNX file (or an OpenVINO IR) with chosen tensors exposed: ONNX Runtime
and OpenVINO behind one small protocol (:mod:`.base`), opened by :func:`open_runtime`. Never imports torch.
"""

from __future__ import annotations

from typing import Sequence

from ..errors import LayertapError, unknown_name
from .base import Engine, InputInfo, Runtime, RuntimeInfo

__all__ = ["RUNTIMES", "Engine", "InputInfo", "Runtime", "RuntimeInfo", "open_runtime"]

#: the runtimes ``--runtime`` names
RUNTIMES = ("ort", "openvino")


def open_runtime(name: str = "ort", *, providers: Sequence[str] | str | None = None, optimize: bool = True,
                 ov_precision: str | None = None, ov_device: str | None = None) -> Runtime:
    """The runtime ``name`` (``ort`` or ``openvino``) with its settings checked.

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
    if name not in RUNTIMES:
        raise LayertapError(unknown_name("runtime", str(name), list(RUNTIMES),
                                         hint="use ort or openvino; ONNX Runtime's execution providers are picked with --providers"))
    if name == "ort":
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
