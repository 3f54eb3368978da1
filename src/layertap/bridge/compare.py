"""``lt.compare``: PyTorch vs ONNX Runtime, module by module.

The PyTorch model runs once with hooks on every module; each module call's
output is moved to numpy as soon as the call returns. The ONNX file's
counterpart of each call (from :class:`~layertap.onnxfile.scopes.ScopeMap`)
is exposed as an extra graph output of an in-memory copy of the graph (the
file is never written) and fetched from ONNX Runtime. Both sides are aligned
by ``(module path, call index)`` and compared in PyTorch execution order.

Error statistic: :mod:`layertap.bridge.tolerance` (per module call, over
every element compared: ``max|onnx - torch| <= atol + rtol * max|torch|``).

Alignment rules:

* Rows come in the order PyTorch module calls *return* (children before their
  parent), so the first failing row is the deepest, earliest module whose
  output differs: that is ``first_divergence``.
* A call aligns with the ONNX call of the same index. When the two sides
  count a different number of calls for a module, its calls are listed as
  ``no counterpart`` rather than guessed.
* A module whose output is a tuple/list/dict is flattened; its ONNX tensors
  pair with the PyTorch tensors by position when count and shapes agree,
  otherwise each ONNX tensor pairs with the first unused PyTorch tensor of the
  same shape. Shapes that only differ by size-1 dimensions are compared after
  reshaping.
* A module folded into another (a Conv whose BatchNorm the exporter fused
  into it) is ``absorbed``: it is never a failure. The fused ONNX value is
  compared where PyTorch computes the same value, the BatchNorm's output.
  When the file's scopes do not say so, a failing call whose ONNX value
  matches the output of one of the next sibling modules is recognised as such
  a fusion too.
* The model's own result is the last row, named ``output``.

Memory stays bounded: PyTorch values beyond ``memory_budget`` bytes spill to
a temporary folder, and ONNX Runtime runs in batches, each session exposing
only the tensors that fit the budget (ORT keeps every exposed output of a run
alive, fetched or not), so each batch's arrays are compared and dropped before
the next run.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterator, Sequence

import numpy as np

from ..errors import InputSpecError, LayertapError, OnnxFileError, unknown_name
from ..report import Column, Report, fmt_float, fmt_shape
from .tolerance import DEFAULT_ATOL, DEFAULT_RTOL, ErrorStats, error_stats

if TYPE_CHECKING:  # pragma: no cover
    import onnx
    import torch

DEFAULT_MEMORY_BUDGET = 1 << 30  # bytes of intermediates held at once, per side

PASS, FAIL, NO_COUNTERPART, ABSORBED = "pass", "FAIL", "no counterpart", "absorbed"
STATISTIC = "rel_err = max|onnx - torch| / max|torch|; pass when max_abs <= atol + rtol * max|torch|"
FUSION_NOTE = (
    "exposing intermediate tensors as ONNX Runtime outputs can stop ORT from fusing the nodes that "
    "produce them, so this run may differ slightly from a plain run of the file; compare with "
    "ort_optimizations=False (--no-ort-opt) to rule ORT's graph optimisations out"
)
# How many following sibling module calls a failing call is checked against
# before it is called a fusion (Conv -> BatchNorm -> ReLU is the longest
# chain exporters fold).
_FUSE_WINDOW = 2
_NO_SCOPE_NOTE = "no ONNX node in its scope (a no-op in eval mode, or folded into constants)"
_ORT_EXTERNAL_DIR_KEY = "session.model_external_initializers_file_folder_path"


# ---------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------
@dataclass
class CompareRow:
    """One PyTorch module call and how its ONNX counterpart compares.

    Attributes:
        name: ``PATH`` (``PATH#k`` when the module ran more than once);
            ``output`` for the model's own result.
        path, call: module path and 0-based call index.
        type: the module's class name.
        shape: shape of the (first) PyTorch tensor compared.
        max_abs: ``max |onnx - torch|``.
        rel_err: ``max_abs / max |torch|`` (see the module docstring).
        status: ``pass``, ``FAIL``, ``no counterpart`` or ``absorbed``.
        ok: True/False for compared calls, ``None`` when nothing was compared.
        onnx: ONNX tensor names compared.
        note: why a call was not compared, or where a fused value was compared.
    """

    name: str
    path: str
    call: int
    type: str
    shape: list[int] | None
    max_abs: float | None
    rel_err: float | None
    status: str
    ok: bool | None
    onnx: list[str] = field(default_factory=list)
    note: str | None = None


class CompareReport(Report):
    """Result of :func:`compare`: one row per module call, in PyTorch execution order.

    Attributes:
        ok: True when no compared call failed (absorbed / no-counterpart calls never fail).
        first_divergence: name of the first failing module call (``None`` when all agree).
        first_divergence_row: that row.
        rtol, atol: the tolerances used.

    Example:
        >>> r = CompareReport([CompareRow("fc", "fc", 0, "Linear", [1, 2], 1.0, 0.5, FAIL, False)], rtol=1e-3, atol=1e-5)
        >>> r.ok, r.first_divergence, r.to_dict()["first_divergence"]
        (False, 'fc', 'fc')
    """

    title = "PyTorch vs ONNX Runtime, module by module"
    columns: ClassVar[Sequence[Column]] = (
        Column("name", "module"),
        Column("type", "type"),
        Column("shape", "shape", fmt_shape, no_wrap=True),
        Column("max_abs", "max abs err", fmt_float, "right", no_wrap=True),
        Column("rel_err", "rel err", fmt_float, "right", no_wrap=True),
        Column("status", "status", no_wrap=True),
        Column("note", "note"),
    )

    def __init__(
        self,
        rows: Sequence[CompareRow] = (),
        notes: Sequence[str] = (),
        *,
        rtol: float = DEFAULT_RTOL,
        atol: float = DEFAULT_ATOL,
        onnx_path: str | None = None,
        ort_optimizations: bool = True,
        ort_runs: int = 0,
    ) -> None:
        super().__init__(rows, notes)
        self.rtol = rtol
        self.atol = atol
        self.onnx_path = onnx_path
        self.ort_optimizations = ort_optimizations
        self.ort_runs = ort_runs

    @property
    def first_divergence_row(self) -> CompareRow | None:
        """The first row that failed (every compared row before it passed)."""
        for row in self.rows:
            if row.ok is False:
                return row
        return None

    @property
    def first_divergence(self) -> str | None:
        """Name (``PATH`` or ``PATH#k``) of the first failing module call, or ``None``."""
        row = self.first_divergence_row
        return row.name if row is not None else None

    def plot(self, path: str | os.PathLike) -> None:
        """Write the error-per-module PNG (log scale, first divergence marked) atomically."""
        from ._plot import write_plot

        write_plot(self, path)

    def counts(self) -> dict[str, int]:
        """How many rows have each status."""
        out = {PASS: 0, FAIL: 0, ABSORBED: 0, NO_COUNTERPART: 0}
        for row in self.rows:
            out[row.status] = out.get(row.status, 0) + 1
        return out

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "ok": self.ok,
            "first_divergence": self.first_divergence,
            "onnx": self.onnx_path,
            "rtol": self.rtol,
            "atol": self.atol,
            "statistic": STATISTIC,
            "ort_optimizations": self.ort_optimizations,
            "ort_runs": self.ort_runs,
            "counts": self.counts(),
        }
        if self.notes:
            out["notes"] = list(self.notes)
        return out

    def footer(self) -> list[str]:
        c = self.counts()
        lines = [f"note: {n}" for n in self.notes]
        lines.append(
            f"{c[PASS]} pass, {c[FAIL]} FAIL, {c[ABSORBED]} absorbed, {c[NO_COUNTERPART]} without counterpart "
            f"(rtol {self.rtol:g}, atol {self.atol:g}; {STATISTIC})"
        )
        row = self.first_divergence_row
        if row is None:
            lines.append("no divergence: every compared module agrees")
        else:
            lines.append(
                f"first divergence: {row.name} ({row.type}): max abs err {fmt_float(row.max_abs)}, "
                f"rel err {fmt_float(row.rel_err)}; every module before it agrees"
            )
        return lines


def _merge(stats: Sequence[ErrorStats]) -> ErrorStats:
    """Worst case over several tensors of one module call."""
    return ErrorStats(
        max(s.max_abs for s in stats),
        max(s.scale for s in stats),
        max(s.rel_err for s in stats),
        all(s.ok for s in stats),
    )


def pair_tensors(torch_shapes: Sequence[tuple], onnx_shapes: Sequence[tuple]) -> list[tuple[int, int]]:
    """Pair ONNX tensors with PyTorch tensors of one module call.

    By position when the counts agree and every shape matches. Otherwise
    matching runs from the end: an ONNX call can leak extra boundary tensors
    *before* its real outputs (an inner value that a tap, or a shared
    subexpression, uses outside the module), while a module's results are the
    last values it computes. Each PyTorch tensor, last first, takes the last
    unused ONNX tensor of the same shape. Returns ``(torch_index, onnx_index)``
    pairs in ONNX order; unpaired tensors are left out.

    Example:
        >>> pair_tensors([(2, 4), (2, 4, 4)], [(2, 4, 4)])
        [(1, 0)]
        >>> pair_tensors([(2, 4), (2, 4)], [(2, 4), (2, 4)])
        [(0, 0), (1, 1)]
        >>> pair_tensors([(1, 5, 8)], [(1, 5, 8), (1, 5, 8)])  # an inner value leaked first
        [(0, 1)]
    """
    if len(torch_shapes) == len(onnx_shapes) and all(_same_shape(t, o) for t, o in zip(torch_shapes, onnx_shapes)):
        return [(i, i) for i in range(len(onnx_shapes))]
    used: set[int] = set()
    pairs: list[tuple[int, int]] = []
    for i in reversed(range(len(torch_shapes))):
        for j in reversed(range(len(onnx_shapes))):
            if j not in used and _same_shape(torch_shapes[i], onnx_shapes[j]):
                used.add(j)
                pairs.append((i, j))
                break
    return sorted(pairs, key=lambda p: p[1])


def _same_shape(a: tuple, b: tuple) -> bool:
    """Equal shapes, or equal after dropping size-1 dimensions (same element order)."""
    a, b = tuple(a), tuple(b)
    return a == b or tuple(d for d in a if d != 1) == tuple(d for d in b if d != 1)


# ---------------------------------------------------------------------------
# PyTorch side
# ---------------------------------------------------------------------------
class _ArrayStore:
    """Arrays by key; beyond ``budget`` bytes new ones spill to a temporary folder.

    Spilled arrays come back memory-mapped, so only the pages being compared
    are resident.
    """

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.held = 0
        self.spilled = 0
        self._mem: dict[int, list[np.ndarray]] = {}
        self._disk: dict[int, list[str]] = {}
        self._shapes: dict[int, list[tuple[int, ...]]] = {}
        self._nbytes: dict[int, int] = {}
        self._dir: str | None = None

    def put(self, key: int, arrays: list[np.ndarray], shared: bool = False) -> None:
        """Store ``arrays``; ``shared`` arrays already held elsewhere cost nothing."""
        nbytes = 0 if shared else sum(a.nbytes for a in arrays)
        self._shapes[key] = [tuple(a.shape) for a in arrays]
        self._nbytes[key] = sum(a.nbytes for a in arrays)
        if shared or self.held + nbytes <= self.budget:
            self._mem[key] = arrays
            self.held += nbytes
            return
        if self._dir is None:
            self._dir = tempfile.mkdtemp(prefix="layertap-compare-")
        paths = []
        for i, a in enumerate(arrays):
            p = os.path.join(self._dir, f"{key}_{i}.npy")
            np.save(p, a, allow_pickle=False)
            paths.append(p)
        self._disk[key] = paths
        self.spilled += nbytes

    def has(self, key: int) -> bool:
        return key in self._shapes

    def shapes(self, key: int) -> list[tuple[int, ...]]:
        return self._shapes.get(key, [])

    def nbytes(self, key: int) -> int:
        return self._nbytes.get(key, 0)

    def get(self, key: int) -> list[np.ndarray]:
        if key in self._mem:
            return self._mem[key]
        if key in self._disk:
            return [np.load(p, mmap_mode="r", allow_pickle=False) for p in self._disk[key]]
        return []

    def close(self) -> None:
        self._mem.clear()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


@dataclass
class _ModCall:
    """One module call as PyTorch ran it; ``key`` is its position in return order."""

    key: int
    path: str
    call: int
    type: str
    note: str | None = None  # why it holds no tensor


def _to_numpy(t: "torch.Tensor") -> np.ndarray:
    import torch

    t = t.detach()
    if t.dtype in (torch.bfloat16,) or (t.is_floating_point() and t.element_size() < 2):
        t = t.float()  # numpy has no bfloat16 / float8
    if t.is_complex() or t.layout != torch.strided:
        t = t.to_dense() if t.layout != torch.strided else t
    # copy: in-place modules (ReLU(inplace=True)) overwrite the tensor later
    return t.to("cpu", copy=True).numpy()


class _TorchRecorder:
    """Forward hooks that record every module call, in return order, into a store.

    A module's output is copied to numpy the moment the call returns (a later
    in-place op cannot change it). A container (``Sequential``, a residual
    block's last child) often returns its last child's tensor object
    unchanged; that value is stored once and shared, not copied twice.

    Example:
        >>> import torch
        >>> m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()).eval()
        >>> store = _ArrayStore(1 << 20)
        >>> rec = _TorchRecorder(m, store, lambda path: True)
        >>> with rec.hooks(), torch.no_grad():
        ...     _ = m(torch.ones(1, 2))
        >>> [(c.path, c.call) for c in rec.calls]
        [('0', 0), ('1', 0)]
    """

    def __init__(self, model: Any, store: _ArrayStore, wanted: Callable[[str], bool]) -> None:
        self.model = model
        self.store = store
        self.wanted = wanted
        self.calls: list[_ModCall] = []
        self._names = {id(m): p for p, m in model.named_modules() if p}
        self._counts: dict[int, int] = {}
        self._open: dict[int, list[int]] = {}  # call indices of calls not yet returned (recursion)
        self._last: tuple[list[Any], list[np.ndarray], list[int]] = ([], [], [])  # tensors, arrays, versions

    @contextmanager
    def hooks(self) -> Iterator[None]:
        """Hooks on every submodule, removed on exit (exceptions too)."""
        handles = []
        try:
            for path, mod in self.model.named_modules():
                if path:
                    handles.append(mod.register_forward_pre_hook(self._pre))
                    handles.append(mod.register_forward_hook(self._post))
            yield
        finally:
            for h in handles:
                h.remove()
            self._last = ([], [], [])

    def _pre(self, mod: Any, _args: Any) -> None:
        k = id(mod)
        c = self._counts.get(k, 0)
        self._counts[k] = c + 1
        self._open.setdefault(k, []).append(c)

    def _post(self, mod: Any, _args: Any, output: Any) -> None:
        k = id(mod)
        c = (self._open.get(k) or [self._counts[k] - 1]).pop()
        mc = _ModCall(len(self.calls), self._names[k], c, type(mod).__name__)
        self.calls.append(mc)
        if self.wanted(mc.path):
            self._record(mc, output)

    def _record(self, mc: _ModCall, output: Any) -> None:
        from ..pytorch.values import flatten

        tensors = [t for _, t in flatten(output)]
        if not tensors:
            mc.note = "PyTorch output holds no tensor"
            return
        prev, prev_arrays, versions = self._last
        if (
            len(prev) == len(tensors)
            and all(a is b for a, b in zip(prev, tensors))
            and all(t._version == v for t, v in zip(tensors, versions))
        ):
            self.store.put(mc.key, prev_arrays, shared=True)
            return
        arrays = [_to_numpy(t) for t in tensors]
        self.store.put(mc.key, arrays)
        self._last = (tensors, arrays, [t._version for t in tensors])


def _run_torch(
    model: Any,
    args: tuple,
    kwargs: dict,
    method: str,
    store: _ArrayStore,
    wanted: Callable[[str], bool],
) -> tuple[list[_ModCall], _ModCall]:
    """Run the model once; record every module call in return order.

    Returns the calls and the root call (the model's result, stored last).
    """
    import torch

    from ..pytorch.taps import bound_method
    from ..pytorch.values import flatten

    fn = bound_method(model, method)
    recorder = _TorchRecorder(model, store, wanted)
    with recorder.hooks(), torch.no_grad():
        try:
            out = fn(*args, **kwargs)
        except (TypeError, ValueError, RuntimeError, IndexError) as e:
            # Almost always inputs that do not fit the model; the chain keeps the traceback.
            raise InputSpecError(
                f"{type(model).__name__}.{method} failed on the given inputs: {type(e).__name__}: {_one_line(e)}"
            ) from e
    root = _ModCall(len(recorder.calls), "", 0, type(model).__name__)
    tensors = [t for _, t in flatten(out)]
    if not tensors:
        raise LayertapError(f"{type(model).__name__}.{method} returned no tensor; there is nothing to compare")
    store.put(root.key, [_to_numpy(t) for t in tensors])
    return recorder.calls, root


# ---------------------------------------------------------------------------
# ONNX side
# ---------------------------------------------------------------------------
def _load_proto(onnx_path: str | os.PathLike) -> "onnx.ModelProto":
    import onnx

    p = Path(onnx_path)
    if not p.is_file():
        raise OnnxFileError(f"ONNX file '{p}' does not exist")
    try:
        # Graph only: weights stay in the external-data file, which ORT reads
        # itself (FIELD-NOTES: loading them through onnx costs GBs on big models).
        return onnx.load(str(p), load_external_data=False)
    except Exception as e:  # noqa: BLE001 - protobuf raises several types
        raise OnnxFileError(f"cannot read ONNX file '{p}': {e}") from None


class _OrtRunner:
    """Sessions over an in-memory copy of the graph with chosen tensors as outputs."""

    def __init__(self, proto: "onnx.ModelProto", folder: Path, optimize: bool) -> None:
        self.proto = proto
        self.folder = folder
        self.optimize = optimize
        self._out_info = {o.name: o for o in proto.graph.output}
        self._value_info = {v.name: v for v in proto.graph.value_info}
        self.runs = 0

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

    def input_shapes(self) -> dict[str, tuple[int | None, ...]]:
        """Declared shape of each graph input; ``None`` for a symbolic or unknown dimension."""
        out = {}
        for i in self.proto.graph.input:
            if i.type.tensor_type.HasField("shape"):
                dims = i.type.tensor_type.shape.dim
                out[i.name] = tuple(d.dim_value if d.HasField("dim_value") else None for d in dims)
        return out

    def run(self, names: list[str], feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import onnx
        import onnxruntime as ort

        graph = self.proto.graph
        saved = list(graph.output)
        try:
            del graph.output[:]
            for n in names:
                info = self._out_info.get(n) or self._value_info.get(n)
                graph.output.append(info if info is not None else onnx.helper.make_empty_tensor_value_info(n))
            data = self.proto.SerializeToString()
        finally:
            del graph.output[:]
            graph.output.extend(saved)
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.graph_optimization_level = (
            ort.GraphOptimizationLevel.ORT_ENABLE_ALL if self.optimize else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        )
        so.add_session_config_entry(_ORT_EXTERNAL_DIR_KEY, str(self.folder))
        try:
            sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001 - ORT raises its own types
            raise OnnxFileError(f"ONNX Runtime cannot load the graph from '{self.folder}' with extra outputs: {_one_line(e)}") from None
        del data
        try:
            values = sess.run(names, feed)
        except Exception as e:  # noqa: BLE001
            raise InputSpecError(f"ONNX Runtime rejected the inputs: {_one_line(e)}") from None
        self.runs += 1
        return dict(zip(names, values))


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:400]


def _feed(inputs: list[tuple[str, str]], args: tuple, kwargs: dict) -> dict[str, np.ndarray]:
    """Map the PyTorch arguments onto the graph inputs.

    A keyword argument goes to the input of the same name; the remaining
    inputs take the positional tensors in order, then the other keyword
    tensors (nested tuples/lists flattened, as the exporters do). Non-tensor
    arguments (``None``, Python numbers) are baked into an exported graph and
    skipped.
    """
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
        a = _to_numpy(t) if isinstance(t, torch.Tensor) else np.asarray(t)
        want = dtypes.get(n)
        if want and a.dtype != np.dtype(want):
            a = a.astype(want)  # e.g. int32 token ids for an int64 input
        out[n] = a
    return out


def _check_feed_shapes(feed: dict[str, np.ndarray], declared: dict[str, tuple[int | None, ...]]) -> None:
    """A clear one-line error before any run when an input cannot fit the file.

    Example:
        >>> _check_feed_shapes({"x": np.zeros((2, 3))}, {"x": (1, 3)})
        Traceback (most recent call last):
        ...
        layertap.errors.InputSpecError: input 'x' has shape 2x3 but the ONNX file expects 1x3 (exported with a fixed shape; pass --input 1x3 or re-export with a dynamic batch)
    """
    for name, a in feed.items():
        want = declared.get(name)
        if want is None:
            continue
        fits = len(want) == a.ndim and all(w is None or w == d for w, d in zip(want, a.shape))
        if not fits:
            spelled = "x".join("?" if w is None else str(w) for w in want) or "a scalar"
            same_rank = len(want) == a.ndim
            # a symbolic size takes the user's own size; only a batch mismatch is fixed by a dynamic batch
            fitting = "x".join(str(a.shape[i] if w is None and same_rank else (1 if w is None else w)) for i, w in enumerate(want))
            batch_only = same_rank and a.ndim > 0 and all(w is None or w == d for w, d in zip(want[1:], a.shape[1:]))
            raise InputSpecError(
                f"input '{name}' has shape {'x'.join(map(str, a.shape)) or 'a scalar'} but the ONNX file expects "
                f"{spelled} (exported with a fixed shape; pass --input {fitting or 'a scalar'}"
                + (" or re-export with a dynamic batch)" if batch_only else ")")
            )


def _model_outputs(proto: "onnx.ModelProto") -> list[str]:
    """The graph outputs that are the model's own result.

    A file from ``lt.export`` also has tap outputs; its ``layertap.taps``
    metadata marks the model's own outputs with ``"path": null``.
    """
    import json

    names = [o.name for o in proto.graph.output]
    for prop in proto.metadata_props:
        if prop.key == "layertap.taps":
            try:
                entries = json.loads(prop.value)
                own = [e["name"] for e in entries if isinstance(e, dict) and e.get("path") is None]
            except (ValueError, TypeError, KeyError):
                return names
            own = [n for n in own if n in names]
            return own or names
    return names


class _ScopeView:
    """The file's module calls under the model's own module paths.

    A file exported from a wrapper around the model names every module under
    the wrapper's attribute: ``lt.export`` files read ``_fn.layer1.0.conv1``
    (dynamo) or ``model.layer1.0.conv1`` (TorchScript). The view strips such
    a prefix so that calls align with ``model.named_modules()``; the wrapper's
    own call (the bare prefix) is the model's result, compared as ``output``.
    It offers the two :class:`~layertap.onnxfile.scopes.ScopeMap` queries the
    plan needs, ``counterparts()`` and ``calls(path)``.
    """

    def __init__(self, smap: Any, model_paths: set[str]) -> None:
        self.source: str = smap.source
        counterparts = smap.counterparts()
        self.prefix = _wrapper_prefix({c.path for c in counterparts}, model_paths)
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


def _wrapper_prefix(onnx_paths: set[str], model_paths: set[str]) -> str:
    """The module path prefix the file adds to the model's paths ("" for none).

    A prefix (one or more leading components, for nested wrappers) is chosen
    only when stripping it makes more of the file's paths known to the model
    than as they are.

    Example:
        >>> _wrapper_prefix({"_fn", "_fn.conv1", "_fn.layer1.0"}, {"conv1", "layer1", "layer1.0"})
        '_fn'
        >>> _wrapper_prefix({"conv1", "layer1.0"}, {"conv1", "layer1", "layer1.0"})
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


def _check_same_model(view: _ScopeView, model: Any, onnx_path: str | os.PathLike) -> None:
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


# ---------------------------------------------------------------------------
# alignment and rows
# ---------------------------------------------------------------------------
@dataclass
class _Item:
    """A module call and the ONNX tensors that answer it (empty when none)."""

    mc: _ModCall
    tensors: tuple[str, ...] = ()
    status: str | None = None  # preset for calls that will not be compared
    note: str | None = None


def _is_absorption(note: str) -> bool:
    low = note.lower()
    return any(w in low for w in ("fold", "fus", "absorb", "merge"))


def _call_counts(calls: Sequence[_ModCall]) -> dict[str, int]:
    """How many times PyTorch ran each module path."""
    counts: dict[str, int] = {}
    for mc in calls:
        counts[mc.path] = max(counts.get(mc.path, 0), mc.call + 1)
    return counts


def _plan(calls: list[_ModCall], root: _ModCall, smap: Any, outputs: list[str], include_root: bool) -> list[_Item]:
    """Pair each PyTorch module call with its ONNX tensors, or say why it has none.

    ``smap`` answers ``counterparts()`` and ``calls(path)`` (a :class:`_ScopeView`).
    """
    counterparts = {(c.path, c.call): c for c in smap.counterparts()}
    torch_calls = _call_counts(calls)
    items: list[_Item] = []
    for mc in calls:
        item = _Item(mc)
        cp = counterparts.get((mc.path, mc.call))
        onnx_calls = smap.calls(mc.path)
        if cp is None and onnx_calls == 0:
            item.status, item.note = NO_COUNTERPART, _NO_SCOPE_NOTE
        elif onnx_calls != torch_calls[mc.path]:
            item.status = NO_COUNTERPART
            item.note = (
                f"PyTorch ran it {torch_calls[mc.path]} time(s), the ONNX graph shows {onnx_calls} call(s); "
                "calls cannot be aligned"
            )
        elif cp is None:
            item.status = NO_COUNTERPART
        elif not cp.tensors:
            item.status = ABSORBED if cp.absorbed_by or (cp.note and _is_absorption(cp.note)) else NO_COUNTERPART
            item.note = f"fused into {cp.absorbed_by}; compared there" if cp.absorbed_by else cp.note
        else:
            item.tensors = tuple(cp.tensors)
        if mc.note and not item.status:
            item.status, item.note, item.tensors = NO_COUNTERPART, mc.note, ()
        items.append(item)
    if include_root:
        items.append(_Item(root, tuple(outputs)))
    return items


def _batches(items: list[_Item], store: _ArrayStore, max_tensors: int | None, budget: int) -> list[list[_Item]]:
    """Split the plan into contiguous batches, each one ORT run.

    A batch holds at most ``max_tensors`` ONNX tensors and (estimated from the
    PyTorch sizes) ``budget`` bytes; a single call over the budget gets a run
    of its own.
    """
    out: list[list[_Item]] = [[]]
    n_tensors = n_bytes = 0
    for item in items:
        k = len(item.tensors)
        b = store.nbytes(item.mc.key) if k else 0
        over = (max_tensors is not None and n_tensors + k > max_tensors) or n_bytes + b > budget
        if k and n_tensors and over:
            out.append([])
            n_tensors = n_bytes = 0
        out[-1].append(item)
        n_tensors += k
        n_bytes += b
    return [b for b in out if b]


class _RowBuilder:
    """Turns aligned values into rows; detects folds the scopes did not report."""

    def __init__(self, items: list[_Item], store: _ArrayStore, rtol: float, atol: float, torch_calls: dict[str, int]) -> None:
        self.items = items
        self.store = store
        self.rtol = rtol
        self.atol = atol
        self.torch_calls = torch_calls
        self.adopted: dict[int, tuple[ErrorStats, list[str], str]] = {}
        self.position = {item.mc.key: i for i, item in enumerate(items)}

    def name(self, mc: _ModCall) -> str:
        if mc.path == "":
            return "output"
        return f"{mc.path}#{mc.call}" if self.torch_calls.get(mc.path, 1) > 1 else mc.path

    def row(self, item: _Item, values: dict[str, np.ndarray]) -> CompareRow:
        mc = item.mc
        shapes = self.store.shapes(mc.key)
        base = dict(name=self.name(mc), path=mc.path, call=mc.call, type=mc.type, shape=list(shapes[0]) if shapes else None)
        if item.status is not None:
            adopted = self.adopted.get(mc.key)
            if adopted is not None and item.status == NO_COUNTERPART:
                stats, names, donor = adopted
                return CompareRow(**base, max_abs=stats.max_abs, rel_err=stats.rel_err, status=PASS if stats.ok else FAIL,
                                  ok=stats.ok, onnx=names, note=f"compared at {donor}'s ONNX tensor (fused)")
            return CompareRow(**base, max_abs=None, rel_err=None, status=item.status, ok=None, note=item.note)
        onnx_arrays = [values[n] for n in item.tensors]
        ref = self.store.get(mc.key)
        stats, names, why = self._compare(ref, onnx_arrays, item.tensors)
        if stats is None:
            # Same inputs, other output shapes: the file does not compute the model's result.
            # For an inner module the scope mapping may be at fault, so that is only "no counterpart".
            status, ok = (FAIL, False) if mc.path == "" else (NO_COUNTERPART, None)
            return CompareRow(**base, max_abs=None, rel_err=None, status=status, ok=ok, onnx=list(item.tensors), note=why)
        if not stats.ok:
            fused = self._fused_into(item, onnx_arrays)
            if fused is not None:
                donee, fstats, fnames = fused
                self.adopted[donee.mc.key] = (fstats, fnames, base["name"])
                return CompareRow(**base, max_abs=stats.max_abs, rel_err=stats.rel_err, status=ABSORBED, ok=None,
                                  onnx=names, note=f"ONNX tensor holds {self.name(donee.mc)}'s value (fused)")
        return CompareRow(**base, max_abs=stats.max_abs, rel_err=stats.rel_err, status=PASS if stats.ok else FAIL,
                          ok=stats.ok, onnx=names, note=why)

    def _compare(
        self, ref: list[np.ndarray], got: list[np.ndarray], names: Sequence[str]
    ) -> tuple[ErrorStats | None, list[str], str | None]:
        pairs = pair_tensors([tuple(r.shape) for r in ref], [tuple(g.shape) for g in got])
        if not pairs:
            return None, [], (
                f"shapes differ: ONNX {', '.join(fmt_shape(g.shape) for g in got)} vs "
                f"PyTorch {', '.join(fmt_shape(r.shape) for r in ref) or 'nothing'}"
            )
        stats = []
        for i, j in pairs:
            r, g = ref[i], got[j]
            if r.shape != g.shape:
                g = g.reshape(r.shape)
            stats.append(error_stats(r, g, self.rtol, self.atol))
        why = None
        if len(pairs) < len(got):
            why = f"compared {len(pairs)} of {len(got)} ONNX tensors (others have no PyTorch tensor of that shape)"
        return _merge(stats), [names[j] for _, j in pairs], why

    def _fused_into(self, item: _Item, onnx_arrays: list[np.ndarray]) -> tuple[_Item, ErrorStats, list[str]] | None:
        """A later sibling call whose PyTorch value the ONNX tensor holds."""
        mc = item.mc
        if mc.path == "":
            return None
        parent = mc.path.rpartition(".")[0]
        seen = 0
        for later in self.items[self.position[mc.key] + 1:]:
            lp = later.mc.path
            if lp == "" or (parent and not lp.startswith(parent + ".")):
                break  # left the parent: no sibling follows
            if lp.rpartition(".")[0] != parent:
                continue  # a deeper call inside a sibling
            seen += 1
            if seen > _FUSE_WINDOW:
                break
            ref = self.store.get(later.mc.key)
            if not ref:
                continue
            stats, names, _ = self._compare(ref, onnx_arrays, item.tensors)
            if stats is not None and stats.ok:
                return later, stats, names
        return None


# ---------------------------------------------------------------------------
# progress
# ---------------------------------------------------------------------------
class _Progress:
    """Transient progress lines on stderr; silent unless enabled."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._progress = None
        self._task = None

    def __enter__(self) -> "_Progress":
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                console=Console(stderr=True), transient=True,
            )
            self._progress.start()
        return self

    def step(self, description: str, total: int = 1) -> None:
        if self._progress is not None:
            if self._task is not None:
                self._progress.remove_task(self._task)
            self._task = self._progress.add_task(description, total=total)

    def advance(self, n: int = 1) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task, n)

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()


# ---------------------------------------------------------------------------
# public entry
# ---------------------------------------------------------------------------
def _module_filter(model: Any, modules: Sequence[str] | str | None) -> tuple[Callable[[str], bool], bool]:
    """``modules`` entries select a module and everything under it."""
    if modules is None:
        return (lambda p: True), True
    if isinstance(modules, str):
        modules = [modules]
    known = [p for p, _ in model.named_modules()]
    known_set = set(known)
    prefixes: list[str] = []
    for m in modules:
        if m not in known_set:
            raise LayertapError(unknown_name("module", m, [k for k in known if k], hint="run 'layertap layers MODEL' to list them"))
        prefixes.append(m)
    include_root = "" in prefixes

    def wanted(path: str) -> bool:
        return include_root or any(path == p or path.startswith(p + ".") for p in prefixes)

    return wanted, include_root


def compare(
    model: Any,
    args: Any,
    onnx_path: str | os.PathLike,
    *,
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
    modules: Sequence[str] | None = None,
    kwargs: dict | None = None,
    method: str = "forward",
    ort_optimizations: bool = True,
    batch_outputs: int | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    progress: bool = False,
) -> CompareReport:
    """Compare a PyTorch model with its ONNX file module by module in ONNX Runtime.

    Args:
        model: the ``nn.Module`` the file was exported from (eval mode).
        args: the positional arguments (a tensor or a tuple of them).
        onnx_path: the ONNX file; read only, never modified.
        rtol, atol: a call passes when ``max|onnx - torch| <= atol + rtol * max|torch|``.
        modules: compare only these modules and their submodules (default: all,
            plus the model's output).
        kwargs: keyword arguments for the method.
        method: the method the file was exported from (``forward`` by default).
        ort_optimizations: run ORT with its graph optimisations (default) or
            with ``ORT_DISABLE_ALL``; exposing intermediates can change which
            fusions ORT applies, so a divergence that disappears without them
            is ORT's, not the exporter's.
        batch_outputs: at most this many ONNX tensors per ORT run (default: as
            many as fit ``memory_budget``).
        memory_budget: bytes of intermediates held at once on each side.
        progress: show progress on stderr.

    Returns:
        A :class:`CompareReport`: ``.ok``, ``.rows`` (one per module call, in
        PyTorch execution order), ``.first_divergence`` (name or ``None``).

    Example:
        >>> import torch, torchvision, layertap as lt
        >>> model = torchvision.models.resnet18().eval()
        >>> x = torch.randn(1, 3, 64, 64)
        >>> torch.onnx.export(model, (x,), "r18.onnx", dynamo=True)          # doctest: +SKIP
        >>> report = lt.compare(model, x, "r18.onnx")                        # doctest: +SKIP
        >>> report.ok, report.first_divergence                               # doctest: +SKIP
        (True, None)
    """
    from ..onnxfile.scopes import ScopeMap
    from ..pytorch.taps import bound_method

    _check_options(rtol, atol, batch_outputs, memory_budget)
    bound_method(model, method)  # a non-module or an unknown method fails before any work
    args = tuple(args) if isinstance(args, (tuple, list)) else (args,)
    kwargs = dict(kwargs or {})
    proto = _load_proto(onnx_path)
    view = _ScopeView(ScopeMap.from_model(proto), {p for p, _ in model.named_modules() if p})
    _check_same_model(view, model, onnx_path)
    wanted, include_root = _module_filter(model, modules)
    runner = _OrtRunner(proto, Path(onnx_path).resolve().parent, ort_optimizations)
    # Inputs first: a wrong number or shape of arguments should not cost a forward.
    feed = _feed(runner.input_names(), args, kwargs)
    _check_feed_shapes(feed, runner.input_shapes())

    store = _ArrayStore(memory_budget)
    try:
        with _Progress(progress) as prog:
            prog.step("PyTorch forward")
            calls, root = _run_torch(model, args, kwargs, method, store, wanted)
            prog.advance()
            items = [it for it in _plan(calls, root, view, _model_outputs(proto), include_root) if wanted(it.mc.path) or it.mc is root]
            builder = _RowBuilder(items, store, float(rtol), float(atol), _call_counts(calls))
            batches = _batches(items, store, batch_outputs, memory_budget)
            prog.step("ONNX Runtime and compare", total=len(items))
            rows = _compare_batches(batches, builder, runner, feed, prog)
    finally:
        store.close()
    return CompareReport(
        rows,
        _notes(model, view, runner, store),
        rtol=float(rtol),
        atol=float(atol),
        onnx_path=str(onnx_path),
        ort_optimizations=ort_optimizations,
        ort_runs=runner.runs,
    )


def _check_options(rtol: Any, atol: Any, batch_outputs: Any, memory_budget: Any) -> None:
    """User errors in the numeric options, as one-line messages."""
    if not (isinstance(rtol, (int, float)) and rtol >= 0 and isinstance(atol, (int, float)) and atol >= 0):
        raise LayertapError(f"tolerances must be numbers >= 0, got rtol={rtol!r}, atol={atol!r}")
    if batch_outputs is not None and (not isinstance(batch_outputs, int) or batch_outputs < 1):
        raise LayertapError(f"batch_outputs must be a positive integer, got {batch_outputs!r}")
    if not isinstance(memory_budget, int) or memory_budget < 1:
        raise LayertapError(f"memory_budget must be a positive number of bytes, got {memory_budget!r}")


def _compare_batches(
    batches: list[list[_Item]], builder: _RowBuilder, runner: _OrtRunner, feed: dict[str, np.ndarray], prog: _Progress
) -> list[CompareRow]:
    """One ORT run per batch; each batch's arrays are compared and dropped before the next run."""
    rows: list[CompareRow] = []
    for batch in batches:
        names = list(dict.fromkeys(n for it in batch for n in it.tensors))
        values = runner.run(names, feed) if names else {}
        for it in batch:
            rows.append(builder.row(it, values))
            prog.advance()
        del values
    return rows


def _notes(model: Any, view: _ScopeView, runner: _OrtRunner, store: _ArrayStore) -> list[str]:
    """What the reader needs to know to trust (or doubt) the rows."""
    if runner.optimize:
        notes = [FUSION_NOTE]
    else:
        notes = ["ONNX Runtime ran with graph optimisations disabled (ORT_DISABLE_ALL)"]
    if getattr(model, "training", False):
        notes.append("the model is in training mode (dropout, batch statistics): call model.eval() before comparing")
    if view.source == "none":
        notes.append(
            "the ONNX file carries no module scopes (not from torch.onnx.export), so only the model output is compared"
        )
    if view.prefix:
        notes.append(f"the file's module scopes carry the prefix '{view.prefix}.' (exported through a wrapper); stripped")
    if runner.runs > 1:
        notes.append(f"ONNX Runtime ran {runner.runs} times, exposing the intermediates in batches to bound memory")
    if store.spilled:
        notes.append(f"{store.spilled / 2**20:.0f} MiB of PyTorch values were held on disk (memory_budget)")
    return notes
