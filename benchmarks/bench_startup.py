"""First use: ``layertap layers torchvision:resnet18`` vs a bare script doing the same work.

The bare script imports torch and torchvision, builds resnet18 and runs one
forward on a 1x3x224x224 input: the least any tool must do to list resnet18's
layers with shapes. Both run as fresh subprocesses (that is what a user waits
for), interleaved, after one warm-up round each (file cache); the medians and
their ratio are printed. Also timed: a bad MODEL spec and a misspelt torchvision/timm model name,
which layertap refuses before importing torch (goal: <= 1 s), and importing onnx and its
ml_dtypes, which every command on an ONNX file pays (the installed versions are printed).

    python benchmarks/bench_startup.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

BARE = (
    "import torch, torchvision\n"
    "model = torchvision.models.resnet18(weights=None).eval()\n"
    "with torch.no_grad():\n"
    "    model(torch.randn(1, 3, 224, 224))\n"
)

COMMANDS = {
    "bare script (import torch+torchvision, build, 1 forward)": [sys.executable, "-c", BARE],
    "layertap layers torchvision:resnet18": [sys.executable, "-m", "layertap", "layers", "torchvision:resnet18"],
    "layertap layers torchvision (bad spec, exit 2)": [sys.executable, "-m", "layertap", "layers", "torchvision"],
    "layertap layers torchvision:resnt18 (typo, exit 2)": [sys.executable, "-m", "layertap", "layers", "torchvision:resnt18"],
    "layertap layers timm:resnt18 (typo, exit 2)": [sys.executable, "-m", "layertap", "layers", "timm:resnt18"],
    "python -c pass (interpreter start)": [sys.executable, "-c", "pass"],
    # what every command on an ONNX file pays first: onnx imports ml_dtypes (0.7.0 took 0.68 s here)
    "python -c 'import ml_dtypes'": [sys.executable, "-c", "import ml_dtypes"],
    "python -c 'import onnx, onnxruntime'": [sys.executable, "-c", "import onnx, onnxruntime"],
}


def _time(cmd: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - t0
    if proc.returncode not in (0, 2):
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-500:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    ns = parser.parse_args()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])))
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for cmd in COMMANDS.values():  # warm-up: file cache, .pyc
        _time(cmd, env)
    for _ in range(ns.rounds):
        for name, cmd in COMMANDS.items():
            times[name].append(_time(cmd, env))
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    bare, layers = list(medians.values())[:2]
    print(f"medians of {ns.rounds} interleaved rounds (fresh processes, after one warm-up each):")
    for name, m in medians.items():
        spread = f"{min(times[name]):.2f}-{max(times[name]):.2f}"
        print(f"  {name:58s} {m:6.2f} s  (range {spread})")
    print(f"layertap layers / bare script: {layers / bare:.2f}x  (goal: <= 1.5x)")
    print("versions: " + ", ".join(f"{d} {version(d)}" for d in ("onnx", "ml_dtypes", "onnxruntime", "numpy")))


if __name__ == "__main__":
    main()
