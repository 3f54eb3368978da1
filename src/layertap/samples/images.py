"""Image preprocessing for ``extract --data`` and ``compare --inputs``: Pillow and numpy only (no torch).

One recipe covers the zoos' eval transforms: resize the shorter side, centre
crop, scale to [0, 1], normalise. It is taken from the model's own config
where layertap knows it (torchvision weights transforms, timm's
``resolve_data_config``: :mod:`layertap.pytorch.preprocessing`), else from
``--image-size/--mean/--std`` (:func:`choose_recipe` decides). Doing it
here, not with torchvision transforms, keeps the ONNX backend free of torch
and gives every engine (local, Ray) the same bytes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import LayertapError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
RESAMPLE = ("nearest", "bilinear", "bicubic", "lanczos", "box", "hamming")


@dataclass(frozen=True)
class Preprocess:
    """Resize the shorter side to ``resize``, centre-crop ``crop`` (H, W), normalise.

    Attributes:
        resize: target length of the shorter side, in pixels.
        crop: (height, width) of the centre crop.
        mean, std: per-channel normalisation of pixels scaled to [0, 1].
        interpolation: Pillow resampling filter name (``bilinear``, ``bicubic``...).
        source: where the recipe came from (``torchvision weights``, ``timm``, ``options``).

    Example:
        >>> from PIL import Image
        >>> p = Preprocess(resize=8, crop=(8, 8), mean=(0.0,) * 3, std=(1.0,) * 3)
        >>> p.apply(Image.new("RGB", (16, 12), (255, 0, 0))).shape
        (3, 8, 8)
    """

    resize: int
    crop: tuple[int, int]
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)
    interpolation: str = "bilinear"
    source: str = "options"

    def to_dict(self) -> dict:
        """The recipe as the manifest records it."""
        d = asdict(self)
        d["crop"] = list(self.crop)
        d["mean"], d["std"] = list(self.mean), list(self.std)
        return d

    def apply(self, image: Any) -> np.ndarray:
        """A PIL image (or HxWxC uint8 array) -> float32 CxHxW array.

        Follows torchvision's ``ImageClassification`` on PIL input step for
        step (same output size rule, same crop offsets), so values match it.
        """
        from PIL import Image

        if isinstance(image, np.ndarray):
            image = Image.fromarray(image)
        img = image.convert("RGB")
        img = img.resize(_resized_size(img.size, self.resize), _resample(self.interpolation))
        img = _center_crop(img, self.crop)
        x = np.asarray(img, dtype=np.float32) / np.float32(255)
        mean = np.asarray(self.mean, dtype=np.float32)
        std = np.asarray(self.std, dtype=np.float32)
        return np.ascontiguousarray(((x - mean) / std).transpose(2, 0, 1))


def _resample(name: str):
    from PIL import Image

    return getattr(Image.Resampling, name.upper())


def _resized_size(size: tuple[int, int], short_side: int) -> tuple[int, int]:
    """torchvision's rule: the shorter side becomes ``short_side``, the other keeps the aspect."""
    w, h = size
    short, long = (w, h) if w <= h else (h, w)
    new_long = int(short_side * long / short)
    return (short_side, new_long) if w <= h else (new_long, short_side)


def _center_crop(img: Any, crop: tuple[int, int]):
    ch, cw = crop
    w, h = img.size
    top = int(round((h - ch) / 2.0))
    left = int(round((w - cw) / 2.0))
    return img.crop((left, top, left + cw, top + ch))


def parse_image_size(text: str | int | Sequence[int]) -> tuple[int, int]:
    """``224`` or ``224x160`` (HxW) -> (H, W).

    Example:
        >>> parse_image_size("64"), parse_image_size("48x64")
        ((64, 64), (48, 64))
    """
    if isinstance(text, int):
        parts = [text]
    elif isinstance(text, str):
        try:
            parts = [int(p) for p in text.lower().split("x")]
        except ValueError:
            parts = []
    else:
        parts = [int(p) for p in text]
    if len(parts) == 1:
        parts = parts * 2
    if len(parts) != 2 or min(parts) < 1:
        raise LayertapError(f"bad --image-size {text!r}; use SIZE or HxW, e.g. 224 or 224x160")
    return parts[0], parts[1]


def from_options(size: Any, mean: Sequence[float] | None, std: Sequence[float] | None) -> Preprocess:
    """The recipe from ``--image-size/--mean/--std`` (pixels in [0, 1] when no mean/std)."""
    crop = parse_image_size(size)
    mean_t = _channels("--mean", mean, 0.0)
    std_t = _channels("--std", std, 1.0)
    if any(s == 0 for s in std_t):
        raise LayertapError(f"--std must not contain 0, got {list(std_t)}")
    return Preprocess(resize=max(crop), crop=crop, mean=mean_t, std=std_t, source="options")


def _channels(flag: str, values: Sequence[float] | None, default: float) -> tuple[float, ...]:
    if values is None:
        return (default,) * 3
    vals = tuple(float(v) for v in values)
    if len(vals) == 1:
        vals = vals * 3
    if len(vals) != 3:
        raise LayertapError(f"{flag} takes 1 or 3 numbers (one per RGB channel), got {len(vals)}")
    return vals


def choose_recipe(image_size: Any, mean: Sequence[float] | None, std: Sequence[float] | None,
                  zoo: Callable[[], Preprocess | None], input_size: Callable[[], tuple[int, int] | None]) -> Preprocess | None:
    """The image recipe: ``image_size`` if given, else the model's zoo config (``zoo()``), else
    the model file's fixed input size (``input_size()``, pixels in [0, 1] unless mean/std).

    ``mean``/``std`` replace the zoo's normalisation. None: no recipe is known.

    Example:
        >>> choose_recipe(None, None, None, lambda: None, lambda: (8, 8)).crop
        (8, 8)
    """
    if image_size is not None:
        return from_options(image_size, mean, std)
    recipe = zoo()
    if recipe is None:
        size = input_size()
        return from_options(size, mean, std) if size else None
    if mean is not None or std is not None:
        base = from_options(recipe.crop, mean, std)
        return Preprocess(recipe.resize, recipe.crop, base.mean, base.std, recipe.interpolation, recipe.source + " (mean/std from options)")
    return recipe
