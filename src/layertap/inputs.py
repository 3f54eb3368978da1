"""``--input`` specs (``[NAME=]SHAPE[:DTYPE]`` or ``[NAME=]FILE.npy``) and the one
maker of random inputs every command uses.

Random values: floats standard normal, integers uniform below a bound (token
ids must stay below the vocabulary size), bools random; each sample draws from
its own seeded generator. Inputs generated from a model's declared shape follow
one rule (:func:`input_shape`, :func:`random_input`).

numpy only, so ONNX-only commands can use it without importing torch; the
PyTorch side converts (``layertap.pytorch.values.random_tensor``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from .errors import InputSpecError
from .files.reads import note_input

DTYPES = {
    "float32": np.float32, "float": np.float32, "f32": np.float32,
    "float16": np.float16, "half": np.float16, "f16": np.float16,
    "float64": np.float64, "double": np.float64, "f64": np.float64,
    "int64": np.int64, "long": np.int64, "i64": np.int64,
    "int32": np.int32, "int": np.int32, "i32": np.int32,
    "int8": np.int8, "uint8": np.uint8, "bool": np.bool_,
}
_SHAPE_RE = re.compile(r"^\d+(x\d+)*$|^$")
DEFAULT_INT_HIGH = 100
#: sizes a symbolic dimension takes in generated inputs (see :func:`input_shape`)
IMAGE_SIZE = 224
SYMBOLIC_SIZE = 16
AUDIO_SAMPLES = 512
_BATCH_NAMES = {"n", "b", "bs", "batch", "batch_size", "batchsize", "batch_dim", "nb"}


@dataclass(frozen=True)
class InputSpec:
    """One parsed ``--input``.

    Example:
        >>> InputSpec.parse("ids=2x7:int64")
        InputSpec(name='ids', shape=(2, 7), dtype='int64', path=None)
        >>> InputSpec.parse("1x3x224x224").dtype
        'float32'
    """

    name: str | None
    shape: tuple[int, ...] | None
    dtype: str
    path: str | None = None

    @classmethod
    def parse(cls, text: str) -> "InputSpec":
        """Parse one spec; raise :class:`InputSpecError` naming the fault."""
        raw = text.strip()
        name = None
        if "=" in raw:
            name, raw = raw.split("=", 1)
            if not name.isidentifier() and not re.match(r"^[\w.:/-]+$", name):
                raise InputSpecError(f"bad --input {text!r}: input name {name!r} is not a valid name")
        if raw.lower().endswith(".npy"):
            if not Path(raw).is_file():
                raise InputSpecError(f"bad --input {text!r}: file {raw!r} does not exist")
            note_input(raw, "--input")
            return cls(name=name, shape=None, dtype="", path=raw)
        shape_txt, _, dtype = raw.partition(":")
        dtype = dtype or "float32"
        if dtype not in DTYPES:
            raise InputSpecError(
                f"bad --input {text!r}: unknown dtype {dtype!r}; use one of {', '.join(sorted(set(DTYPES)))}"
            )
        if not shape_txt or not _SHAPE_RE.match(shape_txt):
            raise InputSpecError(
                f"bad --input {text!r}: expected [NAME=]SHAPE[:DTYPE] like 1x3x224x224 or 2x7:int64, or [NAME=]FILE.npy"
            )
        shape = tuple(int(d) for d in shape_txt.split("x"))
        return cls(name=name, shape=shape, dtype=str(np.dtype(DTYPES[dtype])))

    def header(self) -> tuple[tuple[int, ...], np.dtype]:
        """``(shape, dtype)`` of :meth:`array` without reading the data (a ``.npy`` file's header only).

        Example:
            >>> InputSpec.parse("2x7:int64").header()
            ((2, 7), dtype('int64'))
        """
        if self.path is None:
            return tuple(self.shape or ()), np.dtype(self.dtype)
        try:
            with open(self.path, "rb") as f:
                version = np.lib.format.read_magic(f)
                read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                shape, _, dtype = read(f)
        except (ValueError, OSError) as e:
            raise InputSpecError(f"cannot read --input file {self.path!r}: {e}") from None
        return tuple(shape), dtype.newbyteorder("=")  # array() converts to native byte order

    def array(self, rng: np.random.Generator | None = None, int_high: int = DEFAULT_INT_HIGH) -> np.ndarray:
        """The data: the ``.npy`` file, or seeded random values of the shape.

        Floats are standard normal; integers are uniform in ``[0, int_high)``
        (token ids must stay below the vocabulary size); bools are random.
        A ``.npy`` file is memory-mapped (read as it is used) and converted to
        native byte order; random data is refused before allocating when it
        cannot fit in memory.
        """
        if self.path is not None:
            shape, _ = self.header()
            try:  # mapped: pages are read as they are used; an empty array cannot be mapped
                arr = np.load(self.path, allow_pickle=False, mmap_mode="r" if all(shape) else None)
            except (ValueError, OSError) as e:
                raise InputSpecError(f"cannot read --input file {self.path!r}: {e}") from None
            return arr if arr.dtype.isnative else arr.astype(arr.dtype.newbyteorder("="))
        _check_fits(self)
        return random_array(self.shape, self.dtype, rng, int_high)


def _check_fits(spec: InputSpec) -> None:
    shape, dtype = spec.header()
    need = int(np.prod(shape, dtype=object)) * dtype.itemsize
    have = _memory_bytes()
    if have and need > have:
        shown = "x".join(map(str, shape))
        raise InputSpecError(
            f"--input {shown}:{dtype.name} needs {need / 2**30:.1f} GiB, more than this machine's "
            f"{have / 2**30:.1f} GiB of memory; pass a smaller shape"
        )


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not POSIX
        return 0


def random_array(shape, dtype, rng: np.random.Generator | None = None, int_high: int = DEFAULT_INT_HIGH) -> np.ndarray:
    """Seeded random data of a shape and dtype (see :meth:`InputSpec.array`).

    Example:
        >>> bool(random_array((2, 3), "int64", np.random.default_rng(0), int_high=5).max() < 5)
        True
    """
    rng = rng if rng is not None else np.random.default_rng(0)
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if np.issubdtype(dt, np.integer):
        return rng.integers(0, max(int_high, 1), size=shape).astype(dt)
    return rng.standard_normal(size=shape).astype(dt)


def spec_arrays(specs: Sequence[InputSpec], seed: int, int_high: int = DEFAULT_INT_HIGH) -> list[np.ndarray]:
    """The data of each spec (:meth:`InputSpec.array`), the random ones drawn in order from
    one generator seeded ``seed`` (sample ``i`` of many passes ``seed + i``).

    Example:
        >>> a, b = spec_arrays(parse_inputs(["2x3", "2x7:int64"]), seed=0, int_high=5)
        >>> a.shape, b.dtype.name, bool(b.max() < 5)
        ((2, 3), 'int64', True)
    """
    rng = np.random.default_rng(seed)
    return [s.array(rng, int_high=int_high) for s in specs]


def input_shape(dims: Sequence[Any], dtype: Any, symbolic: int = SYMBOLIC_SIZE) -> tuple[int, ...]:
    """Concrete sizes for an input's declared dims, so generated data fits the model.

    A fixed size stays; a symbolic dimension named by a number is that number;
    the batch axis is 1; a 4-D float input is an image (3 channels, 224x224);
    the samples axis of a 2-D float input (audio) is 512; any other symbolic
    axis is ``symbolic``: ``layertap run`` keeps the default 16 (a short sequence),
    ``compare`` of two ONNX files passes 1 (it runs both files with every
    intermediate exposed, for every sample).

    Example:
        >>> input_shape(["batch", 3, "h", "w"], "float32"), input_shape(["N", "640"], "int64")
        ((1, 3, 224, 224), (1, 640))
        >>> input_shape(["batch", "samples"], "float32"), input_shape([2, "seq"], "int64")
        ((1, 512), (2, 16))
        >>> input_shape([2, "seq"], "int64", symbolic=1), input_shape([], "float32")
        ((2, 1), ())
    """
    dt = np.dtype(dtype)
    image = len(dims) == 4 and np.issubdtype(dt, np.floating)
    out = []
    for axis, d in enumerate(dims):
        name = str(d).strip() if d is not None else ""
        if isinstance(d, int) and d > 0:
            out.append(d)
        elif name.isdigit() and int(name) > 0:
            out.append(int(name))
        elif name.lower() in _BATCH_NAMES or "batch" in name.lower() or (axis == 0 and len(dims) >= 2):
            out.append(1)
        elif image:
            out.append(3 if axis == 1 else IMAGE_SIZE)
        elif len(dims) == 2 and np.issubdtype(dt, np.floating):
            out.append(AUDIO_SAMPLES)
        else:
            out.append(symbolic)
    return tuple(out)


def random_input(name: str, dims: Sequence[Any], dtype: Any, rng: np.random.Generator, *,
                 int_high: int | None = None, symbolic: int = SYMBOLIC_SIZE) -> tuple[np.ndarray, str]:
    """Generated data for one input a model declares, and how it was made (one phrase).

    The shape follows :func:`input_shape`; an input named ``*mask*`` is all ones;
    integers are below ``int_high`` (the size of the table they index; default
    100); otherwise :func:`random_array` draws from ``rng``.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> random_input("ids", ["batch", "seq"], "int64", rng, int_high=7)[1]
        'ids=1x16 int64 in [0, 7)'
        >>> random_input("attention_mask", ["batch", "seq"], "int64", rng)[1]
        'attention_mask=1x16 int64 (ones)'
    """
    dt = np.dtype(dtype)
    shape = input_shape(dims, dt, symbolic)
    shown = f"{name}={'x'.join(str(d) for d in shape) or 'scalar'}"
    if "mask" in name.lower() and (np.issubdtype(dt, np.integer) or dt == np.bool_ or np.issubdtype(dt, np.floating)):
        return np.ones(shape, dt), f"{shown} {dt.name} (ones)"
    if np.issubdtype(dt, np.integer):
        top = int_high or DEFAULT_INT_HIGH
        return random_array(shape, dt, rng, top), f"{shown} {dt.name} in [0, {top})"
    if dt == np.bool_:
        return random_array(shape, dt, rng), f"{shown} bool (random)"
    return random_array(shape, dt, rng), f"{shown} {dt.name} (normal)"


def random_samples(n: int, inputs: Sequence[tuple[str, Sequence[Any], Any]], seed: int, *,
                   symbolic: int = SYMBOLIC_SIZE, int_high: Mapping[str, int | None] | None = None,
                   ) -> list[dict[str, np.ndarray]]:
    """``n`` samples of generated inputs for ``(name, declared dims, dtype)`` triples
    (see :func:`random_input`); sample ``i`` draws from seed ``seed + i``. ``int_high`` bounds
    an integer input by name (the embedding table it indexes); others stay below the default.

    Example:
        >>> s = random_samples(2, [("x", [1, 3], "float32")], seed=0)
        >>> len(s), s[0]["x"].shape, bool((s[0]["x"] != s[1]["x"]).any())
        (2, (1, 3), True)
    """
    out = []
    for i in range(n):
        rng = np.random.default_rng(seed + i)
        out.append({name: random_input(name, dims, dt, rng, symbolic=symbolic, int_high=(int_high or {}).get(name))[0]
                    for name, dims, dt in inputs})
    return out


def parse_inputs(texts: list[str] | None) -> list[InputSpec]:
    """Parse every ``--input``; names are all given or all omitted.

    Example:
        >>> [s.shape for s in parse_inputs(["1x3", "2x7:int64"])]
        [(1, 3), (2, 7)]
    """
    specs = [InputSpec.parse(t) for t in texts or []]
    named = [s.name is not None for s in specs]
    if any(named) and not all(named):
        raise InputSpecError("--input specs must all be named (NAME=...) or all positional")
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            raise InputSpecError(f"--input name {spec.name!r} given twice")
        if spec.name:
            seen.add(spec.name)
    return specs


def as_specs(args: Any) -> list[InputSpec] | None:
    """``args`` as ``--input`` specs when they are specs (``InputSpec`` objects or their text, alone or in
    a list), else ``None`` (tensors, arrays, a dict of them, or nothing).

    Example:
        >>> [s.shape for s in as_specs(["1x3x8x8"])], as_specs(None), as_specs([np.zeros(2)])
        ([(1, 3, 8, 8)], None, None)
    """
    items = args if isinstance(args, (list, tuple)) else [args]
    if not items or not all(isinstance(a, (str, InputSpec)) for a in items):
        return None
    texts = iter(parse_inputs([a for a in items if isinstance(a, str)]))
    specs = [next(texts) if isinstance(a, str) else a for a in items]
    named = [s.name is not None for s in specs]
    if any(named) and not all(named):
        raise InputSpecError("--input specs must all be named (NAME=...) or all positional")
    return specs
