"""Benchmark compiled PyTorch against eager, in one process, three ways:

* plain: ``torch.compile(model)`` and its first call (what a user pays to compile at all);
* layertap: ``lt.compare(model, x, torch.compile(model))`` end to end (the candidate compiled once, its wrapper
  storing every module's buffer as it runs, the float64 reference and the eager ideal run, rows); goal <= 1.3x
  plain;
* the rival on one injected fault (a backend that scales the output of ``layer3.0.conv1``'s op by 1.05):
  torch's accuracy minifier (``TORCHDYNAMO_REPRO_AFTER=dynamo``, ``TORCHDYNAMO_REPRO_LEVEL=4``) against
  layertap's compare with the same backend: time to an answer, and what each names.

Each timed compile runs in a fresh inductor cache (``torch._inductor.utils.fresh_cache``) after
``torch._dynamo.reset()``, so no measurement reuses another's kernels.

Run:
    .venv/bin/python benchmarks/bench_compile.py [--model resnet18] [--size 64] [--rounds 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path


def fresh(fn):
    """``fn()`` timed in a fresh dynamo state and inductor cache: (seconds, result)."""
    import torch
    from torch._inductor.utils import fresh_cache

    torch._dynamo.reset()
    with fresh_cache():
        start = time.perf_counter()
        out = fn()
        return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=1)
    opts = parser.parse_args()

    import torch
    import torchvision

    import layertap as lt

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from _faults import faulty_backend as faulty  # the fault the tests inject

    torch.manual_seed(0)
    model = getattr(torchvision.models, opts.model)().eval()
    x = torch.randn(1, 3, opts.size, opts.size)

    def plain():
        with torch.no_grad():
            return torch.compile(model)(x)

    def compare():
        return lt.compare(model, x, torch.compile(model))

    def compare_warm():  # the candidate compiled and called once already, as a user's compiled model is
        compiled = torch.compile(model)
        with torch.no_grad():
            compiled(x)
        start = time.perf_counter()
        report = lt.compare(model, x, compiled)
        return time.perf_counter() - start, report

    plains, compares, warms = [], [], []
    for _ in range(opts.rounds):  # interleaved, so a busy moment weighs on all three
        plains.append(fresh(plain)[0])
        seconds, report = fresh(compare)
        compares.append(seconds)
        warms.append(fresh(compare_warm)[1][0])
    p, c, w = statistics.median(plains), statistics.median(compares), statistics.median(warms)
    print(f"{opts.model} {opts.size}x{opts.size}, {opts.rounds} round(s), medians:")
    print(f"  torch.compile + first call                  {p:8.1f} s")
    print(f"  lt.compare(model, x, compiled), cold        {c:8.1f} s   {c / p:.2f}x  (goal <= 1.3x)   ok={report.ok}, "
          f"{len(report.rows)} rows")
    print(f"  lt.compare, the candidate already called    {w:8.1f} s   {w / p:.2f}x  (the program lowered again "
          "for its buffers, every kernel from the cache; the float64 and eager runs, rows)")

    # the injected fault: layertap's compare against torch's accuracy minifier
    seconds, report = fresh(lambda: lt.compare(model, x, torch.compile(model, backend=faulty("layer3.0.conv1"))))
    print(f"  fault in layer3.0.conv1, layertap: {seconds:.1f} s, first divergence {report.first_divergence}")
    print(f"  minifier: {minifier(model, x)}")


def minifier(model, x) -> str:
    """torch's accuracy minifier on the faulty backend: the time to its verdict and what it names."""
    import torch
    from torch._dynamo.backends.registry import register_backend

    from _faults import faulty_backend

    register_backend(name="layertap_bench_faulty", compiler_fn=faulty_backend("layer3.0.conv1"))
    config = torch._dynamo.config
    saved = (config.repro_after, config.repro_level)
    with tempfile.TemporaryDirectory() as folder:
        config.repro_after, config.repro_level = "dynamo", 4
        torch._dynamo.reset()
        start = time.perf_counter()
        try:
            with torch.no_grad(), _debug_dir(folder):
                torch.compile(model, backend="layertap_bench_faulty")(x)
            verdict = "no accuracy error found"
        except Exception as e:  # noqa: BLE001 - its verdict is an exception
            verdict = f"{type(e).__name__}: {str(e).splitlines()[1] if len(str(e).splitlines()) > 1 else e}"
        finally:
            config.repro_after, config.repro_level = saved
        seconds = time.perf_counter() - start
        scripts = [p.relative_to(folder) for p in Path(folder).rglob("minifier_launcher.py")]
    names = (f"the whole dynamo graph, and a launcher script ({scripts[0].name}) to run to shrink it; no module"
             if scripts else "no script")
    return f"{seconds:.1f} s to '{verdict}': names {names}"


class _debug_dir:
    """torch's debug folder (where the minifier writes) pointed into a temporary folder for the block."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def __enter__(self) -> None:
        import torch

        self.saved = torch._dynamo.config.debug_dir_root
        torch._dynamo.config.debug_dir_root = self.folder

    def __exit__(self, *exc: object) -> None:
        import torch

        torch._dynamo.config.debug_dir_root = self.saved


if __name__ == "__main__":
    main()
