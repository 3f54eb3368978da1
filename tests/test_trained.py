"""The trained-model corpus (tests/_trained.py): weights load strictly into the architectures, and the
models do what they were trained for on the realistic inputs."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).parent))
import _trained  # noqa: E402


def test_trained_crepe_finds_the_pitch_of_tones():
    f0 = [110.0, 220.0, 440.0, 700.0]
    frames = _trained.tone_frames(4, f0=f0)
    assert np.allclose(frames.mean(1), 0, atol=1e-5) and np.allclose(frames.std(1, ddof=1), 1, atol=1e-4)
    with torch.no_grad():
        probs = _trained.crepe("tiny")(torch.from_numpy(frames))
    assert probs.shape == (4, _trained.PITCH_BINS)
    found = probs.argmax(1).numpy()
    assert np.abs(found - [_trained.pitch_bin(f) for f in f0]).max() <= 2, found


@pytest.mark.parametrize("net,size", [("onet", 48), ("rnet", 24), ("pnet", 12)])
def test_trained_mtcnn_scores_face_crops_above_noise(net, size):
    model = getattr(_trained, net)()
    faces = torch.from_numpy(_trained.face_crops(8, size))
    noise = torch.randn(8, 3, size, size, generator=torch.Generator().manual_seed(0)) * 0.5
    with torch.no_grad():
        face_p, noise_p = (model(x)[-1][:, 1].flatten() for x in (faces, noise))
    assert face_p.mean() > 0.4 and noise_p.mean() < 0.1, (face_p, noise_p)


def test_the_architecture_spec_takes_the_trained_weights_from_the_cli(capsys):
    from layertap.cli.main import main

    spec = f"{Path(_trained.__file__)}:CrepeTiny"
    rc = main(["layers", spec, "--weights", str(_trained.weights("crepe", "tiny")), "--input", "1x1024", "--json"])
    out = capsys.readouterr().out
    assert rc == 0 and "conv6_BN" in out and "classifier" in out


def test_missing_weights_skip_with_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv(_trained.ENV, str(tmp_path))
    with pytest.raises(pytest.skip.Exception) as info:
        _trained.onet()
    assert "make install" in str(info.value) and "\n" not in str(info.value)
