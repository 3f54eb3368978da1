"""The caller's objects kept out of the cyclic collector's passes while layertap works (stdlib only).

A process that imported torch and built a model holds some 340 000 objects the collector
tracks, and a full collection is then usually due: the next few thousand objects anyone keeps
set it off, and it walks all of them (150-180 ms on two cores). In a fresh process that is
layertap's first call, whose imports and work keep that many; the same call later pays nothing
of it, and neither does a script that only runs the engines (their objects are native). So the
first ``lt.compare`` of resnet50 took about 1.5x the engines' own first forward, session and run.

:func:`callers_objects_frozen` freezes what the process holds (``gc.freeze``) for the span of
a call and hands it back (``gc.unfreeze``) after: the collector still runs over what the call
makes (a cycle it drops is freed as before), and the caller's objects wait for their own full
collection, as they would have without the call.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import threading
from typing import Callable, Iterator, TypeVar

F = TypeVar("F", bound=Callable[..., object])

_lock = threading.Lock()
_depth = 0  # calls inside the freeze (threads, nested calls): the last one out unfreezes


@contextlib.contextmanager
def callers_objects_frozen() -> Iterator[None]:
    """Within the block, the collector's passes skip every object made before it.

    Nothing is done where the collector is off, or where objects were frozen already by someone
    else (``gc.freeze`` of a server before it forks): unfreezing would hand theirs back too.

    Example:
        >>> import gc
        >>> with callers_objects_frozen():
        ...     frozen = gc.get_freeze_count() > 0
        >>> frozen, gc.get_freeze_count()
        (True, 0)
    """
    global _depth
    with _lock:
        ours = _depth > 0 or (gc.isenabled() and gc.get_freeze_count() == 0)
        if ours:
            if _depth == 0:
                gc.freeze()
            _depth += 1
    try:
        yield
    finally:
        if ours:
            with _lock:
                _depth -= 1
                if _depth == 0:
                    gc.unfreeze()


def frozen_callers_objects(fn: F) -> F:
    """``fn`` run inside :func:`callers_objects_frozen`."""

    @functools.wraps(fn)
    def wrapped(*args: object, **kwargs: object) -> object:
        with callers_objects_frozen():
            return fn(*args, **kwargs)

    return wrapped  # type: ignore[return-value]
