"""Cost of taps during ``generate`` on random Llamas (CPU): layertap vs plain generate vs nnsight.

11 taps (embeddings, each decoder layer, its attention, MLP and post-attention norm, the final
norm, lm_head) are captured at every step (the prefill, then one call per decode step) by
``lt.extract(model, ids, taps=..., method="generate")`` and, side by side, by nnsight's
``model.generate`` trace saving the same module outputs at every step (``tracer.iter[:]``).
Both must equal each other. The figures are the process's CPU time (what the work costs; on a
shared machine, wall time mostly measures the other processes), medians over rounds interleaved
so that load hits every variant alike, after warm-up, under torch.no_grad(), one torch thread
unless --threads says otherwise.

Models: tiny (hidden 64, 2 layers, GQA 4/2, vocabulary 256) and small (hidden 256, 4 layers,
GQA 8/4, vocabulary 1024); a 16-token prompt, 16 new tokens (min_new_tokens pins the count).

Goal: 11 taps during generate / plain generate <= 1.10x (small model).

Run: .venv/bin/python benchmarks/bench_llm_taps.py [--rounds N] [--threads T] [--no-nnsight]
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from typing import Callable

import torch

import layertap as lt
from bench_llm import SIZES  # a sibling script: benchmarks/ is on sys.path when run as a script
from layertap.selectors import Tap

MODELS = SIZES  # the same random Llamas as bench_llm.py
NEW_TOKENS = 16
GOAL = 1.10


def eleven_taps(layers: int) -> list[str]:
    """The 11 modules tapped, in the order they run (nnsight reads them in that order): embeddings,
    the first and last decoder layers with their attention, post-attention norm and MLP, final norm, lm_head."""
    first, last = 0, layers - 1
    per_layer = [f"model.layers.{n}{part}" for n in (first, last)
                 for part in (".self_attn[0]", ".post_attention_layernorm", ".mlp", "")]
    return ["model.embed_tokens", *per_layer, "model.norm", "lm_head"]


def build(name: str) -> tuple[torch.nn.Module, torch.Tensor]:
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**MODELS[name])
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(1))
    return model, ids


def nnsight_runner(model: torch.nn.Module, ids: torch.Tensor, taps: list[str]) -> Callable[[], list]:
    """nnsight's per-step saving of the same modules during generate; returns [step][tap] tensors."""
    from nnsight.modeling.transformers import TransformersModel
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(model.config.vocab_size)}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0")),
                                  pad_token="t0", eos_token="t1")
    wrapped = TransformersModel(model, tokenizer=tok)

    def envoy(path: str):
        node = wrapped
        for part in Tap.parse(path).path.split("."):
            node = node[int(part)] if part.isdigit() else getattr(node, part)
        return node

    def run() -> list:
        with wrapped.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False) as tracer:
            steps = list().save()
            for _ in tracer.iter[:NEW_TOKENS]:
                steps.append([envoy(t).output for t in taps])
        return steps

    return run


def check_equal(tapped: dict, steps: list, taps: list[str]) -> None:
    for k, values in enumerate(steps):
        for tap, value in zip(taps, values):
            mine = tapped[Tap.parse(tap).name_for_call(k)]
            value = value[0] if isinstance(value, tuple) else value
            assert torch.equal(mine, value), f"{tap}#{k}: layertap and nnsight differ"


def measure(name: str, rounds: int, warmup: int, with_nnsight: bool) -> dict[str, float]:
    model, ids = build(name)
    taps = eleven_taps(model.config.num_hidden_layers)
    kw = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)

    def plain():
        with torch.no_grad():
            model.generate(ids, **kw)

    def layertap():
        return lt.extract(model, ids, taps=taps, method="generate", **kw)

    variants: dict[str, Callable[[], object]] = {"plain generate": plain, "layertap 11 taps": layertap}
    if with_nnsight:
        try:
            nns = nnsight_runner(model, ids, taps)
        except ImportError as e:
            raise SystemExit(f"nnsight is not installed ({e}); pip install nnsight, or run with --no-nnsight") from None
        check_equal(layertap(), nns(), taps)
        variants["nnsight 11 saves"] = nns
    for _ in range(warmup):
        for fn in variants.values():
            fn()
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(rounds):
        for label, fn in variants.items():
            t0 = time.process_time()
            fn()
            times[label].append(time.process_time() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    ap.add_argument("--no-nnsight", action="store_true", help="leave nnsight out")
    ns = ap.parse_args()
    if ns.threads:
        torch.set_num_threads(ns.threads)
    warnings.filterwarnings("ignore")
    ok = True
    for name in MODELS:
        med = measure(name, ns.rounds, ns.warmup, not ns.no_nnsight)
        base = med["plain generate"]
        print(f"{name} Llama, CPU, {torch.get_num_threads()} threads, {NEW_TOKENS} new tokens, "
              f"median of {ns.rounds} rounds:")
        for label, t in med.items():
            print(f"  {label:20s} {t * 1e3:8.1f} ms CPU  {t / base:5.2f}x")
        if name == "small":
            ratio = med["layertap 11 taps"] / base
            ok = ratio <= GOAL
            print(f"  11 taps / plain generate {ratio:5.3f}x (goal <= {GOAL:.2f}x: {'met' if ok else 'MISSED'})")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
