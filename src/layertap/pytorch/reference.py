"""A PyTorch model as a command runs it, in one place: a :class:`~layertap.options.Model` (a module or a
MODEL spec) loaded once, the arguments of its example call (tensors given, ``--input`` specs drawn as
the model accepts them, or a spec's defaults), ``N`` seeded samples drawn like them, and the image recipe
its zoo records. ``lt.compare``, ``lt.repro``, ``lt.fix``, ``lt.extract_dataset`` and the CLI's
PyTorch-only commands all go through here."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

from ..errors import LayertapError
from ..inputs import as_specs
from ..options import Model, SampleOptions, current_progress
from ..samples.images import Preprocess
from .example_inputs import draw_samples, make_inputs
from .models import ModelInfo, load_model
from .preprocessing import zoo_recipe
from .values import random_like


@dataclass(frozen=True)
class Loaded:
    """A model ready to run: the module (eval mode), what its spec knows (``info``: default inputs, the
    vocabulary; ``None`` for a module given as such) and the :class:`Model` it came from (``method``,
    ``kwargs``)."""

    module: nn.Module
    info: ModelInfo | None
    model: Model

    @property
    def method(self) -> str | Callable[..., Any]:
        return self.model.method

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.model.kwargs or {})

    @property
    def name(self) -> str:
        """How messages name the model: its spec, else its class."""
        return self.model.spec or type(self.module).__name__

    # what its samples borrow from it (samples.for_reference.ModelReference): the parts that need torch
    def example(self, args: Any, sampling: SampleOptions) -> tuple[Any, dict[str, Any], SampleOptions]:
        """Its example call (:func:`example_call`)."""
        return example_call(self, args, sampling)

    def like(self, args: tuple, seed: int) -> tuple:
        """Random tensors shaped and typed like ``args`` (:func:`~layertap.pytorch.values.random_like`)."""
        return random_like(args, seed)

    def tensors(self, arrays: Sequence[np.ndarray]) -> tuple[torch.Tensor, ...]:
        """Arrays read for the inputs a file declares, in its input order, as positional tensors."""
        return as_tensors(arrays)

    def recipe(self) -> Preprocess | None:
        """The image recipe its zoo records (:func:`recipe`)."""
        return recipe(self)


def as_tensors(arrays: Sequence[np.ndarray]) -> tuple[torch.Tensor, ...]:
    """Arrays (a sample read for a file's inputs, in its input order) as a model's positional tensors.

    Example:
        >>> [t.shape for t in as_tensors([np.zeros((1, 2), np.float32)])]
        [torch.Size([1, 2])]
    """
    return tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in arrays)


def load(model: Model | nn.Module | str, *, device: str = "cpu", max_bytes: int | None = None) -> Loaded:
    """``model`` loaded once: a MODEL spec built with its weights (the progress receiver of
    :func:`~layertap.options.reporting` hears ``loading SPEC``), a module taken as it is.

    Example:
        >>> from torch import nn
        >>> loaded = load(nn.Linear(2, 3))
        >>> loaded.name, loaded.info, loaded.method
        ('Linear', None, 'forward')
        >>> load("torchvision:resnet18").info.inputs[0].shape
        (1, 3, 224, 224)
    """
    model = Model.of(model)
    if model.spec is None:
        if not isinstance(model.source, nn.Module):
            raise LayertapError(f"expected an nn.Module, a MODEL spec (torchvision:resnet18, file.py:Net) or an ONNX "
                                f"file, got {type(model.source).__name__}")
        if model.weights is not None:
            raise LayertapError("weights= loads a state dict into a model a MODEL spec builds; load it into your "
                                "module yourself (module.load_state_dict)")
        return Loaded(model.source, None, model)
    progress = current_progress()
    if progress is not None:
        progress.step(f"loading {model.spec}")
    # the source itself: a ModelSpec the CLI checked is not checked again
    module, info = load_model(model.source, device=device, max_bytes=max_bytes, **model.loading)
    return Loaded(module, info, model)


def example_call(loaded: Loaded, args: Any, sampling: SampleOptions) -> tuple[Any, dict[str, Any], SampleOptions]:
    """``(args, kwargs, sampling)`` of a PyTorch run: tensors given stay as they are; ``--input`` specs
    (or none, for a spec's defaults) become tensors as the model's method accepts them, seeded by
    ``sampling.seed``, and ``sampling.samples=N`` becomes N samples drawn the same way (the first the
    example); samples read from ``sampling.inputs`` keep ``args`` empty and get the zoo's image recipe
    unless ``sampling.preprocess`` names one.

    Example:
        >>> from torch import nn
        >>> loaded = load(nn.Linear(3, 2))
        >>> a, kw, s = example_call(loaded, ["2x3"], SampleOptions())
        >>> a[0].shape, kw
        (torch.Size([2, 3]), {})
        >>> a, kw, s = example_call(loaded, ["2x3"], SampleOptions(samples=3))  # N samples: args in them
        >>> a, len(s.samples), s.samples[2][0].shape
        (None, 3, torch.Size([2, 3]))
    """
    if sampling.inputs is not None:  # the samples are read from there; --input specs only said their shapes
        preprocess = sampling.preprocess if sampling.preprocess is not None else recipe(loaded)
        return (None if as_specs(args) is not None else args), loaded.kwargs, replace(sampling, preprocess=preprocess)
    specs = as_specs(args)
    listed = sampling.samples is not None and not isinstance(sampling.samples, int)
    if (args is not None and specs is None) or (args is None and listed):  # the tensors themselves
        return args, loaded.kwargs, sampling
    specs = specs or []
    if loaded.info is None and not specs:
        raise LayertapError(f"{loaded.name} has no default inputs: give one sample (args), or --input specs "
                            "(e.g. [\"1x3x224x224\"])")

    info = loaded.info or ModelInfo(loaded.name, "module")
    method = loaded.method if isinstance(loaded.method, str) else "forward"
    first = make_inputs(info, specs, model=loaded.module, method=method, seed=sampling.seed)
    kwargs = {**loaded.kwargs, **first[1]}
    n = sampling.samples
    if isinstance(n, int) and n > 1:
        drawn = draw_samples(info, specs, n, first, model=loaded.module, method=method, seed=sampling.seed)
        return None, loaded.kwargs, replace(sampling, samples=drawn)
    return first[0], kwargs, replace(sampling, samples=None) if isinstance(n, int) else sampling


def recipe(loaded: Loaded | Model | nn.Module | str) -> Preprocess | None:
    """The image recipe a model's zoo records: a ``torchvision:`` or ``timm:`` spec's weights transform, a
    timm module's data config; ``None`` for anything else (images are then read at the model input's own
    size). The one place a recipe is chosen from a model.

    Example:
        >>> recipe("torchvision:resnet18").crop, recipe("pkg.mod:attr")
        ((224, 224), None)
    """
    if isinstance(loaded, Loaded):  # torchvision's recipe is in its weights enum, timm's on the module
        spec = loaded.model.spec or ""
        return zoo_recipe(spec if spec.startswith("torchvision:") else loaded.module)
    model = Model.of(loaded)
    return zoo_recipe(model.spec if model.spec is not None else model.source)
