"""``lt.run``: run an ONNX file in ONNX Runtime with intermediate taps, in memory.

No edited file is written: the graph (weights left on disk) gets the extra
outputs in memory, is serialised to bytes, and ONNX Runtime reads the external
weights from the model's own folder.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import InputSpecError, OnnxFileError, SelectorError, unknown_name
from ..inputs import InputSpec, random_array
from .modelfile import load_model
from .ort import ORT_NUMPY, ort_session
from .outputs import OutputAdder


def run(
    path: str | os.PathLike,
    inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray] | None = None,
    taps: Sequence[str] = (),
    *,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Run ``path`` in ONNX Runtime (CPU); return the model outputs and the taps.

    ``inputs``: dict name -> array, a list in input order, or ``None`` for
    seeded random data from the model's own input shapes and dtypes (symbolic
    dims set to 1; a dict may leave inputs out, they get random data too).
    ``taps``: module selectors (``layer3.1``, ``layer2.0.relu#1``), tensor names,
    or names recorded by ``lt.export``. The result holds the model's outputs
    first (a single output is named ``output``), then each tap.

    Example:
        >>> import layertap as lt
        >>> acts = lt.run("resnet18.onnx", taps=["layer3.1"])   # doctest: +SKIP
        >>> list(acts), acts["layer3.1"].shape                   # doctest: +SKIP
        (['output', 'layer3.1'], (1, 256, 14, 14))
    """
    mf = load_model(path)
    adder = OutputAdder(mf)
    pairs = [p for tap in taps for p in _resolve_tap(adder, tap)]
    if not pairs and not list(adder._outputs):
        raise OnnxFileError(f"'{path}' has no graph outputs, so there is nothing to run; pass --tap NAME to pick tensors")
    own = list(adder._outputs)
    added = adder.apply(pairs)
    try:
        sess = ort_session(mf.model, mf.folder)
    except Exception as e:  # noqa: BLE001 - ORT's own message, one line
        raise OnnxFileError(f"ONNX Runtime cannot load '{path}': {str(e).splitlines()[0]}") from None
    feeds = _feeds(sess, inputs, seed)
    try:
        values = sess.run(None, feeds)
    except Exception as e:  # noqa: BLE001
        raise OnnxFileError(f"ONNX Runtime failed to run '{path}': {str(e).splitlines()[0]}") from None
    got = dict(zip([o.name for o in sess.get_outputs()], values))
    result: dict[str, np.ndarray] = {}
    for name in own:
        key = "output" if len(own) == 1 and "output" not in added else name
        result[key] = got[name]
    for name in added:
        result[name] = got[name]
    for name, tensor in pairs:  # a tap on a graph output: also under the tap's own name
        if name not in result:
            result[name] = got[name if name in got else tensor]
    return result


def _resolve_tap(adder: OutputAdder, text: str) -> list[tuple[str, str]]:
    """Export-recorded names and graph outputs first, then modules, then tensor names."""
    recorded = {r["name"] for r in adder.mf.taps_metadata()}
    if text in adder._outputs or text in recorded:
        if text not in adder._outputs:
            raise OnnxFileError(f"tap {text!r} is recorded by lt.export but is not an output of this file")
        return [(text, text)]
    try:
        tap = _parse(text)
    except SelectorError:
        tap = None
    if tap is not None and adder.scopes.source != "none" and adder.scopes.calls(tap.path):
        return adder.scopes.resolve(tap)
    if text in adder.known_tensors():
        return [(text, text)]
    if tap is not None and adder.scopes.source != "none" and ("." in tap.path or tap.call is not None or tap.port == "input"):
        return adder.scopes.resolve(tap)  # raises the module error with close matches
    where = adder._nested_location(text)
    if where:
        raise OnnxFileError(f"tensor {text!r} is {where}; only tensors of the main graph can be tapped")
    pool = sorted(adder.known_tensors() | set(adder.scopes.modules()) | recorded)
    raise OnnxFileError(unknown_name("tap (module or tensor)", text, pool))


def _parse(text: str):
    from ..selectors import Tap

    return Tap.parse(text)


def _feeds(sess, inputs: Any, seed: int) -> dict[str, np.ndarray]:
    """Arrays per model input; an :class:`~layertap.inputs.InputSpec` value is checked
    against the model's declared input before its data is made or read."""
    specs = sess.get_inputs()
    names = [s.name for s in specs]
    known = set(names)
    if inputs is None:
        given: dict[str, Any] = {}
    elif isinstance(inputs, Mapping):
        given = dict(inputs)
        extra = [k for k in given if k not in known]
        if extra:
            raise InputSpecError(unknown_name("input", extra[0], names, hint=f"the model's inputs are {', '.join(names)}"))
    else:
        seq = list(inputs)
        if len(seq) != len(names):
            raise InputSpecError(f"the model takes {len(names)} input(s) ({', '.join(names)}), got {len(seq)}")
        given = dict(zip(names, seq))
    by_name = {s.name: s for s in specs}
    for name, value in given.items():
        if isinstance(value, InputSpec):
            _check_input(by_name[name], *value.header(), ORT_NUMPY.get(by_name[name].type))
    spec_rng = np.random.default_rng(seed)  # --input specs draw in the order given
    given = {k: v.array(spec_rng) if isinstance(v, InputSpec) else v for k, v in given.items()}
    rng = np.random.default_rng(seed)
    feeds = {}
    for spec in specs:
        dtype = ORT_NUMPY.get(spec.type)
        if spec.name in given:
            arr = np.asarray(given[spec.name])
            arr = arr if arr.dtype.isnative else arr.astype(arr.dtype.newbyteorder("="))
            _check_input(spec, arr.shape, arr.dtype, dtype)
            feeds[spec.name] = arr
        else:
            if dtype is None:
                raise InputSpecError(f"cannot make random data for input {spec.name!r} of type {spec.type}; pass it")
            shape = tuple(d if isinstance(d, int) and d > 0 else 1 for d in (spec.shape or []))
            feeds[spec.name] = random_array(shape, dtype, rng)
    return feeds


def _check_input(spec, shape: tuple[int, ...], got: np.dtype, dtype) -> None:
    want = [d if isinstance(d, int) and d > 0 else None for d in (spec.shape or [])]
    shown = "x".join(str(d) if isinstance(d, int) and d > 0 else str(d or "?") for d in (spec.shape or [])) or "scalar"
    if dtype is not None and got != np.dtype(dtype):
        raise InputSpecError(
            f"input {spec.name!r} must be {np.dtype(dtype).name} with shape {shown}, got {got.name}"
        )
    if len(want) != len(shape) or any(w is not None and w != a for w, a in zip(want, shape)):
        text = "x".join(str(d) for d in shape) or "scalar"
        raise InputSpecError(f"input {spec.name!r} must have shape {shown} ({np.dtype(dtype).name if dtype else spec.type}), got {text}")
