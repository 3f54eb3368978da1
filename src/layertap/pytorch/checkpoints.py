"""``--weights``: a state dict file loaded into a model with a strict, readable key check.

A training checkpoint holds the state dict under a key (``model_state``, ``state_dict``,
``model``, ``ema``, ...): the one that fits the model is taken and named, or ``--weights-key``
picks it; ``--weights-nonstrict`` loads the keys both sides hold and names the others.

``.safetensors`` files are read with safetensors, others with
``torch.load(weights_only=True)``; a pickled whole module only with
``unsafe_pickle`` (what it would call is read from the file and named first).
"""

from __future__ import annotations

import json
import os
import pickle
import pickletools
import re
import warnings
import zipfile
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
from torch import nn

from ..errors import LayertapWarning, ModelSpecError, one_line, unknown_name
from ..files.reads import note_input
from ..specs import check_weights_path


def load_weights(model: nn.Module, path: str | os.PathLike, *, unsafe_pickle: bool = False, what: str = "the model",
                 key: str | None = None, strict: bool = True) -> None:
    """Load a state dict file into ``model`` with a strict, readable key check.

    ``.safetensors`` files are read with safetensors; others with
    ``torch.load(weights_only=True)``, which refuses pickled code. A pickled
    whole module is accepted only with ``unsafe_pickle=True`` (its
    ``state_dict()`` is then used). A training checkpoint (``{"step": ..., "model_state":
    {...}, "optimizer_state": {...}}``) gives the one state dict found in it that fits the
    model (a :class:`~layertap.errors.LayertapWarning` names the key taken); a ``module.``
    (DataParallel) or ``_orig_mod.`` (torch.compile) prefix is removed.

    Args:
        model: the module the weights go into.
        path: a ``.safetensors`` file, or a file ``torch.save`` wrote.
        unsafe_pickle: accept a pickled whole module (runs code from the file).
        what: the model as error messages name it.
        key: the entry of a checkpoint that holds the state dict, nested keys joined by
            ``.`` (``ema.module``); on a flat state dict, the key prefix to keep (``model``
            keeps ``model.*`` without it).
        strict: every key of the model and of the file must match; ``False`` loads the
            keys both hold (as ``load_state_dict(strict=False)``) and warns which were
            skipped and which of the model's keep their values. Shapes must match either way.

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "w.pt")
        >>> torch.save({"weight": torch.zeros(2, 3)}, p)
        >>> load_weights(nn.Linear(3, 2), p)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        layertap.errors.ModelSpecError: weights '...w.pt' do not match the model: 1 missing key: bias; \
pass --weights-nonstrict to load the keys that match
    """
    file = Path(path)
    check_weights_path(file)
    note_input(file, "--weights")
    expected = model.state_dict()
    suffix = file.suffix.lower()
    if suffix == ".safetensors" and key is None:  # keys and shapes from the header first: a wrong file costs no memory
        shapes = _safetensors_shapes(file)
        problem = _dry_load(model, strip_prefixes(shapes, expected)[0], strict)
        if problem:
            _refuse(expected, shapes, file, what, strict, "", problem)
    obj = _read_safetensors(file) if suffix == ".safetensors" else _read_torch(file, unsafe_pickle)
    where, state = pick_state_dict(obj, file, expected, key, strict)
    state, removed = strip_prefixes(state, expected)
    # load_state_dict decides, with the model's own load hooks (a weight-normed layer saved as weight_g and
    # weight_v loads into its parametrization): the keys are named only when it refuses
    try:
        skipped = model.load_state_dict(state, strict=strict)
    except RuntimeError as e:
        _refuse(expected, state, file, what, strict, where, one_line(e, first=True))
    if where and key is None:
        _note_taken(file, obj, where, removed)
    if skipped.missing_keys or skipped.unexpected_keys:
        _note_nonstrict(file, skipped.unexpected_keys, skipped.missing_keys)


def _dry_load(model: nn.Module, shapes: Mapping[str, torch.Tensor], strict: bool) -> str:
    """What ``load_state_dict`` refuses in a state dict of meta tensors (``shapes``), with the model's own
    load hooks, reading no data and changing no parameter (a meta tensor cannot be copied from: those
    errors are this dry run's own and left out); ``""`` when it would load."""
    seen: dict[str, list[str]] = {}

    def keys(_module: nn.Module, incompatible: Any) -> None:
        seen.update(missing=list(incompatible.missing_keys), unexpected=list(incompatible.unexpected_keys))

    handle = model.register_load_state_dict_post_hook(keys)
    problems: list[str] = []
    try:
        model.load_state_dict(shapes, strict=False)
    except RuntimeError as e:
        problems = [ln.strip() for ln in str(e).splitlines()[1:] if ln.strip() and "Cannot copy out of meta" not in ln]
    finally:
        handle.remove()
    if strict and seen.get("missing"):
        problems.insert(0, f"missing keys: {_some(seen['missing'])}")
    if strict and seen.get("unexpected"):
        problems.insert(0, f"unexpected keys: {_some(seen['unexpected'])}")
    return "; ".join(problems)


def _refuse(expected: Mapping, state: Mapping, file: Path, what: str, strict: bool, where: str, why: str) -> None:
    """Raise for a state dict ``load_state_dict`` refused (``why``): the key diff where it explains it."""
    _check_state(expected, state, file, what, strict, where)
    under = f" (the state dict under '{where}')" if where else ""
    raise ModelSpecError(f"weights '{file}'{under} do not load into {what}: {why}")


def _check_state(expected: Mapping, state: Mapping, file: Path, what: str, strict: bool, where: str = "") -> None:
    """Raise when the keys or shapes of ``state`` (prefixes removed) cannot load into a model holding ``expected``."""
    state, _ = strip_prefixes(state, expected)
    missing, unexpected, mismatched = key_diff(expected, state)
    loadable = not mismatched and len(missing) < len(expected)
    if (missing or unexpected or mismatched) and (strict or not loadable):
        hint = "; pass --weights-nonstrict to load the keys that match" if strict and loadable else ""
        under = f" (the state dict under '{where}')" if where else ""
        raise ModelSpecError(f"weights '{file}'{under} do not match {what}: {state_dict_diff(expected, state)}{hint}")


def _note_taken(file: Path, obj: Any, where: str, removed: list[str]) -> None:
    others = [str(k) for k in obj if str(k) != where.split(".")[0]] if isinstance(obj, Mapping) else []
    text = f"weights '{file}': loaded the state dict under '{where}'"
    if removed:
        text += f" (key prefix {', '.join(repr(p) for p in removed)} removed)"
    if others:
        text += f"; not loaded: {_some(others)}"
    warnings.warn(text, LayertapWarning, stacklevel=3)


def _note_nonstrict(file: Path, skipped: list[str], missing: list[str]) -> None:
    parts = []
    if skipped:
        parts.append(f"skipped {len(skipped)} key{_s(skipped)} the model does not have: {_some(skipped)}")
    if missing:
        parts.append(f"{len(missing)} key{_s(missing)} of the model not in the file keep their initial values: {_some(missing)}")
    warnings.warn(f"weights '{file}' loaded non-strictly: {'; '.join(parts)}", LayertapWarning, stacklevel=3)


def _s(items: list) -> str:
    return "s" if len(items) != 1 else ""


def _some(keys: list[str], limit: int = 4, fmt: Callable[[str], str] = str) -> str:
    """Up to ``limit`` keys and how many more.

    Example:
        >>> _some(["a", "b", "c"], 2)
        'a, b, ... (1 more)'
    """
    shown = ", ".join(fmt(k) for k in keys[:limit])
    return shown + (f", ... ({len(keys) - limit} more)" if len(keys) > limit else "")


def _safetensors_shapes(file: Path) -> dict[str, torch.Tensor]:
    """name -> a meta tensor of the stored shape, from the file's JSON header only.

    Read by hand: safetensors' own reader maps the whole file first, which
    fails (or costs address space) for a huge file before any key is compared.
    """
    try:
        with open(file, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if not 0 < size <= _SAFETENSORS_HEADER_MAX:
                raise ValueError(f"header size {size} is not plausible")
            header = json.loads(f.read(size))
        return {k: torch.empty(v["shape"], device="meta") for k, v in header.items() if k != "__metadata__"}
    except (OSError, ValueError, RecursionError, TypeError, KeyError, RuntimeError) as e:
        raise ModelSpecError(f"cannot read weights '{file}' as safetensors: {type(e).__name__}: {one_line(e, first=True)}") from None


_SAFETENSORS_HEADER_MAX = 100 << 20  # the format's own limit


def _read_safetensors(file: Path) -> dict:
    try:
        from safetensors.torch import load_file  # noqa: PLC0415 -- optional
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
            f"cannot read weights '{file}' with torch.load ({type(e).__name__}: {one_line(e, first=True)}); "
            "is it a state dict saved with torch.save?"
        ) from None
    try:
        return _torch_load(file, weights_only=False)
    except Exception as e:  # noqa: BLE001 - unpickling user files may raise anything
        raise ModelSpecError(f"cannot unpickle '{file}': {type(e).__name__}: {one_line(e, first=True)}") from None


def _unsafe_globals(file: Path, error: Exception) -> list[str]:
    """What a pickle refused by ``weights_only=True`` would call, read from the file (never run):
    torch's own reader for its zip archives, the pickle opcodes for a plain pickle, else the name
    torch's message gives (its wording changes between versions: both known forms are read)."""
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
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's notes on pickle protocols: the error says what matters
        try:
            return torch.load(str(file), map_location="cpu", weights_only=weights_only, mmap=True)
        except RuntimeError as e:
            if "mmap" not in str(e):
                raise
        return torch.load(str(file), map_location="cpu", weights_only=weights_only)


def _is_state(obj: Any) -> bool:
    return isinstance(obj, Mapping) and bool(obj) and all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                          for k, v in obj.items())


def find_state_dicts(obj: Any, where: str = "", depth: int = 4) -> list[tuple[str, dict[str, torch.Tensor]]]:
    """Every state dict in what a file held, with the keys leading to it (``.``-joined; ``""``:
    the object itself): mappings of tensors, and (trusted) pickled modules, through nested
    string-keyed dicts (an optimizer's state, keyed by parameter number, is not entered).

    Example:
        >>> ckpt = {"step": 3, "model_state": {"w": torch.zeros(1)}, "ema": {"module": {"w": torch.ones(1)}}}
        >>> [where for where, _ in find_state_dicts(ckpt)]
        ['model_state', 'ema.module']
    """
    if isinstance(obj, nn.Module):
        return [(where, obj.state_dict())]
    if _is_state(obj):
        return [(where, dict(obj))]
    if not isinstance(obj, Mapping) or depth == 0:
        return []
    found = []
    for k, v in obj.items():
        if isinstance(k, str):
            found += find_state_dicts(v, f"{where}.{k}" if where else k, depth - 1)
    return found


def pick_state_dict(obj: Any, file: Path, expected: Mapping[str, torch.Tensor], key: str | None = None,
                    strict: bool = True) -> tuple[str, dict[str, torch.Tensor]]:
    """``(where, state)``: the state dict under ``key``, else the one in ``obj`` (or the one of
    several that fits ``expected``); refused, naming the keys to pass, when none or several fit."""
    if key is not None:
        return key, _under_key(obj, key, file)
    found = find_state_dicts(obj)
    if not found:
        held = f" with keys {_some([str(k) for k in obj], 8)}" if isinstance(obj, Mapping) and obj else ""
        raise ModelSpecError(f"weights '{file}' hold a {type(obj).__name__}{held} and no state dict of tensors in it; "
                             "save model.state_dict(), or pass --weights-key KEY naming the entry that holds it")
    if len(found) == 1:
        return found[0]
    fitting = [(where, state) for where, state in found if _fits(expected, state, strict)]
    if len(fitting) == 1:
        return fitting[0]
    names = [where or "(the whole file)" for where, _ in fitting or found]
    fit = " that fit the model" if fitting else ", none of which fits the model"
    raise ModelSpecError(f"weights '{file}' hold {len(names)} state dicts{fit}: {', '.join(names)}; "
                         f"pass --weights-key with the one to load (e.g. --weights-key {names[0]})")


def _fits(expected: Mapping[str, torch.Tensor], state: Mapping[str, torch.Tensor], strict: bool) -> bool:
    missing, unexpected, mismatched = key_diff(expected, strip_prefixes(state, expected)[0])
    return not mismatched and (not (missing or unexpected) if strict else len(missing) < len(expected))


def _under_key(obj: Any, key: str, file: Path) -> dict[str, torch.Tensor]:
    """The state dict under ``key`` (nested keys joined by ``.``; within a flat state dict, a key prefix)."""
    node, parts = obj, key.split(".")
    for i, part in enumerate(parts):
        if isinstance(node, nn.Module):
            node = node.state_dict()
        if _is_state(node):  # flat: the rest of KEY is a prefix of its keys
            prefix = ".".join(parts[i:]) + "."
            sub = {k[len(prefix):]: v for k, v in node.items() if k.startswith(prefix)}
            if sub:
                return sub
        if not isinstance(node, Mapping) or part not in node:
            known = [w for w, _ in find_state_dicts(obj) if w] + ([str(k) for k in obj] if isinstance(obj, Mapping) else [])
            raise ModelSpecError(f"weights '{file}': " + unknown_name("key", key, known, f"the file holds: {_some(known, 8)}"))
        node = node[part]
    if isinstance(node, nn.Module):
        return node.state_dict()
    if not _is_state(node):
        raise ModelSpecError(f"weights '{file}': --weights-key {key} holds a {type(node).__name__}, not a state dict of tensors")
    return dict(node)


#: key prefixes wrappers add: DataParallel/DDP (``module.``), torch.compile (``_orig_mod.``)
WRAPPER_PREFIXES = ("module", "_orig_mod")


def strip_prefixes(state: Mapping[str, torch.Tensor], expected: Mapping) -> tuple[dict[str, torch.Tensor], list[str]]:
    """``state`` without the ``module.`` prefix of DataParallel/DDP and the ``_orig_mod.`` of
    torch.compile (anywhere in a key: a compiled submodule), where the model's own keys have
    none; and the prefixes removed.

    Example:
        >>> strip_prefixes({"module._orig_mod.fc.weight": torch.zeros(1)}, {"fc.weight": None})
        ({'fc.weight': tensor([0.])}, ['module.', '_orig_mod.'])
    """
    state, removed = dict(state), []
    if any(k == "_orig_mod" or "._orig_mod." in f".{k}" for k in state) and not any("_orig_mod" in k for k in expected):
        state = {".".join(p for p in k.split(".") if p != "_orig_mod"): v for k, v in state.items()}
        removed.append("_orig_mod.")
    prefix = "module."
    if state and all(k.startswith(prefix) for k in state) and not any(k.startswith(prefix) for k in expected):
        state = {k[len(prefix):]: v for k, v in state.items()}
        removed.insert(0, prefix)
    return state, removed


def key_diff(expected: Mapping[str, torch.Tensor], given: Mapping[str, torch.Tensor]) -> tuple[list[str], list[str], list[str]]:
    """``(missing, unexpected, mismatched)``: the model's keys the file lacks, the file's keys the
    model lacks, and keys both hold with other shapes.

    Example:
        >>> key_diff({"a": torch.zeros(2), "b": torch.zeros(1)}, {"a": torch.zeros(3), "c": torch.zeros(1)})
        (['b'], ['c'], ['a'])
    """
    missing = [k for k in expected if k not in given]
    unexpected = [k for k in given if k not in expected]
    mismatched = [k for k in expected if k in given and tuple(given[k].shape) != tuple(expected[k].shape)]
    return missing, unexpected, mismatched


def state_dict_diff(expected: Mapping[str, torch.Tensor], given: Mapping[str, torch.Tensor], limit: int = 4) -> str:
    """One line describing missing keys, unexpected keys and shape differences; ``""`` if none.

    Example:
        >>> state_dict_diff({"a": torch.zeros(2), "b": torch.zeros(1)}, {"a": torch.zeros(3), "c": torch.zeros(1)})
        '1 missing key: b; 1 unexpected key: c; 1 shape mismatch: a (file 3, model 2)'
    """

    def shape(t: torch.Tensor) -> str:
        return "x".join(str(d) for d in t.shape) or "scalar"

    missing, unexpected, mismatched = key_diff(expected, given)
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing key{_s(missing)}: {_some(missing, limit)}")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected key{_s(unexpected)}: {_some(unexpected, limit)}")
    if mismatched:
        parts.append(
            f"{len(mismatched)} shape mismatch{'es' if len(mismatched) > 1 else ''}: "
            + _some(mismatched, limit, lambda k: f"{k} (file {shape(given[k])}, model {shape(expected[k])})")
        )
    return "; ".join(parts)
