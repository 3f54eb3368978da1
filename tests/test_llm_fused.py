"""Fused LLM graphs (ONNX Runtime GenAI builder) under PyTorch module paths, and token selectors (PATH@POS).

The files come from the real builder (fp32 and int4 MatMulNBits) on the tiny random Llama of tests/_llm.py.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import layertap as lt
from _llm import prompt_ids
from conftest import run_cli

LAYER_MODULES = ["input_layernorm", "self_attn", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                 "self_attn.o_proj", "post_attention_layernorm", "mlp", "mlp.gate_proj", "mlp.up_proj",
                 "mlp.act_fn", "mlp.down_proj"]
EVERY_MODULE = ["model.embed_tokens", "model.norm", "model", "lm_head"] + [
    f"model.layers.{n}" + (f".{m}" if m else "") for n in (0, 1) for m in ["", *LAYER_MODULES]]


def _prefill(llama, path, **options):
    """The prompt's prefill on both sides: the file's empty past, mask and positions made by compare."""
    return lt.compare(llama, prompt_ids(), path, **options)


def test_builder_fp32_every_decoder_module_maps_and_passes(llama, llama_genai_fp32):
    report = _prefill(llama, llama_genai_fp32)
    rows = {r.name: r for r in report.rows}
    assert [m for m in EVERY_MODULE if m not in rows or rows[m].status != "pass"] == []
    assert report.first_divergence is None
    # q/k/v are slices of the one packed projection: GQA widths (4 query heads, 2 KV heads of 16)
    assert rows["model.layers.0.self_attn.q_proj"].shape == [1, 7, 64]
    assert rows["model.layers.0.self_attn.k_proj"].shape == rows["model.layers.0.self_attn.v_proj"].shape == [1, 7, 32]
    # a decoder layer's output is the residual output of the next skip-norm (the last one's: the final norm's)
    assert rows["model.layers.0"].onnx == ["/model/layers.1/input_layernorm/output_3"]
    assert rows["model.layers.1"].onnx == ["/model/layers.2/final_norm_layernorm/output_3"]


def test_builder_int4_first_divergence_at_first_quantised_matmul(llama, llama_genai_int4):
    report = _prefill(llama, llama_genai_int4, local=True)
    rows = {r.name: r for r in report.rows}
    assert report.first_divergence == "model.layers.0.self_attn.q_proj"
    assert rows["model.layers.0.input_layernorm"].status == "pass"  # float32 before the first MatMulNBits
    # local error: the int4 MatMuls make their own error, the float ops between them none
    assert rows["model.layers.0.self_attn.q_proj"].local_rel > 1e-2
    assert rows["model.layers.0.mlp.gate_proj"].local_rel > 1e-2
    assert rows["model.layers.0.mlp.act_fn"].local_rel < 1e-5
    assert rows["model.layers.0.post_attention_layernorm"].local_rel < 1e-5


LINEARS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj"]


def test_builder_local_error_for_every_module(llama, llama_genai_fp32, llama_genai_int4):
    # the inputs no module returns (attention's context, act(gate) * up, the residual sums) come from PyTorch
    exact = {r.name: r for r in _prefill(llama, llama_genai_fp32, local=True).rows}
    assert [m for m in EVERY_MODULE if exact[m].local_rel is None or exact[m].local_rel > 1e-5] == []
    int4 = {r.name: r for r in _prefill(llama, llama_genai_int4, local=True).rows}
    linears = ["lm_head"] + [f"model.layers.{n}.{m}" for n in (0, 1) for m in LINEARS]
    assert [m for m in linears if not int4[m].local_rel > 1e-2] == []  # each MatMulNBits' own int4 error
    floats = ["model.norm"] + [f"model.layers.{n}.{m}" for n in (0, 1)
                               for m in ("input_layernorm", "post_attention_layernorm", "mlp.act_fn")]
    assert [m for m in floats if not int4[m].local_rel < 1e-5] == []
    assert all(int4[m].local_rel is not None for m in EVERY_MODULE)


def test_builder_int4_local_error_per_token_row(llama, llama_genai_int4):
    report = lt.compare(llama, prompt_ids(6), llama_genai_int4, local=True, modules=["model.layers.0"], sample_options=lt.SampleOptions(steps=2))
    local = {r.name: r.local_rel for r in report.rows}
    for token in ("0..5", "6", "7"):  # the prompt's row, then each decode step's
        assert [m for m in LINEARS if not local[f"model.layers.0.{m}@{token}"] > 1e-2] == []
        assert local[f"model.layers.0.post_attention_layernorm@{token}"] < 1e-5
        assert local[f"model.layers.0.mlp.act_fn@{token}"] < 1e-5


def test_builder_layers_and_run_name_pytorch_paths(llama_genai_int4):
    table = lt.onnx_layers(llama_genai_int4)
    modules = {r.module for r in table.rows}
    assert {"model.layers.1.self_attn", "model.layers.1.self_attn.q_proj", "model.norm", "lm_head"} <= modules
    assert not any("attn." in m and "self_attn" not in m for m in modules if m)
    packed = next(r for r in table.rows if r.name == "/model/layers.1/attn/qkv_proj/MatMul/output_0")
    assert packed.module == "model.layers.1.self_attn"  # the one MatMul of three projections: their parent's


def test_run_token_selectors_on_a_builder_file(llama, llama_genai_fp32, tmp_path):
    ids = prompt_ids()
    got = lt.run(llama_genai_fp32, {"input_ids": ids.numpy()}, taps=["model.layers.1@-1", "n=model.norm@3"])
    assert "model.layers.1" not in got and got["model.layers.1@-1"].shape == (1, 64)
    with lt.tap(llama, ["model.layers.1@-1", "model.norm@3"]) as taps:
        llama(ids)
    np.testing.assert_allclose(got["model.layers.1@-1"], taps["model.layers.1@-1"], atol=1e-5)
    np.testing.assert_allclose(got["n"], taps["model.norm@3"], atol=1e-5)
    with pytest.raises(lt.LayertapError, match=r"token position 7 is outside the sequence 'model.layers.1' holds \(0\.\.6"):
        lt.run(llama_genai_fp32, {"input_ids": ids.numpy()}, taps=["model.layers.1@7"])
    # an added output is the whole sequence: add-outputs says what to add instead
    with pytest.raises(lt.LayertapError, match=r"add 'model.layers.1' and take \[:, -1\] of its value"):
        lt.add_outputs(llama_genai_fp32, tmp_path / "out.onnx", modules=["model.layers.1@-1"])
    assert not (tmp_path / "out.onnx").exists()


def test_decoder_layer_of_a_cache_file_is_its_hidden_state(llama_dynamo_cache):
    from layertap.onnxfile.modelfile import read_model
    from layertap.onnxfile.scopemap import ScopeMap

    smap = ScopeMap.from_model(read_model(llama_dynamo_cache).model)
    (name, tensor), = smap.resolve("model.layers.1")
    outputs = [o.name for o in read_model(llama_dynamo_cache).model.graph.output]
    assert name == "model.layers.1" and tensor not in outputs[1:]  # not one of the present key/values


def test_token_selectors_equal_hand_slicing(llama):
    ids = prompt_ids()  # 7 prompt tokens, then 3 decode steps feed positions 7, 8, 9
    full = lt.extract(llama, ids, taps=["model.layers.1", "lm_head"], method="generate", max_new_tokens=4, do_sample=False)
    got = lt.extract(llama, ids, taps=["model.layers.1@3", "model.layers.1@8", "last=model.layers.1@-1", "lm_head@6"],
                     method="generate", max_new_tokens=4, do_sample=False)
    assert np.array_equal(got["model.layers.1@3"], full["model.layers.1#0"][:, 3])
    assert np.array_equal(got["model.layers.1@8"], full["model.layers.1#2"][:, 0])
    assert np.array_equal(got["last"], full["model.layers.1#3"][:, 0])
    assert np.array_equal(got["lm_head@6"], full["lm_head#0"][:, 0])  # generate computes the prompt's last logits only
    with lt.tap(llama, ["model.norm@-2"]) as taps:
        hidden = llama.model(ids).last_hidden_state
    assert np.array_equal(taps["model.norm@-2"], hidden.detach()[:, -2])


def test_token_position_outside_the_sequence_exit_2(tmp_path):
    done = run_cli("extract", "tests/_llm.py:tiny_llama", "--method", "generate", "--input", "inputs=1x7:int64",
                   "--tap", "model.layers.1@99", "-o", str(tmp_path / "acts.npz"))
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert re.search(r"token position 99 is outside the positions module 'model.layers.1' computed \(0\.\.\d+\)", last)
    assert not (tmp_path / "acts.npz").exists()
