"""Hooks on every submodule that number each call of each module.

The shared mechanism under ``lt.layers`` (one row per call) and
``lt.compare`` (every call's output kept for comparison). Imports no torch
itself, so ``layertap.comparing`` stays cheap to import.
"""

from __future__ import annotations

import collections
import contextlib
from typing import Any, Iterator


def module_key(mod: Any) -> int:
    """Identity of a module that survives tracing proxies.

    torch.export's non-strict tracer (make_fx's module-stack tracer) hands out
    a fresh ``AttrProxy`` object on every submodule access; each shares the
    real module's ``__dict__``, so that is what identifies the module.

    Example:
        >>> class M: pass
        >>> m = M()
        >>> module_key(m) == id(m.__dict__)
        True
    """
    return id(mod.__dict__)


class CallCounter:
    """The one call-numbering rule: a call's index among its module's calls, counted as calls start.

    A return gets the index of its own start (the innermost open call), so a
    recursive call returns its own index. Keyed by :func:`module_key`.

    Example:
        >>> c = CallCounter()
        >>> c.start(7), c.start(7), c.finish(7), c.finish(7), c.count(7)
        (0, 1, 1, 0, 2)
    """

    def __init__(self) -> None:
        self.started: collections.Counter[int] = collections.Counter()
        self._open: dict[int, list[int]] = collections.defaultdict(list)  # calls not yet returned

    def start(self, key: int) -> int:
        call = self.started[key]
        self.started[key] = call + 1
        self._open[key].append(call)
        return call

    def finish(self, key: int) -> int:
        stack = self._open[key]
        return stack.pop() if stack else self.started[key] - 1

    def count(self, key: int) -> int:
        """Calls of ``key`` started so far."""
        return self.started.get(key, 0)


class CallHooks:
    """Pre/post forward hooks on every submodule (the root excluded).

    Each call gets its index among that module's calls, counted as calls
    start; a recursive call returns its own index. Subclasses override
    :meth:`on_start` and :meth:`on_return`. A module registered under
    several paths is hooked once, under its first path.

    Example:
        >>> import torch
        >>> class Paths(CallHooks):
        ...     def on_return(self, mod, path, call, output):
        ...         seen.append((path, call))
        >>> seen = []
        >>> relu = torch.nn.ReLU()
        >>> m = torch.nn.Sequential(relu, torch.nn.Linear(2, 2), relu)
        >>> with Paths(m).hooks():
        ...     _ = m(torch.ones(1, 2))
        >>> seen
        [('0', 0), ('1', 0), ('0', 1)]
    """

    wants_inputs = False  # True: the pre hooks also get the call's arguments (on_inputs)

    def __init__(self, model: Any) -> None:
        self.model = model
        self.paths: dict[int, str] = {module_key(m): p for p, m in model.named_modules() if p}
        self.counter = CallCounter()

    @contextlib.contextmanager
    def hooks(self) -> Iterator[None]:
        """Attach the hooks; they are removed on exit, exceptions included."""
        import torch  # noqa: PLC0415 -- importing this module stays cheap (comparing.torch_side does)

        handles = []
        try:
            for path, mod in self.model.named_modules():
                if path and not isinstance(mod, torch.jit.ScriptModule):  # PyTorch refuses hooks there
                    if self.wants_inputs:
                        handles.append(mod.register_forward_pre_hook(self._pre_args, with_kwargs=True))
                    else:
                        handles.append(mod.register_forward_pre_hook(self._pre))
                    handles.append(mod.register_forward_hook(self._post))
            yield
        finally:
            for h in handles:
                h.remove()

    def on_start(self, mod: Any, path: str, call: int) -> None:
        """Called as call ``call`` of the module at ``path`` starts."""

    def on_inputs(self, mod: Any, path: str, call: int, args: tuple, kwargs: dict) -> Any:
        """Called after :meth:`on_start` with the call's arguments (only when ``wants_inputs``); may return
        ``(args, kwargs)`` to replace them."""

    def on_return(self, mod: Any, path: str, call: int, output: Any) -> Any:
        """Called as call ``call`` of the module at ``path`` returns ``output``; may return a value that
        replaces the output (hooks added later see it)."""

    def _pre(self, mod: Any, _args: Any) -> None:
        key = module_key(mod)
        self.on_start(mod, self.paths[key], self.counter.start(key))

    def _pre_args(self, mod: Any, args: tuple, kwargs: dict) -> Any:
        key = module_key(mod)
        path, call = self.paths[key], self.counter.start(key)
        self.on_start(mod, path, call)
        return self.on_inputs(mod, path, call, args, kwargs)

    def _post(self, mod: Any, _args: Any, output: Any) -> Any:
        key = module_key(mod)
        return self.on_return(mod, self.paths[key], self.counter.finish(key), output)
