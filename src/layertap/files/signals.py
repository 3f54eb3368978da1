"""Signals that stop a command: raised where they land, and remembered until an output is published.

Python runs a signal's handler in the main thread between two bytecodes. A signal that arrives
during a long native call (a file copy, an exporter's C++) has its handler run when the call
returns, in whatever Python code runs next, and the exception it raises there can be dropped: a
library may turn it into an error of its own and go on (``torch.onnx.export`` then tries its next
capture strategy, which succeeds), and Python prints and drops any exception raised in a
``__del__`` or a weakref callback. The command would then finish and publish its output with exit
0. So while :func:`signals_stop` is active each handler also records its signal, and
:func:`raise_if_stopped`, which every publishing rename calls first
(:func:`layertap.files.writes.replace_keeping_mode`), raises it again.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Iterator, NoReturn

#: the signals a command stops on, where the platform has them
STOPPING = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))

#: the signals received while :func:`signals_stop` is active, in order
_received: list[int] = []
#: (temporary file, output) of each publishing rename begun while :func:`signals_stop` is active
_publishing: list[tuple[str, str]] = []
#: how many :func:`signals_stop` blocks are active (outside them, in a library call, nothing is noted)
_active = [0]


class Terminated(BaseException):
    """SIGTERM or SIGHUP, raised like KeyboardInterrupt so every ``finally`` runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.name = signal.Signals(signum).name


def _raise(signum: int) -> NoReturn:
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated(signum)


def _handler(signum: int, _frame: object) -> None:
    _received.append(signum)
    _raise(signum)


@contextlib.contextmanager
def signals_stop() -> Iterator[None]:
    """While a command runs: SIGINT raises ``KeyboardInterrupt`` and SIGTERM/SIGHUP raise
    :class:`Terminated` (Python's default for those kills the process on the spot, skipping the
    cleanup of temporary files), each recorded for :func:`raise_if_stopped`.

    The handlers are installed even where the process was started ignoring the signal (a shell starts
    a background job ignoring SIGINT, ``nohup`` ignores SIGHUP): a command asked to stop cleans up the
    same way wherever it was started. Outside the main thread nothing changes: Python handles
    signals there only.

    Example:
        >>> import os
        >>> with signals_stop():
        ...     try:
        ...         os.kill(os.getpid(), signal.SIGTERM)
        ...     except Terminated as e:
        ...         e.name
        'SIGTERM'
    """
    start, begun = len(_received), len(_publishing)
    _active[0] += 1
    old = {}
    try:
        for s in STOPPING:
            previous = signal.signal(s, _handler)
            old[s] = signal.SIG_DFL if previous is None else previous  # None: set outside Python
    except ValueError:  # not the main thread: signals cannot be handled here
        pass
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        del _received[start:]
        del _publishing[begun:]
        _active[0] -= 1


def publishing(tmp: str | os.PathLike, target: str | os.PathLike) -> None:
    """Note a publishing rename of ``tmp`` onto ``target`` about to begin, so that a command a signal stops
    afterwards can tell whether that output was written (:func:`published`): a signal landing during or
    right after the rename has its handler run only once the rename returned."""
    if _active[0]:
        _publishing.append((os.fspath(tmp), os.fspath(target)))


def published() -> list[str]:
    """The outputs the command wrote: those of its noted renames that took place and stayed (the temporary
    file is gone, the output is there: a data file placed for a pair the signal then stopped is removed).

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> (d / "t").write_text("x")
        1
        >>> with signals_stop():
        ...     publishing(d / "t", d / "out.txt")
        ...     before = published()
        ...     _ = (d / "t").rename(d / "out.txt")
        ...     after = published()
        >>> before, [pathlib.Path(p).name for p in after]
        ([], ['out.txt'])
    """
    return list(dict.fromkeys(target for tmp, target in _publishing
                              if not os.path.lexists(tmp) and os.path.lexists(target)))


def stopped_by() -> BaseException | None:
    """The exception of the first signal :func:`signals_stop` received (whether or not what it raised
    then reached the command), or ``None``."""
    if not _received:
        return None
    try:
        _raise(_received[0])
    except BaseException as e:  # noqa: BLE001 - built to be returned, never raised here
        return e


def raise_if_stopped() -> None:
    """Raise the signal that stopped the command (``KeyboardInterrupt``, :class:`Terminated`) if one has
    arrived, also when the exception it raised then was caught and dropped; return when none has.

    Signals that arrived a moment ago but whose handlers have not run yet run first. Only the main
    thread, the one that handles signals, is stopped here: a background thread finishes what it was
    handed (a dataset shard and its manifest line), and the main thread decides what is kept.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_BLOCK, ())  # changes nothing; runs the pending handlers on return
    stop = stopped_by()
    if stop is not None:
        raise stop
