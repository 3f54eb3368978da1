"""The weights inside a LiteRT program against the model's parameters (imported only for a ``.tflite``): what
``compare`` checks of a program beside the record it carries of the weights it was converted from, so that a
weight changed inside the program itself is named at its module.

A program holds each weight as a constant tensor that litert-torch names by the modules of the op reading it:
one ``Class_attribute`` segment per level under the tap wrapper (``.../torch.nn.modules.conv.Conv2d_conv2;1``),
several such locations for an op fused from several modules (a Conv, its BatchNorm and ReLU). Each parameter is
looked for among the constants of its own module's ops by shape and values: its axes in any order (a Conv's
``OIHW`` held as ``OHWI``, a depthwise one as ``1HWO``), as it is or with a BatchNorm of the same op folded in
(by output channel, as after a Conv, or by input channel, as before one; a BatchNorm alone as its scale and
shift), within the constant's format (the runtime dequantises it and says how far it may round: half a step of
its channel's scale for int8, float16's rounding).

A constant none of its module's parameters explains is that module's parameter changed only where nothing else
could have made it: a weight of two axes or more that fits one parameter's shape (a bias or a norm's scale alone
can be any neighbour's constants folded in: a hard sigmoid's ``+3`` in an SE block's bias), and, unless the
op is made of torch's own modules alone (the parameter's, BatchNorms, activations), not the parameter scaled per
channel (a fold of another module's scale, or the module's own reparametrisation: weight norm, standardised
weights). Those are left out: never a finding on a healthy program.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Collection, Iterable, Iterator

import numpy as np
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from .wrapper import TapWrapper

#: a program's constant tensor: its name (the locations of the op reading it), its values as float32 (dequantised)
#: and the rounding its format allows each value (broadcast against the values)
Constant = tuple[str, np.ndarray, np.ndarray]
#: a value recomputed here (a BatchNorm folded in) may land an ulp or two from the converter's
_RECOMPUTED = 1e-5
#: the attribute litert-torch's root (``layertap.pytorch.litert._Named``) holds the tap wrapper under, and the
#: tap wrapper the model under (:class:`~.wrapper.TapWrapper`)
_WRAPPER, _MODEL = "wrapper", "model"


def held_weights(model: nn.Module, constants: Iterable[Constant], names: Collection[str],
                 locate: Callable[[str], list[str]] | None = None) -> dict[str, float | None]:
    """The parameters ``names`` of ``model`` found among a program's ``constants``: ``None`` where the program holds
    the parameter's value (within its format), else the relative difference (``max|held - model| / max|model|``)
    of the constant that can only be that parameter. Parameters not found, or not told apart from a converter's
    fold, are left out. ``locate``: a constant's name -> the module paths it names (default: as litert-torch names
    them under layertap's tap wrapper, :func:`located`; a program converted from elsewhere names them otherwise).

    Example:
        >>> import torch
        >>> m = nn.Sequential(nn.Linear(3, 4))
        >>> where = ("layertap.pytorch.litert._Named/layertap.pytorch.wrapper.TapWrapper_wrapper/"
        ...          "torch.nn.modules.container.Sequential_model/torch.nn.modules.linear.Linear_0;1")
        >>> w = m[0].weight.detach().numpy()
        >>> held_weights(m, [(where, w.copy(), np.zeros(1, np.float32))], ["0.weight", "0.bias"])
        {'0.weight': None}
        >>> held_weights(m, [(where, w * np.float32(2), np.zeros(1, np.float32))], ["0.weight"])
        {'0.weight': 1.0}
    """
    params = {n: p.detach().float().cpu().numpy() for n, p in model.named_parameters()
              if n in names and p.is_floating_point()}
    owned: dict[str, list[str]] = {}
    for n in params:
        owned.setdefault(n.rpartition(".")[0], []).append(n)
    locate = locate or _under_wrapper(model)
    found: dict[str, float | None] = {}
    unexplained = []
    for name, value, allow in constants:
        modules = locate(name)
        candidates = [n for m in modules for n in owned.get(m, ()) if _same_axes(params[n].shape, value.shape)]
        hit = next((n for n in candidates if any(_within(e, value, allow) for e in _expected(model, n, params[n], modules)
                                                 )), None)
        if hit is not None:
            found[hit] = None
        elif candidates:
            unexplained.append((modules, candidates, value, allow))
    for modules, candidates, value, allow in unexplained:
        changed = [n for n in candidates if n not in found and _axes(params[n].shape) >= 2]
        if not changed:
            continue  # a bias or a scale alone, or a parameter the program holds elsewhere: no telling
        n = changed[0]
        if not _told(model, n.rpartition(".")[0], modules) and _scaled(params[n], value, allow):
            continue  # a fold or a reparametrisation of scales this check does not know: no telling
        rel = min(_rel(e, value) for e in _expected(model, n, params[n], modules))
        found[n] = max(rel, found.get(n) or 0.0)
    return found


def module_locations(model: nn.Module) -> dict[str, str]:
    """Each module's location as litert-torch names it under the tap wrapper (``Class_attribute`` segments joined by
    ``/``, from the model's own, ``Class_model``; without it too, as a method other than ``forward`` runs the
    model's children) -> its path (``""``: the model itself).

    Example:
        >>> for location, path in module_locations(nn.Sequential(nn.Linear(2, 2))).items():
        ...     print(repr(path), location)
        '' torch.nn.modules.container.Sequential_model
        '0' torch.nn.modules.container.Sequential_model/torch.nn.modules.linear.Linear_0
        '0' torch.nn.modules.linear.Linear_0
    """
    root = f"{_class_name(type(model))}_{_MODEL}"
    out = {root: ""}

    def walk(module: nn.Module, location: str, path: str) -> None:
        for name, child in module.named_children():
            here = f"{location}/{_class_name(type(child))}_{name}" if location else f"{_class_name(type(child))}_{name}"
            out.setdefault(f"{root}/{here}", f"{path}.{name}" if path else name)
            out.setdefault(here, out[f"{root}/{here}"])
            walk(child, here, out[here])

    walk(model, "", "")
    return out


def _under_wrapper(model: nn.Module) -> Callable[[str], list[str]]:
    """A constant's name -> the module paths it names, as litert-torch names them under layertap's tap wrapper."""
    locations = module_locations(model)
    return lambda name: located(name, locations)


def located(name: str, locations: dict[str, str]) -> list[str]:
    """The module paths a constant's name locates (:func:`module_locations`; the ops it was fused from), in the
    name's order: each ``;``-separated location, under the tap wrapper.

    Example:
        >>> located("x._Named/layertap.pytorch.wrapper.TapWrapper_wrapper/m.M_model/a.B_fc;1", {"m.M_model/a.B_fc": "fc"})
        ['fc']
    """
    wrapper = f"{_class_name(TapWrapper)}_{_WRAPPER}"
    out: list[str] = []
    for piece in name.split(";"):
        segments = piece.split("/")
        if wrapper in segments:
            path = locations.get("/".join(segments[segments.index(wrapper) + 1:]))
            if path is not None and path not in out:
                out.append(path)
    return out


def _class_name(cls: type) -> str:
    """A class as litert-torch names it in a location (its module and qualified name)."""
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _told(model: nn.Module, owner: str, modules: list[str]) -> bool:
    """Whether the op of ``modules`` can hold the parameters of module ``owner`` only as they are or through the
    folds :func:`_expected` knows: ``owner`` is one of torch's own modules (its ``forward`` uses its parameters
    as they are), and every other module of the op a BatchNorm or one of torch's own without parameters of its
    own (an activation: nothing it computes folds into a weight as a scale)."""
    def plain(module: nn.Module) -> bool:
        return type(module).__module__.startswith("torch.nn.")

    if not plain(model.get_submodule(owner)):
        return False
    others = [model.get_submodule(m) for m in modules if m != owner]
    return all(_folds(m) or (plain(m) and next(m.parameters(recurse=False), None) is None) for m in others)


def _axes(shape: tuple[int, ...]) -> int:
    return sum(d != 1 for d in shape)


def _same_axes(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Whether shapes ``a`` and ``b`` hold the same axes in some order (axes of size 1 aside)."""
    return sorted(d for d in a if d != 1) == sorted(d for d in b if d != 1) and int(np.prod(a)) == int(np.prod(b))


def _aligned(expected: np.ndarray, shape: tuple[int, ...]) -> Iterator[np.ndarray]:
    """``expected`` with its axes in each order that gives ``shape`` (axes of size 1 aside)."""
    squeezed = expected.reshape([d for d in expected.shape if d != 1])
    want = [d for d in shape if d != 1]
    for order in itertools.permutations(range(squeezed.ndim)):
        if [squeezed.shape[i] for i in order] == want:
            yield np.transpose(squeezed, order).reshape(shape)


def _within(expected: tuple[np.ndarray, np.ndarray], value: np.ndarray, allow: np.ndarray) -> bool:
    """Whether ``value`` holds ``expected`` (in some order of its axes) within ``allow`` and a recomputation's ulps
    (relative to the magnitude of the terms that made each value)."""
    values, terms = expected
    for e, t in zip(_aligned(values, value.shape), _aligned(terms, value.shape)):
        if bool(np.all(np.abs(value - e) <= allow * 1.01 + t * _RECOMPUTED)):
            return True
    return False


def _rel(expected: tuple[np.ndarray, np.ndarray], value: np.ndarray) -> float:
    """The least ``max|value - expected| / max|expected|`` over the orders of ``expected``'s axes."""
    values = expected[0]
    top = float(np.max(np.abs(values), initial=0.0)) or 1.0
    return min((float(np.max(np.abs(value - e), initial=0.0)) / top for e in _aligned(values, value.shape)),
               default=float("inf"))


def _scaled(param: np.ndarray, value: np.ndarray, allow: np.ndarray) -> bool:
    """Whether ``value`` is ``param`` (in some order of its axes) times a factor plus an offset per channel of some
    axis, or of the whole tensor: what a converter's fold of a neighbour's scale, or a module's own
    reparametrisation, makes of a weight. Within twice the format's rounding: a least-squares fit."""
    limit = np.broadcast_to(allow, value.shape).astype(np.float64) * 2
    for e in _aligned(param, value.shape):
        for axis in [None, *(i for i, d in enumerate(value.shape) if d > 1)]:
            x, y, lim = _rows(e.astype(np.float64), axis), _rows(value.astype(np.float64), axis), _rows(limit, axis)
            if x.shape[1] <= 2:
                return True  # any two values fit a line
            dx, dy = x - x.mean(1, keepdims=True), y - y.mean(1, keepdims=True)
            var = np.einsum("ij,ij->i", dx, dx)
            slope = np.divide(np.einsum("ij,ij->i", dx, dy), var, out=np.zeros_like(var), where=var > 0)
            ulps = np.abs(y).max(1, keepdims=True) * _RECOMPUTED  # the fit's own rounding, relative to the row
            if bool(np.all(np.abs(dy - slope[:, None] * dx) <= lim + ulps)):
                return True
    return False


def _rows(a: np.ndarray, axis: int | None) -> np.ndarray:
    """``a`` as one row per channel of ``axis`` (``None``: one row)."""
    return a.reshape(1, -1) if axis is None else np.moveaxis(a, axis, 0).reshape(a.shape[axis], -1)


def _expected(model: nn.Module, name: str, param: np.ndarray, modules: list[str]
              ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """What a program may hold for parameter ``name`` in an op of ``modules``, each with the magnitude of the terms
    that made it (a recomputation's rounding is relative to them): the parameter, and the BatchNorm folds of the
    op's BatchNorms (a Conv's or Linear's weight scaled per output or input channel, its bias moved and scaled; a
    BatchNorm's own weight and bias as the scale and shift it applies)."""
    yield param, np.abs(param)
    path, _, leaf = name.rpartition(".")
    owner = model.get_submodule(path)
    if _folds(owner) and leaf in ("weight", "bias"):
        scale, shift, terms = _affine(owner)
        yield (scale, np.abs(scale)) if leaf == "weight" else (shift, terms)
    for m in modules:
        bn = model.get_submodule(m)
        if m == path or not _folds(bn):
            continue
        scale, shift, terms = _affine(bn)
        if leaf == "weight" and param.ndim >= 2:
            for axis in (0, 1):
                if param.shape[axis] == scale.size:
                    shape = [1] * param.ndim
                    shape[axis] = scale.size
                    folded = param * scale.reshape(shape)
                    yield folded, np.abs(folded)
        elif leaf == "bias" and param.shape == scale.shape:
            yield param * scale + shift, np.abs(param * scale) + terms


def _folds(module: nn.Module) -> bool:
    """Whether ``module`` is a BatchNorm with running statistics (one a converter folds into its neighbours)."""
    return isinstance(module, _BatchNorm) and module.running_var is not None and module.running_mean is not None


def _affine(bn: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A BatchNorm in inference as ``x * scale + shift`` per channel (float64), and the magnitude of the terms of
    ``shift`` (``|mean * scale| + |beta|``: a shift near zero is a difference of larger terms)."""
    var = bn.running_var.detach().cpu().double().numpy()
    mean = bn.running_mean.detach().cpu().double().numpy()
    scale = 1.0 / np.sqrt(var + bn.eps)
    beta = np.zeros_like(scale)
    if bn.weight is not None:
        scale = scale * bn.weight.detach().cpu().double().numpy()
        beta = bn.bias.detach().cpu().double().numpy()
    return scale, beta - mean * scale, np.abs(mean * scale) + np.abs(beta)
