"""ExecuTorch's own ``tap_compare`` beside ``layertap compare MODEL m.pte``, in one process, on one model.

Both run the model through ``torch.export`` -> ``to_edge_transform_and_lower(XnnpackPartitioner)`` ->
ExecuTorch's runtime, and both tap through the delegate. Printed for each: wall time, rows compared, and,
with one module broken in the lowered program (its weight scaled by 1.05 on the way into the lowering,
as a faulty toolchain would write it), the module each names first.

``tap_compare`` reports per-node statistics (min/max/mean/abs-max... ahead of time vs at runtime) keyed by
ATen node and module path; its "first divergent module" here is the first row whose statistics differ by
more than ``--rtol`` of their magnitude. layertap compares whole tensors per module call, with a verdict.

    python benchmarks/bench_executorch.py                 # resnet18 at 64x64
    python benchmarks/bench_executorch.py --model mobilenet_v3_small --size 96 --fault features.3.block.0.0
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import tempfile
import time
from typing import Any, Iterator

import torch
import torchvision

import layertap as lt


@contextlib.contextmanager
def broken_lowering(weight_suffix: str | None) -> Iterator[None]:
    """Every lowering inside the block writes the weight ending in ``weight_suffix`` 1.05x too large."""
    import executorch.exir as exir

    if weight_suffix is None:
        yield
        return
    real = exir.to_edge_transform_and_lower

    def broken(program: Any, **kwargs: Any) -> Any:
        for table in (program.state_dict, program.constants):
            for name in [n for n in table if n.endswith(weight_suffix)]:
                value = table[name] * 1.05  # a new tensor: the eager model keeps its own
                table[name] = torch.nn.Parameter(value, requires_grad=False) \
                    if isinstance(table[name], torch.nn.Parameter) else value
        return real(program, **kwargs)

    exir.to_edge_transform_and_lower = broken
    try:
        yield
    finally:
        exir.to_edge_transform_and_lower = real


def first_in_stats(df: Any, rtol: float) -> str | None:
    """The module path of the first tap_compare row whose runtime statistics leave the AOT ones."""
    fields = [c[4:] for c in df.columns if c.startswith("aot_") and f"rt_{c[4:]}" in df.columns]
    for _, row in df.iterrows():
        for f in fields:
            a, r = float(row[f"aot_{f}"]), float(row[f"rt_{f}"])
            if math.isfinite(a) and abs(a - r) > rtol * max(abs(a), 1e-6):
                return str(row["module_path"] or row["node_name"])
    return None


def run(model: torch.nn.Module, x: torch.Tensor, fault: str | None, rtol: float, folder: str) -> dict[str, Any]:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.devtools.intermediate_output_tap import tap_compare

    suffix = f"{fault}.weight" if fault else None
    with broken_lowering(suffix):
        t = time.perf_counter()
        df, _ = tap_compare(model, (x,), partitioner=[XnnpackPartitioner()])
        et_s = time.perf_counter() - t
        path = os.path.join(folder, f"m{'-fault' if fault else ''}.pte")
        t = time.perf_counter()
        lt.export(model, x, path, verify=False)
        export_s = time.perf_counter() - t
        t = time.perf_counter()
        report = lt.compare(model, x, path)
        lt_s = time.perf_counter() - t
    compared = [r for r in report.rows if r.ok is not None]
    return {"tap_compare_s": et_s, "tap_compare_rows": len(df), "tap_compare_first": first_in_stats(df, rtol),
            "layertap_export_s": export_s, "layertap_compare_s": lt_s, "layertap_rows": len(compared),
            "layertap_first": report.first_divergence, "layertap_ok": report.ok}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet18", help="a torchvision model name")
    p.add_argument("--size", type=int, default=64, help="input height and width")
    p.add_argument("--fault", default="layer2.0.conv1", help="the module whose weight the faulty lowering scales")
    p.add_argument("--rtol", type=float, default=1e-3, help="tap_compare: a statistic this far off diverges")
    a = p.parse_args()
    torch.manual_seed(0)
    model = getattr(torchvision.models, a.model)().eval()
    x = torch.randn(1, 3, a.size, a.size)
    with tempfile.TemporaryDirectory() as folder:
        for fault in (None, a.fault):
            r = run(model, x, fault, a.rtol, folder)
            what = f"fault at {fault}" if fault else "faithful"
            print(f"{a.model} {a.size}x{a.size}, {what}:")
            print(f"  tap_compare     {r['tap_compare_s']:6.1f} s  {r['tap_compare_rows']:4d} node rows   "
                  f"first divergent: {r['tap_compare_first']}")
            print(f"  layertap        {r['layertap_compare_s']:6.1f} s  {r['layertap_rows']:4d} module rows "
                  f"first divergent: {r['layertap_first']} (ok={r['layertap_ok']}; export {r['layertap_export_s']:.1f} s)")
            print(f"  time ratio layertap/tap_compare {r['layertap_compare_s'] / r['tap_compare_s']:.2f} "
                  f"(with its export {(r['layertap_compare_s'] + r['layertap_export_s']) / r['tap_compare_s']:.2f})")


if __name__ == "__main__":
    main()
