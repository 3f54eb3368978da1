"""Run an ONNX file with intermediate taps, in memory (``lt.run``, dataset extraction).

No edited file is written: the graph (weights left on disk) gets the extra
outputs in memory, and the runtime (ONNX Runtime, OpenVINO: a
:class:`~layertap.runtimes.base.Runtime` handed in by the caller) opens it from there.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import LayertapError, OnnxFileError, SelectorError, one_line, unknown_name
from ..onnxfile.feeds import make_feeds
from ..onnxfile.modelfile import ModelFile, model_file
from ..onnxfile.ort import SessionSource
from ..onnxfile.outputs import OutputAdder, dedupe
from ..selectors import Tap
from .base import Runtime


class TappedSession:
    """One engine of ``runtime`` on ``path`` with ``taps`` exposed in memory.

    Build it once and call :meth:`run` for many inputs (dataset extraction);
    ``lt.run`` is one such call. ``tap_names`` lists the names the taps give.
    ``runtime``: a :class:`~layertap.runtimes.base.Runtime`; its :meth:`~.base.Runtime.open_tapped`
    opens the graph whose taps were made outputs here (``file``: a file it reads itself, an
    OpenVINO IR, the taps exposed by name).

    Example:
        >>> import os, tempfile, onnx, onnx.helper as h
        >>> g = h.make_graph([h.make_node("Relu", ["x"], ["r"]), h.make_node("Neg", ["r"], ["y"])], "g",
        ...                  [h.make_tensor_value_info("x", 1, [None, 2])], [h.make_tensor_value_info("y", 1, [None, 2])])
        >>> path = os.path.join(tempfile.mkdtemp(), "m.onnx")
        >>> onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8), path)
        >>> from layertap.runtimes import open_runtime
        >>> sess = TappedSession(path, open_runtime("ort"), taps=["r"])
        >>> sess.tap_names, sess.run([np.array([[-1.0, 2.0]], np.float32)])["r"]
        (['r'], array([[0., 2.]], dtype=float32))
    """

    def __init__(self, path: "str | os.PathLike | ModelFile", runtime: Runtime, taps: Sequence[str] = (), *,
                 file: Path | None = None) -> None:
        self.path = path.path if isinstance(path, ModelFile) else path
        self.runtime = runtime
        self.mf = mf = model_file(path)
        # the weights go to ORT once, as arrays; the proto keeps only the graph
        self.source = SessionSource(mf.model, mf.folder, move_weights=True, origin=mf.path)
        mf.model = self.source.model
        adder = OutputAdder(mf, self.source)
        self.positions: dict[str, tuple[str, int]] = {}  # a PATH@POS tap's name -> (its whole value's name, POS)
        pairs: list[tuple[str, str]] = []
        plain: set[str] = set()
        for tap in taps:
            got = self._resolve(adder, tap)
            plain.update(n for n, _ in got if _whole(tap) == tap)
            pairs.extend(got)
        self.pairs = dedupe(pairs)
        self.hidden = {whole for whole, _ in self.positions.values()} - plain  # read only to be sliced
        if not self.pairs and not list(adder.outputs):
            raise OnnxFileError(f"'{path}' has no graph outputs, so there is nothing to run; pass --tap NAME to pick tensors")
        self.own = list(adder.outputs)
        self.added = adder.apply(self.pairs)
        self.carried = adder.carried  # branch tensors: an empty value means their branch did not run
        self.tap_names = list(dict.fromkeys([*(n for n, _ in self.pairs if n not in self.hidden), *self.positions]))
        try:
            # ``file``: a file the runtime reads itself (an OpenVINO IR, ``mf`` its tensor names)
            tensors = list(dict.fromkeys(t for _, t in self.pairs))
            self.session = runtime.open(file, tensors) if file is not None else runtime.open_tapped(self.source, tensors)
        except LayertapError:
            raise
        except Exception as e:  # noqa: BLE001 - ORT's own message, one line
            raise OnnxFileError(f"{runtime.describe().runtime} cannot load '{self.path}': {one_line(e)}") from None

    def _resolve(self, adder: OutputAdder, text: str) -> list[tuple[str, str]]:
        """A tap's (name, tensor) pairs; a ``PATH@POS`` tap reads PATH's whole value, sliced in :meth:`run`."""
        whole = _whole(text)
        pairs = _resolve_tap(adder, whole)
        if whole != text:
            tap = Tap.parse(text)
            assert tap.pos is not None  # _whole changed only a tap with a position
            for name, _ in pairs:
                self.positions[tap.name if len(pairs) == 1 else f"{name}@{tap.pos}"] = (name, tap.pos)
        return pairs

    def run(
        self, inputs: Mapping[str, Any] | Sequence[Any] | None = None, *, seed: int = 0, notify: Callable[[str], None] | None = None,
        flatten: bool = True,
    ) -> dict[str, Any]:
        """The model's outputs (a single one named ``output``), then each tap; a sequence-valued one is the list of
        its tensors, or, with ``flatten`` (arrays for a file), its elements ``NAME[0]``, ``NAME[1]``, ...
        (:func:`flatten_sequences`)."""
        sess, path = self.session, self.path
        feeds = make_feeds(sess, self.mf.model.graph, inputs, seed, folder=self.mf.folder)
        if feeds.note() and notify is not None:
            notify(feeds.note() or "")
        try:
            got = sess.run(None, feeds.arrays)
        except Exception as e:  # noqa: BLE001
            on = f" on generated inputs ({', '.join(feeds.generated)})" if feeds.generated else ""
            hint = (f"; pass the inputs it needs, e.g. {feeds.options()} with the sizes it expects, or NAME=FILE.npy"
                    if feeds.generated else "")
            raise OnnxFileError(f"{self.runtime.describe().runtime} failed to run '{path}'{on}: {one_line(e)}{hint}") from None
        result: dict[str, Any] = {}
        for name in self.own:
            key = "output" if len(self.own) == 1 and "output" not in self.added else name
            result[key] = got[name]
        tensor_of = dict(self.pairs)
        for name in self.added:  # an alias the runtime does not know by name: its tensor
            result[name] = got[name] if name in got else got[tensor_of[name]]
        for name, tensor in self.pairs:  # a tap on a graph output: also under the tap's own name
            if name not in result:
                result[name] = got[name if name in got else tensor]
        for name, (whole, pos) in self.positions.items():
            result[name] = _at_position(result[whole], pos, whole)
        self._note_not_run(result, notify)
        shown = {k: v for k, v in result.items() if k not in self.hidden}
        return flatten_sequences(shown, notify) if flatten else shown


    def _note_not_run(self, result: dict[str, Any], notify: Callable[[str], None] | None) -> None:
        """One line per tapped branch tensor that came back empty: its branch did not run."""
        if notify is None or not self.carried:
            return
        for name, tensor in self.pairs:
            value = result.get(name)
            if tensor in self.carried and value is not None and np.size(value) == 0 and name not in self.hidden:
                notify(f"{name!r} is inside {self.carried[tensor]}, which did not run on these inputs "
                       "(an empty value: every dimension 0)")


def flatten_sequences(values: dict[str, Any], notify: Callable[[str], None] | None = None) -> dict[str, np.ndarray]:
    """A sequence-valued output (ORT returns a list) becomes ``NAME[0]``, ``NAME[1]``, ...;
    an empty one gives no value, and ``notify`` a line saying so (what a file of arrays holds: ``run -o``,
    a dataset's shards).

    Example:
        >>> {k: v.shape for k, v in flatten_sequences({"s": [np.zeros(2), np.zeros(3)], "t": np.zeros(())}).items()}
        {'s[0]': (2,), 's[1]': (3,), 't': ()}
        >>> flatten_sequences({"s": []}, print)
        's' is an empty sequence on these inputs: it has no elements (s[0], s[1], ...) to show or save
        {}
    """
    out: dict[str, np.ndarray] = {}
    for name, v in values.items():
        if isinstance(v, (list, tuple)):
            if not v and notify is not None:
                notify(f"{name!r} is an empty sequence on these inputs: it has no elements ({name}[0], {name}[1], ...) "
                       "to show or save")
            out.update((f"{name}[{i}]", np.asarray(e)) for i, e in enumerate(v))
        else:
            out[name] = v
    return out


def _whole(text: str) -> str:
    """A ``PATH@POS`` tap's text without its position (any other text unchanged)."""
    try:
        tap = Tap.parse(text)
    except SelectorError:
        return text
    return text if tap.pos is None else tap.with_pos(None).canonical


def _at_position(value: np.ndarray, pos: int, name: str) -> np.ndarray:
    """Token position ``pos`` of a ``[batch, sequence, hidden]`` value (negative: from the end).

    Example:
        >>> _at_position(np.arange(6.0).reshape(1, 3, 2), -1, "h").tolist()
        [[4.0, 5.0]]
    """
    if np.ndim(value) != 3:
        shape = "x".join(map(str, np.shape(value)))
        raise OnnxFileError(f"tap {name}@{pos}: a token position is read along axis 1 of a [batch, sequence, hidden] "
                            f"value, and {name!r} is {shape or 'a scalar'}; tap {name!r} and index its value")
    length = value.shape[1]
    if not -length <= pos < length:
        raise OnnxFileError(f"token position {pos} is outside the sequence {name!r} holds (0..{length - 1}, "
                            f"or -{length}..-1 from the end)")
    return value[:, pos]


def _resolve_tap(adder: OutputAdder, text: str) -> list[tuple[str, str]]:
    """Export-recorded names and graph outputs first, then modules, then tensor names."""
    recorded = {r["name"] for r in adder.mf.taps_metadata()}
    if text in adder.outputs or text in recorded:
        if text not in adder.outputs:
            raise OnnxFileError(f"tap {text!r} is recorded by lt.export but is not an output of this file")
        return [(text, text)]
    try:
        tap = _parse(text)
    except SelectorError:
        tap = None
    if tap is not None and adder.scopes.source != "none" and adder.scopes.calls(tap.path):
        return adder.resolve_scoped(tap)
    if text in adder.known_tensors():
        adder.note_quantized(text)
        return [(text, text)]
    if adder.carry(text) is not None:
        return [(text, text)]
    scoped = adder.scopes.source != "none"
    if tap is not None and scoped and ("." in tap.path or tap.call is not None or tap.port == "input"):
        return adder.resolve_scoped(tap)  # raises the module error with close matches
    where = adder.nested_location(text)
    if where:
        raise OnnxFileError(f"tensor {text!r} is {where}; only tensors of the main graph can be tapped")
    pool = sorted(adder.known_tensors() | set(adder.branch_tensors()) | set(adder.scopes.modules()) | recorded)
    hint = "" if scoped or tap is None else (
        "this file carries no module scopes (no torch.onnx dynamo metadata, no TorchScript-style node names), so "
        "module paths cannot be resolved; tap tensors by name (layertap layers FILE.onnx lists them)")
    raise OnnxFileError(unknown_name("tap (module or tensor)", text, pool, hint=hint))


def _parse(text: str) -> Tap:
    return Tap.parse(text)
