"""A tiny random Llama for the LLM examples (``layertap ... examples/my_llama.py:model``).

``model()`` builds a ``LlamaForCausalLM`` from a transformers config (hidden 64, 2 layers, 4 query
heads over 2 KV heads, vocabulary 256) with seeded random weights: nothing is downloaded.

    python examples/my_llama.py my-llama    # save_pretrained folder + tokenizer.json, as ONNX Runtime GenAI's builder reads it
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import transformers

CONFIG = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=256, max_position_embeddings=128)


def model() -> transformers.LlamaForCausalLM:
    """The tiny Llama, random weights (seed 0), eval mode."""
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).eval()


def save(folder: Path) -> None:
    """``save_pretrained`` plus a WordLevel ``tokenizer.json`` over the ids (the GenAI builder wants one)."""
    from tokenizers import Tokenizer, models

    llama = model()
    llama.save_pretrained(folder)
    vocab = {f"t{i}": i for i in range(llama.config.vocab_size)}
    Tokenizer(models.WordLevel(vocab, unk_token="t0")).save(str(folder / "tokenizer.json"))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="save the tiny random Llama as a transformers folder")
    p.add_argument("folder", type=Path)
    save(p.parse_args().folder)
