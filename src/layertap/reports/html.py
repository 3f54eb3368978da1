"""HTML building blocks shared by every report: escaping, the page, tables, cards.

Everything is inline (CSS, SVG, PNG data URIs, a few lines of script for
"expand all"), so a report opens offline and never fetches anything. The same
fragments serve ``--report`` pages and notebooks' ``_repr_html_``; fragments
are wrapped in ``<div class="lt">`` so the styles stay scoped in a notebook.
"""

from __future__ import annotations

import html
from typing import Any, Iterable, Sequence

from .. import __version__
from ..text import field

CSS = """
.lt{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;
  color:#1d2330;line-height:1.4;font-size:14px;max-width:1200px}
.lt *{box-sizing:border-box}
.lt h1{font-size:1.45em;margin:.2em 0 .4em}
.lt h2{font-size:1.15em;margin:1.4em 0 .5em;padding-bottom:.2em;border-bottom:1px solid #dde1e8}
.lt code,.lt .mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,"Liberation Mono",monospace;font-size:.92em}
.lt .muted{color:#5d6675}
.lt .cards{display:flex;flex-wrap:wrap;gap:.6em;margin:.6em 0}
.lt .card{border:1px solid #dde1e8;border-radius:6px;padding:.45em .8em;background:#f7f8fa;min-width:8em}
.lt .card b{display:block;font-size:1.15em}
.lt .card span{font-size:.85em;color:#5d6675}
.lt .ok{color:#1a7f37}.lt .bad{color:#c0262d}.lt .warn{color:#9a6700}
.lt .verdict{font-size:1.05em;padding:.55em .8em;border-radius:6px;margin:.6em 0}
.lt .verdict.ok{background:#e8f5ec}.lt .verdict.bad{background:#fbeaea}
.lt .scroll{overflow-x:auto;-webkit-overflow-scrolling:touch;max-width:100%}
.lt table.grid{border-collapse:collapse;font-size:.9em;min-width:100%}
.lt table.grid th,.lt table.grid td{border-bottom:1px solid #e6e9ef;padding:.25em .6em;text-align:left;vertical-align:top}
.lt table.grid th{background:#f0f2f5;position:sticky;top:0}
.lt table.grid th.num{text-align:right}
.lt table.grid td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.lt table.grid tr.bad td{background:#fdf0f0}
.lt table.grid tr.first td{background:#fbdcdc;font-weight:600}
.lt .tree{border:1px solid #dde1e8;border-radius:6px;font-size:.9em}
.lt .tree details>summary{list-style:none;cursor:pointer}
.lt .tree details>summary::-webkit-details-marker{display:none}
.lt .tree .row{display:grid;grid-template-columns:var(--lt-cols,minmax(0,1fr) 10em 9em 8em 6em);gap:.5em;
  padding:.18em .6em;border-bottom:1px solid #eef0f4;align-items:baseline}
.lt .tree .row.head{font-weight:600;background:#f0f2f5}
.lt .tree .name{overflow-wrap:anywhere;font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:.95em}
.lt .tree summary .name::before{content:"\\25B8";display:inline-block;width:1em;color:#5d6675}
.lt .tree details[open]>summary .name::before{content:"\\25BE"}
.lt .tree .leaf .name::before{content:"";display:inline-block;width:1em}
.lt .tree .cell{overflow-wrap:anywhere;font-size:.95em}
.lt .tree .row.bad{background:#fdf0f0}.lt .tree .row.first{background:#fbdcdc;font-weight:600}
.lt .tree .row.dim{color:#7a8292}
.lt button.lt-btn{font:inherit;font-size:.85em;padding:.2em .7em;margin:0 .4em .4em 0;border:1px solid #c5cbd6;
  border-radius:4px;background:#fff;cursor:pointer}
.lt svg{max-width:100%;height:auto;display:block}
.lt svg text{font-family:inherit}
.lt .chart{border:1px solid #dde1e8;border-radius:6px;padding:.4em;background:#fff}
.lt .chart-tall{display:none}
.lt .legend{display:flex;flex-wrap:wrap;gap:1em;font-size:.85em;margin:.3em 0}
.lt .legend i{display:inline-block;width:.9em;height:.9em;border-radius:2px;margin-right:.3em;vertical-align:-.1em}
.lt .tensors{display:grid;grid-template-columns:repeat(auto-fill,minmax(300px,1fr));gap:.8em}
.lt .tensor{border:1px solid #dde1e8;border-radius:6px;padding:.5em;background:#fff;min-width:0}
.lt .tensor h3{font-size:.95em;margin:0 0 .3em;overflow-wrap:anywhere}
.lt .tensor img{image-rendering:pixelated;max-width:100%;height:auto;display:block;margin:.3em 0;border:1px solid #eef0f4}
.lt .tensor .stats{font-size:.82em;color:#3d4554}
.lt .explain{background:#fff8e6;border:1px solid #f0d78c;border-radius:6px;padding:.6em .9em}
.lt .explain p{margin:.3em 0}
.lt footer{margin-top:2em;font-size:.8em;color:#7a8292}
.lt .tree .br{display:none}
@media (max-width:640px){
  .lt{font-size:13px}
  .lt .tree .row{display:flex;flex-wrap:wrap;align-items:baseline;gap:0 .6em}
  .lt .tree .row .name{flex:1 1 0;min-width:0;order:0}
  .lt .tree .row .cell{order:3;font-size:.85em;color:#5d6675}
  .lt .tree .row .cell.lead{margin-left:calc(var(--d,0em) + 1em)}
  .lt .tree .row .cell.keep{order:1;font-size:1em;color:inherit;margin-left:0}
  .lt .tree .row .cell:empty{display:none}
  .lt .tree .row:not(.head) .cell:not(.keep)::before{content:attr(data-h) " ";color:#9aa1ad}
  .lt .tree .row .br{display:block;order:2;flex-basis:100%;height:0}
  .lt .tree .row.head .cell{display:none}.lt .tree .row.head .cell.keep{display:inline}
  .lt .tensors{grid-template-columns:minmax(0,1fr)}
  .lt .card{min-width:6.5em;padding:.35em .6em}
  .lt .chart-wide{display:none}.lt .chart-tall{display:block}
}
"""

# A wide chart on a narrow screen scrolls sideways; start it at the first divergence.
# (Phones get the tall chart instead: one line per module down the page.)
SCRIPT = (
    "<script>document.querySelectorAll('.lt .chart-wide').forEach(function(c){"
    "var l=c.querySelector('.first-divergence');if(!l||c.scrollWidth<=c.clientWidth)return;"
    "c.scrollLeft+=l.getBoundingClientRect().left-c.getBoundingClientRect().left-c.clientWidth/2;});</script>"
)


def esc(value: Any) -> str:
    """HTML-escape any value's text (``None`` -> ``-``).

    Example:
        >>> esc("<a&b>"), esc(None)
        ('&lt;a&amp;b&gt;', '-')
    """
    return "-" if value is None else html.escape(str(value), quote=True)


def fragment(*parts: str) -> str:
    """Wrap parts in a scoped ``<div class="lt">`` with the stylesheet (notebook cells, pages)."""
    return f'<div class="lt"><style>{CSS}</style>{"".join(parts)}</div>'


def page(title: str, *parts: str) -> str:
    """A whole self-contained HTML document.

    Example:
        >>> doc = page("layers of m", "<p>hi</p>")
        >>> doc.startswith("<!DOCTYPE html>"), "http" in doc.split("<body>")[0]
        (True, False)
    """
    foot = f'<footer>written by layertap {esc(__version__)}; self-contained: opens offline, loads nothing.</footer>'
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title></head><body style=\"margin:0;padding:12px 16px\">"
        f"{fragment(f'<h1>{esc(title)}</h1>', *parts, foot)}{SCRIPT}</body></html>\n"
    )


def section(title: str, *parts: str, anchor: str | None = None) -> str:
    """``<section>`` with an ``<h2>`` heading."""
    ident = f' id="{esc(anchor)}"' if anchor else ""
    return f"<section{ident}><h2>{esc(title)}</h2>{''.join(parts)}</section>"


def cards(items: Iterable[tuple[str, Any]], css: dict[str, str] | None = None) -> str:
    """A row of small summary boxes: value in bold, label under it.

    Example:
        >>> "3" in cards([("modules", 3)])
        True
    """
    css = css or {}
    boxes = "".join(
        f'<div class="card"><b class="{esc(css.get(label, ""))}">{esc(value)}</b><span>{esc(label)}</span></div>'
        for label, value in items
    )
    return f'<div class="cards">{boxes}</div>'


def verdict(ok: bool, text: str) -> str:
    """The one-line outcome, green or red."""
    cls = "ok" if ok else "bad"
    return f'<div class="verdict {cls}"><b class="{cls}">{"OK" if ok else "DIFFERS"}</b> {esc(text)}</div>'


def notes_list(notes: Sequence[str]) -> str:
    """The report's notes as a list ('' when none)."""
    if not notes:
        return ""
    return "<ul class=\"muted\">" + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>"


def grid_table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, numeric: Sequence[int] = (),
               row_classes: Sequence[str] | None = None) -> str:
    """A scrollable table; cells are already-escaped HTML; ``numeric`` column indexes align right.

    Example:
        >>> "<td class=\\"num\\">2</td>" in grid_table(["a", "n"], [["x", "2"]], numeric=[1])
        True
    """
    head = "".join(f'<th class="num">{esc(h)}</th>' if j in numeric else f"<th>{esc(h)}</th>" for j, h in enumerate(headers))
    body = []
    for i, cells in enumerate(rows):
        cls = row_classes[i] if row_classes is not None and row_classes[i] else ""
        tds = "".join(f'<td class="num">{c}</td>' if j in numeric else f"<td>{c}</td>" for j, c in enumerate(cells))
        body.append(f'<tr class="{cls}">{tds}</tr>' if cls else f"<tr>{tds}</tr>")
    return f'<div class="scroll"><table class="grid"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'


def table_fragment(table: Any, limit: int = 2000) -> str:
    """Any :class:`~layertap.tables.Table` as an HTML table from its columns (notes and footer under it).

    Example:
        >>> from layertap.tables import Column, Table
        >>> class T(Table):
        ...     columns = [Column("name", "Name")]
        >>> "<td>a&lt;b</td>" in table_fragment(T([{"name": "a<b"}]))
        True
    """
    cols = list(table.columns)
    shown = table.rows[:limit]
    numeric = [i for i, c in enumerate(cols) if c.justify == "right"]
    body = [[esc(_cell_text(table, row, c)) for c in cols] for row in shown]
    classes = ["bad" if field(r, "ok") is False else "" for r in shown]
    more = f'<p class="muted">first {limit} of {len(table.rows)} rows shown</p>' if len(table.rows) > limit else ""
    title = f"<h2>{esc(table.title)}</h2>" if getattr(table, "title", None) else ""
    lines = list(table.footer())
    foot = "".join(f"<p class=\"muted\">{esc(line)}</p>" for line in lines)
    if isinstance(getattr(table, "ok", None), bool) and lines:  # a Report: its verdict first
        title = verdict(table.ok, lines[-1]) + title
    return title + grid_table([c.header for c in cols], body, numeric=numeric, row_classes=classes) + more + foot


def _cell_text(table: Any, row: Any, col: Any) -> str:
    value = field(row, col.key)
    if col.fmt is not None:
        return col.fmt(value)
    return "-" if value is None else str(value)
