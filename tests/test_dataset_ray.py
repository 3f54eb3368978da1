"""Extraction on Ray Data (a real local cluster, 2 CPUs, started once for this module) equals the local run."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")

import layertap as lt  # noqa: E402
from _datasets import image_folder, npy_folder, same_tree, write_model  # noqa: E402
from conftest import run_cli  # noqa: E402
from layertap.errors import LayertapError  # noqa: E402

pytestmark = pytest.mark.slow  # starting Ray and its actors takes tens of seconds


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_equals_local_byte_for_byte(cluster, tmp_path, caplog):
    data = npy_folder(tmp_path / "data", n=22, shape=(3, 32, 32))
    kw = dict(taps=["layer1.0", "layer4"], batch_size=4, pool="mean")
    opts = lt.DatasetOptions(shard_size=6, dtype="float16", progress=False)
    local = lt.extract_dataset("torchvision:resnet18", data, out=tmp_path / "local", **kw, dataset_options=opts)
    on_ray = lt.extract_dataset("torchvision:resnet18", data, out=tmp_path / "ray", **kw,
                                dataset_options=replace(opts, engine="ray"))
    assert on_ray.ids == local.ids and on_ray.taps == local.taps == ["layer1.0", "layer4"]
    assert same_tree(tmp_path / "local", tmp_path / "ray") == []  # same shards, same manifest
    assert [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()] == []  # current Ray Data API


def test_ray_shard_size_in_bytes_equals_local(cluster, tmp_path):
    # a size in bytes is resolved before the shards are handed out: the same shards as a local run
    data = npy_folder(tmp_path / "data", n=10, shape=(3, 8, 8))
    kw = dict(taps=["conv2"], batch_size=2)
    opts = lt.DatasetOptions(shard_size="2KiB", progress=False)
    model = f"{write_model(tmp_path)}:Net"
    local = lt.extract_dataset(model, data, out=tmp_path / "local", **kw, dataset_options=opts)
    on_ray = lt.extract_dataset(model, data, out=tmp_path / "ray", **kw, dataset_options=replace(opts, engine="ray"))
    assert local.manifest.header["options"]["shard_samples"] == on_ray.manifest.header["options"]["shard_samples"] == 2
    # 16x4x4 float32: 1024 bytes per sample
    assert same_tree(tmp_path / "local", tmp_path / "ray") == []


def test_ray_actors_run_on_the_drivers_thread_count(cluster, tmp_path):
    # Ray starts actors with OMP_NUM_THREADS=num_cpus; a forward on another thread count sums in another order
    first = torch.get_num_threads()
    try:
        torch.set_num_threads(3)  # neither Ray's per-actor default nor this cluster's CPU count
        f = lt.extract_dataset(f"{write_model(tmp_path)}:Threads", [np.zeros(1, np.float32)] * 6, taps=["count"],
                               out=tmp_path / "o", batch_size=2,
                               dataset_options=lt.DatasetOptions(shard_size=2, engine="ray", progress=False))
    finally:
        torch.set_num_threads(first)
    assert f.manifest.data["options"]["threads"] == 3
    assert np.asarray(f["count"]).ravel().tolist() == [3.0] * 6


def test_ray_images_resume_and_bad_samples(cluster, tmp_path):
    folder = image_folder(tmp_path / "imgs", n=9)
    (folder / "dogs" / "zz_broken.png").write_bytes(b"not a png")
    kw = dict(taps=["layer2"], batch_size=2, pool="max", sample_options=lt.SampleOptions(image_size=32))
    opts = lt.DatasetOptions(shard_size=3, progress=False)
    with pytest.raises(LayertapError, match="'dogs/zz_broken.png'"):
        lt.extract_dataset("torchvision:resnet18", folder, out=tmp_path / "ray", **kw, dataset_options=replace(opts, engine="ray"))
    kept = json.loads((tmp_path / "ray" / "manifest.json").read_text())
    assert kept["status"] == "running" and len(kept["shards"]) == 3  # the other shards were written
    f = lt.extract_dataset("torchvision:resnet18", folder, out=tmp_path / "skip", **kw,
                           dataset_options=replace(opts, engine="ray", skip_bad=True))
    local = lt.extract_dataset("torchvision:resnet18", folder, out=tmp_path / "local", **kw,
                               dataset_options=replace(opts, skip_bad=True))
    assert [s["id"] for s in f.skipped] == ["dogs/zz_broken.png"] and f.ids == local.ids
    assert np.array_equal(np.asarray(f["layer2"]), np.asarray(local["layer2"]))  # a batch of 1 (beside the bad sample) too
    (folder / "dogs" / "zz_broken.png").unlink()
    resumed = lt.extract_dataset("torchvision:resnet18", folder, out=tmp_path / "ray", resume=True, **kw,
                                 dataset_options=replace(opts, engine="ray"))
    fresh = lt.extract_dataset("torchvision:resnet18", folder, out=tmp_path / "fresh", **kw, dataset_options=opts)
    assert resumed.ids == fresh.ids
    assert same_tree(tmp_path / "fresh", tmp_path / "ray") == []


def test_cli_joins_a_running_cluster_by_address(cluster, tmp_path):
    data = npy_folder(tmp_path / "data", n=5, shape=(3, 32, 32))
    address = ray.get_runtime_context().gcs_address
    args = ["extract", "torchvision:resnet18", "--tap", "layer3", "--data", str(data), "--pool", "mean", "--shard-size", "2"]
    r = run_cli(*args, "-o", str(tmp_path / "ray"), "--ray", address)
    assert r.returncode == 0, r.stderr
    assert "deprecated" not in r.stderr
    assert run_cli(*args, "-o", str(tmp_path / "local")).returncode == 0
    assert same_tree(tmp_path / "local", tmp_path / "ray") == []


def test_ray_refuses_an_iterator(cluster, tmp_path):
    with pytest.raises(LayertapError, match="engine='ray' needs data it can split"):
        lt.extract_dataset(torch.nn.Linear(2, 2), (np.zeros(2, np.float32) for _ in range(3)), taps=[""],
                           out=tmp_path / "o", dataset_options=lt.DatasetOptions(engine="ray", progress=False))


def test_a_driver_stopped_between_shards_leaves_only_shards_its_manifest_lists(cluster, tmp_path, monkeypatch):
    """Workers write each shard under a temporary name and the driver publishes it as it records it: a stop that
    lands as the second shard is recorded (the manifest write refused, as a signal makes it) leaves no shard on
    disk the manifest does not list (a worker still busy may leave a temporary one, which the resume removes),
    and a resume equals a fresh run."""
    from layertap.dataset.manifest import Manifest

    data = npy_folder(tmp_path / "data", n=10, shape=(3, 8, 8))
    kw = dict(taps=["layer1"], batch_size=2, pool="mean")
    opts = lt.DatasetOptions(shard_size=2, progress=False)
    recorded = Manifest.add_shard
    calls = []

    def stopped_at_the_second(self, record):
        calls.append(record["index"])
        if len(calls) == 2:
            self.shards[record["index"]] = record  # as add_shard does, before its write: then the stop
            raise KeyboardInterrupt
        recorded(self, record)

    monkeypatch.setattr(Manifest, "add_shard", stopped_at_the_second)
    out = tmp_path / "ray"
    with pytest.raises(KeyboardInterrupt):
        lt.extract_dataset("torchvision:resnet18", data, out=out, **kw, dataset_options=replace(opts, engine="ray"))
    monkeypatch.setattr(Manifest, "add_shard", recorded)
    listed = {s["file"] for s in json.loads((out / "manifest.json").read_text())["shards"]}
    shards = {p.name for p in out.iterdir() if p.name != "manifest.json" and not p.name.startswith(".")}
    assert shards == listed and len(listed) == 1
    resumed = lt.extract_dataset("torchvision:resnet18", data, out=out, resume=True, **kw,
                                 dataset_options=replace(opts, engine="ray"))
    fresh = lt.extract_dataset("torchvision:resnet18", data, out=tmp_path / "fresh", **kw, dataset_options=opts)
    assert resumed.ids == fresh.ids and same_tree(tmp_path / "fresh", out) == []
