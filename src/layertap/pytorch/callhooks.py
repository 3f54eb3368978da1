"""Hooks on every submodule that number each call of each module.

The shared mechanism under ``lt.layers`` (one row per call) and
``lt.compare`` (every call's output kept for comparison). Imports no torch
itself, so ``layertap.bridge.compare`` stays cheap to import.
"""

from __future__ import annotations

import collections
import contextlib
from typing import Any, Iterator


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

    def __init__(self, model: Any) -> None:
        self.model = model
        self.paths: dict[int, str] = {id(m): p for p, m in model.named_modules() if p}
        self.counts: dict[int, int] = collections.Counter()  # id(module) -> calls started
        self._open: dict[int, list[int]] = collections.defaultdict(list)  # calls not yet returned

    @contextlib.contextmanager
    def hooks(self) -> Iterator[None]:
        """Attach the hooks; they are removed on exit, exceptions included."""
        import torch  # here: importing this module stays cheap

        handles = []
        try:
            for path, mod in self.model.named_modules():
                if path and not isinstance(mod, torch.jit.ScriptModule):  # PyTorch refuses hooks there
                    handles.append(mod.register_forward_pre_hook(self._pre))
                    handles.append(mod.register_forward_hook(self._post))
            yield
        finally:
            for h in handles:
                h.remove()

    def on_start(self, mod: Any, path: str, call: int) -> None:
        """Called as call ``call`` of the module at ``path`` starts."""

    def on_return(self, mod: Any, path: str, call: int, output: Any) -> None:
        """Called as call ``call`` of the module at ``path`` returns ``output``."""

    def _pre(self, mod: Any, _args: Any) -> None:
        key = id(mod)
        call = self.counts[key]
        self.counts[key] = call + 1
        self._open[key].append(call)
        self.on_start(mod, self.paths[key], call)

    def _post(self, mod: Any, _args: Any, output: Any) -> None:
        key = id(mod)
        stack = self._open[key]
        call = stack.pop() if stack else self.counts[key] - 1
        self.on_return(mod, self.paths[key], call, output)
