"""``--weights``: a state dict file loaded into a model with a strict, readable key check.

``.safetensors`` files are read with safetensors, others with
``torch.load(weights_only=True)``; a pickled whole module only with
``unsafe_pickle`` (what it would call is read from the file and named first).
"""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
from torch import nn

from ..errors import ModelSpecError, first_line
from ..files.reads import note_input
from ..specs import check_weights_path


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
        raise ModelSpecError(f"cannot read weights '{file}' as safetensors: {type(e).__name__}: {first_line(e)}") from None


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
            f"cannot read weights '{file}' with torch.load ({type(e).__name__}: {first_line(e)}); "
            "is it a state dict saved with torch.save?"
        ) from None
    try:
        return _torch_load(file, weights_only=False)
    except Exception as e:  # noqa: BLE001 - unpickling user files may raise anything
        raise ModelSpecError(f"cannot unpickle '{file}': {type(e).__name__}: {first_line(e)}") from None


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
