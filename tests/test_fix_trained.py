"""``layertap fix MODEL`` from a PyTorch reference on trained models (tests/_trained.py), through the CLI:
the plain conversion misses the target, the search keeps a set that meets it, and FIXED.onnx, loaded
here in plain ONNX Runtime, meets the target against PyTorch's own outputs; ``--inputs`` alone gives
the example input the model is exported with."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxconverter_common")
sys.path.insert(0, str(Path(__file__).parent))
import _trained  # noqa: E402

SPEC = str(Path(_trained.__file__))  # MODEL specs by file: f"{SPEC}:Crepe"


def _fix(capsys, *args) -> tuple[int, dict]:
    from layertap.cli.main import main

    rc = main(["fix", *map(str, args), "--json"])
    return rc, json.loads(capsys.readouterr().out)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _sqnr(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(10 * np.log10((a @ a) / ((a - b) @ (a - b))))


def _worst(metric, model, fixed: Path, samples: np.ndarray) -> float:
    """FIXED.onnx in a plain ONNX Runtime session vs the PyTorch model: the worst ``metric`` over outputs
    and samples."""
    sess = ort.InferenceSession(str(fixed), providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    values = []
    for x in samples:
        with torch.no_grad():
            ref = model(torch.from_numpy(x[None]))
        refs = ref if isinstance(ref, tuple) else (ref,)
        values += [metric(r.numpy(), got) for r, got in zip(refs, sess.run(None, {name: x[None]}), strict=True)]
    return min(values)


def _configs_hold_the_set(cfg: Path, report: dict) -> None:
    assert json.loads((cfg / "modules.json").read_text())["modules"] == report["kept"]
    assert json.loads((cfg / "onnxconverter_common.json").read_text())["node_block_list"] == report["nodes"]
    assert json.loads((cfg / "ort_quantization.json").read_text())["nodes_to_exclude"] == report["nodes"]


@pytest.mark.slow
def test_fp16_of_trained_crepe_from_pytorch_meets_the_target_in_plain_onnxruntime(tmp_path, capsys):
    """Full CREPE: float16 gives output cosine ~0.96 (conv2_BN diverges); the kept set meets 0.999."""
    weights = _trained.weights("crepe", "full")
    frames = _trained.tone_frames(4, seed=3)
    np.savez(tmp_path / "frames.npz", frames[:, None])  # one 1x1024 sample per leading index
    out, cfg = tmp_path / "crepe16.onnx", tmp_path / "cfg"
    rc, report = _fix(capsys, f"{SPEC}:Crepe", "--weights", weights, "--input", "1x1024", "--to", "fp16", "-o", out,
                      "--inputs", tmp_path / "frames.npz", "--config-out", cfg)
    plain = report["rows"][0]
    assert rc == 0 and report["ok"] and plain["action"] == "plain" and plain["metric"] < 0.99, report
    assert "conv2_BN" in report["kept"] and len(report["kept"]) <= 3, report
    _configs_hold_the_set(cfg, report)
    assert "makes FIXED.onnx again (checked)" in " ".join(report["notes"])
    assert _worst(_cosine, _trained.crepe("full"), out, frames) >= 0.999


def test_int8_of_trained_crepe_from_pytorch_meets_the_target_in_plain_onnxruntime(tmp_path, capsys):
    """Tiny CREPE, QDQ calibrated on the tone frames: plain int8 gives ~27 dB on the worst frame; the kept
    set meets 30 dB."""
    weights = _trained.weights("crepe", "tiny")
    frames = _trained.tone_frames(8)
    np.savez(tmp_path / "frames.npz", frames)  # rows of the input's own rank: one 1x1024 sample each
    out, cfg = tmp_path / "crepe8.onnx", tmp_path / "cfg"
    rc, report = _fix(capsys, f"{SPEC}:CrepeTiny", "--weights", weights, "--input", "1x1024", "--to", "int8", "-o", out,
                      "--inputs", tmp_path / "frames.npz", "--target", "sqnr:30", "--config-out", cfg)
    plain = report["rows"][0]
    assert rc == 0 and report["ok"] and plain["action"] == "plain" and plain["metric"] < 28, report
    assert report["kept"] and report["nodes"] and min(len(r["kept"]) for r in report["rows"] if r["ok"]) == len(report["kept"])
    _configs_hold_the_set(cfg, report)
    assert _worst(_sqnr, _trained.crepe("tiny"), out, frames) >= 30


def test_the_samples_file_gives_the_example_input_of_a_pytorch_model(tmp_path, capsys):
    """No --input: ONet is exported with the first face crop of --inputs (with or without a batch axis
    per row), and FIXED.onnx takes 3x48x48 crops; a file the model runs on in no layout is exit 2."""
    faces = _trained.face_crops(4)
    np.savez(tmp_path / "faces.npz", faces[:, None])  # each row 1x3x48x48: a sample with its batch axis
    out = tmp_path / "onet16.onnx"
    rc, report = _fix(capsys, f"{SPEC}:onet", "--to", "fp16", "-o", out, "--inputs", tmp_path / "faces.npz")
    assert rc == 0 and report["ok"], report
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert sess.get_inputs()[0].shape[1:] == [3, 48, 48]
    assert _worst(_cosine, _trained.onet(), out, faces) >= 0.999
    np.savez(tmp_path / "short.npz", faces[:, :, :20])
    from layertap.cli.main import main

    assert main(["fix", f"{SPEC}:onet", "--to", "fp16", "-o", str(tmp_path / "x.onnx"), "--inputs",
                 str(tmp_path / "short.npz")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "neither with a batch axis nor as stored: 1x3x20x48" in err and "--input" in err
    assert not (tmp_path / "x.onnx").exists()
