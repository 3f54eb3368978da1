"""Extraction over a dataset: layertap vs a bare loop vs thingsvision, and peak memory vs dataset size.

resnet18 (random weights, seed 0), 512 samples of 3x112x112 float32 in .npy
files, batch 32, tap ``layer4`` mean-pooled (512 features per sample). Each
contender reads the same files and runs the same full forward on CPU:

- bare loop: np.load each file, stack, forward under inference_mode with a
  forward hook on layer4, mean over H and W; features kept in memory;
- layertap: ``lt.extract_dataset(..., pool="mean")`` into a fresh OUT_DIR
  (shards and manifest written), with 0 and 2 loader workers;
- thingsvision 2.7 ``PyTorchExtractor`` (the rival; installed with
  ``pip install --no-deps thingsvision``). Its package ``__init__`` imports
  TensorFlow, so only its PyTorch extractor modules are loaded, and
  ``torchtyping`` (used there for type annotations only) is stubbed when it is
  not installed. It keeps the unpooled maps; we pool them after;
- torchlens 2.x ``extract_dataset(..., pool="spatial_mean", output_dir=...)``
  (the rival with module addresses and shards on disk; the ``bench`` extra),
  read back with ``load_extraction``.

Then the peak RSS of layertap for 128 vs 512 samples, each in a fresh process.
Prints samples/s, the ratios and the RSS figures. Run:

    python benchmarks/bench_dataset.py [--samples 512] [--repeat 2]

``--rss-layer1 1000,2000,4000`` measures instead the peak RSS of unpooled
resnet50 ``layer1`` features (3.2 MB per sample) over that many JPEGs at the
default shard size (256MB), each size in a fresh process: it stays flat in the
dataset size.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np

BATCH = 32
SHAPE = (3, 112, 112)


def make_data(folder: Path, n: int) -> Path:
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        np.save(folder / f"s{i:05d}.npy", rng.standard_normal(SHAPE).astype(np.float32))
    return folder


def resnet18():
    import torch
    import torchvision

    torch.manual_seed(0)
    return torchvision.models.resnet18(weights=None).eval()


def bare_loop(model, folder: Path) -> np.ndarray:
    import torch

    files = sorted(folder.glob("*.npy"))
    got: dict = {}
    handle = model.layer4.register_forward_hook(lambda m, i, o: got.__setitem__("x", o))
    out = []
    try:
        with torch.inference_mode():
            for s in range(0, len(files), BATCH):
                x = torch.from_numpy(np.stack([np.load(f) for f in files[s : s + BATCH]]))
                model(x)
                out.append(got["x"].mean((2, 3)).numpy())
    finally:
        handle.remove()
    return np.concatenate(out)


def layertap_run(model, folder: Path, out: Path, workers: int) -> np.ndarray:
    import layertap as lt

    f = lt.extract_dataset(model, folder, taps=["layer4"], out=out, batch_size=BATCH, pool="mean",
                           dataset_options=lt.DatasetOptions(workers=workers, progress=False))
    return np.asarray(f["layer4"])


class _NpyFiles:
    def __init__(self, files: list[Path]) -> None:
        self.files = files

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        import torch

        return torch.from_numpy(np.load(self.files[i]))


def thingsvision_extractor(model):
    """thingsvision's PyTorchExtractor without its TensorFlow-importing package __init__."""
    spec = importlib.util.find_spec("thingsvision")
    if spec is None or spec.origin is None:
        return None
    root = Path(spec.origin).parent
    for name, sub in (("thingsvision", root), ("thingsvision.core", root / "core"),
                      ("thingsvision.core.extraction", root / "core" / "extraction"), ("thingsvision.utils", root / "utils")):
        if name not in sys.modules:
            mod = types.ModuleType(name)
            mod.__path__ = [str(sub)]
            sys.modules[name] = mod
    if importlib.util.find_spec("torchtyping") is None:
        stub = types.ModuleType("torchtyping")

        class TensorType:  # annotations only: TensorType["b", "c", "h", "w"]
            def __class_getitem__(cls, item):
                return cls

        stub.TensorType = TensorType  # type: ignore[attr-defined]
        sys.modules["torchtyping"] = stub
    from thingsvision.core.extraction.torch import PyTorchExtractor

    return PyTorchExtractor(model_name="resnet18", pretrained=False, device="cpu", model=model)


def thingsvision_run(extractor, folder: Path) -> np.ndarray:
    from torch.utils.data import DataLoader

    loader = DataLoader(_NpyFiles(sorted(folder.glob("*.npy"))), batch_size=BATCH)
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        feats = extractor.extract_features(batches=loader, module_name="layer4", flatten_acts=False, output_type="ndarray")
    return feats.mean((2, 3))


def torchlens_rates(model, folder: Path, tmp: Path, n: int, repeat: int, ref: np.ndarray) -> dict[str, tuple[float, float]]:
    """torchlens ``extract_dataset`` into shards on disk, mean-pooled by its own preset; checked against the bare loop."""
    if importlib.util.find_spec("torchlens") is None:
        print("torchlens: not installed (pip install -e '.[bench]')")
        return {}
    import torchlens as tl

    runs = iter(range(100))

    def run() -> np.ndarray:
        out = tmp / f"torchlens{next(runs)}"
        tl.extract_dataset(model, _NpyFiles(sorted(folder.glob("*.npy"))), ["layer4"], batch_size=BATCH,
                           output_dir=out, progress=False, pool="spatial_mean")
        loaded = tl.load_extraction(out)
        values = loaded.activations if hasattr(loaded, "activations") else loaded
        return np.asarray(next(iter(values.values())) if isinstance(values, dict) else values)

    rate, got = best_rate(run, n, repeat)
    np.testing.assert_allclose(got.reshape(len(ref), -1), ref, rtol=1e-4, atol=1e-4)
    return {f"torchlens {tl.__version__} extract_dataset": rate}


def best_rate(fn, n: int, repeat: int) -> tuple[tuple[float, float], np.ndarray]:
    """Best samples/s over ``repeat`` runs, by wall clock and by this process's CPU time.

    On a shared machine the wall clock mostly measures the neighbours; CPU time
    (all threads of this process; DataLoader worker processes not counted)
    shows the work each contender itself does.
    """
    wall, cpu, result = 0.0, 0.0, None
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        result = fn()
        wall = max(wall, n / (time.perf_counter() - t))
        cpu = max(cpu, n / (time.process_time() - c))
    return (wall, cpu), result  # type: ignore[return-value]


def peak_rss_child(folder: Path, n: int) -> float:
    """Peak RSS (MiB) of a fresh process that extracts the first ``n`` samples."""
    code = (
        "import json, resource, sys, tempfile, torch, torchvision, layertap as lt\n"
        "torch.manual_seed(0); m = torchvision.models.resnet18(weights=None).eval()\n"
        f"lt.extract_dataset(m, {str(folder)!r}, taps=['layer4'], out=tempfile.mkdtemp() + '/o', batch_size={BATCH}, "
        f"pool='mean', sample_options=lt.SampleOptions(limit={n}), "
        "dataset_options=lt.DatasetOptions(shard_size=64, progress=False))\n"
        "print(json.dumps(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(json.loads(r.stdout.strip().splitlines()[-1]))


def make_images(folder: Path, n: int, size: int = 256) -> Path:
    """``n`` JPEGs of ``size`` x ``size`` noise (seed 0), in one folder."""
    from PIL import Image

    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(folder / f"img{i:05d}.jpg", quality=90)
    return folder


_RSS_CHILD = """
import json, resource, sys, tempfile, time
import layertap as lt
folder, n, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with tempfile.TemporaryDirectory(dir=sys.argv[4]) as tmp:
    t = time.perf_counter()
    f = lt.extract_dataset("torchvision:resnet50", folder, taps=["layer1"], out=tmp + "/o", limit=n, batch_size=batch,
                           stop_early=True, progress=False)
    opts = f.manifest.header["options"]
    print(json.dumps({"rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "seconds": time.perf_counter() - t,
                      "shard_samples": opts["shard_samples"], "shards": len(f.manifest.data["shards"])}))
"""

_RSS_BARE = """
import json, resource, sys
import numpy as np, torch, torchvision
batch = int(sys.argv[1])
torch.manual_seed(0)
m = torchvision.models.resnet50(weights=None).eval()
with torch.inference_mode():
    x = torch.randn(batch, 3, 224, 224)
    h = m.layer1(m.maxpool(m.relu(m.bn1(m.conv1(x)))))
    keep = h.numpy().copy()
print(json.dumps({"rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def rss_layer1_child(folder: Path, n: int, batch: int) -> dict:
    """Peak RSS (MiB) of a fresh process that extracts unpooled ``layer1`` features of
    torchvision:resnet50 (256x56x56 float32: 3.2 MB per sample) from the first ``n`` images,
    at the default shard size (256MB), with ``stop_early`` (the layers after ``layer1`` hold
    smaller activations, so they set no peak; skipping them only saves time). The shards go
    to a temporary folder, removed after."""
    r = subprocess.run([sys.executable, "-c", _RSS_CHILD, str(folder), str(n), str(batch), str(folder.parent)],
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def rss_layer1(sizes: list[int], batch: int) -> None:
    """Peak RSS of unpooled resnet50 ``layer1`` extraction at the default shard size, per dataset size,
    next to a bare process that builds resnet50 and runs one batch to ``layer1`` (the floor)."""
    bare = subprocess.run([sys.executable, "-c", _RSS_BARE, str(batch)], capture_output=True, text=True, check=True)
    floor = json.loads(bare.stdout.strip().splitlines()[-1])["rss_mib"]
    with tempfile.TemporaryDirectory() as tmp:
        folder = make_images(Path(tmp) / "images", max(sizes))
        print(f"resnet50 layer1 unpooled (3.2 MB per sample), JPEGs 256x256, batch {batch}, shard size 256MB (default); "
              f"bare forward of one batch: {floor:.0f} MiB")
        for n in sizes:
            r = rss_layer1_child(folder, n, batch)
            print(f"{n:6d} samples: peak RSS {r['rss_mib']:6.0f} MiB, {r['shards']} shards of {r['shard_samples']} samples, "
                  f"{r['seconds']:.0f} s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--rss-layer1", metavar="N,N", default=None,
                   help="only measure the peak RSS of unpooled resnet50 layer1 extraction for these dataset sizes (e.g. 1000,2000,4000)")
    p.add_argument("--rss-batch", type=int, default=64, help="batch size of --rss-layer1 (default 64, extract's default)")
    a = p.parse_args()
    if a.rss_layer1:
        rss_layer1([int(n) for n in a.rss_layer1.split(",")], a.rss_batch)
        return
    import torch

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
          f"resnet18, {a.samples} x {'x'.join(map(str, SHAPE))} .npy, batch {BATCH}, layer4 mean-pooled")
    with tempfile.TemporaryDirectory() as tmp:
        folder = make_data(Path(tmp) / "data", a.samples)
        model = resnet18()
        with torch.inference_mode():
            model(torch.zeros(BATCH, *SHAPE))  # warm-up
        rates: dict[str, tuple[float, float]] = {}
        rates["bare loop"], ref = best_rate(lambda: bare_loop(model, folder), a.samples, a.repeat)
        runs = iter(range(100))
        for workers in (0, 2):
            rate, got = best_rate(lambda w=workers: layertap_run(model, folder, Path(tmp) / f"out{next(runs)}", w), a.samples, a.repeat)
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
            rates[f"layertap (workers={workers})"] = rate
        try:
            extractor = thingsvision_extractor(model)
        except Exception as e:  # noqa: BLE001 - report why the rival could not run
            extractor, why = None, f"{type(e).__name__}: {e}"
        else:
            why = "not installed (pip install --no-deps thingsvision)"
        if extractor is not None:
            rate, got = best_rate(lambda: thingsvision_run(extractor, folder), a.samples, a.repeat)
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
            rates["thingsvision 2.7 PyTorchExtractor"] = rate
        else:
            print(f"thingsvision: {why}")
        rates.update(torchlens_rates(model, folder, Path(tmp), a.samples, a.repeat, ref))
        base = rates["bare loop"]
        print(f"{'':36s} {'wall samples/s':>15s} {'x bare':>7s} {'CPU samples/s':>14s} {'x bare':>7s}")
        for name, (wall, cpu) in rates.items():
            print(f"{name:36s} {wall:15.1f} {wall / base[0]:7.2f} {cpu:14.1f} {cpu / base[1]:7.2f}")
        tv = rates.get("thingsvision 2.7 PyTorchExtractor")
        if tv:
            lt0 = rates["layertap (workers=0)"]
            print(f"layertap (workers=0) / thingsvision: {lt0[0] / tv[0]:.2f}x wall, {lt0[1] / tv[1]:.2f}x CPU")
        for name, (wall, cpu) in rates.items():
            if name.startswith("torchlens"):
                lt0 = rates["layertap (workers=0)"]
                print(f"layertap (workers=0) / {name}: {lt0[0] / wall:.2f}x wall, {lt0[1] / cpu:.2f}x CPU (samples/s)")
        small = peak_rss_child(folder, min(128, a.samples))
        large = peak_rss_child(folder, a.samples)
        print(f"peak RSS: {min(128, a.samples)} samples {small:.0f} MiB, {a.samples} samples {large:.0f} MiB "
              f"({(large / small - 1) * 100:+.1f}%; goal within 15%)")
    print(f"(this process: peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB)")


if __name__ == "__main__":
    main()
