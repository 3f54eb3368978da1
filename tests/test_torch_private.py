"""The private torch names layertap relies on. If torch changes one of them,
these fail and say which code to revisit, instead of exports getting noisy."""

from __future__ import annotations

import inspect

import torch

from layertap.pytorch.exporter import quiet


def test_jit_onnx_log_is_what_quiet_mode_swaps():
    # pytorch.exporter.quiet swaps torch._C._jit_onnx_log for a no-op: the TorchScript
    # exporter logs its graph through it (to C++ stdout, which would corrupt --json).
    assert callable(torch._C._jit_onnx_log)
    from torch.onnx._internal.torchscript_exporter import utils

    src = inspect.getsource(utils)
    # looked up on torch._C at call time, so swapping the attribute takes effect
    assert "from torch import _C" in src and "_C._jit_onnx_log(" in src
    # the log is switched on through the *function object* (a truthy test), the
    # reason it cannot simply be disabled and is swapped instead
    assert "is_originally_enabled = _C._jit_is_onnx_log_enabled\n" in src


def test_quiet_mode_swaps_and_restores_the_log_function():
    original = torch._C._jit_onnx_log
    with quiet():
        assert torch._C._jit_onnx_log is not original
        torch._C._jit_onnx_log("not printed: ", "graph")
    assert torch._C._jit_onnx_log is original
