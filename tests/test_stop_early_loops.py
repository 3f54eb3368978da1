"""stop_early through ``for blk in self.blocks`` over an nn.Sequential, and through
a loop body whose ``if self.grad_checkpointing: checkpoint(blk, x)`` branch is
dead: the forward stops after the tapped block, and the values equal a full run."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import layertap as lt
from layertap.pytorch import callgraph

timm = pytest.importorskip("timm")


class SeqLoop(nn.Module):
    """Iterates an nn.Sequential itself (timm's vit with a mask)."""

    def __init__(self, blocks: nn.Sequential) -> None:
        super().__init__()
        self.blocks = blocks
        self.grad_checkpointing = False

    def forward(self, x, masked: bool = True):
        if masked:
            for blk in self.blocks:
                if self.grad_checkpointing:
                    x = torch.utils.checkpoint.checkpoint(blk, x)
                else:
                    x = blk(x)
        else:
            x = self.blocks(x)
        return x


def _distinct() -> nn.Sequential:
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))


def _shared() -> nn.Sequential:
    lin = nn.Linear(4, 4)
    return nn.Sequential(lin, nn.ReLU(), lin)  # the same module twice: it runs twice


@pytest.mark.parametrize(
    "make, path, expected",
    [
        (_distinct, "blocks.0", "blocks.0"),
        (_distinct, "blocks.2", "blocks.2"),
        (_shared, "blocks.0", ""),  # the same Linear twice: only the end of forward completes it
    ],
)
def test_loop_over_a_sequential_proves_its_elements(make, path, expected):
    torch.manual_seed(0)
    model = SeqLoop(make()).eval()
    assert callgraph.completing_ancestor(model, path) == expected
    x = torch.randn(2, 4)
    full = lt.extract(model, x, taps=[path])
    early = lt.extract(model, x, taps=[path], stop_early=True)
    assert [k for k in early if not k.startswith("output")] == [k for k in full if not k.startswith("output")]
    for k in early:
        if not k.startswith("output"):
            torch.testing.assert_close(early[k], full[k], rtol=0, atol=0)


def _timm(name: str, **kw):
    torch.manual_seed(0)
    return timm.create_model(name, pretrained=False, **kw).eval()


@pytest.mark.parametrize(
    "name, kw, size",
    [
        ("vit_tiny_patch16_224", {"img_size": 32, "depth": 4}, 32),
        ("deit_tiny_patch16_224", {"img_size": 32, "depth": 4}, 32),
        ("eva02_tiny_patch14_224", {"img_size": 28, "depth": 4}, 28),
    ],
)
def test_timm_transformers_stop_after_the_tapped_block(name, kw, size):
    model = _timm(name, **kw)
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(3))
    taps = ["blocks.1", "blocks.1.attn", "blocks.0:input"]
    assert callgraph.completing_ancestor(model, "blocks.1") == "blocks.1"
    with torch.no_grad():
        full = lt.extract(model, x, taps=taps)
    ran = []
    h = model.blocks[2].register_forward_pre_hook(lambda *a: ran.append(1))
    try:
        with torch.no_grad():
            early = lt.extract(model, x, taps=taps, stop_early=True)
    finally:
        h.remove()
    assert not ran, "the forward went on past the last tapped block"
    assert set(taps) <= set(early)
    for t in taps:
        torch.testing.assert_close(early[t], full[t], rtol=0, atol=0)
