"""Every command gets its samples from one place, ``samples.for_reference.samples_for``: the same
``inputs=`` file gives compare, fix and repro the same samples; random samples are drawn at a file's
declared shapes or a program's; export's calibration and extract --data read through it too."""

from __future__ import annotations

import importlib
import types

import numpy as np
import pytest

import layertap as lt
from layertap.errors import LayertapError
from layertap.options import ExportOptions, RuntimeOptions, SampleOptions
from layertap.samples.for_reference import samples_for

torch = pytest.importorskip("torch")
ASKERS = ("layertap.comparing.api", "layertap.dataset.extraction", "layertap.exporting.program", "layertap.fixing.fix",
          "layertap.fixing.programs", "layertap.reproducing.repro")
OTHER_RUN = RuntimeOptions(ref_ort_optimizations=False)  # the file against itself, run another way


@pytest.fixture
def calls(monkeypatch):
    """Every Samples the commands got, with the module that asked: samples_for wrapped where each command
    imported it."""
    got: list[tuple[str, object]] = []
    for name in ASKERS:
        monkeypatch.setattr(importlib.import_module(name), "samples_for", _recording(name, got))
    return got


def _recording(asker: str, got: list):
    def record(*args, **kwargs):
        samples = samples_for(*args, **kwargs)
        got.append((asker, samples))
        return samples

    return record


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A small model, its ONNX file (input ``x``: 1x4) and three samples of it in one ``.npz``."""
    folder = tmp_path_factory.mktemp("home")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
    path = folder / "m.onnx"
    torch.onnx.export(model, (torch.randn(1, 4),), str(path), dynamo=False, input_names=["x"])
    rows = np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32)
    npz = folder / "in.npz"
    np.savez(npz, x=rows)
    return types.SimpleNamespace(model=model, path=path, npz=npz, rows=rows, folder=folder)


def _rows(samples) -> np.ndarray:
    """The one input of every sample, joined on the batch axis."""
    values = [(list(s.args) + list(s.kwargs.values()))[0] for s in samples]
    return np.concatenate([v.numpy() if isinstance(v, torch.Tensor) else np.asarray(v) for v in values])


def test_one_inputs_file_gives_compare_fix_and_repro_the_same_samples(files, calls, tmp_path):
    reading = SampleOptions(inputs=files.npz)
    saved = tmp_path / "compared.npz"
    lt.compare(files.model, None, files.path, sample_options=SampleOptions(inputs=files.npz, save_inputs=saved))
    lt.compare(files.path, None, files.path, sample_options=reading, runtime_options=OTHER_RUN)
    lt.fix(files.path, to="fp16", out=None, sample_options=reading)
    with pytest.raises(LayertapError):  # the export agrees with its model: nothing to package, after the samples
        lt.repro(files.model, None, files.path, out=tmp_path / "pkg", sample_options=reading)

    compares = [samples for module, samples in calls if module == "layertap.comparing.api"]
    first = {}
    for module, samples in calls:
        first.setdefault(module, samples)
    for samples in (compares[0], compares[1], first["layertap.fixing.fix"], first["layertap.reproducing.repro"]):
        np.testing.assert_array_equal(_rows(samples), files.rows)
    # what compare ran is what it read: its --save-inputs file holds the same rows
    np.testing.assert_array_equal(np.load(saved)["x"], files.rows)
    # a PyTorch reference gets tensors in the file's input order, an ONNX one arrays by input name
    torch_samples = next(s for m, s in calls if m.endswith("api") and s[0].args)
    onnx_samples = next(s for m, s in calls if m.endswith("api") and s[0].kwargs)
    assert isinstance(torch_samples[0].args[0], torch.Tensor) and list(onnx_samples[0].kwargs) == ["x"]


def test_random_samples_are_drawn_at_the_file_declared_shapes(files, calls, tmp_path):
    import onnx

    drawn = samples_for(files.path, None, SampleOptions(samples=3, seed=5), shapes_from=onnx.load(str(files.path)))
    assert [s.kwargs["x"].shape for s in drawn] == [(1, 4)] * 3
    assert not np.array_equal(drawn[0].kwargs["x"], drawn[1].kwargs["x"])
    # compare draws the same ones from the same seed, and so does fix
    saved = tmp_path / "drawn.npz"
    lt.compare(files.path, None, files.path, samples=3, sample_options=SampleOptions(seed=5, save_inputs=saved),
               runtime_options=OTHER_RUN)
    np.testing.assert_array_equal(np.load(saved)["x"], np.concatenate([s.kwargs["x"] for s in drawn]))
    lt.fix(files.path, to="fp16", out=None, samples=3, sample_options=SampleOptions(seed=5))
    fixed = next(s for m, s in calls if m.endswith("fix") and len(s) == 3)
    np.testing.assert_array_equal(np.concatenate([s.kwargs["x"] for s in fixed]),
                                  np.concatenate([s.kwargs["x"] for s in drawn]))


def test_a_program_shapes_give_a_model_its_samples(files):
    from layertap.pytorch.reference import load

    program = [types.SimpleNamespace(name="x", type="tensor(float)", shape=[2, 4])]  # as a program's engine declares
    samples = samples_for(load(files.model), None, SampleOptions(samples=2), shapes_from=lambda: program)
    assert [tuple(s.args[0].shape) for s in samples] == [(2, 4), (2, 4)] and not samples[0].kwargs
    assert not torch.equal(samples[0].args[0], samples[1].args[0])
    # given arguments win: the program is not even asked
    asked = []
    given = samples_for(load(files.model), torch.zeros(1, 4), SampleOptions(samples=2),
                        shapes_from=lambda: asked.append(1))
    assert not asked and torch.equal(given[0].args[0], torch.zeros(1, 4)) and given[1].args[0].shape == (1, 4)


def test_export_calibration_and_dataset_read_through_the_one_entry(files, calls, tmp_path):
    from layertap.exporting.program import calibration_samples

    read = calibration_samples(files.model, (torch.zeros(1, 4),), files.npz)
    assert [tuple(r[0].shape) for r in read] == [(1, 4)] * 3
    np.testing.assert_array_equal(torch.cat([r[0] for r in read]).numpy(), files.rows)
    drawn = calibration_samples(files.model, (torch.ones(1, 4),), 3)
    assert torch.equal(drawn[0][0], torch.ones(1, 4)) and len(drawn) == 3
    assert sum(m.endswith("program") for m, _ in calls) == 2

    data = tmp_path / "data"
    data.mkdir()
    for i, row in enumerate(files.rows):
        np.save(data / f"{i}.npy", row[None])
    feats = lt.extract_dataset(files.model, data, taps=["0"], out=tmp_path / "out", batch_size=2)
    assert len(feats) == 3
    sources = [s for m, s in calls if m.endswith("extraction")]
    assert len(sources) == 1 and sources[0].source is not None and not sources[0].items


def test_export_reads_its_calibration_path_through_it(files, calls, tmp_path):
    pytest.importorskip("executorch")
    report = lt.export(files.model, torch.zeros(1, 4), tmp_path / "m.pte",
                       export_options=ExportOptions(quantize="int8", calibration=str(files.npz)))
    assert report.ok
    assert any(m.endswith("program") and len(s) == 3 for m, s in calls)
