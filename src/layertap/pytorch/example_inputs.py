"""Example inputs for a model run: tensors from ``--input`` specs or the spec's
defaults, their one-line description, and the error for a run that failed on them; the example a
model is exported with from ``--inputs``' first sample (``example_from_samples``)."""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from ..errors import LayertapError, one_line, unknown_name
from ..inputs import InputSpec, spec_arrays
from ..samples.loading import load_samples
from .models import ModelInfo


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
    args: list[torch.Tensor] = []
    kwargs: dict[str, torch.Tensor] = {}
    for s, array in zip(specs, spec_arrays(specs, seed, info.int_high)):
        # copy: .npy files load read-only, and torch wants writable memory
        tensor = torch.from_numpy(array if array.flags.writeable else np.array(array, copy=True))
        if s.name is None:
            args.append(tensor)
        else:
            kwargs[s.name] = tensor
    return tuple(args), kwargs


def draw_samples(info: ModelInfo, specs: Sequence[InputSpec], n: int, first: tuple[tuple, dict], *,
                 model: nn.Module | None = None, method: str = "forward", seed: int = 0) -> list[Any]:
    """``n`` samples for ``compare``: ``first`` (the example's ``(args, kwargs)``), then
    :func:`make_inputs` with seeds ``seed + 1`` ... ``seed + n - 1``; each one positional
    arguments, or a dict when the model takes keywords.

    Example:
        >>> info = ModelInfo("x", "module", [InputSpec.parse("2x3")])
        >>> drawn = draw_samples(info, [], 3, make_inputs(info))
        >>> len(drawn), drawn[2][0].shape
        (3, torch.Size([2, 3]))
    """
    pairs = [first] + [make_inputs(info, specs, model=model, method=method, seed=seed + i) for i in range(1, n)]
    return [_as_sample(a, k) for a, k in pairs]


def _as_sample(args: tuple, kwargs: dict) -> Any:
    """A sample for ``compare``: positional args, or a dict when the model takes keywords."""
    if kwargs and not args:
        return dict(kwargs)
    if kwargs:
        raise LayertapError("--samples with both positional and named inputs: name every --input, or none")
    return tuple(args)


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
    msg = one_line(error, first=True)
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


def example_from_samples(model: Any, path: str | os.PathLike) -> tuple[Any, ...]:
    """The first sample of ``--inputs PATH`` as the tensors a PyTorch model is exported with, when no
    ``--input`` gives its shape: its arrays fill ``forward``'s parameters that have no default, in
    order (or by name). No file says the inputs' ranks yet, so the sample is tried with a batch axis
    of 1 before it (a ``.npz`` row, an image), then as stored (a row that holds its own batch axis):
    the first layout the model runs on is taken, and the samples are then read against the
    exported file's inputs as for any file.

    Raises:
        LayertapError: the file holds no sample, or the model runs on neither layout (naming both).
    """
    p = Path(path)
    params = inspect.signature(model.forward).parameters.values()
    names = [q.name for q in params if q.kind in (q.POSITIONAL_ONLY, q.POSITIONAL_OR_KEYWORD) and q.default is q.empty]
    names = names or ["input"]
    first = load_samples(p, names, [None] * len(names), limit=1)
    if not first:
        raise LayertapError(f"--inputs '{p}' holds no sample to export the model with; give --input SHAPE")
    rows = p.is_file() and p.suffix == ".npz"  # a .npz row keeps its leading axis: its own layout is a[i]
    stored = [first[0][n][0] if rows else first[0][n] for n in names]
    errors: list[str] = []
    for layout in ([a[None] for a in stored], stored):
        args = tuple(torch.from_numpy(np.array(a)) for a in layout)
        try:
            with torch.no_grad():
                model(*args)
        except Exception as e:  # noqa: BLE001 - the model's own error, said in one line below
            errors.append(f"{' '.join('x'.join(map(str, a.shape)) for a in layout)} ({type(e).__name__}: {one_line(e, first=True)})")
            continue
        return args
    raise LayertapError(f"--inputs '{p}': the model runs on its first sample neither with a batch axis nor as stored: "
                        f"{'; '.join(errors)}; give --input SHAPE")
