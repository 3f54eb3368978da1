"""Argument groups shared by the tools (Polygraphy-style).

A tool lists the groups it needs; each group adds its options to the parser
and turns the parsed namespace into the objects the Python API takes. Heavy
imports (torch) happen only inside the ``load`` methods of groups that need
them.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import LayertapError


class ArgGroup:
    """One reusable set of options."""

    def add(self, parser: argparse.ArgumentParser) -> None:
        raise NotImplementedError


class ModelArgs(ArgGroup):
    """``MODEL`` plus ``--weights``, ``--config``, ``--unsafe-load-pickle``, ``--method``."""

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
        g.add_argument("--config", metavar="FILE.json", help="transformers config for transformers:CLASS")
        g.add_argument(
            "--unsafe-load-pickle",
            action="store_true",
            help="allow --weights to be a pickled whole module (runs code from the file: only for files you trust)",
        )
        if self.method:
            g.add_argument("--method", default="forward", metavar="NAME", help="method to run instead of forward (e.g. encode_image)")

    @staticmethod
    def load(ns: argparse.Namespace, device: str = "cpu", max_bytes: int | None = None):
        """Build the model; returns ``(model, info)`` (see pytorch.models)."""
        from ..pytorch.models import load_model

        return load_model(
            ns.model,
            weights=ns.weights,
            config=ns.config,
            unsafe_pickle=ns.unsafe_load_pickle,
            device=device,
            max_bytes=max_bytes,
        )

    @staticmethod
    def check(ns: argparse.Namespace) -> None:
        """What can be checked before torch is imported: MODEL syntax, --weights/--config files."""
        from ..specs import check_model_args

        check_model_args(ns.model, weights=ns.weights, config=ns.config)

    @classmethod
    def load_with_inputs(cls, ns: argparse.Namespace, *, need_inputs: bool = True, device: str = "cpu",
                         max_bytes: int | None = None):
        """``(model, info, args, kwargs)`` for a MODEL and its ``--input`` specs.

        ``--input`` is parsed before the model is built, so a typo fails fast.
        With ``need_inputs=False`` a model without known inputs gets ``args=None``.
        With ``device="meta"`` the model and its inputs hold no data (shapes only).
        """
        specs = InputArgs.specs(ns)  # before torch is imported
        cls.check(ns)

        from ..pytorch.example_inputs import make_inputs
        from .console import status

        with status(f"loading {ns.model}"):
            model, info = cls.load(ns, device, max_bytes)
        if not specs and not info.inputs and not need_inputs:
            return model, info, None, {}
        args, kwargs = make_inputs(info, specs, model=model, method=ns.method, seed=ns.seed)
        if device != "cpu":
            args, kwargs = tuple(a.to(device) for a in args), {k: v.to(device) for k, v in kwargs.items()}
        return model, info, args, kwargs


class InputArgs(ArgGroup):
    """``--input SPEC`` (repeatable) and ``--seed``."""

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

    @staticmethod
    def specs(ns: argparse.Namespace):
        from ..inputs import parse_inputs

        return parse_inputs(ns.input)


class TapArgs(ArgGroup):
    """``--tap TAP`` (repeatable)."""

    def __init__(self, required: bool = False) -> None:
        self.required = required

    def add(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--tap",
            action="append",
            default=[],
            required=self.required,
            metavar="TAP",
            help="[ALIAS=]PATH[#CALL][:input|:output][INDEX]..., e.g. layer2.1.relu#1, fc:input, enc.layers.3[0]",
        )

    @staticmethod
    def taps(ns: argparse.Namespace):
        from ..selectors import parse_taps

        return parse_taps(ns.tap)


class OutputArgs(ArgGroup):
    """``-o/--output FILE``."""

    def __init__(self, required: bool, suffixes: tuple[str, ...], help: str) -> None:  # noqa: A002 - argparse's own name
        self.required = required
        self.suffixes = suffixes
        self.help = help

    def add(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("-o", "--output", required=self.required, metavar="FILE", help=self.help)

    def check(self, ns: argparse.Namespace, inputs: tuple = ()):
        """Validate the output path before any work (folder exists, not a file the command reads)."""
        from ..files.reads import note_input
        from ..files.writes import check_output_path

        for path, what in read_paths(ns):
            note_input(path, what)
        if ns.output is None:
            return None
        return check_output_path(ns.output, inputs=inputs, suffixes=self.suffixes)


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


class ToleranceArgs(ArgGroup):
    """``--rtol`` / ``--atol``: the pass rule shared by export verification and compare."""

    def add(self, parser: argparse.ArgumentParser) -> None:
        from ..metrics import DEFAULT_ATOL, DEFAULT_RTOL

        g = parser.add_argument_group("tolerance")
        g.add_argument("--rtol", type=nonneg_float, default=DEFAULT_RTOL, metavar="R",
                       help=f"pass when max|onnx-torch| <= atol + rtol*max|torch| (default {DEFAULT_RTOL:g})")
        g.add_argument("--atol", type=nonneg_float, default=DEFAULT_ATOL, metavar="A",
                       help=f"absolute tolerance (default {DEFAULT_ATOL:g})")


class JsonArgs(ArgGroup):
    """``--json``: machine-readable output on stdout."""

    def add(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")


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

    @staticmethod
    def check(ns: argparse.Namespace, inputs: tuple = ()):
        """Refuse an unwritable or clashing report path before anything is loaded."""
        if ns.report is None:
            return None
        from ..reports import check_report_path

        return check_report_path(ns.report, inputs=inputs)

    @staticmethod
    def write(ns: argparse.Namespace, document: str) -> None:
        """Write the report atomically and say so on stderr."""
        import sys

        from ..reports import write_report

        write_report(ns.report, document)
        sys.stderr.write(f"wrote report {ns.report}\n")

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
