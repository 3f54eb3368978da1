"""First use: bad arguments fail fast (before torch), small CLI rules."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

BAD_ARGUMENTS = [
    (["layers", "torchvision:resnet18", "--config", "c.json"], "--config applies to transformers:CLASS models only"),
    (["layers", "transformers:BertModel", "--config", "missing.json"], "--config file 'missing.json' does not exist"),
    (["layers", "transformers:BertModel", "--config", "list.json"], "holds a JSON list"),
    (["layers", "transformers:BertModel", "--config", "broken.json"], "cannot read --config 'broken.json' as JSON"),
    (["layers", "torchvision"], "bad MODEL 'torchvision'"),
    (["layers", "missing.py:Net"], "model file 'missing.py' does not exist"),
    (["layers", "torchvison:resnet18"], "did you mean: torchvision:..."),
    (["layers", "torchvision:resnt18"], "unknown torchvision model 'resnt18'; did you mean: resnet18,"),
    (["layers", "timm:resnt18"], "unknown timm model 'resnt18'; did you mean: resnet18,"),
    (["extract", "timm:vit_tiny_patch16_22.augreg_in21k", "--tap", "blocks.0", "-o", "x.npz"],
     "unknown timm model 'vit_tiny_patch16_22'; did you mean: vit_tiny_patch16_224"),
    (["layers", "torchvision:resnet18", "--weights", "w.pt"], "weights file 'w.pt' does not exist"),
    (["layers", "torchvision:resnet18", "--input", "1xax3"], "1xax3"),
    (["extract", "torchvision:resnet18", "--tap", "layer1[", "-o", "x.npz"], "layer1["),
    (["extract", "torchvision:resnet18", "--tap", "layer1", "-o", "nodir/x.npz"], "nodir"),
    (["export", "torchvision:resnet18", "-o", "x.txt"], "x.txt"),
    (["compare", "torchvision:resnet18", "missing.onnx"], "'missing.onnx' does not exist"),
    (["compare", "r18.onnx", "torchvision:resnet18"], "the arguments look swapped"),
    (["layers", "torchvision:resnet18", "--tapp", "x"], "unrecognized arguments: --tapp x (see 'layertap layers --help')"),
    (["run", "m.onnx", "--bogus"], "(see 'layertap run --help')"),
]


def test_bad_arguments_fail_before_torch_is_imported(tmp_path):
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "broken.json").write_text("{")
    code = (
        "import contextlib, io, json, sys\n"
        "from layertap.cli.main import main\n"
        "out = []\n"
        f"for argv in {json.dumps([a for a, _ in BAD_ARGUMENTS])}:\n"
        "    err = io.StringIO()\n"
        "    with contextlib.redirect_stderr(err):\n"
        "        rc = main(argv)\n"
        "    out.append([rc, 'torch' in sys.modules, err.getvalue()])\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for (argv, fragment), (rc, torch_loaded, err) in zip(BAD_ARGUMENTS, json.loads(proc.stdout)):
        assert rc == 2, (argv, err)
        assert err.startswith("layertap: error: ") and err.count("\n") == 1, (argv, err)
        assert fragment in err, (argv, err)
        assert not torch_loaded, (argv, "torch was imported before the check failed")


def test_zoo_model_names_read_without_torch_are_the_zoos_own_names():
    from layertap.specs import check_model_args, zoo_model_names

    timm = pytest.importorskip("timm")
    torchvision = pytest.importorskip("torchvision")
    from timm.models import _registry

    assert zoo_model_names("torchvision") == set(torchvision.models.list_models())
    assert zoo_model_names("timm") == set(_registry._model_entrypoints)  # deprecated names included
    assert timm.is_model("resnet18.a1_in1k")
    check_model_args("timm:resnet18.a1_in1k")  # a pretrained tag after the name is accepted, as timm does


HUGE_LLAMA = {"model_type": "llama", "hidden_size": 16384, "intermediate_size": 65536, "num_hidden_layers": 64,
              "num_attention_heads": 128, "num_key_value_heads": 128, "vocab_size": 32000}


def _piped_env() -> dict:
    """The environment of a piped run: no COLUMNS, so lines are as long as their content."""
    import os

    return {k: v for k, v in os.environ.items() if k != "COLUMNS"}


def _run(args, cwd):
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    proc = subprocess.run([sys.executable, "-m", "layertap", *args], cwd=cwd, capture_output=True, text=True, timeout=600)
    return proc, max(before, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) * 1024


def test_model_too_big_for_memory_is_refused_before_allocating(tmp_path):
    (tmp_path / "huge.json").write_text(json.dumps(HUGE_LLAMA))  # ~0.9 TiB of float32 weights
    proc, _ = _run(["extract", "transformers:LlamaModel", "--config", "huge.json", "--tap", "norm",
                    "--input", "input_ids=1x4:int64", "-o", "x.npz"], tmp_path)
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr
    assert err.startswith("layertap: error: transformers:LlamaModel needs about ") and err.count("\n") == 1, err
    assert "GiB of memory is available; make the config in 'huge.json' smaller" in err
    assert not (tmp_path / "x.npz").exists()


def test_layers_of_a_huge_model_lists_it_from_the_meta_device(tmp_path):
    (tmp_path / "huge.json").write_text(json.dumps(HUGE_LLAMA))
    proc, peak = _run(["layers", "transformers:LlamaModel", "--config", "huge.json", "--json"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    rows = {r["name"]: r for r in data["rows"]}
    assert rows["layers.63.mlp.down_proj"]["shapes"] == [[1, 16, 16384]]  # shapes from a forward on meta
    assert rows["layers.63.mlp.down_proj"]["params"] == 16384 * 65536
    assert any("built on the meta device" in n and "no weights allocated" in n for n in data["notes"])
    assert peak < 8 * 2**30  # nothing near the 0.9 TiB a real build would take


@pytest.mark.slow
def test_layers_of_llama_default_config_allocates_no_weights(tmp_path):
    # LlamaModel() is 6.7 billion parameters (25 GiB): listed from the meta device on any machine
    proc, peak = _run(["layers", "transformers:LlamaModel"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "layers.31.mlp.down_proj" in proc.stdout and "1x16x4096" in proc.stdout
    assert "built on the meta device (24.6 GiB of weights)" in proc.stdout
    assert peak < 8 * 2**30


def test_every_option_has_a_help_text():
    from layertap.cli.main import build_parser

    parser, _ = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, p in sub.choices.items():
        for action in p._actions:
            assert action.help, (name, action.option_strings or action.dest)


def _one_output_file(path, output_name: str):
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info(output_name, TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["hidden"]), helper.make_node("Neg", ["hidden"], [output_name])],
                              "g", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_run_names_a_single_output_output_on_every_file(tmp_path):
    import layertap as lt

    for graph_name in ("output", "logits"):
        path = tmp_path / f"{graph_name}.onnx"
        _one_output_file(path, graph_name)
        assert list(lt.run(path)) == ["output"]
        assert list(lt.run(path, taps=["hidden"])) == ["output", "hidden"]


@pytest.mark.parametrize("exporter", [["--exporter", "torchscript"], ["--fallback"]])
def test_traced_branch_is_named_and_checked_with_the_other_branch(tmp_path, exporter):
    import shutil
    from pathlib import Path

    shutil.copy(Path(__file__).resolve().parent.parent / "examples" / "mymodels.py", tmp_path)
    proc = subprocess.run([sys.executable, "-m", "layertap", "export", "mymodels.py:Gated", "--input", "2x8", *exporter,
                           "-o", "g.onnx"], cwd=tmp_path, capture_output=True, text=True, timeout=600, env=_piped_env())
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the file is written, for inspection
    assert "TracerWarning" not in proc.stderr
    notes = [line for line in proc.stdout.splitlines() if "data-dependent control flow" in line]
    assert len(notes) == 1 and "mymodels.py:37 (if x.sum() > 0:)" in notes[0], proc.stdout
    assert "differs from PyTorch on the example's negated inputs" in proc.stdout
    assert (tmp_path / "g.onnx").is_file()


def test_no_branch_note_without_data_dependent_flow(tmp_path):
    import torch

    import layertap as lt

    report = lt.export(torch.nn.Linear(4, 2).eval(), torch.randn(2, 4), tmp_path / "l.onnx", exporter="torchscript")
    assert report.ok and not any("control flow" in n for n in report.notes)
