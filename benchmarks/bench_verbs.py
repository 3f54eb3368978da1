"""One verb per process, for timing two checkouts of layertap against each other (a change's before and after).

``prepare DIR`` writes the files once (resnet18 at 64x64 with random weights: its ONNX file and float16
copy, a float32 ExecuTorch program, a small net whose float16 file overflows for ``fix``); each other verb
then runs once, as a user's command does, imports included:

* ``compare``: ``lt.compare(model, x, r18.onnx)``, a PyTorch reference
* ``compare-files``: ``lt.compare(r18.onnx, None, r18-fp16.onnx)``, judged at float16
* ``compare-program``: ``lt.compare(model, x, r18.pte)``, module rows from the program lowered again
* ``run``: ``lt.run(r18.onnx, taps=[4 modules])``
* ``taps``: ``lt.extract(model, x, taps=[10 modules])``; ``stop-early``: the same at layer2 with ``stop_early``
* ``fix``: ``lt.fix(overflow.onnx, to="fp16")``, every set converted and run

Time both checkouts pair by pair with farm-bench (the ratio new/old per pair)::

    PYTHONPATH=NEW/src farm-bench -n 5 --vs "env PYTHONPATH=OLD/src python benchmarks/bench_verbs.py compare DIR" \\
        -- python benchmarks/bench_verbs.py compare DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

TAPS = ["conv1", "layer1.0", "layer1.1", "layer2.0", "layer2.1", "layer3.0", "layer3.1", "layer4.0", "layer4.1",
        "avgpool"]


def _model():
    import torch
    import torchvision

    torch.manual_seed(0)
    return torchvision.models.resnet18().eval(), torch.randn(1, 3, 64, 64)


def prepare(folder: Path) -> None:
    import onnx
    import torch
    from onnxconverter_common import float16

    import layertap as lt

    folder.mkdir(parents=True, exist_ok=True)
    model, x = _model()
    torch.onnx.export(model, (x,), str(folder / "r18.onnx"), dynamo=False)
    onnx.save(float16.convert_float_to_float16(onnx.load(str(folder / "r18.onnx")), keep_io_types=True),
              str(folder / "r18-fp16.onnx"))
    lt.export(model, x, folder / "r18.pte")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.LayerNorm(32),
                              torch.nn.Linear(32, 8)).eval()
    with torch.no_grad():
        net[2].weight.mul_(3e5)  # its float16 output overflows: fix has a module to keep
    torch.onnx.export(net, (torch.randn(2, 16),), str(folder / "overflow.onnx"), dynamo=False)


def main(verb: str, folder: Path) -> None:
    if verb == "prepare":
        return prepare(folder)
    import layertap as lt

    if verb == "compare-files":
        lt.compare(folder / "r18.onnx", None, folder / "r18-fp16.onnx")
    elif verb == "run":
        lt.run(folder / "r18.onnx", taps=TAPS[1:5])
    elif verb == "fix":
        lt.fix(folder / "overflow.onnx", to="fp16", out=None, samples=4)
    else:
        model, x = _model()
        if verb == "compare":
            lt.compare(model, x, folder / "r18.onnx")
        elif verb == "compare-program":
            lt.compare(model, x, folder / "r18.pte")
        elif verb == "taps":
            lt.extract(model, x, taps=TAPS)
        elif verb == "stop-early":
            lt.extract(model, x, taps=["layer2"], stop_early=True)
        else:
            raise SystemExit(f"unknown verb {verb!r}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], Path(sys.argv[2]))
