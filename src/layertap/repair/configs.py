"""What ``layertap fix`` aims for and what it writes: the target (``cosine:0.999``, ``rel:1e-2``,
``sqnr:30``, ``top1:0.99``) measured on a model's outputs over every sample, and the kept set in
each toolchain's form (``--config-out DIR``). Numpy only."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import LayertapError
from ..files.writes import atomic_write_bytes
from ..metrics import error_stats, similarity
from .convert import FP16_OPTIONS

TARGETS = ("cosine", "rel", "sqnr", "top1")
# file name -> what it holds (written by :func:`write_configs`)
CONFIG_FILES = ("modules.json", "onnxconverter_common.json", "ort_quantization.json", "polygraphy.txt", "modelopt.json")


@dataclass(frozen=True)
class Target:
    """A target on the model's outputs: ``metric`` over every sample must reach ``value``
    (``rel`` at most ``value``, the others at least).

    Example:
        >>> t = Target.parse("cosine:0.999")
        >>> t.met(0.9995), t.met(0.99), Target.parse("rel:1e-2").met(0.005)
        (True, False, True)
    """

    metric: str
    value: float

    @classmethod
    def parse(cls, text: "str | Target") -> "Target":
        """``METRIC:VALUE``; a wrong metric or value is a one-line error naming the forms."""
        if isinstance(text, Target):
            return text
        metric, _, value = str(text).partition(":")
        metric = metric.strip().lower()
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if metric not in TARGETS or not math.isfinite(number):
            raise LayertapError(f"bad target {text!r}; use METRIC:VALUE with METRIC one of {', '.join(TARGETS)} "
                                "(cosine:0.999, rel:1e-2, sqnr:30, top1:0.99)")
        return cls(metric, number)

    def met(self, value: float) -> bool:
        """Whether a measured ``value`` reaches the target."""
        if math.isnan(value):
            return False
        return value <= self.value if self.metric == "rel" else value >= self.value

    def better(self, a: float, b: float) -> bool:
        """Whether ``a`` is strictly closer to the reference than ``b``."""
        if math.isnan(b):
            return not math.isnan(a)
        return a < b if self.metric == "rel" else a > b

    def measure(self, refs: Sequence[Sequence[np.ndarray]], gots: Sequence[Sequence[np.ndarray]]) -> float:
        """The metric over every sample (the worst sample's value; ``top1``: the share of
        samples whose arg-max over the last axis of the first output agrees everywhere)."""
        if self.metric == "top1":
            same = [bool(np.array_equal(np.argmax(r[0], axis=-1), np.argmax(g[0], axis=-1))) for r, g in zip(refs, gots)]
            return float(np.mean(same)) if same else math.nan
        values = [self._one(r, g) for rs, gs in zip(refs, gots) for r, g in zip(rs, gs)]
        if not values:
            return math.nan
        return max(values) if self.metric == "rel" else min(values)

    def _one(self, ref: np.ndarray, got: np.ndarray) -> float:
        got = np.asarray(got, dtype=np.float32) if got.dtype != ref.dtype else got
        if self.metric == "rel":
            return error_stats(ref, got).rel_err
        cosine, sqnr, _ = similarity(ref, got)
        return cosine if self.metric == "cosine" else sqnr

    def __str__(self) -> str:
        return f"{self.metric}:{self.value:.10g}"


def write_configs(folder: str | os.PathLike, modules: Sequence[str], nodes: Sequence[str], to: str) -> list[Path]:
    """The kept set in each toolchain's form, each file written atomically; returns the paths.

    Example:
        >>> import tempfile
        >>> paths = write_configs(tempfile.mkdtemp(), ["fc"], ["/fc/Gemm"], "fp16")
        >>> [p.name for p in paths][:2], json.loads(paths[1].read_text())["node_block_list"]
        (['modules.json', 'onnxconverter_common.json'], ['/fc/Gemm'])
    """
    root = Path(folder)
    if not root.is_dir():
        raise LayertapError(f"--config-out '{root}' is not a folder; create it first")
    names = list(nodes)
    texts = {
        "modules.json": _json({"precision": "float32", "modules": list(modules), "converted_to": to}),
        "onnxconverter_common.json": _json({**FP16_OPTIONS, "node_block_list": names}),
        "ort_quantization.json": _json({"quant_format": "QDQ", "nodes_to_exclude": names}),
        "polygraphy.txt": "# polygraphy run/convert MODEL.onnx --fp16 --int8 $(grep -v '^#' polygraphy.txt)\n"
                          "--precision-constraints obey\n"
                          + "".join(f"--layer-precisions {n}:float32\n" for n in names[:1])
                          + "".join(f"{n}:float32\n" for n in names[1:]),
        "modelopt.json": _json({"quantize_mode": to, "nodes_to_exclude": names}),
    }
    out = []
    for name in CONFIG_FILES:
        atomic_write_bytes(root / name, texts[name].encode())
        out.append(root / name)
    return out


def _json(obj: object) -> str:
    return json.dumps(obj, indent=1) + "\n"
