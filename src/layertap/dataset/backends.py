"""What runs a batch: a PyTorch module with taps, an ONNX file in ONNX Runtime (or another graph runtime),
or a program in the runtime that made it (its taps: those it was exported with).

Each takes a batched input (an array, or a dict name -> array) and returns
name -> float/int numpy array with the batch first, for the taps only. The
file backends never import torch; a backend is built from a picklable
:class:`BackendSpec`, so each Ray actor builds its own model once.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import LayertapError, one_line, unknown_name
from ..options import Model
from ..runtimes import open_runtime, plugin_for
from ..runtimes.plugins import a_program


@dataclass
class BackendSpec:
    """How to build a backend anywhere (in this process, a DataLoader worker, a Ray actor).

    Attributes:
        model: an ``nn.Module``, a MODEL spec text, or a path to an ``.onnx`` file.
        taps: selector texts (ONNX: module selectors or tensor names).
        method, stop_early, device: PyTorch options.
        weights, config, unsafe_pickle, weights_key, weights_strict: MODEL spec options (see
            ``layertap.pytorch.models.load_model``).
        runtime: what runs an ONNX file: ``{"runtime": "ort"|"openvino", "ov_precision": ..., "ov_device": ...}``
            (only the keys given; :func:`layertap.runtimes.open_runtime`'s keywords).
    """

    model: Any
    taps: list[str]
    method: str | Callable[..., Any] = "forward"
    stop_early: bool = False
    device: str = "cpu"
    weights: str | None = None
    config: str | None = None
    unsafe_pickle: bool = False
    weights_key: str | None = None
    weights_strict: bool = True
    runtime: dict[str, Any] = field(default_factory=dict)
    _info: Any = field(default=None, repr=False)

    @property
    def is_onnx(self) -> bool:
        """The model is a file a runtime runs (an ``.onnx`` file, or a program): no torch in this process."""
        return is_file(self.model)

    def build(self) -> "TorchBackend | OnnxBackend | ProgramBackend":
        """The backend, with its model loaded (once)."""
        program = plugin_for(self.model) if self.is_onnx else None
        if program is not None and program.form == "program":
            if self.runtime.get("runtime", program.name) != program.name or set(self.runtime) - {"runtime"}:
                raise LayertapError(f"'{self.model}' is {a_program(program)}: it runs in {program.title} only "
                                    "(drop --runtime, --ov-precision and --ov-device)")
            return ProgramBackend(Path(self.model), self.taps, program)
        if self.is_onnx:
            return OnnxBackend(Path(self.model), self.taps, self.runtime)
        return TorchBackend(self)

    def describe(self) -> dict:
        """The model as the manifest records it (enough to refuse a resume on another model)."""
        if self.is_onnx:
            path = Path(self.model).resolve()
            ran = {"runtime": self.runtime} if self.runtime.get("runtime", "ort") != "ort" else {}
            kind = "onnx" if path.suffix.lower() == ".onnx" else str(getattr(plugin_for(path), "name", "file"))
            return {"backend": kind, "spec": str(path), "bytes": path.stat().st_size if path.exists() else None, **ran}
        if isinstance(self.model, str):
            # recorded only when given, so earlier manifests still resume
            chosen = {**({"weights_key": self.weights_key} if self.weights_key else {}),
                      **({} if self.weights_strict else {"weights_strict": False})}
            return {"backend": "pytorch", "spec": self.model, "weights": self.weights, **chosen, "config": self.config,
                    "method": self.method, "stop_early": self.stop_early}
        from ..pytorch.values import method_name

        cls = type(self.model)
        return {"backend": "pytorch", "spec": f"{cls.__module__}.{cls.__qualname__}", "params_sha256": _params_digest(self.model),
                "method": method_name(self.method), "stop_early": self.stop_early}


def _params_digest(model: Any) -> str:
    """A digest of the state dict, so a resume with other weights is refused."""
    import torch

    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        t = t.detach().cpu().contiguous().reshape(-1)
        h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def tap_keys(names: Sequence[str], taps: Sequence[Any]) -> list[str]:
    """The captured names that belong to taps (``lt.extract`` adds the model's ``output``)."""
    root = any(t.path == "" for t in taps)
    return [n for n in names if root or not (n == "output" or n.startswith("output["))]


class TorchBackend:
    """``lt.extract`` on each batch under ``torch.inference_mode``, on ``cpu`` or ``cuda``."""

    kind = "pytorch"

    def __init__(self, spec: BackendSpec) -> None:
        import torch

        from ..selectors import parse_taps  # noqa: PLC0415 -- layertap --help loads this module; selectors load on use

        self.torch = torch
        self.spec = spec
        self.taps = parse_taps(spec.taps)
        self.device = check_device(torch, spec.device)
        self.model = _load_torch_model(spec).to(self.device).eval()

    def run(self, batch: Any) -> dict[str, np.ndarray]:
        """name -> array (batch first) for one batched input."""
        from ..pytorch.taps import extract
        from ..pytorch.values import tensor_to_numpy

        torch = self.torch
        args, kwargs = ((), {k: self._tensor(v) for k, v in batch.items()}) if isinstance(batch, dict) else ((self._tensor(batch),), {})
        with torch.inference_mode():
            try:
                values = extract(self.model, *args, taps=self.taps, method=self.spec.method, stop_early=self.spec.stop_early, **kwargs)
            except LayertapError:
                raise
            except Exception as e:  # noqa: BLE001 - user models raise anything on bad inputs
                raise LayertapError(f"the model failed on a batch of {_describe(batch)}: "
                                    f"{type(e).__name__}: {one_line(e, first=True)}") from None
        return {k: tensor_to_numpy(values[k]) for k in tap_keys(list(values), self.taps)}

    def _tensor(self, a: np.ndarray):
        t = self.torch.from_numpy(np.ascontiguousarray(a))
        return t.to(self.device, non_blocking=True) if self.device.type != "cpu" else t


def pin_threads(n: int | None) -> int | None:
    """Set PyTorch's intra-op thread count to ``n``; return the count before (None when ``n`` is None).

    A convolution split over 2 threads sums in another order than over 1, so
    values differ in the last bits: the local engine, Ray actors (which Ray
    starts with ``OMP_NUM_THREADS=1``) and resumed runs all pin the count the
    manifest records.
    """
    if n is None:
        return None
    import torch

    before = torch.get_num_threads()
    if before != n:
        torch.set_num_threads(n)
    return before


def check_device(torch: Any, name: str):
    """``torch.device(name)`` for ``cpu`` / ``cuda[:N]``, or a one-line error (no GPU, bad name)."""
    if name not in ("cpu", "cuda") and not name.startswith("cuda:"):
        raise LayertapError(f"unknown --device {name!r}; use cpu or cuda (cuda:N)")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise LayertapError(f"--device {name}: no CUDA device is available here (torch.cuda.is_available() is False); use --device cpu")
    return torch.device(name)


def _load_torch_model(spec: BackendSpec):
    from torch import nn

    if isinstance(spec.model, nn.Module):
        return spec.model
    if not isinstance(spec.model, str):
        raise LayertapError(f"model must be an nn.Module, a MODEL spec or an .onnx path, got a {type(spec.model).__name__}")
    from ..pytorch.reference import load

    loaded = load(Model(spec.model, weights=spec.weights, weights_key=spec.weights_key, weights_strict=spec.weights_strict,
                        config=spec.config, unsafe_pickle=spec.unsafe_pickle))
    spec._info = loaded.info
    return loaded.module


class OnnxBackend:
    """One engine (ONNX Runtime, or the runtime ``runtime`` names) for the whole run, the taps
    exposed in memory (as ``lt.run``)."""

    kind = "onnx"

    def __init__(self, path: Path, taps: Sequence[str], runtime: dict[str, Any] | None = None) -> None:
        from ..runtimes.runner import TappedSession  # noqa: PLC0415 -- layertap --help loads this module; the runner loads on use

        if not path.is_file():
            raise LayertapError(f"ONNX file '{path}' does not exist")
        self.session = TappedSession(path, open_runtime(**(runtime or {})), list(taps))
        self.names = self.session.tap_names
        first = self.session.session.get_inputs()
        self.inputs = [i.name for i in first]
        # A file exported with a fixed batch of 1 still works: one sample per run.
        shape = first[0].shape if first else None
        self.one_at_a_time = shape is not None and len(shape) > 0 and shape[0] == 1

    def run(self, batch: Any) -> dict[str, np.ndarray]:
        """name -> array (batch first) for one batched input."""
        n = len(next(iter(batch.values()))) if isinstance(batch, dict) else len(batch)
        if self.one_at_a_time and n > 1:
            parts = [self.run(_take(batch, i)) for i in range(n)]
            return {k: np.concatenate([p[k] for p in parts]) for k in self.names}
        given = sorted(batch) if isinstance(batch, dict) else [""]
        if given != sorted(self.inputs) and not (given == [""] and len(self.inputs) == 1):
            what = "one array" if given == [""] else ", ".join(given)
            raise LayertapError(f"the samples give {what}, but '{self.session.path}' takes the inputs {', '.join(self.inputs)}; "
                                "use .npz samples with one array per input name")
        got = self.session.run(batch if isinstance(batch, dict) else [batch])
        return {k: got[k] for k in self.names}


class ProgramBackend:
    """A program in the runtime that made it (a ``"program"`` plug-in's engine): the taps are outputs it was
    exported with. A program runs at the batch size it was lowered for, so a batch is run in chunks of it."""

    kind = "program"

    def __init__(self, path: Path, taps: Sequence[str], runtime: Any) -> None:
        self.engine = runtime.engine(path)
        self.path, self.names = path, list(dict.fromkeys(taps))
        outputs = self.engine.output_names()
        for t in self.names:
            if t not in outputs:
                raise LayertapError(unknown_name("tap", t, outputs, hint="a program hands out the taps it was exported "
                                                 "with; list them with layertap layers " + path.name))
        first = self.engine.get_inputs()
        self.inputs = [i.name for i in first]
        dims = first[0].shape if first and first[0].shape else [1]
        self.chunk = int(dims[0]) if isinstance(dims[0], int) and dims[0] > 0 else 1

    def run(self, batch: Any) -> dict[str, np.ndarray]:
        """name -> array (batch first) for one batched input, run in chunks of the program's batch."""
        n = len(next(iter(batch.values()))) if isinstance(batch, dict) else len(batch)
        if n % self.chunk:
            raise LayertapError(f"'{self.path}' was lowered for a batch of {self.chunk}; give --batch-size a multiple "
                                f"of it (a batch of {n} came)")
        parts = []
        for i in range(0, n, self.chunk):
            part = {k: v[i: i + self.chunk] for k, v in batch.items()} if isinstance(batch, dict) else \
                {self.inputs[0]: batch[i: i + self.chunk]}
            parts.append(self.engine.run(self.names, part))
        return {k: np.concatenate([p[k] for p in parts]) for k in self.names}


def is_file(model: Any) -> bool:
    """Whether ``model`` names a file a runtime runs (an ``.onnx`` file, or a program such as a ``.pte``), not a
    PyTorch model.

    Example:
        >>> is_file("m.onnx"), is_file("m.pte"), is_file("torchvision:resnet18")
        (True, True, False)
    """
    if not isinstance(model, (str, os.PathLike)):
        return False
    found = plugin_for(model)
    return str(model).lower().endswith(".onnx") or (found is not None and found.form == "program")


def _take(batch: Any, i: int) -> Any:
    return {k: v[i : i + 1] for k, v in batch.items()} if isinstance(batch, dict) else batch[i : i + 1]


def _describe(batch: Any) -> str:
    items = batch.items() if isinstance(batch, dict) else [("", batch)]
    return ", ".join(f"{k + '=' if k else ''}{'x'.join(map(str, v.shape))} {v.dtype}" for k, v in items)
