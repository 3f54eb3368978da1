"""``--input`` specs: ``[NAME=]SHAPE[:DTYPE]`` or ``[NAME=]FILE.npy``.

numpy only, so ONNX-only commands can use it without importing torch.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

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
