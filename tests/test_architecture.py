"""The import rule of docs/ARCHITECTURE.md, checked on the source (no imports run):
which parts may import which, no import cycles, torch never reached from the
ONNX side, and every module listed in the architecture document."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "layertap"
CORE = {"errors", "selectors", "tables", "text", "inputs", "files", "specs", "metrics", "numformats", "options", "noise", "heap"}
# part -> parts it may import (itself always). ``core`` is the top-level modules above.
ALLOWED = {
    "core": {"core"},
    "pytorch": {"core", "samples"},
    "onnxfile": {"core"},
    "samples": {"core", "onnxfile"},
    "runtimes": {"core", "onnxfile"},
    "exporting": {"core", "pytorch", "onnxfile", "runtimes", "samples"},
    "comparing": {"core", "pytorch", "onnxfile", "runtimes", "samples"},
    "reports": {"core", "onnxfile", "comparing"},  # comparing.words only (WORDS_OF below)
    "dataset": {"core", "pytorch", "onnxfile", "reports", "runtimes", "samples"},
    "fixing": {"core", "pytorch", "onnxfile", "runtimes", "exporting", "comparing", "samples"},
    "reproducing": {"core", "pytorch", "onnxfile", "runtimes", "comparing", "samples"},
    "cli": {"core", "pytorch", "onnxfile", "runtimes", "exporting", "comparing", "reports", "dataset", "fixing",
            "reproducing", "samples"},
    "root": {"core", "pytorch", "onnxfile", "runtimes", "exporting", "comparing", "reports", "dataset", "fixing",
             "reproducing", "cli", "samples"},  # layertap/__init__.py, __main__.py
}
# Parts any other part may import inside a function only: the HTML renderers
# behind ``_repr_html_`` (a report object draws itself with them when asked).
LAZY_FOR_ALL = {"reports"}
# part -> the one module of another part it may read a report's words from: the compare
# wing owns its words (explanation, metric and threshold text, chart points); its pages
# only draw them, and the compare wing never reaches back into the pages.
WORDS_OF = {"reports": {"comparing": "layertap.comparing.words"}}
NEVER = {"comparing": {"reports"}}  # not even inside a function
# The runtimes' own libraries: every session and run of a file is made in runtimes/ (a new runtime
# is a module there). The one exception is a converter: fix's int8 conversion is ORT's quantize_static.
RUNTIME_LIBRARIES = {"onnxruntime", "openvino", "executorch", "ai_edge_litert"}
#: modules that convert models with those libraries' own tools (quantize_static; ExecuTorch's lowering; LiteRT's
#: converter and AI Edge Quantizer, whose calibration reads the program's signature)
CONVERTERS = {"layertap.fixing.convert", "layertap.pytorch.lowering", "layertap.pytorch.litert"}
#: a runtime whose Python bindings take and hand out torch tensors (ExecuTorch's) converts its feeds there; a
#: "program" runtime's plug-in lowers the PyTorch model itself, so it may reach the PyTorch side (inside functions)
TORCH_RUNTIMES = {"layertap.runtimes.executorch", "layertap.runtimes.compiled", "layertap.runtimes.litert"}


def _name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in sorted(SRC.rglob("*.py"))}


def _part(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] == "__main__":
        return "root"
    return "core" if parts[1] in CORE else parts[1]


def _imports(module: str, typing: bool = True) -> list[tuple[str, bool]]:
    """(imported module, at import time) for every import in ``module``.

    Imports inside functions and under ``if TYPE_CHECKING:`` are not run at
    import time; the rule still applies to them. ``typing=False`` leaves out
    those under ``if TYPE_CHECKING:`` (they never run at all).
    """
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text())
    out: list[tuple[str, bool]] = []

    def visit(node: ast.AST, eager: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, False)
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                if typing:
                    visit(child, False)
            elif isinstance(child, ast.Import):
                out.extend((a.name, eager) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    base = ".".join(up + ([child.module] if child.module else []))
                for a in child.names:
                    sub = f"{base}.{a.name}"
                    out.append((sub if sub in MODULES else base, eager))
            else:
                visit(child, eager)

    visit(tree, True)
    return out


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_follow_the_rule(module):
    part = _part(module)
    bad = []
    for target, eager in _imports(module):
        if target.split(".")[0] == "torch" and part in ("core", "onnxfile", "runtimes", "samples") \
                and module not in TORCH_RUNTIMES:
            bad.append(f"{target} (the ONNX side and the core never import torch)")
        if target.split(".")[0] in RUNTIME_LIBRARIES and part != "runtimes" and module not in CONVERTERS:
            bad.append(f"{target} (only runtimes/ runs a file)")
        if not target.startswith("layertap") or target not in MODULES:
            continue
        other = _part(target)
        if other in NEVER.get(part, ()):
            bad.append(f"{target} ({part} never imports {other})")
            continue
        words = WORDS_OF.get(part, {}).get(other)
        if words is not None and target != words:
            bad.append(f"{target} ({part} may import only {words} of {other})")
            continue
        if other == "root" or (other in LAZY_FOR_ALL and not eager):
            continue
        if other == "pytorch" and module in TORCH_RUNTIMES and not eager:
            continue
        if other != part and other not in ALLOWED[part]:
            bad.append(f"{target} ({part} may import {', '.join(sorted(ALLOWED[part]))})")
        if module == "layertap.cli.console" and target.startswith("layertap.cli."):
            bad.append(f"{target} (cli/console.py is a leaf)")
    assert not bad, f"{module} imports: " + "; ".join(bad)


def _import_graph() -> dict[str, list[str]]:
    """module -> the modules it imports: at import time, inside a function, or for its type hints (a loop
    through type hints is a loop a reader follows, and the next edit that runs the import closes it)."""
    return {m: sorted({t for t, _ in _imports(m) if t in MODULES and t != m}) for m in MODULES}


def _check_acyclic(graph: dict[str, list[str]]) -> None:
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def dfs(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in graph[m]:
            if state.get(t) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(t):] + [t]))
            if t not in state:
                dfs(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            dfs(m)


def test_no_import_cycles():
    _check_acyclic(_import_graph())


def test_every_module_is_in_the_architecture_document():
    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    missing = [str(p.relative_to(SRC)) for p in MODULES.values() if p.name != "__init__.py" and p.name not in doc]
    assert not missing, f"docs/ARCHITECTURE.md does not list: {', '.join(missing)}"


def test_the_rule_catches_a_bad_import(tmp_path, monkeypatch):
    # the checker itself: an onnxfile module importing torch and the PyTorch side is refused
    bad = tmp_path / "layertap" / "onnxfile" / "bad.py"
    bad.parent.mkdir(parents=True)
    bad.write_text("import torch\nfrom ..pytorch.values import flatten\n")
    monkeypatch.setitem(MODULES, "layertap.onnxfile.bad", bad)
    monkeypatch.setitem(MODULES, "layertap.pytorch.values", SRC / "pytorch" / "values.py")
    with pytest.raises(AssertionError, match="never import torch.*pytorch.values"):
        test_imports_follow_the_rule("layertap.onnxfile.bad")
    bad.write_text("def f():\n    import onnxruntime\n")  # onnxfile/ reads and edits files; only runtimes/ runs them
    with pytest.raises(AssertionError, match="onnxruntime .only runtimes/ runs a file"):
        test_imports_follow_the_rule("layertap.onnxfile.bad")


def test_the_rule_keeps_compare_words_in_the_compare_wing(tmp_path, monkeypatch):
    # comparing never reaches into the pages, not even lazily; a page reads comparing.words only
    for part, name, text in (("comparing", "bad", "def f():\n    from ..reports.compare_page import explain\n"),
                             ("reports", "bad_page", "from ..comparing.api import compare\n")):
        bad = tmp_path / "layertap" / part / f"{name}.py"
        bad.parent.mkdir(parents=True)
        bad.write_text(text)
        monkeypatch.setitem(MODULES, f"layertap.{part}.{name}", bad)
    with pytest.raises(AssertionError, match="comparing never imports reports"):
        test_imports_follow_the_rule("layertap.comparing.bad")
    with pytest.raises(AssertionError, match="reports may import only layertap.comparing.words of comparing"):
        test_imports_follow_the_rule("layertap.reports.bad_page")


def test_the_cycle_check_counts_imports_inside_functions():
    graph = {m: list(ts) for m, ts in _import_graph().items()}
    graph["layertap.errors"] = [*graph["layertap.errors"], "layertap.tables"]  # as if errors imported tables lazily
    with pytest.raises(AssertionError, match="import cycle: .*layertap.errors"):
        _check_acyclic(graph)


MAX_FUNCTION_LINES = 60


def _long_functions(path: Path, module: str) -> list[str]:
    """``module.function (N lines)`` for each function over MAX_FUNCTION_LINES lines of code:
    docstring, blank and comment lines do not count."""
    text = path.read_text()
    lines = text.splitlines()
    out = []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        doc = node.body[0]
        skip = set()
        if isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str):
            skip = set(range(doc.lineno, doc.end_lineno + 1))
        code = [i for i in range(node.lineno, node.end_lineno + 1)
                if i not in skip and lines[i - 1].strip() and not lines[i - 1].strip().startswith("#")]
        name = f"{module}.{node.name}"
        if len(code) > MAX_FUNCTION_LINES:
            out.append(f"{name} ({len(code)} lines)")
    return out


def test_no_function_is_longer_than_60_lines():
    long = [f for module, path in MODULES.items() for f in _long_functions(path, module)]
    assert not long, "functions over 60 lines of code: " + ", ".join(long)


def test_the_length_check_counts_code_lines_only(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(60))
    ok = tmp_path / "ok.py"  # the def line and 59 more: 60
    ok.write_text(f'def f():\n    """Doc.\n\n    more doc\n    """\n    # why\n\n{body[body.index("x1 ="):].join(["    ", ""])}')
    long = tmp_path / "long.py"
    long.write_text(f"def f():\n{body}    return x0\n")
    assert _long_functions(ok, "ok") == []
    assert _long_functions(long, "long") == ["long.f (62 lines)"]


def test_module_names_say_what_they_hold():
    # one file name per part, and public classes only in public modules
    seen: dict[tuple[str, str], str] = {}
    bad = []
    for module, path in MODULES.items():
        if path.name == "__init__.py":
            continue
        key = (_part(module), path.name)
        if key in seen:
            bad.append(f"{seen[key]} and {module} share the file name {path.name}")
        seen[key] = module
        if path.name.startswith("_"):
            classes = [n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef) and not n.name.startswith("_")]
            bad.extend(f"{module}.{c} (a public class in a private module)" for c in classes)
    assert not bad, "; ".join(bad)
