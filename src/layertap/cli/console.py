"""Terminal output shared by the tools: status lines, spinners, progress bars, the stdout console.

A leaf module: it imports nothing from the rest of ``layertap.cli`` (so
``args.py`` and ``tools/`` can both use it without an import cycle), and rich
only inside its functions.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import sys
from typing import Any, Iterator

from ..errors import printable

# Piped output has no width to fit: lines are as long as their content.
PIPED_WIDTH = 10_000
RULE_WIDTH = 80  # section rules (the demo's) when the console is wider or unbounded


def stdout_console() -> Any:
    """A rich console for stdout: the terminal's width (or ``COLUMNS``), unbounded when piped.

    On a terminal, tables fit the window (see :class:`layertap.tables.Table`).
    Piped output (a file, ``less``, CI logs) would otherwise get rich's
    80-column default; there every line is as long as its content, so module
    paths are never cut or wrapped.

    Example:
        >>> stdout_console().width >= 80
        True
    """
    from rich.console import Console

    class StdoutConsole(Console):
        def on_broken_pipe(self) -> None:
            # rich's own answer is SystemExit(1), which reads as the model's sys.exit; the
            # CLI ends quietly on this error instead (cli.main: stdout_closed, quiet_exit)
            raise BrokenPipeError(errno.EPIPE, "stdout was closed")

    if sys.stdout.isatty() or os.environ.get("COLUMNS", "").strip().isdigit():
        return StdoutConsole()
    return StdoutConsole(width=PIPED_WIDTH)


def stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has gone (``layertap layers m.onnx | head``).

    Example:
        >>> stdout_closed()  # a terminal, a file or a pipe still read
        False
    """
    try:
        poller = select.poll()
        poller.register(1, 0)  # POLLERR is reported whatever the mask: a pipe's write end with no reader
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll (Windows) or no descriptor 1
        return False


def quiet_exit() -> int:
    """End as ``git log | head`` does once stdout's reader has gone: no message, status
    128 + SIGPIPE; stdout now points at the null device, so the interpreter's last flush of
    what was still buffered is not reported as an error."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    return 128 + getattr(signal, "SIGPIPE", 13)


def rule(console: Any, title: str) -> None:
    """A section rule at most :data:`RULE_WIDTH` wide (a full-width rule on a pipe would be huge).

    Example:
        >>> from rich.console import Console
        >>> rule(Console(width=PIPED_WIDTH, color_system=None), "1. layers")
        1. layers ──────────────────────────────────────────────────────────────────────
    """
    from rich.rule import Rule

    console.print(Rule(title, align="left"), width=min(console.width, RULE_WIDTH))


def say(message: str) -> None:
    """A status line on stderr (keeps stdout clean for --json).

    Example:
        >>> say("wrote out.onnx")  # on stderr
    """
    from rich.console import Console

    Console(stderr=True, width=10_000 if not sys.stderr.isatty() else None).print(
        printable(message), markup=False, highlight=False, soft_wrap=True
    )


@contextlib.contextmanager
def status(message: str) -> Iterator[None]:
    """A spinner on stderr while a long step runs; silent when stderr is not a terminal.

    Example:
        >>> with status("loading"):
        ...     pass
    """
    from rich.console import Console

    console = Console(stderr=True)
    if not console.is_terminal:
        yield
        return
    with console.status(message):
        yield


class StepProgress:
    """Transient progress bars on stderr, one per step; silent unless enabled.

    Implements :class:`layertap.comparing.Progress` (``step``/``advance``).

    Example:
        >>> with StepProgress(enabled=False) as prog:
        ...     prog.step("PyTorch forward"); prog.advance()
    """

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self) -> StepProgress:
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                console=Console(stderr=True), transient=True,
            )
            self._progress.start()
        return self

    def step(self, description: str, total: int = 1) -> None:
        if self._progress is not None:
            if self._task is not None:
                self._progress.remove_task(self._task)
            self._task = self._progress.add_task(description, total=total)

    def advance(self, n: int = 1) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task, n)

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
