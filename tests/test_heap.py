"""layertap.heap: the caller's objects out of the collector's passes for a call, and handed back after."""

from __future__ import annotations

import gc
import threading

from layertap.heap import callers_objects_frozen, frozen_callers_objects


def test_the_callers_objects_are_frozen_for_the_call_and_handed_back():
    assert gc.get_freeze_count() == 0
    with callers_objects_frozen():
        assert gc.get_freeze_count() > 0
        with callers_objects_frozen():  # a nested call leaves the freeze to the outer one
            pass
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0


def test_a_freeze_of_someone_else_is_left_alone():
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with callers_objects_frozen():
            pass
        # not unfrozen (that would empty the permanent generation); another thread freeing a frozen object
        # meanwhile (a worker letting go of its job) lowers the count by that much
        assert gc.get_freeze_count() > frozen // 2
    finally:
        gc.unfreeze()


def test_nothing_is_frozen_while_the_collector_is_off():
    gc.disable()
    try:
        with callers_objects_frozen():
            assert gc.get_freeze_count() == 0
    finally:
        gc.enable()


def test_calls_on_two_threads_unfreeze_once_both_ended():
    inside, release = threading.Event(), threading.Event()

    @frozen_callers_objects
    def held() -> int:
        inside.set()
        release.wait(10)
        return 1

    thread = threading.Thread(target=held)
    thread.start()
    inside.wait(10)
    with callers_objects_frozen():
        release.set()
        thread.join(10)
        assert gc.get_freeze_count() > 0  # this call still runs
    assert gc.get_freeze_count() == 0


def test_the_decorated_function_keeps_its_name_result_and_errors():
    @frozen_callers_objects
    def f(x: int) -> int:
        """Doc."""
        if x < 0:
            raise ValueError("negative")
        return x + 1

    assert (f(1), f.__name__, f.__doc__) == (2, "f", "Doc.")
    try:
        f(-1)
    except ValueError:
        pass
    assert gc.get_freeze_count() == 0
