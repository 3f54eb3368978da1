"""The README's and the documentation site's examples, run as written; the site itself builds.

One mechanism for every page (``README.md`` and each page of ``mkdocs.yml``'s nav, in nav order):

- every ```sh / ```console command and every ```python snippet runs, page after page, from one
  temporary copy of the repository root (so nothing is written into the checkout), with
  ``layertap`` and ``python`` on ``PATH`` meaning this checkout's sources and this interpreter.
  A page may use a file an earlier page made (``r18.onnx`` on the export page); a snippet the
  same as one already run (the README repeats the pages' examples) is not run twice;
- every ``layertap ...`` command shown in any fenced block (also ```text blocks, which do not run:
  a cluster address, a GPU, a file the reader has) parses with the real argument parser;
- every file a page names under ``examples/``, ``benchmarks/``, ``tests/`` or ``docs/`` exists;
- ``mkdocs build --strict`` succeeds (links, anchors, the generated API and CLI pages).

A documentation edit that breaks a command fails here.
"""

from __future__ import annotations

import os
import re
import shlex
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
    "make ": "sets up .venv and runs the suite, the benchmarks or the site build (what CI does itself)",
    ".venv/bin/pytest": "runs part of this suite",
    ".venv/bin/python benchmarks/": "a benchmark (minutes of full-size models): make bench runs them",
    "layertap demo": "tests/test_cli_torch.py::test_demo_runs_end_to_end runs the demo",
}

_FENCE = re.compile(r"^```(\w*)\s*$")
_SHELL_OPERATORS = {"|", "||", "&&", ";", ">", ">>", "<", "(", ")", "&"}


def documents() -> list[Path]:
    """``README.md``, then the site's pages in the order of ``mkdocs.yml``'s nav."""
    nav = re.findall(r"^\s*-\s*(?:[^:\n]+:\s*)?(\S+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.MULTILINE)
    return [README] + [ROOT / "docs" / page for page in nav]


@dataclass(frozen=True)
class Snippet:
    kind: str  # "sh" (runs), "python" (runs) or "shown" (a command in a block that does not run)
    text: str
    doc: str  # the file, relative to the repository root
    line: int  # 1-based line where it starts

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {self.text.splitlines()[0][:100]}"


def snippets(text: str, doc: str = "README.md") -> list[Snippet]:
    """Shell commands (one per ``Snippet``), Python blocks and shown commands, in document order.

    Example:
        >>> [s.text for s in snippets("```console\\n$ ls -a \\\\\\n   -l\\nout\\n```\\n")]
        ['ls -a \\\\\\n   -l']
        >>> [(s.kind, s.text) for s in snippets("```text\\nlayertap run m.onnx --tap x\\nlayertap: error: no\\n```\\n")]
        [('shown', 'layertap run m.onnx --tap x')]
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
            out.append(Snippet("python", "\n".join(body), doc, start + 1))
        elif lang in ("sh", "console"):
            out += _commands(body, doc, start + 1, prompt="$ " if lang == "console" else "", kind="sh")
        else:  # output, grammar, commands that need what the test has not (a cluster, a GPU)
            out += [s for s in _commands(body, doc, start + 1, prompt="", kind="shown")
                    if s.text.startswith(("layertap ", "$ layertap "))]
        i = j + 1
    return out


def _commands(body: list[str], doc: str, first_line: int, prompt: str, kind: str) -> list[Snippet]:
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
        out.append(Snippet(kind, "\n".join(parts), doc, first_line + start))
        k += 1
    return out


def layertap_argv(command: str) -> list[str] | None:
    """The arguments after ``layertap`` in a shell command line, up to the first shell operator;
    None when the line does not run ``layertap``.

    Example:
        >>> layertap_argv("$ layertap run a.onnx --tap x#1 -o 'b c.npz' || echo fail   # a comment")
        ['run', 'a.onnx', '--tap', 'x#1', '-o', 'b c.npz']
    """
    text = re.sub(r"\\\n", " ", command.strip().removeprefix("$ "))
    text = re.sub(r"(^|\s)#(\s.*)?$", "", text, flags=re.MULTILINE)  # a comment; x#1 is a call number
    lex = shlex.shlex(text, posix=True, punctuation_chars=True)
    lex.whitespace_split, lex.commenters = True, ""
    words = []
    for word in lex:
        if word in _SHELL_OPERATORS:
            break
        words.append(word)
    return words[1:] if words[:1] == ["layertap"] else None


def _skip_reason(snippet: Snippet) -> str | None:
    return next((why for prefix, why in SKIPPED.items() if snippet.text.startswith(prefix)), None)


def _all_snippets() -> list[Snippet]:
    return [s for doc in documents() for s in snippets(doc.read_text(), str(doc.relative_to(ROOT)))]


def test_readme_has_commands_and_snippets():
    readme = snippets(README.read_text())
    assert sum(s.kind == "sh" for s in readme) >= 15
    assert sum(s.kind == "python" for s in readme) >= 2
    assert all(_skip_reason(s) is None for s in readme if "layertap " in s.text and "demo" not in s.text)
    assert len(README.read_text().splitlines()) < 200


def test_every_page_is_in_the_nav():
    pages = {p.name for p in documents()[1:]}
    assert pages == {p.name for p in (ROOT / "docs").glob("*.md")}
    assert "ARCHITECTURE.md" in pages


def test_every_command_shown_parses():
    from layertap.cli.main import build_parser
    from layertap.errors import LayertapError

    parser, _ = build_parser()
    checked = 0
    for snippet in _all_snippets():
        argv = layertap_argv(snippet.text) if snippet.kind != "python" else None
        if argv is None or "..." in argv:  # "layertap compare REF CAND ...": a grammar, not a command
            continue
        try:
            _ns, extra = parser.parse_known_args(argv)
        except LayertapError as e:
            pytest.fail(f"{snippet}\ndoes not parse: {e}")
        assert not extra, f"{snippet}\nunrecognised arguments: {extra}"
        checked += 1
    assert checked >= 50


_NAMED_FILE = re.compile(r"(?<![\w/.-])((?:examples|benchmarks|tests|docs)/[\w./-]*\w\.(?:py|json|md|txt|yml))")


def test_every_file_named_exists():
    named = {(m.group(1), str(doc.relative_to(ROOT))) for doc in documents() for m in _NAMED_FILE.finditer(doc.read_text())}
    assert len(named) >= 10
    missing = sorted(f"{doc}: {path}" for path, doc in named if not (ROOT / path).exists())
    assert not missing, "files the docs name but the repository lacks:\n" + "\n".join(missing)


def test_site_builds_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="pip install -e '.[docs]' (make install) builds the site")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    api = (tmp_path / "site" / "api.html").read_text()
    import layertap

    missing = [name for name in layertap.__all__ if not re.search(rf'id="layertap\.[\w.]*\.{name}"', api)]
    assert not missing, f"public names not on the API page: {missing}"
    cli = (tmp_path / "site" / "cli.html").read_text()
    assert "--check-finite" in cli and "layertap add-outputs" in cli


@pytest.fixture(scope="module")
def docs_root(tmp_path_factory) -> tuple[Path, dict, dict]:
    """A scratch repository root: ``examples/`` copied, shims for ``layertap`` and ``python``;
    then the record of the pages and snippets run in it so far."""
    root = tmp_path_factory.mktemp("docs")
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
    return root, env, {"docs": set(), "ran": set()}


def _run_page(doc: Path, root: Path, env: dict, done: dict) -> int:
    """Run the pages before ``doc`` (whose files it may use) and ``doc``; return how many snippets of ``doc`` ran."""
    order = documents()
    ran = 0
    for page in order[: order.index(doc) + 1]:
        if page in done["docs"]:
            continue
        done["docs"].add(page)
        for snippet in snippets(page.read_text(), str(page.relative_to(ROOT))):
            if snippet.kind == "shown" or _skip_reason(snippet) or (snippet.kind, snippet.text) in done["ran"]:
                continue
            cmd = ["bash", "-e", "-o", "pipefail", "-c", snippet.text] if snippet.kind == "sh" else [sys.executable, "-c", snippet.text]
            proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)
            assert proc.returncode == 0, f"{snippet}\nexit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
            done["ran"].add((snippet.kind, snippet.text))
            ran += page == doc
    return ran


@pytest.mark.slow
@pytest.mark.parametrize("doc", documents(), ids=lambda p: p.name)
def test_page_runs_as_written(doc, docs_root):
    root, env, done = docs_root
    _run_page(doc, root, env, done)
    assert not (ROOT / "r18.onnx").exists() and not (ROOT / "resnet18.onnx").exists()
