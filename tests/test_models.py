"""MODEL specs, --weights loading and example inputs (layertap.pytorch.models)."""

from __future__ import annotations

import contextlib
import json
import textwrap

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from layertap.errors import LayertapError, LayertapWarning, ModelSpecError  # noqa: E402
from layertap.inputs import InputSpec  # noqa: E402
from layertap.pytorch.checkpoints import load_weights  # noqa: E402
from layertap.pytorch.example_inputs import make_inputs  # noqa: E402
from layertap.pytorch.models import ModelInfo, load_model  # noqa: E402


def test_torchvision_random_weights_are_seeded():
    a, info = load_model("torchvision:resnet18")
    b, _ = load_model("torchvision:resnet18")
    c, _ = load_model("torchvision:resnet18", seed=1)
    assert info.family == "torchvision" and info.inputs == [InputSpec(None, (1, 3, 224, 224), "float32")]
    assert not a.training
    torch.testing.assert_close(a.conv1.weight, b.conv1.weight)
    assert not torch.equal(a.conv1.weight, c.conv1.weight)


def test_torchvision_input_size_from_weights_metadata():
    import torchvision

    from layertap.pytorch.zoos import _torchvision_inputs

    assert _torchvision_inputs(torchvision, "inception_v3")[0].shape == (1, 3, 299, 299)
    assert _torchvision_inputs(torchvision, "r3d_18")[0].shape == (1, 3, 16, 112, 112)


def test_timm_input_size_from_pretrained_cfg():
    model, info = load_model("timm:resnet10t")
    assert info.inputs[0].shape == (1, 3, 176, 176)
    args, kwargs = make_inputs(info, model=model)
    assert model(*args, **kwargs).shape == (1, 1000)


def test_transformers_with_config_file(tmp_path):
    cfg = dict(model_type="bert", hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=57)
    path = tmp_path / "bert.json"
    path.write_text(json.dumps(cfg))
    model, info = load_model("transformers:BertModel", config=str(path))
    assert (info.family, info.int_high, model.config.vocab_size) == ("transformers", 57, 57)
    assert info.inputs == [InputSpec("input_ids", (1, 16), "int64")]
    args, kwargs = make_inputs(info, model=model)
    assert args == () and kwargs["input_ids"].dtype == torch.int64 and int(kwargs["input_ids"].max()) < 57
    assert model(**kwargs).last_hidden_state.shape == (1, 16, 32)


def test_transformers_clip_gets_both_inputs_and_method_filter(tmp_path):
    cfg = dict(
        model_type="clip", projection_dim=8,
        text_config=dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, vocab_size=50, max_position_embeddings=20),
        vision_config=dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, image_size=32, patch_size=16),
    )
    path = tmp_path / "clip.json"
    path.write_text(json.dumps(cfg))
    model, info = load_model("transformers:CLIPModel", config=str(path))
    assert [s.name for s in info.inputs] == ["input_ids", "pixel_values"]
    assert info.inputs[1].shape == (1, 3, 32, 32) and info.int_high == 50
    _, kwargs = make_inputs(info, model=model, method="get_image_features")
    assert list(kwargs) == ["pixel_values"]


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("torchvision:resnt18", "unknown torchvision model 'resnt18'; did you mean: resnet18"),
        ("timm:resnet10", "unknown timm model 'resnet10'; did you mean: resnet10t"),
        ("transformers:BertModl", "unknown transformers model class 'BertModl'; did you mean: BertModel"),
        ("torchvison:resnet18", "did you mean: torchvision:"),
        ("no_such_pkg_xyz.models:Net", "cannot import 'no_such_pkg_xyz.models'"),
        ("resnet18", "bad MODEL 'resnet18'"),
        ("model.onnx", "is an ONNX file"),
        ("missing/file.py:Net", "does not exist"),
    ],
)
def test_bad_specs(spec, fragment):
    with pytest.raises(ModelSpecError) as e:
        load_model(spec)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_config_only_for_transformers(tmp_path):
    with pytest.raises(ModelSpecError, match="--config applies to transformers"):
        load_model("torchvision:resnet18", config=str(tmp_path / "x.json"))


USER_CODE = textwrap.dedent(
    """
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self, width=4):
            super().__init__()
            self.fc = nn.Linear(3, width)

        def forward(self, x):
            return self.fc(x)

    def make():
        return Net(width=5)

    def needs_args(width):
        return Net(width)

    instance = Net(width=6)
    not_a_model = 3

    def returns_int():
        return 3
    """
)


@pytest.fixture
def user_file(tmp_path):
    path = tmp_path / "usernet.py"
    path.write_text(USER_CODE)
    return path


def test_file_and_module_specs(user_file, monkeypatch):
    m, info = load_model(f"{user_file}:Net")
    assert info.family == "file" and m.fc.out_features == 4 and info.inputs == []
    assert load_model(f"{user_file}:make")[0].fc.out_features == 5
    assert load_model(f"{user_file}:instance")[0].fc.out_features == 6
    monkeypatch.syspath_prepend(str(user_file.parent))
    m, info = load_model("usernet:make")
    assert info.family == "module" and m.fc.out_features == 5


@pytest.mark.parametrize(
    "attr, fragment",
    [
        ("Nett", "did you mean: Net"),
        ("needs_args", "takes no arguments"),
        ("not_a_model", "is a int, not an nn.Module"),
        ("returns_int", "returned a int, not an nn.Module"),
    ],
)
def test_bad_user_attributes(user_file, attr, fragment):
    with pytest.raises(ModelSpecError, match=fragment):
        load_model(f"{user_file}:{attr}")


def test_unknown_attribute_names_the_file_not_its_private_module_name(user_file):
    with pytest.raises(ModelSpecError) as e:
        load_model(f"{user_file}:Nett")
    assert str(e.value) == f"unknown attribute of '{user_file}': 'Nett'; did you mean: Net"
    with pytest.raises(ModelSpecError, match=f"unknown attribute of '{user_file}:Net': 'fcc'"):
        load_model(f"{user_file}:Net.fcc")


def test_file_that_raises_on_import(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("raise ImportError('no gpu here')\n")
    with pytest.raises(ModelSpecError, match="failed: ImportError: no gpu here"):
        load_model(f"{path}:Net")


# -- weights ---------------------------------------------------------------------
def test_weights_pt_and_safetensors_round_trip(tmp_path):
    from safetensors.torch import save_file

    src, _ = load_model("torchvision:resnet18", seed=7)
    pt, st = tmp_path / "w.pt", tmp_path / "w.safetensors"
    torch.save(src.state_dict(), pt)
    save_file({k: v.contiguous() for k, v in src.state_dict().items()}, str(st))
    torch.save({"state_dict": {f"module.{k}": v for k, v in src.state_dict().items()}}, tmp_path / "ckpt.pth")
    for path in (pt, st, tmp_path / "ckpt.pth"):
        wrapped = path.name == "ckpt.pth"
        with pytest.warns(LayertapWarning, match="under 'state_dict' .key prefix 'module.' removed") if wrapped \
                else contextlib.nullcontext():
            model, info = load_model("torchvision:resnet18", weights=str(path))
        assert info.weights == str(path)
        torch.testing.assert_close(model.layer4[0].conv1.weight, src.layer4[0].conv1.weight)
        torch.testing.assert_close(model.bn1.running_var, src.bn1.running_var)


def test_state_dict_mismatch_is_readable(tmp_path):
    state = nn.Linear(3, 4).state_dict()
    state["extra.weight"] = torch.zeros(1)
    state["weight"] = torch.zeros(2, 3)
    del state["bias"]
    path = tmp_path / "bad.pt"
    torch.save(state, path)
    with pytest.raises(ModelSpecError) as e:
        load_weights(nn.Linear(3, 4), path, what="my:Net")
    msg = str(e.value)
    assert msg.startswith(f"weights '{path}' do not match my:Net: ")
    assert "1 missing key: bias" in msg and "1 unexpected key: extra.weight" in msg
    assert "1 shape mismatch: weight (file 2x3, model 4x3)" in msg


def test_pickled_module_refused_unless_unsafe(tmp_path):
    src = nn.Linear(3, 4)
    path = tmp_path / "whole.pt"
    torch.save(src, path)
    with pytest.raises(ModelSpecError, match="calls torch.nn.modules.linear.Linear .not a plain state dict.*--unsafe-load-pickle"):
        load_weights(nn.Linear(3, 4), path)
    dst = nn.Linear(3, 4)
    load_weights(dst, path, unsafe_pickle=True)
    torch.testing.assert_close(dst.weight, src.weight)


def test_checkpoint_calling_os_system_names_it_and_loads_only_with_the_flag(tmp_path):
    import os
    import zipfile

    ran = tmp_path / "payload-ran"

    class Payload:  # harmless: it creates an empty file, so the test sees whether unpickling ran it
        def __reduce__(self):
            return (os.system, (f"touch '{ran}'",))

    src = nn.Linear(3, 4)
    path = tmp_path / "x.pt"
    torch.save({"state_dict": src.state_dict(), "note": Payload()}, path)
    assert zipfile.is_zipfile(path)  # torch's own archive format, as torch.save writes it
    with pytest.raises(ModelSpecError) as e:
        load_weights(nn.Linear(3, 4), path)
    assert str(e.value) == (
        f"weights '{path}' are a pickled object that calls posix.system (not a plain state dict), which "
        "torch.load(weights_only=True) refuses; load it only if you trust the file: --unsafe-load-pickle")
    assert not ran.exists()
    dst = nn.Linear(3, 4)
    with pytest.warns(LayertapWarning, match="under 'state_dict'; not loaded: note"):
        load_weights(dst, path, unsafe_pickle=True)
    assert ran.exists()
    torch.testing.assert_close(dst.weight, src.weight)


def test_unsafe_pickle_of_a_model_from_a_file_spec(tmp_path):
    # README: `layertap layers mymodels.py:Net --weights trusted_full_model.pt --unsafe-load-pickle`.
    # The pickle names its class `mymodels.Net` (saved by a script that imported mymodels);
    # the folder is not on sys.path, so unpickling used to fail with "No module named 'mymodels'".
    import subprocess
    import sys

    (tmp_path / "mymodels_rt.py").write_text(USER_CODE)
    code = ("import torch, mymodels_rt; torch.manual_seed(1); m = mymodels_rt.Net(); "
            "torch.save(m, 'whole.pt'); torch.save(m.state_dict(), 'sd.pt')")
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True)
    spec = f"{tmp_path / 'mymodels_rt.py'}:Net"
    with pytest.raises(ModelSpecError, match="--unsafe-load-pickle"):
        load_model(spec, weights=tmp_path / "whole.pt")
    model, _ = load_model(spec, weights=tmp_path / "whole.pt", unsafe_pickle=True)
    saved = torch.load(tmp_path / "sd.pt", weights_only=True)
    torch.testing.assert_close(model.fc.weight, saved["fc.weight"])
    assert "mymodels_rt" not in sys.modules  # the alias lives only while unpickling


@pytest.mark.parametrize("name, content, fragment", [
    ("w.txt", b"x", "must end in one of"),
    ("w.pt", b"not a zip", "cannot read weights"),
    ("w.pt", b"hello", "cannot read weights .* with torch.load \\(KeyError"),  # was an uncaught KeyError
    ("w.safetensors", b"garbage", "cannot read weights"),
])
def test_unreadable_weights(tmp_path, name, content, fragment):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ModelSpecError, match=fragment):
        load_weights(nn.Linear(3, 4), path)
    with pytest.raises(ModelSpecError, match="does not exist"):
        load_weights(nn.Linear(3, 4), tmp_path / "nope.pt")


# -- inputs ----------------------------------------------------------------------
class Two(nn.Module):
    def forward(self, x, mask=None):
        return x if mask is None else x * mask


def test_make_inputs_named_positional_and_files(tmp_path):
    import numpy as np

    info = ModelInfo("t:Two", "module", int_high=5)
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.save(tmp_path / "x.npy", arr)
    args, kwargs = make_inputs(info, [InputSpec.parse(str(tmp_path / "x.npy")), InputSpec.parse("2x3:int64")], model=Two())
    assert torch.equal(args[0], torch.from_numpy(arr)) and int(args[1].max()) < 5
    args, kwargs = make_inputs(info, [InputSpec.parse("x=2x3"), InputSpec.parse("mask=2x3")], model=Two(), seed=1)
    again = make_inputs(info, [InputSpec.parse("x=2x3"), InputSpec.parse("mask=2x3")], model=Two(), seed=1)[1]
    assert args == () and list(kwargs) == ["x", "mask"] and torch.equal(kwargs["x"], again["x"])
    with pytest.raises(LayertapError, match="unknown input name for forward\\(\\) 'msk'; did you mean: mask"):
        make_inputs(info, [InputSpec.parse("msk=2x3")], model=Two())
    # no close match: the names forward() takes, in order
    with pytest.raises(LayertapError, match="unknown input name for forward\\(\\) 'y' \\(forward\\(\\) takes: x, mask\\)$"):
        make_inputs(info, [InputSpec.parse("y=2x3")], model=Two())
    with pytest.raises(LayertapError, match="no example inputs known for t:Two; pass --input"):
        make_inputs(info, [], model=Two())
