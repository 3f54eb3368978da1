"""Benchmarks of layertap on decoder LLMs (random Llama weights, seed 0; no download).

``steps``: ``lt.compare(model, prompt, file, steps=16)`` against 16 plain decode steps of each side
(PyTorch with its ``DynamicCache``, ONNX Runtime fed its own ``present.*``), on a file written by
``lt.export(..., kv_cache=True)``. Goal: compare <= 4x the two plain loops together. Run::

    .venv/bin/python benchmarks/bench_llm.py steps [--size tiny|small|both] [--steps 16] [--repeat 3]

Sizes: tiny (hidden 64, 2 layers, 4/2 heads, vocabulary 256) and small (hidden 256, 4 layers,
8/4 heads, vocabulary 1024); a 16-token prompt.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

SIZES = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=256, max_position_embeddings=128),
    "small": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=4, vocab_size=1024, max_position_embeddings=256),
}
PROMPT = 16


def llama(size: str):
    """A random-weight ``LlamaForCausalLM`` of the given size (seed 0), eval mode."""
    import torch
    import transformers

    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**SIZES[size])).eval()


def plain_torch(model, ids, steps: int) -> None:
    """Prefill and ``steps`` greedy decode steps with a ``DynamicCache``, no hooks."""
    import torch
    import transformers

    cache = transformers.DynamicCache(config=model.config)
    tokens = ids
    with torch.no_grad():
        for _ in range(steps + 1):
            logits = model(input_ids=tokens, past_key_values=cache, use_cache=True).logits
            tokens = logits[:, -1:].argmax(-1)


def plain_ort(path: Path, ids, model, steps: int) -> None:
    """Prefill from an empty past and ``steps`` greedy decode steps in ONNX Runtime, presents fed back."""
    import numpy as np
    import onnxruntime as ort

    cfg = model.config
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    size = cfg.hidden_size // cfg.num_attention_heads
    past = {i.name: np.zeros((1, cfg.num_key_value_heads, 0, size), np.float32)
            for i in sess.get_inputs() if i.name.startswith("past_key_values")}
    tokens, length = ids.numpy(), 0
    for _ in range(steps + 1):
        length += tokens.shape[1]
        out = dict(zip(names, sess.run(None, {"input_ids": tokens, "attention_mask": np.ones((1, length), np.int64),
                                              **past})))
        past = {k: out[k.replace("past_key_values", "present")] for k in past}
        tokens = out["logits"][:, -1:].argmax(-1).astype(np.int64)


def _best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def bench_steps(size: str, steps: int, repeat: int) -> dict:
    """``compare(steps=N)`` time vs the two plain decode loops, best of ``repeat``."""
    import torch

    import layertap as lt

    model = llama(size)
    ids = torch.randint(0, model.config.vocab_size, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"llama_{size}.onnx"
        lt.export(model, ids[:, :5], path, export_options=lt.ExportOptions(kv_cache=True))
        torch_s = _best(lambda: plain_torch(model, ids, steps), repeat)
        ort_s = _best(lambda: plain_ort(path, ids, model, steps), repeat)
        report = None

        def run_compare() -> None:
            nonlocal report
            report = lt.compare(model, ids, path, sample_options=lt.SampleOptions(steps=steps))

        compare_s = _best(run_compare, repeat)
    assert report is not None and report.ok, "the exported file should agree with PyTorch"
    plain = torch_s + ort_s
    return {"size": size, "steps": steps, "prompt": PROMPT, "torch_s": round(torch_s, 4), "ort_s": round(ort_s, 4),
            "compare_s": round(compare_s, 4), "ratio": round(compare_s / plain, 2), "rows": len(report.rows),
            "goal": "<= 4x"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("steps", help="compare --steps N vs plain decode loops of both sides")
    p.add_argument("--size", choices=("tiny", "small", "both"), default="both")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--repeat", type=int, default=3)
    ns = parser.parse_args()
    if ns.what == "steps":
        for size in ("tiny", "small") if ns.size == "both" else (ns.size,):
            print(json.dumps(bench_steps(size, ns.steps, ns.repeat)))


if __name__ == "__main__":
    main()
