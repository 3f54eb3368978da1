"""``layertap extract MODEL --tap ... -o FILE``: save tapped tensors to .npz/.safetensors."""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any, Iterator

from ..args import InputArgs, ModelArgs, OutputArgs, TapArgs
from .base import Tool, stdout_console

OUTPUT = OutputArgs(required=True, suffixes=(".npz", ".safetensors"), help="FILE.npz or FILE.safetensors (keys are the tap names)")


@contextlib.contextmanager
def status(message: str) -> Iterator[None]:
    """A spinner on stderr while a long step runs; silent when stderr is not a terminal."""
    from rich.console import Console

    console = Console(stderr=True)
    if not console.is_terminal:
        yield
        return
    with console.status(message):
        yield


def load_with_inputs(ns: argparse.Namespace, *, need_inputs: bool = True):
    """``(model, info, args, kwargs)`` for a MODEL and its ``--input`` specs.

    ``--input`` is parsed before the model is built, so a typo fails fast.
    With ``need_inputs=False`` a model without known inputs gets ``args=None``.
    """
    from ...pytorch.models import make_inputs

    specs = InputArgs.specs(ns)
    with status(f"loading {ns.model}"):
        model, info = ModelArgs.load(ns)
    if not specs and not info.inputs and not need_inputs:
        return model, info, None, {}
    args, kwargs = make_inputs(info, specs, model=model, method=ns.method, seed=ns.seed)
    return model, info, args, kwargs


@contextlib.contextmanager
def running(info: Any, method: str, args: tuple, kwargs: dict) -> Iterator[None]:
    """Turn an error raised by the user's model into a one-line user error."""
    from ...errors import LayertapError
    from ...pytorch.models import run_failed

    with status(f"running {info.spec}.{method}"):
        try:
            yield
        except LayertapError:
            raise
        except Exception as e:  # noqa: BLE001 - the model may raise anything on bad inputs
            raise run_failed(e, info, method, args, kwargs) from e


def to_numpy(tensors: dict) -> tuple[dict, list[str]]:
    """name -> ndarray; dtypes numpy lacks (bfloat16) become float32, with a note."""
    import torch

    from ...pytorch.values import tensor_to_numpy

    arrays, notes = {}, []
    for name, t in tensors.items():
        if t.dtype == torch.bfloat16:
            notes.append(f"{name}: bfloat16 saved as float32")
        arrays[name] = tensor_to_numpy(t)
    return arrays, notes


class ExtractTool(Tool):
    name = "extract"
    help = "run a model once and save the tapped tensors to .npz or .safetensors"
    groups = (ModelArgs(), TapArgs(required=True), InputArgs(), OUTPUT)

    def add_own_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--stop-early", action="store_true", help="stop the forward once every tap is captured (no 'output' then)")

    def run(self, ns: argparse.Namespace) -> int:
        taps = TapArgs.taps(ns)  # cheap checks first: nothing is built for a typo
        out = OUTPUT.check(ns)
        from ...files import save_arrays
        from ...pytorch.taps import extract

        model, info, args, kwargs = load_with_inputs(ns)
        with running(info, ns.method, args, kwargs):
            values = extract(model, *args, taps=taps, method=ns.method, stop_early=ns.stop_early, **kwargs)
        arrays, notes = to_numpy(values)
        with status(f"writing {out}"):
            save_arrays(out, arrays)
        self.print_saved(arrays, notes)
        # plain write: rich would wrap a long path when stderr is a pipe
        sys.stderr.write(f"wrote {len(arrays)} array(s) to {out}\n")
        return 0

    @staticmethod
    def print_saved(arrays: dict, notes: list[str]) -> None:
        """What was saved: one line per array (name, shape, dtype) on stdout."""
        from rich.markup import escape
        from rich.table import Table

        table = Table(title="saved", title_justify="left")
        for col in ("name", "shape", "dtype"):
            table.add_column(col)
        for name, a in arrays.items():
            table.add_row(escape(name), "x".join(str(d) for d in a.shape) or "scalar", str(a.dtype))
        console = stdout_console()
        console.print(table)
        for note in notes:
            console.print(note, markup=False, highlight=False)
