"""MODEL specs: build a PyTorch model from a short text, load weights, make inputs.

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
import inspect
import os
import pickle
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from ..errors import LayertapError, ModelSpecError, unknown_name
from ..files.reads import note_input
from ..inputs import DEFAULT_INT_HIGH, InputSpec
from ..specs import add_cwd_to_path, check_model_args, check_weights_path, module_not_found
from .capture import eager

DEFAULT_SEQ_LEN = 16


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
    spec: str,
    *,
    weights: str | os.PathLike | None = None,
    config: str | os.PathLike | None = None,
    unsafe_pickle: bool = False,
    seed: int = 0,
    device: str = "cpu",
    max_bytes: int | None = None,
) -> tuple[nn.Module, ModelInfo]:
    """Build the model a spec names, in eval mode, with seeded random weights.

    A ``transformers:CLASS`` model is first built on the meta device (no memory)
    to estimate its size: one that would not fit in the available memory is
    refused with :class:`ModelTooLargeError` before any weight is allocated.

    Args:
        spec: MODEL text (see module docstring).
        weights: optional state dict file (.pt/.pth/.bin/.ckpt or .safetensors).
        config: JSON config for ``transformers:CLASS``.
        unsafe_pickle: allow ``weights`` to be a pickled whole module
            (runs code from the file).
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
    parsed = check_model_args(spec, weights=weights, config=config)  # the checks that need no torch
    spec, head, name = parsed.text, parsed.head, parsed.name
    if device == "meta" and weights is not None:
        raise ModelSpecError(f"--weights cannot be loaded into a model on the meta device ({spec})")
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        if head == "torchvision":
            model, info = _torchvision(name, spec)
        elif head == "timm":
            model, info = _timm(name, spec)
        elif head == "transformers":
            model, info = _transformers(name, spec, config, meta=device == "meta", max_bytes=max_bytes)
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
            load_weights(model, weights, unsafe_pickle=unsafe_pickle, what=spec)
        finally:
            if aliased:
                sys.modules.pop(alias, None)
        info.weights = str(weights)
    return eager(model).eval(), info


# -- zoos ---------------------------------------------------------------------
def _zoo_import(name: str, spec: str):
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise ModelSpecError(f"MODEL {spec!r} needs the '{name}' package ({e}); pip install {name}") from None


def _torchvision(name: str, spec: str) -> tuple[nn.Module, ModelInfo]:
    tv = _zoo_import("torchvision", spec)
    names = tv.models.list_models()
    if name not in names:
        raise ModelSpecError(unknown_name("torchvision model", name, names))
    model = tv.models.get_model(name, weights=None)
    return model, ModelInfo(spec, "torchvision", _torchvision_inputs(tv, name))


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


def _timm(name: str, spec: str) -> tuple[nn.Module, ModelInfo]:
    timm = _zoo_import("timm", spec)
    if not timm.is_model(name):
        raise ModelSpecError(unknown_name("timm model", name, timm.list_models()))
    model = timm.create_model(name, pretrained=False)
    cfg = getattr(model, "pretrained_cfg", None) or {}
    c, h, w = tuple(cfg.get("input_size") or (3, 224, 224))
    return model, ModelInfo(spec, "timm", [InputSpec(None, (1, c, h, w), "float32")])


def _transformers(
    name: str, spec: str, config_path: str | os.PathLike | None, meta: bool, max_bytes: int | None
) -> tuple[nn.Module, ModelInfo]:
    tr = _zoo_import("transformers", spec)
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
    return model, ModelInfo(spec, "transformers", inputs, int_high)


def _build(cls: Any, config: Any, name: str, *, meta: bool) -> nn.Module:
    try:
        with torch.device("meta") if meta else contextlib.nullcontext():
            return cls(config)
    except Exception as e:  # noqa: BLE001 - report any construction failure as a spec problem
        raise ModelSpecError(f"building {name} from its config failed: {type(e).__name__}: {e}") from None


class ModelTooLargeError(ModelSpecError):
    """A model whose weights alone would not fit in the available memory.

    Attributes:
        need: bytes of parameters and buffers.
        available: bytes of memory available.
    """

    def __init__(self, message: str, need: int, available: int) -> None:
        super().__init__(message)
        self.need = need
        self.available = available


# Leave room for activations, the interpreter and torch itself.
MEMORY_HEADROOM = 0.8


def check_fits(model: nn.Module, spec: str, config_path: str | os.PathLike | None = None,
               max_bytes: int | None = None) -> None:
    """Raise :class:`ModelTooLargeError` when ``model`` (built on meta) would not fit in memory
    (or would take more than ``max_bytes``).

    Example:
        >>> with torch.device("meta"):
        ...     huge = nn.Linear(1 << 20, 1 << 20)  # 2**40 parameters, 4 TiB in float32
        >>> check_fits(huge, "big:Linear")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        layertap.pytorch.models.ModelTooLargeError: big:Linear needs about 4096.0 GiB for its weights ...
    """
    need = model_bytes(model)
    available = available_memory()
    limits = [b for b in (max_bytes, available and MEMORY_HEADROOM * available) if b]
    if not limits or need <= min(limits):
        return
    available = available or need
    params = sum(p.numel() for p in model.parameters())
    fix = (f"make the config in '{config_path}' smaller" if config_path is not None
           else "pass a smaller --config FILE.json")
    raise ModelTooLargeError(
        f"{spec} needs about {need / 2**30:.1f} GiB for its weights ({_count(params)} parameters) but "
        f"{available / 2**30:.1f} GiB of memory is available; {fix} (fewer num_hidden_layers, a smaller "
        "hidden_size; e.g. examples/tiny-bert.json)",
        need, available,
    )


def model_bytes(model: nn.Module) -> int:
    """Bytes of a model's parameters and buffers (works on the meta device: nothing is read).

    Example:
        >>> model_bytes(nn.Linear(10, 10))
        440
    """
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def available_memory() -> int | None:
    """Bytes of memory this process can still use: MemAvailable, capped by a cgroup limit."""
    values = []
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                values.append(int(line.split()[1]) * 1024)
    with contextlib.suppress(OSError, ValueError):
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            values.append(int(limit) - used)
    return min(values) if values else None


def _count(n: int) -> str:
    return f"{n / 1e9:.1f} billion" if n >= 1e9 else f"{n / 1e6:.1f} million" if n >= 1e6 else f"{n:,}"


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


# -- weights ------------------------------------------------------------------
def load_weights(model: nn.Module, path: str | os.PathLike, *, unsafe_pickle: bool = False, what: str = "the model") -> None:
    """Load a state dict file into ``model`` with a strict, readable key check.

    ``.safetensors`` files are read with safetensors; others with
    ``torch.load(weights_only=True)``, which refuses pickled code. A pickled
    whole module is accepted only with ``unsafe_pickle=True`` (its
    ``state_dict()`` is then used).

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "w.pt")
        >>> torch.save({"weight": torch.zeros(2, 3)}, p)
        >>> load_weights(nn.Linear(3, 2), p)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        layertap.errors.ModelSpecError: weights '...w.pt' do not match the model: 1 missing key: bias
    """
    file = Path(path)
    check_weights_path(file)
    note_input(file, "--weights")
    suffix = file.suffix.lower()
    if suffix == ".safetensors":  # keys and shapes from the header first: a wrong file costs no memory
        _check_state(model, _safetensors_shapes(file), file, what)
    state = _read_safetensors(file) if suffix == ".safetensors" else _read_torch(file, unsafe_pickle)
    state = _check_state(model, _state_dict_of(state, file), file, what)
    model.load_state_dict(state, strict=True)


def _check_state(model: nn.Module, state: dict, file: Path, what: str) -> dict:
    """``state`` with a DataParallel prefix dropped; raise when its keys or shapes differ from the model's."""
    state = _strip_prefix(state, model.state_dict())
    problems = state_dict_diff(model.state_dict(), state)
    if problems:
        raise ModelSpecError(f"weights '{file}' do not match {what}: {problems}")
    return state


def _safetensors_shapes(file: Path) -> dict[str, torch.Tensor]:
    """name -> a meta tensor of the stored shape, from the file's JSON header only.

    Read by hand: safetensors' own reader maps the whole file first, which
    fails (or costs address space) for a huge file before any key is compared.
    """
    import json

    try:
        with open(file, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if not 0 < size <= _SAFETENSORS_HEADER_MAX:
                raise ValueError(f"header size {size} is not plausible")
            header = json.loads(f.read(size))
        return {k: torch.empty(v["shape"], device="meta") for k, v in header.items() if k != "__metadata__"}
    except (OSError, ValueError, RecursionError, TypeError, KeyError, RuntimeError) as e:
        raise ModelSpecError(f"cannot read weights '{file}' as safetensors: {type(e).__name__}: {_first_line(e)}") from None


_SAFETENSORS_HEADER_MAX = 100 << 20  # the format's own limit


def _read_safetensors(file: Path) -> dict:
    try:
        from safetensors.torch import load_file
    except ImportError:
        raise ModelSpecError("reading .safetensors needs the 'safetensors' package; pip install safetensors") from None
    try:
        return load_file(str(file))
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error types
        raise ModelSpecError(f"cannot read weights '{file}' as safetensors: {e}") from None


def _read_torch(file: Path, unsafe_pickle: bool) -> Any:
    try:
        return _torch_load(file, weights_only=True)
    except pickle.UnpicklingError as e:
        found = _unsafe_globals(file, e)
        if not found:
            raise ModelSpecError(f"cannot read weights '{file}': not a torch checkpoint (unpickling failed)") from None
        if not unsafe_pickle:
            raise ModelSpecError(
                f"weights '{file}' are a pickled object that calls {', '.join(found[:3])} (not a plain state dict), "
                "which torch.load(weights_only=True) refuses; load it only if you trust the file: --unsafe-load-pickle"
            ) from None
    except Exception as e:  # noqa: BLE001 - a corrupt file makes the unpickler raise anything (KeyError...)
        raise ModelSpecError(
            f"cannot read weights '{file}' with torch.load ({type(e).__name__}: {_first_line(e)}); "
            "is it a state dict saved with torch.save?"
        ) from None
    try:
        return _torch_load(file, weights_only=False)
    except Exception as e:  # noqa: BLE001 - unpickling user files may raise anything
        raise ModelSpecError(f"cannot unpickle '{file}': {type(e).__name__}: {_first_line(e)}") from None


def _unsafe_globals(file: Path, error: Exception) -> list[str]:
    """What a pickle refused by ``weights_only=True`` would call, read from the file (never run):
    torch's own reader for its zip archives, the pickle opcodes for a plain pickle, else the name
    torch's message gives (its wording changes between versions: both known forms are read)."""
    import zipfile

    if zipfile.is_zipfile(file):
        try:
            found = torch.serialization.get_unsafe_globals_in_checkpoint(str(file))
        except Exception:  # noqa: BLE001 - a damaged archive: fall back to torch's message
            found = []
    else:
        found = _pickled_globals(file)
    refused = re.search(r"[Uu]nsupported (?:global: )?GLOBAL ([\w.]+)", str(error))
    return found or ([refused.group(1)] if refused else [])


def _pickled_globals(file: Path) -> list[str]:
    """The ``module.name`` globals a plain pickle file names (read, never run); empty when it is not a pickle.

    Example:
        >>> import pickle, os, tempfile
        >>> p = Path(tempfile.mkdtemp()) / "x.pt"
        >>> _ = p.write_bytes(pickle.dumps(os.path.join))
        >>> _pickled_globals(p)
        ['posixpath.join']
    """
    import pickletools

    names: list[str] = []
    strings: list[str] = []
    try:
        with open(file, "rb") as f:
            for op, arg, _ in pickletools.genops(f):
                if op.name == "GLOBAL":
                    names.append(str(arg).replace(" ", "."))
                elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                    names.append(f"{strings[-2]}.{strings[-1]}")
                elif isinstance(arg, str):
                    strings.append(arg)
    except Exception:  # noqa: BLE001 - not a pickle stream: the caller says so
        return []
    return list(dict.fromkeys(names))


def _torch_load(file: Path, *, weights_only: bool) -> Any:
    """``torch.load`` memory-mapped (tensors are read when used, so a key check costs no memory);
    files in the old non-zip format cannot be mapped and are read whole."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's notes on pickle protocols: the error says what matters
        try:
            return torch.load(str(file), map_location="cpu", weights_only=weights_only, mmap=True)
        except RuntimeError as e:
            if "mmap" not in str(e):
                raise
        return torch.load(str(file), map_location="cpu", weights_only=weights_only)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _state_dict_of(obj: Any, file: Path) -> dict[str, torch.Tensor]:
    """A state dict from what a file held: the dict itself, a checkpoint's
    ``state_dict``/``model`` entry, or a (trusted) pickled module's state."""
    if isinstance(obj, nn.Module):
        return obj.state_dict()
    if isinstance(obj, Mapping) and obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
        return dict(obj)
    if isinstance(obj, Mapping):
        for key in ("state_dict", "model_state_dict", "model", "module"):
            inner = obj.get(key)
            if isinstance(inner, nn.Module):
                return inner.state_dict()
            if isinstance(inner, Mapping) and inner and all(isinstance(v, torch.Tensor) for v in inner.values()):
                return dict(inner)
    raise ModelSpecError(f"weights '{file}' hold a {type(obj).__name__}, not a state dict of tensors")


def _strip_prefix(state: dict, expected: Mapping) -> dict:
    """Drop a ``module.`` prefix (DataParallel/DDP checkpoints) when that makes the keys match."""
    prefix = "module."
    if state and all(k.startswith(prefix) for k in state) and not any(k.startswith(prefix) for k in expected):
        return {k[len(prefix):]: v for k, v in state.items()}
    return state


def state_dict_diff(expected: Mapping[str, torch.Tensor], given: Mapping[str, torch.Tensor], limit: int = 4) -> str:
    """One line describing missing keys, unexpected keys and shape differences; ``""`` if none.

    Example:
        >>> state_dict_diff({"a": torch.zeros(2), "b": torch.zeros(1)}, {"a": torch.zeros(3), "c": torch.zeros(1)})
        '1 missing key: b; 1 unexpected key: c; 1 shape mismatch: a (file 3, model 2)'
    """

    def some(keys: list[str], fmt: Callable[[str], str] = str) -> str:
        shown = ", ".join(fmt(k) for k in keys[:limit])
        return shown + (f", ... ({len(keys) - limit} more)" if len(keys) > limit else "")

    def shape(t: torch.Tensor) -> str:
        return "x".join(str(d) for d in t.shape) or "scalar"

    missing = [k for k in expected if k not in given]
    unexpected = [k for k in given if k not in expected]
    mismatched = [k for k in expected if k in given and tuple(given[k].shape) != tuple(expected[k].shape)]
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing key{'s' if len(missing) > 1 else ''}: {some(missing)}")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected key{'s' if len(unexpected) > 1 else ''}: {some(unexpected)}")
    if mismatched:
        parts.append(
            f"{len(mismatched)} shape mismatch{'es' if len(mismatched) > 1 else ''}: "
            + some(mismatched, lambda k: f"{k} (file {shape(given[k])}, model {shape(expected[k])})")
        )
    return "; ".join(parts)


# -- inputs -------------------------------------------------------------------
def make_inputs(
    info: ModelInfo,
    specs: Sequence[InputSpec] = (),
    *,
    model: nn.Module | None = None,
    method: str = "forward",
    seed: int = 0,
) -> tuple[tuple, dict]:
    """Tensors for ``model.<method>(*args, **kwargs)`` from ``--input`` specs.

    Named specs become keyword arguments, unnamed ones positional. With no
    specs, the spec's defaults are used (for another method, only those it
    accepts). Integers are drawn below ``info.int_high`` (the vocabulary).

    Example:
        >>> info = ModelInfo("x", "module", [InputSpec.parse("2x3")])
        >>> args, kwargs = make_inputs(info)
        >>> args[0].shape, kwargs
        (torch.Size([2, 3]), {})
    """
    specs = list(specs)
    accepted = _accepted_names(model, method)
    if not specs:
        specs = [s for s in info.inputs if s.name is None or accepted is None or s.name in accepted]
    if not specs:
        raise LayertapError(
            f"no example inputs known for {info.spec}"
            + (f".{method}" if method != "forward" else "")
            + "; pass --input SHAPE[:DTYPE] (e.g. --input 1x3x224x224) or --input NAME=FILE.npy"
        )
    if accepted is not None:
        allowed = set(accepted)  # a set: thousands of --input stay linear
        for s in specs:
            if s.name is not None and s.name not in allowed:
                takes = f"{method}() takes: {', '.join(accepted[:12]) or 'no named inputs'}"
                raise LayertapError(unknown_name(f"input name for {method}()", s.name, accepted, hint=takes))
    rng = np.random.default_rng(seed)
    args: list[torch.Tensor] = []
    kwargs: dict[str, torch.Tensor] = {}
    for s in specs:
        # copy: .npy files load read-only, and torch wants writable memory
        tensor = torch.from_numpy(np.array(s.array(rng, int_high=info.int_high), copy=True))
        if s.name is None:
            args.append(tensor)
        else:
            kwargs[s.name] = tensor
    return tuple(args), kwargs


def _accepted_names(model: nn.Module | None, method: str) -> list[str] | None:
    """Keyword names ``model.<method>`` takes, in signature order; None when unknown
    or it takes only ``**kwargs`` (then every name is passed through)."""
    fn = getattr(model, method, None) if model is not None else None
    if fn is None:
        return None
    if method == "forward" and isinstance(model, nn.Module):
        fn = model.forward
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    names = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if any(p.kind is p.VAR_KEYWORD for p in params) and not names:
        return None
    return names


def describe_inputs(args: tuple, kwargs: dict) -> str:
    """``1x3x224x224 float32, input_ids=1x16 int64``."""

    def one(t: Any) -> str:
        if isinstance(t, torch.Tensor):
            return _shape_text(t.shape) + " " + str(t.dtype).replace("torch.", "")
        return type(t).__name__

    return ", ".join([one(a) for a in args] + [f"{k}={one(v)}" for k, v in kwargs.items()])


def run_failed(error: Exception, info: ModelInfo, method: str, args: tuple, kwargs: dict) -> LayertapError:
    """A one-line user error for a model that raised on the given inputs; when the
    spec knows its default inputs and these differ, it leads with the inputs expected.

    Example:
        >>> str(run_failed(RuntimeError("bad shape"), ModelInfo("m:M", "module"), "forward", (torch.zeros(2),), {}))
        'm:M.forward(2 float32) failed: RuntimeError: bad shape (check --input)'
        >>> info = ModelInfo("m:M", "module", [InputSpec.parse("1x3x8x8")])
        >>> print(run_failed(RuntimeError("bad shape"), info, "forward", (torch.zeros(1, 3, 8),), {}))
        m:M expects an input like 1x3x8x8 float32 (its default), got 1x3x8 float32: forward() failed with ...; pass --input 1x3x8x8, ...
    """
    msg = _first_line(error)
    given = describe_inputs(args, kwargs)
    defaults = [s for s in info.inputs if s.shape is not None] if method == "forward" else []
    wanted = ", ".join(f"{s.name + '=' if s.name else ''}{_shape_text(s.shape)} {s.dtype}" for s in defaults)
    if not defaults or len(defaults) != len(info.inputs) or wanted == given:
        return LayertapError(f"{info.spec}.{method}({given}) failed: {type(error).__name__}: {msg} (check --input)")
    options = " ".join(f"--input {s.name + '=' if s.name else ''}{_shape_text(s.shape)}"
                       f"{'' if s.dtype == 'float32' else ':' + s.dtype}" for s in defaults)
    return LayertapError(f"{info.spec} expects an input like {wanted} (its default), got {given}: {method}() failed with "
                         f"{type(error).__name__}: {msg}; pass {options}, or no --input for the default")


def _shape_text(shape: Sequence[int] | None) -> str:
    return "x".join(str(d) for d in shape or ())
