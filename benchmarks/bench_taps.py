"""Cost of taps and of stop_early on torchvision resnet50 (CPU, batch 4), beside the rivals.

Measured side by side in one process, interleaved round by round (each round
starting one variant later) so that load from other processes hits every
variant alike; each figure is the median over rounds, after warm-up, all under
torch.no_grad(), in wall time and in this process's CPU time (on a shared
machine the CPU time shows the work each variant itself does). Every variant's
values are checked equal to layertap's before anything is timed.

Goals:
  10 taps / plain forward                       <= 1.05x
  stop_early at layer2 / plain forward          <= 0.55x
  stop_early at layer2 / create_feature_extractor pruned to layer2  <= 1.15x

Beside them, the floor of any early stop: the modules up to layer2 called by hand, one after
the other (the stem, layer1, layer2), against the plain forward and against stop_early.

Rivals (the ``bench`` extra; each skipped with a line when not installed):
  torchlens 2.x   ``trace(model, x, save=tl.module(a) | tl.module(b) | ...)`` with the
                  same module taps, saving everything (its default), and its
                  ``halt=`` early stop at layer2 against ``stop_early``;
  nnsight         on a small transformers GPT-2 (random weights), every block's
                  hidden states saved (``model.h[i].output.save()`` in ``trace``)
                  against ``lt.extract(model, ids, taps=["h.0", ...])``.

Run: .venv/bin/python benchmarks/bench_taps.py [--rounds N] [--threads T] [--no-rivals]
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib.util
import operator
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
# the module outputs of TEN_TAPS (torchlens saves module outputs; the model output is fc's)
MODULE_TAPS = [t for t in TEN_TAPS if ":" not in t]
# torchlens saves what a selector names: the same modules, and fc for the model output layertap returns anyway
TORCHLENS_MODULES = [*dict.fromkeys(t.split("#")[0] for t in MODULE_TAPS), "fc"]

Variants = dict[str, Callable[[], object]]


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """Wall seconds and this process's CPU seconds (all its threads) of one call."""
    gc.collect()  # a rival's garbage (torchlens traces hold cycles) is not collected on the next variant's clock
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def interleaved(variants: Variants, rounds: int, warmup: int) -> tuple[dict[str, float], dict[str, float]]:
    """Median wall and CPU seconds of each variant; each round runs every variant once, starting
    one variant later than the round before (no variant always follows the same one)."""
    for _ in range(warmup):
        for fn in variants.values():
            fn()
    names = list(variants)
    wall: dict[str, list[float]] = {k: [] for k in names}
    cpu: dict[str, list[float]] = {k: [] for k in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            w, c = timed(variants[name])
            wall[name].append(w)
            cpu[name].append(c)
    return ({k: statistics.median(v) for k, v in wall.items()}, {k: statistics.median(v) for k, v in cpu.items()})


def show(title: str, wall: dict[str, float], cpu: dict[str, float]) -> None:
    print(f"{title} (ms):")
    print(f"  {'':34s} {'wall':>8s} {'CPU':>8s}")
    for name in wall:
        print(f"  {name:34s} {wall[name] * 1e3:8.1f} {cpu[name] * 1e3:8.1f}")


Row = tuple[str, float, float, "float | None"]  # label, wall ratio, CPU ratio, goal


def ratio(label: str, wall: dict[str, float], cpu: dict[str, float], a: str, b: str, goal: float | None = None) -> Row:
    return label, wall[a] / wall[b], cpu[a] / cpu[b], goal


def have(package: str) -> bool:
    if importlib.util.find_spec(package) is None:
        print(f"{package}: not installed, its rows are skipped (pip install -e '.[bench]')")
        return False
    return True


def same(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    if not torch.allclose(a, b, atol=1e-5, rtol=1e-5):
        raise SystemExit(f"{what}: values differ from layertap's")


def torchlens_variants(model: torch.nn.Module, x: torch.Tensor, tapped: dict) -> Variants:
    """torchlens's module taps, save-everything and halt=, each checked against layertap's values."""
    import torchlens as tl

    def module_taps():
        with torch.no_grad():
            return tl.trace(model, x, save=functools.reduce(operator.or_, [tl.module(m) for m in TORCHLENS_MODULES]))

    def save_all():
        with torch.no_grad():
            return tl.trace(model, x)  # torchlens's default: every operation's output saved

    def halt_layer2():
        with torch.no_grad():
            return tl.trace(model, x, save=tl.module("layer2"), halt=tl.module("layer2"))

    trace = module_taps()
    for tap in MODULE_TAPS:
        path, _, call = tap.partition("#")
        same(trace.modules[path].calls[int(call or 0)].out, tapped[tap], f"torchlens {tap}")
    same(trace.modules["fc"].out, tapped["output"], "torchlens fc")
    same(save_all().modules["layer3.2"].out, tapped["layer3.2"], "torchlens saving everything: layer3.2")
    early = halt_layer2()
    assert early.halted
    same(early.modules["layer2"].out, tapped["layer2"], "torchlens halt= layer2")
    return {"torchlens module taps": module_taps, "torchlens save all": save_all, "torchlens halt= layer2": halt_layer2}


def resnet50_rows(ns: argparse.Namespace, rivals: bool) -> list[Row]:
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

    def by_hand():  # the floor of any early stop: the modules up to layer2 called one after the other
        with torch.no_grad():
            y = model.maxpool(model.relu(model.bn1(model.conv1(x))))
            return model.layer2(model.layer1(y))

    with torch.no_grad():
        same(by_hand(), ref_l2, "layer2 by hand")
    variants: Variants = {
        "plain forward": plain,
        "layer2 by hand": by_hand,
        "10 taps": lambda: lt.extract(model, x, taps=TEN_TAPS),  # runs under no_grad itself
        "9 module taps": lambda: lt.extract(model, x, taps=MODULE_TAPS),
        "stop_early layer2": lambda: lt.extract(model, x, taps=["layer2"], stop_early=True),
        "create_feature_extractor layer2": lambda: pruned(x),
    }
    if rivals and have("torchlens"):
        variants.update(torchlens_variants(model, x, tapped))
    with torch.no_grad():
        wall, cpu = interleaved(variants, ns.rounds, ns.warmup)
    show(f"torchvision resnet50, CPU, batch 4, {torch.get_num_threads()} threads, "
         f"median of {ns.rounds} interleaved rounds", wall, cpu)
    rows = [
        ratio("10 taps / plain forward", wall, cpu, "10 taps", "plain forward", 1.05),
        ratio("stop_early layer2 / plain forward", wall, cpu, "stop_early layer2", "plain forward", 0.55),
        ratio("stop_early layer2 / create_feature_extractor", wall, cpu, "stop_early layer2", "create_feature_extractor layer2", 1.15),
        ratio("layer2 by hand / plain forward (the floor)", wall, cpu, "layer2 by hand", "plain forward"),
        ratio("stop_early layer2 / layer2 by hand", wall, cpu, "stop_early layer2", "layer2 by hand"),
    ]
    if "torchlens module taps" in wall:
        rows += [
            ratio("torchlens module taps / plain forward", wall, cpu, "torchlens module taps", "plain forward"),
            ratio("torchlens save all / plain forward", wall, cpu, "torchlens save all", "plain forward"),
            ratio("torchlens module taps / layertap 9 module taps", wall, cpu, "torchlens module taps", "9 module taps"),
            ratio("torchlens halt= layer2 / stop_early layer2", wall, cpu, "torchlens halt= layer2", "stop_early layer2"),
        ]
    return rows


def gpt2_rows(ns: argparse.Namespace) -> list[Row]:
    """nnsight against layertap: a small GPT-2 (random weights), every block's hidden states."""
    import transformers
    from nnsight import NNsight

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=6, n_embd=256, n_head=4, vocab_size=1000, n_positions=128,
                                     bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2Model(config).eval()
    ids = torch.randint(0, 1000, (2, 128), generator=torch.Generator().manual_seed(0))
    taps = [f"h.{i}" for i in range(config.n_layer)]
    wrapped = NNsight(model)

    def nnsight_saved() -> list:
        saved: list = []
        with torch.no_grad(), wrapped.trace(ids):
            for i in range(config.n_layer):
                saved.append(wrapped.h[i].output.save())
        return saved

    def plain():
        with torch.no_grad():
            model(ids)

    tapped = lt.extract(model, ids, taps=taps)
    for tap, value in zip(taps, nnsight_saved()):
        same(value, tapped[tap], f"nnsight {tap}")
    wall, cpu = interleaved({"plain forward": plain, "layertap": lambda: lt.extract(model, ids, taps=taps),
                             "nnsight": nnsight_saved}, ns.rounds, ns.warmup)
    show(f"transformers GPT2Model ({config.n_layer} layers, 256 wide), ids 2x128, hidden states of every block, "
         f"median of {ns.rounds} interleaved rounds", wall, cpu)
    return [ratio("layertap GPT-2 blocks / plain forward", wall, cpu, "layertap", "plain forward"),
            ratio("nnsight GPT-2 blocks / plain forward", wall, cpu, "nnsight", "plain forward"),
            ratio("nnsight / layertap", wall, cpu, "nnsight", "layertap")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--no-rivals", action="store_true", help="layertap and the plain forward only")
    ns = ap.parse_args()
    if ns.threads:
        torch.set_num_threads(ns.threads)
    rows = resnet50_rows(ns, rivals=not ns.no_rivals)
    if not ns.no_rivals and have("nnsight") and have("transformers"):
        rows += gpt2_rows(ns)
    ok = True
    print(f"ratios:{'':43s} {'wall':>7s} {'CPU':>7s}  (goals on wall time)")
    for label, by_wall, by_cpu, goal in rows:
        passed = goal is None or by_wall <= goal
        ok &= passed
        verdict = "" if goal is None else f"  (goal <= {goal:.2f}x: {'met' if passed else 'MISSED'})"
        print(f"  {label:48s} {by_wall:6.3f}x {by_cpu:6.3f}x{verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
