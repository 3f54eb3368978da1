"""Cost of taps and of stop_early on torchvision resnet50 (CPU, batch 4).

Measured side by side in one process, interleaved round by round so that
load from other processes hits every variant alike; each figure is the
median over rounds, after warm-up, all under torch.no_grad().

Goals:
  10 taps / plain forward                       <= 1.05x
  stop_early at layer2 / plain forward          <= 0.55x
  stop_early at layer2 / create_feature_extractor pruned to layer2  <= 1.15x

Run: .venv/bin/python benchmarks/bench_taps.py [--rounds N] [--threads T]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch
import torchvision
from torchvision.models.feature_extraction import create_feature_extractor

import layertap as lt

TEN_TAPS = [
    "relu", "layer1", "layer1.0.conv1", "layer2.0.relu#1", "layer2", "layer3.2",
    "layer3", "layer4.0.conv3", "layer4", "fc:input",
]


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ns = ap.parse_args()
    if ns.threads:
        torch.set_num_threads(ns.threads)
    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None).eval()
    x = torch.randn(4, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    pruned = create_feature_extractor(model, return_nodes={"layer2": "layer2"}).eval()

    # correctness first: every variant must agree
    with torch.no_grad():
        ref_l2 = pruned(x)["layer2"]
    early = lt.extract(model, x, taps=["layer2"], stop_early=True)
    assert list(early) == ["layer2"] and torch.allclose(early["layer2"], ref_l2, atol=1e-5)
    tapped = lt.extract(model, x, taps=TEN_TAPS)
    assert len(tapped) == len(TEN_TAPS) + 1

    def plain():
        with torch.no_grad():
            model(x)

    def ten_taps():
        lt.extract(model, x, taps=TEN_TAPS)  # runs under no_grad itself

    def stop_early():
        lt.extract(model, x, taps=["layer2"], stop_early=True)

    def feature_extractor():
        with torch.no_grad():
            pruned(x)

    variants = {"plain forward": plain, "10 taps": ten_taps, "stop_early layer2": stop_early,
                "create_feature_extractor layer2": feature_extractor}
    for _ in range(ns.warmup):
        for fn in variants.values():
            fn()
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(ns.rounds):
        for name, fn in variants.items():
            times[name].append(timed(fn))
    med = {k: statistics.median(v) for k, v in times.items()}

    print(f"torchvision resnet50, CPU, batch 4, {torch.get_num_threads()} threads, "
          f"median of {ns.rounds} rounds (ms):")
    for name, t in med.items():
        print(f"  {name:34s} {t * 1e3:8.1f}")
    rows = [
        ("10 taps / plain forward", med["10 taps"] / med["plain forward"], 1.05),
        ("stop_early layer2 / plain forward", med["stop_early layer2"] / med["plain forward"], 0.55),
        ("stop_early layer2 / create_feature_extractor", med["stop_early layer2"] / med["create_feature_extractor layer2"], 1.15),
    ]
    ok = True
    print("ratios:")
    for label, ratio, goal in rows:
        passed = ratio <= goal
        ok &= passed
        print(f"  {label:46s} {ratio:5.3f}x  (goal <= {goal:.2f}x: {'met' if passed else 'MISSED'})")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
