"""``lt.compare``'s ONNX side: a file in its runtime (:class:`~layertap.runtimes.runner.ModelRunner`:
its own copy of the graph, chosen tensors exposed as outputs), the PyTorch arguments mapped onto
its inputs, and its module scopes viewed under the model's own module paths.

Used by :mod:`layertap.comparing`.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ..errors import InputSpecError, LayertapError, OnnxFileError
from ..onnxfile.kvcache import complete_feeds
from ..runtimes.runner import ModelRunner
from .local_errors import LocalGraph
from .nchwc import blocked_tensors
from .rows import ABSORBED
from .torch_side import to_numpy

if TYPE_CHECKING:  # pragma: no cover
    import onnx

    from ..onnxfile.kvcache import KvLayout
    from ..onnxfile.modelfile import ModelFile
    from ..runtimes import Runtime, RuntimeInfo


class OrtSide:
    """An ONNX file run by a runtime (ONNX Runtime, OpenVINO): a compare side (the candidate, or an
    ONNX reference's runs). The caller's file (a path, or a ``ModelFile`` it read) is left as it
    was: the side runs its own copy of the graph (:class:`~layertap.runtimes.runner.ModelRunner`)."""

    def __init__(self, source: "str | os.PathLike | ModelFile", runtime: "Runtime") -> None:
        # The shared loader: graph only (weights held once, in memory, for every engine) and the
        # external-data safety checks every ONNX command applies; a file the caller already read is
        # not read again. An OpenVINO IR: its tensors by name (no module scopes, no ONNX nodes), run from the file.
        self.runner = ModelRunner.reading(source, runtime)
        self.path = Path(self.runner.path)
        if self.runner.file is not None:
            self.blocked: set[str] = set()
            self.carried: frozenset[str] = frozenset()  # an IR's If bodies stay OpenVINO's
            return
        # a fused decoder's module calls read values its ops hide: made tensors of the side's graph first
        self.runner.expose_fused_values_in_place()
        self.blocked = blocked_tensors(self.runner.proto.graph)
        #: tensors of If branches carried out to the main graph (empty when their branch did not run)
        self.carried = frozenset(self.runner.carry_branches_in_place(IF_BRANCHES))

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
        """Build the engine that exposes ``names`` ahead of :meth:`run` (see :meth:`ModelRunner.prepare`)."""
        self.runner.prepare(names)

    def run(self, names: list[str], feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One run exposing ``names`` (see :meth:`ModelRunner.run`)."""
        return self.runner.run(names, feed)

    def local_graph(self, scopes: Any = None) -> Any:
        """The file's part graphs for local errors (:class:`~layertap.comparing.local_errors.LocalGraph`;
        ``scopes``: the file's ScopeMap when the reference already read it)."""
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


IF_BRANCHES = ("If",)  # the subgraphs a compare reads and carries out (ModelRunner.carry_branches_in_place)


def absorb_unexposable(items: Sequence[Any], side: OrtSide, *, reference: bool = False) -> None:
    """Rows whose tensors the side's runtime cannot hand out (OpenVINO folded a Cast, a
    quantize/dequantize pair or a fused node away) become ``absorbed``, never a failure: the
    next compared module holds their effect. ``reference``: check the rows' reference tensors.
    """
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
    (``declared`` as :meth:`ModelRunner.input_shapes` gives it).

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
