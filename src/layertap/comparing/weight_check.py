"""Same model, or refuse: the reference's parameters against the candidate file's, before the candidate runs.

Parameters found on both sides by name (a PyTorch state dict against the file's initializers, or
the initializers of two files) are compared through each side's number format
(:mod:`layertap.onnxfile.weights`): a parameter *differs* when some element moved further than
the two formats' rounding explains. Then:

* more than half of the matched parameters differ: another checkpoint, another seed, another
  architecture. :func:`WeightCheck.enforce` raises one line naming the first, unless the caller
  allows it (the report then says it compared anyway);
* fewer differ: a converter or a hand edit changed them. Each is named on the row of the module
  that owns it (``CompareRow.weights``) and the comparison runs.

A name the other side lacks, a shape that is another layout of the same values, and a Conv
weight the exporter scaled by a folded BatchNorm whose module is not known are skipped, never
guessed: with no parameter matched, nothing is said. Never imports torch unless the reference
is a PyTorch model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from ..errors import LayertapError
from ..numformats import FLOAT_LIMITS, capped
from ..onnxfile.weights import Allowance, file_params, format_allowance
from ..runtimes.ort_kernels import as_float32
from ..text import fmt_float, fmt_shape
from .background import Background

if TYPE_CHECKING:  # pragma: no cover
    from ..onnxfile.weights import FileParam, Reading
    from ..runtimes.source import SessionSource
    from .rows import CompareRow

#: a reference value recomputed here (a folded BatchNorm's scale) may land an ulp or two away
_RECOMPUTED = 1e-5
_SKIP = "skip"
_SAME = "same"
#: mismatches spelled out in a note
_NAMED = 5


class DifferentWeightsError(LayertapError):
    """The candidate holds another model's weights (exit 2)."""


@dataclass(frozen=True)
class Mismatch:
    """A parameter whose values differ beyond what the formats explain.

    Attributes:
        name: the parameter's name (the reference's).
        module: the module that owns it (the name without its last part).
        rel: ``max|cand - ref| / max|ref|`` (``inf`` when the shapes differ).
        shapes: ``(reference shape, candidate shape)`` when they differ, else ``None``.
    """

    name: str
    module: str
    rel: float
    shapes: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    #: ``rel`` is a lower bound (a program's record keeps a digest and the largest magnitude, not the values)
    at_least: bool = False

    def words(self, ref: str = "model", cand: str = "file") -> str:
        """``fc.weight differs (rel 1.38)``.

        Example:
            >>> Mismatch("fc.weight", "fc", 0.25, at_least=True).words(), Mismatch("fc.bias", "fc", 0.0, at_least=True).words()
            ('fc.weight differs (rel >= 0.25)', 'fc.bias differs (other values, the same largest magnitude)')
        """
        if self.shapes is not None:
            return (f"{self.name} differs (shape {fmt_shape(list(self.shapes[1]))} in the {cand}, "
                    f"{fmt_shape(list(self.shapes[0]))} in the {ref})")
        return f"{self.name} differs ({self.how()})"

    def how(self) -> str:
        """How it differs, in a few words: ``rel 1.38``, ``shape``, ``rel >= 0.25`` (a lower bound)."""
        if self.shapes is not None:
            return "shape"
        if self.at_least:
            return f"rel >= {fmt_float(self.rel)}" if self.rel > 0 else "other values, the same largest magnitude"
        return f"rel {fmt_float(self.rel)}"


@dataclass(frozen=True)
class Capped:
    """A parameter some of whose values the float16 converter held at its cap (``max_finite_val``).

    Attributes:
        name, module: the parameter and the module that owns it.
        top: its largest magnitude in the reference.
        cap: the converter's cap.
    """

    name: str
    module: str
    top: float
    cap: float

    def words(self) -> str:
        """``conv2_BN.running_var capped at 1e+04 by the converter (up to 1.22e+04)``."""
        return f"{self.name} capped at {self.cap:g} by the float16 converter (up to {self.top:.3g})"


@dataclass
class WeightCheck:
    """What the parameters matched by name say: how many matched, which differ.

    Attributes:
        matched: parameters found on both sides and compared.
        differing: those that differ, in the reference's order.
        ref, cand: how messages name the two sides (``model`` / ``file``, ``reference`` / ``candidate``).
        compared_anyway: most differ and the caller allowed it.
        capped: parameters the float16 converter capped (values float16 carries, held at its cap): part of
            the format, named in a note and on their modules' rows, never a difference.
    """

    matched: int = 0
    differing: list[Mismatch] = field(default_factory=list)
    ref: str = "model"
    cand: str = "file"
    compared_anyway: bool = False
    capped: list[Capped] = field(default_factory=list)

    @property
    def most_differ(self) -> bool:
        """More than half of the matched parameters differ: not the same weights."""
        return self.matched > 0 and 2 * len(self.differing) > self.matched

    def verdict(self) -> str:
        """``the file's weights are not the model's: X differs (rel 1.38), and 61 of 62 matched parameters differ``."""
        first = self.differing[0].words(self.ref, self.cand) if self.differing else ""
        shaped = [m for m in self.differing if m.shapes is not None]
        other = ""  # another architecture: say so, naming one parameter of another shape
        if shaped and shaped[0] is not self.differing[0]:
            ref_shape, cand_shape = (fmt_shape(list(s)) for s in shaped[0].shapes or ((), ()))
            other = (f", {len(shaped)} of them in shape ({shaped[0].name}: {cand_shape} in the {self.cand}, "
                     f"{ref_shape} in the {self.ref})")
        elif shaped:
            other = f", {len(shaped)} of them in shape"
        return (f"the {self.cand}'s weights are not the {self.ref}'s: {first}, and {len(self.differing)} of "
                f"{self.matched} matched parameters differ{other}")

    def enforce(self, allow: bool) -> WeightCheck:
        """Raise :class:`DifferentWeightsError` when most differ and ``allow`` is false; returns ``self``."""
        if self.most_differ:
            if not allow:
                what = "export this checkpoint again" if self.ref == "model" else "make both files from one checkpoint"
                raise DifferentWeightsError(f"{self.verdict()}; {what}, or pass --allow-different-weights")
            self.compared_anyway = True
        return self

    def notes(self) -> list[str]:
        """The report's notes: compared anyway, or which parameters differ; and which the converter capped."""
        if self.compared_anyway:
            return [f"compared anyway (allow_different_weights): {self.verdict()}"]
        notes = []
        if self.capped:
            named = ", ".join(f"{c.name} (up to {c.top:.3g})" for c in self.capped[:_NAMED])
            more = f" and {len(self.capped) - _NAMED} more" if len(self.capped) > _NAMED else ""
            notes.append(f"the float16 converter capped {len(self.capped)} parameter(s) at {self.capped[0].cap:g} "
                         f"(onnxconverter-common's default max_finite_val): {named}{more}; judged as part of float16 "
                         "here (the ideal run caps them too); convert with max_finite_val=65504 to keep them")
        if not self.differing:
            return notes
        named = ", ".join(f"{m.name} ({m.how()})" for m in self.differing[:_NAMED])
        more = f" and {len(self.differing) - _NAMED} more" if len(self.differing) > _NAMED else ""
        return notes + [f"{len(self.differing)} of {self.matched} matched parameters differ from the {self.ref}'s: "
                        f"{named}{more} (named on their modules' rows)"]

    def annotate(self, rows: Sequence[CompareRow]) -> None:
        """Name each differing parameter on the first row of the module that owns it (``row.weights``)."""
        if self.compared_anyway:
            return  # every row would say it: the note does
        first: dict[str, CompareRow] = {}
        for row in rows:
            first.setdefault(row.path, row)
        for m in self.differing:
            owner = first.get(m.module)
            if owner is not None:
                text = m.words(self.ref, self.cand)
                owner.weights = f"{owner.weights}; {text}" if owner.weights else text
        for c in self.capped:
            owner = first.get(c.module)
            if owner is not None:
                owner.note = f"{c.words()}; {owner.note}" if owner.note else c.words()

    def to_dict(self) -> dict[str, Any]:
        """For the report's JSON summary."""
        return {"matched": self.matched, "compared_anyway": self.compared_anyway,
                "differing": {m.name: (None if math.isinf(m.rel) else m.rel) for m in self.differing}}


class PendingCheck:
    """A weight check on a worker thread, so that it costs little time of its own: it reads
    every parameter once (on resnet50 about as long as a session build) while the sides do work
    that leaves a core free (ONNX Runtime's session builds, one thread each; numpy and ONNX
    Runtime let go of the GIL). Not beside a PyTorch forward: its OpenMP threads stall when a
    third thread takes a core (measured slower on 2 cores), so the PyTorch reference starts it
    after its forward. :meth:`result` waits for it and refuses another checkpoint
    (:meth:`WeightCheck.enforce`) before the candidate runs; :meth:`cancel` stops it between
    parameters when the comparison ends early.

    Example:
        >>> pending = PendingCheck(lambda stop: WeightCheck(matched=3), allow=False, start=False)
        >>> pending.result().matched
        3
    """

    def __init__(self, check: Callable[[threading.Event], WeightCheck], allow: bool, *, start: bool = True) -> None:
        self._stop = threading.Event()
        self._allow = allow
        self._job = Background(lambda: check(self._stop), name="layertap-weight-check", start=start)

    def start(self) -> None:
        """Start the check (once)."""
        self._job.start()

    def result(self, beside: Callable[[], Any] | None = None) -> WeightCheck:
        """The check (started if it was not, and waited for), after ``beside()`` ran meanwhile in
        this thread; raises what the check raised, or :class:`DifferentWeightsError`."""
        self.start()
        if beside is not None:
            beside()
        return self._job.result().enforce(self._allow)

    def cancel(self) -> None:
        """Stop the check at its next parameter (the comparison ended without it)."""
        self._stop.set()

    @contextlib.contextmanager
    def named_first(self) -> Iterator[None]:
        """A :class:`LayertapError` raised in the block (an input of the wrong shape) gives way to
        the refusal of another checkpoint or architecture, its likely cause; any other error
        stops the check."""
        try:
            yield
        except LayertapError:
            self.result()
            raise
        except BaseException:
            self.cancel()
            raise


def judge(pairs: Iterable[tuple[str, Any, "FileParam"]], ref: str, cand: str,
          unknowable: Callable[[str, Reading, Reading], str | None] | None = None,
          stop: threading.Event | None = None) -> WeightCheck:
    """Compare ``(name, read reference, candidate parameter)`` pairs, one parameter in memory at a time.

    ``read reference`` returns the reference's ``(value, allowance)``, or ``None`` to skip the name;
    ``unknowable(name, ref, cand)`` explains a parameter that differs for a reason the file no longer shows:
    ``"skip"`` (no telling: not counted), ``"same"`` (checked another way: it agrees), else ``None``;
    ``stop``, once set, ends the check early (its result is then unused).
    """
    check = WeightCheck(ref=ref, cand=cand)
    for name, read_ref, param in pairs:
        if stop is not None and stop.is_set():
            break
        got = read_ref()
        if got is None:
            continue
        value = param.read()
        verdict = _differs(name, got, value)
        explained = unknowable(name, got, value) if isinstance(verdict, Mismatch) and unknowable is not None else None
        if verdict is _SKIP or explained == _SKIP:
            continue
        if explained == _SAME:
            verdict = None
        check.matched += 1
        if isinstance(verdict, Mismatch):
            check.differing.append(verdict)
        elif (top := _capped_top(got[0], value[1])) is not None:
            check.capped.append(Capped(name, name.rsplit(".", 1)[0] if "." in name else "", top, value[1].clamp or 0.0))
    return check


def _capped_top(r: np.ndarray, c_allow: Allowance) -> float | None:
    """The largest magnitude of ``r`` the candidate's converter held at its cap (one float16 carries), else ``None``."""
    if c_allow.clamp is None or r.size == 0:
        return None
    mag = np.abs(r)
    held = mag[(mag > c_allow.clamp) & (mag <= FLOAT_LIMITS["float16"][0])]
    return float(held.max()) if held.size else None


def _differs(name: str, ref: Reading, cand: Reading) -> Mismatch | str | None:
    """A :class:`Mismatch`, ``None`` when the values agree, :data:`_SKIP` when they cannot be compared."""
    (r, r_allow), (c, c_allow) = ref, cand
    module = name.rsplit(".", 1)[0] if "." in name else ""
    if r.shape != c.shape:
        if r.size != c.size:
            return Mismatch(name, module, math.inf, (tuple(r.shape), tuple(c.shape)))
        if [d for d in r.shape if d != 1] != [d for d in c.shape if d != 1]:
            return _SKIP  # the same number of values in another layout: a converter's, not compared
        c, c_allow = c.reshape(r.shape), c_allow.reshaped(c.shape, r.shape)
    if c_allow.clamp is not None:  # the converter held values beyond its cap at the cap (float16 carries them)
        r = capped(r, c_allow.clamp, FLOAT_LIMITS["float16"][0])
    if r.size == 0 or within(r, c, r_allow, c_allow):
        return None
    scale = float(np.max(np.abs(r)))
    worst = float(np.max(np.abs(c - r)))
    return Mismatch(name, module, worst / scale if scale > 0 else math.inf)


#: elements per block of :func:`within`: the values, their allowances and the difference of a block stay in cache
_BLOCK = 1 << 15


def within(r: np.ndarray, c: np.ndarray, r_allow: Allowance, c_allow: Allowance) -> bool:
    """Whether every ``|c - r|`` is at most a hair over the two formats' rounding (their own float32
    arithmetic rounds too): ``(r_allow + c_allow) * 1.01``, each allowance applied to its own side's
    values. Block by block along the first axis, so that no temporary the size of the parameter
    is made (neither the difference nor an allowance: measured 1.5x faster on resnet50's weights).

    Example:
        >>> from layertap.onnxfile.weights import Allowance
        >>> r = np.linspace(-1, 1, 4 * _BLOCK, dtype=np.float32).reshape(4, -1)
        >>> two_millionths = Allowance(floor=2e-6)
        >>> within(r, r + np.float32(1e-6), two_millionths, Allowance()), within(r, r + np.float32(1e-5), two_millionths, Allowance())
        (True, False)
        >>> within(r, r * np.float32(1.0001), Allowance(rel=1e-4), Allowance())
        True
    """
    # a file that holds the model's own values (float32 exports; folds recomputed the same way) has
    # the same bits: equal finite values are within any allowance, so allowances are made only for
    # blocks that differ; after one such block (a converted parameter) the rest are not tested for
    # equality (measured on resnet50: float32 file 89 -> 69 ms of CPU, a float16 file unchanged)
    same = _never_negative(r_allow) and _never_negative(c_allow)
    if r.ndim == 0 or r.size <= 2 * _BLOCK:
        if same and _same_finite(r, c):
            return True
        allowed = (r_allow.of(r) + c_allow.of(c)) * np.float32(1.01)
        return bool(np.all(np.abs(c - r) <= allowed))
    step = max(1, _BLOCK * r.shape[0] // r.size)
    for start in range(0, r.shape[0], step):
        rows = slice(start, start + step)
        rb, cb = r[rows], c[rows]
        if same:
            if _same_finite(rb, cb):
                continue
            same = False
        allowed = r_allow.part(rb, rows, r.shape)
        allowed += c_allow.part(cb, rows, r.shape)
        allowed *= np.float32(1.01)
        if not bool(np.all(np.abs(cb - rb) <= allowed)):
            return False
    return True


def _never_negative(allow: Allowance) -> bool:
    """Whether ``allow`` is at least 0 for every finite value (no negative or NaN floor), so that equal
    finite values pass it as the full rule would pass them."""
    return allow.rel >= 0 and bool(np.all(np.asarray(allow.floor) >= 0))


def _same_finite(r: np.ndarray, c: np.ndarray) -> bool:
    """Whether ``c`` holds exactly ``r``'s values, all finite (an infinity minus itself is NaN, which the
    full rule refuses: such values take it)."""
    if not bool(np.array_equal(r, c)):
        return False
    return r.size == 0 or (math.isfinite(float(np.max(r))) and math.isfinite(float(np.min(r))))


# ---------------------------------------------------------------------------
# the two kinds of reference
# ---------------------------------------------------------------------------
def check_recorded(record: Mapping[str, Mapping[str, Any]], now: Mapping[str, Mapping[str, Any]],
                   held: Mapping[str, float | None] | None = None) -> WeightCheck:
    """The model's parameters (``now``: :func:`~layertap.pytorch.lowering.weight_record` of ``model``) against the
    record a program carries of those it was lowered from, matched by name: a shape or a digest that differs is a
    :class:`Mismatch` (its ``rel`` a lower bound, from the largest magnitudes). ``record`` is what the program was
    lowered from, ``now`` the model's. ``held``: the weights inside the program against the model's, where its
    runtime reads them (:attr:`~layertap.runtimes.plugins.TappedProgram.held_weights`): a parameter the program
    holds another value of differs by that ``rel`` (a weight changed in the program after it was written, which
    its record cannot show).

    Example:
        >>> rec = {"fc.weight": {"shape": [2, 2], "absmax": 1.0, "digest": "a"}}
        >>> check_recorded(rec, {"fc.weight": {"shape": [2, 2], "absmax": 1.5, "digest": "b"}}).differing[0].words()
        'fc.weight differs (rel >= 0.5)'
        >>> check_recorded(rec, {"fc.weight": dict(rec["fc.weight"])}, {"fc.weight": 0.25}).differing[0].words("model", "program")
        'fc.weight differs (rel 0.25)'
        >>> check_recorded({}, {"fc.weight": {}, "fc.bias": {}}, {"fc.weight": None}).matched
        1
    """
    differing = []
    held = held or {}
    matched = [n for n in now if n in record or n in held]  # a program without a record: its held weights alone
    for name in matched:
        r, c = now[name], record.get(name)
        module = name.rsplit(".", 1)[0] if "." in name else ""
        rel = held.get(name)
        if rel is not None:
            differing.append(Mismatch(name, module, float(rel)))
        elif c is None:
            continue
        elif list(r["shape"]) != list(c["shape"]):
            differing.append(Mismatch(name, module, math.inf, (tuple(r["shape"]), tuple(c["shape"]))))
        elif r["digest"] != c["digest"]:
            top = max(float(c["absmax"]), 1e-30)
            differing.append(Mismatch(name, module, abs(float(r["absmax"]) - float(c["absmax"])) / top, at_least=True))
    return WeightCheck(matched=len(matched), differing=differing, ref="model", cand="program")


def check_file_weights(ref: "SessionSource", cand: "SessionSource", stop: threading.Event | None = None) -> WeightCheck:
    """Two files' parameters (from the sessions' sources, which hold their weights), matched by name; a
    BatchNormalization's running variance through its ``epsilon`` (see :func:`through_eps`)."""
    eps = {n.input[4]: next((a.f for a in n.attribute if a.name == "epsilon"), 1e-5)
           for n in ref.model.graph.node if n.op_type == "BatchNormalization" and len(n.input) > 4}
    return check_files(_params(ref), _params(cand), stop, eps)


def check_model_weights(model: Any, view: Any, cand: "SessionSource", stop: threading.Event | None = None) -> WeightCheck:
    """A PyTorch model against the file ``cand`` holds; ``view``: the file's scopes under the model's paths
    (its wrapper prefix, the Conv modules a BatchNorm was folded into)."""
    absorbed = {cp.path: cp.absorbed_by for cp in view.counterparts() if cp.absorbed_by}
    return check_model(model, _params(cand), view.prefix, absorbed, stop)


def _params(source: "SessionSource") -> "dict[str, FileParam]":
    """The parameters of the file ``source`` holds, read where it holds them (float16 widened on every core)."""
    return file_params(source.model, source.folder, source.held, widen=as_float32)


def check_files(ref: dict[str, "FileParam"], cand: dict[str, "FileParam"], stop: threading.Event | None = None,
                eps: dict[str, float] | None = None) -> WeightCheck:
    """Two files' parameters, matched by name; a weight folded on one side only is skipped. ``eps``: a
    normalisation's running variance by name -> the epsilon added to it (:func:`through_eps`)."""
    pairs = [through_eps(name, p.read, cand[name], (eps or {}).get(name)) for name, p in ref.items()
             if name in cand and (p.folded is None) == (cand[name].folded is None)]
    return judge(pairs, "reference", "candidate", stop=stop)


def through_eps(name: str, read: Callable[[], Reading | None], param: "FileParam", eps: float | None,
                ) -> tuple[str, Callable[[], Reading | None], "FileParam"]:
    """A pair whose both sides are read as ``value + eps`` where ``eps`` is given (a BatchNorm's running variance
    acts only through ``var + eps``: a converter that raised a variance of 1e-8 to float16's 1e-7 changes nothing
    a BatchNorm with eps 1e-3 computes); the pair unchanged otherwise.

    Example:
        >>> from layertap.onnxfile.weights import Allowance, FileParam
        >>> param = FileParam("bn.running_var", (2,), "float16", None, lambda: (np.array([1e-7, 4.0], np.float32), Allowance()))
        >>> ref = lambda: (np.array([1e-8, 4.0], np.float32), Allowance(rel=2.0**-11))
        >>> _differs("bn.running_var", ref(), param.read()) is None
        False
        >>> name, r, p = through_eps("bn.running_var", ref, param, 1e-3)
        >>> _differs(name, r(), p.read()) is None
        True
    """
    if not eps:
        return name, read, param
    shift = np.float32(eps)

    def ref_read() -> Reading | None:
        got = read()
        return None if got is None else (got[0] + shift, got[1])

    def cand_read() -> Reading:
        value, allowance = param.read()
        return value + shift, allowance

    return name, ref_read, dataclasses.replace(param, _read=cand_read)


def check_model(model: Any, cand: dict[str, "FileParam"], prefix: str, absorbed: dict[str, str],
                stop: threading.Event | None = None) -> WeightCheck:
    """A PyTorch model's state dict against a file's parameters.

    ``prefix``: the module scope prefix the file adds (an export wrapper's attribute);
    ``absorbed``: Conv module path -> the BatchNorm folded into it, from the file's scopes.
    """
    from torch.nn.modules.batchnorm import _BatchNorm

    eps = {f"{path}.running_var" if path else "running_var": float(m.eps) for path, m in model.named_modules()
           if isinstance(m, _BatchNorm)}
    pairs = []
    for name, tensor in model.state_dict().items():
        param = cand.get(f"{prefix}.{name}" if prefix else name) or cand.get(name)
        if param is None or not tensor.is_floating_point():
            continue
        pairs.append(through_eps(name, _torch_reader(model, name, tensor, param, absorbed), param,
                                 eps.get(name) if param.folded is None else None))
    # a file that records any fold records them all: only a file without such records may hide one
    unmarked = None if any(p.folded for p in cand.values()) else _UnmarkedFolds(_conv_paths(model))
    return judge(pairs, "model", "file", unmarked, stop)


def _conv_paths(model: Any) -> dict[str, Any]:
    """Each Conv module's path -> the BatchNorm registered right after it in the same parent (torchvision's
    ``Conv2dNormActivation``, ResNet's ``conv1``/``bn1``), where its channels match, else ``None``."""
    from torch.nn.modules.conv import _ConvNd

    out: dict[str, Any] = {}
    for path, parent in model.named_modules():
        children = list(parent.named_children())
        for (name, m), after in zip(children, [*children[1:], (None, None)]):
            if isinstance(m, _ConvNd):
                bn = after[1] if not m.transposed else None
                var = getattr(bn, "running_var", None)
                fits = var is not None and hasattr(bn, "eps") and var.shape[0] == m.out_channels
                out[f"{path}.{name}" if path else name] = bn if fits else None
    return out


class _UnmarkedFolds:
    """A Conv weight the file does not mark as folded, yet equal to the model's scaled per output channel.

    That is what folding a BatchNorm into a Conv makes; files that lost the exporter's record of
    it (ONNX Runtime's optimised copies keep the names, drop the metadata; a quantiser's
    pre-processing) hold such weights, and the Conv's bias then carries the BatchNorm's shift. Where
    the model registers a BatchNorm right after the Conv, the weight is checked against that fold,
    through the candidate's format (a quantised weight within half its step); else against the best
    scale per channel. Neither can be told there from a hand edit that scales channels, so both are
    skipped: never a refusal, never a finding.
    """

    def __init__(self, convs: dict[str, Any]) -> None:
        self.convs = convs
        self.scaled: set[str] = set()

    def __call__(self, name: str, ref: Reading, cand: Reading) -> str | None:
        module, _, leaf = name.rpartition(".")
        if leaf == "bias":
            return _SKIP if module in self.scaled else None
        (r, _), (c, c_allow) = ref, cand
        if leaf != "weight" or module not in self.convs or r.ndim < 2 or r.shape != c.shape:
            return None
        rows, got = r.reshape(r.shape[0], -1), c.reshape(c.shape[0], -1)
        bn = self.convs[module]
        if bn is not None and _folds_into(rows, got, c_allow.of(c).reshape(got.shape), bn):
            self.scaled.add(module)
            return _SAME
        norms = np.einsum("ij,ij->i", rows, rows)
        scale = np.divide(np.einsum("ij,ij->i", rows, got), norms, out=np.zeros_like(norms), where=norms > 0)
        residual = np.abs(got - rows * scale[:, None])
        allowed = np.reshape(c_allow.of(c), got.shape) + np.abs(got) * np.float32(_RECOMPUTED)
        if bool(np.all(residual <= allowed)):
            self.scaled.add(module)
            return _SKIP
        return None


def _folds_into(rows: np.ndarray, got: np.ndarray, allowed: np.ndarray, bn: Any) -> bool:
    """Whether ``got`` (a Conv weight, one row per output channel) is ``rows`` with BatchNorm ``bn`` folded in,
    within ``allowed`` (the candidate's rounding) and the fold's own float32 arithmetic."""
    var = bn.running_var.detach().cpu().double().numpy()
    scale = 1.0 / np.sqrt(var + bn.eps)
    if bn.weight is not None:
        scale = scale * bn.weight.detach().cpu().double().numpy()
    folded = (rows * scale[:, None]).astype(np.float32)
    return bool(np.all(np.abs(got - folded) <= allowed + np.abs(folded) * np.float32(_RECOMPUTED)))


def _torch_reader(model: Any, name: str, tensor: Any, param: FileParam, absorbed: dict[str, str]) -> Any:
    def read() -> Reading | None:
        value = tensor.detach().cpu().float().numpy()
        if param.folded is None:
            return value, format_allowance(str(tensor.dtype).removeprefix("torch."))
        return _folded_value(model, name, value, param.folded, absorbed)

    return read


def _folded_value(model: Any, name: str, value: np.ndarray, op: str, absorbed: dict[str, str]) -> Reading | None:
    """A Conv's weight or bias as the exporter folded its BatchNorm in (``s = gamma / sqrt(running_var + eps)``
    per output channel: ``W * s``, ``(b - running_mean) * s + beta``); ``None`` (skip) unless the file
    names the BatchNorm and the model has it."""
    module, _, leaf = name.rpartition(".")
    bn = _batchnorm(model, absorbed.get(module))
    if op != "Conv" or leaf not in ("weight", "bias") or bn is None or bn.running_var.shape[0] != value.shape[0]:
        return None

    def arr(t: Any) -> np.ndarray:
        return t.detach().cpu().float().numpy()

    scale = (1.0 / np.sqrt(arr(bn.running_var) + np.float32(bn.eps))).astype(np.float32)
    shift = np.zeros_like(scale)
    if bn.weight is not None:
        scale, shift = scale * arr(bn.weight), arr(bn.bias)
    if leaf == "weight":
        return value * scale.reshape(-1, *([1] * (value.ndim - 1))), Allowance(rel=_RECOMPUTED)
    centred = (value - arr(bn.running_mean)) * scale
    return centred + shift, Allowance(floor=(np.abs(centred) + np.abs(shift)) * np.float32(_RECOMPUTED))


def _batchnorm(model: Any, path: str | None) -> Any:
    """The BatchNorm module at ``path`` (with running statistics), else ``None``."""
    if path is None:
        return None
    try:
        bn = model.get_submodule(path)
    except AttributeError:
        return None
    has_stats = getattr(bn, "running_var", None) is not None and getattr(bn, "running_mean", None) is not None
    return bn if has_stats and hasattr(bn, "eps") else None
