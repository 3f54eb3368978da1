"""Hook-based capture of module inputs and outputs.

:class:`Capture` is the engine behind ``lt.tap``, ``lt.extract`` and
``lt.export``: it resolves selectors to modules, attaches the fewest hooks
that serve them, counts calls, keeps only the calls a selector asked for, and
removes every hook on every exit path.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Iterable

import torch
from torch import nn

from ..errors import SelectorError, unknown_name
from ..files.store import ArrayStore
from ..selectors import Tap, index_text, parse_taps
from . import callgraph
from .callhooks import CallCounter, module_key
from .values import CallArgs, Method, check_method, method_name, not_a_tensor, param_names, pick


class StopForward(BaseException):
    """Raised from a hook to cut the forward short once every tap is captured.

    A ``BaseException`` so that a model's own ``except Exception`` cannot
    swallow it.
    """


_BY_POSITION = torch.empty(0)  # a PATH@POS tap's call record: the value itself lives in _Tokens


@dataclass
class _Slot:
    """What one tap has captured so far."""

    tap: Tap
    # call index -> (sequence number, tensor); bounded for negative calls.
    values: dict[int, tuple[int, torch.Tensor]] = field(default_factory=dict)
    done: bool = False
    # A selector that does not fit the value (bad index, not a tensor). Kept
    # here and raised by results(): raised inside the hook, a model's own
    # ``except Exception`` around the call could swallow it.
    error: SelectorError | None = None
    tokens: "_Tokens | None" = None  # a PATH@POS tap: the positions seen, the value kept


class _Tokens:
    """A ``PATH@POS`` tap's value: position POS of the sequence axis (axis 1), from whichever call held it.

    A call's value covers the last ``s`` positions (``s`` its axis-1 length) of the tokens the
    model has seen when it runs (prefill: the prompt; a decode step: one more); only the
    position asked for is cloned (for a negative POS, the last ``|POS|`` positions seen).

    Example:
        >>> t = _Tokens(-2)
        >>> t.add(torch.arange(3.0).reshape(1, 3), end=3); t.add(torch.tensor([[7.0]]), end=4)
        >>> t.value(), t.span
        (tensor([2.]), (0, 4))
    """

    def __init__(self, pos: int) -> None:
        self.pos = pos
        self.kept: list[tuple[int, torch.Tensor]] = []  # (first position, value along axis 1)
        self.span: tuple[int, int] | None = None  # positions computed: first, end

    def add(self, value: torch.Tensor, end: int, clone: Any = torch.Tensor.clone) -> None:
        start = end - value.shape[1]
        self.span = (start, end) if self.span is None else (min(self.span[0], start), max(self.span[1], end))
        if self.pos >= 0:
            if start <= self.pos < end:
                self.kept = [(self.pos, clone(value[:, self.pos - start: self.pos - start + 1]))]
            return
        keep = min(value.shape[1], -self.pos)
        self.kept.append((end - keep, clone(value[:, value.shape[1] - keep:])))
        while self.kept and self.kept[0][0] + self.kept[0][1].shape[1] <= end + self.pos:
            self.kept.pop(0)

    def value(self) -> torch.Tensor | None:
        if self.span is None:
            return None
        want = self.pos if self.pos >= 0 else self.span[1] + self.pos
        for first, v in self.kept:
            if first <= want < first + v.shape[1]:
                return v[:, want - first]
        return None


def module_paths(model: nn.Module) -> list[str]:
    """Every path a module can be reached by (shared modules under each name)."""
    return [name for name, _ in model.named_modules(remove_duplicate=False)]


def eager(model: Any) -> Any:
    """The module a ``torch.compile`` wrapper runs, so hooks fire and paths read as in the model.

    A compiled model that already ran replays its compiled graph: submodule
    hooks never fire and every path starts with ``_orig_mod.``. Taps go to the
    original module instead (eager, the same weights).

    Example:
        >>> eager(nn.Linear(2, 2)).__class__.__name__
        'Linear'
    """
    inner = getattr(model, "_orig_mod", None)
    return inner if isinstance(model, nn.Module) and isinstance(inner, nn.Module) else model


def find_module(model: nn.Module, path: str) -> nn.Module:
    """``model.get_submodule(path)`` with an error that lists close paths.

    Example:
        >>> from collections import OrderedDict
        >>> find_module(nn.Sequential(OrderedDict(encoder=nn.Linear(2, 2))), "encodr")
        Traceback (most recent call last):
        ...
        layertap.errors.SelectorError: unknown module 'encodr'; did you mean: encoder (run 'layertap layers MODEL' to list them)
    """
    if path == "":
        return model
    mod = model
    parts = path.split(".")
    for depth, part in enumerate(parts, 1):  # the path walked once, through each module's own children
        child = getattr(mod, "_modules", {}).get(part)
        if not isinstance(child, nn.Module):
            raise _unknown_module(model, path)
        if isinstance(child, torch.jit.ScriptModule):
            raise _scripted(path, ".".join(parts[:depth]), depth == len(parts))
        mod = child
    return mod


def _unknown_module(model: nn.Module, path: str) -> SelectorError:
    if path.startswith("_orig_mod."):
        return SelectorError(
            f"unknown module {path!r}: a torch.compile'd model is tapped through its original module, "
            f"so paths have no '_orig_mod.' prefix; use {path[len('_orig_mod.'):]!r}"
        )
    candidates = [p for p in module_paths(model) if p]
    return SelectorError(unknown_name("module", path, candidates, hint="run 'layertap layers MODEL' to list them"))


def _scripted(path: str, prefix: str, itself: bool) -> SelectorError:
    """Refuse a path at or inside a TorchScript module: PyTorch runs no hooks there."""
    where = "is" if itself else f"is inside {prefix!r}, which is"
    parent = prefix.rpartition(".")[0]
    return SelectorError(
        f"module {path!r} {where} a TorchScript module (torch.jit.script/trace): PyTorch runs no hooks "
        f"there, so it cannot be tapped; tap {parent + ' or ' if parent else ''}the :input of the module that uses "
        "its result instead, or build the model without scripting that part"
    )


class Capture:
    """Hooks that record the values selected by taps.

    Args:
        model: the root module that tap paths are relative to.
        taps: selectors (text or :class:`~layertap.selectors.Tap`).
        detach: store ``tensor.detach().clone()`` (default) instead of a clone
            that keeps the autograd graph.
        stop_early: raise :class:`StopForward` once every tap is complete.
        method: the root method being run, a name or a callable (used by
            ``stop_early``'s analysis and in messages).
        memory_budget: bytes of detached values held in memory; later ones go to a temporary
            folder and come back memory-mapped (a long ``generate``), as ``lt.compare``'s
            values do (:class:`~layertap.files.store.ArrayStore`). ``None``: all in memory.

    The value is always cloned: in-place modules (``ReLU(inplace=True)``)
    would otherwise overwrite what was captured.

    Example:
        >>> m = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
        >>> with Capture(m, ["0", "1:input"]) as cap:
        ...     _ = m(torch.ones(1, 4))
        >>> list(cap.results())
        ['0', '1:input']
    """

    def __init__(
        self,
        model: nn.Module,
        taps: Iterable[str | Tap],
        *,
        detach: bool = True,
        stop_early: bool = False,
        method: Method = "forward",
        memory_budget: int | None = None,
    ) -> None:
        self.model = model
        self.store = ArrayStore(memory_budget) if memory_budget is not None and detach else None
        self.taps = parse_taps(taps)
        self.detach = detach
        self.stop_early = stop_early
        self.method = check_method(method)
        self._modules = {t.path: find_module(model, t.path) for t in self.taps}
        self._handles: list[Any] = []
        self._seq = itertools.count()
        self._slots = self._new_slots()
        self._counter = CallCounter()
        self._tokens_end = 0  # tokens the model has seen, through its current call (PATH@POS taps)
        # stop_early: per tap, the module whose return means no call of the
        # tapped module can follow (None: only the end of the method).
        self._finisher: list[nn.Module | None] = self._plan_stop() if stop_early else []

    # -- lifecycle -------------------------------------------------------
    def __enter__(self) -> "Capture":
        self.attach()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.remove()
        return exc_type is StopForward

    def attach(self) -> None:
        """Register the hooks (idempotent only via :meth:`remove`)."""
        assert not self._handles, "Capture.attach called twice"
        try:
            by_module: dict[int, nn.Module] = {}
            for mod in [*self._modules.values(), *self._finisher]:
                if mod is not None:
                    by_module.setdefault(module_key(mod), mod)
            # Under a tracer the same module may arrive as several proxies: use
            # one object per module everywhere, and map hook arguments to it.
            self._registered = by_module
            self._modules = {p: by_module[module_key(m)] for p, m in self._modules.items()}
            self._finisher = [None if m is None else by_module[module_key(m)] for m in self._finisher]
            if any(t.pos is not None for t in self.taps):
                # registered first: the root's own taps (an @POS on its input) read the count it sets
                self._handles.append(self.model.register_forward_pre_hook(self._count_tokens, with_kwargs=True))
            # per module, the slots its calls feed: a hook looks up its own instead of testing every tap
            self._inputs_of = {k: [i for i, t in enumerate(self.taps) if t.port == "input" and self._modules[t.path] is m]
                               for k, m in by_module.items()}
            self._outputs_of = {k: [i for i, t in enumerate(self.taps) if t.port == "output" and self._modules[t.path] is m]
                                for k, m in by_module.items()}
            for key, mod in by_module.items():
                if self._inputs_of[key] or self.stop_early:
                    self._handles.append(mod.register_forward_pre_hook(self._pre_hook, with_kwargs=True))
                else:  # only the call count: the lean hook (no keyword arguments gathered)
                    self._handles.append(mod.register_forward_pre_hook(self._start_hook))
                self._handles.append(mod.register_forward_hook(self._post_hook))
        except BaseException:
            self.remove()
            raise

    def remove(self) -> None:
        """Remove every hook this capture registered."""
        while self._handles:
            self._handles.pop().remove()

    def reset(self) -> None:
        """Forget captured values and call counts (hooks stay)."""
        self._seq = itertools.count()
        self._slots = self._new_slots()
        self._counter = CallCounter()
        self._tokens_end = 0

    def _new_slots(self) -> list[_Slot]:
        return [_Slot(t, tokens=None if t.pos is None else _Tokens(t.pos)) for t in self.taps]

    # -- hooks -----------------------------------------------------------
    def _count_tokens(self, mod: nn.Module, args: tuple, kwargs: dict) -> None:
        self._tokens_end = tokens_through(args, kwargs, self._tokens_end)

    def _start_hook(self, mod: nn.Module, args: tuple) -> None:
        self._counter.start(module_key(mod))

    def _pre_hook(self, mod: nn.Module, args: tuple, kwargs: dict):
        key = module_key(mod)
        mod = self._registered.get(key, mod)
        call = self._counter.start(key)
        for i in self._inputs_of[key]:
            slot = self._slots[i]
            self._record(slot, call, _input_value(args, kwargs, slot.tap, _forward_names(mod)))
        # An ':input' tap can be complete before its module runs: stop here
        # and save that module's work too.
        if self.stop_early and self._all_done(mod, returned=False):
            raise StopForward()
        return None

    def _post_hook(self, mod: nn.Module, args: tuple, output: Any):
        key = module_key(mod)
        call = self._counter.finish(key)
        for i in self._outputs_of[key]:
            self._record(self._slots[i], call, output)
        if self.stop_early and self._all_done(self._registered.get(key, mod), returned=True):
            raise StopForward()
        return None

    def _record(self, slot: _Slot, call: int, value: Any) -> None:
        tap = slot.tap
        if slot.error is not None or (tap.call is not None and tap.call >= 0 and call != tap.call):
            return
        if tap.index or not isinstance(value, torch.Tensor):  # a plain tensor output needs no picking
            value = self._picked(slot, value)
            if value is None:
                return
        if slot.tokens is not None:
            if value.dim() < 2:
                slot.error = SelectorError(f"tap {tap.name!r}: a token position needs a sequence axis (axis 1); "
                                           f"the value has shape {tuple(value.shape)}; tap {tap.path!r} without @")
                return
            slot.tokens.add(value, self._tokens_end or value.shape[1], self._clone)
            slot.values[call] = (next(self._seq), _BY_POSITION)  # the call ran; its value is kept by position
            return
        value = self._clone(value)
        seq = next(self._seq)
        slot.values[call] = (seq, self._held(seq, value))
        if tap.call is not None and tap.call < 0:
            # Only the last |call| calls can be the one asked for.
            while len(slot.values) > -tap.call:
                slot.values.pop(min(slot.values))

    def _picked(self, slot: _Slot, value: Any) -> torch.Tensor | None:
        """The tensor a tap's index picks from a call's value; ``None`` with ``slot.error`` set when it fails."""
        tap = slot.tap
        where = f"tap {tap.name!r}: module {tap.path or '<root>'!r} {tap.port}"
        try:
            value = pick(value, tap.index, where=where)
            if not isinstance(value, torch.Tensor):
                raise not_a_tensor(f"{where}{index_text(tap.index)}", value, tap.canonical)
        except SelectorError as e:
            slot.error = e
            return None
        return value

    def _clone(self, value: torch.Tensor) -> torch.Tensor:
        # under no_grad (every extract) a value has no graph to detach from: one copy, no detach op
        return value.detach().clone() if self.detach and value.requires_grad else value.clone()

    def _held(self, key: int, value: torch.Tensor) -> torch.Tensor:
        """``value``, or beyond the memory budget its copy on disk (memory-mapped, read lazily)."""
        store = self.store
        if store is None or value.dtype == torch.bfloat16 or value.device.type != "cpu":
            return value
        arr = value.numpy()
        store.put(key, [arr])
        if store.on_disk(key):
            return torch.from_numpy(store.get(key)[0])
        return value

    @property
    def spilled(self) -> int:
        """Bytes of captured values held on disk (``memory_budget``)."""
        return self.store.spilled if self.store is not None else 0

    def release_disk(self) -> None:
        """Remove the spill folder: values already returned stay readable through their maps (POSIX)."""
        if self.store is not None:
            self.store.close()

    # -- stop_early ------------------------------------------------------
    def _plan_stop(self) -> list[nn.Module | None]:
        """For each tap, the module whose return completes it (None: the root)."""
        plan: list[nn.Module | None] = []
        for tap in self.taps:
            path = callgraph.completing_ancestor(self.model, tap.path, self.method)
            fin = find_module(self.model, path)
            plan.append(None if fin is self.model else fin)
        return plan

    def _all_done(self, mod: nn.Module, *, returned: bool) -> bool:
        """Update which taps are complete after ``mod`` starts or returns."""
        all_done = True
        for i, slot in enumerate(self._slots):
            if not slot.done:
                slot.done = self._slot_done(slot, self._finisher[i], mod, returned)
                all_done = all_done and slot.done
        return all_done

    def _slot_done(self, slot: _Slot, fin: nn.Module | None, mod: nn.Module, returned: bool) -> bool:
        tap = slot.tap
        own = self._modules[tap.path]
        if slot.error is not None:
            return True  # results() raises it; nothing to wait for
        if tap.call is not None and tap.call >= 0 and tap.call in slot.values:
            return True  # the one call asked for is in hand
        if fin is None:
            return False
        if returned and fin is mod:
            # The completing ancestor returned: the module cannot run again
            # (if it never ran, results() says so).
            return True
        # A module that runs at most once has its input as soon as it starts.
        return (not returned) and fin is own and own is mod and tap.port == "input" and bool(slot.values)

    # -- results ---------------------------------------------------------
    def calls(self, path: str) -> int:
        """How many times the module at ``path`` ran so far."""
        return self._counter.count(module_key(self._modules[path]))

    def results(self) -> dict[str, torch.Tensor]:
        """Captured tensors by name, in the order they were captured.

        Raises :class:`SelectorError` for a module that never ran or a call
        index beyond the calls that happened.
        """
        named: list[tuple[int, str, torch.Tensor]] = []
        for slot in self._slots:
            if slot.error is not None:
                raise slot.error
        for slot in self._slots:
            named.extend(self._resolve(slot))
        named.sort(key=lambda item: item[0])
        return {name: value for _, name, value in named}

    def _resolve(self, slot: _Slot) -> list[tuple[int, str, torch.Tensor]]:
        tap = slot.tap
        ran = self.calls(tap.path)
        where = f"tap {str(tap)!r}"
        if ran == 0:
            raise SelectorError(
                f"{where}: module {tap.path or '<root>'!r} never ran in this {method_name(self.method)}; "
                "check the method and inputs, or run 'layertap layers MODEL' to see which modules run"
            )
        if slot.tokens is not None:
            return [self._at_position(slot, where)]
        if tap.call is None:
            if len(slot.values) < ran:
                missing = min(set(range(ran)) - set(slot.values))
                raise SelectorError(
                    f"{where}: call #{missing} of module {tap.path or '<root>'!r} did not return a value "
                    "(its forward raised and the model went on)"
                )
            if ran == 1:
                seq, value = slot.values[0]
                return [(seq, tap.name, value)]
            return [(seq, tap.name_for_call(c), v) for c, (seq, v) in sorted(slot.values.items())]
        call = tap.call if tap.call >= 0 else ran + tap.call
        if not 0 <= call < ran or call not in slot.values:
            raise SelectorError(
                f"{where}: call #{tap.call} is out of range; module {tap.path or '<root>'!r} ran {ran} "
                f"time{'s' if ran != 1 else ''} (calls #0..#{ran - 1})"
            )
        seq, value = slot.values[call]
        return [(seq, tap.name, value)]

    def _at_position(self, slot: _Slot, where: str) -> tuple[int, str, torch.Tensor]:
        tokens, tap = slot.tokens, slot.tap
        assert tokens is not None
        value = tokens.value()
        if value is None:
            first, end = tokens.span or (0, 0)
            raise SelectorError(
                f"{where}: token position {tap.pos} is outside the positions module {tap.path or '<root>'!r} "
                f"computed ({first}..{end - 1}); use @{first}..@{end - 1}, or @-1 for the last"
            )
        return max(seq for seq, _ in slot.values.values()), tap.name, value


def tokens_through(args: tuple, kwargs: dict, before: int) -> int:
    """How many token positions the model has seen once the call with these arguments is done.

    ``position_ids`` / ``cache_position`` (what ``generate`` passes) say it; else the call's
    tokens (``input_ids``, ``inputs_embeds`` or the first tensor argument, axis 1) follow the
    ``before`` seen so far.

    Example:
        >>> tokens_through((), {"input_ids": torch.zeros(1, 1), "position_ids": torch.tensor([[7]])}, 0)
        8
        >>> tokens_through((torch.zeros(1, 5),), {}, 3)
        8
    """
    for key in ("position_ids", "cache_position"):
        v = kwargs.get(key)
        if isinstance(v, torch.Tensor) and v.numel():
            return int(v.max()) + 1
    new = kwargs.get("input_ids", kwargs.get("inputs_embeds"))
    if not isinstance(new, torch.Tensor):
        new = next((a for a in args if isinstance(a, torch.Tensor)), None)
    return before + (int(new.shape[1]) if isinstance(new, torch.Tensor) and new.dim() >= 2 else 0)


def _forward_names(mod: nn.Module) -> tuple[str, ...]:
    """Parameter names of ``mod.forward``, for ``:input[name]``.

    Read on each call, not cached per class: wrappers (accelerate, peft) may
    replace ``forward`` on one instance only.
    """
    return param_names(mod.forward)


def _input_value(args: tuple, kwargs: dict, tap: Tap, names: tuple[str, ...] = ()) -> Any:
    """The value an ``:input`` tap starts from.

    With an index, the first index picks the argument: an integer picks a
    positional argument, a key picks a keyword argument, or a positional one
    by its parameter name in ``names`` (then the rest of the chain applies).
    Without an index, the input is the one tensor argument: the only
    positional argument, else the only tensor among the positional arguments
    (HF calls ``layer(h, None, is_causal=True)``), else the only tensor
    keyword argument. Anything less clear is returned whole, so the error
    shows the call's structure.

    Example:
        >>> t = torch.zeros(1)
        >>> _input_value((t, None), {"is_causal": True}, Tap.parse("m:input")) is t
        True
        >>> _input_value((t, None), {}, Tap.parse("m:input[hidden]"), ("hidden", "mask")).positional
        {'hidden': 0, 'mask': 1}
    """
    if not tap.index:
        if len(args) == 1:
            return args[0]
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if len(tensors) == 1:
            return tensors[0]
        if not tensors:
            kw_tensors = [v for v in kwargs.values() if isinstance(v, torch.Tensor)]
            if len(kw_tensors) == 1:
                return kw_tensors[0]
    return CallArgs(args, kwargs, names)
