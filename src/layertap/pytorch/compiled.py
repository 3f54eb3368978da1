"""Compiled PyTorch as a candidate (imported only for one): how a module was compiled, the module run with a
tap at every module inside the compiled graph, its float64 twin, the graph breaks dynamo took, and the modules
kept eager.

Taps live inside the compiled program: a forward hook on every tapped module, registered *before* the copy is
compiled, clones each value it sees into a list the wrapper returns beside the model's own outputs
(:class:`HookTaps`). Dynamo traces the hooks into the graph (no graph break), so the values are those the
compiled kernels computed; the clone keeps a later in-place op (``ReLU(inplace=True)``) from overwriting one.
The hooks sit on a copy of the user's module, so neither the user's module nor its compiled form is touched.

Example:
    >>> import torch
    >>> m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval()
    >>> taps = HookTaps(m, "forward", {"0", "1"})
    >>> values = taps.named(taps(torch.ones(2, 4)))
    >>> sorted(values), taps.names
    (['0#0', '1#0', 'output'], {('0', 0): ('0#0',), ('1', 0): ('1#0',)})
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import nn

from ..errors import LayertapError, one_line, unknown_name
from ..noise import COMPILE_LOGGERS, quiet_loggers
from ..numformats import PRECISIONS
from .taps import bound_method, output_tensors

#: ``--autocast`` names -> the dtype both sides compute in
AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}
#: the modes torch.compile names (``--compile-mode``)
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass
class Compilation:
    """How a candidate module runs: compiled by ``ctx`` (a ``torch.compile`` context: its backend, mode, options;
    ``None``: eager), under ``autocast`` (``bf16``, ``fp16``; ``None``: the module's own dtype).

    Example:
        >>> Compilation(None).describe(), Compilation(None, "bf16").precision
        ('PyTorch eager', 'bfloat16')
    """

    ctx: Any
    autocast: str | None = None

    @property
    def precision(self) -> str:
        """The format the candidate computes in (its autocast dtype, else float32)."""
        return PRECISIONS[self.autocast or "fp32"]

    def compile(self, module: nn.Module) -> nn.Module:
        """``module`` compiled as the candidate was (eager: itself), its compiled frames kept apart from every
        other compile's (:func:`isolated`)."""
        return isolated(self.ctx)(module) if self.ctx is not None else module

    def backend(self) -> str:
        """The backend's name (``inductor``, a callable's name), ``eager`` for an uncompiled module."""
        if self.ctx is None:
            return "eager"
        found = _backend_object(self.ctx)
        return str(getattr(found, "_compiler_name", None) or getattr(found, "__name__", None) or type(found).__name__)

    def options(self) -> dict[str, Any]:
        """The inductor options the mode and ``options=`` set (``{}`` for another backend)."""
        found = _backend_object(self.ctx) if self.ctx is not None else None
        inner = getattr(found, "_torchdynamo_orig_backend", found)
        config = getattr(inner, "config", None)
        return dict(config) if isinstance(config, dict) else {}

    def describe(self) -> str:
        """``torch.compile (inductor, max_autotune)``, ``PyTorch eager``."""
        if self.ctx is None:
            return "PyTorch eager"
        extra = [k for k, v in self.options().items() if v is True] + (["fullgraph"] if self.fullgraph else [])
        return f"torch.compile ({', '.join([self.backend(), *extra])})"

    @property
    def fullgraph(self) -> bool:
        return bool(getattr(self.ctx, "fullgraph", False))

    @contextlib.contextmanager
    def running(self, device: str = "cpu") -> Iterator[None]:
        """No gradients, and the autocast the candidate computes under (torch's compile logs quiet)."""
        with torch.no_grad(), quiet_loggers(*COMPILE_LOGGERS):
            if self.autocast is None:
                yield
            else:
                with torch.autocast(device, dtype=AUTOCAST[self.autocast]):
                    yield


def own_frames(model: nn.Module) -> nn.Module:
    """Give every module of ``model`` (a copy layertap made) a ``forward`` of its own code object, in place.

    Dynamo caches compiled frames on the code object, and a cached frame's guards do not cover a module's
    hooks nor a ``forward`` replaced on the instance: after a graph break, the frame an earlier compile cached
    for a module's ``forward`` (the user's, without taps; another fix trial's, with other modules kept eager)
    would run for this copy. Isolated compile regions still fall back to shared entries; a code object of its
    own has none. Returns ``model``.
    """
    made: dict[type, type] = {}
    for m in model.modules():
        cls = type(m)
        fn = cls.forward if isinstance(getattr(cls.forward, "__code__", None), types.CodeType) else None
        if fn is None or "forward" in m.__dict__:
            continue
        if cls not in made:  # a subclass of the same name, so module stacks and rows read as before
            fresh = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__,
                                       fn.__closure__)
            fresh.__kwdefaults__, fresh.__qualname__ = fn.__kwdefaults__, fn.__qualname__
            made[cls] = type(cls.__name__, (cls,), {"forward": fresh, "__module__": cls.__module__,
                                                    "__qualname__": cls.__qualname__})
        m.__class__ = made[cls]
    return model


def isolated(ctx: Any) -> Any:
    """A copy of a dynamo context whose compiled frames live in a cache region of their own.

    Frames are cached per code object, and dynamo does not guard a module's hooks: after a graph break, the
    frame of a module's ``forward`` that an earlier compile cached (the user's, without taps) would serve the
    tapped copy and skip its hooks, and a frame cached with taps would serve the user's. Each compile here
    gets its own region (``torch.compile(isolate_recompiles=True)``; before torch had regions, the shared
    cache)."""
    from torch._dynamo import eval_frame  # noqa: PLC0415 -- dynamo loads with the first compile

    counter = getattr(eval_frame, "_next_isolate_recompiles_id", None)
    if counter is None or not hasattr(ctx, "_isolate_recompiles_id"):
        return ctx
    fresh = copy.copy(ctx)
    fresh._isolate_recompiles_id = next(counter)
    return fresh


def _backend_object(ctx: Any) -> Any:
    """The backend a dynamo context wraps (past its frame converters)."""
    found = getattr(ctx, "callback", ctx)
    for _ in range(8):
        inner = getattr(found, "_torchdynamo_orig_backend", None)
        if inner is None or inner is found or hasattr(found, "_compiler_name"):
            break
        found = inner
    return found


def is_compiled(module: Any) -> bool:
    """Whether ``module`` is a ``torch.compile`` result (an ``OptimizedModule``)."""
    return hasattr(module, "_orig_mod") and hasattr(module, "dynamo_ctx")


def compilation_of(candidate: Any, autocast: str | None = None) -> tuple[nn.Module, Compilation]:
    """The module a candidate runs and how: a ``torch.compile`` result's original module and its context, or a
    plain module run eagerly.

    Example:
        >>> m = nn.Linear(2, 2)
        >>> compilation_of(m)[0] is m, compilation_of(torch.compile(m))[1].backend()
        (True, 'inductor')
    """
    check_autocast(autocast)
    if is_compiled(candidate):
        return candidate._orig_mod, Compilation(candidate.dynamo_ctx, autocast)
    if not isinstance(candidate, nn.Module):
        raise LayertapError(f"the candidate is a {type(candidate).__name__}: give an nn.Module (torch.compile(model), "
                            "another checkpoint of the model) or a file")
    return candidate, Compilation(None, autocast)


def check_autocast(autocast: str | None) -> None:
    if autocast is not None and autocast not in AUTOCAST:
        raise LayertapError(unknown_name("autocast dtype", str(autocast), list(AUTOCAST)))


def compiled(model: nn.Module, backend: str | Callable[..., Any] = "inductor", mode: str | None = None,
             options: dict[str, Any] | None = None, fullgraph: bool = False) -> nn.Module:
    """``torch.compile(model, ...)`` with its names checked (a bad mode is one line naming the known ones).

    Example:
        >>> compiled(nn.Linear(2, 2), mode="fast")
        Traceback (most recent call last):
        ...
        layertap.errors.LayertapError: unknown compile mode 'fast'; use one of default, reduce-overhead, ...
    """
    if mode is not None and mode not in MODES:
        raise LayertapError(f"unknown compile mode {mode!r}; use one of {', '.join(MODES)}")
    if mode is not None and options:
        raise LayertapError("torch.compile takes a mode or options, not both: drop --compile-mode or the options")
    made: Any = torch.compile(nn.Identity(), backend=backend, mode=mode, options=options, fullgraph=fullgraph)
    return Compilation(made.dynamo_ctx).compile(model)


class HookTaps(nn.Module):
    """``forward(*args)`` -> the model's own tensors, then a clone of each value the modules ``paths`` returned,
    in return order. The hooks are registered here, before any compile, so a compiled ``HookTaps`` computes the
    taps inside its graph. :meth:`named` names one call's values: ``output`` (or ``output[i]``...) and
    ``PATH#CALL`` (a tuple-returning module's items ``PATH#CALL[i]``); :attr:`names` maps each module call to its
    names, from the first call."""

    _fn: Callable[..., Any]
    _values: list[torch.Tensor]
    _sources: list[tuple[str, int]]
    _own: list[str]

    def __init__(self, model: nn.Module, method: Any, paths: set[str]) -> None:
        super().__init__()
        self.model = model
        self.__dict__["_fn"] = bound_method(model, method)  # past __setattr__: the model is already a child
        self.__dict__["_values"] = []
        self.__dict__["_sources"] = []
        self.__dict__["_own"] = []
        self.names: dict[tuple[str, int], tuple[str, ...]] = {}
        self._handles = [m.register_forward_hook(self._hook(p)) for p, m in model.named_modules() if p in paths]

    def _hook(self, path: str) -> Callable[..., None]:
        values, sources = self._values, self._sources

        def hook(module: nn.Module, args: Any, out: Any) -> None:
            if isinstance(out, torch.Tensor) and out.is_floating_point():
                values.append(out.clone())
                sources.append((path, -1))
            elif isinstance(out, (tuple, list)) and out and all(
                    isinstance(t, torch.Tensor) and t.is_floating_point() for t in out):
                for i, t in enumerate(out):
                    values.append(t.clone())
                    sources.append((path, i))

        return hook

    def forward(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
        self._values.clear()
        self._sources.clear()
        own = output_tensors(self._fn(*args, **kwargs), detach=False)
        self._own[:] = list(own)
        return (*own.values(), *self._values)

    def named(self, values: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        """One call's values by name (see the class doc); the first call also fills :attr:`names`."""
        own = list(self._own)
        out = dict(zip(own, values))
        calls: dict[str, int] = {}
        names: dict[tuple[str, int], list[str]] = {}
        for (path, item), value in zip(self._sources, values[len(own):]):
            call = calls.get(path, 0) if item <= 0 else calls[path] - 1
            if item <= 0:
                calls[path] = call + 1
            name = f"{path}#{call}" + (f"[{item}]" if item >= 0 else "")
            out[name] = value
            names.setdefault((path, call), []).append(name)
        if not self.names:
            self.names = {k: tuple(v) for k, v in names.items()}
        return out

    def remove(self) -> None:
        """Take the hooks off (the copy they sit on is dropped after)."""
        for h in self._handles:
            h.remove()


def tappable(model: nn.Module, wanted: Callable[[str], bool]) -> set[str]:
    """The module paths tapped: every named submodule ``wanted``."""
    return {p for p, _ in model.named_modules() if p and wanted(p)}


def float64_twin(model: nn.Module) -> nn.Module:
    """A float64 copy of ``model``: the reference a compiled and an eager run are both judged against."""
    twin = copy.deepcopy(model)
    return twin.to(torch.float64)


def float64_args(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Floating tensors as float64 (integers, masks and everything else as given)."""
    def cast(v: Any) -> Any:
        return v.to(torch.float64) if isinstance(v, torch.Tensor) and v.is_floating_point() else v

    return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}


@dataclass(frozen=True)
class GraphBreak:
    """Where dynamo split the graph: the modules whose ``forward`` holds the break, and dynamo's reason."""

    modules: tuple[str, ...]
    reason: str


def explained(compilation: Compilation, wrapper: nn.Module) -> tuple[nn.Module, Callable[[], list[Any]] | None]:
    """``wrapper`` compiled as ``compilation`` compiles, its backend wrapped in dynamo's ``ExplainWithBackend``, so
    that the compile itself collects its graph breaks (no second trace, as ``dynamo.explain`` would make), and
    the function that returns them once it ran (``None``: eager, fullgraph, or a context that cannot be rebuilt
    around another backend: :func:`graph_breaks` traces instead)."""
    ctx = compilation.ctx
    if ctx is None or compilation.fullgraph:
        return compilation.compile(wrapper), None
    from torch._dynamo.backends.debugging import ExplainWithBackend  # noqa: PLC0415 -- dynamo loads with the first compile

    try:
        explainer = ExplainWithBackend(_backend_object(ctx))
        made: Any = torch.compile(nn.Identity(), backend=explainer, dynamic=getattr(ctx, "_dynamic", None))
    except Exception:  # noqa: BLE001 - another torch's context: the breaks are traced apart (graph_breaks)
        return compilation.compile(wrapper), None
    return Compilation(made.dynamo_ctx, compilation.autocast).compile(wrapper), lambda: list(explainer.break_reasons)


def graph_breaks(module: nn.Module, wrapper: nn.Module, args: tuple, ctx: Any) -> list[GraphBreak]:
    """The graph breaks compiling ``wrapper`` takes (nothing when it compiled whole), each with the modules of
    ``module`` whose ``forward`` code holds it. Traced with dynamo's ``explain`` (its eager backend), where the
    compile could not collect them itself (:func:`explained`)."""
    if ctx is None or getattr(ctx, "fullgraph", False):
        return []
    import torch._dynamo as dynamo  # noqa: PLC0415 -- dynamo loads with the first compile, not with layertap

    try:
        with torch.no_grad():
            found = dynamo.explain(wrapper)(*args)
    except Exception as e:  # noqa: BLE001 - a failed explain leaves the compare as it is; compile errors surface there
        return [GraphBreak((), f"dynamo's explain failed: {one_line(e)}")]
    return breaks_in(module, found.break_reasons)


def breaks_in(module: nn.Module, reasons: Sequence[Any]) -> list[GraphBreak]:
    """Dynamo's break ``reasons`` (``GraphCompileReason``s), each with the modules of ``module`` whose ``forward``
    code holds it (the innermost frame of its user stack that falls in one)."""
    codes = _forward_codes(module)
    out = []
    for b in reasons:
        frames = list(getattr(b, "user_stack", []) or [])
        where: tuple[str, ...] = ()
        for frame in reversed(frames):
            where = tuple(p for p, (file, first, last) in codes.items()
                          if file == frame.filename and first <= (frame.lineno or 0) <= last)
            if where:
                break
        out.append(GraphBreak(where, one_line(str(b.reason), limit=200)))
    return out


def _forward_codes(module: nn.Module) -> dict[str, tuple[str, int, int]]:
    """Each submodule's ``forward`` code: its file and line range."""
    out = {}
    for p, m in module.named_modules():
        code = getattr(type(m).forward, "__code__", None)
        if p and code is not None:
            lines = [line for _, _, line in code.co_lines() if line is not None]
            out[p] = (code.co_filename, code.co_firstlineno, max(lines, default=code.co_firstlineno))
    return out


#: what ``keep-eager.json`` holds
KEEP_EAGER_FORMAT = "layertap.keep-eager/1"


def keep_eager(model: nn.Module, kept: str | os.PathLike | Sequence[str]) -> nn.Module:
    """Run the ``forward`` of each module ``kept`` eagerly inside any later ``torch.compile`` of ``model``
    (``torch.compiler.disable`` on those modules' ``forward``, in place); ``kept`` is a list of module paths or
    the ``keep-eager.json`` that ``layertap fix --runtime inductor`` writes. Returns ``model``.

    Example:
        >>> m = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        >>> keep_eager(m, ["1"]) is m, hasattr(m[1].forward, "_torchdynamo_disable")
        (True, True)
    """
    paths = read_kept(kept) if isinstance(kept, (str, os.PathLike)) else list(kept)
    modules = dict(model.named_modules())
    for path in paths:
        if path not in modules or not path:
            raise LayertapError(unknown_name("module", str(path), sorted(p for p in modules if p)))
        m = modules[path]
        m.forward = torch.compiler.disable(m.forward, recursive=True)
    return model


def read_kept(path: str | os.PathLike) -> list[str]:
    """The module paths a ``keep-eager.json`` names (one-line errors for a file that is not one)."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise LayertapError(f"no such keep-eager file: '{path}'") from None
    except (OSError, ValueError) as e:
        raise LayertapError(f"'{path}' is not a keep-eager JSON file: {one_line(e)}") from None
    kept = data.get("keep_eager") if isinstance(data, dict) else None
    if not isinstance(kept, list) or not all(isinstance(k, str) for k in kept):
        raise LayertapError(f"'{path}' is not a keep-eager JSON file: it needs a 'keep_eager' list of module paths "
                            "(layertap fix MODEL --runtime inductor --config-out DIR writes one)")
    return kept


def kept_json(kept: Sequence[str], compilation: Compilation) -> dict[str, Any]:
    """``keep-eager.json``: the modules kept eager, how the rest was compiled, and the line that applies it."""
    return {"format": KEEP_EAGER_FORMAT, "keep_eager": list(kept), "backend": compilation.backend(),
            "options": {k: v for k, v in compilation.options().items() if isinstance(v, (bool, int, float, str))},
            "autocast": compilation.autocast,
            "apply": "layertap.keep_eager(model, 'keep-eager.json'); model = torch.compile(model, ...)"}


def copy_with(model: nn.Module, kept: Sequence[str]) -> nn.Module:
    """A copy of ``model`` with the modules ``kept`` eager (:func:`keep_eager`), for a fix trial."""
    return keep_eager(own_frames(copy.deepcopy(model)), kept)



def compile_error(error: BaseException, module: nn.Module) -> LayertapError | None:
    """A compile failure as one line that names the module it happened in and dynamo's own words (no C++
    compiler: where to get one), or ``None`` for an error that is not the compiler's."""
    kind = type(error)
    if not kind.__module__.startswith(("torch._dynamo", "torch._inductor")) and "Backend" not in kind.__name__:
        return None
    if "CxxCompiler" in kind.__name__ or "C++ compiler" in str(error):
        return LayertapError("torch.compile's inductor backend needs a C++ compiler and found none: install one "
                             "(apt-get install g++; or set CXX), or compare with --compile-backend aot_eager")
    codes = _forward_codes(module.model if isinstance(module, HookTaps) else module)  # a tapped copy: the model's paths
    where: tuple[str, ...] = ()
    for frame in reversed(list(getattr(error, "real_stack", None) or [])):
        where = tuple(p for p, (file, first, last) in codes.items()
                      if file == frame.filename and first <= (frame.lineno or 0) <= last)
        if where:
            break
    at = f" in {', '.join(where[:3])}" if where else ""
    return LayertapError(f"torch.compile could not compile the model{at}: {one_line(error, first=True, limit=300)}")


#: the key of layertap's record in an AOTInductor package's metadata
PACKAGE_RECORD = "layertap"


def aoti_package(wrapper: nn.Module, example: tuple, out: Path, record: str) -> None:
    """``wrapper`` exported at the example's sizes and compiled by AOTInductor into the package ``out``, with
    layertap's ``record`` (its inputs, outputs and weights: JSON text) in the package's metadata."""
    from torch._inductor import aoti_compile_and_package  # noqa: PLC0415 -- inductor loads for a package only

    with torch.no_grad():
        program = torch.export.export(wrapper, example, strict=False)
    try:
        with quiet_loggers(*COMPILE_LOGGERS):
            aoti_compile_and_package(program, package_path=str(out),
                                     inductor_configs={"aot_inductor.metadata": {PACKAGE_RECORD: record}})
    except Exception as e:
        raise compile_error(e, wrapper) or LayertapError(
            f"AOTInductor could not compile the model: {one_line(e, first=True, limit=300)}") from e


def load_package(path: Path) -> Any:
    """An AOTInductor package loaded for running (its ``get_metadata()`` holds layertap's record)."""
    from torch._inductor import aoti_load_package  # noqa: PLC0415 -- inductor loads for a package only

    with quiet_loggers(*COMPILE_LOGGERS):
        return aoti_load_package(str(path))
