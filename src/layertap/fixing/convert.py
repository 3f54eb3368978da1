"""The conversions ``layertap fix`` tries, each with a list of ONNX node names kept in float32:
float16 with onnxconverter-common (``keep_io_types=True``, ``node_block_list``) and int8 QDQ with
``onnxruntime.quantization.quantize_static`` (``nodes_to_exclude``), calibrated on real samples
once (ONNX Runtime's calibration cache), so every set is quantised with the same ranges."""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from ..errors import LayertapError, first_line

if TYPE_CHECKING:  # pragma: no cover
    import onnx

FORMATS = ("fp16", "int8")
# onnxconverter-common's options besides the block list. Its default max_finite_val (1e4) clamps
# every larger weight, those of the nodes it keeps in float32 too (it casts their inputs first,
# then converts the initializers no longer named by a kept node): the largest finite float16 keeps
# the weights a kept node needs.
FP16_OPTIONS = {"keep_io_types": True, "max_finite_val": 65504.0}


class Converter:
    """Converts a float32 model with some nodes kept in float32; ``to`` is ``fp16`` or ``int8``.

    ``calib`` (int8): feeds (input name -> array with batch axis) to calibrate on. ``folder``:
    where the calibration cache lives (a temporary folder the caller removes).

    Example:
        >>> from layertap.onnxfile.samples import write_tiny_model
        >>> import onnx, tempfile; from pathlib import Path
        >>> d = Path(tempfile.mkdtemp()); _ = write_tiny_model(d)
        >>> Converter("fp16", d).convert(onnx.load(d / "m.onnx"), [], d / "h.onnx").name
        'h.onnx'
    """

    def __init__(self, to: str, folder: Path, calib: Sequence[dict[str, Any]] = ()) -> None:
        if to not in FORMATS:
            raise LayertapError(f"unknown conversion {to!r}; use one of {', '.join(FORMATS)}")
        if to == "int8" and not calib:
            raise LayertapError("int8 quantisation needs calibration samples (--calib PATH, else --inputs or --samples)")
        self.to, self.folder, self.calib = to, Path(folder), list(calib)
        self.cache = self.folder / "calibration.json"

    @property
    def tool(self) -> str:
        """The converter in words, with its version."""
        if self.to == "fp16":
            import onnxconverter_common

            return f"onnxconverter-common {onnxconverter_common.__version__}"
        import onnxruntime

        return f"onnxruntime.quantization {onnxruntime.__version__}"

    def convert(self, model: "onnx.ModelProto", nodes: Sequence[str], out: Path) -> Path:
        """Write ``model`` converted with ``nodes`` kept in float32 to ``out``; a model the converter
        cannot handle is a one-line error with the converter's reason."""
        try:
            with _quiet():
                if self.to == "fp16":
                    self._fp16(model, nodes, out)
                else:
                    self._int8(model, nodes, out)
        except LayertapError:
            raise
        except Exception as e:  # noqa: BLE001 - any converter failure is the converter's reason
            raise LayertapError(f"{self.tool} cannot convert this model: {first_line(e)}") from None
        return out

    def _fp16(self, model: "onnx.ModelProto", nodes: Sequence[str], out: Path) -> None:
        import onnx
        from onnxconverter_common import float16

        converted = float16.convert_float_to_float16(_copy(model), node_block_list=list(nodes), **FP16_OPTIONS)
        restore_float32(model, converted, nodes)
        onnx.save(converted, str(out))

    def _int8(self, model: "onnx.ModelProto", nodes: Sequence[str], out: Path) -> None:
        from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

        class Reader(CalibrationDataReader):
            def __init__(self, feeds: list[dict[str, Any]]) -> None:
                self.it = iter(feeds)

            def get_next(self) -> dict[str, Any] | None:
                return next(self.it, None)

        quantize_static(_copy(model), str(out), Reader(self.calib), quant_format=QuantFormat.QDQ,
                        nodes_to_exclude=list(nodes), calibration_cache_path=str(self.cache))


def restore_float32(model: "onnx.ModelProto", converted: "onnx.ModelProto", nodes: Sequence[str]) -> list[str]:
    """Undo what onnxconverter-common does to the nodes it keeps in float32; returns the names of the
    weights and outputs put back.

    It casts a kept node's inputs first and then converts every initializer no kept node names any
    more, so a kept node may read its weights through ``Cast(float16 -> float)``: rounded, and
    clamped at ``max_finite_val``; such a weight, read only by casts that feed kept nodes, gets its
    float32 values back (the cast then casts float to float). And a kept node that makes a model
    output has that output cast to float16 despite ``keep_io_types``: the cast is made to float.
    """
    kept = set(nodes)
    original = {t.name: t for t in model.graph.initializer if t.data_type == 1}
    users: dict[str, list[Any]] = {}
    for n in converted.graph.node:
        for name in n.input:
            users.setdefault(name, []).append(n)
    restored = []
    for t in converted.graph.initializer:
        casts = users.get(t.name, [])
        if t.name in original and t.data_type != 1 and casts and all(
                c.op_type == "Cast" and all(u.name in kept for o in c.output for u in users.get(o, ())) for c in casts):
            t.CopyFrom(original[t.name])
            restored.append(t.name)
    restored += _float_outputs(model, converted)
    return restored


def _float_outputs(model: "onnx.ModelProto", converted: "onnx.ModelProto") -> list[str]:
    """Model outputs that were float32 and came out float16 behind a Cast: cast to float instead."""
    was_float = {o.name for o in model.graph.output if o.type.tensor_type.elem_type == 1}
    makers = {o: n for n in converted.graph.node for o in n.output}
    fixed = []
    for out in converted.graph.output:
        maker = makers.get(out.name)
        if out.name in was_float and out.type.tensor_type.elem_type == 10 and maker is not None and maker.op_type == "Cast":
            for a in maker.attribute:
                if a.name == "to":
                    a.i = 1
            out.type.tensor_type.elem_type = 1
            fixed.append(out.name)
    return fixed


def _copy(model: "onnx.ModelProto") -> "onnx.ModelProto":
    """The converters edit the model they are given; the caller's stays as read."""
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


@contextlib.contextmanager
def _quiet():
    """The converters' warnings and log lines (one per node kept) would flood the terminal."""
    logger = logging.getLogger()
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)
