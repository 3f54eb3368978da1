"""The model zoos a MODEL spec can name: ``torchvision:NAME``, ``timm:NAME``,
``transformers:CLASS``; each builds with random weights (nothing is downloaded) and
knows its default example inputs."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from ..errors import ModelSpecError, unknown_name
from ..files.reads import note_input
from ..inputs import DEFAULT_INT_HIGH, InputSpec
from ..noise import quiet_registrations
from .memory import check_fits

#: what a zoo builds: the module, its default example inputs, the upper bound for random integer inputs
Built = tuple[nn.Module, list[InputSpec], int]
DEFAULT_SEQ_LEN = 16


def _zoo_import(name: str, spec: str):
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise ModelSpecError(f"MODEL {spec!r} needs the '{name}' package ({e}); pip install {name}") from None


def torchvision_model(name: str, spec: str) -> Built:
    """``torchvision:NAME`` with random weights."""
    tv = _zoo_import("torchvision", spec)
    names = tv.models.list_models()
    if name not in names:
        raise ModelSpecError(unknown_name("torchvision model", name, names))
    model = tv.models.get_model(name, weights=None)
    return model, _torchvision_inputs(tv, name), DEFAULT_INT_HIGH


def _torchvision_inputs(tv, name: str) -> list[InputSpec]:
    """Default input from the weights' preprocessing (inception: 299), else 224."""
    size: Sequence[int] = (224, 224)
    with contextlib.suppress(Exception):  # models without weights metadata keep 224
        crop = getattr(tv.models.get_model_weights(name).DEFAULT.transforms(), "crop_size", None)
        if crop:
            size = (crop[0], crop[-1])
    kind = tv.models.get_model_builder(name).__module__
    if ".video." in kind:
        return [InputSpec(None, (1, 3, 16, *size), "float32")]  # N, C, T, H, W
    if ".optical_flow." in kind:
        return [InputSpec(None, (1, 3, *size), "float32")] * 2  # two frames
    return [InputSpec(None, (1, 3, *size), "float32")]


def timm_model(name: str, spec: str) -> Built:
    """``timm:NAME`` with ``pretrained=False``."""
    timm = _zoo_import("timm", spec)
    if not timm.is_model(name):
        raise ModelSpecError(unknown_name("timm model", name, timm.list_models()))
    model = timm.create_model(name, pretrained=False)
    cfg = getattr(model, "pretrained_cfg", None) or {}
    c, h, w = tuple(cfg.get("input_size") or (3, 224, 224))
    return model, [InputSpec(None, (1, c, h, w), "float32")], DEFAULT_INT_HIGH


def transformers_model(name: str, spec: str, config_path: str | os.PathLike | None, meta: bool, max_bytes: int | None) -> Built:
    """``transformers:CLASS`` from its default config or ``--config``; sized on the meta device first."""
    tr = _zoo_import("transformers", spec)
    with quiet_registrations():  # the class's module is imported here, and with it any torchao
        cls = getattr(tr, name, None) if not name.startswith("_") else None
    config_class = getattr(cls, "config_class", None)
    if not (isinstance(cls, type) and issubclass(cls, nn.Module) and config_class is not None):
        candidates = [n for n in dir(tr) if "Model" in n or "For" in n]
        raise ModelSpecError(unknown_name("transformers model class", name, candidates))
    if config_path is None:
        config = config_class()
    else:
        path = Path(config_path)
        note_input(path, "--config")
        try:
            config = config_class.from_json_file(str(path))
        except (ValueError, OSError, TypeError) as e:
            raise ModelSpecError(f"cannot read --config '{path}' as a {config_class.__name__}: {e}") from None
    model = _build(cls, config, name, meta=True)
    if not meta:
        check_fits(model, spec, config_path, max_bytes)  # a default config can be billions of parameters
        model = _build(cls, config, name, meta=False)
    inputs, int_high = _transformers_inputs(cls, config)
    return model, inputs, int_high


def _build(cls: Any, config: Any, name: str, *, meta: bool) -> nn.Module:
    try:
        with torch.device("meta") if meta else contextlib.nullcontext():
            return cls(config)
    except Exception as e:  # noqa: BLE001 - report any construction failure as a spec problem
        raise ModelSpecError(f"building {name} from its config failed: {type(e).__name__}: {e}") from None


def _sub_config(config: Any, attr: str, *subs: str) -> Any:
    """``config.attr``, else the first ``config.<sub>.attr`` (text_config, vision_config...)."""
    if getattr(config, attr, None) is not None:
        return getattr(config, attr)
    for sub in subs:
        value = getattr(getattr(config, sub, None), attr, None)
        if value is not None:
            return value
    return None


def _transformers_inputs(cls: Any, config: Any) -> tuple[list[InputSpec], int]:
    """Named example inputs the forward takes: token ids, pixels, audio."""
    params = inspect.signature(cls.forward).parameters
    vocab = _sub_config(config, "vocab_size", "text_config", "decoder", "encoder")
    inputs: list[InputSpec] = []
    if "input_ids" in params:
        inputs.append(InputSpec("input_ids", (1, DEFAULT_SEQ_LEN), "int64"))
    if "decoder_input_ids" in params and getattr(config, "is_encoder_decoder", False):
        inputs.append(InputSpec("decoder_input_ids", (1, DEFAULT_SEQ_LEN), "int64"))
    if "pixel_values" in params:
        size = _sub_config(config, "image_size", "vision_config") or 224
        size = size if isinstance(size, (list, tuple)) else (size, size)
        channels = _sub_config(config, "num_channels", "vision_config") or 3
        inputs.append(InputSpec("pixel_values", (1, channels, *size), "float32"))
    if "input_values" in params and not inputs:
        inputs.append(InputSpec("input_values", (1, 16000), "float32"))  # one second of 16 kHz audio
    return inputs, int(vocab) if vocab else DEFAULT_INT_HIGH
