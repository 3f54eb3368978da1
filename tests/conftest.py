"""Shared fixtures: real architectures, random weights, fixed seeds.

Session-scoped so that a model is built (and exported) once per test worker.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Subprocesses may run in another folder (cwd=tmp_path): a relative PYTHONPATH (src) must still
# mean this checkout's sources.
if os.environ.get("PYTHONPATH"):
    os.environ["PYTHONPATH"] = os.pathsep.join(str(Path(p).resolve()) for p in os.environ["PYTHONPATH"].split(os.pathsep) if p)


@pytest.fixture(scope="session")
def torch_mod():
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    return torch


@pytest.fixture(scope="session")
def resnet18(torch_mod):
    """torchvision resnet18, random weights (seed 0), eval mode."""
    import torchvision

    torch_mod.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    # Non-trivial BatchNorm statistics, so that folding BN into Conv matters.
    with torch_mod.no_grad():
        for m in model.modules():
            if isinstance(m, torch_mod.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.1, 0.1)
    return model


@pytest.fixture(scope="session")
def resnet_input(torch_mod):
    g = torch_mod.Generator().manual_seed(1)
    return torch_mod.randn(2, 3, 64, 64, generator=g)


def _export(model, x, path: Path, dynamo: bool) -> Path:
    import torch

    kwargs = dict(input_names=["x"], output_names=["output"])
    if dynamo:
        torch.onnx.export(model, (x,), str(path), dynamo=True, **kwargs)
    else:
        torch.onnx.export(model, (x,), str(path), dynamo=False, **kwargs)
    return path


@pytest.fixture(scope="session")
def resnet_onnx_dynamo(resnet18, resnet_input, tmp_path_factory) -> Path:
    """resnet18 exported by plain ``torch.onnx.export(dynamo=True)`` (not by layertap)."""
    return _export(resnet18, resnet_input, tmp_path_factory.mktemp("rn_dyn") / "resnet18.onnx", True)


@pytest.fixture(scope="session")
def resnet_onnx_torchscript(resnet18, resnet_input, tmp_path_factory) -> Path:
    """resnet18 exported by plain ``torch.onnx.export(dynamo=False)``."""
    return _export(resnet18, resnet_input, tmp_path_factory.mktemp("rn_ts") / "resnet18.onnx", False)


def run_cli(*args: str, cwd: str | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run ``python -m layertap ARGS`` in a subprocess (the way users do)."""
    return subprocess.run(
        [sys.executable, "-m", "layertap", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
    )


@pytest.fixture
def cli():
    return run_cli


# The tiny Llama and its decoder files (GenAI builder fp32/int4, dynamo with a DynamicCache), once per session.
from _llm import llama, llama_dynamo_cache, llama_folder, llama_genai_fp32, llama_genai_int4  # noqa: E402,F401
