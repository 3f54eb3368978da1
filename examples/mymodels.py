"""Small models for the README's examples (``layertap ... examples/mymodels.py:Net``).

``Net`` is a plain CNN for 3x32x32 images. ``Gated`` branches on a tensor
value, which the TorchScript exporter bakes into one branch (see ``--fallback``).
"""

import torch
from torch import nn


class Net(nn.Module):
    """Two conv blocks and a linear head for 3x32x32 inputs."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.fc = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.features(x), 1))


class Gated(nn.Module):
    """A layer whose result depends on a tensor value: a data-dependent ``if``."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        if x.sum() > 0:
            return torch.relu(h)
        return -h
