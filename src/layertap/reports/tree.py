"""The collapsible module tree: nested ``<details>``, one aligned row per module call.

Rows arrive in execution order (calls as they start, or as they finish); the
tree nests each under its nearest enclosing module call. Columns stay aligned
because nesting only indents the name cell, never the row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from .html import esc

# Modules nested deeper than this start collapsed (failing rows are always shown).
OPEN_DEPTH = 2


@dataclass
class Node:
    """One line of the tree. ``cells`` are escaped HTML; ``cls`` is ``bad``, ``first``, ``dim`` or ''."""

    path: str
    label: str
    cells: Sequence[str] = ()
    cls: str = ""
    children: list["Node"] = field(default_factory=list)


def is_ancestor(a: str, b: str) -> bool:
    """True when module path ``a`` encloses ``b`` (``""`` is the root).

    Example:
        >>> is_ancestor("", "fc"), is_ancestor("layer1", "layer1.0"), is_ancestor("layer1", "layer10")
        (True, True, False)
    """
    return a != b and (a == "" or b.startswith(a + "."))


def nest(nodes: Sequence[Node]) -> list[Node]:
    """Nest nodes by module path; returns the top-level nodes.

    Works for calls listed as they start (parents first) and as they finish
    (children first): the second order, reversed, is the first with siblings
    reversed.

    Example:
        >>> top = nest([Node("a.b", "a.b"), Node("a", "a"), Node("c", "c")])
        >>> [(n.label, [k.label for k in n.children]) for n in top]
        [('a', ['a.b']), ('c', [])]
    """
    post_order = _finishes_first(nodes)
    ordered = list(reversed(nodes)) if post_order else list(nodes)
    for n in ordered:
        n.children = []
    top: list[Node] = []
    stack: list[Node] = []
    for n in ordered:
        while stack and not is_ancestor(stack[-1].path, n.path):
            stack.pop()
        (stack[-1].children if stack else top).append(n)
        stack.append(n)
    if post_order:
        _reverse_all(top)
    return top


def _finishes_first(nodes: Sequence[Node]) -> bool:
    """Whether enclosing calls mostly come after their children."""
    after = before = 0
    seen: dict[str, int] = {}
    for i, n in enumerate(nodes):
        seen[n.path] = i
    for i, n in enumerate(nodes):
        parent = _nearest_listed_ancestor(n.path, seen)
        if parent is not None:
            after += seen[parent] > i
            before += seen[parent] < i
    return after > before


def _nearest_listed_ancestor(path: str, listed: dict[str, int]) -> str | None:
    parts = path.split(".") if path else []
    for k in range(len(parts) - 1, -1, -1):
        cand = ".".join(parts[:k])
        if cand in listed and cand != path:
            return cand
    return None


def _reverse_all(nodes: list[Node]) -> None:
    nodes.reverse()
    for n in nodes:
        _reverse_all(n.children)


def render_tree(headers: Sequence[str], top: Sequence[Node], *, widths: Sequence[float] = (), keep: int = 0,
                note: str = "") -> str:
    """The tree as HTML: a header row, expand/collapse buttons, nested ``<details>``.

    ``widths`` are the widths (em) of the columns after the name (default 8 each);
    ``keep`` is the column that stays beside the name on a phone (the others
    wrap onto a second, smaller line).

    Example:
        >>> out = render_tree(["module", "type"], nest([Node("", "(root)", ["Net"]), Node("fc", "fc", ["Linear"])]))
        >>> out.count("<details"), "Linear" in out
        (1, True)
    """
    names = [esc(h) for h in headers[1:]]
    head = _row(esc(headers[0]), names, "head", keep, 0, names)
    body = "".join(_render(n, 0, keep, names) for n in top)
    buttons = "".join(
        f'<button class="lt-btn" type="button" onclick="this.closest(\'.lt\').querySelectorAll(\'.tree details\')'
        f'.forEach(function(d){{d.open={js}}})">{label}</button>'
        for js, label in (("true", "expand all"), ("false", "collapse all"))
    )  # inline handlers: they work in a notebook cell too, where page scripts may not run
    extra = f'<p class="muted">{esc(note)}</p>' if note else ""
    cols = " ".join(f"{w:g}em" for w in (list(widths) + [8.0] * len(headers))[: len(headers) - 1])
    return f'{buttons}{extra}<div class="tree" style="--lt-cols:minmax(0,1fr) {cols}">{head}{body}</div>'


def _render(n: Node, depth: int, keep: int, names: Sequence[str]) -> str:
    if not n.children:
        return _row(n.label, n.cells, f"leaf {n.cls}".strip(), keep, depth, names)
    opened = " open" if depth < OPEN_DEPTH or _holds_failure(n) else ""
    kids = "".join(_render(k, depth + 1, keep, names) for k in n.children)
    return f"<details{opened}><summary>{_row(n.label, n.cells, n.cls, keep, depth, names)}</summary>{kids}</details>"


def _holds_failure(n: Node) -> bool:
    return any(k.cls in ("bad", "first") or _holds_failure(k) for k in n.children)


def _row(label: str, cells: Sequence[str], cls: str, keep: int, depth: int, names: Sequence[str]) -> str:
    """One aligned line; each cell carries its column name, which a phone shows as a label."""
    indent = f"{depth * 1.1:.1f}em"
    spans = []
    lead = True
    for i, c in enumerate(cells):
        kind = "cell keep" if i == keep else ("cell lead" if lead else "cell")
        lead = lead and i == keep
        spans.append(f'<span class="{kind}" data-h="{names[i] if i < len(names) else ""}">{c}</span>')
    return (f'<div class="row {cls}" style="--d:{indent}"><span class="name"><span style="padding-left:{indent}">'
            f'{label}</span></span><span class="br"></span>{"".join(spans)}</div>')
