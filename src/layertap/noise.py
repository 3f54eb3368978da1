"""Lines other libraries print that are not the user's answer: torch's pytree log when torchao is
imported (transformers and ExecuTorch import it), what torch logs as it compiles, and the C++ lines ExecuTorch's CPU probe writes
straight to the process's stderr. Each is silenced for the call that makes it, never for good."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
from typing import Iterator


@contextlib.contextmanager
def quiet_registrations() -> Iterator[None]:
    """Importing torchao makes torch log a deprecation line per Enum it registers with pytree: noise
    on stderr above the user's answer, about a package they did not ask for. torch's pytree logger is
    raised for the block only.

    >>> with quiet_registrations():
    ...     logging.getLogger("torch.utils._pytree").isEnabledFor(logging.WARNING)
    False
    """
    with quiet_loggers("torch.utils._pytree"):
        yield


#: what torch logs while it compiles or loads a compiled package: the CUDA toolkit it looked for on a CPU
#: machine, a package's version check
COMPILE_LOGGERS = ("torch.utils.cpp_extension", "torch._inductor.package.package")


@contextlib.contextmanager
def quiet_loggers(*names: str) -> Iterator[None]:
    """The loggers ``names`` raised to errors only, for the block.

    >>> with quiet_loggers("torch.utils.cpp_extension"):
    ...     logging.getLogger("torch.utils.cpp_extension").isEnabledFor(logging.WARNING)
    False
    """
    loggers = [logging.getLogger(n) for n in names]
    levels = [g.level for g in loggers]
    for g in loggers:
        g.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for g, level in zip(loggers, levels):
            g.setLevel(level)


@contextlib.contextmanager
def quiet_native_stderr() -> Iterator[list[str]]:
    """Native code's writes to file descriptor 2 during the block go to a temporary file instead of the
    terminal (Python's own ``sys.stderr`` is flushed first and keeps working); the list yielded holds
    what was written once the block ends, for an error that wants it.

    >>> with quiet_native_stderr() as said:
    ...     _ = os.write(2, b"[cpuinfo_utils.cpp:125] a probe line\\n")
    >>> said
    ['[cpuinfo_utils.cpp:125] a probe line']
    """
    said: list[str] = []
    fd = 2  # native code writes to the descriptor, whatever Python's sys.stderr is now
    with contextlib.suppress(AttributeError, OSError, ValueError):
        sys.stderr.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), fd)
        try:
            yield said
        finally:
            os.dup2(saved, fd)
            os.close(saved)
            sink.seek(0)
            said.extend(sink.read().decode(errors="replace").splitlines())
