"""Small sample folders and a tiny CNN file for the dataset-extraction tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

TINY_CNN = '''
import os
import time
from pathlib import Path

import torch
from torch import nn


class Net(nn.Module):
    """conv -> relu -> conv -> head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        h = self.relu(self.conv2(self.relu(self.conv1(x))))
        return self.head(h.mean((2, 3)))


class GatedNet(Net):
    """Net, held where a test means to signal it: with TINYCNN_GATE naming a folder, forward call number
    TINYCNN_HOLD_AT (0-based) writes GATE/ready and waits until GATE/open exists. Without it, Net."""

    calls = 0

    def forward(self, x):
        gate = os.environ.get("TINYCNN_GATE")
        if gate and GatedNet.calls == int(os.environ["TINYCNN_HOLD_AT"]):
            (Path(gate) / "ready").touch()
            while not (Path(gate) / "open").exists():  # a signal raises here
                time.sleep(0.01)
        GatedNet.calls += 1
        return super().forward(x)


class Threads(nn.Module):
    """Each sample's output is torch.get_num_threads() during the forward; a negative input acts as Ctrl-C."""

    def __init__(self):
        super().__init__()
        self.count = nn.Identity()

    def forward(self, x):
        if bool((x < 0).any()):
            raise KeyboardInterrupt
        return self.count(torch.full((x.shape[0], 1), float(torch.get_num_threads())))
'''


def write_model(folder: Path) -> Path:
    path = folder / "tinycnn.py"
    path.write_text(TINY_CNN)
    return path


def npy_folder(folder: Path, n: int = 20, shape: tuple[int, ...] = (3, 16, 16), seed: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        np.save(folder / f"s{i:03d}.npy", rng.standard_normal(shape).astype(np.float32))
    return folder


def image_folder(folder: Path, n: int = 6, seed: int = 0) -> Path:
    """PNGs and JPEGs of different sizes in two sub-folders."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for i in range(n):
        sub = folder / ("cats" if i % 2 else "dogs")
        sub.mkdir(parents=True, exist_ok=True)
        h, w = int(rng.integers(40, 80)), int(rng.integers(40, 80))
        img = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        img.save(sub / f"img{i}.{'png' if i % 3 else 'jpg'}")
    return folder


def same_tree(a: Path, b: Path) -> list[str]:
    """Relative paths whose bytes differ between two folders (or exist in one only)."""
    fa = {p.relative_to(a).as_posix(): p for p in a.rglob("*") if p.is_file()}
    fb = {p.relative_to(b).as_posix(): p for p in b.rglob("*") if p.is_file()}
    diff = sorted(set(fa) ^ set(fb))
    diff += [k for k in sorted(set(fa) & set(fb)) if fa[k].read_bytes() != fb[k].read_bytes()]
    return diff
