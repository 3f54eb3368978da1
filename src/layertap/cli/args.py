"""Argument groups shared by the tools (Polygraphy's ArgGroup pattern).

A tool lists the groups it needs. Each group adds its options to the parser
(:meth:`ArgGroup.add`); once argparse is done, :meth:`Tool.parse
<layertap.cli.tools.base.Tool.parse>` calls every group's :meth:`ArgGroup.parse`
exactly once, which checks its options and turns them into a typed object on
:class:`Args` (parsed ``InputSpec``s, parsed ``Tap``s, a checked model spec,
checked output paths). The tool then reads those attributes, never the
``argparse.Namespace`` again, and hands the library the parsed values.

Parsing imports no torch: heavy imports happen only in :meth:`ModelChoice.load`.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..dataset.job import DEFAULT_SHARD_SIZE, parse_shard_size
from ..dataset.pooling import DTYPES, POOLS
from ..dataset.shards import FORMATS
from ..errors import LayertapError
from ..files.reads import note_input
from ..files.writes import check_output_path
from ..inputs import parse_inputs
from ..metrics import DEFAULT_ATOL, DEFAULT_RTOL, Criterion
from ..options import DatasetOptions as LibDatasetOptions
from ..options import Model, RuntimeOptions, SampleOptions, merged_criterion
from ..runtimes import plugin_for
from ..specs import check_model_args
from .console import status

if TYPE_CHECKING:  # pragma: no cover
    from ..inputs import InputSpec
    from ..metrics import Criterion
    from ..selectors import Tap
    from ..specs import ModelSpec


@dataclass
class Args:
    """The parsed command line of one tool: one attribute per argument group.

    ``own`` holds the tool's own options (whatever its ``parse_own`` returns);
    ``reads`` the files it names that an output must never overwrite. ``model``
    and ``tolerance`` exist only on tools that have those groups.
    """

    argv: list[str] = field(default_factory=list)
    own: Any = None
    reads: tuple[str, ...] = ()
    model: ModelChoice = field(init=False, repr=False)
    inputs: InputChoice = field(default_factory=lambda: InputChoice([], 0))
    taps: list[Tap] = field(default_factory=list)
    tap_texts: list[str] = field(default_factory=list)
    output: str | None = None  # as given (checked): messages name it as the user wrote it
    tolerance: Tolerance = field(init=False, repr=False)
    json: bool = False
    report: str | None = None  # as given (checked)
    dataset: DatasetChoice | None = None  # extract --data
    runtime: RuntimeOptions = field(default_factory=RuntimeOptions)  # RuntimeArgs
    sampling: SampleOptions = field(default_factory=SampleOptions)  # SampleArgs


class ArgGroup:
    """One reusable set of options: ``add`` them to a parser, then ``parse`` them once.

    ``order`` sets when a group is parsed: cheap checks of paths come first, the
    model spec last, so that a typo in a path is reported before the model is looked at.
    """

    order = 0

    def add(self, parser: argparse.ArgumentParser) -> None:
        raise NotImplementedError

    def parse(self, ns: argparse.Namespace, args: Args) -> None:
        """Check the group's options and store their typed value on ``args``."""


@dataclass(frozen=True)
class ModelChoice:
    """MODEL as parsed: an ONNX file, or a checked PyTorch model spec and its files."""

    text: str
    is_onnx: bool
    spec: ModelSpec | None  # checked (syntax, package, files); None for an ONNX file
    weights: str | None
    config: str | None
    unsafe_pickle: bool
    method: str
    weights_key: str | None = None
    weights_strict: bool = True

    @property
    def model(self) -> Model:
        """The PyTorch model as the library takes it (a MODEL spec with its files and method)."""
        return Model(self.spec if self.spec is not None else self.text, weights=self.weights,
                     weights_key=self.weights_key, weights_strict=self.weights_strict,
                     config=self.config, unsafe_pickle=self.unsafe_pickle, method=self.method)

    def load(self, device: str = "cpu", max_bytes: int | None = None) -> Any:
        """Build the model; returns ``(model, info)`` (see pytorch.models)."""
        from ..pytorch.reference import load

        loaded = load(self.model, device=device, max_bytes=max_bytes)
        return loaded.module, loaded.info

    def load_with_inputs(self, inputs: InputChoice, *, need_inputs: bool = True, device: str = "cpu",
                         max_bytes: int | None = None) -> tuple[Any, Any, Any, dict]:
        """``(model, info, args, kwargs)`` for this model and the parsed ``--input`` specs.

        With ``need_inputs=False`` a model without known inputs gets ``args=None``.
        With ``device="meta"`` the model and its inputs hold no data (shapes only).
        """
        from ..pytorch.reference import example_call, load

        with status(f"loading {self.text}"):
            loaded = load(self.model, device=device, max_bytes=max_bytes)
        model, info = loaded.module, loaded.info
        assert info is not None  # a MODEL spec always has its ModelInfo
        if not inputs.specs and not info.inputs and not need_inputs:
            return model, info, None, {}
        args, kwargs, _ = example_call(loaded, inputs.specs or None, SampleOptions(seed=inputs.seed))
        if device != "cpu":
            args, kwargs = tuple(a.to(device) for a in args), {k: v.to(device) for k, v in kwargs.items()}
        return model, info, args, kwargs


class ModelArgs(ArgGroup):
    """``MODEL`` plus ``--weights``, ``--config``, ``--unsafe-load-pickle``, ``--method``."""

    order = 2  # after the inputs: a typo in --input fails before the model spec is looked at

    def __init__(self, *, method: bool = True, onnx_ok: bool = False) -> None:
        self.method = method
        self.onnx_ok = onnx_ok

    def add(self, parser: argparse.ArgumentParser) -> None:
        what = "model spec or .onnx file" if self.onnx_ok else "model spec"
        parser.add_argument(
            "model",
            metavar="MODEL",
            help=f"{what}: torchvision:NAME, timm:NAME, transformers:CLASS, pkg.module:ATTR, path/file.py:ATTR",
        )
        g = parser.add_argument_group("model")
        g.add_argument("--weights", metavar="FILE", help="state dict to load (.pt/.pth via torch.load(weights_only=True), or .safetensors)")
        g.add_argument("--weights-key", metavar="KEY",
                       help="the entry of a training checkpoint that holds the state dict (model_state, ema.module); "
                            "by default the one that fits the model")
        g.add_argument("--weights-nonstrict", action="store_true",
                       help="load the keys the model and --weights both hold (load_state_dict(strict=False)); "
                            "the keys skipped and the model's keys left as they were are named")
        g.add_argument("--config", metavar="FILE.json", help="transformers config for transformers:CLASS")
        g.add_argument(
            "--unsafe-load-pickle",
            action="store_true",
            help="allow --weights to be a pickled whole module (runs code from the file: only for files you trust)",
        )
        if self.method:
            g.add_argument("--method", default="forward", metavar="NAME", help="method to run instead of forward (e.g. encode_image)")

    def parse(self, ns: argparse.Namespace, args: Args) -> None:
        """Decide once whether MODEL is an ONNX file; otherwise check what needs no torch
        (spec syntax, package, ``--weights``/``--config`` files)."""
        is_onnx = self.onnx_ok and is_onnx_path(ns.model)
        spec = None if is_onnx else check_model_args(ns.model, weights=ns.weights, config=ns.config)
        if not ns.weights and (ns.weights_key or ns.weights_nonstrict):
            raise LayertapError(f"{'--weights-key' if ns.weights_key else '--weights-nonstrict'} applies to --weights, "
                                "which is not given")
        args.model = ModelChoice(ns.model, is_onnx, spec, ns.weights, ns.config, ns.unsafe_load_pickle,
                                 getattr(ns, "method", "forward"), ns.weights_key, not ns.weights_nonstrict)


def is_onnx_path(text: str) -> bool:
    """Whether a MODEL/REF argument names an ONNX file, or a file a runtime runs in its place (an OpenVINO IR
    ``.xml``, an ExecuTorch program ``.pte``: by its suffix)."""
    return text.lower().endswith(".onnx") or plugin_for(text) is not None


@dataclass(frozen=True)
class InputChoice:
    """The parsed ``--input`` specs (names all given or all omitted) and ``--seed``."""

    specs: list[InputSpec]
    seed: int


class InputArgs(ArgGroup):
    """``--input SPEC`` (repeatable) and ``--seed``."""

    order = 1

    def add(self, parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("inputs")
        g.add_argument(
            "--input",
            action="append",
            default=[],
            metavar="SPEC",
            help="[NAME=]SHAPE[:DTYPE] (random data, e.g. 1x3x224x224, 2x7:int64) or [NAME=]FILE.npy; repeat for several arguments",
        )
        g.add_argument("--seed", type=int, default=0, help="seed for random inputs (default 0)")

    def parse(self, ns: argparse.Namespace, args: Args) -> None:
        args.inputs = InputChoice(parse_inputs(ns.input), ns.seed)


class TapArgs(ArgGroup):
    """``--tap TAP`` (repeatable), parsed into ``Tap`` objects once.

    With ``selectors=False`` (an ONNX file's taps, which may be tensor names) the
    texts are kept as given, for the library to resolve against the file.
    """

    def __init__(self, required: bool = False, selectors: bool | Callable[[argparse.Namespace], bool] = True) -> None:
        self.required = required
        self.selectors = selectors  # or a rule on the command line (extract over a dataset keeps texts)

    def add(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--tap",
            action="append",
            default=[],
            required=self.required,
            metavar="TAP",
            help="[ALIAS=]PATH[#CALL][:input|:output][INDEX]..., e.g. layer2.1.relu#1, fc:input, enc.layers.3[0]",
        )

    def parse(self, ns: argparse.Namespace, args: Args) -> None:
        from ..selectors import parse_taps  # noqa: PLC0415 -- layertap --help loads this module; selectors load on use

        args.tap_texts = list(ns.tap)
        if self.selectors is True or (callable(self.selectors) and self.selectors(ns)):
            args.taps = parse_taps(ns.tap)


class OutputArgs(ArgGroup):
    """``-o/--output FILE``, checked before any work (folder exists, not a file the command reads)."""

    def __init__(self, required: bool, suffixes: tuple[str, ...], help: str,  # noqa: A002 - argparse's own name
                 when: Callable[[argparse.Namespace], bool] = lambda ns: True) -> None:
        self.required = required
        self.suffixes = suffixes
        self.help = help
        self.when = when  # False: -o means something else this time (a folder); the tool checks it

    def add(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("-o", "--output", required=self.required, metavar="FILE", help=self.help)

    def parse(self, ns: argparse.Namespace, args: Args) -> None:
        if not self.when(ns):
            return
        for path, what in read_paths(ns):
            note_input(path, what)
        if ns.output is not None:
            check_output_path(ns.output, inputs=args.reads, suffixes=self.suffixes)
            args.output = ns.output


#: namespace attribute -> what that file is, for every option naming a file a command reads
_READ_OPTIONS = {
    "weights": "--weights", "config": "--config", "onnx": "", "src": "",
}


def read_paths(ns: argparse.Namespace):
    """``(path, what)`` for every file the parsed command line says it reads.

    The library records what it opens as well (external data, imported files);
    this lets the CLI refuse a bad ``-o`` before anything is loaded.
    """
    for attr, what in _READ_OPTIONS.items():
        value = getattr(ns, attr, None)
        if isinstance(value, str) and value:
            yield value, what
    model = getattr(ns, "model", None)
    if isinstance(model, str):
        head = model.rpartition(":")[0] if ".py:" in model else model
        if head.lower().endswith((".py", ".onnx")):
            yield head, "MODEL"
    for text in getattr(ns, "input", None) or []:
        value = text.split("=", 1)[-1]
        if value.lower().endswith(".npy"):
            yield value, "--input"


def nonneg_float(text: str) -> float:
    """argparse type: a number >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    return _int_at_least(text, 1, "a positive integer")


def nonneg_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    return _int_at_least(text, 0, "an integer >= 0")


def _int_at_least(text: str, low: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


@dataclass(frozen=True)
class Tolerance:
    """The pass rule shared by export verification, compare and repro: the library's
    :class:`~layertap.metrics.Criterion`, and whether ``--rtol``/``--atol`` were given."""

    criterion: Criterion
    given: bool = True  # False: neither was on the command line (compare may fit rtol to a reduced precision)

    @property
    def rtol(self) -> float:
        return self.criterion.rtol

    @property
    def atol(self) -> float:
        return self.criterion.atol

    def chosen(self) -> dict[str, Any]:
        """``rtol``/``atol`` as keywords when the user gave them: a rule nobody chose may be fitted to
        a runtime's reduced precision (:func:`~layertap.options.merged_criterion`)."""
        return dict(rtol=self.rtol, atol=self.atol) if self.given else {}


class ToleranceArgs(ArgGroup):
    """``--rtol`` / ``--atol``: the pass rule shared by export verification and compare; ``rule`` words
    it for a command whose sides are not ONNX vs torch. With ``metrics=True`` also ``--metric``,
    ``--min-cosine``, ``--min-sqnr`` and ``--check-finite``. Parsed once into a :class:`Tolerance`."""

    def __init__(self, rule: str = "pass when max|onnx-torch| <= atol + rtol*max|torch|", *, metrics: bool = False) -> None:
        self.rule, self.metrics = rule, metrics

    def add(self, parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("pass rule" if self.metrics else "tolerance")
        g.add_argument("--rtol", type=nonneg_float, default=None, metavar="R",
                       help=f"{self.rule} (default {DEFAULT_RTOL:g})")
        g.add_argument("--atol", type=nonneg_float, default=None, metavar="A",
                       help=f"absolute tolerance (default {DEFAULT_ATOL:g})")
        if self.metrics:
            self._add_metrics(g)

    @staticmethod
    def _add_metrics(g: Any) -> None:
        g.add_argument("--metric", choices=("rel", "cosine", "sqnr"), default="rel",
                       help="what decides pass/fail: rel (--rtol/--atol, default), cosine (--min-cosine), sqnr (--min-sqnr)")
        g.add_argument("--min-cosine", type=float, default=None, metavar="C",
                       help="with --metric cosine: pass when cosine similarity >= C (default 0.999)")
        g.add_argument("--min-sqnr", type=float, default=None, metavar="DB",
                       help="with --metric sqnr: pass when SQNR >= DB decibels (default 30)")
        g.add_argument("--check-finite", action="store_true",
                       help="fail any module whose candidate values hold NaN/inf, and name the first one")
        g.add_argument("--precision", choices=("auto", "fp32", "fp16", "bf16", "int8"), default="auto",
                       help="the format a reduced-precision candidate is judged at: auto (default: read from the file "
                            "and its runtime) or one named; below fp32 a row fails when the candidate is further from "
                            "an ideal run at that format than the format explains, or where the format cannot carry a "
                            "value (--rtol/--atol/--metric given: they decide); fp32: the fixed rule")

    def parse(self, ns: argparse.Namespace, args: Args) -> None:
        rule = dict(metric=ns.metric, min_cosine=ns.min_cosine, min_sqnr_db=ns.min_sqnr,
                    check_finite=ns.check_finite, precision=ns.precision) if self.metrics else {}
        given = {k: v for k, v in dict(rtol=ns.rtol, atol=ns.atol, **rule).items() if v is not None}
        criterion, _ = merged_criterion(Criterion(), **given)
        args.tolerance = Tolerance(criterion, given=ns.rtol is not None or ns.atol is not None)


class SampleArgs(ArgGroup):
    """Which samples a command runs on: ``--inputs PATH`` and ``--samples N`` (one or the other),
    with ``reading=True`` also ``--limit``, ``--save-inputs``, ``--columns``, ``--image-size``,
    ``--mean``, ``--std``; parsed once into :class:`~layertap.options.SampleOptions` (``--seed``
    from the inputs group). ``default_samples``: ``N`` when neither is given."""

    order = 1

    def __init__(self, *, inputs_help: str, samples_help: str | None = None, reading: bool = False,
                 default_samples: int | None = None, check_exists: bool = False) -> None:
        self.inputs_help, self.samples_help, self.reading = inputs_help, samples_help, reading
        self.default_samples, self.check_exists = default_samples, check_exists

    def add(self, parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("samples")
        g.add_argument("--inputs", metavar="PATH", help=self.inputs_help)
        if self.samples_help is not None:
            g.add_argument("--samples", type=positive_int, default=None, metavar="N", help=self.samples_help)
        if self.reading:
            g.add_argument("--save-inputs", metavar="FILE.npz",
                           help="write the samples compared to FILE.npz, an array per input named after it: samples "
                                "of batch 1 joined on the batch axis (4 samples of 1x3x224x224: 4x3x224x224, one per "
                                "row), others stacked (4 samples of 2x7: 4x2x7); --inputs FILE.npz repeats the "
                                "comparison exactly")
            add_sample_options(g, limit_help="with --inputs: only the first N samples")

    def parse(self, ns: argparse.Namespace, args: Args) -> None:
        samples = getattr(ns, "samples", None)
        if ns.inputs is not None and samples is not None:
            raise LayertapError("give --inputs or --samples, not both")
        reading = dict(limit=ns.limit, columns=ns.columns, image_size=ns.image_size, mean=ns.mean, std=ns.std,
                       save_inputs=ns.save_inputs) if self.reading else {}
        for flag in ("limit", "columns", "image_size"):
            if reading.get(flag) is not None and ns.inputs is None:
                raise LayertapError(f"--{flag.replace('_', '-')} applies to the samples of --inputs PATH; give --inputs too")
        if self.check_exists and ns.inputs is not None:
            if not Path(ns.inputs).exists():
                raise LayertapError(f"--inputs '{ns.inputs}' does not exist")
        if samples is None and ns.inputs is None:
            samples = self.default_samples
        args.sampling = SampleOptions(samples=samples, inputs=ns.inputs, seed=getattr(ns, "seed", 0), **reading)


class RuntimeArgs(ArgGroup):
    """``--runtime ort|openvino``, ``--ov-precision``, ``--ov-device`` (with ``cand=True`` also
    ``--cand-runtime``, ``--providers``, ``--cand-providers``, ``--no-ort-opt``, ``--ref-no-ort-opt``):
    what runs each ONNX file, parsed once into :class:`~layertap.options.RuntimeOptions`."""

    def __init__(self, *, cand: bool = False) -> None:
        self.cand = cand

    def add(self, parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("runtime")
        which = "an ONNX reference (else the candidate)" if self.cand else "the file"
        # no argparse choices: a runtime registered from outside is a name too, and an unknown one is refused
        # by open_runtime with the close matches
        g.add_argument("--runtime", default=None, metavar="NAME",
                       help=f"what runs {which}: ort (ONNX Runtime, default), openvino, or a runtime plug-in's name")
        if self.cand:
            g.add_argument("--cand-runtime", default=None, metavar="NAME",
                           help="what runs the candidate (default: the reference's runtime)")
        self.add_openvino(g)
        if self.cand:
            self._add_ort(g)
            self.add_compiled(parser)

    @staticmethod
    def add_openvino(g: Any) -> None:
        """OpenVINO's flags (``--runtime openvino``; ``fix --runtime openvino`` too)."""
        g.add_argument("--ov-precision", choices=("f32", "bf16", "f16"), default=None,
                       help="OpenVINO's inference precision (default: the device's own, bf16 on CPUs with AMX)")
        g.add_argument("--ov-device", default=None, metavar="DEVICE", help="OpenVINO device: CPU (default), GPU, NPU")

    @staticmethod
    def add_compiled(parser: argparse.ArgumentParser) -> None:
        """Compiled PyTorch's flags (``--cand-runtime inductor``, ``fix --runtime inductor``)."""
        g = parser.add_argument_group("compiled PyTorch (--runtime/--cand-runtime inductor)")
        g.add_argument("--autocast", choices=("bf16", "fp16"), default=None,
                       help="run the model and its compiled form under torch.autocast at this dtype (judged against "
                            "float64 beside eager at the same dtype)")
        g.add_argument("--compile-mode", default=None, metavar="MODE",
                       help="torch.compile's mode: default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs")
        g.add_argument("--compile-backend", default=None, metavar="NAME",
                       help="torch.compile's backend (default inductor; eager, aot_eager, or any registered name)")

    @staticmethod
    def _add_ort(g: Any) -> None:
        g.add_argument("--providers", metavar="EP[,EP]", default=None,
                       help="ONNX Runtime execution providers of an ONNX reference (CUDA, TensorRT, OpenVINO, CoreML; default CPU)")
        g.add_argument("--cand-providers", metavar="EP[,EP]", default=None,
                       help="execution providers of the candidate (default CPU)")
        g.add_argument("--no-ort-opt", action="store_true",
                       help="run the candidate with ORT graph optimisations disabled (exposed outputs can change its fusions)")
        g.add_argument("--ref-no-ort-opt", action="store_true",
                       help="run an ONNX reference with ORT graph optimisations disabled")

    def parse(self, ns: argparse.Namespace, args: Args) -> None:

        both = dict(cand_runtime=ns.cand_runtime, providers=ns.providers, cand_providers=ns.cand_providers,
                    ort_optimizations=not ns.no_ort_opt, ref_ort_optimizations=not ns.ref_no_ort_opt,
                    autocast=ns.autocast, compile_mode=ns.compile_mode,
                    compile_backend=ns.compile_backend) if self.cand else {}
        args.runtime = RuntimeOptions(runtime=ns.runtime, ov_precision=ns.ov_precision, ov_device=ns.ov_device, **both)


class JsonArgs(ArgGroup):
    """``--json``: machine-readable output on stdout."""

    def add(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")

    def parse(self, ns: argparse.Namespace, args: Args) -> None:
        args.json = bool(ns.json)


def need(value: Any, message: str) -> Any:
    """Raise a usage error when ``value`` is missing."""
    if value is None or value == [] or value == "":
        raise LayertapError(message)
    return value


class ReportArgs(ArgGroup):
    """``--report FILE.html``: a self-contained HTML report (checked before any work)."""

    def add(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--report", metavar="FILE.html",
                            help="also write a self-contained HTML report (opens offline; tables, charts, thumbnails)")

    def parse(self, ns: argparse.Namespace, args: Args) -> None:
        """Refuse an unwritable path, or one that clashes with what the command reads or writes."""
        if ns.report is None:
            return
        from ..reports import check_report_path

        clashes = args.reads + ((args.output,) if args.output is not None else ())
        check_report_path(ns.report, inputs=clashes)
        args.report = ns.report

    @staticmethod
    def write(args: Args, document: str) -> None:
        """Write the report atomically and say so on stderr."""
        from ..reports import write_report

        write_report(need(args.report, "no --report path"), document)
        sys.stderr.write(f"wrote report {args.report}\n")

    @staticmethod
    def inputs_text(args: Any, kwargs: dict | None = None) -> str:
        """``1x3x224x224, ids=2x7`` for the arguments a model ran on (anything with ``.shape``).

        Example:
            >>> import numpy as np
            >>> ReportArgs.inputs_text((np.zeros((1, 3)),), {"mask": np.zeros((2, 7))})
            '1x3, mask=2x7'
        """
        def one(v: Any) -> str:
            shape = getattr(v, "shape", None)
            return "x".join(str(d) for d in shape) or "scalar" if shape is not None else type(v).__name__

        parts = [one(a) for a in (args or ())] + [f"{k}={one(v)}" for k, v in (kwargs or {}).items()]
        return ", ".join(parts) or "-"


def floats(text: str) -> list[float]:
    """argparse type: numbers separated by commas or spaces (``0.485,0.456,0.406``).

    Example:
        >>> floats("0.5,0.25 1")
        [0.5, 0.25, 1.0]
    """
    try:
        return [float(v) for v in text.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 0.485,0.456,0.406, got {text!r}") from None


def names(text: str) -> list[str]:
    """argparse type: comma-separated names (``input_ids,attention_mask``).

    Example:
        >>> names("input_ids, attention_mask")
        ['input_ids', 'attention_mask']
    """
    out = [n.strip() for n in text.split(",") if n.strip()]
    if not out:
        raise argparse.ArgumentTypeError(f"expected names like input_ids,attention_mask, got {text!r}")
    return out


def add_sample_options(group: Any, *, limit_help: str) -> None:
    """``--limit``, ``--columns``, ``--image-size``, ``--mean``, ``--std``: how samples are read from a folder
    (``extract --data`` and ``compare --inputs`` read the same sources)."""
    group.add_argument("--limit", type=positive_int, metavar="N", help=limit_help)
    group.add_argument("--columns", type=names, metavar="A,B",
                       help="the input columns of a datasets folder (default: its image or array column, else every "
                            "array column, as named inputs; a label column is kept as labels)")
    group.add_argument("--image-size", metavar="SIZE|HxW", help="image size when the model's config has none")
    group.add_argument("--mean", type=floats, metavar="R,G,B",
                       help="per-channel mean of pixels in [0,1] (default: model config, else 0)")
    group.add_argument("--std", type=floats, metavar="R,G,B", help="per-channel std (default: model config, else 1)")


@dataclass(frozen=True)
class DatasetChoice:
    """Extraction over ``--data``: the data, OUT_DIR and ``lt.extract_dataset``'s everyday options; the rest
    as the library's :class:`~layertap.options.DatasetOptions` (``--dtype``, ``--shard-size``,
    ``--skip-bad``, ``--workers``, ``--ray``) and how samples are read (``--limit``, ``--columns``,
    ``--image-size``, ``--mean``, ``--std``) as its :class:`~layertap.options.SampleOptions`."""

    data: str
    out: str  # -o OUT_DIR
    batch_size: int
    format: str
    pool: str
    resume: bool
    device: str
    options: LibDatasetOptions
    sampling: SampleOptions


class DatasetArgs(ArgGroup):
    """``--data`` and the options of extraction over a dataset."""

    def add(self, parser: argparse.ArgumentParser) -> None:
        g = parser.add_argument_group("dataset (with --data; -o is then an OUT_DIR)")
        g.add_argument("--data", metavar="PATH", help="folder of images, of .npy/.npz samples, or a datasets save_to_disk folder")
        g.add_argument("--batch-size", type=positive_int, default=64, metavar="N", help="samples per forward (default 64)")
        g.add_argument("--workers", type=nonneg_int, default=0, metavar="N", help="DataLoader workers that load ahead (default 0)")
        g.add_argument("--format", choices=FORMATS, default="safetensors", help="shard format (default safetensors)")
        g.add_argument("--dtype", choices=DTYPES, default="float32", help="dtype of floating features (default float32)")
        g.add_argument("--pool", choices=POOLS, default="none", help="pool spatial (NCHW) or token (NTD) axes (default none)")
        g.add_argument("--shard-size", default=DEFAULT_SHARD_SIZE, metavar="N|SIZE",
                       help=f"samples per shard file (1024), or the size of a shard's features (256MB, 1GiB; default "
                            f"{DEFAULT_SHARD_SIZE}: samples per shard from the taps' bytes per sample)")
        g.add_argument("--resume", action="store_true", help="continue an interrupted run in OUT_DIR (same options)")
        g.add_argument("--device", default="cpu", metavar="cpu|cuda", help="PyTorch device (default cpu)")
        g.add_argument("--skip-bad", action="store_true", help="skip unreadable samples (listed in the manifest) instead of stopping")
        add_sample_options(g, limit_help="only the first N samples")
        g.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                       help="run on Ray Data: a local Ray without ADDRESS, else join the cluster at ADDRESS (e.g. auto, ray://head:10001)")

    def parse(self, ns: argparse.Namespace, args: Args) -> None:
        if ns.data is not None:
            samples, _ = parse_shard_size(ns.shard_size)  # a typo fails before the model loads
            sampling = SampleOptions(limit=ns.limit, columns=ns.columns, image_size=ns.image_size, mean=ns.mean,
                                     std=ns.std)
            options = LibDatasetOptions(dtype=ns.dtype, shard_size=samples or ns.shard_size, skip_bad=ns.skip_bad,
                                        workers=ns.workers, engine="ray" if ns.ray is not None else "local",
                                        ray_address=ns.ray or None)
            args.dataset = DatasetChoice(ns.data, ns.output, ns.batch_size, ns.format, ns.pool, ns.resume, ns.device,
                                         options, sampling)
