"""GPU check: resnet50 (random weights, seed 0) exported once, then the same file compared layer by
layer on ONNX Runtime's CPU provider vs CUDA, vs TensorRT (float32) and vs TensorRT with float16
kernels (``trt_fp16_enable``); the PyTorch side on the CUDA device (taps, and a compare of the model
there against the file in ORT on the CPU); and a small feature extraction on the CUDA device.

Needs a machine with an NVIDIA GPU, ``onnxruntime-gpu`` (its CUDA/TensorRT providers) and a CUDA
build of torch. Whatever is missing is skipped with a ``skipped: ...`` line, and the script still
exits 0; it exits 1 only when something that ran went wrong.

For each comparison it prints the providers each ONNX Runtime session really used
(``session.get_providers()``: ORT drops a provider that fails to load and runs on CPU without
raising), the wall time, the ORT runs, the row counts and the first divergence with its error.
layertap takes provider names; TensorRT's options are added here when each session is created.

Run:
    python benchmarks/gpu_check.py [--batch 1] [--size 224] [--images 64]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

CPU, CUDA, TRT = "CPUExecutionProvider", "CUDAExecutionProvider", "TensorrtExecutionProvider"
SHORT = {CPU: "CPU", CUDA: "CUDA", TRT: "TensorRT"}


class SessionLog:
    """Records the providers every ORT session of this process really got, and hands TensorRT
    its options (``trt_fp16_enable``) while :attr:`trt_options` is set."""

    def __init__(self) -> None:
        self.used: list[tuple[str, ...]] = []
        self.trt_options: dict[str, str] = {}

    def install(self) -> None:
        import onnxruntime as ort

        log, base = self, ort.InferenceSession

        class LoggedSession(base):  # type: ignore[misc, valid-type]
            def __init__(self, path_or_bytes, sess_options=None, providers=None, provider_options=None, **kw):
                if providers and log.trt_options and provider_options is None:
                    provider_options = [dict(log.trt_options) if p == TRT else {} for p in providers]
                super().__init__(path_or_bytes, sess_options, providers, provider_options, **kw)
                log.used.append(tuple(self.get_providers()))

        ort.InferenceSession = LoggedSession

    def take(self) -> str:
        """The provider lists used since the last call, with how many sessions used each."""
        counts, self.used = Counter(self.used), []
        return "; ".join(f"{n} session(s) on {'+'.join(SHORT.get(p, p) for p in ps)}"
                         for ps, n in counts.items()) or "no session"


def _loads(provider: str, path: Path) -> bool:
    """Whether ORT really puts ``provider`` on a session of the file (listed is not enough)."""
    import onnxruntime as ort

    return provider in ort.InferenceSession(str(path), providers=[provider, CPU]).get_providers()


def compare_on(path: Path, x, cand: str, fp16: bool, log: SessionLog) -> None:
    import layertap as lt

    log.trt_options = {"trt_fp16_enable": "True"} if fp16 else {}
    label = f"CPU vs {SHORT.get(cand, cand)}{' fp16' if fp16 else ''}"
    t0 = time.perf_counter()
    report = lt.compare(path, {"x": x}, path, runtime_options=lt.RuntimeOptions(providers=[CPU], cand_providers=[cand]))
    took = time.perf_counter() - t0
    row = report.first_divergence_row
    where = f"{row.name} (rel {row.rel_err:.2e}, max abs {row.max_abs:.2e})" if row else "none"
    out = report.rows[-1]
    print(f"{label:22s} {took:7.1f} s, ORT runs {report.ort_runs}, {report.counts()}, "
          f"output rel {out.rel_err:.2e}, first divergence {where}")
    print(f"{'':22s} sessions: {log.take()}")
    log.trt_options = {}


def extract_on(device: str, n: int, size: int) -> None:
    import numpy as np
    import torch
    import torchvision

    import layertap as lt

    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None).eval()
    data = [np.random.default_rng(i).standard_normal((3, size, size)).astype(np.float32) for i in range(n)]
    with tempfile.TemporaryDirectory(prefix="gpu-check-feats-") as d:
        opts = dict(taps=["layer2", "layer4"], batch_size=16, pool="mean", dataset_options=lt.DatasetOptions(progress=False))
        t0 = time.perf_counter()
        gpu = lt.extract_dataset(model, data, out=Path(d) / device, device=device, **opts)
        took = time.perf_counter() - t0
        cpu = lt.extract_dataset(model, data[:16], out=Path(d) / "cpu-16", device="cpu", **opts)
        diff = {t: float(np.abs(gpu[t][:16] - cpu[t][:]).max() / np.abs(cpu[t][:]).max()) for t in ("layer2", "layer4")}
        print(f"extract_dataset        {took:7.1f} s for {len(gpu)} samples ({len(gpu) / took:.1f}/s), device "
              f"{gpu.manifest.data['options']['device']} ({torch.cuda.get_device_name(0) if device != 'cpu' else 'CPU'}); first 16 vs CPU, "
              f"rel: {', '.join(f'{t} {v:.1e}' for t, v in diff.items())}")


def torch_side_on(device: str, path: Path, x) -> None:
    """The PyTorch side on ``device``: taps and a compare of the model there against its file in ORT on
    the CPU (the module outputs come back to the host as copies), each against the same on the CPU."""
    import numpy as np
    import torch
    import torchvision

    import layertap as lt

    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None).eval()
    xt = torch.from_numpy(x)
    taps = ["layer1", "layer3.2", "fc"]
    on_cpu = lt.extract(model, xt, taps=taps)
    t0 = time.perf_counter()
    there = lt.extract(model.to(device), xt.to(device), taps=taps)
    took = time.perf_counter() - t0
    rel = {t: float((there[t].cpu() - on_cpu[t]).abs().max() / on_cpu[t].abs().max()) for t in taps}
    print(f"extract on {device:11s} {took:7.1f} s, {', '.join(f'{t} rel {v:.1e}' for t, v in rel.items())}; "
          f"values on {there[taps[0]].device}")
    t0 = time.perf_counter()
    report = lt.compare(model, xt.to(device), path)
    took = time.perf_counter() - t0
    out = report.rows[-1]
    print(f"compare on {device:11s} {took:7.1f} s, ok={report.ok}, {report.counts()}, output rel {out.rel_err:.2e}, "
          f"first divergence {report.first_divergence or 'none'}")
    if not report.ok or not np.isfinite(out.rel_err):
        raise SystemExit(f"compare of the model on {device} against its file failed")
    model.to("cpu")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--images", type=int, default=64, help="samples for the extract_dataset check")
    ns = p.parse_args()
    import onnxruntime as ort

    available = ort.get_available_providers()
    print(f"onnxruntime {ort.__version__}, providers: {', '.join(available)}")
    wanted = [c for c in (CUDA, TRT) if c in available]
    for c in (CUDA, TRT):
        if c not in available:
            print(f"skipped: no {SHORT[c]} provider (install onnxruntime-gpu; "
                  f"{'TensorRT also needs the TensorRT libraries' if c == TRT else 'it needs CUDA 12 and cuDNN 9'})")
    import torch

    if not torch.cuda.is_available():
        print("skipped: extract_dataset, extract and compare on cuda (torch.cuda.is_available() is False)")
    if not wanted and not torch.cuda.is_available():
        return 0
    log = SessionLog()
    log.install()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as d:
        import numpy as np
        import torchvision

        torch.manual_seed(0)
        path = Path(d) / "resnet50.onnx"
        x = np.random.default_rng(1).standard_normal((ns.batch, 3, ns.size, ns.size)).astype(np.float32)
        torch.onnx.export(torchvision.models.resnet50(weights=None).eval(), (torch.from_numpy(x),), str(path),
                          dynamo=True, input_names=["x"])
        for cand in wanted:
            if not _loads(cand, path):
                print(f"skipped: {cand} is listed but did not load (ORT's warning above says why)")
                continue
            log.take()
            for fp16 in (False, True) if cand == TRT else (False,):
                compare_on(path, x, cand, fp16, log)
        if torch.cuda.is_available():
            torch_side_on("cuda", path, x)
    if torch.cuda.is_available():
        extract_on("cuda", ns.images, ns.size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
