"""The files of a repro package: the parts, the arrays, ``repro.py``, ``README.md``, ``repro.json``.

``repro.py`` is generated to import only numpy, onnx and onnxruntime; :func:`check_package`
runs it in a fresh interpreter (``python -I``, cwd the package) and the reference's part in
ONNX Runtime, so the package is known to reproduce before it is handed over.
"""

from __future__ import annotations

import json
import platform
import re
import subprocess
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from ..files.arrays import npz_member, save_arrays
from ..metrics import error_stats
from ..onnxfile.modelfile import is_onnx_source, read_model
from ..onnxfile.parts import PartCutter, save_part
from ..onnxfile.scopemap import GraphFacts, ScopeMap, expose_fused_values_in_place, is_fused_llm
from ..onnxfile.tensor_types import element_type
from ..runtimes import open_runtime
from ..runtimes.ort import EXACT_INT8

#: the file that marks a folder as a repro package (a later repro may replace it)
MARKER = "repro.json"
_VERSIONS = ("torch", "onnx", "onnxruntime", "onnxconverter-common", "onnxscript", "onnx-ir", "numpy", "layertap")


@dataclass
class Check:
    """The package run as a user runs it: ``repro.py``'s exit status, figure and output."""

    exit_status: int
    output: str
    error: float | None
    ref_error: float | None = None
    ref_agrees: bool | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def reproduced(self) -> bool:
        """``repro.py`` showed the mismatch (exit 1) and the reference's part, if any, agrees."""
        return self.exit_status == 1 and "mismatch:" in self.output and self.ref_agrees is not False


def write_package(folder: Path, cand: Any, ref: Any, part: Any, row: Any, *, rtol: float, atol: float) -> list[str]:
    """``cand.onnx`` (and ``ref.onnx`` for an ONNX reference), ``inputs.npz``, ``expected.npz``
    and ``repro.py`` in ``folder``; returns notes on what is missing."""
    notes = []
    _cand_part(folder, _path(cand), part)
    if is_onnx_source(ref):
        why = _ref_part(folder, _path(ref), part)
        if why:
            notes.append(f"no ref.onnx: {why}")
    save_arrays(folder / "inputs.npz", part.inputs)
    save_arrays(folder / "expected.npz", part.expected)
    (folder / "repro.py").write_text(_repro_py(row.name, part, rtol, atol), encoding="utf-8")
    return notes


def _path(source: Any) -> Path:
    """Where an ONNX source lives (read again here: a file ``compare`` read holds no inline weights after it)."""
    return Path(source.path if hasattr(source, "path") else source)


def _cand_part(folder: Path, path: Path, part: Any) -> None:
    """The candidate's nodes of the call, fed the reference's values (cast inside to the file's types)."""
    mf = _read(path)
    cutter = PartCutter(mf.model)
    inputs = {t: (element_type(v), v.shape) for t, v in part.inputs.items()}
    piece = cutter.piece(part.nodes, inputs, list(part.expected), cast=part.casts)
    save_part(cutter.model([piece], "candidate_part"), folder / "cand.onnx", mf.folder)


def _ref_part(folder: Path, path: Path, part: Any) -> str | None:
    """The reference file's nodes of the same call, fed the same inputs; or why there is none."""
    mf = _read(path)
    smap = ScopeMap.from_model(mf.model)
    rename = {part.ref_names.get(t, t): t for t in [*part.inputs, *part.expected]}
    if smap.source != "none":
        nodes, entering, _ = smap.call_nodes(part.path, part.call)
    else:  # no module scopes: the row is a tensor, its part the reference's nodes that make it
        nodes, entering = _makers(mf.model.graph, [part.ref_names.get(c, c) for c in part.expected])
    if not nodes:
        return "the reference file has no nodes of this call under its module scope"
    missing = [t for t in entering if t not in rename or rename[t] not in part.inputs]
    if missing:
        return f"the reference's part reads {missing[0]}, which the candidate's part is not fed"
    inputs = {r: (element_type(part.inputs[rename[r]]), part.inputs[rename[r]].shape) for r in entering}
    outputs = [part.ref_names.get(c, c) for c in part.expected]
    cutter = PartCutter(mf.model)
    piece = cutter.piece(nodes, inputs, outputs, rename=rename)
    if len(piece.outputs) < len(outputs):
        return "the reference's nodes of this call do not make the tensors compared"
    save_part(cutter.model([piece], "reference_part"), folder / "ref.onnx", mf.folder)
    return None


def _read(path: Path) -> Any:
    """A file read for its part: a fused decoder's hidden values made tensors of this copy, as its
    compare side made them (the part's nodes are counted in that graph)."""
    mf = read_model(path)
    if is_fused_llm(mf.model.graph):
        expose_fused_values_in_place(mf.model.graph)
    return mf


def _makers(graph: Any, tensors: list[str]) -> tuple[list[int], tuple[str, ...]]:
    """The nodes that make ``tensors`` and the tensors they read from outside (weights excluded)."""
    nodes = sorted({i for i, n in enumerate(graph.node) if set(n.output) & set(tensors)})
    return nodes, (GraphFacts(graph).entering(nodes) if nodes else ())


def check_package(folder: Path, *, rtol: float, atol: float, timeout: float = 900) -> Check:
    """Run ``repro.py`` in a fresh interpreter (only the package on its path), and the reference's part."""
    try:
        proc = subprocess.run([sys.executable, "-I", "repro.py"], cwd=folder, capture_output=True, text=True,
                              timeout=timeout)
        status, output = proc.returncode, (proc.stdout + proc.stderr).strip()
    except subprocess.TimeoutExpired:
        status, output = -1, f"repro.py ran past {timeout:.0f} s"
    found = re.search(r"worst rel error (\S+)", output)
    check = Check(status, output, float(found.group(1)) if found else None)
    if status not in (0, 1) or found is None:
        check.notes.append(f"repro.py failed: {output.splitlines()[-1] if output else f'exit {status}'}")
    if (folder / "ref.onnx").is_file():
        check.ref_error, check.ref_agrees = _run_ref(folder, rtol, atol)
        if not check.ref_agrees:
            check.notes.append(f"the reference's part disagrees with expected.npz (rel error {check.ref_error:.3g})")
    return check


def _run_ref(folder: Path, rtol: float, atol: float) -> tuple[float, bool]:
    """The reference's part on ``inputs.npz`` against ``expected.npz``: worst rel error, agreement."""
    engine = open_runtime().open_file(folder / "ref.onnx")  # what repro.py runs it in
    with np.load(folder / "inputs.npz") as inputs, np.load(folder / "expected.npz") as expected:
        feed = {i.name: inputs[npz_member(i.name)] for i in engine.get_inputs()}
        names = engine.output_names()
        got = engine.run(names, feed)
        stats = [error_stats(expected[npz_member(n)], got[n].reshape(expected[npz_member(n)].shape), rtol, atol)
                 for n in names]
    return max((s.rel_err for s in stats), default=0.0), all(s.ok for s in stats)


def finish_package(folder: Path, part: Any, row: Any, check: Check, notes: list[str], command: str,
                   sample: tuple[int, int] | None = None) -> None:
    """``README.md`` (command, versions, the error seen, the sample of several) and ``repro.json`` (the marker)."""
    files = sorted(p.name for p in folder.iterdir())
    versions = {"python": platform.python_version(), **_versions()}
    text = _readme(row, part, check, notes, command, versions, files, sample)
    (folder / "README.md").write_text(text, encoding="utf-8")
    record = dict(module=row.name, path=part.path, call=part.call, reproduced=check.reproduced, error=check.error,
                  ref_error=check.ref_error, files=sorted({*files, "README.md"}), command=command, versions=versions,
                  notes=notes, sample=None if sample is None else sample[0], samples=1 if sample is None else sample[1])
    (folder / MARKER).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def _versions() -> dict[str, str]:
    """Installed versions of the tools that made and run the files (without importing them)."""
    out = {}
    for name in _VERSIONS:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def _readme(row: Any, part: Any, check: Check, notes: list[str], command: str, versions: dict[str, str],
            files: list[str], sample: tuple[int, int] | None = None) -> str:
    verdict = ("The candidate's part of this call, fed the reference's own inputs, differs from the reference's "
               "output: `python repro.py` exits 1 and prints the error below." if check.reproduced else
               "**Does not reproduce**: the candidate's part of this call alone, fed the reference's inputs, does not "
               "show the mismatch (the error comes from elsewhere, or from ONNX Runtime's fusions across the call).")
    described = {
        "cand.onnx": "the candidate file's nodes of this call (big weights in cand.onnx.data)",
        "ref.onnx": "the reference file's nodes of the same call, fed the same inputs",
        "inputs.npz": "the tensors entering the call, from the reference run (both parts take these)",
        "expected.npz": "the reference's output of the call",
        "repro.py": "runs cand.onnx on inputs.npz and compares with expected.npz (numpy, onnx, onnxruntime only)",
    }
    lines = [f"# Repro: module `{row.name}`", "", verdict, "", "Made by:", "", "```", command, "```", "",
             "The error seen:", "", "```", check.output, "```", ""]
    if sample is not None:
        lines[-6:-6] = [f"Sample {sample[0]} of the {sample[1]} given (counted from 0): the one where this call's "
                        "error is worst.", ""]
    if check.ref_error is not None:
        lines += [f"`ref.onnx` on `inputs.npz` against `expected.npz`: rel error {check.ref_error:.3g} "
                  f"({'agrees' if check.ref_agrees else 'DISAGREES'}).", ""]
    lines += ["Files:", ""] + [f"- `{f}`: {described[f]}" for f in files if f in described] + [""]
    lines += ["Versions:", ""] + [f"- {k} {v}" for k, v in versions.items()] + [""]
    return "\n".join(lines + [f"Note: {n}" for n in notes]) + "\n"


def _repro_py(module: str, part: Any, rtol: float, atol: float) -> str:
    """The script: the candidate's part on the inputs, each output's error, exit 1 while any exceeds the tolerance."""
    inputs = {t: npz_member(t) for t in part.inputs}
    expected = {t: npz_member(t) for t in part.expected}

    return _SCRIPT.format(module=module, rtol=rtol, atol=atol, inputs=inputs, expected=expected, exact_int8=EXACT_INT8)


_SCRIPT = '''"""Reproduce: module {module!r} of the candidate, fed the reference's inputs, differs from the reference.

Needs numpy, onnx and onnxruntime only. Exit 1 while the error exceeds the tolerance, 0 once it is within.
"""
import sys

import numpy as np
import onnx
import onnxruntime as ort

MODULE = {module!r}
RTOL, ATOL = {rtol!r}, {atol!r}
INPUTS = {inputs!r}  # tensor name -> member of inputs.npz
EXPECTED = {expected!r}  # tensor name -> member of expected.npz
# as layertap runs it: exact int8 sums on every x86 CPU (ONNX Runtime's own option; without it, CPUs
# without VNNI saturate pairs of int8 products in 16 bits)
EXACT_INT8 = {exact_int8!r}


def error(ref, got):
    """max abs error, rel error (max abs / max |ref|), within the tolerance."""
    ref, got = ref.astype(np.float64), got.astype(np.float64).reshape(ref.shape)
    diff = np.abs(got - ref)
    max_abs = float("inf") if not np.isfinite(diff).all() else float(diff.max(initial=0.0))
    scale = float(np.abs(ref[np.isfinite(ref)]).max(initial=0.0))
    return max_abs, max_abs / scale if scale else max_abs, max_abs <= ATOL + RTOL * scale


def open_session(path):
    """The part in ONNX Runtime with exact int8 sums, unless ORT refuses them for this graph."""
    options = ort.SessionOptions()
    options.add_session_config_entry(*EXACT_INT8)
    try:
        return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    except Exception:  # ORT 1.32 refuses the option where two nodes read one int8 weight
        return ort.InferenceSession(path, providers=["CPUExecutionProvider"])


def main():
    graph = onnx.load("cand.onnx", load_external_data=False).graph
    ops = sorted({{n.op_type for n in graph.node}})
    print(f"{{MODULE}}: candidate part of {{len(graph.node)}} nodes ({{', '.join(ops)}}); "
          f"onnx {{onnx.__version__}}, onnxruntime {{ort.__version__}}")
    session = open_session("cand.onnx")
    with np.load("inputs.npz") as inputs, np.load("expected.npz") as expected:
        feed = {{name: inputs[member] for name, member in INPUTS.items()}}
        names = list(EXPECTED)
        got = dict(zip(names, session.run(names, feed)))
        worst, ok = 0.0, True
        for name in names:
            max_abs, rel, within = error(expected[EXPECTED[name]], got[name])
            bad = int((~np.isfinite(got[name])).sum())
            print(f"{{name}}: max abs error {{max_abs:.6g}}, rel error {{rel:.6g}}"
                  f"{{f', {{bad}} non-finite values' if bad else ''}} -> {{'ok' if within else 'MISMATCH'}}")
            worst, ok = max(worst, rel), ok and within
    verdict = "within" if ok else "exceeds"
    print(f"{{'agrees' if ok else 'mismatch'}}: worst rel error {{worst:.6g}} {{verdict}} the tolerance "
          f"(max abs <= {{ATOL}} + {{RTOL}} * max|expected|)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
'''
