"""Whether a model's weights fit in memory, checked on the meta device before any
weight is allocated."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from torch import nn

from ..errors import ModelSpecError


class ModelTooLargeError(ModelSpecError):
    """A model whose weights alone would not fit in the available memory.

    Attributes:
        need: bytes of parameters and buffers.
        available: bytes of memory available.
    """

    def __init__(self, message: str, need: int, available: int) -> None:
        super().__init__(message)
        self.need = need
        self.available = available


# Leave room for activations, the interpreter and torch itself.
MEMORY_HEADROOM = 0.8


def check_fits(model: nn.Module, spec: str, config_path: str | os.PathLike | None = None,
               max_bytes: int | None = None) -> None:
    """Raise :class:`ModelTooLargeError` when ``model`` (built on meta) would not fit in memory
    (or would take more than ``max_bytes``).

    Example:
        >>> import torch
        >>> with torch.device("meta"):
        ...     huge = nn.Linear(1 << 20, 1 << 20)  # 2**40 parameters, 4 TiB in float32
        >>> check_fits(huge, "big:Linear")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        layertap.pytorch.memory.ModelTooLargeError: big:Linear needs about 4096.0 GiB for its weights ...
    """
    need = model_bytes(model)
    available = available_memory()
    limits = [b for b in (max_bytes, available and MEMORY_HEADROOM * available) if b]
    if not limits or need <= min(limits):
        return
    available = available or need
    params = sum(p.numel() for p in model.parameters())
    fix = (f"make the config in '{config_path}' smaller" if config_path is not None
           else "pass a smaller --config FILE.json")
    raise ModelTooLargeError(
        f"{spec} needs about {need / 2**30:.1f} GiB for its weights ({_count(params)} parameters) but "
        f"{available / 2**30:.1f} GiB of memory is available; {fix} (fewer num_hidden_layers, a smaller "
        "hidden_size; e.g. examples/tiny-bert.json)",
        need, available,
    )


def model_bytes(model: nn.Module) -> int:
    """Bytes of a model's parameters and buffers (works on the meta device: nothing is read).

    Example:
        >>> model_bytes(nn.Linear(10, 10))
        440
    """
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def available_memory() -> int | None:
    """Bytes of memory this process can still use: MemAvailable, capped by a cgroup limit."""
    values = []
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                values.append(int(line.split()[1]) * 1024)
    with contextlib.suppress(OSError, ValueError):
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            values.append(int(limit) - used)
    return min(values) if values else None


def _count(n: int) -> str:
    return f"{n / 1e9:.1f} billion" if n >= 1e9 else f"{n / 1e6:.1f} million" if n >= 1e6 else f"{n:,}"
