"""``lt.compare``'s ONNX side: load the graph, run it in ONNX Runtime with chosen
tensors exposed as outputs, map the PyTorch arguments onto its inputs, and view
its module scopes under the model's own module paths.

Used by :mod:`layertap.comparing`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ..errors import InputSpecError, LayertapError, OnnxFileError, one_line
from ..runtimes import is_ir
from .torch_side import to_numpy

if TYPE_CHECKING:  # pragma: no cover
    import onnx

    from ..onnxfile.kvcache import KvLayout
    from ..onnxfile.modelfile import ModelFile
    from ..onnxfile.ort import SessionSource
    from ..runtimes import Runtime, RuntimeInfo


class OrtRunner:
    """Sessions over an in-memory copy of the graph with chosen tensors as outputs.

    The model's inline weights are taken out once (:class:`SessionSource` with
    ``move_weights``): every session, and every part of the graph run on its own
    (``--local``), reads them in place, instead of the whole model being
    serialised and parsed again per session. :attr:`proto` is that small copy;
    callers use it and drop the model they passed in.
    """

    def __init__(self, proto: "onnx.ModelProto", folder: Path, runtime: "Runtime", file: Path | None = None,
                 origin: Path | None = None) -> None:
        from ..onnxfile.ort import SessionSource

        self.file = file  # an OpenVINO IR: run from the file (``proto`` is its tensor names only)
        # ``origin``: the unedited file ``proto`` was read from (see SessionSource)
        self.source = SessionSource(proto, folder, move_weights=True, origin=origin)
        self.label = str(file or origin or folder)  # how an error names what failed to load
        self.proto = self.source.model
        self.folder = folder
        self.runtime = runtime
        self._out_info = {o.name: o for o in self.proto.graph.output}
        self._value_info = {v.name: v for v in self.proto.graph.value_info}
        self.runs = 0
        self.sessions = 0
        self._session: tuple[tuple[str, ...], Any] | None = None  # the last engine, kept for the next sample

    @classmethod
    def of_source(cls, source: "SessionSource", folder: Path, runtime: "Runtime", label: str) -> "OrtRunner":
        """A runner on a graph already held in memory with its weights (an ideal run's rounded copy);
        ``label`` names it in an error."""
        runner = cls.__new__(cls)
        runner.file, runner.source, runner.proto, runner.folder, runner.runtime = None, source, source.model, folder, runtime
        runner.label = label
        runner._out_info = {o.name: o for o in runner.proto.graph.output}
        runner._value_info = {v.name: v for v in runner.proto.graph.value_info}
        runner.runs = runner.sessions = 0
        runner._session = None
        return runner

    @property
    def optimize(self) -> bool:
        """ONNX Runtime's graph optimisations (always on for another runtime)."""
        return self.runtime.optimize

    def exposable(self) -> set[str] | None:
        """The tensors the runtime can hand out (``None``: every tensor of the graph)."""
        return self.runtime.exposable(self.file or self.source)

    def input_names(self) -> list[tuple[str, str]]:
        """(name, element type) of the graph's real inputs (not initializers)."""
        import onnx

        inits = {i.name for i in self.proto.graph.initializer}
        out = []
        for i in self.proto.graph.input:
            if i.name in inits:
                continue
            et = i.type.tensor_type.elem_type
            try:
                dtype = onnx.helper.tensor_dtype_to_np_dtype(et).name if et else ""
            except (KeyError, ValueError, TypeError):
                dtype = ""  # a type numpy lacks (bfloat16, float8): feed as given
            out.append((i.name, dtype))
        return out

    def input_shapes(self) -> dict[str, tuple[int | str, ...]]:
        """Declared shape of each graph input: a fixed size as an int, a symbolic one as its
        name (``""`` when unnamed or negative: :func:`~layertap.onnxfile.shapes.declared_dims`)."""
        from ..onnxfile.shapes import input_dims

        return {name: dims for name, dims in input_dims(self.proto.graph).items() if dims is not None}

    def prepare(self, names: list[str]) -> Any:
        """The session exposing ``names``: the last one while the names stay the same (one
        session for every sample of a batch), else a new one."""
        key = tuple(names)
        if self._session is None or self._session[0] != key:
            self._session = None  # drop the old session (and its exposed-output graph) first
            self._session = (key, self._new_session(names))
            self.sessions += 1
        return self._session[1]

    def run(self, names: list[str], feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One run exposing ``names`` (in the session :meth:`prepare` keeps)."""
        sess = self.prepare(names)
        try:
            values = sess.run(names, feed)
        except Exception as e:  # noqa: BLE001
            raise InputSpecError(f"{self.runtime.describe().runtime} rejected the inputs: {one_line(e)}") from None
        self.runs += 1
        return values

    def _new_session(self, names: list[str]) -> Any:
        import onnx

        infos = []
        for n in names:
            info = self._out_info.get(n) or self._value_info.get(n)
            infos.append(info if info is not None else onnx.helper.make_empty_tensor_value_info(n))
        try:
            return self.runtime.open(self.file or self.source, infos, only=True)
        except LayertapError:
            raise
        except Exception as e:  # noqa: BLE001 - ORT raises its own types
            raise OnnxFileError(self._load_failure(names, e)) from None

    def _load_failure(self, names: list[str], error: Exception) -> str:
        """What failed to load: the file itself, or only with the tensors exposed (it is opened again as it is, to tell)."""
        runtime = self.runtime.describe().runtime
        try:
            self.runtime.open(self.file or self.source)
        except Exception as plain:  # noqa: BLE001 - ORT raises its own types
            return f"{runtime} cannot load '{self.label}' (as it is, without layertap's outputs too): {one_line(plain)}"
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        return (f"{runtime} loads '{self.label}' but not with its tensors {shown} exposed as outputs: {one_line(error)}; "
                "compare fewer modules (--module) to find the tensor it refuses")

    def close(self) -> None:
        self._session = None


class OrtSide:
    """An ONNX file run by a runtime (ONNX Runtime, OpenVINO): a compare side (the candidate, or an
    ONNX reference's runs)."""

    def __init__(self, source: "str | os.PathLike | ModelFile", runtime: "Runtime") -> None:
        from ..onnxfile.modelfile import ModelFile, model_file
        from .nchwc import blocked_tensors

        if not isinstance(source, ModelFile) and is_ir(source):
            from ..runtimes.openvino import ir_graph

            # an OpenVINO IR: its tensors by name (no module scopes, no ONNX nodes), run from the file
            self.path = Path(source)
            self.runner = OrtRunner(ir_graph(runtime, self.path), self.path.parent, runtime, file=self.path)
            self.blocked: set[str] = set()
            self.carried: frozenset[str] = frozenset()  # an IR's If bodies stay OpenVINO's
            return
        # The shared loader: graph only (weights stay on disk for ORT) and the external-data
        # safety checks every ONNX command applies; a file the caller already read is not read again.
        loaded = model_file(source)
        self.path = loaded.path if isinstance(source, ModelFile) else Path(source)
        self.runner = OrtRunner(loaded.model, loaded.folder, runtime, origin=loaded.path)
        # the runner holds the graph and the weights once: a caller's file keeps the graph alone
        loaded.model = self.runner.proto
        del loaded
        self.blocked = blocked_tensors(self.runner.proto.graph)
        #: tensors of If branches carried out to the main graph (empty when their branch did not run)
        self.carried = frozenset(carry_branches(self.runner))

    @property
    def proto(self) -> "onnx.ModelProto":
        return self.runner.proto

    @property
    def inputs(self) -> list[tuple[str, str]]:
        return self.runner.input_names()

    @property
    def runs(self) -> int:
        return self.runner.runs

    @property
    def sessions(self) -> int:
        return self.runner.sessions

    def prepare(self, names: list[str]) -> None:
        """Build the session that exposes ``names`` ahead of :meth:`run` (see :meth:`OrtRunner.prepare`)."""
        self.runner.prepare(names)

    def run(self, names: list[str], feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One run exposing ``names`` (see :meth:`OrtRunner.run`)."""
        return self.runner.run(names, feed)

    def local_graph(self, scopes: Any = None) -> Any:
        """The file's part graphs for local errors (:class:`~layertap.comparing.local.LocalGraph`;
        ``scopes``: the file's ScopeMap when the reference already read it)."""
        from .local import LocalGraph

        if self.runner.file is not None:
            raise LayertapError(f"--local (local=True) runs parts of an ONNX graph; '{self.path}' is an OpenVINO IR, "
                                "whose nodes are not ONNX: compare it without --local")
        return LocalGraph(self.runner.source, self.runner.runtime, scopes)

    def describe(self) -> "RuntimeInfo":
        """Runtime, version, device and precision this side ran in."""
        return self.runner.runtime.describe()

    def notes(self, label: str | None, rounding: bool) -> list[str]:
        """How the side ran: ``label: PATH in RUNTIME VERSION on DEVICE, PRECISION ...`` next to another
        ONNX run, else the runtime line and what departs from a plain run (and ORT's fusion caveat
        when the first divergence ``rounding`` could be ORT's)."""
        runtime = self.runner.runtime
        settings = runtime.settings()
        ran = self.describe().text() + (f", {settings}" if settings else "")
        if label is not None:
            return [f"{label}: {self.path} in {ran}"]
        notes = [f"the candidate ran in {ran}"]
        if rounding and runtime.rounding_note():
            notes.append(runtime.rounding_note())
        return notes

    def close(self) -> None:
        self.runner.close()


IF_BRANCHES = ("If",)  # the subgraphs a compare reads and carries out (see carry_branches)


def carry_branches(runner: OrtRunner) -> list[str]:
    """Tensors inside ``If`` branches made outputs of their ``If`` nodes (see
    :mod:`layertap.onnxfile.branches`), so rows can expose them; the names carried.

    ONNX Runtime only: OpenVINO's CPU plug-in refuses an ``If`` whose branches give tensors of
    different shapes (the branch not taken gives an empty one). Loop bodies are not carried:
    their values per iteration answer no single module call. A tensor that cannot be carried (a
    name several subgraphs define, an untyped one) stays inside, and its rows have no counterpart.
    """
    from ..errors import OnnxFileError
    from ..onnxfile.branches import Carrier, branch_tensors, has_subgraphs

    graph = runner.proto.graph
    if not runner.runtime.carries_branches or runner.file is not None or not has_subgraphs(graph):
        return []
    carrier, carried = Carrier(runner.proto), []
    for name in branch_tensors(graph, ops=IF_BRANCHES):
        try:
            if carrier.carry(name) is not None:
                carried.append(name)
        except OnnxFileError:
            continue
    if carried:
        runner.source.origin = None  # the graph is no longer the file's
    return carried


def absorb_unexposable(items: Sequence[Any], side: OrtSide, *, reference: bool = False) -> None:
    """Rows whose tensors the side's runtime cannot hand out (OpenVINO folded a Cast, a
    quantize/dequantize pair or a fused node away) become ``absorbed``, never a failure: the
    next compared module holds their effect. ``reference``: check the rows' reference tensors.
    """
    from .rows import ABSORBED

    available = side.runner.exposable()
    if available is None:
        return
    for it in items:
        names = it.ref_tensors if reference else it.tensors
        gone = [t for t in names if t not in available]
        if it.status is not None or not it.mc.path or not gone:
            continue
        whose = "the reference's" if reference else "the candidate's"
        it.status, it.tensors, it.unverified = ABSORBED, (), None
        it.note = (f"{side.describe().runtime} folds {whose} tensor {gone[0]} into a neighbouring kernel (a fusion, "
                   "or a quantised one), so its value cannot be read there; the next compared module holds its effect")


def feed_from_args(inputs: list[tuple[str, str]], args: tuple, kwargs: dict, *, layout: "KvLayout | None" = None,
                   config: Any = None) -> dict[str, np.ndarray]:
    """Map the PyTorch arguments onto the graph inputs.

    A keyword argument goes to the input of the same name; the remaining
    inputs take the positional tensors in order, then the other keyword
    tensors (nested tuples/lists flattened, as the exporters do). Non-tensor
    arguments (``None``, Python numbers) are baked into an exported graph and
    skipped. A decoder file (``layout``) takes ``past_key_values`` (a ``Cache``
    or tuple; ``cache`` in newer transformers) by its cache input names; the cache inputs not given make a
    prefill (:func:`~layertap.onnxfile.kvcache.complete_feeds`, sized by ``config``).
    """
    if layout is not None:
        return _decoder_feed(inputs, args, kwargs, layout, config)
    import torch

    from ..pytorch.values import flatten

    names = [n for n, _ in inputs]
    dtypes = dict(inputs)
    feed: dict[str, Any] = {}
    rest_values: list[Any] = [t for a in args for _, t in flatten(a)]
    for k, v in kwargs.items():
        flat = [t for _, t in flatten(v)]
        if k in dtypes and len(flat) == 1:
            feed[k] = flat[0]
        else:
            rest_values.extend(flat)
    rest = [n for n in names if n not in feed]
    if len(rest_values) != len(rest):
        given = len(rest_values) + len(feed)
        raise InputSpecError(
            f"{given} input tensor{'s' if given != 1 else ''} given but the ONNX file takes {len(names)}: "
            f"{', '.join(names)} (pass them positionally in that order, or by name)"
        )
    feed.update(zip(rest, rest_values))
    out = {}
    for n, t in feed.items():
        a = to_numpy(t) if isinstance(t, torch.Tensor) else np.asarray(t)
        want = dtypes.get(n)
        if want and a.dtype != np.dtype(want):
            a = a.astype(want)  # e.g. int32 token ids for an int64 input
        out[n] = a
    return out


def _decoder_feed(inputs: list[tuple[str, str]], args: tuple, kwargs: dict, layout: "KvLayout",
                  config: Any) -> dict[str, np.ndarray]:
    from ..onnxfile.kvcache import complete_feeds
    from ..pytorch.caches import cache_tensors

    kwargs = dict(kwargs)
    past = kwargs.pop("past_key_values", None)
    past = kwargs.pop("cache", None) if past is None else past  # the newer transformers name
    kwargs.pop("use_cache", None)
    plain = [(n, d) for n, d in inputs if n not in layout.names or n in kwargs]
    feed = feed_from_args(plain, args, kwargs)
    if past is not None:
        tensors = cache_tensors(past)
        if len(tensors) != len(layout.past):
            raise InputSpecError(
                f"the past holds {len(tensors) // 2} layer(s) but the file's cache inputs hold {layout.layers} "
                f"({', '.join(layout.past[:2])}, ...): give the past of the model the file was exported from")
        feed.update(zip(layout.past, (to_numpy(t) for t in tensors)))
    made, _ = complete_feeds(layout, feed, config=config)
    dtypes = dict(inputs)
    feed.update({n: a.astype(dtypes[n]) if dtypes.get(n) else a for n, a in made.items()})
    return {n: feed[n] for n, _ in inputs if n in feed}


def check_feed_shapes(feed: dict[str, np.ndarray], declared: dict[str, tuple[int | str, ...]]) -> None:
    """A clear one-line error before any run when an input cannot fit the file
    (``declared`` as :meth:`OrtRunner.input_shapes` gives it).

    Example:
        >>> check_feed_shapes({"x": np.zeros((2, 3))}, {"x": (1, 3)})
        Traceback (most recent call last):
        ...
        layertap.errors.InputSpecError: input 'x' has shape 2x3 but the ONNX file expects 1x3 (exported with a fixed shape; ...
        >>> check_feed_shapes({"x": np.zeros((2, 3, 8))}, {"x": ("N", 3, 4)})
        Traceback (most recent call last):
        ...
        layertap.errors.InputSpecError: input 'x' has shape 2x3x8 but the ONNX file expects Nx3x4 (N can vary, ...; pass --input 2x3x4)
    """
    for name, a in feed.items():
        want = declared.get(name)
        if want is None:
            continue
        fixed = [w if isinstance(w, int) else None for w in want]
        fits = len(want) == a.ndim and all(w is None or w == d for w, d in zip(fixed, a.shape))
        if fits:
            continue
        symbolic = list(dict.fromkeys(str(w or "N") for w in want if not isinstance(w, int)))
        spelled = (" x " if any(len(n) > 1 for n in symbolic) else "x").join(
            str(w) if isinstance(w, int) else str(w or "N") for w in want) or "a scalar"
        same_rank = len(want) == a.ndim
        # a symbolic size takes the user's own size; only a batch mismatch is fixed by a dynamic batch
        fitting = "x".join(str(a.shape[i] if w is None and same_rank else (1 if w is None else w)) for i, w in enumerate(fixed))
        batch_only = same_rank and a.ndim > 0 and all(w is None or w == d for w, d in zip(fixed[1:], a.shape[1:]))
        why = (f"{', '.join(symbolic)} can vary, the other sizes were fixed at export" if symbolic
               else "exported with a fixed shape")
        raise InputSpecError(
            f"input '{name}' has shape {'x'.join(map(str, a.shape)) or 'a scalar'} but the ONNX file expects "
            f"{spelled} ({why}; pass --input {fitting or 'a scalar'}"
            + (" or re-export with a dynamic batch)" if batch_only else ")")
        )


class ScopeView:
    """The file's module calls under the model's own module paths.

    A file exported from a wrapper around the model names every module under
    the wrapper's attribute: ``lt.export`` files read ``_fn.layer1.0.conv1``
    (dynamo) or ``model.layer1.0.conv1`` (TorchScript). The view strips such
    a prefix so that calls align with ``model.named_modules()``; the wrapper's
    own call (the bare prefix) is the model's result, compared as ``output``.
    It offers the two :class:`~layertap.onnxfile.scopemap.ScopeMap` queries the
    plan needs, ``counterparts()`` and ``calls(path)``.
    """

    def __init__(self, smap: Any, model_paths: set[str]) -> None:
        self.source: str = smap.source
        counterparts = smap.counterparts()
        self.prefix = wrapper_prefix({c.path for c in counterparts}, model_paths)
        if self.prefix:
            counterparts = [_unprefixed(c, self.prefix) for c in counterparts if c.path != self.prefix]
        self._counterparts = counterparts
        self._calls: dict[str, int] = {}
        for c in counterparts:
            self._calls[c.path] = self._calls.get(c.path, 0) + 1

    def counterparts(self) -> list[Any]:
        return list(self._counterparts)

    def calls(self, path: str) -> int:
        return self._calls.get(path, 0)

    def paths(self) -> set[str]:
        return set(self._calls)


def wrapper_prefix(onnx_paths: set[str], model_paths: set[str]) -> str:
    """The module path prefix the file adds to the model's paths ("" for none).

    A prefix (one or more leading components, for nested wrappers) is chosen
    only when stripping it makes more of the file's paths known to the model
    than as they are.

    Example:
        >>> wrapper_prefix({"_fn", "_fn.conv1", "_fn.layer1.0"}, {"conv1", "layer1", "layer1.0"})
        '_fn'
        >>> wrapper_prefix({"conv1", "layer1.0"}, {"conv1", "layer1", "layer1.0"})
        ''
    """
    candidates: set[str] = set()
    for p in onnx_paths:
        parts = p.split(".")
        candidates.update(".".join(parts[:k]) for k in range(1, min(len(parts), 4)))
    best, best_hits = "", len(onnx_paths & model_paths)
    for prefix in sorted(candidates, key=len):  # shortest first: ties keep the shallower prefix
        cut = len(prefix) + 1
        hits = sum(1 for p in onnx_paths if p.startswith(prefix + ".") and p[cut:] in model_paths)
        if hits > best_hits:
            best, best_hits = prefix, hits
    return best


def _unprefixed(cp: Any, prefix: str) -> Any:
    """``cp`` with ``prefix.`` removed from its path and from module names in its note."""
    import dataclasses

    cut = len(prefix) + 1
    fields: dict[str, Any] = {"path": cp.path[cut:] if cp.path.startswith(prefix + ".") else cp.path}
    if cp.note:
        fields["note"] = re.sub(rf"(?<![\w.]){re.escape(prefix)}\.(?=\w)", "", cp.note)
    absorbed_by = getattr(cp, "absorbed_by", None)
    if absorbed_by and absorbed_by.startswith(prefix + "."):
        fields["absorbed_by"] = absorbed_by[cut:]
    return dataclasses.replace(cp, **fields)


def check_same_model(view: ScopeView, model: Any, onnx_path: str | os.PathLike) -> None:
    """Refuse a file whose module scopes name none of the model's modules.

    Without this, every module would be ``no counterpart`` and a file of
    another model would "compare clean" on its output alone.
    """
    onnx_paths = view.paths()
    if view.source == "none" or not onnx_paths:
        return
    model_paths = [p for p, _ in model.named_modules() if p]
    if not model_paths or onnx_paths & set(model_paths):
        return
    raise OnnxFileError(
        f"'{onnx_path}' does not look like an export of {type(model).__name__}: none of its {len(onnx_paths)} "
        f"module scopes ({_first_few(sorted(onnx_paths, key=lambda p: (p.count('.'), p)))}) is a module of "
        f"the model ({_first_few(model_paths)})"
    )


def _first_few(names: Sequence[str], n: int = 3) -> str:
    """``a, b, c, ...`` (the dots only when something was left out)."""
    return ", ".join(names[:n]) + (", ..." if len(names) > n else "")
