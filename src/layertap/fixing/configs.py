"""What ``layertap fix`` aims for and what it writes: the target (``cosine:0.999``, ``rel:1e-2``,
``sqnr:30``, ``top1:0.99``, ``max_abs:1e-3``) measured on a model's outputs over every sample, and the kept set in
each toolchain's form (``--config-out DIR``), with ``convert.py`` for float16: the converter's
options alone do not restore what :func:`.convert.restore_float32` restores nor make the types
:func:`.convert.retype_float16` repairs. Numpy only."""

from __future__ import annotations

import inspect
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import LayertapError
from ..files.writes import atomic_write_bytes
from ..metrics import error_stats, similarity
from .convert import FP16_OPTIONS, SCRIPT_HELPERS

TARGETS = ("cosine", "rel", "sqnr", "top1", "max_abs")
# the metrics a smaller value of meets (the others: a larger one)
_AT_MOST = ("rel", "max_abs")
_NEAR_ZERO = 2.0**-10  # float16's step at 1: outputs no larger than this on every sample are all but zero
# file name -> what it holds (written by :func:`write_configs`)
CONFIG_FILES = ("modules.json", "onnxconverter_common.json", "ort_quantization.json", "polygraphy.txt", "modelopt.json")
# a file without module scopes keeps ONNX nodes: nodes.json takes modules.json's place


@dataclass(frozen=True)
class Target:
    """A target on the model's outputs: ``metric`` over every sample must reach ``value``
    (``rel`` and ``max_abs``, the largest absolute difference: at most ``value``; the others at least).

    Example:
        >>> t = Target.parse("cosine:0.999")
        >>> t.met(0.9995), t.met(0.99), Target.parse("rel:1e-2").met(0.005), Target.parse("max_abs:1e-3").met(2e-3)
        (True, False, True, False)
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
                                "(cosine:0.999, rel:1e-2, sqnr:30, top1:0.99, max_abs:1e-3)")
        return cls(metric, number)

    def met(self, value: float) -> bool:
        """Whether a measured ``value`` reaches the target."""
        if math.isnan(value):
            return False
        return value <= self.value if self.metric in _AT_MOST else value >= self.value

    def better(self, a: float, b: float) -> bool:
        """Whether ``a`` is strictly closer to the reference than ``b``."""
        if math.isnan(b):
            return not math.isnan(a)
        return a < b if self.metric in _AT_MOST else a > b

    def measure(self, refs: Sequence[Sequence[np.ndarray]], gots: Sequence[Sequence[np.ndarray]]) -> float:
        """The metric over every sample (the worst sample's value; ``top1``: the share of
        samples whose arg-max over the last axis of the first output agrees everywhere)."""
        if self.metric == "top1":
            same = [bool(np.array_equal(np.argmax(r[0], axis=-1), np.argmax(g[0], axis=-1))) for r, g in zip(refs, gots)]
            return float(np.mean(same)) if same else math.nan
        values = [self._one(r, g) for rs, gs in zip(refs, gots) for r, g in zip(rs, gs)]
        if not values:
            return math.nan
        return max(values) if self.metric in _AT_MOST else min(values)

    def _one(self, ref: np.ndarray, got: np.ndarray) -> float:
        got = np.asarray(got, dtype=np.float32) if got.dtype != ref.dtype else got
        if self.metric == "rel":
            return error_stats(ref, got).rel_err
        if self.metric == "max_abs":
            return error_stats(ref, got).max_abs
        cosine, sqnr, _ = similarity(ref, got)
        return cosine if self.metric == "cosine" else sqnr

    def noise(self, refs: Sequence[Sequence[np.ndarray]], to: str) -> str | None:
        """Why this target cannot judge a float16 conversion on these reference outputs, else ``None``: outputs
        near zero on every sample (at most float16's step at 1, 2^-10: a probability map of background, the
        sigmoids of very negative logits) make a cosine, SQNR or relative error a measure of float16's relative
        error in values that are all but zero (a logit off by 0.01 moves such a probability by 1%), not of what
        the conversion changes; the largest difference still judges it.

        Example:
            >>> tiny = [[np.full((1, 4), 1e-4, np.float32)]]
            >>> Target.parse("cosine:0.999").noise(tiny, "fp16")[:46], Target.parse("max_abs:1e-3").noise(tiny, "fp16")
            ('the reference outputs are near zero on every s', None)
        """
        floats = [np.asarray(r) for rs in refs for r in rs if np.issubdtype(np.asarray(r).dtype, np.floating)]
        if to != "fp16" or self.metric not in ("cosine", "sqnr", "rel") or not floats:
            return None
        top = max(float(np.max(np.abs(a), initial=0.0)) for a in floats)
        if top == 0.0 or top > _NEAR_ZERO:
            return None
        return (f"the reference outputs are near zero on every sample (|x| <= {top:.2g}): a {self.metric} there measures "
                "float16's relative error in values that are all but zero, not what the conversion changes; judge the "
                "largest difference you accept instead, --target max_abs:VALUE (e.g. max_abs:1e-3), or give samples on "
                "which the outputs are not zero (--inputs)")

    def __str__(self) -> str:
        return f"{self.metric}:{self.value:.10g}"


def check_config_out(folder: str | os.PathLike) -> Path:
    """``--config-out``: a folder, or a new one inside an existing folder (made when the configs are written).

    Example:
        >>> import tempfile, os
        >>> check_config_out(os.path.join(tempfile.mkdtemp(), "cfg")).name
        'cfg'
    """
    root = Path(folder)
    if root.exists() and not root.is_dir():
        raise LayertapError(f"--config-out '{folder}' is a file; give a folder (made if it does not exist)")
    if not root.exists() and not root.parent.is_dir():
        raise LayertapError(f"--config-out '{folder}': its parent folder '{root.parent}' does not exist; create it first")
    return root


def write_configs(folder: str | os.PathLike, modules: Sequence[str], nodes: Sequence[str], to: str,
                  unit: str = "module") -> list[Path]:
    """The kept set in each toolchain's form, each file written atomically; returns the paths.
    ``unit``: what ``modules`` holds, ``module`` paths (``modules.json``) or ONNX ``node`` names
    of a file without module scopes (``nodes.json``).

    Example:
        >>> import tempfile
        >>> paths = write_configs(tempfile.mkdtemp(), ["fc"], ["/fc/Gemm"], "fp16")
        >>> [p.name for p in paths][:2], json.loads(paths[1].read_text())["node_block_list"]
        (['modules.json', 'onnxconverter_common.json'], ['/fc/Gemm'])
    """
    root = check_config_out(folder)
    root.mkdir(exist_ok=True)
    names = list(nodes)
    texts = {
        f"{unit}s.json": _json({"precision": "float32", f"{unit}s": list(modules), "converted_to": to}),
        "onnxconverter_common.json": _json({**FP16_OPTIONS, "node_block_list": names}),
        "ort_quantization.json": _json({"quant_format": "QDQ", "nodes_to_exclude": names}),
        "polygraphy.txt": "# polygraphy run/convert MODEL.onnx --fp16 --int8 $(grep -v '^#' polygraphy.txt)\n"
                          "--precision-constraints obey\n"
                          + "".join(f"--layer-precisions {n}:float32\n" for n in names[:1])
                          + "".join(f"{n}:float32\n" for n in names[1:]),
        "modelopt.json": _json({"quantize_mode": to, "nodes_to_exclude": names}),
    }
    if to == "fp16":
        texts["convert.py"] = convert_script()
    out = []
    for name in texts:
        atomic_write_bytes(root / name, texts[name].encode())
        out.append(root / name)
    return out


def convert_script() -> str:
    """``convert.py``: onnxconverter-common with ``onnxconverter_common.json``, then the same steps
    ``fix`` runs after it (:func:`.convert.restore_float32`, :func:`.convert.retype_float16`, their
    source copied in). Imports onnx and onnxconverter-common only.

    Example:
        >>> text = convert_script()
        >>> "def restore_float32(" in text and "def retype_float16(" in text and "node_block_list" in text
        True
    """
    helpers = "\n\n".join(inspect.getsource(f) for f in SCRIPT_HELPERS)
    return _CONVERT_PY.replace("# HELPERS", helpers)


def check_script(folder: str | os.PathLike, ref: Path, fixed: Path, scratch: Path) -> str:
    """Run ``convert.py`` in a fresh interpreter on ``ref`` and compare its file with ``fixed`` byte
    for byte; returns a line for the report (a mismatch or a failure is said, never hidden)."""
    made = scratch / "convert_check.onnx"
    cmd = [sys.executable, "-I", "convert.py", str(Path(ref).absolute()), str(made)]
    proc = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0 or not made.is_file():
        said = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[-1]
        return f"convert.py failed (exit {proc.returncode}): {said}"
    if made.read_bytes() != Path(fixed).read_bytes():
        return "convert.py's file differs from FIXED.onnx (checked): use FIXED.onnx"
    return f"{Path(folder) / 'convert.py'} makes FIXED.onnx again (checked); {proc.stdout.strip()}"


def _json(obj: object) -> str:
    return json.dumps(obj, indent=1) + "\n"


_CONVERT_PY = '''"""Make FIXED.onnx again: REF converted to float16 by onnxconverter-common with the options and
node_block_list of onnxconverter_common.json (a weight the kept nodes share with others copied for them
first, so each side keeps its own type), then the float32 weights and outputs of the kept nodes
restored (the converter rounds and clamps them at max_finite_val, and casts a kept node's model
output to float16), and the types it leaves disagreeing repaired (ONNX Runtime refuses the file
otherwise): value_info entries that repeat a model output's declaration are dropped first; nodes
that read a model output (a tap) read its float16 tensor, not the float32 copy made for the
output; nodes whose type an attribute fixes (a Cast to float, a ConstantOfShape without value)
make the float16 it declares. Those options alone do not make FIXED.onnx when a step changes
something.

    python convert.py REF.onnx FIXED.onnx

Needs onnx and onnxconverter-common only.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import onnx
from onnxconverter_common import float16


# HELPERS


def main(argv):
    if len(argv) != 3:
        print(__doc__)
        return 2
    options = json.loads((Path(__file__).resolve().parent / "onnxconverter_common.json").read_text())
    model = onnx.load(argv[1])
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    retyped = outputs_declared_once(copy)
    unshared = unshare_weights(copy, options["node_block_list"])
    converted = float16.convert_float_to_float16(copy, **options)
    restored = restore_float32(model, converted, options["node_block_list"])
    retyped += retype_float16(converted, options["node_block_list"], options.get("op_block_list"))
    onnx.save(converted, argv[2])
    print(f"float32 restored: {_some(restored)}; types repaired: {_some(retyped)}; weights copied for kept nodes: "
          f"{_some(unshared)}")
    return 0


def _some(names):
    more = f" (+{len(names) - 3})" if len(names) > 3 else ""
    return f"{', '.join(names[:3]) or 'nothing'}{more}"


if __name__ == "__main__":
    sys.exit(main(sys.argv))
'''
