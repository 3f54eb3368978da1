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
    report = lt.compare(lt.Model(llama, kwargs=dict(input_ids=prompt_ids(3), cache=cache)), (), llama_dynamo_cache)
    assert report.ok
    row = next(r for r in report.rows if r.name == "output")
    assert row.shape == [1, 3, 256] and row.status == "pass"


def test_model_with_other_layers_is_refused(llama_genai_fp32):
    with pytest.raises(LayertapError, match="config has 3 layers, 2 KV heads of size 16 but the file's cache"):
        lt.compare(tiny_llama(num_hidden_layers=3), prompt_ids(7), llama_genai_fp32)


def test_steps_compare_each_token_with_the_reference_tokens(llama, llama_dynamo_cache):
    ids = prompt_ids(7)
    report = lt.compare(llama, ids, llama_dynamo_cache, sample_options=lt.SampleOptions(steps=3))
    assert report.ok and report.first_divergence is None
    outputs = [(r.name, r.token, r.tokens, r.shape) for r in report.rows if r.path == ""]
    assert outputs == [("output@0..6", 0, 7, [1, 7, 256]), ("output@7", 7, 1, [1, 1, 256]),
                       ("output@8", 8, 1, [1, 1, 256]), ("output@9", 9, 1, [1, 1, 256])]
    with torch.no_grad():
        generated = llama.generate(ids, max_new_tokens=3, do_sample=False)[0, 7:].tolist()
    assert f"reference's tokens ({', '.join(map(str, generated))})" in report.notes[-1]
    footer = report.footer()
    grid = footer[footer.index("rel err by module and token position (! = FAIL):") + 1:]
    assert grid[0] == "module              0..6        7        8        9"
    assert [line.split()[0] for line in grid[1:4]] == ["model.layers.0", "model.layers.1", "output"]
    assert "!" not in "".join(grid[1:4]) and len(grid[1].split()) == 5


def test_steps_int4_divergence_named_with_token(llama, llama_genai_int4):
    report = lt.compare(llama, prompt_ids(7), llama_genai_int4, sample_options=lt.SampleOptions(steps=2))
    assert not report.ok
    row = report.first_divergence_row
    assert report.first_divergence == f"{row.path}@0..6" and report.summary()["first_divergence_token"] == 0
    assert [r.token for r in report.rows if r.path == "" and r.status == "FAIL"] == [0, 7, 8]
    assert any(line.startswith("first divergence: ") and " in the prompt (tokens 0..6)" in line
               for line in report.footer())
    html = report._repr_html_()
    grid = html[html.index("error by layer and token"):html.index("module tree")]
    assert '<th class="num">0..6</th><th class="num">7</th><th class="num">8</th>' in grid and '<span class="bad">' in grid


def test_steps_refuse_a_file_without_cache(tmp_path, llama):
    path = tmp_path / "no_cache.onnx"
    torch.onnx.export(llama.model.norm, (torch.zeros(1, 3, 64),), str(path), dynamo=False)
    with pytest.raises(LayertapError, match="steps= needs a decoder file with a KV cache"):
        lt.compare(llama.model.norm, torch.zeros(1, 3, 64), path, sample_options=lt.SampleOptions(steps=2))


@pytest.fixture(scope="session")
def llama_kv_export(llama, tmp_path_factory):
    path = tmp_path_factory.mktemp("llama_kv") / "llama_kv.onnx"
    return lt.export(llama, prompt_ids(5), path, export_options=lt.ExportOptions(kv_cache=True)), path


def test_export_kv_cache_uses_optimum_names_and_decodes(llama, llama_kv_export):
    report, path = llama_kv_export
    assert report.ok and [r.name for r in report.rows] == [
        "logits", "present.0.key", "present.0.value", "present.1.key", "present.1.value"]
    assert list(report.inputs) == ["input_ids", "attention_mask", "past_key_values.0.key", "past_key_values.0.value",
                                   "past_key_values.1.key", "past_key_values.1.value"]
    assert any("a prefill of 5 tokens and 3 greedy steps fed their own present.*" in n for n in report.notes)
    # another prompt length, a prefill made by layertap, then decode steps: all match PyTorch
    steps = lt.compare(llama, prompt_ids(9), path, sample_options=lt.SampleOptions(steps=4))
    assert steps.ok and [r.token for r in steps.rows if r.path == ""] == [0, 9, 10, 11, 12]


def test_export_dynamic_sequence_runs_at_other_lengths(llama, tmp_path):
    path = tmp_path / "llama_seq.onnx"
    report = lt.export(llama, prompt_ids(5), path, export_options=lt.ExportOptions(dynamic_sequence=True))
    assert report.ok and report.inputs["input_ids"][1] != 5  # a symbol, not the example's length
    assert any(n.startswith("the model also returns its KV cache (past_key_values), which the file does not output")
               for n in report.notes)
    for length in (3, 11):
        ids = prompt_ids(length, seed=length)
        np.testing.assert_allclose(lt.run(path, {"input_ids": ids.numpy()})["output"], _logits(llama, ids),
                                   atol=1e-5)


def test_run_dynamo_cache_file_sizes_its_empty_past_from_the_graph(llama, llama_dynamo_cache):
    # no config next to the file and a symbolic past: KV heads and head size come from the present outputs
    ids, notes = prompt_ids(7), []
    out = lt.run(llama_dynamo_cache, {"input_ids": ids.numpy()}, notify=notes.append)
    assert any("prefill: empty past (past_key_values_*: 1x2x0x16 float32)" in n for n in notes), notes
    logits = next(v for v in out.values() if v.shape == (1, 7, 256))
    np.testing.assert_allclose(logits, _logits(llama, ids), atol=1e-5)


def test_bad_cache_inputs_are_one_line_errors(llama_genai_fp32, llama_dynamo_cache, tmp_path):
    import onnx

    ids = prompt_ids(4).numpy()
    with pytest.raises(LayertapError, match=r"the past is given only in part: past_key_values.0.value, "):
        lt.run(llama_genai_fp32, {"input_ids": ids, "past_key_values.0.key": np.zeros((1, 2, 0, 16), np.float32)})
    # no config, and neither the past nor the present declares the KV sizes: the message names the inputs
    model = onnx.load(str(llama_dynamo_cache))
    for value in [*model.graph.output, *model.graph.value_info]:
        value.type.tensor_type.ClearField("shape")
    onnx.save(model, str(tmp_path / "shapeless.onnx"))
    with pytest.raises(LayertapError, match=r"KV head count and head size of the cache inputs \(past_key_values_0, "
                                            r"past_key_values_1, \.\.\. declared .*--input past_key_values_0=1xHEADSx0x"):
        lt.run(tmp_path / "shapeless.onnx", {"input_ids": ids})


def test_cli_compare_steps_prints_the_token_grid(cli, llama_genai_int4):
    done = cli("compare", "tests/_llm.py:tiny_llama", str(llama_genai_int4), "--input", "input_ids=1x6:int64",
               "--steps", "2", "--module", "model.layers.0.mlp")
    assert done.returncode == 1, done.stderr
    out = " ".join(done.stdout.split())  # lines wrap at the terminal's width
    assert "rel err by module and token position (! = FAIL):" in out
    assert "first divergence: model.layers.0.mlp.gate_proj@0..5 (Linear) in the prompt (tokens 0..5)" in out


def test_long_generation_values_beyond_the_budget_go_to_disk(llama, llama_dynamo_cache):
    ids, taps = prompt_ids(7), ["model.layers.0", "model.layers.1", "model.norm"]
    held = lt.extract(llama, ids, taps=taps, method="generate", max_new_tokens=12, do_sample=False)
    spilled = lt.extract(llama, ids, taps=taps, method="generate", max_new_tokens=12, do_sample=False,
                         memory_budget=4096)
    assert held.spilled == 0 and spilled.spilled > 0 and list(spilled) == list(held)
    assert all(torch.equal(spilled[k], held[k]) for k in held)
    report = lt.compare(llama, ids, llama_dynamo_cache, sample_options=lt.SampleOptions(steps=2), runtime_options=lt.RuntimeOptions(memory_budget=4096))
    assert report.ok and any("KiB of reference values were held on disk (memory_budget)" in n for n in report.notes)


def test_int4_builder_file_against_its_fp32_builder_file_on_generated_feeds(llama_genai_fp32, llama_genai_int4, tmp_path):
    """Two builder files alone (no genai_config.json beside them), no inputs given: a prefill of 16 random
    tokens with an empty past whose head size (declared kv_cache_dim) comes from the GroupQueryAttention
    node (kv_num_heads 2; packed QKV width 128 over 4 + 2 x 2 heads: 16). Never imports torch."""
    import shutil
    import subprocess
    import sys

    import onnx

    from layertap.onnxfile.kvcache import kv_layout

    bare = {}
    for name, path in (("fp32", llama_genai_fp32), ("int4", llama_genai_int4)):
        (tmp_path / name).mkdir()
        for f in path.parent.glob("model.onnx*"):
            shutil.copy(f, tmp_path / name)
        bare[name] = tmp_path / name / "model.onnx"
        graph = onnx.load(bare[name], load_external_data=False).graph
        assert [d.dim_param or d.dim_value for d in graph.input[2].type.tensor_type.shape.dim][3] == "kv_cache_dim"
        assert kv_layout(graph).dims == ("batch_size", 2, "past_sequence_length", 16)
    saved = tmp_path / "feeds.npz"
    report = lt.compare(bare["fp32"], None, bare["int4"], samples=2, sample_options=lt.SampleOptions(save_inputs=saved))
    assert report.samples == 2 and not report.ok
    assert report.first_divergence == "model.layers.0.self_attn.q_proj"  # the first int4 MatMulNBits
    rows = {r.name: r for r in report.rows}
    assert rows["output"].shape == [1, 16, 256] and rows["output"].status == "FAIL"
    assert rows["model.embed_tokens"].status == "pass"
    feeds = np.load(saved)
    assert feeds["input_ids"].shape == (2, 16) and feeds["past_key_values.0.key"].shape == (2, 2, 0, 16)
    code = ("import sys\nfrom layertap.cli.main import main\n"
            f"rc = main(['compare', {str(bare['fp32'])!r}, {str(bare['int4'])!r}, '--json'])\n"
            "assert 'torch' not in sys.modules, 'torch imported'\nsys.exit(rc)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    assert '"first_divergence": "model.layers.0.self_attn.q_proj"' in done.stdout.replace("\n", "")
