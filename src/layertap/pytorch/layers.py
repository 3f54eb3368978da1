"""``lt.layers``: every module that ran, one row per call, with output shapes.

The names in the first column are valid tap selectors (``PATH``, or
``PATH#k`` for a module that ran several times), so a user can copy a name
from this table straight into ``--tap``.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..report import Column, Table, fmt_shape
from .taps import bound_method
from .values import describe, summarize


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
        return row.structure
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
    """

    title = "layers"
    columns = [
        Column("name", "module (tap name)"),
        Column("type", "type"),
        Column("calls", "calls", lambda c: "-" if c is None else str(c), "right"),
        Column("shapes", "output", None),
        Column("dtypes", "dtype", _fmt_dtypes),
        Column("params", "params", _fmt_params, "right"),
    ]

    @staticmethod
    def _cell(row: Any, col: Column) -> str:
        # These two cells need the whole row (depth, structure), not one field.
        whole_row = {"name": _fmt_name, "shapes": _fmt_output}
        if col.key in whole_row:
            from rich.markup import escape

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
        from ..errors import SelectorError, unknown_name

        raise SelectorError(unknown_name("layer", name, self.names))


def layers(model: nn.Module, *args: Any, method: str = "forward", run: bool | None = None, **kwargs: Any) -> LayersTable:
    """Run ``model.<method>(*args, **kwargs)`` once; one row per module call.

    Without arguments (and ``run`` not True) the model is not run: every
    module is listed with its type and parameters but no shapes.

    Args:
        model: the root module.
        *args, **kwargs: example inputs for the method.
        method: method to run (``"forward"``, ``"encode_image"``...).
        run: force running (True) or listing only (False); default: run when
            inputs are given.

    Example:
        >>> import torch, torchvision
        >>> t = layers(torchvision.models.resnet18().eval(), torch.randn(1, 3, 64, 64))
        >>> r = t.find("layer1.0.relu#1")
        >>> (r.type, r.calls, r.shapes)
        ('ReLU', 2, [[1, 64, 16, 16]])
    """
    if run is None:
        run = bool(args or kwargs)
    if not run:
        return _static_rows(model)
    return _traced_rows(model, args, kwargs, method)


def _param_counts(model: nn.Module) -> dict[int, int]:
    return {id(m): sum(p.numel() for p in m.parameters()) for m in model.modules()}


def _depth(path: str) -> int:
    return 0 if path == "" else path.count(".") + 1


def _static_rows(model: nn.Module) -> LayersTable:
    counts = _param_counts(model)
    rows = [
        LayerRow(name=path, path=path, type=type(m).__name__, call=None, calls=None, shapes=None,
                 dtypes=None, structure=None, params=counts[id(m)], depth=_depth(path))
        for path, m in model.named_modules()
    ]
    return LayersTable(rows, notes=["model not run (no inputs): pass inputs to see output shapes"])


def _summary(value: Any) -> tuple[list, list, str | None]:
    shapes, dtypes = summarize(value)
    structure = None if isinstance(value, torch.Tensor) else describe(value)
    return shapes, dtypes, structure


def _traced_rows(model: nn.Module, args: tuple, kwargs: dict, method: str) -> LayersTable:
    fn = bound_method(model, method)
    counts = _param_counts(model)
    # named_modules() lists a shared module once, under its first path.
    paths = {id(m): p for p, m in model.named_modules() if p}
    mods = {id(m): m for m in model.modules()}
    rows: list[LayerRow] = []
    row_keys: list[int] = []
    calls: dict[int, int] = collections.Counter()
    open_rows: dict[int, list[int]] = collections.defaultdict(list)

    def pre(mod: nn.Module, _args: tuple) -> None:
        key = id(mod)
        path = paths[key]
        rows.append(LayerRow(name=path, path=path, type=type(mod).__name__, call=calls[key], calls=None,
                             shapes=None, dtypes=None, structure=None, params=counts[key], depth=_depth(path)))
        row_keys.append(key)
        calls[key] += 1
        open_rows[key].append(len(rows) - 1)

    def post(mod: nn.Module, _args: tuple, output: Any) -> None:
        stack = open_rows[id(mod)]
        if stack:
            row = rows[stack.pop()]
            row.shapes, row.dtypes, row.structure = _summary(output)

    handles = []
    root = LayerRow(name="", path="", type=type(model).__name__, call=0, calls=1, shapes=None, dtypes=None,
                    structure=None, params=counts[id(model)], depth=0)
    try:
        for key, path in paths.items():
            handles.append(mods[key].register_forward_pre_hook(pre))
            handles.append(mods[key].register_forward_hook(post))
        with torch.no_grad():
            out = fn(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    root.shapes, root.dtypes, root.structure = _summary(out)
    for row, key in zip(rows, row_keys):
        row.calls = calls[key]
        if row.calls > 1:
            row.name = f"{row.path}#{row.call}"
    idle_all = {p for key, p in paths.items() if calls[key] == 0}
    # Name only the topmost idle modules: "text_model", not each of its layers.
    idle = [p for p in paths.values() if p in idle_all and p.rpartition(".")[0] not in idle_all]
    notes = []
    if idle:
        shown = ", ".join(idle[:5]) + (f", ... ({len(idle) - 5} more)" if len(idle) > 5 else "")
        notes.append(f"{len(idle)} module(s) did not run in this {method}: {shown}")
    return LayersTable([root, *rows], notes=notes)
