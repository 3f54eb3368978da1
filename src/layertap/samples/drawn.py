"""Samples given and drawn: the samples a caller gave (``args``/``samples``) and how many more to
draw, the samples ``--input`` specs make, and the one drawing of random samples for a file's
declared inputs (``compare`` and ``fix`` draw the same samples from the same seed). numpy only."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from ..errors import InputSpecError, LayertapError
from ..inputs import SYMBOLIC_SIZE, random_samples, spec_arrays
from ..onnxfile.kvcache import complete_feeds

if TYPE_CHECKING:  # pragma: no cover
    from ..inputs import InputSpec
    from ..onnxfile.kvcache import KvLayout

Sample = dict[str, np.ndarray] | list[np.ndarray]
#: ``draw(inputs, shapes, bounds, n)``: ``n`` random samples of a file's inputs
Draw = Callable[[list[tuple[str, str]], dict[str, tuple], dict[str, int | None], int], list[Any]]


def given_samples(args: Any, samples: Any) -> tuple[list[Any], int]:
    """``compare``'s ``args`` and ``samples`` as the samples given and how many more to draw at
    random: ``samples=N`` adds ``N - 1`` to ``args`` (``N`` without ``args``), a list replaces
    ``args``. Raises :class:`~layertap.errors.LayertapError` for ``N < 1`` or an empty list.

    Example:
        >>> given_samples("x", 3), given_samples(None, None), given_samples("x", ["a", "b"])
        ((['x'], 2), ([], 1), (['a', 'b'], 0))
    """
    given = [] if args is None else [args]
    if isinstance(samples, int) and not isinstance(samples, bool):
        if samples < 1:
            raise LayertapError(f"samples must be a positive number, got {samples!r}")
        return given, samples - len(given)
    if samples is not None:
        given = list(samples)
        if not given:
            raise LayertapError("samples is empty: give at least one sample")
        return given, 0
    return given, 0 if given else 1


def spec_samples(specs: Sequence[InputSpec], n: int, seed: int) -> list[Sample]:
    """``n`` samples from ``--input`` specs (:func:`~layertap.inputs.spec_arrays`; sample ``i``
    drawn from ``seed + i``): a dict by input name when the specs are named, else arrays in order.

    Example:
        >>> from layertap.inputs import parse_inputs
        >>> [s["x"].shape for s in spec_samples(parse_inputs(["x=2x3"]), 2, seed=0)]
        [(2, 3), (2, 3)]
    """
    drawn: list[Sample] = []
    for i in range(n):
        arrays = spec_arrays(specs, seed + i)
        drawn.append({str(s.name): a for s, a in zip(specs, arrays)} if specs and specs[0].name is not None else arrays)
    return drawn


def random_for_file(seed: int, decoder: KvLayout | None = None, folder: Path | None = None) -> Draw:
    """Draws random samples of a file's declared inputs: ``draw(inputs, shapes, bounds, n)`` for
    ``(name, dtype)`` pairs, declared dims by name and integer bounds by name (other symbolic sizes 1;
    integers below the table they index, as ``run`` draws them), seeds after ``seed``. A decoder file
    (``decoder``, its KV layout) gets a prefill: token ids of 16 tokens (as ``run`` makes them) and
    the empty past, mask and positions that fit them (:func:`~layertap.onnxfile.kvcache.complete_feeds`,
    sized by the file, else the config in ``folder``).

    Example:
        >>> draw = random_for_file(0)
        >>> [s["x"].shape for s in draw([("x", "float32")], {"x": (1, "n")}, {}, 2)]
        [(1, 1), (1, 1)]
    """

    def draw(inputs: list[tuple[str, str]], shapes: dict[str, tuple], bounds: dict[str, int | None], n: int) -> list[Any]:
        made = decoder.names if decoder is not None else set()
        names = [name for name, _ in inputs if name not in made]
        missing = [name for name in names if name not in shapes]
        if missing:
            raise InputSpecError(f"input {missing[0]!r} has no declared shape; pass the inputs (--input SHAPE)")
        plain = [(name, shapes[name], dt or "float32") for name, dt in inputs if name not in made]
        samples = random_samples(n, plain, seed + 1, symbolic=1 if decoder is None else SYMBOLIC_SIZE, int_high=bounds)
        return [with_cache(s, decoder, folder) for s in samples]

    return draw


def with_cache(sample: dict[str, Any], decoder: KvLayout | None, folder: Path | None) -> dict[str, Any]:
    """A decoder file's sample with the cache inputs it lacks: a prefill after its token ids."""
    if decoder is None:
        return sample

    return {**sample, **complete_feeds(decoder, sample, folder=folder)[0]}
