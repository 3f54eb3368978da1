"""A tiny random Llama and the decoder files LLM engineers compare it with, built once per test session.

Files (all from the same weights, seed 0):

- ``llama_folder``: ``save_pretrained`` folder plus a ``tokenizer.json`` (a WordLevel vocabulary over
  the ids, made with the ``tokenizers`` library; no download), as ONNX Runtime GenAI's builder needs;
- ``llama_genai_fp32`` / ``llama_genai_int4``: ``model.onnx`` written by
  ``python -m onnxruntime_genai.models.builder -p fp32|int4 -e cpu`` (GroupQueryAttention,
  SkipSimplifiedLayerNormalization, MatMulNBits; inputs ``past_key_values.N.key/value``);
- ``llama_dynamo_cache``: ``torch.onnx.export(dynamo=True)`` with a ``DynamicCache`` (inputs
  ``past_key_values_0..3``, layer-major key/value; every axis symbolic, an empty past runs).

The fixtures are imported into ``conftest.py``; the plain functions serve tests that need a
second model or folder.
"""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest

LLAMA = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=256, max_position_embeddings=128)


def tiny_llama_config(**overrides):
    """The tiny Llama's config: hidden 64, 2 layers, 4 query heads over 2 KV heads, vocabulary 256."""
    import transformers

    return transformers.LlamaConfig(**{**LLAMA, **overrides})


def tiny_llama(**overrides):
    """A ``LlamaForCausalLM`` with random weights (seed 0), eval mode.

    Usable as a MODEL spec: ``tests/_llm.py:tiny_llama``.
    """
    import torch
    import transformers

    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(tiny_llama_config(**overrides)).eval()


def prompt_ids(length: int = 7, seed: int = 1):
    """A 1 x ``length`` int64 prompt of token ids below the tiny vocabulary."""
    import torch

    return torch.randint(0, LLAMA["vocab_size"], (1, length), generator=torch.Generator().manual_seed(seed))


def save_llama_folder(model, folder: Path) -> Path:
    """``model.save_pretrained(folder)`` plus a WordLevel ``tokenizer.json`` over its ids."""
    from tokenizers import Tokenizer, models

    model.save_pretrained(folder)
    vocab = {f"t{i}": i for i in range(model.config.vocab_size)}
    Tokenizer(models.WordLevel(vocab, unk_token="t0")).save(str(folder / "tokenizer.json"))
    return folder


def build_genai(folder: Path, out: Path, precision: str) -> Path:
    """Run ONNX Runtime GenAI's model builder on ``folder`` (``fp32`` or ``int4``, CPU); the ``model.onnx`` path."""
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(folder), "-o", str(out),
           "-p", precision, "-e", "cpu"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0 or not (out / "model.onnx").exists():
        raise RuntimeError(f"the GenAI builder failed ({done.returncode}): {done.stderr[-2000:]}")
    return out / "model.onnx"


def export_dynamo_cache(model, path: Path, past: int = 4, new: int = 3) -> Path:
    """``torch.onnx.export(dynamo=True)`` of ``model(input_ids, attention_mask, past_key_values=DynamicCache)``.

    Every axis is symbolic (transformers' automatic dynamic shapes), so the file runs with any prompt
    length and an empty past.
    """
    import torch
    import transformers
    from transformers.exporters.exporter_dynamo import get_auto_dynamic_shapes, register_cache_pytrees_for_model

    register_cache_pytrees_for_model(model)
    with torch.no_grad():
        cache = model(prompt_ids(past, seed=2), cache=transformers.DynamicCache(config=model.config),
                      use_cache=True).past_key_values
    kwargs = dict(input_ids=prompt_ids(new, seed=3), attention_mask=torch.ones(1, past + new, dtype=torch.long),
                  past_key_values=cache, use_cache=True)
    with warnings.catch_warnings():  # the keyword stays past_key_values: it names the file's inputs
        warnings.filterwarnings("ignore", "`past_key_values` is deprecated", FutureWarning)
        torch.onnx.export(model, (), kwargs=kwargs, f=str(path), dynamo=True,
                          dynamic_shapes=get_auto_dynamic_shapes(kwargs), verbose=False)
    return path


@pytest.fixture(scope="session")
def llama():
    """The tiny random Llama (seed 0), shared by every LLM test: do not change its weights."""
    return tiny_llama()


@pytest.fixture(scope="session")
def llama_folder(llama, tmp_path_factory) -> Path:
    """The tiny Llama saved as a transformers folder with a ``tokenizer.json``."""
    return save_llama_folder(llama, tmp_path_factory.mktemp("llama_hf"))


@pytest.fixture(scope="session")
def llama_genai_fp32(llama_folder, tmp_path_factory) -> Path:
    """``model.onnx`` from ONNX Runtime GenAI's builder, fp32 CPU."""
    return build_genai(llama_folder, tmp_path_factory.mktemp("llama_genai_fp32"), "fp32")


@pytest.fixture(scope="session")
def llama_genai_int4(llama_folder, tmp_path_factory) -> Path:
    """``model.onnx`` from ONNX Runtime GenAI's builder, int4 CPU (MatMulNBits)."""
    return build_genai(llama_folder, tmp_path_factory.mktemp("llama_genai_int4"), "int4")


@pytest.fixture(scope="session")
def llama_dynamo_cache(llama, tmp_path_factory) -> Path:
    """The tiny Llama exported by ``torch.onnx.export(dynamo=True)`` with a ``DynamicCache`` past."""
    return export_dynamo_cache(llama, tmp_path_factory.mktemp("llama_dyn") / "llama.onnx")
