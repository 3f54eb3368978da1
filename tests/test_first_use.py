"""First use: bad arguments fail fast (before torch), small CLI rules."""

from __future__ import annotations

import json
import subprocess
import sys

BAD_ARGUMENTS = [
    (["layers", "torchvision:resnet18", "--config", "c.json"], "--config applies to transformers:CLASS models only"),
    (["layers", "transformers:BertModel", "--config", "missing.json"], "--config file 'missing.json' does not exist"),
    (["layers", "transformers:BertModel", "--config", "list.json"], "holds a JSON list"),
    (["layers", "transformers:BertModel", "--config", "broken.json"], "cannot read --config 'broken.json' as JSON"),
    (["layers", "torchvision"], "bad MODEL 'torchvision'"),
    (["layers", "missing.py:Net"], "model file 'missing.py' does not exist"),
    (["layers", "torchvison:resnet18"], "did you mean: torchvision:..."),
    (["layers", "torchvision:resnet18", "--weights", "w.pt"], "weights file 'w.pt' does not exist"),
    (["layers", "torchvision:resnet18", "--input", "1xax3"], "1xax3"),
    (["extract", "torchvision:resnet18", "--tap", "layer1[", "-o", "x.npz"], "layer1["),
    (["extract", "torchvision:resnet18", "--tap", "layer1", "-o", "nodir/x.npz"], "nodir"),
    (["export", "torchvision:resnet18", "-o", "x.txt"], "x.txt"),
    (["compare", "torchvision:resnet18", "missing.onnx"], "'missing.onnx' does not exist"),
]


def test_bad_arguments_fail_before_torch_is_imported(tmp_path):
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "broken.json").write_text("{")
    code = (
        "import contextlib, io, json, sys\n"
        "from layertap.cli.main import main\n"
        "out = []\n"
        f"for argv in {json.dumps([a for a, _ in BAD_ARGUMENTS])}:\n"
        "    err = io.StringIO()\n"
        "    with contextlib.redirect_stderr(err):\n"
        "        rc = main(argv)\n"
        "    out.append([rc, 'torch' in sys.modules, err.getvalue()])\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for (argv, fragment), (rc, torch_loaded, err) in zip(BAD_ARGUMENTS, json.loads(proc.stdout)):
        assert rc == 2, (argv, err)
        assert err.startswith("layertap: error: ") and err.count("\n") == 1, (argv, err)
        assert fragment in err, (argv, err)
        assert not torch_loaded, (argv, "torch was imported before the check failed")
