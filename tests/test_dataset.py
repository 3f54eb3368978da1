"""Extraction over a dataset (local engine): values, pooling, formats, images, ONNX, resume, bad input.

References are per-sample ``lt.extract`` runs stacked (or torchvision's own
transforms for images); tolerances cover batched-vs-single float rounding.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import layertap as lt  # noqa: E402
from _datasets import image_folder, npy_folder, same_tree, write_model  # noqa: E402
from conftest import run_cli  # noqa: E402
from layertap.errors import LayertapError  # noqa: E402

TAPS = ["conv1", "relu", "head:input"]  # relu runs twice: relu#0, relu#1
TOL = dict(rtol=1e-5, atol=1e-5)
SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    root = tmp_path_factory.mktemp("ds")
    return {"root": root, "model": write_model(root), "npy": npy_folder(root / "npy", n=20)}


@pytest.fixture(scope="module")
def net(work):
    from layertap.pytorch.models import load_model

    return load_model(f"{work['model']}:Net")[0]


def per_sample(model, folder: Path, ids, taps=TAPS) -> dict[str, np.ndarray]:
    outs = [lt.extract(model, torch.from_numpy(np.load(folder / i))[None], taps=taps) for i in ids]
    return {k: np.concatenate([o[k].numpy() for o in outs]) for k in outs[0] if not k.startswith("output")}


@pytest.mark.parametrize("fmt,workers", [("safetensors", 0), ("npy", 2), ("zarr", 0)])
def test_values_equal_per_sample_extract(work, net, tmp_path, fmt, workers):
    # batch 8 and shard 6 do not align: batches straddle shards; workers=2: DataLoader worker processes
    f = lt.extract_dataset(net, work["npy"], taps=TAPS, out=tmp_path / "o", batch_size=8, format=fmt, dataset_options=lt.DatasetOptions(shard_size=6, workers=workers, progress=False))
    assert f.ids == sorted(p.name for p in work["npy"].iterdir())
    ref = per_sample(net, work["npy"], f.ids)
    assert f.taps == ["conv1", "relu#0", "relu#1", "head:input"]
    for tap in f.taps:
        np.testing.assert_allclose(np.asarray(f[tap]), ref[tap], **TOL)
    assert [s["source"] for s in f.manifest.data["shards"]] == [[0, 6], [6, 12], [12, 18], [18, 20]]
    assert f.manifest.data["status"] == "complete"


@pytest.mark.parametrize("pool,dtype,fmt", [("mean", "float16", "npy"), ("max", "bfloat16", "safetensors"),
                                            ("first", "bfloat16", "zarr"), ("mean", "float32", "zarr")])
def test_pooled_shapes_and_dtypes(work, net, tmp_path, pool, dtype, fmt):
    import ml_dtypes

    f = lt.extract_dataset(net, work["npy"], taps=TAPS, out=tmp_path / "o", batch_size=5,
                           pool=pool, format=fmt, dataset_options=lt.DatasetOptions(shard_size=8, dtype=dtype, progress=False))
    ref = per_sample(net, work["npy"], f.ids)
    want = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    reduce = {"mean": lambda a: a.mean((2, 3)), "max": lambda a: a.max((2, 3)), "first": lambda a: a[:, :, 0, 0]}[pool]
    for tap in f.taps:
        got = f[tap]
        expected = reduce(ref[tap]) if ref[tap].ndim == 4 else ref[tap]
        assert got.shape == expected.shape and got.dtype == want
        np.testing.assert_allclose(np.asarray(got).astype(np.float32), expected, rtol=1e-2, atol=1e-2)
    axes = {t["name"]: t["pooled_axes"] for t in f.manifest.data["taps"]}
    assert axes["conv1"] == [2, 3] and axes["head:input"] == []
    assert f.manifest.data["options"]["pool"] == pool


def test_token_pooling_and_safetensors_readable(tmp_path):
    from safetensors.numpy import load_file

    model = torch.nn.Sequential(torch.nn.Linear(4, 6)).eval()
    data = [np.random.default_rng(i).standard_normal((5, 4)).astype(np.float32) for i in range(7)]  # (tokens, dim)
    f = lt.extract_dataset(model, data, taps=["0"], out=tmp_path / "o", pool="first", batch_size=3, dataset_options=lt.DatasetOptions(progress=False))
    ref = np.stack([model(torch.from_numpy(d)).detach().numpy()[0] for d in data])
    np.testing.assert_allclose(np.asarray(f["0"]), ref, **TOL)
    shard = load_file(str(tmp_path / "o" / f.manifest.data["shards"][0]["file"]))  # the real reader agrees
    np.testing.assert_array_equal(shard["0"], np.asarray(f["0"]))


def test_images_with_ids_follow_torchvision_transforms(tmp_path):
    import torchvision
    from PIL import Image

    folder = image_folder(tmp_path / "imgs", n=5)
    f = lt.extract_dataset("torchvision:resnet18", folder, taps=["layer4"], out=tmp_path / "o", pool="mean",
                           batch_size=2, dataset_options=lt.DatasetOptions(shard_size=3, progress=False))
    assert f.ids == ["cats/img1.png", "cats/img3.jpg", "dogs/img0.jpg", "dogs/img2.png", "dogs/img4.png"]
    prep = f.manifest.data["preprocessing"]
    assert prep["source"] == "torchvision weights resnet18" and prep["crop"] == [224, 224] and prep["resize"] == 256
    tf = torchvision.models.get_model_weights("resnet18").DEFAULT.transforms()
    from layertap.pytorch.models import load_model

    model = load_model("torchvision:resnet18")[0]
    for i, sid in enumerate(f.ids):
        x = tf(Image.open(folder / sid).convert("RGB"))[None]
        ref = lt.extract(model, x, taps=["layer4"])["layer4"].mean((2, 3)).numpy()
        np.testing.assert_allclose(f["layer4"][i], ref[0], rtol=1e-4, atol=1e-4)


def test_datasets_image_column_equals_the_image_folder(net, tmp_path):
    datasets = pytest.importorskip("datasets")
    from PIL import Image

    folder = image_folder(tmp_path / "imgs", n=4)
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.*"))
    ds = datasets.Dataset.from_dict({"image": [Image.open(folder / f) for f in files], "label": [0, 1, 0, 1]})
    ds.cast_column("image", datasets.Image()).save_to_disk(str(tmp_path / "hf"))
    a = lt.extract_dataset(net, folder, taps=["conv2"], out=tmp_path / "a", pool="mean", sample_options=lt.SampleOptions(image_size=20), dataset_options=lt.DatasetOptions(progress=False))
    b = lt.extract_dataset(net, tmp_path / "hf", taps=["conv2"], out=tmp_path / "b", pool="mean", sample_options=lt.SampleOptions(image_size=20), dataset_options=lt.DatasetOptions(progress=False))
    assert a.ids == files and b.ids == [0, 1, 2, 3]
    assert b.manifest.data["data"] == {"kind": "datasets", "path": str(tmp_path / "hf"), "column": "image",
                                       "classes": None, "label_column": "label"}
    # labels kept: the label column's values, and the image folder's class folders
    assert b.labels.tolist() == [0, 1, 0, 1] and b.classes is None
    assert a.labels.tolist() == [0, 0, 1, 1] and a.classes == ["cats", "dogs"]
    assert lt.load_features(tmp_path / "a").labels.tolist() == [0, 0, 1, 1]
    np.testing.assert_allclose(np.asarray(b["conv2"]), np.asarray(a["conv2"]), rtol=1e-6, atol=1e-6)


def test_progress_bar_on_a_terminal_only(work, tmp_path):
    import pty

    args = [sys.executable, "-m", "layertap", "extract", f"{work['model']}:Net", "--tap", "conv2", "--data", str(work["npy"]),
            "--batch-size", "4"]
    main, sub = pty.openpty()
    proc = subprocess.run([*args, "-o", str(tmp_path / "tty")], stdout=subprocess.DEVNULL, stderr=sub, timeout=300)
    os.close(sub)
    seen = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    os.close(main)
    assert proc.returncode == 0
    assert b"samples/s" in seen and b"20/20" in seen
    piped = run_cli(*args[3:], "-o", str(tmp_path / "pipe"))
    assert piped.returncode == 0 and "samples/s" not in piped.stderr


def test_cuda_without_a_gpu_is_one_line(work, net, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(LayertapError, match="--device cuda: no CUDA device is available here"):
        lt.extract_dataset(net, work["npy"], taps=["conv2"], out=tmp_path / "o", device="cuda", dataset_options=lt.DatasetOptions(progress=False))
    assert not (tmp_path / "o").exists()


def test_image_size_mean_std_options(work, net, tmp_path):
    from PIL import Image

    folder = image_folder(tmp_path / "imgs", n=3)
    f = lt.extract_dataset(net, folder, taps=["conv2"], out=tmp_path / "o", sample_options=lt.SampleOptions(image_size=24, mean=[0.5], std=[0.25]), dataset_options=lt.DatasetOptions(progress=False))
    img = Image.open(folder / f.ids[0]).convert("RGB")
    w, h = img.size
    s = 24 / min(w, h)
    img = img.resize((max(24, int(w * s)), max(24, int(h * s))), Image.Resampling.BILINEAR)
    left, top = round((img.size[0] - 24) / 2), round((img.size[1] - 24) / 2)
    x = (np.asarray(img.crop((left, top, left + 24, top + 24)), np.float32) / 255 - 0.5) / 0.25
    ref = lt.extract(net, torch.from_numpy(x.transpose(2, 0, 1).copy())[None], taps=["conv2"])["conv2"].numpy()
    np.testing.assert_allclose(f["conv2"][0], ref[0], **TOL)
    assert f.manifest.data["preprocessing"]["mean"] == [0.5, 0.5, 0.5]


@pytest.fixture(scope="module")
def tiny_onnx(work, net):
    path = work["root"] / "tiny.onnx"
    torch.onnx.export(net, (torch.zeros(2, 3, 16, 16),), str(path), dynamo=False, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "n"}, "y": {0: "n"}})
    return path


def test_onnx_backend_equals_pytorch(work, net, tiny_onnx, tmp_path):
    taps = ["conv1", "conv2"]
    fo = lt.extract_dataset(tiny_onnx, work["npy"], taps=taps, out=tmp_path / "onnx", batch_size=8, dataset_options=lt.DatasetOptions(shard_size=6, workers=2, progress=False))
    ft = lt.extract_dataset(net, work["npy"], taps=taps, out=tmp_path / "torch", batch_size=8, dataset_options=lt.DatasetOptions(shard_size=6, progress=False))
    assert fo.ids == ft.ids and fo.taps == ft.taps == taps
    for tap in taps:
        np.testing.assert_allclose(np.asarray(fo[tap]), np.asarray(ft[tap]), rtol=1e-4, atol=1e-4)
    assert fo.manifest.data["model"]["backend"] == "onnx"


def test_onnx_extraction_never_imports_torch(work, tiny_onnx, tmp_path):
    code = (
        "import sys, layertap as lt\n"
        f"f = lt.extract_dataset({str(tiny_onnx)!r}, {str(work['npy'])!r}, taps=['conv2'], out={str(tmp_path / 'o')!r}, dataset_options=lt.DatasetOptions(progress=False))\n"
        "print(len(f), 'torch' in sys.modules)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": SRC})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["20", "False"]


def test_iterables_dataloader_and_datasets_folder_agree(work, net, tmp_path):
    datasets = pytest.importorskip("datasets")
    files = sorted(work["npy"].iterdir())
    arrays = [np.load(p) for p in files]
    base = lt.extract_dataset(net, work["npy"], taps=["conv2"], out=tmp_path / "folder", batch_size=4, dataset_options=lt.DatasetOptions(progress=False))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.from_numpy(np.stack(arrays))), batch_size=3)
    hf = tmp_path / "hf"
    datasets.Dataset.from_dict({"x": arrays, "label": list(range(len(arrays)))}).save_to_disk(str(hf))
    for name, data in [("list", arrays), ("generator", (a for a in arrays)), ("loader", loader), ("hf", hf)]:
        f = lt.extract_dataset(net, data, taps=["conv2"], out=tmp_path / f"out_{name}", batch_size=4, dataset_options=lt.DatasetOptions(progress=False))
        assert f.ids == list(range(len(arrays))), name
        np.testing.assert_array_equal(np.asarray(f["conv2"]), np.asarray(base["conv2"]), err_msg=name)


def test_load_features_is_lazy_and_indexes_across_shards(work, net, tmp_path):
    lt.extract_dataset(net, work["npy"], taps=["conv2"], out=tmp_path / "o", batch_size=6, dataset_options=lt.DatasetOptions(shard_size=6, progress=False))
    f = lt.load_features(tmp_path / "o")
    a = f["conv2"]
    assert isinstance(a.parts[0], np.memmap) and len(a.parts) == 4
    full = np.asarray(a)
    np.testing.assert_array_equal(a[4:9], full[4:9])
    np.testing.assert_array_equal(a[[19, 0, 7]], full[[19, 0, 7]])
    np.testing.assert_array_equal(a[-1, 3], full[-1, 3])
    assert "conv2" in f and len(f) == 20
    with pytest.raises(KeyError, match="did you mean: conv2"):
        f["conv"]


def test_limit_and_stop_early(work, net, tmp_path):
    f = lt.extract_dataset(net, work["npy"], taps=["conv1"], out=tmp_path / "o", sample_options=lt.SampleOptions(limit=7), dataset_options=lt.DatasetOptions(stop_early=True, progress=False))
    assert len(f) == 7 and f.manifest.data["source_count"] == 7


# -- CLI: resume, bad input -------------------------------------------------------
def _cli_extract(model: str, data: Path, out: Path, *extra: str):
    return run_cli("extract", model, "--tap", "conv2", "--tap", "relu", "--data", str(data), "-o", str(out),
                   "--batch-size", "2", "--shard-size", "4", *extra)


@contextlib.contextmanager
def _held(args: list[str], gate: Path, hold_at: int, **popen) -> Iterator[subprocess.Popen]:
    """``layertap ARGS`` on GatedNet, started to stop before its forward number ``hold_at``. A shard goes to
    the writer when the first batch of the next one has run: held at forward 2N+1 (2 batches a shard),
    N shards are written and recorded and nothing else is on its way."""
    gate.mkdir()
    env = {**os.environ, "TINYCNN_GATE": str(gate), "TINYCNN_HOLD_AT": str(hold_at)}
    proc = subprocess.Popen([sys.executable, "-m", "layertap", *args], env=env, **popen)
    try:
        yield proc
    finally:
        if proc.poll() is None:  # a check failed: no child stays held at its gate
            proc.kill()
            proc.wait()


def _wait_held(proc: subprocess.Popen, gate: Path, out: Path, shards: int) -> None:
    """Wait until ``proc`` is held at its gate with ``shards`` shards recorded. Both come true while it
    waits there, whatever the machine's load; the time limit only keeps a broken run from hanging."""
    deadline = time.monotonic() + 120
    while not ((gate / "ready").exists() and _recorded(out) == shards):
        assert proc.poll() is None, f"exit {proc.returncode} before the child reached its gate"
        assert time.monotonic() < deadline, "the child never reached its gate"
        time.sleep(0.01)


def _recorded(out: Path) -> int:
    manifest = out / "manifest.json"
    return len(json.loads(manifest.read_text())["shards"]) if manifest.exists() else 0  # replaced atomically


def test_sigkill_after_first_shards_then_resume_is_byte_identical(work, tmp_path):
    data = npy_folder(tmp_path / "data", n=24)
    model = f"{work['model']}:GatedNet"
    whole = _cli_extract(model, data, tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr
    out = tmp_path / "killed"
    args = ["extract", model, "--tap", "conv2", "--tap", "relu", "--data", str(data), "-o", str(out),
            "--batch-size", "2", "--shard-size", "4"]
    gate = tmp_path / "gate"
    with _held(args, gate, hold_at=5, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as proc:
        _wait_held(proc, gate, out, shards=2)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    before = json.loads((out / "manifest.json").read_text())
    assert before["status"] == "running" and 1 <= len(before["shards"]) < 6
    assert len(before["shards"]) == 2
    again = _cli_extract(model, data, out)
    assert again.returncode == 2 and "pass --resume" in again.stderr
    resumed = _cli_extract(model, data, out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert same_tree(tmp_path / "whole", out) == []


def test_ctrl_c_names_the_kept_shards_and_the_resume_command(work, tmp_path):
    data = npy_folder(tmp_path / "data", n=24)
    model = f"{work['model']}:GatedNet"
    assert _cli_extract(model, data, tmp_path / "whole").returncode == 0
    out = tmp_path / "stopped"
    args = ["extract", model, "--tap", "conv2", "--tap", "relu", "--data", str(data), "-o", str(out),
            "--batch-size", "2", "--shard-size", "4"]
    gate = tmp_path / "gate"
    with _held(args, gate, hold_at=3, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as proc:
        _wait_held(proc, gate, out, shards=1)
        proc.send_signal(signal.SIGINT)
        (gate / "open").touch()  # were the signal lost, the run would go on and fail below, not hang
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    m = json.loads((out / "manifest.json").read_text())
    kept = len(m["shards"])
    assert m["status"] == "running" and 1 <= kept < 6
    assert kept == 1
    command = shlex.join(["layertap", *args, "--resume"])
    assert err.strip().splitlines() == [
        f"layertap: error: interrupted; {kept} complete shard(s) ({4 * kept} samples) are kept in '{out}'; to go on, run: {command}"
    ]
    assert sorted(p.name for p in out.iterdir()) == sorted(["manifest.json", *(s["file"] for s in m["shards"])])  # no temp files
    resumed = run_cli(*shlex.split(command)[1:])
    assert resumed.returncode == 0, resumed.stderr
    assert f"wrote {6 - kept} new shard(s) ({kept} kept from the earlier run) and manifest.json to {out}" in resumed.stderr
    assert same_tree(tmp_path / "whole", out) == []
    again = run_cli(*shlex.split(command)[1:])
    assert again.returncode == 0 and f"nothing to do: all 6 shard(s) in {out} were written by the earlier run" in again.stderr


def test_ctrl_c_before_the_first_shard_keeps_nothing(work, tmp_path):
    data = [np.zeros(1, np.float32)] * 2 + [np.full(1, -1, np.float32)]  # Threads raises KeyboardInterrupt on -1
    with pytest.raises(KeyboardInterrupt):
        lt.extract_dataset(f"{work['model']}:Threads", data, taps=["count"], out=tmp_path / "o", batch_size=1, dataset_options=lt.DatasetOptions(shard_size=4, progress=False))
    assert not (tmp_path / "o").exists()


def test_resume_runs_on_the_thread_count_the_run_started_with(work, tmp_path):
    # a convolution's float sums depend on how many threads split it: a resumed run must use the recorded count
    model, first = f"{work['model']}:Threads", torch.get_num_threads()
    stopped = [np.zeros(1, np.float32)] * 6 + [np.full(1, -1, np.float32)] + [np.zeros(1, np.float32)]
    kw = dict(taps=["count"], out=tmp_path / "o", batch_size=2, dataset_options=lt.DatasetOptions(shard_size=2, progress=False))
    try:
        torch.set_num_threads(1)
        with pytest.raises(KeyboardInterrupt):
            lt.extract_dataset(model, stopped, **kw)
        assert len(json.loads((tmp_path / "o" / "manifest.json").read_text())["shards"]) == 2
        torch.set_num_threads(2)
        f = lt.extract_dataset(model, [np.zeros(1, np.float32)] * 8, resume=True, **kw)
        assert torch.get_num_threads() == 2  # the caller's setting is back
    finally:
        torch.set_num_threads(first)
    assert f.manifest.data["options"]["threads"] == 1
    assert np.asarray(f["count"]).ravel().tolist() == [1.0] * 8
    assert (f.written, f.kept) == (2, 2)


def test_resume_with_other_options_is_refused_naming_the_difference(work, tmp_path):
    data = npy_folder(tmp_path / "data", n=6)
    model = f"{work['model']}:Net"
    assert _cli_extract(model, data, tmp_path / "o").returncode == 0
    r = _cli_extract(model, data, tmp_path / "o", "--resume", "--dtype", "float16")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"layertap: error: cannot resume '{tmp_path / 'o'}': --dtype was \"float32\", now \"float16\"; "
        "rerun with the same options, or write to a new OUT_DIR"
    ]


def test_corrupt_sample_named_shards_kept_then_resume_after_fix(work, tmp_path):
    data = npy_folder(tmp_path / "data", n=14)
    good = (data / "s009.npy").read_bytes()
    (data / "s009.npy").write_bytes(b"\x93NUMPY garbage")
    model = f"{work['model']}:Net"
    r = _cli_extract(model, data, tmp_path / "o")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "'s009.npy'" in lines[0] and "--resume" in lines[0]
    m = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert [s["source"] for s in m["shards"]] == [[0, 4], [4, 8]]  # the shards before it are kept
    (data / "s009.npy").write_bytes(good)
    assert _cli_extract(model, data, tmp_path / "o", "--resume").returncode == 0
    assert _cli_extract(model, data, tmp_path / "clean").returncode == 0
    assert same_tree(tmp_path / "clean", tmp_path / "o") == []


def test_skip_bad_records_skipped_ids(work, net, tmp_path):
    folder = image_folder(tmp_path / "imgs", n=4)
    (folder / "cats" / "broken.png").write_bytes(b"not a png")
    f = lt.extract_dataset(net, folder, taps=["conv2"], out=tmp_path / "o", sample_options=lt.SampleOptions(image_size=16), dataset_options=lt.DatasetOptions(skip_bad=True, progress=False))
    assert "cats/broken.png" not in f.ids and len(f) == 4
    assert [s["id"] for s in f.skipped] == ["cats/broken.png"]
    assert "cannot read sample 'cats/broken.png'" in f.skipped[0]["error"]
    with pytest.raises(LayertapError, match="cats/broken.png"):
        lt.extract_dataset(net, folder, taps=["conv2"], out=tmp_path / "o2", sample_options=lt.SampleOptions(image_size=16), dataset_options=lt.DatasetOptions(progress=False))


def test_wrong_shape_sample_named_and_mixed_shapes_need_pool(work, net, tmp_path):
    data = npy_folder(tmp_path / "data", n=5)
    np.save(data / "s003.npy", np.zeros((3, 20, 20), np.float32))
    with pytest.raises(LayertapError, match=r"sample 's003.npy' has shape 3x20x20, unlike the first sample 's000.npy' \(3x16x16\).*--pool"):
        lt.extract_dataset(net, data, taps=["conv2"], out=tmp_path / "o", dataset_options=lt.DatasetOptions(progress=False))
    f = lt.extract_dataset(net, data, taps=["conv2"], out=tmp_path / "p", pool="mean", dataset_options=lt.DatasetOptions(progress=False))
    ref = lt.extract(net, torch.from_numpy(np.load(data / "s003.npy"))[None], taps=["conv2"])["conv2"].mean((2, 3))
    np.testing.assert_allclose(f["conv2"][3], ref[0].numpy(), **TOL)
    np.save(data / "s004.npy", np.zeros((3, 16, 16), np.float64))
    with pytest.raises(LayertapError, match="'s004.npy' has dtype float64, unlike"):
        lt.extract_dataset(net, data, taps=["conv2"], out=tmp_path / "q", pool="mean", dataset_options=lt.DatasetOptions(progress=False))


@pytest.mark.parametrize("case,expected", [
    ("empty", "is empty: no images"),
    ("other", "holds other files (notes.txt, ...) and no manifest.json"),
    ("tuple", "is tuple(Tensor[2,4,3], tuple(Tensor[1,2,3], Tensor[1,2,3])), not a tensor; pick one with an index, e.g. lstm[0]"),
    ("unbatched", "needs taps whose first axis is the batch"),
    ("inside", "is inside the data folder"),
])
def test_bad_inputs_give_one_line(work, tmp_path, case, expected):
    data = npy_folder(tmp_path / "data", n=2, shape=(4, 2))
    out = tmp_path / "o"
    model = torch.nn.Sequential()
    model.add_module("lstm", torch.nn.LSTM(2, 3, batch_first=True))
    if case == "empty":
        data = tmp_path / "empty"
        data.mkdir()
    elif case == "inside":
        out = data / "feats"
    elif case == "other":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    taps = ["lstm[1][0]"] if case == "unbatched" else (["lstm"] if case == "tuple" else ["lstm[0]"])
    with pytest.raises(LayertapError) as e:
        lt.extract_dataset(model, data, taps=taps, out=out, dataset_options=lt.DatasetOptions(progress=False))
    assert expected in str(e.value) and "\n" not in str(e.value)
    if case == "other":
        assert (out / "notes.txt").read_text() == "mine"
    else:
        assert not out.exists()  # a run that failed before its first shard leaves no OUT_DIR


def test_cli_dataset_summary_and_onnx_model(work, tiny_onnx, tmp_path):
    r = run_cli("extract", str(tiny_onnx), "--tap", "conv2", "--data", str(work["npy"]), "-o", str(tmp_path / "o"),
                "--pool", "mean", "--format", "npy", "--limit", "5")
    assert r.returncode == 0, r.stderr
    assert "conv2" in r.stdout and "16" in r.stdout and "5 samples" in r.stdout
    assert f"wrote 1 shard(s) and manifest.json to {tmp_path / 'o'}" in r.stderr
    r = run_cli("extract", str(tiny_onnx), "--tap", "conv2", "--data", str(work["npy"]))
    assert r.returncode == 2 and "the following arguments are required: -o" in r.stderr
