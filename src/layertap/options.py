"""The option objects the library's entry points take: :class:`~layertap.metrics.Criterion` (how
rows are judged), :class:`RuntimeOptions` (what runs each ONNX file) and :class:`SampleOptions`
(which samples a command runs on). The CLI's argument groups build them; ``lt.compare``,
``lt.fix``, ``lt.repro`` and ``lt.extract_dataset`` take them, or build them from their
documented keywords (:func:`merged_criterion`, ``RuntimeOptions.merged``,
``SampleOptions.merged``), and hand the objects to the layers below (never 30 flat keywords).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Sequence, TypeVar

from .errors import LayertapError
from .metrics import DEFAULT_ATOL, DEFAULT_RTOL, Criterion

_O = TypeVar("_O", "RuntimeOptions", "SampleOptions", Criterion)


def _merged(cls: type[_O], given: _O | None, keywords: dict[str, Any]) -> _O:
    """``given`` (else the defaults) with each keyword that differs from its default in place of the
    object's field: the documented keywords and an options object combine, the keywords winning."""
    base = given if given is not None else cls()
    if not isinstance(base, cls):
        raise LayertapError(f"expected a layertap.options.{cls.__name__}, got {type(base).__name__}; build one with "
                            f"{cls.__name__}(...) or give the keywords instead")
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    changed = {k: v for k, v in keywords.items() if not _is_default(v, defaults[k])}
    return dataclasses.replace(base, **changed) if changed else base


def _is_default(value: Any, default: Any) -> bool:
    # by identity (None), or equal plain values (True, 0); never ``==`` on arrays or tensors
    return value is default or (type(value) is type(default) and isinstance(value, (bool, int, float, str))
                                and value == default)


@dataclass(frozen=True)
class RuntimeOptions:
    """What runs each ONNX file: the runtime (``ort`` or ``openvino``; ``runtime`` is the reference
    file's, or the one file's, ``cand_runtime`` a candidate's), ONNX Runtime's execution providers and
    graph optimisations per side, OpenVINO's precision and device.

    Example:
        >>> RuntimeOptions.merged(RuntimeOptions(runtime="openvino"), ov_precision="f32").ov_precision
        'f32'
    """

    runtime: str | None = None
    cand_runtime: str | None = None
    providers: Sequence[str] | str | None = None
    cand_providers: Sequence[str] | str | None = None
    ort_optimizations: bool = True
    ref_ort_optimizations: bool | None = None  # None: the candidate's
    ov_precision: str | None = None
    ov_device: str | None = None

    @classmethod
    def merged(cls, given: RuntimeOptions | None = None, **keywords: Any) -> RuntimeOptions:
        """``given`` with the keywords that are not at their defaults in place of its fields."""
        return _merged(cls, given, keywords)

    def one_file(self) -> dict[str, str]:
        """The keywords of a command that runs one file (``lt.run``): ``runtime``, ``ov_precision``,
        ``ov_device``, those given.

        Example:
            >>> RuntimeOptions(runtime="openvino").one_file()
            {'runtime': 'openvino'}
        """
        pairs = (("runtime", self.runtime), ("ov_precision", self.ov_precision), ("ov_device", self.ov_device))
        return {k: v for k, v in pairs if v is not None}


@dataclass(frozen=True)
class SampleOptions:
    """Which samples a command runs on: ``samples`` (``N`` seeded random ones, or the samples
    themselves), ``inputs`` (a path: one ``.npz``, a folder of images/``.npy``/``.npz`` files or a
    ``datasets`` folder; ``limit`` reads its first N, ``columns`` picks a ``datasets`` folder's input
    columns), the image recipe (``image_size``, ``mean``, ``std``; ``preprocess``: the model's own),
    ``save_inputs`` (write the samples run to one ``.npz``) and ``seed`` (of random samples).

    Example:
        >>> o = SampleOptions.merged(SampleOptions(inputs="images", limit=8), limit=2, seed=0)
        >>> o.inputs, o.limit, o.seed
        ('images', 2, 0)
    """

    samples: int | Sequence[Any] | None = None
    inputs: str | os.PathLike | None = None
    limit: int | None = None
    columns: Sequence[str] | None = None
    image_size: Any = None
    mean: Sequence[float] | None = None
    std: Sequence[float] | None = None
    preprocess: Any = None  # a samples.images.Preprocess: the model's own recipe
    save_inputs: str | os.PathLike | None = None
    seed: int = 0

    @classmethod
    def merged(cls, given: SampleOptions | None = None, **keywords: Any) -> SampleOptions:
        """``given`` with the keywords that are not at their defaults in place of its fields."""
        return _merged(cls, given, keywords)

    @property
    def recipe(self) -> tuple[Any, Any, Any, Any]:
        """``(preprocess, image_size, mean, std)``: how images are read."""
        return self.preprocess, self.image_size, self.mean, self.std


def merged_criterion(given: Criterion | None = None, **keywords: Any) -> tuple[Criterion, bool]:
    """``given`` (else the default rule) with the keywords that are not ``None`` and not at
    their defaults in place of its fields, and whether the tolerances were chosen (an ``rtol`` or
    ``atol`` keyword, or an object whose tolerances are not the defaults): a rule nobody chose may
    be fitted to a runtime's reduced precision, a chosen one never is.

    Example:
        >>> c, chosen = merged_criterion(Criterion(metric="cosine"), min_cosine=0.99, rtol=None)
        >>> c.metric, c.min_cosine, chosen
        ('cosine', 0.99, False)
        >>> merged_criterion(None, rtol=1e-3)[1]
        True
    """
    base = given if given is not None else Criterion()
    if not isinstance(base, Criterion):
        raise LayertapError(f"expected a layertap.metrics.Criterion, got {type(base).__name__}; build one with "
                            "Criterion(metric=..., rtol=...) or give the keywords instead")
    chosen = any(keywords.get(k) is not None for k in ("rtol", "atol")) or \
        (base.rtol, base.atol) != (DEFAULT_RTOL, DEFAULT_ATOL)
    tolerances = {k: v for k, v in keywords.items() if k in ("rtol", "atol") and v is not None}
    others = {k: v for k, v in keywords.items() if k not in ("rtol", "atol") and v is not None}
    return dataclasses.replace(_merged(Criterion, base, others), **tolerances), chosen
