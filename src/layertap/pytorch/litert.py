"""LiteRT conversion of a PyTorch model (imported only for a ``.tflite``): the recipe a program is converted by,
and the conversion itself, shared by ``lt.export`` (:mod:`layertap.exporting.litert`), ``compare`` (the model
converted again with a tap at every module) and ``fix`` (int8 with modules kept float32).

The model, wrapped with its taps (:class:`~.lowering.Tapped`: the method's result flattened, then each tapped
tensor, each value once), returns a dict keyed by output name, so ``litert-torch`` names the program's signature
outputs by layertap's names (``layer1``, ``relu#0``, ``fc:input``). Quantisation is AI Edge Quantizer's, run on
the float program: ``int8`` is its ``static_wi8_ai8`` recipe (int8 weights per channel, int8 activations
calibrated on samples), ``dynamic`` its ``dynamic_wi8_afp32``; modules kept float32 are recipe entries with
``no_quantize`` whose ``regex`` matches the location names ``litert-torch`` gives the ops of that module
(``.../torch.nn.modules.conv.Conv2d_conv1/...``).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from ..errors import LayertapError, missing_litert, one_line, unknown_name
from ..noise import quiet_native_stderr, quiet_registrations
from ..numformats import Format
from .callhooks import CallHooks
from .taps import bound_method, output_tensors
from .wrapper import TapWrapper

#: the quantisations ``--quantize`` names for a ``.tflite``
QUANTIZE = ("int8", "dynamic")
#: the one signature layertap writes and runs
SIGNATURE = "serving_default"


@dataclass
class Conversion:
    """How a program is converted: its quantisation, the calibration samples (static int8) and the modules kept
    float32.

    Example:
        >>> Conversion("int8", keep_float=["fc"]).record()
        {'converter': 'litert-torch', 'quantize': 'int8', 'keep_float': ['fc']}
    """

    quantize: str | None = None
    calibration: list[tuple] = field(default_factory=list)
    keep_float: Sequence[str] = ()
    #: module path -> the program outputs that are its value (:func:`output_owners`): kept by name too
    outputs: Mapping[str, Sequence[str]] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """The sidecar's ``recipe``."""
        return {"converter": "litert-torch", "quantize": self.quantize, "keep_float": list(self.keep_float)}

    def check(self) -> "Conversion":
        if self.quantize is not None and self.quantize not in QUANTIZE:
            raise LayertapError(unknown_name("quantisation", str(self.quantize), list(QUANTIZE)))
        return self


def location_regex(path: str) -> str:
    """The AI Edge Quantizer ``regex`` that matches the ops of module ``path``: ``litert-torch`` names each op by
    the modules it ran in, one ``Class_attribute`` segment per level.

    Example:
        >>> bool(re.search(location_regex("layer1.0.conv1"),
        ...                "W/m.M_model/torch.nn.Sequential_layer1/m.Block_0/torch.nn.Conv2d_conv1;1"))
        True
        >>> bool(re.search(location_regex("layer1.0.conv1"), "W/m.M_model/torch.nn.Sequential_layer1/m.Block_0/x.Conv2d_conv10"))
        False
    """
    parts = [rf"[^/;]*_{re.escape(p)}" for p in path.split(".")]
    return "/".join(parts) + r"(?:[/;]|$)"


def aeq_recipe(quantize: str, keep_float: Sequence[str] = (), outputs: Mapping[str, Sequence[str]] | None = None
               ) -> list[dict[str, Any]]:
    """The AI Edge Quantizer recipe (its own JSON form) for ``quantize`` with the modules ``keep_float`` kept
    float32 (later entries win in AI Edge Quantizer). ``outputs``: module path -> the program outputs its value
    is (:func:`output_owners`): an op whose output is the signature's is named by it, not by its modules.

    Example:
        >>> [e["algorithm_key"] for e in aeq_recipe("int8", ["fc"])]
        ['min_max_uniform_quantize', 'no_quantize']
    """
    weights = {"num_bits": 8, "symmetric": True, "granularity": "CHANNELWISE", "dtype": "INT"}
    if quantize == "int8":
        config: dict[str, Any] = {"activation_tensor_config": {"num_bits": 8, "symmetric": False,
                                                               "granularity": "TENSORWISE", "dtype": "INT"},
                                  "weight_tensor_config": weights, "compute_precision": "INTEGER",
                                  "explicit_dequantize": False}
    else:  # dynamic: int8 weights, activations quantised as the kernels run
        config = {"weight_tensor_config": weights, "compute_precision": "INTEGER", "explicit_dequantize": False}
    recipe = [{"regex": ".*", "operation": "*", "algorithm_key": "min_max_uniform_quantize", "op_config": config}]
    for p in keep_float:
        names = [re.escape(f"{SIGNATURE}_{n}_output") for n in (outputs or {}).get(p, ())]
        # AI Edge Quantizer reads an op's scope as its output names, each followed by ";"
        regex = location_regex(p) if not names else f"(?:{location_regex(p)}|^(?:{'|'.join(names)})(?:;|$))"
        recipe.append({"regex": regex, "operation": "*", "algorithm_key": "no_quantize"})
    return recipe


def output_owners(model: nn.Module, method: Any, args: tuple) -> dict[str, list[str]]:
    """Module path -> the model's outputs (by name: ``output``, ``output[0]``) that are that module's own output
    tensor (the last module a value came out of)."""
    return _Returns.run(model, method, args, {}).owners


def module_outputs(model: nn.Module, method: Any, args: tuple, kwargs: Mapping[str, Any] | None = None
                   ) -> tuple[dict[tuple[str, int], tuple[int, ...] | None], dict[str, str], dict[str, list[str]]]:
    """What a program's tensors are matched against, from one forward: each module call's output shape (``None``:
    not one floating tensor), in the order calls return; each module's class as litert-torch writes it in its
    location names (the class's module and qualified name); and the model's outputs each module owns
    (:func:`output_owners`).

    Example:
        >>> m = nn.Sequential(nn.Linear(4, 3), nn.ReLU()).eval()
        >>> shapes, classes, owners = module_outputs(m, "forward", (torch.ones(2, 4),))
        >>> shapes, classes["1"], owners
        ({('0', 0): (2, 3), ('1', 0): (2, 3)}, 'torch.nn.modules.activation.ReLU', {'1': ['output']})
    """
    seen = _Returns.run(model, method, args, dict(kwargs or {}))
    classes = {p: f"{type(m).__module__}.{type(m).__qualname__}" for p, m in model.named_modules()}
    return seen.shapes, classes, seen.owners


class _Returns(CallHooks):
    """What one forward's module calls returned: each call's output shape (one floating tensor, else ``None``),
    and the last module to return each tensor (the outermost), by storage and shape: outputs come back as
    views."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self.shapes: dict[tuple[str, int], tuple[int, ...] | None] = {}
        self.returned: dict[tuple[int, tuple[int, ...]], str] = {}
        self.owners: dict[str, list[str]] = {}

    @staticmethod
    def key(t: torch.Tensor) -> tuple[int, tuple[int, ...]]:
        return t.data_ptr(), tuple(t.shape)

    def on_return(self, mod: Any, path: str, call: int, output: Any) -> None:
        one = isinstance(output, torch.Tensor) and output.is_floating_point()
        self.shapes[(path, call)] = tuple(output.shape) if one else None
        if isinstance(output, torch.Tensor) and path:
            self.returned[self.key(output)] = path

    @classmethod
    def run(cls, model: nn.Module, method: Any, args: tuple, kwargs: dict[str, Any]) -> "_Returns":
        """The model run once with these hooks, the owners of its outputs filled."""
        seen = cls(model)
        with seen.hooks(), torch.no_grad():
            out = bound_method(model, method)(*args, **kwargs)
        for name, value in output_tensors(out).items():
            if seen.key(value) in seen.returned:
                seen.owners.setdefault(seen.returned[seen.key(value)], []).append(name)
        return seen


class _Named(nn.Module):
    """The tap wrapper returning a dict by output name: ``litert-torch`` names signature outputs by its keys."""

    def __init__(self, wrapper: TapWrapper, names: list[str]) -> None:
        super().__init__()
        self.wrapper, self.names = wrapper, names

    def forward(self, *tensors: torch.Tensor) -> dict[str, torch.Tensor]:
        return dict(zip(self.names, self.wrapper(*tensors)))


@contextlib.contextmanager
def quiet_converter() -> Iterator[None]:
    """litert-torch's progress lines, AI Edge Quantizer's prints and the runtime's native log lines, off for
    the block."""
    before = os.environ.get("LITERT_TORCH_SHOW_PROGRESS")
    os.environ["LITERT_TORCH_SHOW_PROGRESS"] = "n"
    try:
        with quiet_registrations(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()), quiet_native_stderr(), warnings.catch_warnings():
            # the calibrator keeps every tensor of the interpreter on purpose; LiteRT warns about it
            warnings.filterwarnings("ignore", message=".*experimental_preserve_all_tensors.*")
            yield
    finally:
        if before is None:
            os.environ.pop("LITERT_TORCH_SHOW_PROGRESS", None)
        else:
            os.environ["LITERT_TORCH_SHOW_PROGRESS"] = before


def convert(wrapper: TapWrapper, example: tuple, names: list[str], conversion: Conversion,
            input_names: Sequence[str]) -> bytes:
    """``wrapper(*example)`` converted by litert-torch, its outputs named ``names``, quantised as ``conversion``
    says (calibrated on its samples, fed by ``input_names``): the program's bytes.

    Raises:
        LayertapError: litert-torch is missing, or a step failed (one line naming the step and the error).
    """
    try:
        with quiet_converter():
            import litert_torch  # noqa: PLC0415 -- optional: the litert extra
    except ImportError:
        raise missing_litert() from None
    with tempfile.TemporaryDirectory(prefix="layertap-litert-") as work, torch.no_grad():
        path = Path(work) / "float.tflite"
        with quiet_converter():
            converted = _step("litert-torch conversion", lambda: litert_torch.convert(_Named(wrapper, names).eval(),
                                                                                      tuple(example)))
            _step("writing the program", lambda: converted.export(str(path)))
        buffer = path.read_bytes()
    if conversion.quantize:
        buffer = quantize(buffer, conversion, input_names)
    return buffer


def quantize(buffer: bytes, conversion: Conversion, input_names: Sequence[str]) -> bytes:
    """A float program quantised by AI Edge Quantizer as ``conversion`` says."""
    try:
        with quiet_converter():
            from ai_edge_quantizer import quantizer  # noqa: PLC0415 -- optional: the litert extra
    except ImportError:
        raise missing_litert() from None
    with quiet_converter():
        qt = quantizer.Quantizer(bytearray(buffer))
        qt.load_quantization_recipe(aeq_recipe(str(conversion.quantize), conversion.keep_float, conversion.outputs))
        calibrated = None
        if qt.need_calibration:
            data = {SIGNATURE: [{n: t.detach().cpu().numpy() for n, t in zip(_signature_inputs(buffer, input_names), s)}
                                for s in conversion.calibration]}
            calibrated = _step("AI Edge Quantizer calibration", lambda: qt.calibrate(data))
        result = _step(f"AI Edge Quantizer ({conversion.quantize})", lambda: qt.quantize(calibrated))
    return bytes(result.quantized_model)


def _signature_inputs(buffer: bytes, input_names: Sequence[str]) -> list[str]:
    """The signature's input names in the order of the model's arguments (``args_0``, ``args_1``...)."""
    from ai_edge_litert.interpreter import Interpreter  # noqa: PLC0415 -- optional: the litert extra

    names = Interpreter(model_content=bytes(buffer)).get_signature_list()[SIGNATURE]["inputs"]
    return sorted(names, key=lambda n: int(n.rsplit("_", 1)[-1]) if n.rsplit("_", 1)[-1].isdigit() else 0)


def _step(what: str, fn: Any) -> Any:
    try:
        return fn()
    except LayertapError:
        raise
    except Exception as e:  # the converter's and the quantizer's errors of every kind
        inner: BaseException = e
        while inner.__cause__ is not None:
            inner = inner.__cause__
        said = inner if str(inner) else e
        raise LayertapError(f"LiteRT export failed in {what}: {type(said).__name__}: "
                            f"{one_line(said, first=True, limit=300)}") from e


def weight_grid(model: nn.Module) -> dict[str, tuple[Any, np.ndarray]]:
    """The weights an int8 program holds on a per-channel symmetric int8 grid (every Conv and Linear weight,
    127 levels each side of zero per output channel), as :class:`~.rounding.RoundingPlan` takes them."""
    grid = {}
    for path, mod in model.named_modules():
        w = getattr(mod, "weight", None)
        if isinstance(mod, (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)) and isinstance(w, torch.Tensor) and w.ndim >= 2:
            n = int(w.shape[0])
            fmt = Format.quantised("int8", np.ones(n, np.float32), np.zeros(n, np.float32), 0)
            grid[f"{path}.weight" if path else "weight"] = (fmt, np.full(n, 127.0, np.float32))
    return grid
