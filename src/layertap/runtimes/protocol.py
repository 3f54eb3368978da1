"""The runtime protocol: a :class:`Runtime` opens :class:`Engine` s on a model (held in memory by
a :class:`~layertap.runtimes.source.SessionSource`, or a file) with chosen tensors exposed, on a
part of a model (``--local``), or on a file as it is (export's check, fix's trials, repro's
reference part); an engine runs a feed into arrays by name; :meth:`Runtime.describe` says what
ran (runtime, version, device, precision). A runtime's plug-in (:mod:`.plugins`) opens its
:class:`Runtime`; :func:`layertap.runtimes.open_runtime` is the one factory, and every session and
every run of a file goes through it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, Sequence

import numpy as np

from ..errors import OnnxFileError

if TYPE_CHECKING:  # pragma: no cover
    import onnx

    from .source import SessionSource


class InputInfo(NamedTuple):
    """A model input as ONNX Runtime's ``NodeArg`` shows it: name, type text (``tensor(float)``), shape."""

    name: str
    type: str
    shape: list[int | str | None] | None


@dataclass(frozen=True)
class RuntimeInfo:
    """What ran a side: runtime name, its version, the device and the precision it computed in, and
    a note when that is not what was asked for.

    Example:
        >>> RuntimeInfo("OpenVINO", "2026.4.1", "CPU", "bfloat16").text()
        'OpenVINO 2026.4.1 on CPU, bfloat16'
        >>> RuntimeInfo("ONNX Runtime", "1.24", "CPU", "float32", "CUDA was asked for and did not run").text()
        'ONNX Runtime 1.24 on CPU, float32 (CUDA was asked for and did not run)'
    """

    runtime: str
    version: str
    device: str
    precision: str
    note: str = ""

    def text(self) -> str:
        """One line for the terminal notes and the HTML page."""
        return f"{self.runtime} {self.version} on {self.device}, {self.precision}" + (f" ({self.note})" if self.note else "")

    def to_dict(self) -> dict[str, str]:
        """The fields, for ``--json`` (``note`` only when there is one)."""
        return {k: v for k, v in asdict(self).items() if k != "note" or v}


class Engine(Protocol):
    """A model compiled with some tensors exposed, run any number of times."""

    def get_inputs(self) -> list[InputInfo]:
        """The model's real inputs (not initializers)."""

    def output_names(self) -> list[str]:
        """The model's outputs, one name each, in order (what ``run(None, ...)`` hands out)."""

    def run(self, names: Sequence[str] | None, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One run on ``feed``: the tensors ``names`` (``None``: every output) by name."""


class Runtime(Protocol):
    """Opens engines; one instance per side, so its settings (device, precision) hold for every engine.

    What differs between runtimes is said here, never by asking a runtime's ``name``.
    """

    name: str
    #: graph optimisations on (ONNX Runtime's switch, ``--no-ort-opt``; a runtime without one: always True)
    optimize: bool
    #: tensors inside ``If`` branches may be carried out as outputs of their ``If``
    #: (:mod:`layertap.onnxfile.branches`; OpenVINO's CPU plug-in refuses an ``If`` whose branches differ in shape)
    carries_branches: bool

    def open(self, model: "SessionSource | Path", outputs: Sequence["str | onnx.ValueInfoProto"] = (), *,
             only: bool = False) -> Engine:
        """An engine on the whole model with ``outputs`` exposed beside (``only``: instead of) its own."""

    def open_tapped(self, source: "SessionSource", tensors: Sequence[str]) -> Engine:
        """An engine on ``source``, whose graph already has ``tensors`` among its outputs (added in
        memory, typed): ONNX Runtime runs that graph; a runtime that reads the unedited file
        (OpenVINO) exposes them by name."""

    def settings(self) -> str:
        """The settings a run's note names beside :meth:`describe` (``""``: none)."""

    def rounding_note(self) -> str:
        """Why a first divergence within rounding may come from running with tensors exposed
        (``""``: nothing to say)."""

    def open_part(self, source: "SessionSource", part: "onnx.ModelProto") -> Engine:
        """An engine on a graph built from ``source`` 's nodes, reading its weights (``--local``)."""

    def open_file(self, path: Path, *, timing: bool = False) -> Engine:
        """An engine on the file at ``path`` as it is, read by the runtime itself (its own outputs;
        ``timing``: set up to measure its latency as the runtime runs by default)."""

    def exposable(self, model: "SessionSource | Path") -> set[str] | None:
        """Tensor names this runtime can hand out (``None``: every tensor of the ONNX graph)."""

    def describe(self) -> RuntimeInfo:
        """Runtime, version, device and the precision that ran."""


def check_exposed(names: Sequence[str], available: set[str] | None, runtime: str) -> None:
    """Refuse names an engine cannot hand out (a caller asks only for tensors it has checked).

    Example:
        >>> check_exposed(["a"], {"a", "b"}, "OpenVINO")
        >>> check_exposed(["c"], {"a"}, "OpenVINO")
        Traceback (most recent call last):
        ...
        layertap.errors.OnnxFileError: OpenVINO does not hand out the tensor 'c' (its graph folded it away)
    """
    if available is None:
        return
    missing = [n for n in names if n not in available]
    if missing:
        raise OnnxFileError(f"{runtime} does not hand out the tensor {missing[0]!r} (its graph folded it away)")


def as_input_infos(items: Sequence[Any]) -> list[InputInfo]:
    """ORT ``NodeArg`` s (or anything with ``name``, ``type``, ``shape``) as :class:`InputInfo`."""
    return [InputInfo(i.name, i.type, list(i.shape) if i.shape is not None else None) for i in items]
