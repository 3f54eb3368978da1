"""HTML for ``layers``: the PyTorch module table and the ONNX tensor table, as trees.

Reads rows by field name (``getattr`` with defaults), so it never imports the
side that made them: an ONNX table renders without torch.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..text import compact_structure, field, fmt_shape
from .html import cards, esc, notes_list, section
from .tree import Node, nest, render_tree

MAX_TREE_ROWS = 5000  # rows drawn in one tree; the report says when more were left out


def _ints(n: int | None) -> str:
    return "-" if not n else f"{n:,}"


def torch_output_text(row: Any) -> str:
    """A layers row's output: shape, or the compact structure of a tuple/dict result."""
    structure = field(row, "structure")
    if structure:
        return compact_structure(structure)
    shapes = field(row, "shapes")
    return fmt_shape(shapes[0]) if shapes else "-"


def layers_fragment(table: Any) -> str:
    """The PyTorch ``layers`` table as a summary and a collapsible module tree.

    Example:
        >>> from types import SimpleNamespace as R
        >>> class T:
        ...     rows = [R(name="", path="", type="Net", calls=1, shapes=[[1, 2]], dtypes=["float32"], structure=None, params=10),
        ...             R(name="fc", path="fc", type="Linear", calls=1, shapes=[[1, 2]], dtypes=["float32"], structure=None, params=10)]
        ...     notes = []
        >>> html = layers_fragment(T())
        >>> "Linear" in html and "module tree" in html
        True
    """
    rows = list(table.rows)
    ran = [r for r in rows if field(r, "calls")]
    root = next((r for r in rows if field(r, "path") == ""), None)
    summary = cards([
        ("modules listed", len({field(r, "path") for r in rows})),
        ("module calls", len(ran) if ran else "not run"),
        ("parameters", _ints(field(root, "params") if root is not None else None)),
        ("output", torch_output_text(root) if root is not None else "-"),
    ])
    nodes = [
        Node(field(r, "path", ""), esc(field(r, "name") or "(root)"),
             [esc(field(r, "type")), esc(torch_output_text(r)), esc(",".join(dict.fromkeys(field(r, "dtypes") or [])) or "-"),
              esc(_ints(field(r, "params"))), esc(field(r, "calls") or "-")])
        for r in rows[:MAX_TREE_ROWS]
    ]
    cut = f"first {MAX_TREE_ROWS} of {len(rows)} rows shown" if len(rows) > MAX_TREE_ROWS else ""
    tree = render_tree(["module (tap name)", "type", "output", "dtype", "params", "calls"], nest(nodes),
                       widths=(10, 11, 6, 7, 3.5), keep=1, note=cut)
    return summary + notes_list(table.notes) + section("module tree", tree, anchor="tree")


def onnx_layers_fragment(table: Any) -> str:
    """The ONNX tensor table as a summary and a tree of module scopes with their tensors.

    Example:
        >>> from types import SimpleNamespace as R
        >>> class T:
        ...     rows = [R(name="x", op="input", node=None, dtype="float32", shape=[1, 3], module=None, call=None),
        ...             R(name="y", op="Relu", node="n0", dtype="float32", shape=[1, 3], module="act", call=0)]
        ...     notes, source = [], "dynamo"
        >>> html = onnx_layers_fragment(T())
        >>> "Relu" in html and "act" in html
        True
    """
    rows = list(table.rows)
    ops = Counter(field(r, "op") for r in rows if field(r, "op") != "input")
    summary = cards([
        ("tensors", len(rows)),
        ("graph inputs", sum(1 for r in rows if field(r, "op") == "input")),
        ("modules", len({field(r, "module") for r in rows if field(r, "module")})),
        ("module scopes from", getattr(table, "source", "none")),
        ("top ops", ", ".join(f"{op} {n}" for op, n in ops.most_common(4)) or "-"),
    ])
    top = _onnx_tree(rows[:MAX_TREE_ROWS])
    cut = f"first {MAX_TREE_ROWS} of {len(rows)} tensors shown" if len(rows) > MAX_TREE_ROWS else ""
    tree = render_tree(["module / tensor", "op", "dtype", "shape"], top, widths=(10, 6, 10), keep=2, note=cut)
    return summary + notes_list(getattr(table, "notes", [])) + section("tensors by module", tree, anchor="tree")


def _onnx_tree(rows: list[Any]) -> list[Node]:
    """Module nodes (ancestors included) in first-use order, each tensor under its module;
    tensors outside every module stay at the top level, in graph order."""
    modules: dict[str, Node] = {}
    order: list[Node] = []
    first_seen: dict[int, int] = {}
    own: dict[int, list[Any]] = {}
    loose: list[Node] = []
    for i, r in enumerate(rows):
        leaf = Node("", f'<span class="mono">{esc(field(r, "name"))}</span>',
                    [esc(field(r, "op")), esc(field(r, "dtype")), esc(fmt_shape(field(r, "shape")))])
        module = field(r, "module")
        if not module:
            first_seen[id(leaf)] = i
            loose.append(leaf)
            continue
        key = module if field(r, "call") in (None, 0) else f"{module}#{field(r, 'call')}"
        for anc in _with_ancestors(module):
            akey = key if anc == module else anc
            if akey not in modules:
                modules[akey] = Node(anc, f"<b>{esc(akey)}</b>")
                order.append(modules[akey])
                first_seen[id(modules[akey])] = i
                own[id(modules[akey])] = []
        own[id(modules[key])].append((leaf, r))
    top = nest(order)
    for n in order:
        mine = own[id(n)]
        n.children = n.children + [leaf for leaf, _ in mine]
        ops = ", ".join(dict.fromkeys(field(r, "op") for _, r in mine))
        n.cells = [esc(ops), "", f"{len(mine)} tensor{'s' if len(mine) != 1 else ''}" if mine else ""]
    return sorted(loose + top, key=lambda n: first_seen[id(n)])


def _with_ancestors(path: str) -> list[str]:
    parts = path.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
