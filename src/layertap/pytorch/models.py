"""MODEL specs: build a PyTorch model from a short text (weights: :mod:`.checkpoints`,
zoos: :mod:`.zoos`, inputs: :mod:`.example_inputs`).

Specs (the forms ``MODEL`` takes on the command line)::

    torchvision:NAME          random weights (seeded) unless --weights
    timm:NAME                 pretrained=False
    transformers:CLASS        random init from CLASS's default config, or --config FILE.json
    package.module:ATTR       an nn.Module, or a callable returning one with no arguments
    path/to/file.py:ATTR      the same, from a file

Nothing here downloads: zoo models are built with random weights, and
``--weights`` loads a local state dict (``torch.load(weights_only=True)`` or
safetensors) with a strict, readable key check.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ModelSpecError, unknown_name
from ..files.reads import note_input
from ..inputs import DEFAULT_INT_HIGH, InputSpec
from ..specs import ModelSpec, add_cwd_to_path, check_model_args, module_not_found
from .capture import eager
from .checkpoints import load_weights
from .zoos import Built, timm_model, torchvision_model, transformers_model


@dataclass
class ModelInfo:
    """What a model spec knows besides the module itself.

    Attributes:
        spec: the MODEL text as given.
        family: ``torchvision``, ``timm``, ``transformers``, ``module`` or ``file``.
        inputs: default example inputs (may be empty: then ``--input`` is needed).
        int_high: upper bound (exclusive) for random integer inputs, e.g. the vocabulary size.
        weights: the weights file loaded, if any.

    Example:
        >>> ModelInfo("torchvision:resnet18", "torchvision", [InputSpec.parse("1x3x224x224")]).inputs[0].shape
        (1, 3, 224, 224)
    """

    spec: str
    family: str
    inputs: list[InputSpec] = field(default_factory=list)
    int_high: int = DEFAULT_INT_HIGH
    weights: str | None = None

    def describe(self) -> str:
        """``torchvision:resnet18 (random weights)``."""
        return f"{self.spec} ({'weights ' + self.weights if self.weights else 'random weights'})"


def load_model(
    spec: str | ModelSpec,
    *,
    weights: str | os.PathLike | None = None,
    config: str | os.PathLike | None = None,
    unsafe_pickle: bool = False,
    weights_key: str | None = None,
    weights_strict: bool = True,
    seed: int = 0,
    device: str = "cpu",
    max_bytes: int | None = None,
) -> tuple[nn.Module, ModelInfo]:
    """Build the model a spec names, in eval mode, with seeded random weights.

    A ``transformers:CLASS`` model is first built on the meta device (no memory)
    to estimate its size: one that would not fit in the available memory is
    refused with :class:`ModelTooLargeError` before any weight is allocated.

    Args:
        spec: MODEL text (see module docstring), or the :class:`~layertap.specs.ModelSpec`
            that :func:`~layertap.specs.check_model_args` returned for it and these files
            (already checked: not checked again).
        weights: optional state dict file (.pt/.pth/.bin/.ckpt or .safetensors).
        config: JSON config for ``transformers:CLASS``.
        unsafe_pickle: allow ``weights`` to be a pickled whole module
            (runs code from the file).
        weights_key: the checkpoint entry that holds the state dict (``model_state``,
            ``ema.module``); by default the one state dict in the file that fits the model.
        weights_strict: ``False`` loads the keys the model and the file both hold and warns
            which were skipped and which keep their initial values (``load_state_dict(strict=False)``).
        seed: seed for the random initialisation (the global RNG is left as it was).
        device: ``"cpu"``, or ``"meta"`` for the module structure without weights
            (shapes propagate through a forward, values do not exist).
        max_bytes: refuse (``ModelTooLargeError``) a transformers model whose
            weights exceed this many bytes, even when memory would allow it.

    Example:
        >>> load_model("transformers:LlamaModel", device="meta")[0].embed_tokens.weight.is_meta
        True
        >>> model, info = load_model("torchvision:resnet18")
        >>> type(model).__name__, info.inputs[0].shape, model.training
        ('ResNet', (1, 3, 224, 224), False)
    """
    parsed = spec if isinstance(spec, ModelSpec) else check_model_args(spec, weights=weights, config=config)
    spec, head, name = parsed.text, parsed.head, parsed.name
    if device == "meta" and weights is not None:
        raise ModelSpecError(f"--weights cannot be loaded into a model on the meta device ({spec})")
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        if head == "torchvision":
            model, info = _zoo(head, torchvision_model(name, spec), spec)
        elif head == "timm":
            model, info = _zoo(head, timm_model(name, spec), spec)
        elif head == "transformers":
            model, info = _zoo(head, transformers_model(name, spec, config, meta=device == "meta", max_bytes=max_bytes), spec)
        elif head.endswith(".py"):
            user_module = _load_file(head, spec)
            model, info = _instantiate(user_module, name, spec, where=head), ModelInfo(spec, "file")
        else:
            model, info = _instantiate(_import_module(head, spec), name, spec, where=head), ModelInfo(spec, "module")
    if weights is not None:
        # A whole model pickled by a script that did ``import mymodels`` refers to
        # ``mymodels.Net``: while unpickling, let that name mean the file the user named.
        alias = Path(head).stem if head.endswith(".py") and unsafe_pickle else ""
        aliased = alias.isidentifier() and alias not in sys.modules
        if aliased:
            sys.modules[alias] = user_module
        try:
            load_weights(eager(model), weights, unsafe_pickle=unsafe_pickle, what=spec, key=weights_key,
                         strict=weights_strict)
        finally:
            if aliased:
                sys.modules.pop(alias, None)
        info.weights = str(weights)
    return eager(model).eval(), info


def _zoo(family: str, built: Built, spec: str) -> tuple[nn.Module, ModelInfo]:
    model, inputs, int_high = built
    return model, ModelInfo(spec, family, inputs, int_high)


# -- user code ----------------------------------------------------------------
def _import_module(modname: str, spec: str):
    add_cwd_to_path()
    try:
        return importlib.import_module(modname)
    except ModuleNotFoundError as e:
        raise module_not_found(modname, spec, e.name, str(e)) from None
    except Exception as e:  # noqa: BLE001 - user code may raise anything at import time
        raise ModelSpecError(f"importing {modname!r} for MODEL {spec!r} failed: {type(e).__name__}: {e}") from None


def _load_file(filename: str, spec: str):
    path = Path(filename)
    if not path.is_file():
        raise ModelSpecError(f"model file '{path}' does not exist (MODEL {spec!r})")
    note_input(path, "MODEL")
    modname = f"layertap_user_{abs(hash(str(path.resolve())))}"
    if modname in sys.modules:
        return sys.modules[modname]
    mspec = importlib.util.spec_from_file_location(modname, path)
    if mspec is None or mspec.loader is None:
        raise ModelSpecError(f"cannot load '{path}' as Python")
    module = importlib.util.module_from_spec(mspec)
    sys.modules[modname] = module  # dataclasses and pickling look modules up here
    folder = str(path.resolve().parent)
    sys.path.insert(0, folder)  # sibling imports inside the file
    try:
        mspec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - user code may raise anything at import time
        sys.modules.pop(modname, None)
        raise ModelSpecError(f"running '{path}' for MODEL {spec!r} failed: {type(e).__name__}: {e}") from None
    except BaseException:  # SystemExit, KeyboardInterrupt: no half-run module stays cached
        sys.modules.pop(modname, None)
        raise
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(folder)
    return module


def _instantiate(module: Any, attr: str, spec: str, *, where: str) -> nn.Module:
    """``module.<attr>`` (dotted), called with no arguments unless it is a module.

    ``where`` names the module in errors as the user wrote it (a file path, not
    the private name the file was imported under).
    """
    obj: Any = module
    for depth, part in enumerate(attr.split(".")):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_")]
            owner = where if depth == 0 else f"{where}:{'.'.join(attr.split('.')[:depth])}"
            raise ModelSpecError(unknown_name(f"attribute of {owner!r}:", part, names))
        obj = getattr(obj, part)
    if isinstance(obj, nn.Module):
        return obj
    if not callable(obj):
        raise ModelSpecError(f"{spec!r} is a {type(obj).__name__}, not an nn.Module or a function that returns one")
    try:
        made = obj()
    except TypeError as e:
        raise ModelSpecError(
            f"calling {attr}() for MODEL {spec!r} failed ({e}); point at an nn.Module instance or a function that takes no arguments"
        ) from None
    except Exception as e:  # noqa: BLE001 - user code may raise anything
        raise ModelSpecError(f"calling {attr}() for MODEL {spec!r} failed: {type(e).__name__}: {e}") from None
    if not isinstance(made, nn.Module):
        raise ModelSpecError(f"{attr}() for MODEL {spec!r} returned a {type(made).__name__}, not an nn.Module")
    return made


