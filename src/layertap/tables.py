"""Tables and reports: what the API returns and what the CLI prints.

A :class:`Table` holds ``rows`` (dataclass records, in order) and renders with
rich; a :class:`Report` adds ``ok``. ``to_dict()`` gives exactly the fields the
CLI's ``--json`` prints. Pure Python + rich: no torch, no onnx.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Literal, Sequence

from .errors import printable
from .metrics import DEFAULT_ATOL, DEFAULT_RTOL
from .text import field


@dataclass(frozen=True)
class Column:
    """One rendered column: ``key`` is the row attribute, ``fmt`` turns it into text.

    No cell is ever cut short with an ellipsis. A ``name`` column (module
    paths, tap names: what users copy into ``--tap``) keeps its full width
    while any other column can give way; it wraps only when it alone is wider
    than the terminal. Columns with ``drop > 0`` are hidden, highest first,
    when the table does not fit the terminal otherwise.
    """

    key: str
    header: str
    fmt: Callable[[Any], str] | None = None
    justify: Literal["left", "center", "right"] = "left"
    no_wrap: bool = False  # short values (shapes, numbers) that read badly when wrapped
    name: bool = False
    drop: int = 0


class Table:
    """Rows of records that print as a table and serialise to JSON.

    Subclasses set ``columns`` and ``title``.

    Example:
        >>> @dataclass
        ... class R:
        ...     name: str
        ...     n: int
        >>> class T(Table):
        ...     columns = [Column("name", "Name"), Column("n", "N")]
        >>> t = T([R("a", 1)])
        >>> t.to_dict()
        {'rows': [{'name': 'a', 'n': 1}]}
    """

    columns: Sequence[Column] = ()  # an instance may name a column its own way
    title: str | None = None
    report_kind: ClassVar[str] = "table"  # which layertap.reports fragment draws it as HTML

    def __init__(self, rows: Sequence[Any] = (), notes: Sequence[str] = ()) -> None:
        self.rows = list(rows)
        self.notes = list(notes)

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self):
        return iter(self.rows)

    def __getitem__(self, i: int) -> Any:
        return self.rows[i]

    def summary(self) -> dict[str, Any]:
        """Top-level JSON fields besides ``rows``; subclasses extend."""
        return {"notes": list(self.notes)} if self.notes else {}

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: summary fields plus ``rows``."""
        out = dict(self.summary())
        out["rows"] = [_row_dict(r) for r in self.rows]
        return out

    def to_json(self, indent: int | None = 2) -> str:
        """``to_dict()`` as JSON text (NaN/inf written as null)."""
        return json.dumps(_json_safe(self.to_dict()), indent=indent)

    def __rich_console__(self, console: Any, options: Any) -> Any:
        """The table at the console's width: drop columns (``Column.drop``) before cutting any name."""
        width = options.max_width
        cells = [[self._cell(row, col) for col in self.columns] for row in self.rows]
        shown = list(range(len(self.columns)))
        hidden: list[int] = []
        while _natural_width(self.columns, cells, shown) > width:
            droppable = [i for i in shown if self.columns[i].drop]
            if not droppable:
                break
            victim = max(droppable, key=lambda i: self.columns[i].drop)
            shown.remove(victim)
            hidden.append(victim)
        hidden += _squeezed_prose(self.columns, cells, shown, width)
        yield self._rich_table(cells, shown, width)
        if hidden:
            from rich.text import Text

            headers = ", ".join(self.columns[i].header for i in sorted(hidden))
            yield Text(f"not shown at {width} columns: {headers} (a wider terminal or --json shows them)")

    def _rich_table(self, cells: list[list[str]], shown: list[int], width: int) -> Any:
        from rich.table import Table as RichTable

        table = RichTable(title=self.title, title_justify="left")
        keep = _whole_names(self.columns, cells, shown, width)
        fits = _natural_width(self.columns, cells, shown) <= width
        for i in shown:
            col = self.columns[i]
            table.add_column(col.header, justify=col.justify, no_wrap=i in keep or (fits and col.no_wrap),
                             min_width=_widest(self.columns, cells, i) if i in keep else None, overflow="fold")
        for row in cells:
            table.add_row(*[row[i] for i in shown])
        return table

    def footer(self) -> list[str]:
        """Lines printed under the table (notes, verdict)."""
        return list(self.notes)

    def render(self, width: int = 160) -> str:
        """Plain-text rendering (what ``str()`` and ``print()`` show)."""
        from rich.console import Console

        buf = io.StringIO()
        console = Console(file=buf, width=width, color_system=None, force_terminal=False)
        console.print(self)
        for line in self.footer():
            console.print(printable(line), markup=False, highlight=False)
        return buf.getvalue().rstrip("\n")

    def __str__(self) -> str:
        return self.render()

    def _repr_html_(self) -> str:
        """Notebook rendering: the same HTML fragments as ``--report`` pages."""
        from .reports import repr_html

        return repr_html(self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} with {len(self.rows)} rows>"

    @staticmethod
    def _cell(row: Any, col: Column) -> str:
        value = field(row, col.key)
        text = col.fmt(value) if col.fmt else ("-" if value is None else str(value))
        from rich.markup import escape

        return escape(printable(text))


class Report(Table):
    """A table with a verdict: ``ok`` is True when every row passed.

    Rows carry an ``ok`` attribute (``None`` = not compared, never a failure).
    """

    @property
    def ok(self) -> bool:
        return all(getattr(r, "ok", True) is not False for r in self.rows)

    @property
    def failures(self) -> list[Any]:
        """Rows that failed, in order."""
        return [r for r in self.rows if getattr(r, "ok", True) is False]

    def summary(self) -> dict[str, Any]:
        out = {"ok": self.ok}
        out.update(super().summary())
        return out

    def footer(self) -> list[str]:
        lines = super().footer()
        n_fail = len(self.failures)
        lines.append("all passed" if self.ok else f"{n_fail} of {len(self.rows)} FAILED")
        return lines


PROSE_WORD = 16  # the narrowest a prose column (a note) gets before names must fold


def _widest(columns: Sequence[Column], cells: list[list[str]], i: int) -> int:
    """Width column ``i`` needs so that nothing is cut: its longest line, or its longest
    word for a column that may wrap at spaces (not a name, not ``no_wrap``)."""
    col = columns[i]
    lines = [col.header, *(line for row in cells for line in row[i].splitlines())]
    if not (col.name or col.no_wrap):
        # prose wraps at spaces; a long word in it (a path in a note) may fold past PROSE_WORD
        return min(max((len(w) for line in lines for w in line.split()), default=0), max(PROSE_WORD, len(col.header)))
    return max((len(line) for line in lines), default=0)


def _whole_names(columns: Sequence[Column], cells: list[list[str]], shown: list[int], width: int) -> set[int]:
    """The name columns that keep their full width: all when the table fits; else, narrowest
    first, those that fit beside the other columns squeezed to 4 characters."""
    names = [i for i in shown if columns[i].name]
    if _natural_width(columns, cells, shown) <= width:
        return set(names)
    room = width - 1 - 3 * len(shown) - 4 * (len(shown) - len(names))
    keep = set()
    for i in sorted(names, key=lambda i: _widest(columns, cells, i)):
        if _widest(columns, cells, i) <= room:
            keep.add(i)
            room -= _widest(columns, cells, i)
    return keep


def _squeezed_prose(columns: Sequence[Column], cells: list[list[str]], shown: list[int], width: int) -> list[int]:
    """Prose columns (notes) left narrower than half a word's room beside whole names and numbers:
    removed from ``shown`` and returned, since text folded every few letters cannot be read."""
    prose = [i for i in shown if not (columns[i].name or columns[i].no_wrap)]
    fixed = sum(_widest(columns, cells, i) for i in shown if i not in prose)
    room = width - 1 - 3 * len(shown) - fixed
    if not prose or room >= len(prose) * PROSE_WORD // 2 or _natural_width(columns, cells, shown) <= width:
        return []
    for i in prose:
        shown.remove(i)
    return prose


def _natural_width(columns: Sequence[Column], cells: list[list[str]], shown: list[int]) -> int:
    """Width of the table with nothing cut: cells, one space of padding each side, borders."""
    return sum(_widest(columns, cells, i) + 3 for i in shown) + 1


def _row_dict(row: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(row) and not isinstance(row, type):
        return dataclasses.asdict(row)
    return dict(row)


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return _json_safe(obj.item())
    return obj


class ToleranceReport(Report):
    """A report whose rows were judged by :mod:`layertap.metrics`: holds ``rtol`` and ``atol``.

    The base of ``lt.export``'s and ``lt.compare``'s reports; ``summary()``
    (the JSON head) carries both tolerances.

    Example:
        >>> ToleranceReport([], rtol=1e-3, atol=1e-5).summary()["rtol"]
        0.001
    """

    def __init__(self, rows: Any = (), notes: Any = (), *, rtol: float = DEFAULT_RTOL, atol: float = DEFAULT_ATOL) -> None:
        super().__init__(rows, notes)
        self.rtol = rtol
        self.atol = atol

    def summary(self) -> dict[str, Any]:
        out = super().summary()
        out.update(rtol=self.rtol, atol=self.atol)
        return out
