"""The image recipes the model zoos record (torchvision weights transforms, timm's data config),
as :class:`~layertap.samples.images.Preprocess`: read without downloading anything."""

from __future__ import annotations

import math
from typing import Any

from ..samples.images import RESAMPLE, Preprocess


def zoo_recipe(model: Any) -> Preprocess | None:
    """The recipe of a MODEL spec (``torchvision:NAME``, ``timm:NAME``) or a timm module; None otherwise.

    Example:
        >>> zoo_recipe("torchvision:resnet18").crop, zoo_recipe("pkg.mod:attr")
        ((224, 224), None)
    """
    if isinstance(model, str) and model.startswith("torchvision:"):
        return from_torchvision(model.split(":", 1)[1])
    if isinstance(model, str) and model.startswith("timm:"):
        import timm  # noqa: PLC0415 -- optional, heavy

        if timm.is_model(model.split(":", 1)[1]):
            return from_timm(timm.create_model(model.split(":", 1)[1], pretrained=False))
        return None
    if getattr(model, "pretrained_cfg", None) and type(model).__module__.startswith("timm"):
        return from_timm(model)
    return None


def from_torchvision(name: str) -> Preprocess | None:
    """The eval transform torchvision's weights enum records for ``name`` (no download)."""
    import torchvision  # noqa: PLC0415 -- optional, heavy

    try:
        t = torchvision.models.get_model_weights(name).DEFAULT.transforms()
    except Exception:  # noqa: BLE001 - models without weights metadata have no recipe
        return None
    crop, resize = getattr(t, "crop_size", None), getattr(t, "resize_size", None)
    if not crop or not resize:
        return None
    interp = getattr(getattr(t, "interpolation", None), "value", "bilinear")
    return Preprocess(
        resize=int(resize[0]), crop=(int(crop[0]), int(crop[-1])), mean=tuple(t.mean), std=tuple(t.std),
        interpolation=str(interp), source=f"torchvision weights {name}",
    )


def from_timm(model: Any) -> Preprocess | None:
    """timm's ``resolve_data_config`` for ``model`` as the same recipe (centre-crop mode)."""
    import timm.data  # noqa: PLC0415 -- optional, heavy

    cfg = timm.data.resolve_data_config({}, model=model)
    _, h, w = cfg["input_size"]
    mode = cfg.get("crop_mode", "center")
    pct = float(cfg.get("crop_pct") or 1.0)
    if mode != "center" or h != w:
        return None  # squash / border modes are not this recipe
    resize = int(math.floor(h / pct))
    interp = cfg.get("interpolation", "bilinear")
    return Preprocess(
        resize=resize, crop=(h, w), mean=tuple(cfg["mean"]), std=tuple(cfg["std"]),
        interpolation=interp if interp in RESAMPLE else "bilinear", source="timm resolve_data_config",
    )
