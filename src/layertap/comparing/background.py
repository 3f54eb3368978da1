"""Work on a thread of its own while the caller's thread does other work (numpy only).

ONNX Runtime's session builds and runs, and numpy's large operations, let go of the GIL: a
compare overlaps them (a candidate's session build beside the reference's, the next sample's
runs beside this sample's statistics) instead of leaving a core idle.

Each kind of work has one long-lived worker thread (:func:`worker`), not a thread per job:
glibc gives every new thread a memory arena of its own, so a fresh thread pays a page fault
for every page it allocates (measured: a resnet50 session build and run in a new thread took
40 000 page faults, on the same warm thread 12 000-20 000), and a compare hands its worker
one job per sample.
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Callable, Generic, TypeVar

T = TypeVar("T")

_PENDING = object()


class _Worker:
    """A daemon thread that runs the jobs handed to it, one after the other."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[Background[object]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, job: Background[object]) -> None:
        self._jobs.put(job)

    def _loop(self) -> None:
        while True:
            self._jobs.get()._run()


_workers: dict[str, _Worker] = {}
_workers_lock = threading.Lock()


def worker(name: str) -> _Worker:
    """The worker thread for the jobs called ``name`` (started on first use, again after a fork)."""
    with _workers_lock:
        w = _workers.get(name)
        if w is None or not w.alive():
            w = _workers[name] = _Worker(name)
        return w


def _forget_workers() -> None:
    _workers.clear()  # a forked child has none of its parent's threads


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_workers)


class Background(Generic[T]):
    """``work()`` run by the worker thread named ``name``; :meth:`result` waits for it and returns
    its value, or raises what it raised (in the caller's thread, traceback kept).

    Jobs of one name run in the order they were started, one at a time, so a job must never wait
    for another job of its own name. The threads are daemons: an interrupted command exits
    without waiting for them (a caller whose job uses resources it frees waits with :meth:`wait`).

    Example:
        >>> job = Background(lambda: sum(range(10)))
        >>> job.result()
        45
        >>> Background(lambda: 1 // 0).result()
        Traceback (most recent call last):
        ...
        ZeroDivisionError: integer division or modulo by zero
    """

    def __init__(self, work: Callable[[], T], *, name: str = "layertap-background", start: bool = True) -> None:
        self._work = work
        self._name = name
        self._outcome: object = _PENDING
        self._failed = False
        self._done = threading.Event()
        self._started = False
        if start:
            self.start()

    def start(self) -> None:
        """Hand the work to its worker (once)."""
        if not self._started:
            self._started = True
            worker(self._name).submit(self)  # type: ignore[arg-type]

    def _run(self) -> None:
        try:
            self._outcome = self._work()
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread by result()
            self._outcome, self._failed = e, True
        finally:
            self._work = None  # type: ignore[assignment]  # what it held goes with it
            self._done.set()

    def wait(self) -> None:
        """Wait for the work to end (started if it was not); its outcome stays for :meth:`result`."""
        self.start()
        self._done.wait()

    def result(self) -> T:
        """The work's value, once it ended; what it raised is raised here."""
        self.wait()
        outcome = self._outcome
        if self._failed:
            assert isinstance(outcome, BaseException)
            raise outcome
        assert outcome is not _PENDING, "the background job ended without an outcome"
        return outcome  # type: ignore[return-value]
