"""--weights as training scripts save them: a state dict inside a checkpoint, wrapper prefixes,
extra or missing keys. MTCNN's trained ONet (facenet-pytorch's wheel, fetched by ``make install``)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import _trained  # noqa: E402
from layertap.cli.main import main  # noqa: E402
from layertap.errors import LayertapWarning, ModelSpecError  # noqa: E402
from layertap.pytorch.models import load_model  # noqa: E402

MODEL = f"{Path(_trained.__file__)}:ONet"  # facenet-pytorch's ONet, as the trained corpus writes it


@pytest.fixture(scope="module")
def onet():
    """(MODEL spec, trained state dict, its file)."""
    path = _trained.weights("mtcnn", "onet")
    return MODEL, torch.load(path, weights_only=True), path


def training_checkpoint(spec: str, state: dict, path: Path, **entries) -> Path:
    """What a training loop saves: step, the model's state under ``entries``, an Adam optimizer's state after a step."""
    model, _ = load_model(spec)
    model.load_state_dict(state)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(2, 3, 48, 48))[0].sum().backward()
    opt.step()
    torch.save({"step": 1200, **entries, "optimizer_state": opt.state_dict(), "config": {"lr": 1e-3}}, path)
    return path


def same_weights(model, state: dict) -> None:
    for k, v in state.items():
        torch.testing.assert_close(model.state_dict()[k], v, rtol=0, atol=0)


def warned(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    return result, [str(w.message) for w in caught if issubclass(w.category, LayertapWarning)]


def test_training_checkpoint_through_cli_equals_plain_state_dict(onet, tmp_path, capsys):
    spec, state, _ = onet
    ckpt = training_checkpoint(spec, state, tmp_path / "pretrained.pt", model_state=state)
    outs = {}
    for name, weights in (("plain", onet[2]), ("ckpt", ckpt)):
        out = tmp_path / f"{name}.npz"
        assert main(["extract", spec, "--weights", str(weights), "--tap", "dense5", "--input", "2x3x48x48",
                     "-o", str(out)]) == 0
        outs[name] = dict(np.load(out))
        err = capsys.readouterr().err
    assert f"layertap: warning: weights '{ckpt}': loaded the state dict under 'model_state'; not loaded: step, " \
           "optimizer_state, config" in err
    assert outs["plain"].keys() == outs["ckpt"].keys()
    for k in outs["plain"]:
        np.testing.assert_array_equal(outs["plain"][k], outs["ckpt"][k])


def test_nested_wrapper_with_dataparallel_and_compile_prefixes(onet, tmp_path):
    spec, state, _ = onet
    wrapped = {f"module._orig_mod.{k}": v for k, v in state.items()}
    ckpt = training_checkpoint(spec, state, tmp_path / "ema.pt", ema={"module": wrapped, "decay": 0.999})
    (model, _), notes = warned(lambda: load_model(spec, weights=ckpt))
    same_weights(model, state)
    assert notes == [f"weights '{ckpt}': loaded the state dict under 'ema.module' (key prefix 'module.', '_orig_mod.' "
                     "removed); not loaded: step, optimizer_state, config"]


def test_two_fitting_state_dicts_are_refused_until_one_is_named(onet, tmp_path, capsys):
    spec, state, _ = onet
    ema = {k: v + 1 for k, v in state.items()}
    ckpt = training_checkpoint(spec, state, tmp_path / "both.pt", model=state, model_ema=ema)
    out = tmp_path / "a.npz"
    argv = ["extract", spec, "--weights", str(ckpt), "--tap", "conv1", "--input", "1x3x48x48", "-o", str(out)]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        f"layertap: error: weights '{ckpt}' hold 2 state dicts that fit the model: model, model_ema; "
        "pass --weights-key with the one to load (e.g. --weights-key model)\n")
    assert not out.exists()
    assert main([*argv, "--weights-key", "model_ema"]) == 0
    model, _ = load_model(spec, weights=ckpt, weights_key="model_ema")
    same_weights(model, ema)


def test_no_state_dict_names_what_the_file_holds(onet, tmp_path):
    spec, state, _ = onet
    ckpt = training_checkpoint(spec, state, tmp_path / "opt_only.pt")
    with pytest.raises(ModelSpecError) as e:
        load_model(spec, weights=ckpt)
    assert str(e.value) == (f"weights '{ckpt}' hold a dict with keys step, optimizer_state, config and no state dict of "
                            "tensors in it; save model.state_dict(), or pass --weights-key KEY naming the entry that holds it")
    with pytest.raises(ModelSpecError, match="unknown key 'model_stat'; did you mean: model_state"):
        load_model(spec, weights=training_checkpoint(spec, state, tmp_path / "c.pt", model_state=state),
                   weights_key="model_stat")


def test_extra_and_missing_keys_need_nonstrict_which_names_them(onet, tmp_path, capsys):
    spec, state, _ = onet
    trimmed = {k: v for k, v in state.items() if not k.startswith("dense6_3")}
    trimmed["aux_head.weight"] = torch.zeros(3, 256)
    ckpt = training_checkpoint(spec, state, tmp_path / "aux.pt", model_state_dict=trimmed)
    out = tmp_path / "a.npz"
    argv = ["extract", spec, "--weights", str(ckpt), "--tap", "dense5", "--input", "1x3x48x48", "-o", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"layertap: error: weights '{ckpt}' (the state dict under 'model_state_dict') do not match "
                          f"{spec}: 2 missing keys: dense6_3.weight, "
                          "dense6_3.bias; 1 unexpected key: aux_head.weight; pass --weights-nonstrict")
    assert main([*argv, "--weights-nonstrict"]) == 0
    assert (f"layertap: warning: weights '{ckpt}' loaded non-strictly: skipped 1 key the model does not have: "
            "aux_head.weight; 2 keys of the model not in the file keep their initial values: dense6_3.weight, "
            "dense6_3.bias\n") in capsys.readouterr().err
    (model, _), notes = warned(lambda: load_model(spec, weights=ckpt, weights_strict=False))
    same_weights(model, {k: v for k, v in trimmed.items() if k in state})
    assert any("loaded non-strictly" in n for n in notes)
    with pytest.raises(ModelSpecError, match="shape mismatch: dense5.weight"):  # shapes must fit, strict or not
        bad = {**trimmed, "dense5.weight": torch.zeros(256, 10)}
        load_model(spec, weights=training_checkpoint(spec, state, tmp_path / "bad.pt", model=bad), weights_strict=False)


def test_safetensors_with_prefixes_and_a_key(onet, tmp_path, capsys):
    from safetensors.torch import save_file

    spec, state, _ = onet
    flat = tmp_path / "dp.safetensors"
    save_file({f"module.{k}": v.contiguous() for k, v in state.items()}, str(flat))
    same_weights(load_model(spec, weights=flat)[0], state)
    both = tmp_path / "both.safetensors"
    save_file({**{f"model.{k}": v.contiguous() for k, v in state.items()},
               **{f"ema.{k}": (v + 1).contiguous() for k, v in state.items()}}, str(both))
    out = tmp_path / "a.npz"
    assert main(["extract", spec, "--weights", str(both), "--weights-key", "ema", "--tap", "conv1",
                 "--input", "1x3x48x48", "-o", str(out)]) == 0
    same_weights(load_model(spec, weights=both, weights_key="ema")[0], {k: v + 1 for k, v in state.items()})
    assert main(["layers", spec, "--weights-nonstrict"]) == 2
    assert "--weights-nonstrict applies to --weights, which is not given" in capsys.readouterr().err


def test_dataset_extraction_takes_the_named_state_dict(onet, tmp_path):
    import layertap as lt

    spec, state, _ = onet
    ema = {k: v * 0.5 for k, v in state.items()}
    ckpt = training_checkpoint(spec, state, tmp_path / "both.pt", model=state, model_ema=ema)
    data = [np.random.default_rng(i).standard_normal((3, 48, 48)).astype(np.float32) for i in range(3)]
    feats = lt.extract_dataset(lt.Model(spec, weights=ckpt, weights_key="model_ema"), data, taps=["dense5"], out=tmp_path / "feats", dataset_options=lt.DatasetOptions(progress=False))
    model, _ = load_model(spec, weights=ckpt, weights_key="model_ema")
    with torch.no_grad():
        expected = lt.extract(model, torch.from_numpy(np.stack(data)), taps=["dense5"])["dense5"].numpy()
    np.testing.assert_allclose(feats["dense5"][:], expected, rtol=1e-5, atol=1e-5)
    assert feats.manifest.data["model"]["weights_key"] == "model_ema"
