"""Real data in, real data out: compare on the sources extract --data reads (image folders with
the model's preprocessing, datasets folders of token ids), --limit, --save-inputs; labels; shard
sizes in bytes; npy files named after their tap holding bfloat16; --help examples."""

from __future__ import annotations

import json
import shlex

import numpy as np
import pytest

import layertap as lt
from _datasets import image_folder, npy_folder, same_tree
from layertap.cli.main import main

datasets = pytest.importorskip("datasets")

TEXT_MODEL = '''
import torch
from torch import nn


class Text(nn.Module):
    """Token ids and a mask -> one vector per sequence."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(50, 8)
        self.proj = nn.Linear(8, 4)

    def forward(self, input_ids, attention_mask):
        h = self.embed(input_ids) * attention_mask[..., None].to(torch.float32)
        return self.proj(h.sum(1) / attention_mask.sum(1, keepdim=True).clamp(min=1))
'''


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    """The tiny text model, its ONNX file (inputs input_ids, attention_mask; batch and length
    symbolic) and a datasets folder of padded token ids with a ClassLabel column."""
    import sys

    import torch

    work = tmp_path_factory.mktemp("text")
    (work / "textmodel.py").write_text(TEXT_MODEL)
    sys.path.insert(0, str(work))
    try:
        from textmodel import Text
    finally:
        sys.path.remove(str(work))
    model = Text().eval()
    ids, mask = torch.randint(0, 50, (2, 6)), torch.ones(2, 6, dtype=torch.int64)
    path = work / "text.onnx"
    torch.onnx.export(model, (ids, mask), str(path), dynamo=False, input_names=["input_ids", "attention_mask"],
                      dynamic_axes={"input_ids": {0: "b", 1: "t"}, "attention_mask": {0: "b", 1: "t"}})
    rng = np.random.default_rng(0)
    rows = {"input_ids": rng.integers(0, 50, (5, 6)).tolist(), "attention_mask": [[1] * 6, [1] * 4 + [0] * 2] * 2 + [[1] * 6],
            "label": [0, 1, 1, 0, 1], "text": ["a", "b", "c", "d", "e"]}
    ds = datasets.Dataset.from_dict(rows).cast_column("label", datasets.ClassLabel(names=["neg", "pos"]))
    ds.save_to_disk(str(work / "tokens"))
    ragged = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [4, 5]], "attention_mask": [[1, 1, 1], [1, 1]]})
    ragged.save_to_disk(str(work / "ragged"))
    return model, path, work / "tokens", work / "ragged", rows


@pytest.fixture(scope="module")
def cnn_file(tmp_path_factory):
    """A tiny CNN file whose image size is symbolic (an ONNX reference then needs --image-size)."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2)).eval()
    path = tmp_path_factory.mktemp("cnn") / "cnn.onnx"
    torch.onnx.export(model, (torch.randn(1, 3, 20, 20),), str(path), dynamo=False, input_names=["x"],
                      dynamic_axes={"x": {0: "b", 2: "h", 3: "w"}})
    return path


# -- compare --inputs: image folders --------------------------------------------------------------
def test_compare_on_an_image_folder_with_the_zoo_preprocessing_and_a_saved_rerun(tmp_path, capsys):
    """PyTorch reference torchvision:resnet18: the images are preprocessed as its weights say
    (torchvision's own transforms give the same pixels); --save-inputs, then --inputs of that file,
    gives the identical report."""
    import torch
    import torchvision
    from PIL import Image

    from layertap.pytorch.models import load_model

    images = image_folder(tmp_path / "imgs", n=3)
    model, _ = load_model("torchvision:resnet18")
    onnx_path = tmp_path / "r18.onnx"
    torch.onnx.export(model, (torch.randn(1, 3, 224, 224),), str(onnx_path), dynamo=False, input_names=["x"],
                      dynamic_axes={"x": {0: "b"}})
    saved = tmp_path / "used.npz"
    rc, out, err = _cli(capsys, "compare", "torchvision:resnet18", onnx_path, "--inputs", images, "--limit", "2",
                        "--save-inputs", saved, "--json")
    assert rc == 0, err
    first = json.loads(out)
    assert first["samples"] == 2 and saved.is_file()
    x = np.load(saved)["x"]
    files = sorted(p for p in images.rglob("*.*"))[:2]
    tf = torchvision.models.ResNet18_Weights.DEFAULT.transforms()
    for i, f in enumerate(files):
        np.testing.assert_allclose(x[i], tf(Image.open(f).convert("RGB")).numpy(), atol=1e-5)
    rc, out, err = _cli(capsys, "compare", "torchvision:resnet18", onnx_path, "--inputs", saved, "--json")
    assert rc == 0, err
    assert json.loads(out)["rows"] == first["rows"]


def test_compare_onnx_reference_on_an_image_folder_needs_image_size(cnn_file, tmp_path, capsys):
    from PIL import Image

    from layertap.samples.images import from_options

    images = image_folder(tmp_path / "imgs", n=4)
    rc, _, err = _cli(capsys, "compare", cnn_file, cnn_file, "--no-ort-opt", "--inputs", images)
    assert rc == 2 and "--image-size" in err and err.count("\n") == 1
    saved = tmp_path / "in.npz"
    rc, out, err = _cli(capsys, "compare", cnn_file, cnn_file, "--no-ort-opt", "--inputs", images, "--image-size", "16",
                        "--mean", "0.5", "--std", "0.25", "--save-inputs", saved, "--json")
    assert rc == 0, err
    assert json.loads(out)["samples"] == 4
    x = np.load(saved)["x"]
    first = sorted(images.rglob("*.*"))[0]
    assert x.shape == (4, 3, 16, 16)
    np.testing.assert_array_equal(x[0], from_options(16, [0.5], [0.25]).apply(Image.open(first)))


@pytest.mark.parametrize("batch", [1, 2])
def test_saved_inputs_read_back_as_the_same_samples(cnn_file, tmp_path, capsys, batch):
    """--save-inputs of 4 samples, then --inputs of that file: the same 4 samples, the same rows. Samples
    of batch 1 are one array of the input's own shape (4x3x16x16), one sample per row; others are stacked."""
    saved = tmp_path / "in.npz"
    common = ["compare", cnn_file, cnn_file, "--no-ort-opt", "--json"]
    rc, out, err = _cli(capsys, *common, "--input", f"x={batch}x3x16x16", "--samples", "4", "--save-inputs", saved)
    assert rc == 0, err
    first = json.loads(out)
    x = np.load(saved)["x"]
    assert x.shape == ((4, 3, 16, 16) if batch == 1 else (4, batch, 3, 16, 16))
    assert len({x[i].tobytes() for i in range(4)}) == 4  # four different samples, not one repeated
    rc, out, err = _cli(capsys, *common, "--inputs", saved)
    assert rc == 0, err
    again = json.loads(out)
    assert again["samples"] == first["samples"] == 4
    assert again["rows"] == first["rows"]


def test_an_image_folder_mixing_class_folders_and_loose_files_is_refused(cnn_file, tmp_path, capsys):
    images = image_folder(tmp_path / "imgs", n=3)
    (images / "dogs" / "img2.png").rename(images / "loose.png")
    rc, _, err = _cli(capsys, "compare", cnn_file, cnn_file, "--no-ort-opt", "--inputs", images, "--image-size", "16")
    assert rc == 2 and err.count("\n") == 1
    assert "mixes class folders (cats/" in err and "loose.png" in err
    with pytest.raises(lt.LayertapError, match="loose.png"):
        lt.extract_dataset(cnn_file, images, taps=["x"], out=tmp_path / "o", sample_options=lt.SampleOptions(image_size=16), dataset_options=lt.DatasetOptions(progress=False))


# -- datasets folders of token ids ----------------------------------------------------------------
def test_compare_on_a_datasets_folder_of_token_ids(text_model, tmp_path, capsys):
    """Two columns feed the two named inputs; --limit; --columns picks; a PyTorch reference gets
    them in the file's input order."""
    model, path, tokens, _, rows = text_model
    rc, out, err = _cli(capsys, "compare", path, path, "--no-ort-opt", "--inputs", tokens, "--limit", "3",
                        "--save-inputs", tmp_path / "t.npz", "--json")
    assert rc == 0, err
    assert json.loads(out)["samples"] == 3
    saved = np.load(tmp_path / "t.npz")
    np.testing.assert_array_equal(saved["input_ids"], np.asarray(rows["input_ids"][:3]))
    np.testing.assert_array_equal(saved["attention_mask"], np.asarray(rows["attention_mask"][:3]))
    report = lt.compare(model, None, path, sample_options=lt.SampleOptions(inputs=tokens, columns=["input_ids", "attention_mask"]))
    assert report.ok and report.samples == 5
    rc, _, err = _cli(capsys, "compare", path, path, "--no-ort-opt", "--inputs", tokens, "--columns", "input_ids,atention_mask")
    assert rc == 2 and err.count("\n") == 1
    assert "unknown column 'atention_mask'; did you mean: attention_mask" in err and "input_ids, attention_mask, label, text" in err


def test_extract_on_token_columns_keeps_the_label_column(text_model, tmp_path):
    model, _, tokens, _, rows = text_model
    f = lt.extract_dataset(model, tokens, taps=["proj"], out=tmp_path / "o", batch_size=2, dataset_options=lt.DatasetOptions(progress=False))
    assert f["proj"].shape == (5, 4)
    assert f.labels.tolist() == rows["label"] and f.classes == ["neg", "pos"]
    import torch

    with torch.inference_mode():
        want = model(torch.tensor(rows["input_ids"]), torch.tensor(rows["attention_mask"])).numpy()
    np.testing.assert_allclose(np.asarray(f["proj"]), want, rtol=1e-5, atol=1e-6)
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert manifest["labels"] == rows["label"] and manifest["data"]["classes"] == ["neg", "pos"]
    assert manifest["data"]["column"] == ["input_ids", "attention_mask"]


def test_ragged_token_rows_are_refused_saying_to_pad(text_model, tmp_path, capsys):
    model, path, _, ragged, _ = text_model
    rc, _, err = _cli(capsys, "compare", path, path, "--no-ort-opt", "--inputs", ragged)
    assert rc == 2 and err.count("\n") == 1
    assert "column 'input_ids'" in err and "different lengths (2 to 3)" in err and "padding='max_length'" in err
    with pytest.raises(lt.LayertapError, match="different lengths"):
        lt.extract_dataset(model, ragged, taps=["proj"], out=tmp_path / "o", dataset_options=lt.DatasetOptions(progress=False))


# -- datasets folders of images or arrays beside labels and captions ------------------------------
@pytest.fixture(scope="module")
def captioned(tmp_path_factory):
    """Two datasets folders of 4 rows with a ClassLabel ``label``, a ``caption`` and a list of
    ``captions``: one of images (an Image column), one of 3x16x16 arrays (``emb``)."""
    from PIL import Image

    work = tmp_path_factory.mktemp("captioned")
    rng = np.random.default_rng(0)
    text = {"label": [0, 1, 1, 0], "caption": ["a cat", "a dog", "two dogs", "a cat asleep"],
            "captions": [["a cat", "cat"], ["a dog", "dog"], ["dogs", "two dogs"], ["cat", "sleeping cat"]]}
    images = [Image.fromarray(rng.integers(0, 256, (20 + i, 24, 3), dtype=np.uint8)) for i in range(4)]
    arrays = rng.standard_normal((4, 3, 16, 16)).astype(np.float32)
    for name, column in (("images", {"image": images}), ("arrays", {"emb": list(arrays)})):
        ds = datasets.Dataset.from_dict({**column, **text}).cast_column("label", datasets.ClassLabel(names=["cat", "dog"]))
        if name == "images":
            ds = ds.cast_column("image", datasets.Image())
        ds.save_to_disk(str(work / name))
    return work / "images", work / "arrays", arrays, text["label"]


@pytest.mark.parametrize("kind", ["images", "arrays"])
def test_extract_on_a_datasets_folder_skips_text_columns_and_keeps_labels(cnn_file, captioned, tmp_path, capsys, kind):
    images, arrays, values, labels = captioned
    folder = images if kind == "images" else arrays
    out = tmp_path / "feats"
    rc, _, err = _cli(capsys, "extract", cnn_file, "--data", folder, "--tap", "x", "-o", out, "--image-size", "16",
                      "--batch-size", "2")
    assert rc == 0, err
    f = lt.load_features(out)
    assert f.labels.tolist() == labels and f.classes == ["cat", "dog"]
    assert f["x"].shape == (4, 3, 16, 16)
    if kind == "arrays":
        np.testing.assert_array_equal(f["x"][:], values)
    assert f.manifest.data["data"]["column"] == ("image" if kind == "images" else "emb")
    rc, _, err = _cli(capsys, "extract", cnn_file, "--data", folder, "--tap", "x", "-o", tmp_path / "o2",
                      "--image-size", "16", "--columns", "caption")
    assert rc == 2 and err.count("\n") == 1
    assert f"column 'caption' of datasets folder '{folder}' holds text, and a model takes arrays" in err


def test_a_datasets_object_in_memory_reads_as_its_folder_does(cnn_file, captioned, tmp_path):
    """A Dataset given to lt.extract_dataset (any format) feeds its image column, not every column of a row."""
    images, _, _, labels = captioned
    ds = datasets.load_from_disk(str(images))
    expected = lt.extract_dataset(cnn_file, images, taps=["x"], out=tmp_path / "folder", sample_options=lt.SampleOptions(image_size=16), dataset_options=lt.DatasetOptions(progress=False))
    for fmt in (None, "numpy", "torch"):
        f = lt.extract_dataset(cnn_file, ds.with_format(fmt), taps=["x"], out=tmp_path / f"mem_{fmt}", sample_options=lt.SampleOptions(image_size=16), dataset_options=lt.DatasetOptions(progress=False))
        assert f.labels.tolist() == labels and f.classes == ["cat", "dog"]
        np.testing.assert_array_equal(f["x"][:], expected["x"][:])


# -- shard sizes ----------------------------------------------------------------------------------
def test_shard_size_in_bytes_default_and_resume(tmp_path, capsys):
    """The default is 256MB; a size gives the samples per shard from the taps' bytes per sample
    (recorded), a resumed run keeps it, and a size that does not parse is one line, shards kept."""
    from torch import nn

    from layertap.dataset.manifest import Manifest

    data = npy_folder(tmp_path / "data", n=10, shape=(3, 4, 4))
    net = nn.Sequential(nn.Conv2d(3, 8, 1))
    f = lt.extract_dataset(net, data, taps=["0"], out=tmp_path / "a", batch_size=2, dataset_options=lt.DatasetOptions(progress=False))
    opts = f.manifest.header["options"]
    assert opts["shard_size"] == "256MB" and opts["shard_samples"] == 256 * 10**6 // (8 * 4 * 4 * 4) // 2 * 2
    # 8 float32 per sample after mean pooling: 32 bytes; 100 bytes hold 3, so 2 (whole batches of 2)
    f = lt.extract_dataset(net, data, taps=["0"], out=tmp_path / "b", batch_size=2, pool="mean", dataset_options=lt.DatasetOptions(shard_size="100B", progress=False))
    assert f.manifest.header["options"]["shard_samples"] == 2 and len(f.manifest.data["shards"]) == 5
    # interrupted after 2 shards: a resume with the same options writes the same bytes
    out = tmp_path / "c"
    args = ["extract", str(tmp_path / "net.py:net"), "--tap", "0", "--data", data, "-o", out, "--batch-size", "2",
            "--pool", "mean", "--shard-size", "0.1kB"]
    (tmp_path / "net.py").write_text("import torch\nfrom torch import nn\ntorch.manual_seed(0)\nnet = nn.Sequential(nn.Conv2d(3, 8, 1))\n")
    assert _cli(capsys, *args)[0] == 0
    (tmp_path / "whole").mkdir()
    for p in out.iterdir():
        (tmp_path / "whole" / p.name).write_bytes(p.read_bytes()) if p.is_file() else None
    m = Manifest.read(out)
    for k in (2, 3, 4):
        (out / m.shards.pop(k)["file"]).unlink()
    m.status = "running"
    m.write()
    assert _cli(capsys, *args, "--resume")[0] == 0
    assert same_tree(out, tmp_path / "whole") == []
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    rc, _, err = _cli(capsys, *args[:-1], "12XB", "--resume")
    assert rc == 2 and err.count("\n") == 1 and "bad --shard-size '12XB'" in err and "256MB" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


# -- npy shards -----------------------------------------------------------------------------------
def test_npy_files_are_named_after_their_tap_and_load_as_bfloat16(tmp_path):
    import ml_dtypes
    from torch import nn

    data = npy_folder(tmp_path / "data", n=5, shape=(3, 4, 4))
    net = nn.Sequential(nn.Conv2d(3, 8, 1), nn.ReLU())
    f32 = lt.extract_dataset(net, data, taps=["0", "1"], out=tmp_path / "f32", pool="mean", dataset_options=lt.DatasetOptions(progress=False))
    bf = lt.extract_dataset(net, data, taps=["0", "1"], out=tmp_path / "bf", pool="mean", format="npy", dataset_options=lt.DatasetOptions(dtype="bfloat16", progress=False))
    shard = tmp_path / "bf" / bf.manifest.data["shards"][0]["file"]
    assert sorted(p.name for p in shard.iterdir()) == ["0.npy", "1.npy"]
    raw = np.load(shard / "1.npy")  # plain np.load, ml_dtypes imported: bfloat16 values
    assert raw.dtype == np.dtype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(raw, np.asarray(f32["1"]).astype(ml_dtypes.bfloat16))
    assert bf["1"].dtype == np.dtype(ml_dtypes.bfloat16)
    assert "ml_dtypes" in bf.manifest.data["taps"][1]["read"]


# -- --help ---------------------------------------------------------------------------------------
def test_help_shows_examples_and_never_splits_a_word(monkeypatch):
    """At 80 columns every help text keeps its words whole, and each command shows examples that
    its own parser accepts."""
    from layertap.cli.main import build_parser

    monkeypatch.setenv("COLUMNS", "80")
    parser, tools = build_parser()
    sub = next(a for a in parser._actions if a.choices)
    for name, tool in tools.items():
        p = sub.choices[name]
        text = p.format_help()
        assert "examples:" in text and len(tool.examples) >= 2, name
        tokens = set(text.split())
        for action in p._actions:
            for word in (action.help or "").split():
                assert word in tokens, f"'{word}' of {name} {action.option_strings} is split in --help"
        for example in tool.examples:
            words = shlex.split(example.partition("  # ")[0])
            assert words[:2] == ["layertap", name]
            p.parse_known_args(words[2:])  # an option that no longer exists would fail here
    compare_help = sub.choices["compare"].format_help()
    assert "(convert_float_to_float16's" in compare_help.split()
