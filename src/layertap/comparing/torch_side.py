"""``lt.compare``'s PyTorch side: run the model once with hooks on every module
and keep each call's output as numpy (spilling to disk beyond a memory budget).

Used by :mod:`layertap.comparing`.
"""

from __future__ import annotations

import contextlib
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Collection, Iterator

import numpy as np

from ..errors import InputSpecError, LayertapError, one_line
from ..files.store import ArrayStore
from ..pytorch.callhooks import CallHooks, module_key  # noqa: TID253 -- callhooks imports no torch

if TYPE_CHECKING:  # pragma: no cover
    import torch


@dataclass
class ModuleCall:
    """One module call as PyTorch ran it; ``key`` is its position in return order."""

    key: int
    path: str
    call: int
    type: str
    note: str | None = None  # why it holds no tensor
    # per output tensor: (key, index) of the latest earlier call that returned that very
    # tensor object (the child that produced it), or None; tells tuple elements apart
    sources: list[tuple[int, int] | None] | None = None


@dataclass
class KeptCall:
    """A module call's arguments, copied as it started, to run it again alone (``local=True`` judged at the
    candidate's precision: the call at the candidate's format on the reference's own inputs).

    Attributes:
        module: the module called.
        args, kwargs: copies of its arguments (each tensor copied once per forward).
        counts: how many calls of each module (by :func:`~layertap.pytorch.callhooks.module_key`) had started
            before it: numbers its own call and those inside it again as the forward numbered them.
        producers: position among its flattened arguments -> the (call key, output index) that returned it.
        first: the key the first call made inside it gets (the calls it holds: its own key minus this).
    """

    module: Any
    args: tuple
    kwargs: dict
    counts: dict[int, int]
    producers: dict[int, tuple[int, int]]
    first: int = 0


def to_numpy(t: "torch.Tensor") -> np.ndarray:
    """A copy: in-place modules (``ReLU(inplace=True)``) overwrite the tensor later."""
    from ..pytorch.values import tensor_to_numpy

    return tensor_to_numpy(t, copy=True)


def input_key(key: int) -> int:
    """The store key of call ``key``'s inputs (kept with ``inputs=True``): negative, apart from outputs."""
    return -1 - key


def _shallow_tensors(values: list[Any]) -> Iterator[Any]:
    """The arguments and the members of tuple/list arguments (a cache object's tensors are not inputs)."""
    for v in values:
        yield from (v if isinstance(v, (tuple, list)) else (v,))


class _TorchRecorder(CallHooks):
    """Forward hooks that record every module call, in return order, into a store.

    A module's output is copied to numpy the moment the call returns (a later
    in-place op cannot change it). A container (``Sequential``, a residual
    block's last child) often returns its last child's tensor object
    unchanged; that value is stored once and shared, not copied twice.

    Example:
        >>> import torch
        >>> m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()).eval()
        >>> store = ArrayStore(1 << 20)
        >>> rec = _TorchRecorder(m, store, lambda path: True)
        >>> with rec.hooks(), torch.no_grad():
        ...     _ = m(torch.ones(1, 2))
        >>> [(c.path, c.call) for c in rec.calls]
        [('0', 0), ('1', 0)]
    """

    def __init__(self, model: Any, store: ArrayStore, wanted: Callable[[str], bool], inputs: bool = False,
                 kept: dict[int, KeptCall] | None = None, shapes_only: Collection[str] = ()) -> None:
        super().__init__(model)
        self.store = store
        self.wanted = wanted
        self.shapes_only = shapes_only
        self.wants_inputs = inputs or kept is not None
        self.fresh_inputs = inputs
        self.kept = kept
        self._pending: dict[tuple[str, int], list[np.ndarray]] = {}  # a running call's fresh inputs
        self._calling: dict[tuple[str, int], KeptCall] = {}  # a running call's arguments, when kept
        self._clones: dict[int, tuple[Any, int, Any]] = {}  # id(tensor) -> (weakref, version, clone): one copy each
        self.calls: list[ModuleCall] = []
        self._last: tuple[list[Any], list[np.ndarray], list[int]] = ([], [], [])  # tensors, arrays, versions
        self._made_by: dict[int, tuple[Any, tuple[int, int]]] = {}  # id(tensor) -> (weakref, (key, index))

    @contextmanager
    def hooks(self) -> Iterator[None]:
        """Hooks on every submodule, removed on exit (exceptions too)."""
        try:
            with super().hooks():
                yield
        finally:
            self._last = ([], [], [])
            self._made_by = {}
            self._clones = {}

    def on_inputs(self, mod: Any, path: str, call: int, args: tuple, kwargs: dict) -> None:
        """Keep the floating inputs no earlier call returned (a value between modules: ``act(gate) * up``,
        an attention's context, a residual sum); the local error of a call reads them. With ``kept``, keep
        the call's whole arguments too (copies), to run it again alone (:class:`KeptCall`)."""
        if not self.wanted(path):
            return
        import torch

        if self.kept is not None:
            counts = dict(self.counter.started)
            counts[module_key(mod)] -= 1  # as they stood before this call started
            self._calling[(path, call)] = KeptCall(mod, self._copy(args), self._copy(kwargs), counts,
                                                  self._producers(args, kwargs), len(self.calls))
        if not self.fresh_inputs:
            return

        fresh = []
        for t in _shallow_tensors([*args, *kwargs.values()]):
            if not isinstance(t, torch.Tensor):
                continue
            seen = self._made_by.get(id(t))
            if t.is_floating_point() and not (seen is not None and seen[0]() is t):
                fresh.append(to_numpy(t))
        if fresh:
            self._pending[(path, call)] = fresh

    def on_return(self, mod: Any, path: str, call: int, output: Any) -> None:
        mc = ModuleCall(len(self.calls), path, call, type(mod).__name__)
        self.calls.append(mc)
        if self.wanted(mc.path):
            self._record(mc, output)
        fresh = self._pending.pop((path, call), None)
        if fresh:
            self.store.put(input_key(mc.key), fresh)
        kept = self._calling.pop((path, call), None)
        if kept is not None and self.kept is not None:
            self.kept[mc.key] = kept

    def _copy(self, value: Any) -> Any:
        """``value`` with every tensor in it copied once (a later in-place op cannot change the copy; a tensor
        handed to several calls is copied once), rebuilt as :func:`~layertap.pytorch.rounding.map_tensors` rebuilds."""
        from ..pytorch.rounding import map_tensors

        return map_tensors(value, lambda i, t: self._clone(t))

    def _clone(self, t: Any) -> Any:
        seen = self._clones.get(id(t))
        if seen is not None and seen[0]() is t and seen[1] == t._version:
            return seen[2]
        copy = t.detach().clone()
        with contextlib.suppress(TypeError):  # a tensor subclass without weak references: copied each time
            self._clones[id(t)] = (weakref.ref(t), t._version, copy)
        return copy

    def _producers(self, args: tuple, kwargs: dict) -> dict[int, tuple[int, int]]:
        """Position among the arguments' tensors (:func:`~layertap.pytorch.rounding.map_tensors`'s order) -> the
        (call key, output index) of the call that returned that tensor."""
        from ..pytorch.rounding import map_tensors

        out = {}

        def note(i: int, t: Any) -> Any:
            seen = self._made_by.get(id(t))
            if seen is not None and seen[0]() is t:
                out[i] = seen[1]
            return t

        map_tensors((args, kwargs), note)
        return out

    def _record(self, mc: ModuleCall, output: Any) -> None:
        from ..pytorch.values import flatten

        tensors = [t for _, t in flatten(output)]
        if not tensors:
            mc.note = "PyTorch output holds no tensor"
            return
        self._track_sources(mc, tensors)
        if mc.path in self.shapes_only:
            self.store.put_shapes(mc.key, [tuple(t.shape) for t in tensors])
            self._last = ([], [], [])  # a container returning this tensor copies it itself
            return
        prev, prev_arrays, versions = self._last
        if (
            len(prev) == len(tensors)
            and all(a is b for a, b in zip(prev, tensors))
            and all(t._version == v for t, v in zip(tensors, versions))
        ):
            self.store.put(mc.key, prev_arrays, shared=True)
            return
        arrays = [to_numpy(t) for t in tensors]
        self.store.put(mc.key, arrays)
        self._last = (tensors, arrays, [t._version for t in tensors])

    def _track_sources(self, mc: ModuleCall, tensors: list[Any]) -> None:
        """Which earlier call returned each of these tensor objects (weak refs: nothing kept alive)."""
        sources: list[tuple[int, int] | None] = []
        for t in tensors:
            seen = self._made_by.get(id(t))
            sources.append(seen[1] if seen is not None and seen[0]() is t else None)
        mc.sources = sources
        for i, t in enumerate(tensors):
            try:
                self._made_by[id(t)] = (weakref.ref(t), (mc.key, i))
            except TypeError:  # a tensor subclass without weakref support
                pass


def run_torch(
    model: Any,
    args: tuple,
    kwargs: dict,
    method: str | Callable[..., Any],
    store: ArrayStore,
    wanted: Callable[[str], bool],
    inputs: bool = False,
    kept: dict[int, KeptCall] | None = None,
    shapes_only: Collection[str] = (),
) -> tuple[list[ModuleCall], ModuleCall]:
    """Run the model once; record every module call in return order (``inputs``: also the
    inputs no module returned, under :func:`input_key`; ``kept``: filled with every wanted call's
    arguments, by call key, to run it again alone; ``shapes_only``: modules whose calls' shapes
    are kept without their values, which nothing compares).

    Returns the calls and the root call (the model's result, stored last).
    """
    import torch

    from ..pytorch.taps import bound_method
    from ..pytorch.values import exact_float32, flatten, gpu_device, method_name

    fn = bound_method(model, method)
    what = f"{type(model).__name__}.{method}" if isinstance(method, str) else method_name(method)
    recorder = _TorchRecorder(model, store, wanted, inputs, kept, shapes_only)
    # a reference in full float32 on a GPU too (PyTorch's default TF32 would be a divergence of its own)
    precise = exact_float32() if gpu_device(model, args, kwargs) is not None else contextlib.nullcontext()
    with recorder.hooks(), torch.no_grad(), precise:
        try:
            out = fn(*args, **kwargs)
        except (TypeError, ValueError, RuntimeError, IndexError) as e:
            if type(e).__name__ == "UncapturedHigherOrderOpError":  # torch._dynamo's, without importing it
                raise LayertapError(
                    f"{what} calls modules inside torch.cond (or another control-flow operator), and PyTorch refuses "
                    "the forward hooks layertap puts on them in eager mode; compare the exported file with another "
                    "ONNX file (layertap compare REF.onnx CAND.onnx), or tap its branch tensors by name "
                    "(layertap run FILE.onnx --tap NAME)") from e
            # Almost always inputs that do not fit the model; the chain keeps the traceback.
            raise InputSpecError(
                f"{what} failed on the given inputs: {type(e).__name__}: {one_line(e, limit=400)}"
            ) from e
    root = ModuleCall(len(recorder.calls), "", 0, type(model).__name__)
    tensors = [t for _, t in flatten(out)]
    if not tensors:
        raise LayertapError(f"{what} returned no tensor; there is nothing to compare")
    store.put(root.key, [to_numpy(t) for t in tensors])
    return recorder.calls, root
