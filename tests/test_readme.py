"""The README's shell commands and Python snippets, run as written.

Every ```sh / ```console command and every ```python snippet runs in document
order, from a temporary copy of the repository root (so nothing is written into
the checkout), with ``layertap`` and ``python`` on ``PATH`` meaning this
checkout's sources and this interpreter. A README edit that breaks a command
fails here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

# Commands the test does not run, and why (each is exercised elsewhere).
SKIPPED = {
    "make ": "sets up .venv and runs the suite or the benchmarks (what CI does itself)",
    ".venv/bin/pytest": "runs part of this suite",
    "layertap demo": "tests/test_cli_torch.py::test_demo_runs_end_to_end runs the demo",
}

_FENCE = re.compile(r"^```(\w*)\s*$")


@dataclass(frozen=True)
class Snippet:
    kind: str  # "sh" or "python"
    text: str
    line: int  # 1-based line of the README where it starts

    def __str__(self) -> str:
        return f"README.md:{self.line}: {self.text.splitlines()[0][:100]}"


def readme_snippets(text: str) -> list[Snippet]:
    """Shell commands (one per ``Snippet``) and Python blocks, in document order.

    Example:
        >>> [s.text for s in readme_snippets("```console\\n$ ls -a \\\\\\n   -l\\nout\\n```\\n")]
        ['ls -a \\\\\\n   -l']
    """
    out: list[Snippet] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        lang, start = m.group(1), i + 1
        j = start
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        body = lines[start:j]
        if lang == "python":
            out.append(Snippet("python", "\n".join(body), start + 1))
        elif lang in ("sh", "console"):
            out += _commands(body, start + 1, prompt="$ " if lang == "console" else "")
        i = j + 1
    return out


def _commands(body: list[str], first_line: int, prompt: str) -> list[Snippet]:
    out: list[Snippet] = []
    k = 0
    while k < len(body):
        line = body[k]
        if not line.strip() or line.lstrip().startswith("#") or not line.startswith(prompt):
            k += 1
            continue
        start, parts = k, [line[len(prompt):]]
        while parts[-1].rstrip().endswith("\\") and k + 1 < len(body):
            k += 1
            parts.append(body[k])
        out.append(Snippet("sh", "\n".join(parts), first_line + start))
        k += 1
    return out


def _skip_reason(snippet: Snippet) -> str | None:
    return next((why for prefix, why in SKIPPED.items() if snippet.text.startswith(prefix)), None)


@pytest.fixture(scope="module")
def readme_root(tmp_path_factory) -> tuple[Path, dict]:
    """A scratch repository root: ``examples/`` copied, shims for ``layertap`` and ``python``."""
    root = tmp_path_factory.mktemp("readme")
    shutil.copytree(ROOT / "examples", root / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    bin_dir = root / ".bin"
    bin_dir.mkdir()
    for name, target in (("layertap", f'"{sys.executable}" -m layertap'), ("python", f'"{sys.executable}"')):
        shim = bin_dir / name
        shim.write_text(f'#!/bin/sh\nexec {target} "$@"\n')
        shim.chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    env["COLUMNS"] = "80"
    return root, env


def test_readme_has_commands_and_snippets():
    snippets = readme_snippets(README.read_text())
    assert sum(s.kind == "sh" for s in snippets) >= 15
    assert sum(s.kind == "python" for s in snippets) >= 5
    assert all(_skip_reason(s) is None for s in snippets if "layertap " in s.text and "demo" not in s.text)


@pytest.mark.slow
def test_readme_runs_as_written(readme_root):
    root, env = readme_root
    ran = 0
    for snippet in readme_snippets(README.read_text()):
        if _skip_reason(snippet):
            continue
        if snippet.kind == "sh":
            cmd = ["bash", "-e", "-o", "pipefail", "-c", snippet.text]
        else:
            cmd = [sys.executable, "-c", snippet.text]
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{snippet}\nexit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        ran += 1
    assert ran >= 20
    assert not (ROOT / "r18.onnx").exists() and not (ROOT / "resnet18.onnx").exists()
