"""Benchmark ``lt.compare`` on resnet50 (random weights).

Measures, each in a fresh process so that peak memory (``ru_maxrss``) is
the work's own:

* baseline: one PyTorch forward plus one ONNX Runtime run of the untapped
  file (session already built; best of ``--repeat``), and
* compare: ``lt.compare(model, x, file)`` end to end, as a user calls it
  (graph load, scope mapping, PyTorch run with every module hooked, ORT
  session(s) with every counterpart exposed, statistics); best of ``--repeat``.

Goal: compare <= 2.5x the baseline.

A command-line user pays the first call of a fresh process. ``--first N`` (default 5) times, in
fresh processes interleaved after one warm-up each (medians of ``N``):

* first call: ``import layertap``, the model built, then the first ``lt.compare(model, x, file)``
  (layertap's, ONNX's and ONNX Runtime's imports inside it), and
* the engines alone, the floor of that first call: the model built, then ``import onnx, onnxruntime``,
  one PyTorch forward, a session exposing every node output (the graph read without its weights,
  which ORT reads from the file's data) and one run.

Both are also printed as whole processes from the first line of the child (``import torch``
included), and the first call's own steps (more fresh processes, each step timed where layertap
makes it: the import, the file read, the reference's set-up, the hooked forward, the session build
with the weight check beside it, the candidate's run, the rows). Goal: first call <= 1.15x the floor.
The children read compiled bytecode as an installed package does (``PYTHONDONTWRITEBYTECODE`` left out, caches under a temporary
``PYTHONPYCACHEPREFIX`` written by the warm-up).

With ``--fp16`` it also measures resnet50 float32 vs its float16
conversion (onnxconverter-common, ``keep_io_types=True``), layer by layer:

* fp16 baseline: one ORT run of each file (sessions built; best of ``--repeat``),
* ONNX Runtime's own floor for any layer-by-layer comparison, without layertap: each
  file loaded, every node output exposed, the session built and run once,
* ``lt.compare(fp32_file, x, fp16_file, metric="cosine")`` end to end, and
* the rival, Polygraphy: ``polygraphy run FILE --onnxrt --onnx-outputs mark all``
  on the float32 file (``--save-inputs``/``--save-outputs``), then on the float16
  file with ``--load-inputs``/``--load-outputs`` (saved outputs compared), both
  processes timed together, peak RSS of the larger one (skipped, with a line, when
  Polygraphy is not installed), and
* many samples (``--samples N``, default 16): ``lt.compare(fp32_file, None, fp16_file,
  samples=[N feeds])`` against N plain ORT runs of each file (sessions built once, not
  counted), interleaved in one process, medians of ``--repeat`` rounds. Goal: <= 2.0x.

Every plain ORT baseline is measured with ORT's default session options and with the one
layertap sets (``session.intra_op.allow_spinning`` 0: no spin-waiting worker threads, which on
a machine of few cores take the cores layertap's own work between runs needs), and the many
runs three ways: sample by sample with each, and file by file with ORT's defaults (then no
pool spins beside the other file's run). The goals are judged against the fastest of them, so
that no ratio is won by a session option or by the order of a user's own runs.

On a shared machine the separate processes above see different loads. ``--rounds N`` also
times, in one process interleaved round by round (medians of ``N`` rounds, wall and this
process's CPU time), each plain baseline beside the ``lt.compare`` it is the yardstick of: one
PyTorch forward plus one ORT run of the file (ORT's defaults) beside ``lt.compare(model, x, file)``,
and (with ``--fp16``) one ORT run of each file beside ``lt.compare(fp32_file, x, fp16_file)``.
Every ``lt.compare`` there builds its sessions, as a user's call does (a "cold" compare).

Run:
    .venv/bin/python benchmarks/bench_compare.py [--batch 1] [--size 224] [--repeat 3] [--budget-mb N] [--fp16] [--samples 16]
        [--rounds N] [--first N]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable


def _model(seed: int = 0):
    import torch
    import torchvision

    torch.manual_seed(seed)
    return torchvision.models.resnet50(weights=None).eval()


def _input(batch: int, size: int):
    import torch

    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(1))


def _rss_mb() -> float:
    """Peak RSS of this process. ``ru_maxrss`` survives ``exec`` on Linux (a child would
    report its parent's peak at fork), so read the fresh address space's ``VmHWM``."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _session(path: str, spin: bool):
    """A plain session: ORT's defaults (``spin``), or with layertap's one change (no spinning)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    if not spin:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def child_baseline(path: str, batch: int, size: int, repeat: int) -> dict:
    import torch

    model, x = _model(), _input(batch, size)
    rss_loaded = _rss_mb()
    t0 = time.perf_counter()
    sessions = {"spin": _session(path, True)}
    t_session = time.perf_counter() - t0
    sessions["nospin"] = _session(path, False)
    feed = {sessions["spin"].get_inputs()[0].name: x.numpy()}
    best_pt, best_ort = float("inf"), {k: float("inf") for k in sessions}
    for _ in range(repeat):
        t0 = time.perf_counter()
        with torch.no_grad():
            model(x)
        best_pt = min(best_pt, time.perf_counter() - t0)
        for key, sess in sessions.items():
            t0 = time.perf_counter()
            sess.run(None, feed)
            best_ort[key] = min(best_ort[key], time.perf_counter() - t0)
    return {"torch_s": best_pt, "ort_s": best_ort["spin"], "ort_nospin_s": best_ort["nospin"], "ort_session_s": t_session,
            "rss_loaded_mb": rss_loaded, "peak_rss_mb": _rss_mb()}


def child_compare(path: str, batch: int, size: int, repeat: int, budget_mb: int | None = None) -> dict:
    import layertap as lt

    model, x = _model(), _input(batch, size)
    rss_loaded = _rss_mb()
    times = []
    report = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        opts = {"memory_budget": budget_mb << 20} if budget_mb else {}
        report = lt.compare(model, x, path, **opts)
        times.append(time.perf_counter() - t0)
    c = report.counts()
    return {"compare_s": min(times), "compare_first_s": times[0], "ok": report.ok, "rows": len(report.rows),
            "counts": c, "ort_runs": report.ort_runs, "rss_loaded_mb": rss_loaded, "peak_rss_mb": _rss_mb()}


def child_first(path: str, batch: int, size: int) -> dict:
    """The first ``lt.compare`` of a fresh process (``import layertap`` and the model before it)."""
    t_start = time.perf_counter()
    import layertap as lt

    model, x = _model(), _input(batch, size)
    t0, c0 = time.perf_counter(), time.process_time()
    report = lt.compare(model, x, path)
    t1 = time.perf_counter()
    return {"first_s": t1 - t0, "cpu_s": time.process_time() - c0, "process_s": t1 - t_start, "ok": report.ok,
            "rows": len(report.rows)}


def child_first_floor(path: str, batch: int, size: int) -> dict:
    """The same first call's work done by the engines alone in a fresh process: their imports, one
    forward, a session exposing every node output, one run."""
    t_start = time.perf_counter()
    import torch

    model, x = _model(), _input(batch, size)
    t0, c0 = time.perf_counter(), time.process_time()
    import onnx
    import onnxruntime as ort

    with torch.no_grad():
        model(x)
    graph = onnx.load(path, load_external_data=False)
    outs = [t for node in graph.graph.node for t in node.output if t]
    del graph.graph.output[:]
    graph.graph.output.extend(onnx.helper.make_empty_tensor_value_info(t) for t in outs)
    so = ort.SessionOptions()
    so.add_session_config_entry("session.model_external_initializers_file_folder_path", str(Path(path).parent))
    sess = ort.InferenceSession(graph.SerializeToString(), so, providers=["CPUExecutionProvider"])
    sess.run(outs, {sess.get_inputs()[0].name: x.numpy()})
    t1 = time.perf_counter()
    return {"first_s": t1 - t0, "cpu_s": time.process_time() - c0, "process_s": t1 - t_start, "outputs": len(outs)}


#: the first call's steps, timed where layertap makes them (module, owner attribute or "", function, label)
FIRST_STEPS = (("layertap.comparing.onnx_side", "OrtSide", "__init__", "file read (onnx imported)"),
               ("layertap.comparing.torch_ref", "TorchReference", "__init__", "reference set-up"),
               ("layertap.comparing.torch_ref", "", "run_torch", "hooked forward"),
               ("layertap.comparing.onnx_side", "OrtSide", "prepare", "session build"),
               ("layertap.comparing.onnx_side", "OrtSide", "run", "candidate run"),
               ("layertap.comparing.driver", "Driver", "_judge", "rows"))


def child_first_steps(path: str, batch: int, size: int) -> dict:
    """The first ``lt.compare`` of a fresh process, step by step (:data:`FIRST_STEPS`; each step's own time,
    the steps of worker threads included: the session build runs beside the weight check)."""
    import functools
    import importlib

    import layertap as lt

    model, x = _model(), _input(batch, size)
    t0 = time.perf_counter()
    importlib.import_module("layertap.comparing.api")  # what the first lt.compare imports
    steps = {"import layertap.comparing": time.perf_counter() - t0}

    def timed(fn: Callable[..., Any], label: str) -> Callable[..., Any]:
        @functools.wraps(fn)
        def step(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                steps[label] = steps.get(label, 0.0) + time.perf_counter() - start
        return step

    for module, owner, name, label in FIRST_STEPS:
        where = importlib.import_module(module)
        where = getattr(where, owner) if owner else where
        setattr(where, name, timed(getattr(where, name), label))
    lt.compare(model, x, path)
    steps["whole first call"] = time.perf_counter() - t0
    return steps


def _first_calls(path: Path, ns: argparse.Namespace) -> dict:
    """``--first N`` fresh processes of each kind, interleaved after one warm-up each; medians."""
    import statistics

    with tempfile.TemporaryDirectory(prefix="bench-compare-pyc-") as cache:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = cache
        runs: dict[str, list[dict]] = {"first": [], "first-floor": []}
        for r in range(ns.first + 1):
            for mode in (list(runs) if r % 2 else list(runs)[::-1]):
                result = _run_child(mode, path, ns, env)
                if r:
                    runs[mode].append(result)
        steps = [_run_child("first-steps", path, ns, env) for _ in range(ns.first)]
    med = statistics.median
    out = {mode: {key: med(x[key] for x in rs) for key in ("first_s", "cpu_s", "process_s")} | {"n": len(rs), "range": (
        min(x["first_s"] for x in rs), max(x["first_s"] for x in rs))} for mode, rs in runs.items()}
    out["steps"] = {label: med(s.get(label, 0.0) for s in steps) for label in steps[0]} if steps else {}
    return out


def _print_first(r: dict) -> None:
    c, f = r["first"], r["first-floor"]
    print(f"  first call in a fresh process (medians of {c['n']}, interleaved): lt.compare {c['first_s'] * 1e3:.0f} ms "
          f"(range {c['range'][0] * 1e3:.0f}-{c['range'][1] * 1e3:.0f}); the engines alone (imports, forward, a session "
          f"exposing every node output, one run) {f['first_s'] * 1e3:.0f} ms (range {f['range'][0] * 1e3:.0f}-"
          f"{f['range'][1] * 1e3:.0f}) -> {c['first_s'] / f['first_s']:.2f}x (goal <= 1.15x); by the process's CPU time "
          f"{c['cpu_s'] * 1e3:.0f} against {f['cpu_s'] * 1e3:.0f} ms -> {c['cpu_s'] / f['cpu_s']:.2f}x")
    print(f"  whole processes, import torch included: layertap {c['process_s']:.2f} s, engines alone {f['process_s']:.2f} s"
          f" -> {c['process_s'] / f['process_s']:.2f}x")
    if r["steps"]:
        shown = ", ".join(f"{label} {t * 1e3:.0f}" for label, t in r["steps"].items())
        print(f"  the first call's steps (ms, medians of {c['n']} more fresh processes; the weight check runs beside "
              f"the session build): {shown}")


def child_fp16_baseline(path: str, batch: int, size: int, repeat: int) -> dict:
    x = _np_input(batch, size)
    best, built = {}, {}
    for spin in (True, False):
        for name in (path, _fp16_path(path)):
            t0 = time.perf_counter()
            sess = _session(name, spin)
            built[name, spin] = time.perf_counter() - t0
            feed = {sess.get_inputs()[0].name: x}
            t = float("inf")
            for _ in range(repeat):
                t0 = time.perf_counter()
                sess.run(None, feed)
                t = min(t, time.perf_counter() - t0)
            best[name, spin] = t
    fp16 = _fp16_path(path)
    return {"fp32_s": best[path, True], "fp16_s": best[fp16, True], "peak_rss_mb": _rss_mb(),
            "fp32_nospin_s": best[path, False], "fp16_nospin_s": best[fp16, False],
            "sessions_s": built[path, True] + built[fp16, True]}


def _np_input(batch: int, size: int):
    """The ONNX-only children never import torch (their RSS is ORT's and layertap's own)."""
    import numpy as np

    return np.random.default_rng(1).standard_normal((batch, 3, size, size)).astype(np.float32)


def child_fp16_compare(path: str, batch: int, size: int, repeat: int, budget_mb: int | None = None) -> dict:
    import layertap as lt

    x = _np_input(batch, size)
    times, report = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        report = lt.compare(path, {"x": x}, _fp16_path(path), metric="cosine")
        times.append(time.perf_counter() - t0)
    return {"compare_s": min(times), "compare_first_s": times[0], "ok": report.ok, "rows": len(report.rows),
            "counts": report.counts(), "ort_runs": report.ort_runs, "peak_rss_mb": _rss_mb(),
            "first_divergence": report.first_divergence}


def child_fp16_floor(path: str, batch: int, size: int, repeat: int) -> dict:
    """What any layer-by-layer comparison pays ONNX Runtime itself, without layertap: per file,
    load it, expose every node output, build the session and run it once (best of ``repeat``).

    Two ways: ``naive`` hands ORT the whole model with its weights serialised (what a script
    written by hand does), ``by_ref`` hands the weights over as ``OrtValue``s that ORT reads in
    place (what lt.compare does), so only the graph is serialised and parsed.
    """
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    x = _np_input(batch, size)

    def one(name: str, by_ref: bool) -> tuple[float, float]:
        model = onnx.load(name)
        outs = [t for n in model.graph.node for t in n.output if t]
        del model.graph.output[:]
        model.graph.output.extend(onnx.helper.make_empty_tensor_value_info(t) for t in outs)
        so = ort.SessionOptions()
        if by_ref:
            names, values = [], []
            for init in model.graph.initializer:
                if init.ByteSize() < 1024:
                    continue  # small constants (axes, shapes) stay inline: shape inference reads them
                names.append(init.name)
                values.append(ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(numpy_helper.to_array(init))))
                for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data"):
                    init.ClearField(field)
                init.data_location = onnx.TensorProto.EXTERNAL  # ORT takes the values handed over below
                for key, value in (("location", "*/in-memory/*"), ("offset", "0"), ("length", "0")):
                    init.external_data.add(key=key, value=value)
            so.add_external_initializers(names, values)
        t1 = time.perf_counter()
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        t2 = time.perf_counter()
        sess.run(outs, {"x": x})
        return t2 - t1, time.perf_counter() - t2

    result = {}
    for way in ("naive", "by_ref"):
        best = (float("inf"), 0.0, 0.0)
        for _ in range(repeat):
            t0 = time.perf_counter()
            parts = [one(name, way == "by_ref") for name in (path, _fp16_path(path))]
            total = time.perf_counter() - t0
            if total < best[0]:
                best = (total, sum(p[0] for p in parts), sum(p[1] for p in parts))
        result[way] = {"floor_s": best[0], "builds_s": best[1], "runs_s": best[2]}
    return result


def child_fp16_samples(path: str, batch: int, size: int, repeat: int, samples: int) -> dict:
    """``lt.compare`` over ``samples`` feeds against ``samples`` plain runs of each file (ORT's
    default sessions, and sessions without spinning), interleaved round by round in this one
    process (medians; the plain sessions are built before, not counted); and ``lt.compare`` of one
    of the feeds, a call of its own (it builds its sessions, like any call)."""
    import statistics

    import numpy as np

    import layertap as lt

    rng = np.random.default_rng(2)
    feeds = [{"x": rng.standard_normal((batch, 3, size, size)).astype(np.float32)} for _ in range(samples)]
    sessions = {spin: [_session(name, spin) for name in (path, _fp16_path(path))] for spin in (True, False)}
    for sess in (*sessions[True], *sessions[False]):
        sess.run(None, feeds[0])  # warm: first-run allocations
    plain: dict = {True: [], False: [], "each": []}
    plain_cpu: dict = {True: [], False: [], "each": []}
    compared, compared_cpu, one, report = [], [], [], None
    for _ in range(repeat):
        for spin in (True, False, "each"):
            t0, c0 = time.perf_counter(), time.process_time()
            if spin == "each":  # ORT's defaults, each file's runs one after the other: no pool spins beside the other's
                for sess in sessions[True]:
                    for feed in feeds:
                        sess.run(None, feed)
            else:
                for feed in feeds:
                    for sess in sessions[spin]:
                        sess.run(None, feed)
            plain[spin].append(time.perf_counter() - t0)
            plain_cpu[spin].append(time.process_time() - c0)
        t0, c0 = time.perf_counter(), time.process_time()
        report = lt.compare(path, None, _fp16_path(path), samples=feeds, metric="cosine")
        compared.append(time.perf_counter() - t0)
        compared_cpu.append(time.process_time() - c0)
        t0 = time.perf_counter()
        lt.compare(path, None, _fp16_path(path), samples=feeds[:1], metric="cosine")
        one.append(time.perf_counter() - t0)
    med = statistics.median
    return {"plain_s": med(plain[True]), "plain_nospin_s": med(plain[False]), "plain_each_s": med(plain["each"]),
            "plain_each_cpu_s": med(plain_cpu["each"]), "compare_s": med(compared),
            "one_s": med(one), "samples": samples,
            "plain_cpu_s": med(plain_cpu[True]), "plain_nospin_cpu_s": med(plain_cpu[False]),
            "compare_cpu_s": med(compared_cpu),
            "rows": len(report.rows), "counts": report.counts(), "ort_runs": report.ort_runs,
            "first_divergence": report.first_divergence}


def child_polygraphy(path: str, batch: int, size: int, repeat: int) -> dict:
    """Polygraphy marks every tensor of each file and compares the saved outputs (best of ``repeat``)."""
    folder = Path(path).parent
    exe = str(Path(sys.executable).with_name("polygraphy"))
    if not Path(exe).is_file():
        return {"skipped": "Polygraphy is not installed (pip install -e '.[bench]'): its rival row is skipped"}
    first = [exe, "run", path, "--onnxrt", "--onnx-outputs", "mark", "all", "--input-shapes", f"x:[{batch},3,{size},{size}]",
             "--save-inputs", str(folder / "pg_in.json"), "--save-outputs", str(folder / "pg_fp32.json")]
    second = [exe, "run", _fp16_path(path), "--onnxrt", "--onnx-outputs", "mark", "all",
              "--load-inputs", str(folder / "pg_in.json"), "--load-outputs", str(folder / "pg_fp32.json")]
    times, rc = [], 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(first, capture_output=True, text=True, check=True)
        rc = subprocess.run(second, capture_output=True, text=True).returncode  # 1 when outputs differ
        times.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"polygraphy_s": min(times), "rc": rc, "peak_rss_mb": peak}


def _exposed_floor(path: str, names: list[str], feed: dict) -> Callable[[], object]:
    """What ONNX Runtime alone costs to hand out ``names`` of ``path`` once, without layertap: a
    session exposing them built (the weights handed over in memory, made once before, as
    lt.compare holds them) and run on ``feed``."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    model = onnx.load(path)
    held: dict[str, object] = {}
    for init in model.graph.initializer:
        if init.ByteSize() < 1024 and init.data_location != onnx.TensorProto.EXTERNAL:
            continue  # small constants (axes, shapes) stay inline: shape inference reads them
        held[init.name] = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(numpy_helper.to_array(init)))
        for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data"):
            init.ClearField(field)
        del init.external_data[:]
        init.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", "*/in-memory/*"), ("offset", "0"), ("length", "0")):
            init.external_data.add(key=key, value=value)
    made = {t for node in model.graph.node for t in node.output} | {o.name for o in model.graph.output}
    names = [n for n in names if n in made]
    del model.graph.output[:]
    model.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in names)
    graph = model.SerializeToString()

    def floor() -> object:
        so = ort.SessionOptions()
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.add_external_initializers(list(held), list(held.values()))
        return ort.InferenceSession(graph, so, providers=["CPUExecutionProvider"]).run(names, feed)

    return floor


def _exposed(report: Any) -> list[str]:
    """The candidate tensors a compare report read (its rows'); a float16 conversion keeps the float32
    file's names, so they name the reference's tensors too (:func:`_exposed_floor` keeps a file's own)."""
    return list(dict.fromkeys(n for row in report.rows for n in (row.onnx or [])))


def child_interleaved(path: str, batch: int, size: int, rounds: int, fp16: bool) -> dict:
    """The plain runs, ONNX Runtime's floor and ``lt.compare`` in this one process, round by round
    (medians of ``rounds``).

    Without ``fp16``: one PyTorch forward plus one ORT run of ``path`` (session built before, ORT's
    defaults) beside ``lt.compare(model, x, path)``; with it, one ORT run of each file beside
    ``lt.compare(path, {"x": x}, fp16 file, metric="cosine")``. Each compare builds its own sessions.
    The floor is what the same comparison costs without layertap's own work: the plain forward (without
    ``fp16``) and, per file, a session exposing the tensors the compare read, built and run once
    (:func:`_exposed_floor`); no hooks, statistics, weight check or ideal run."""
    import statistics

    import layertap as lt

    if fp16:
        x = _np_input(batch, size)
        sessions = [_session(name, True) for name in (path, _fp16_path(path))]

        def plain() -> None:
            for sess in sessions:
                sess.run(None, {"x": x})

        def compared() -> object:
            return lt.compare(path, {"x": x}, _fp16_path(path), metric="cosine")

        names = _exposed(compared())
        floors = [_exposed_floor(name, names, {"x": x}) for name in (path, _fp16_path(path))]

        def floor() -> None:
            for f in floors:
                f()
    else:
        import torch

        model, xt = _model(), _input(batch, size)
        sess = _session(path, True)
        feed = {sess.get_inputs()[0].name: xt.numpy()}

        def plain() -> None:
            with torch.no_grad():
                model(xt)
            sess.run(None, feed)

        def compared() -> object:
            return lt.compare(model, xt, path)

        exposed = _exposed_floor(path, _exposed(compared()), feed)

        def floor() -> None:
            with torch.no_grad():
                model(xt)
            exposed()

    variants = {"plain": plain, "floor": floor, "compare": compared}
    for fn in variants.values():
        fn()  # warm: first-run allocations, imports
    report = compared()
    wall: dict[str, list[float]] = {k: [] for k in variants}
    cpu: dict[str, list[float]] = {k: [] for k in variants}
    order = list(variants)
    for r in range(rounds):
        for name in order[r % 3:] + order[:r % 3]:
            t0, c0 = time.perf_counter(), time.process_time()
            variants[name]()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    med = statistics.median
    return {"plain_s": med(wall["plain"]), "compare_s": med(wall["compare"]), "plain_cpu_s": med(cpu["plain"]),
            "compare_cpu_s": med(cpu["compare"]), "floor_s": med(wall["floor"]), "floor_cpu_s": med(cpu["floor"]),
            "rounds": rounds, "ok": getattr(report, "ok", None)}


def _print_interleaved(title: str, r: dict, goal: float) -> None:
    print(f"  {title}, interleaved in one process (medians of {r['rounds']} rounds): lt.compare "
          f"{r['compare_s'] * 1e3:.1f} ms against {r['plain_s'] * 1e3:.1f} ms -> {r['compare_s'] / r['plain_s']:.2f}x "
          f"(goal <= {goal:g}x); by this process's CPU time {r['compare_cpu_s'] / r['plain_cpu_s']:.2f}x")
    print(f"  ONNX Runtime's floor in the same rounds (the tensors the compare read exposed, each session built and "
          f"run once{', beside the plain forward' if 'PyTorch' in title else ''}): {r['floor_s'] * 1e3:.1f} ms = "
          f"{r['floor_s'] / r['plain_s']:.2f}x the plain runs; lt.compare {r['compare_s'] / r['floor_s']:.2f}x the floor "
          f"(CPU time {r['compare_cpu_s'] / r['floor_cpu_s']:.2f}x)")


def _fp16_path(path: str) -> str:
    return str(Path(path).with_name("resnet50-fp16.onnx"))


def _make_fp16(path: Path) -> None:
    import warnings

    import onnx
    from onnxconverter_common import float16

    with warnings.catch_warnings():  # one "will be truncated" line per tiny weight
        warnings.simplefilter("ignore", UserWarning)
        onnx.save(float16.convert_float_to_float16(onnx.load(str(path)), keep_io_types=True), _fp16_path(str(path)))


def _run_child(mode: str, path: Path, ns: argparse.Namespace, env: dict[str, str] | None = None) -> dict:
    cmd = [sys.executable, __file__, "--child", mode, "--onnx", str(path),
           "--batch", str(ns.batch), "--size", str(ns.size), "--repeat", str(ns.repeat), "--rounds", str(ns.rounds)]
    if ns.budget_mb:
        cmd += ["--budget-mb", str(ns.budget_mb)]
    cmd += ["--samples", str(ns.samples)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--budget-mb", type=int, default=None, help="lt.compare memory_budget in MiB (default: its 1 GiB)")
    p.add_argument("--fp16", action="store_true", help="also: float32 vs float16 file, layer by layer, and Polygraphy")
    p.add_argument("--samples", type=int, default=16, help="with --fp16: samples of the many-sample comparison (0: skip it)")
    p.add_argument("--rounds", type=int, default=0,
                   help="also time the plain runs and lt.compare interleaved in one process, medians of N rounds (0: skip)")
    p.add_argument("--first", type=int, default=5,
                   help="fresh processes timing the first lt.compare and the engines alone, medians of N (0: skip)")
    p.add_argument("--child", choices=("baseline", "compare", "fp16-baseline", "fp16-compare", "fp16-floor", "polygraphy",
                                       "fp16-samples", "interleaved", "fp16-interleaved", "first",
                                       "first-floor", "first-steps"))
    p.add_argument("--onnx")
    ns = p.parse_args()
    if ns.child:
        if ns.child == "baseline":
            result = child_baseline(ns.onnx, ns.batch, ns.size, ns.repeat)
        elif ns.child == "compare":
            result = child_compare(ns.onnx, ns.batch, ns.size, ns.repeat, ns.budget_mb)
        elif ns.child == "fp16-baseline":
            result = child_fp16_baseline(ns.onnx, ns.batch, ns.size, ns.repeat)
        elif ns.child == "fp16-floor":
            result = child_fp16_floor(ns.onnx, ns.batch, ns.size, ns.repeat)
        elif ns.child == "fp16-compare":
            result = child_fp16_compare(ns.onnx, ns.batch, ns.size, ns.repeat, ns.budget_mb)
        elif ns.child == "fp16-samples":
            result = child_fp16_samples(ns.onnx, ns.batch, ns.size, ns.repeat, ns.samples)
        elif ns.child == "first":
            result = child_first(ns.onnx, ns.batch, ns.size)
        elif ns.child == "first-floor":
            result = child_first_floor(ns.onnx, ns.batch, ns.size)
        elif ns.child == "first-steps":
            result = child_first_steps(ns.onnx, ns.batch, ns.size)
        elif ns.child in ("interleaved", "fp16-interleaved"):
            result = child_interleaved(ns.onnx, ns.batch, ns.size, ns.rounds, ns.child == "fp16-interleaved")
        else:
            result = child_polygraphy(ns.onnx, ns.batch, ns.size, ns.repeat)
        print(json.dumps(result))
        return

    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    with tempfile.TemporaryDirectory(prefix="bench-compare-") as d:
        path = Path(d) / "resnet50.onnx"
        t0 = time.perf_counter()
        torch.onnx.export(_model(), (_input(ns.batch, ns.size),), str(path), dynamo=True, input_names=["x"])
        print(f"export (not timed below): {time.perf_counter() - t0:.1f} s")
        base = _run_child("baseline", path, ns)
        cmp_ = _run_child("compare", path, ns)
        mixed = _run_child("interleaved", path, ns) if ns.rounds else None
        first = _first_calls(path, ns) if ns.first else None
        if ns.fp16:
            _make_fp16(path)
            modes = ("fp16-baseline", "fp16-floor", "fp16-compare", "polygraphy", *(("fp16-samples",) if ns.samples else ()),
                     *(("fp16-interleaved",) if ns.rounds else ()))
            fp16 = {mode: _run_child(mode, path, ns) for mode in modes}
    one = base["torch_s"] + base["ort_s"]
    one_nospin = base["torch_s"] + base["ort_nospin_s"]
    budget = f", memory_budget {ns.budget_mb} MiB" if ns.budget_mb else ""
    print(f"resnet50, input {ns.batch}x3x{ns.size}x{ns.size}, {os.cpu_count()} CPU(s), best of {ns.repeat}{budget}")
    print(f"  PyTorch forward           {base['torch_s'] * 1e3:8.1f} ms")
    print(f"  ORT run (untapped)        {base['ort_s'] * 1e3:8.1f} ms   (session build {base['ort_session_s'] * 1e3:.0f} ms, not counted);"
          f" without spinning {base['ort_nospin_s'] * 1e3:.1f} ms")
    print(f"  baseline (sum)            {one * 1e3:8.1f} ms   (without spinning {one_nospin * 1e3:.1f} ms)")
    print(f"  lt.compare                {cmp_['compare_s'] * 1e3:8.1f} ms   (first call {cmp_['compare_first_s'] * 1e3:.0f} ms)"
          f" -> {cmp_['compare_s'] / one:.2f}x baseline, {cmp_['compare_s'] / one_nospin:.2f}x the one without spinning"
          " (goal <= 2.5x)")
    print(f"  rows {cmp_['rows']} {cmp_['counts']}, ORT runs {cmp_['ort_runs']}, ok={cmp_['ok']}")
    print(f"  peak RSS: baseline {base['peak_rss_mb']:.0f} MB (model+inputs loaded {base['rss_loaded_mb']:.0f} MB), "
          f"compare {cmp_['peak_rss_mb']:.0f} MB (model+inputs loaded {cmp_['rss_loaded_mb']:.0f} MB)")
    if mixed is not None:
        _print_interleaved("one PyTorch forward + one ORT run", mixed, 2)
    if first is not None:
        _print_first(first)

    if ns.fp16:
        _print_fp16(fp16)


def _print_fp16(r: dict) -> None:
    b, c, pg = r["fp16-baseline"], r["fp16-compare"], r["polygraphy"]
    one = b["fp32_s"] + b["fp16_s"]
    one_nospin = b["fp32_nospin_s"] + b["fp16_nospin_s"]
    print("resnet50 float32 vs float16 (onnxconverter-common, keep_io_types), layer by layer")
    print(f"  ORT run fp32 + fp16       {one * 1e3:8.1f} ms   ({b['fp32_s'] * 1e3:.1f} + {b['fp16_s'] * 1e3:.1f});"
          f" without spinning {one_nospin * 1e3:.1f} ms")
    print(f"  lt.compare (cosine)       {c['compare_s'] * 1e3:8.1f} ms   -> {c['compare_s'] / one:.2f}x one run of each "
          f"({c['compare_s'] / one_nospin:.2f}x without spinning); first call in a fresh process "
          f"{c['compare_first_s'] * 1e3:.0f} ms -> {c['compare_first_s'] / one:.2f}x (goal <= 4x); "
          f"rows {c['rows']} {c['counts']}, ORT runs {c['ort_runs']}, first divergence {c['first_divergence']}")
    for way, label in (("naive", "weights serialised"), ("by_ref", "weights by reference")):
        f = r["fp16-floor"][way]
        print(f"  ORT alone, every tensor exposed, {label}: load+build+run each {f['floor_s'] * 1e3:7.1f} ms "
              f"(builds {f['builds_s'] * 1e3:.0f}, runs {f['runs_s'] * 1e3:.0f}) = {f['floor_s'] / one:.2f}x one run of "
              f"each; lt.compare is {c['compare_s'] / f['floor_s']:.2f}x that")
    print(f"  ORT sessions + one run of each {(one + b['sessions_s']) * 1e3:8.1f} ms -> lt.compare is "
          f"{c['compare_s'] / (one + b['sessions_s']):.2f}x (what a user waits for either way)")
    if "skipped" in pg:
        print(f"  polygraphy: {pg['skipped']}")
        print(f"  peak RSS: ORT runs {b['peak_rss_mb']:.0f} MB, lt.compare {c['peak_rss_mb']:.0f} MB")
    else:
        print(f"  polygraphy run x2         {pg['polygraphy_s'] * 1e3:8.1f} ms   -> {pg['polygraphy_s'] / one:.2f}x; "
              f"lt.compare is {pg['polygraphy_s'] / c['compare_s']:.2f}x faster (polygraphy exit {pg['rc']})")
        print(f"  peak RSS: ORT runs {b['peak_rss_mb']:.0f} MB, lt.compare {c['peak_rss_mb']:.0f} MB, "
              f"polygraphy {pg['peak_rss_mb']:.0f} MB (largest of its processes)")
    m = r.get("fp16-samples")
    if m:
        n = m["samples"]
        best = min(m["plain_s"], m["plain_nospin_s"], m["plain_each_s"])  # the fastest way to make the plain runs
        print(f"  {n} samples, interleaved in one process (medians): lt.compare {m['compare_s']:.2f} s; {n} plain "
              f"runs of each file, sample by sample: {m['plain_s']:.2f} s -> {m['compare_s'] / m['plain_s']:.2f}x, "
              f"without spinning {m['plain_nospin_s']:.2f} s -> {m['compare_s'] / m['plain_nospin_s']:.2f}x; "
              f"file by file (ORT's defaults) {m['plain_each_s']:.2f} s -> {m['compare_s'] / m['plain_each_s']:.2f}x")
        print(f"  against the fastest of them ({best:.2f} s): {m['compare_s'] / best:.2f}x (goal <= 2.0x); by this "
              f"process's CPU time {m['compare_cpu_s'] / m['plain_cpu_s']:.2f}x / "
              f"{m['compare_cpu_s'] / m['plain_nospin_cpu_s']:.2f}x / {m['compare_cpu_s'] / m['plain_each_cpu_s']:.2f}x")
        print(f"  one sample, a call of its own in the same rounds: lt.compare {m['one_s'] * 1e3:.0f} ms -> "
              f"{m['one_s'] / (best / n):.2f}x one plain run of each at the fastest (goal <= 4x), "
              f"{m['one_s'] / (m['plain_s'] / n):.2f}x sample by sample with ORT's defaults; each extra sample "
              f"{(m['compare_s'] - m['one_s']) / (n - 1) * 1e3:.0f} ms against {best / n * 1e3:.0f} ms for a plain "
              "run of each")
        print(f"  rows {m['rows']} {m['counts']}, ORT runs {m['ort_runs']}, first divergence {m['first_divergence']}")
    if "fp16-interleaved" in r:
        _print_interleaved("one ORT run of each file", r["fp16-interleaved"], 4)


if __name__ == "__main__":
    main()
