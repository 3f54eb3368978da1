"""ONNX Runtime as a :class:`~.base.Runtime`: a thin adapter over :mod:`layertap.onnxfile.ort`
(sessions on in-memory models, providers)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from .base import InputInfo, RuntimeInfo, as_input_infos

if TYPE_CHECKING:  # pragma: no cover
    import onnx

    from ..onnxfile.ort import SessionSource


class OrtEngine:
    """One ONNX Runtime session.

    Example:
        >>> import onnx.helper as h
        >>> from layertap.onnxfile.ort import SessionSource
        >>> g = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g",
        ...     [h.make_tensor_value_info("x", 1, [2])], [h.make_tensor_value_info("y", 1, [2])])
        >>> src = SessionSource(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), Path("."))
        >>> OrtRuntime().open(src).run(None, {"x": np.array([-1.0, 2.0], np.float32)})
        {'y': array([0., 2.], dtype=float32)}
    """

    def __init__(self, session: Any) -> None:
        self.session = session

    def get_inputs(self) -> list[InputInfo]:
        return as_input_infos(self.session.get_inputs())

    def run(self, names: Sequence[str] | None, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from ..onnxfile.ort import run_options

        wanted = list(names) if names is not None else [o.name for o in self.session.get_outputs()]
        return dict(zip(wanted, self.session.run(wanted, feed, run_options())))


#: what a compare says when its first divergence is within rounding and ORT optimised the graph
FUSION_NOTE = (
    "exposing intermediate tensors as ONNX Runtime outputs can stop ORT from fusing the nodes that "
    "produce them, so this run may differ slightly from a plain run of the file; compare with "
    "ort_optimizations=False (--no-ort-opt) to rule ORT's graph optimisations out"
)


class OrtRuntime:
    """ONNX Runtime on ``providers`` (CPU by default), graph optimisations on unless ``optimize`` is False.

    Example:
        >>> rt = OrtRuntime(optimize=False)
        >>> rt.settings(), rt.rounding_note(), OrtRuntime().settings()
        ('with graph optimisations disabled (ORT_DISABLE_ALL)', '', 'with graph optimisations')
    """

    name = "ort"
    carries_branches = True  # a tensor carried out of an If branch: an empty value when the branch did not run

    def __init__(self, providers: Sequence[str] | str | None = None, optimize: bool = True) -> None:
        from ..onnxfile.ort import resolve_providers

        self.providers = resolve_providers(providers)
        self.optimize = optimize
        self.ran: list[str] | None = None  # the providers the last session runs on (ORT drops one that fails to load)

    def open(self, model: "SessionSource | Path", outputs: Sequence["str | onnx.ValueInfoProto"] = (), *,
             only: bool = False) -> OrtEngine:
        source = _source(model) if isinstance(model, Path) else model
        return self._engine(source.session(outputs, only=only, optimize=self.optimize, providers=self.providers))

    def open_tapped(self, source: "SessionSource", tensors: Sequence[str]) -> OrtEngine:
        return self.open(source)  # the taps are outputs of the in-memory graph, typed there

    def open_part(self, source: "SessionSource", part: "onnx.ModelProto") -> OrtEngine:
        return self._engine(source.session_for(part, optimize=self.optimize, providers=self.providers))

    def settings(self) -> str:
        return "with graph optimisations" if self.optimize else "with graph optimisations disabled (ORT_DISABLE_ALL)"

    def rounding_note(self) -> str:
        return FUSION_NOTE if self.optimize else ""

    def _engine(self, session: Any) -> OrtEngine:
        self.ran = list(session.get_providers())
        return OrtEngine(session)

    def exposable(self, model: "SessionSource | Path") -> set[str] | None:
        return None  # every tensor of the graph can be a graph output

    def describe(self) -> RuntimeInfo:
        """The providers the sessions ran on (those asked for until one was built), and a note
        naming any asked for that ORT left out."""
        import onnxruntime as ort

        ran = self.ran if self.ran is not None else self.providers
        return RuntimeInfo("ONNX Runtime", ort.__version__, _short(ran), "the file's own types",
                           providers_note(self.providers, ran))


def providers_note(asked: Sequence[str], ran: Sequence[str]) -> str:
    """What to say when ORT left out a provider that was asked for (it falls back to the others,
    silently, when one fails to load); ``""`` when all ran.

    Example:
        >>> providers_note(["CUDAExecutionProvider", "CPUExecutionProvider"], ["CPUExecutionProvider"])
        'CUDA was asked for but did not load: ONNX Runtime ran on CPU'
        >>> providers_note(["CPUExecutionProvider"], ["CPUExecutionProvider"])
        ''
    """
    missing = [p for p in asked if p not in ran]
    if not missing:
        return ""
    return f"{_short(missing)} was asked for but did not load: ONNX Runtime ran on {_short(ran)}"


def _short(providers: Sequence[str]) -> str:
    return ", ".join(p.removesuffix("ExecutionProvider") for p in providers)


def _source(path: Path) -> "SessionSource":
    """A file read once, its weights held for every session."""
    from ..onnxfile.modelfile import read_model
    from ..onnxfile.ort import SessionSource

    mf = read_model(path)
    return SessionSource(mf.model, mf.folder, move_weights=True)
