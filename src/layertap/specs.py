"""MODEL specs as text: their syntax and the files they name, checked without torch.

``layertap`` checks these before it imports torch (seconds on a busy machine),
so a typo in a spec, a missing ``--config`` or ``--weights`` file fails at once.
:func:`layertap.pytorch.models.load_model` runs the same checks.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from .errors import ModelSpecError, close_matches, unknown_name

ZOOS = ("torchvision", "timm", "transformers")
SPEC_FORMS = "torchvision:NAME, timm:NAME, transformers:CLASS, package.module:ATTR or path/to/file.py:ATTR"
WEIGHT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".safetensors")

# How torchvision and timm register their model builders, read from the installed sources
# (importing either package imports torch: seconds): ``@register_model`` or
# ``@register_model(name="x")`` on the next top-level ``def``, and timm's
# ``register_model_deprecations(__name__, {"old_name": ...})``.
_REGISTERED = re.compile(
    r"^@register_model(?:\(\s*(?:name\s*=\s*[\"'](\w+)[\"'])?\s*\))?\s*$.*?^(?:async\s+)?def\s+(\w+)", re.M | re.S)
_DEPRECATED = re.compile(r"register_model_deprecations\(\s*__name__\s*,\s*\{(.*?)\}\s*\)", re.S)
_DICT_KEY = re.compile(r"[\"']([\w.-]+)[\"']\s*:")
#: zoo -> (its model builders' folder, the model name kind in errors)
_ZOO_NAMES = {"torchvision": ("models", "torchvision model"), "timm": ("models", "timm model")}


#: the suffixes of files a runtime runs (not PyTorch models): ONNX files and OpenVINO IRs
RUNTIME_FILE_SUFFIXES = (".onnx", ".xml")


def is_model_spec(text: str) -> bool:
    """Whether ``text`` is a MODEL spec (``head:name``) rather than the path of a file a runtime runs.

    Example:
        >>> is_model_spec("torchvision:resnet18"), is_model_spec("nets/m.onnx"), is_model_spec("file.py:Net")
        (True, False, True)
    """
    if text.lower().endswith(RUNTIME_FILE_SUFFIXES):
        return False
    return ":" in text and not re.match(r"^[A-Za-z]:[\\/]", text)  # a Windows drive is no spec


@dataclass(frozen=True)
class ModelSpec:
    """A parsed MODEL text: ``head:name``.

    Example:
        >>> s = parse_model_spec("examples/mymodels.py:Net")
        >>> s.family, s.head, s.name
        ('file', 'examples/mymodels.py', 'Net')
    """

    text: str
    head: str
    name: str

    @property
    def family(self) -> str:
        """``torchvision``, ``timm``, ``transformers``, ``file`` or ``module``."""
        if self.head in ZOOS:
            return self.head
        return "file" if self.head.endswith(".py") else "module"


def parse_model_spec(spec: str) -> ModelSpec:
    """Split a MODEL text into ``head:name``; one-line errors for malformed ones.

    Args:
        spec: the MODEL text, e.g. ``torchvision:resnet18``.

    Returns:
        The :class:`ModelSpec`.

    Example:
        >>> parse_model_spec("torchvision").text
        Traceback (most recent call last):
        ...
        layertap.errors.ModelSpecError: bad MODEL 'torchvision'; use torchvision:NAME, timm:NAME, ...
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ModelSpecError(f"empty MODEL; use {SPEC_FORMS}")
    spec = spec.strip()
    if spec.lower().endswith(".onnx"):
        raise ModelSpecError(f"MODEL {spec!r} is an ONNX file; this command needs a PyTorch model: {SPEC_FORMS}")
    head, sep, name = spec.rpartition(":")
    if not sep or not head or not name:
        raise ModelSpecError(f"bad MODEL {spec!r}; use {SPEC_FORMS}")
    return ModelSpec(spec, head, name)


def check_model_args(
    spec: str,
    *,
    weights: str | os.PathLike | None = None,
    config: str | os.PathLike | None = None,
) -> ModelSpec:
    """Everything about a MODEL and its files that can be checked without importing torch.

    The spec's syntax, that a zoo package is installed, that a ``file.py`` or the
    top-level package of ``package.module`` exists, that ``--weights`` exists with
    a known suffix, and that ``--config`` (transformers only) is a JSON object.

    Args:
        spec: the MODEL text.
        weights: optional state dict file.
        config: optional transformers config file.

    Returns:
        The parsed :class:`ModelSpec`.

    Example:
        >>> check_model_args("torchvision:resnet18", config="c.json")
        Traceback (most recent call last):
        ...
        layertap.errors.ModelSpecError: --config applies to transformers:CLASS models only, not 'torchvision:resnet18'
    """
    parsed = parse_model_spec(spec)
    if config is not None:
        _check_config(parsed, Path(config))
    if parsed.family in ZOOS and importlib.util.find_spec(parsed.head) is None:
        raise ModelSpecError(f"MODEL {parsed.text!r} needs the '{parsed.head}' package; pip install {parsed.head}")
    if parsed.family in _ZOO_NAMES:
        _check_zoo_name(parsed)
    if parsed.family == "file" and not Path(parsed.head).is_file():
        raise ModelSpecError(f"model file '{parsed.head}' does not exist (MODEL {parsed.text!r})")
    if parsed.family == "module":
        _check_module_exists(parsed)
    if weights is not None:
        check_weights_path(Path(weights))
    return parsed


def check_weights_path(file: Path) -> None:
    """The ``--weights`` file exists and has a suffix layertap reads."""
    if not file.is_file():
        raise ModelSpecError(f"weights file '{file}' does not exist")
    if file.suffix.lower() not in WEIGHT_SUFFIXES:
        raise ModelSpecError(f"weights file '{file}' must end in one of: {', '.join(WEIGHT_SUFFIXES)}")


def module_not_found(modname: str, spec: str, missing: str | None, reason: str) -> ModelSpecError:
    """The error for a ``package.module:ATTR`` spec whose module cannot be found.

    Example:
        >>> str(module_not_found("torchvison", "torchvison:resnet18", "torchvison", "not found")).split(" (forms")[0]
        "cannot import 'torchvison' for MODEL 'torchvison:resnet18': not found; did you mean: torchvision:..."
    """
    msg = f"cannot import {modname!r} for MODEL {spec!r}: {reason}"
    zoo = close_matches(modname, ZOOS)
    if zoo and missing == modname.split(".")[0]:
        msg += f"; did you mean: {zoo[0]}:..."
    return ModelSpecError(f"{msg} (forms: {SPEC_FORMS})")


def add_cwd_to_path() -> None:
    """``python -m`` puts the working folder on sys.path, the console script does not;
    make ``layertap ... mypkg.model:Net`` work the same from both."""
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())


@functools.cache
def zoo_model_names(zoo: str) -> frozenset[str] | None:
    """The model names ``torchvision`` or ``timm`` registers, read from the installed package's
    sources without importing it (so without torch); None when it is not installed or its
    sources do not read as expected (then the zoo itself checks the name, after the import).

    The same names as ``torchvision.models.list_models()`` and timm's registry (deprecated
    names included; a timm name's ``.tag`` is not part of it).

    Example:
        >>> names = zoo_model_names("torchvision")
        >>> names is None or {"resnet18", "vit_b_16"} <= names
        True
    """
    found = importlib.util.find_spec(zoo) if zoo in _ZOO_NAMES else None
    if found is None or found.origin is None:
        return None
    names: set[str] = set()
    for file in (Path(found.origin).parent / _ZOO_NAMES[zoo][0]).rglob("*.py"):
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None
        if "register_model" in text:
            names.update(m.group(1) or m.group(2) for m in _REGISTERED.finditer(text))
            for block in _DEPRECATED.finditer(text):
                names.update(_DICT_KEY.findall(block.group(1)))
    return frozenset(names) if "resnet18" in names else None  # resnet18: both zoos have it for years


def _check_zoo_name(parsed: ModelSpec) -> None:
    names = zoo_model_names(parsed.head)
    arch = parsed.name.split(".", 1)[0] if parsed.head == "timm" else parsed.name  # timm: NAME.pretrained_tag
    if names is not None and arch not in names:
        raise ModelSpecError(unknown_name(_ZOO_NAMES[parsed.head][1], arch, sorted(names)))


def _check_module_exists(parsed: ModelSpec) -> None:
    add_cwd_to_path()
    top = parsed.head.split(".")[0]
    try:
        found = importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        found = True  # let the real import report it
    if not found:
        raise module_not_found(parsed.head, parsed.text, top, f"No module named {top!r}")


def _check_config(parsed: ModelSpec, path: Path) -> None:
    if parsed.family != "transformers":
        raise ModelSpecError(f"--config applies to transformers:CLASS models only, not {parsed.text!r}")
    if not path.is_file():
        raise ModelSpecError(f"--config file '{path}' does not exist")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelSpecError(f"cannot read --config '{path}' as JSON: {e}") from None
    if not isinstance(data, dict):
        raise ModelSpecError(f"--config '{path}' holds a JSON {type(data).__name__}, not an object of config fields")
