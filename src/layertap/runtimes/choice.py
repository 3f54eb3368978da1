"""Which runtime runs each side of a comparison, opened with the settings that are its own: the one place the
options a user gives (``--runtime``, ``--cand-runtime``, ``--providers``, ``--ov-precision``, ...) become runtimes.
"""

from __future__ import annotations

from typing import Any

from ..errors import LayertapError
from ..options import RuntimeOptions
from . import open_runtime


def side_runtimes(onnx_ref: bool, runs: RuntimeOptions, own: tuple[str | None, str | None] = (None, None)
                  ) -> tuple[Any, Any]:
    """The reference's runtime (``None`` for a PyTorch reference) and the candidate's, each opened by
    :func:`~layertap.runtimes.open_runtime`; OpenVINO's options go to the sides that run OpenVINO.
    A side whose file only one runtime runs (``own``: :func:`~layertap.runtimes.runtime_for` of the
    reference and of the candidate; an OpenVINO IR) runs there unless told otherwise. ORT's graph
    optimisations per side (the reference's ``None``: the candidate's); turning them off for a side that
    OpenVINO runs is refused, not ignored."""
    runtime, cand_runtime, ov_precision, ov_device = runs.runtime, runs.cand_runtime, runs.ov_precision, runs.ov_device
    providers = (runs.providers, runs.cand_providers)
    if runs.autocast is not None or runs.compile_mode is not None or runs.compile_backend is not None:
        raise LayertapError("--autocast and --compile-mode (autocast=, compile_mode=, compile_backend=) apply to a "
                            "compiled PyTorch candidate: layertap compare MODEL --cand-runtime inductor "
                            "(lt.compare(model, x, torch.compile(model)))")
    optimize = (runs.ref_ort_optimizations, runs.ort_optimizations)
    if providers[0] is not None and not onnx_ref:
        raise LayertapError(
            "--providers (providers=) picks the execution providers of an ONNX reference, and REF here is a PyTorch "
            "model; give the candidate's providers with --cand-providers (cand_providers=)"
        )
    if not onnx_ref and runtime is not None and cand_runtime is not None and runtime != cand_runtime:
        raise LayertapError("with a PyTorch reference only the candidate runs a file: give --runtime or "
                            "--cand-runtime (runtime= or cand_runtime=), not both")
    ref_name = (runtime or own[0] or "ort") if onnx_ref else None
    cand_name = cand_runtime or own[1] or (runtime if onnx_ref or runtime else None) or ref_name or "ort"
    if "openvino" not in (ref_name, cand_name) and (ov_precision is not None or ov_device is not None):
        raise LayertapError("--ov-precision and --ov-device (ov_precision=, ov_device=) apply to the OpenVINO runtime; "
                            "add --runtime openvino or --cand-runtime openvino")

    def opened(name: str, side: int) -> Any:
        ov: dict[str, str | None] = dict(ov_precision=ov_precision, ov_device=ov_device) if name == "openvino" else {}
        asked = optimize[side]
        if name == "openvino" and asked is False:
            flag = ("--ref-no-ort-opt (ref_ort_optimizations=False)", "the reference") if side == 0 else \
                ("--no-ort-opt (ort_optimizations=False)", "the candidate")
            raise LayertapError(f"{flag[0]} turns off ONNX Runtime's graph optimisations, but OpenVINO runs {flag[1]} "
                                "(its own graph transformations always apply); drop the option, or run that side in "
                                "ONNX Runtime (--runtime/--cand-runtime ort)")
        if name == "openvino":  # ONNX Runtime's switch, inherited from the other side: not OpenVINO's to take
            return open_runtime(name, providers=providers[side], ov_precision=ov_precision, ov_device=ov_device)
        return open_runtime(name, providers=providers[side], optimize=optimize[1] if asked is None else asked, **ov)

    return (opened(ref_name, 0) if ref_name else None), opened(cand_name, 1)
