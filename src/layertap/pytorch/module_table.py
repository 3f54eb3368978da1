"""``lt.layers``: every module that ran, one row per call, with output shapes.

The names in the first column are valid tap selectors (``PATH``, or
``PATH#k`` for a module that ran several times), so a user can copy a name
from this table straight into ``--tap``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from rich.markup import escape
from torch import nn

from ..errors import SelectorError, unknown_name
from ..tables import Column, Table
from ..text import compact_structure, fmt_shape
from .callgraph import is_plain_container
from .callhooks import CallHooks, module_key
from .capture import eager
from .taps import bound_method
from .values import Method, describe, method_name, summarize


@dataclass
class LayerRow:
    """One call of one module.

    Attributes:
        name: tap selector for this call (``PATH`` or ``PATH#k``; ``""`` is the root).
        path: module path as in ``named_modules()``.
        type: class name of the module.
        call: index of this call (``None`` when the model was not run).
        calls: how many times the module ran (``None`` when the model was not run).
        shapes: shape of every tensor in the output, in ``flatten`` order.
        dtypes: dtype of every tensor in the output.
        structure: the output's structure when it is not one tensor,
            e.g. ``tuple(Tensor[2,17,64], None)``.
        params: parameters of the module and its children.
        depth: nesting depth (0 for the root).
    """

    name: str
    path: str
    type: str
    call: int | None
    calls: int | None
    shapes: list[list[int]] | None
    dtypes: list[str] | None
    structure: str | None
    params: int
    depth: int


def _fmt_name(row: LayerRow) -> str:
    # Indent by nesting so the table reads as a tree.
    return "  " * max(row.depth - 1, 0) + (row.name or "(root)")


def _fmt_output(row: LayerRow) -> str:
    if row.structure is not None:
        return compact_structure(row.structure)
    if row.shapes is None:
        return "-"
    return fmt_shape(row.shapes[0]) if row.shapes else "-"


def _fmt_dtypes(dtypes: list[str] | None) -> str:
    return ",".join(dict.fromkeys(dtypes)) if dtypes else "-"


def _fmt_params(n: int) -> str:
    return f"{n:,}" if n else "-"


class LayersTable(Table):
    """What :func:`layers` returns: rows of :class:`LayerRow`, in call order.

    ``str(table)`` renders an indented table; ``table.to_json()`` gives the
    same fields as the CLI's ``--json``.

    Example:
        >>> import torch, layertap as lt
        >>> net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
        >>> table = lt.layers(net, torch.zeros(2, 4))
        >>> isinstance(table, lt.LayersTable), table.find("0").shapes, table.find("0").params
        (True, [[2, 3]], 15)
    """

    title = "Layers"
    report_kind = "layers"
    columns = [
        Column("name", "Module (tap name)", name=True),
        Column("type", "Type"),
        Column("calls", "Calls", lambda c: "-" if c is None else str(c), "right", drop=2),
        Column("shapes", "Output", None),
        Column("dtypes", "Dtype", _fmt_dtypes, drop=3),
        Column("params", "Params", _fmt_params, "right", drop=1),
    ]

    @staticmethod
    def _cell(row: Any, col: Column) -> str:
        # These two cells need the whole row (depth, structure), not one field.
        whole_row = {"name": _fmt_name, "shapes": _fmt_output}
        if col.key in whole_row:

            return escape(whole_row[col.key](row))
        return Table._cell(row, col)

    @property
    def names(self) -> list[str]:
        """Every tap name in the table, in row order (root excluded)."""
        return [r.name for r in self.rows if r.name]

    def find(self, name: str) -> LayerRow:
        """The row whose tap name is ``name``."""
        for r in self.rows:
            if r.name == name:
                return r

        raise SelectorError(unknown_name("layer", name, self.names))


def layers(model: nn.Module, *args: Any, method: Method = "forward", run: bool | None = None, **kwargs: Any) -> LayersTable:
    """Run ``model.<method>(*args, **kwargs)`` once; one row per module call.

    Without arguments (and ``run`` not True) the model is not run: every
    module is listed with its type and parameters but no shapes.

    Args:
        model: the root module.
        *args, **kwargs: example inputs for the method.
        method: method to run (``"forward"``, ``"encode_image"``...) or a
            callable ``fn(model, *args, **kwargs)``.
        run: force running (True) or listing only (False); default: run when
            inputs are given.

    Example:
        >>> import torch, torchvision
        >>> t = layers(torchvision.models.resnet18().eval(), torch.randn(1, 3, 64, 64))
        >>> r = t.find("layer1.0.relu#1")
        >>> (r.type, r.calls, r.shapes)
        ('ReLU', 2, [[1, 64, 16, 16]])
    """
    model = eager(model)  # a torch.compile wrapper: the original module (hooks fire, paths read as written)
    if run is None:
        run = bool(args or kwargs)
    if not run:
        return _static_rows(model)
    return _traced_rows(model, args, kwargs, method)


def _param_counts(model: nn.Module) -> dict[int, int]:
    return {module_key(m): sum(p.numel() for p in m.parameters()) for m in model.modules()}


def _depth(path: str) -> int:
    return 0 if path == "" else path.count(".") + 1


def _static_rows(model: nn.Module) -> LayersTable:
    counts = _param_counts(model)
    rows = [
        LayerRow(name=path, path=path, type=type(m).__name__, call=None, calls=None, shapes=None,
                 dtypes=None, structure=None, params=counts[module_key(m)], depth=_depth(path))
        for path, m in model.named_modules()
    ]
    return LayersTable(rows, notes=["model not run (no inputs): pass inputs to see output shapes"])


def _summary(value: Any) -> tuple[list, list, str | None]:
    shapes, dtypes = summarize(value)
    structure = None if isinstance(value, torch.Tensor) else describe(value)
    return shapes, dtypes, structure


class _Recorder(CallHooks):
    """Appends one :class:`LayerRow` per module call, in the order calls start."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self.param_counts = _param_counts(model)
        self.mods = {module_key(m): m for m in model.modules()}
        self.rows: list[LayerRow] = []
        self.keys: list[int] = []
        self._row_of: dict[tuple[int, int], int] = {}  # (module, call) -> row, until it returns

    def on_start(self, mod: nn.Module, path: str, call: int) -> None:
        key = module_key(mod)
        self.rows.append(LayerRow(name=path, path=path, type=type(mod).__name__, call=call, calls=None,
                                  shapes=None, dtypes=None, structure=None, params=self.param_counts[key],
                                  depth=_depth(path)))
        self.keys.append(key)
        self._row_of[(key, call)] = len(self.rows) - 1

    def on_return(self, mod: nn.Module, path: str, call: int, output: Any) -> None:
        index = self._row_of.pop((module_key(mod), call), None)
        if index is not None:
            row = self.rows[index]
            row.shapes, row.dtypes, row.structure = _summary(output)

    def run(self, fn: Any, args: tuple, kwargs: dict) -> Any:
        """Call ``fn`` with the hooks attached; they are removed on every exit."""
        with self.hooks(), torch.no_grad():
            return fn(*args, **kwargs)

    def finish(self) -> None:
        """Fill in call counts, ``PATH#k`` names and tree depths."""
        ran = {p for key, p in self.paths.items() if self.counter.count(key)}
        for row, key in zip(self.rows, self.keys):
            row.calls = self.counter.count(key)
            if row.calls > 1:
                row.name = f"{row.path}#{row.call}"
            # Indent under the modules that appear in the table: a ModuleList
            # never runs, so its elements sit one level under its parent.
            row.depth = 1 + sum(1 for a in _ancestors(row.path) if a in ran)

    def idle_note(self, method: Method) -> list[str]:
        """A note naming the topmost modules that did not run. Plain containers
        (ModuleList, ModuleDict) never run themselves, so they are not named."""
        idle_all = {
            p for key, p in self.paths.items() if self.counter.count(key) == 0 and not is_plain_container(self.mods[key])
        }
        # Name only the topmost idle modules: "text_model", not each of its layers.
        idle = [p for p in self.paths.values() if p in idle_all and not any(a in idle_all for a in _ancestors(p))]
        if not idle:
            return []
        shown = ", ".join(idle[:5]) + (f", ... ({len(idle) - 5} more)" if len(idle) > 5 else "")
        return [f"{len(idle)} module(s) did not run in this {method_name(method)}: {shown}"]


def _ancestors(path: str) -> list[str]:
    """Proper ancestors of a module path, root excluded.

    Example:
        >>> _ancestors("encoder.layer.0.attention")
        ['encoder', 'encoder.layer', 'encoder.layer.0']
    """
    parts = path.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _traced_rows(model: nn.Module, args: tuple, kwargs: dict, method: Method) -> LayersTable:
    fn = bound_method(model, method)
    rec = _Recorder(model)
    out = rec.run(fn, args, kwargs)
    rec.finish()
    root = LayerRow(name="", path="", type=type(model).__name__, call=0, calls=1, shapes=None, dtypes=None,
                    structure=None, params=rec.param_counts[module_key(model)], depth=0)
    root.shapes, root.dtypes, root.structure = _summary(out)
    return LayersTable([root, *rec.rows], notes=rec.idle_note(method))
