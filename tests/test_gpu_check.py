"""benchmarks/gpu_check.py on a machine without a GPU: it says what it skipped and exits 0."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_check.py"


def test_gpu_check_prints_what_it_skips_without_cuda():
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this machine has the CUDA provider: the check runs for real here")
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "skipped: no CUDA provider (install onnxruntime-gpu; it needs CUDA 12 and cuDNN 9)" in lines
    assert any(line.startswith("skipped: no TensorRT provider") for line in lines)
    assert "compared" not in done.stdout and "CPU vs" not in done.stdout  # nothing ran, nothing claimed


def test_gpu_check_help_names_what_it_needs():
    done = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    assert "onnxruntime-gpu" in done.stdout and "--images" in done.stdout


def test_gpu_checks_run_on_the_cpu_as_written(capsys):
    """The checks a GPU machine runs call the library as it is today (run here on the CPU)."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(SCRIPT.parent))
    gpu_check.extract_on("cpu", 4, 32)
    out = capsys.readouterr().out
    assert "extract_dataset" in out and "for 4 samples" in out and "layer2 0.0e+00, layer4 0.0e+00" in out
