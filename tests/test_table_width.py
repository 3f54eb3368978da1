"""Tables fit the terminal (``COLUMNS``) without ever cutting a module path or tap name."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass

import pytest

from layertap.tables import Column, Table

LONG = "encoder_stage_one.0.conv_projection_layer"


@dataclass
class _Row:
    name: str
    kind: str
    shape: str
    extra: str
    note: str


class _Wide(Table):
    title = "Wide"
    columns = [
        Column("name", "Name", name=True),
        Column("kind", "Kind", drop=1),
        Column("shape", "Shape", no_wrap=True),
        Column("extra", "Extra", drop=2),
        Column("note", "Note"),
    ]


def _table() -> _Wide:
    return _Wide([
        _Row(LONG, "Conv2d" * 3, "1x128x28x28", "float32 float32", "fused into the next node; compared there"),
        _Row("fc", "Linear", "1x10", "float32", "-"),
    ])


def test_names_stay_whole_and_lines_fit_at_80():
    text = _table().render(width=80)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert LONG in text and "…" not in text
    assert "1x128x28x28" in text
    assert "not shown at 80 columns: Kind, Extra" in text


def test_a_note_squeezed_below_half_a_word_is_listed_not_folded_every_few_letters():
    """Beside a 44-character path and two numbers, 80 columns leave a note 7 characters: it
    would read ``checke d numeric ally``; it is listed under the table instead."""
    path = "model.layers.0.self_attn.rotary_embedding@0..4"

    @dataclass
    class R:
        name: str
        err: str
        status: str
        note: str

    class T(Table):
        columns = [Column("name", "Module", name=True), Column("err", "Rel err", no_wrap=True),
                   Column("status", "Status", no_wrap=True), Column("note", "Note")]

    text = T([R(path, "2.93e-07", "no counterpart", "fused into the next node (checked numerically)")]).render(width=80)
    assert max(len(line) for line in text.splitlines()) <= 80 and path in text
    assert "numerically" not in text and "not shown at 80 columns: Note" in text
    assert "numerically" in T([R("fc", "0", "pass", "checked numerically")]).render(width=80)


def test_wide_enough_shows_every_column():
    text = _table().render(width=200)
    assert "Extra" in text and "Kind" in text and "not shown" not in text


def test_too_narrow_folds_names_but_never_cuts():
    text = _table().render(width=40)
    assert max(len(line) for line in text.splitlines()) <= 40
    assert "…" not in text
    cells = "".join(line.split("│")[1].strip() for line in text.splitlines() if line.startswith("│"))
    assert LONG in cells  # folded across lines, every character kept


MODEL_CODE = '''
import torch
from torch import nn

class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv_projection_layer = nn.Conv2d(3, 3, 3, padding=1)
        self.activation_function = nn.ReLU()

    def forward(self, x):
        return self.activation_function(self.conv_projection_layer(x))

class Deep(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder_stage_one = nn.Sequential(Inner(), Inner())
        self.classification_head = nn.Linear(3 * 8 * 8, 5)

    def forward(self, x):
        return self.classification_head(torch.flatten(self.encoder_stage_one(x), 1))
'''


def _cli(args, cwd, columns: str | None):
    env = dict(os.environ)
    env.pop("COLUMNS", None)
    if columns is not None:
        env["COLUMNS"] = columns
    return subprocess.run([sys.executable, "-m", "layertap", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_cli_tables_at_80_columns_and_piped(tmp_path):
    (tmp_path / "deep.py").write_text(MODEL_CODE)
    spec, inp = "deep.py:Deep", ["--input", "1x3x8x8"]
    taps = ["--tap", "encoder_stage_one.1.activation_function", "--tap", f"{LONG.replace('0.', '1.')}:input"]
    commands = [
        ["layers", spec, *inp],
        ["export", spec, *inp, *taps, "-o", "deep.onnx"],
        ["compare", spec, "deep.onnx", *inp],
        ["run", "deep.onnx", "--input", "1x3x8x8"],
        ["layers", "deep.onnx"],
    ]
    for args in commands:
        narrow = _cli(args, tmp_path, "80")
        assert narrow.returncode == 0, narrow.stderr
        piped = _cli(args, tmp_path, None)
        assert piped.returncode == 0, piped.stderr
        listed = _cli([*args, "--json"], tmp_path, None) if args[0] != "export" else None
        names = _names(json.loads(listed.stdout)) if listed else [LONG.replace("0.", "1."), "encoder_stage_one.1.activation_function"]
        assert names
        assert max(len(line) for line in narrow.stdout.splitlines()) <= 80, (args, narrow.stdout)
        for out in (narrow.stdout, piped.stdout):
            assert "…" not in out, (args, out)
        for name in names:  # piped and at 80 columns every name is on one line, whole
            assert name in piped.stdout, (args, name, piped.stdout)
            assert name in narrow.stdout or name in _folded(narrow.stdout), (args, name, narrow.stdout)
        # where two long name columns cannot both fit (an ONNX tensor named after a tap, beside its
        # module), one folds; module paths in a single name column never do
        if args[0] != "layers" or not args[1].endswith(".onnx"):
            assert all(name in narrow.stdout for name in names), (args, narrow.stdout)
        # piped: tables as wide as their content (no column stretched to a console width), rules short
        assert _unstretched(piped.stdout), (args, piped.stdout)
        assert all(len(line) <= 80 for line in piped.stdout.splitlines() if _is_rule(line)), (args, piped.stdout)


def _is_rule(line: str) -> bool:
    """A section rule (``──── 1. layers ────``), not a table border (those have column joints)."""
    return line.startswith(("─", "━")) and not any(c in line for c in "┬┴┼┳┻╇╈┯┷")


def _unstretched(text: str) -> bool:
    """Every column of every table has a cell filled to its width (rich pads cells by one space)."""
    rows = [re.split("[│┃]", line)[1:-1] for line in text.splitlines() if line.startswith(("│", "┃"))]
    columns = {len(r) for r in rows}
    for n in columns:
        same = [r for r in rows if len(r) == n]
        for c in range(n):
            cells = [r[c] for r in same]
            if min(len(cell) - len(cell.rstrip()) for cell in cells) > 1 and any(cell.strip() for cell in cells):
                return False
    return True


def _folded(text: str) -> str:
    """The cells of a table column by column, each column's lines joined (undoes folding)."""
    rows = [line.split("│")[1:-1] for line in text.splitlines() if line.startswith("│")]
    return "\n".join("".join(r[c].strip() for r in rows) for c in range(max(map(len, rows), default=0)))


def _names(data: dict) -> list[str]:
    """Module paths / tap names / tensor names in a --json result."""
    out = []
    for row in data["rows"]:
        for key in ("path", "name", "module"):
            value = row.get(key)
            if isinstance(value, str) and value:
                out.append(value)
    return out
