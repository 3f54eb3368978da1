"""Decoder files with a KV cache: prefill feeds, a past given as a Cache, decode steps, cache exports.

Files come from the real tools (ONNX Runtime GenAI's builder, torch.onnx with a DynamicCache,
lt.export), built once per session from the tiny random Llama (tests/_llm.py).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import layertap as lt  # noqa: E402
from _llm import prompt_ids, tiny_llama  # noqa: E402
from layertap.errors import LayertapError  # noqa: E402


def _logits(model, ids, **kwargs):
    with torch.no_grad():
        return model(ids, **kwargs).logits.numpy()


def test_run_builder_file_makes_prefill_feeds(llama, llama_genai_fp32):
    ids = prompt_ids(7)
    notes: list[str] = []
    out = lt.run(llama_genai_fp32, {"input_ids": ids.numpy()}, notify=notes.append)
    assert out["present.0.key"].shape == (1, 2, 7, 16)  # KV heads 2, head size 16 from genai_config.json
    np.testing.assert_allclose(out["logits"], _logits(llama, ids), atol=1e-5)
    assert notes == ["prefill: empty past (past_key_values.*: 1x2x0x16 float32), attention_mask ones 1x7"]


def test_compare_dynamo_cache_file_passes_every_module(llama, llama_dynamo_cache):
    report = lt.compare(llama, prompt_ids(7), llama_dynamo_cache)
    assert report.ok
    compared = {r.name for r in report.rows if r.status == "pass"}
    assert {"model.layers.0", "model.layers.1.self_attn", "model.norm", "output"} <= compared


def test_compare_builder_fp32_file_passes(llama, llama_genai_fp32):
    report = lt.compare(llama, prompt_ids(7), llama_genai_fp32)
    assert report.ok and report.first_divergence is None
    assert any(r.name == "output" and r.status == "pass" for r in report.rows)


def test_compare_builder_int4_file_diverges(llama, llama_genai_int4):
    report = lt.compare(llama, prompt_ids(7), llama_genai_int4)
    assert not report.ok and report.first_divergence is not None


def test_compare_with_a_past_given_as_cache(llama, llama_dynamo_cache):
    with torch.no_grad():
        cache = llama(prompt_ids(4, seed=5), cache=transformers.DynamicCache(config=llama.config),
                      use_cache=True).past_key_values
    report = lt.compare(llama, (), llama_dynamo_cache, kwargs=dict(input_ids=prompt_ids(3), cache=cache))
    assert report.ok
    row = next(r for r in report.rows if r.name == "output")
    assert row.shape == [1, 3, 256] and row.status == "pass"


def test_model_with_other_layers_is_refused(llama_genai_fp32):
    with pytest.raises(LayertapError, match="config has 3 layers, 2 KV heads of size 16 but the file's cache"):
        lt.compare(tiny_llama(num_hidden_layers=3), prompt_ids(7), llama_genai_fp32)
