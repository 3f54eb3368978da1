"""Hostile inputs that threaten the user's data: data loss, exit codes, resources, security.

Every case checks what ``test_hostile.py`` checks (exit status, exactly one
``layertap: error:`` line, no traceback, no partial or temporary file left,
inputs byte-identical) and, where an earlier output exists, that it is intact.
Concurrency, signal and disk-full cases run the CLI in subprocesses.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from layertap.cli.main import main

SRC = str(Path(__file__).resolve().parents[1] / "src")

TINY_PY = textwrap.dedent(
    """
    import torch
    from torch import nn

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))

        def forward(self, x):
            return self.body(x)

    class Keys(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 2)

        def forward(self, x):
            y = self.lin(x)
            return {1: y, "1": y + 1}

    def make():
        torch.manual_seed(0)
        return Tiny()

    def keys():
        return Keys()
    """
)


# -- building blocks ---------------------------------------------------------
def tiny_file(tmp: Path, extra: str = "") -> str:
    path = tmp / "tiny.py"
    path.write_text(TINY_PY + textwrap.dedent(extra))
    return str(path)


def matmul_model(folder: Path, *, name: str = "m.onnx", data: str | None = None, seed: int = 0,
                 size: int = 3, doc_bytes: int = 0) -> Path:
    """Y = relu(X @ W), X 2 x size; W in ``data`` (external) when given."""
    folder.mkdir(parents=True, exist_ok=True)
    w = np.random.default_rng(seed).standard_normal((size, size)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["X", "W"], ["H"], name="mm"), helper.make_node("Relu", ["H"], ["Y"], name="relu")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, size])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, size])],
                          initializer=[numpy_helper.from_array(w, "W")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    if doc_bytes:
        m.doc_string = "d" * doc_bytes
    path = folder / name
    if data is None:
        onnx.save(m, str(path))
    else:
        onnx.save_model(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data, size_threshold=0)
    return path


def ort_run(path: Path, x: np.ndarray | None = None) -> np.ndarray:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    x = np.ones([d if isinstance(d, int) else 1 for d in inp.shape], np.float32) if x is None else x
    return sess.run(None, {inp.name: x})[0]


def hash_tree(root: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


def leftovers(root: Path) -> list[str]:
    """Temporary files and folders layertap makes (``.NAME.XXXX.tmp``, ``.NAME.XXXX/``)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob(".*") if p.name.endswith(".tmp") or p.is_dir())


def one_error(code: int, err: str, out: str = "", *, expect: str = "", status: int = 2) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == status, f"exit {code}, stderr={err!r}"
    assert len(lines) == 1, f"expected one line, got {err!r}"
    assert lines[0].startswith("layertap: error: "), lines[0]
    assert "Traceback" not in err + out
    assert expect.lower() in lines[0].lower(), f"{lines[0]!r} lacks {expect!r}"
    return lines[0]


def refused(tmp: Path, argv: list[str], capsys, *, expect: str = "", status: int = 2,
            intact: tuple[Path, ...] = ()) -> str:
    """Run ``argv`` in-process; check the usual promises; return the error line."""
    before = hash_tree(tmp)
    code = main(argv)
    cap = capsys.readouterr()
    line = one_error(code, cap.err, cap.out, expect=expect, status=status)
    assert not leftovers(tmp), leftovers(tmp)
    after = hash_tree(tmp)
    assert {k: v for k, v in after.items() if k in before} == before, "an input or earlier output changed"
    for p in intact:
        assert p.exists(), f"{p} was removed"
    return line


def cli(*args: str, timeout: int = 300, preexec=None, env: dict | None = None, cwd: str | None = None):
    return subprocess.run([sys.executable, "-m", "layertap", *args], capture_output=True, text=True, timeout=timeout,
                          preexec_fn=preexec, env={**os.environ, "PYTHONPATH": SRC, **(env or {})}, cwd=cwd)


# -- 1. an output is never a file the command reads ------------------------------
def test_extract_weights_as_output(tmp_path, capsys):
    import torch
    from safetensors.torch import save_file

    spec = tiny_file(tmp_path) + ":make"
    weights = tmp_path / "W.safetensors"
    save_file({k: v.contiguous() for k, v in _tiny_state(torch).items()}, str(weights))
    line = refused(tmp_path, ["extract", spec, "--weights", str(weights), "--tap", "body.0", "--input", "2x4",
                              "-o", str(weights)], capsys, expect="--weights")
    assert "input file" in line


def _tiny_state(torch):
    from torch import nn

    torch.manual_seed(0)
    seq = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    return {f"body.{k}": v for k, v in seq.state_dict().items()}


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
@pytest.mark.parametrize("what", ["--input", "--config", "MODEL", "--weights"])
def test_output_links_to_an_input(tmp_path, capsys, what, link):
    """Resolved paths catch symlinks, ``samefile`` catches hard links; suffixes cannot hide an input."""
    spec_file = tiny_file(tmp_path)
    npy = tmp_path / "x.npy"
    np.save(npy, np.ones((2, 4), np.float32))
    config = tmp_path / "cfg.json"
    config.write_text("{}")
    weights = tmp_path / "w.pt"
    weights.write_bytes(b"not read: the output check comes first")
    target = {"--input": npy, "--config": config, "MODEL": Path(spec_file), "--weights": weights}[what]
    out = tmp_path / "out.npz"
    (os.symlink if link == "symlink" else os.link)(target, out)
    argv = ["extract", spec_file + ":make", "--tap", "body.0", "-o", str(out), "--input", str(npy)]
    argv += {"--config": ["--config", str(config)], "--weights": ["--weights", str(weights)]}.get(what, [])
    refused(tmp_path, argv, capsys, expect="input file", intact=(target,))


def test_add_outputs_onto_external_data_of_input(tmp_path, capsys):
    src = matmul_model(tmp_path, data="weights.onnx")
    expected = ort_run(src)
    refused(tmp_path, ["add-outputs", str(src), "-o", str(tmp_path / "weights.onnx"), "--tensor", "H"], capsys,
            expect="external data")
    np.testing.assert_array_equal(ort_run(src), expected)


def test_run_onto_external_data_of_input(tmp_path, capsys):
    src = matmul_model(tmp_path, data="w.npz")
    refused(tmp_path, ["run", str(src), "--input", "X=2x3", "-o", str(tmp_path / "w.npz")], capsys, expect="external data")


def test_python_api_refuses_external_data_as_output(tmp_path):
    import layertap as lt
    from layertap.errors import LayertapError

    src = matmul_model(tmp_path, data="w.onnx")
    before = hash_tree(tmp_path)
    with pytest.raises(LayertapError, match="external data"):
        lt.add_outputs(src, tmp_path / "w.onnx", tensors=["H"])
    assert hash_tree(tmp_path) == before


def test_read_files_do_not_leak_between_commands(tmp_path, capsys):
    """The record is per command: a file read by one command may be written by the next."""
    src = matmul_model(tmp_path / "a")
    out = tmp_path / "a" / "t.onnx"
    assert main(["add-outputs", str(src), "-o", str(out), "--tensor", "H"]) == 0
    assert main(["add-outputs", str(out), "-o", str(tmp_path / "a" / "u.onnx"), "--tensor", "Y"]) == 0
    assert main(["add-outputs", str(src), "-o", str(out), "--tensor", "H"]) == 0
    capsys.readouterr()


# -- 3. colliding output names -------------------------------------------------
@pytest.mark.parametrize("factory, tap, expect", [
    ("make", "output=body.0", "'output'"),  # a tap alias equal to the model's output
    ("keys", "lin", "output[1]"),           # a result {1: a, "1": b}
])
def test_extract_colliding_names(tmp_path, capsys, factory, tap, expect):
    spec = tiny_file(tmp_path) + ":" + factory
    out = tmp_path / "a.npz"
    refused(tmp_path, ["extract", spec, "--tap", tap, "--input", "2x4", "-o", str(out)], capsys, expect=expect)
    assert not out.exists()


def test_npz_member_names_are_safe(tmp_path, capsys):
    """13: a tensor named like a path cannot become a path-traversal zip member."""
    import zipfile

    folder = tmp_path / "m"
    src = matmul_model(folder)
    proto = onnx.load(str(src))
    for n in proto.graph.node:
        n.output[:] = ["../../x" if o == "H" else o for o in n.output]
        n.input[:] = ["../../x" if i == "H" else i for i in n.input]
    onnx.save(proto, str(src))
    out = folder / "acts.npz"
    assert main(["run", str(src), "--tap", "../../x", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert "'../../x' is saved under the key '%2E%2E/%2E%2E/x'" in " ".join(err.split())
    with zipfile.ZipFile(out) as z:
        assert z.namelist() == ["output.npy", "%2E%2E/%2E%2E/x.npy"]
        z.extractall(folder / "unzipped")
    assert sorted(p.name for p in folder.rglob("*.npy")) == ["output.npy", "x.npy"]
    assert (folder / "unzipped" / "%2E%2E" / "%2E%2E" / "x.npy").is_file()  # inside the folder


def test_npz_keys_are_the_onnx_tensor_names(tmp_path, capsys):
    """A TorchScript tensor name (leading '/') is the key np.load takes; unzipped, it stays in the folder."""
    import zipfile

    import torch

    from _tiny import small_cnn

    src = tmp_path / "cnn.onnx"
    torch.onnx.export(small_cnn(), (torch.zeros(1, 3, 16, 16),), str(src), dynamo=False)
    name = "/block/block.2/Relu_output_0"
    out = tmp_path / "acts.npz"
    assert main(["run", str(src), "--tap", name, "--tap", "stem", "-o", str(out)]) == 0
    assert "saved under the key" not in capsys.readouterr().err
    import layertap as lt

    want = lt.run(src, taps=[name, "stem"])
    with np.load(out) as saved:
        assert saved.files == ["output", name, "stem"]
        np.testing.assert_array_equal(saved[name], want[name])
        np.testing.assert_array_equal(saved["stem"], want["stem"])
    with zipfile.ZipFile(out) as z:
        z.extractall(tmp_path / "unzipped")
    assert (tmp_path / "unzipped" / "block" / "block.2" / "Relu_output_0.npy").is_file()


def test_npz_keys_named_like_savez_parameters(tmp_path, capsys):
    spec = tiny_file(tmp_path) + ":make"
    out = tmp_path / "a.npz"
    assert main(["extract", spec, "--tap", "file=body.0", "--tap", "allow_pickle=body.2", "--input", "2x4",
                 "-o", str(out)]) == 0
    capsys.readouterr()
    with np.load(out) as saved:
        assert saved.files == ["file", "allow_pickle", "output"]
        np.testing.assert_array_equal(saved["allow_pickle"], saved["output"])


# -- 4. permissions ------------------------------------------------------------
def test_replacing_an_output_keeps_its_mode(tmp_path, capsys):
    src = matmul_model(tmp_path / "m")
    onnx_out, npz_out = tmp_path / "m" / "t.onnx", tmp_path / "m" / "a.npz"
    ext, pair = matmul_model(tmp_path / "e", data="w.bin"), tmp_path / "p" / "t.onnx"
    pair.parent.mkdir()
    argv = ["add-outputs", str(ext), "-o", str(pair), "--tensor", "H"]
    assert main(argv) == 0
    pair.chmod(0o600)
    assert main(argv) == 0
    assert {stat.S_IMODE(p.stat().st_mode) for p in pair.parent.iterdir()} == {0o600}  # the new data file too
    for argv, out in ((["add-outputs", str(src), "-o", str(onnx_out), "--tensor", "H"], onnx_out),
                      (["run", str(src), "-o", str(npz_out)], npz_out)):
        assert main(argv) == 0
        out.chmod(0o600)
        assert main(argv) == 0
        assert stat.S_IMODE(out.stat().st_mode) == 0o600
    capsys.readouterr()


# -- 2. an .onnx and its data change as one unit -------------------------------------
def _pair_ok(out: Path, src: Path) -> None:
    """``out`` loads with its own data and computes what ``src`` computes."""
    np.testing.assert_array_equal(ort_run(out), ort_run(src))


def test_replacing_keeps_earlier_pair_until_the_new_one_is_complete(tmp_path, capsys):
    a = matmul_model(tmp_path / "a", data="w.bin", seed=1)
    b = matmul_model(tmp_path / "b", data="w.bin", seed=2)
    out = tmp_path / "out" / "t.onnx"
    out.parent.mkdir()
    for src in (a, b, a):
        assert main(["add-outputs", str(src), "-o", str(out), "--tensor", "H"]) == 0
        _pair_ok(out, src)
        # exactly the data file the .onnx names is left: the replaced one was removed after
        assert sorted(p.name for p in out.parent.iterdir()) == sorted({"t.onnx", *_locations(out)})
    capsys.readouterr()


def _locations(path: Path) -> set[str]:
    from layertap.onnxfile.publish import external_locations

    return external_locations(onnx.load(str(path), load_external_data=False))


def test_export_replacing_external_pair(tmp_path):
    """lt.export publishes the same way: the earlier pair stays whole, its old data goes after."""
    import torch

    import layertap as lt

    out = tmp_path / "e.onnx"
    for seed in (0, 1):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU()).eval()
        x = torch.randn(2, 4)
        lt.export(model, x, out, ["0"], exporter="torchscript", dynamic_batch=False, export_options=lt.ExportOptions(external_data=True))
        got = ort_run(out, x.numpy())
        np.testing.assert_allclose(got, model(x).detach().numpy(), rtol=1e-5, atol=1e-6)
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted({"e.onnx", *_locations(out)})


def _fsize_limit(limit: int):
    def apply():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


@pytest.fixture(params=["tmpfs", "rlimit"])
def small_disk(request, tmp_path):
    """(folder, mounted): a 256 KiB tmpfs (where this machine lets us mount one), or a plain
    folder whose writers get RLIMIT_FSIZE."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    mounted = False
    if request.param == "tmpfs":
        mounted = os.geteuid() == 0 and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True).returncode == 0
        if not mounted:
            pytest.skip("cannot mount a tmpfs here (needs root); the rlimit variant covers the mechanism")
    try:
        yield mnt, mounted
    finally:
        if mounted:
            subprocess.run(["umount", str(mnt)], check=False)


@pytest.mark.parametrize("fails_at", ["data copy", "onnx write"])
def test_disk_full_keeps_previous_pair(tmp_path, small_disk, fails_at):
    """2: ENOSPC (tmpfs) or EFBIG (RLIMIT_FSIZE) while replacing: the earlier t.onnx still loads."""
    disk, mounted = small_disk
    if fails_at == "data copy":  # 40 KiB of data each: the second copy does not fit in 20 KiB
        first_kw = second_kw = dict(size=100)
    else:                        # 4 KiB of data fits, a 100 KiB graph does not
        first_kw, second_kw = dict(size=32), dict(size=32, doc_bytes=100 << 10)
    small = matmul_model(tmp_path / "small", data="w.bin", seed=1, **first_kw)
    big = matmul_model(tmp_path / "big", data="w.bin", seed=2, **second_kw)
    out = disk / "t.onnx"
    first = cli("add-outputs", str(small), "-o", str(out), "--tensor", "H")
    assert first.returncode == 0, first.stderr
    preexec = None
    if mounted:  # leave 20 KiB free
        st = os.statvfs(disk)
        (disk / "filler").write_bytes(b"\0" * max(0, st.f_bavail * st.f_frsize - (20 << 10)))
    else:
        preexec = _fsize_limit(20 << 10)
    before = hash_tree(disk)
    second = cli("add-outputs", str(big), "-o", str(out), "--tensor", "H", preexec=preexec)
    one_error(second.returncode, second.stderr, second.stdout)
    assert hash_tree(disk) == before
    assert not leftovers(disk)
    _pair_ok(out, small)


def test_concurrent_writers_never_mix(tmp_path):
    """2: two add-outputs to one -o at once: t.onnx and its data always come from the same run."""
    a = matmul_model(tmp_path / "a", data="w.bin", seed=1, size=512)   # 1 MiB of data: copies overlap
    b = matmul_model(tmp_path / "b", data="w.bin", seed=2, size=512)
    out = tmp_path / "out" / "t.onnx"
    out.parent.mkdir()
    env = {**os.environ, "PYTHONPATH": SRC}
    x = np.ones((2, 512), np.float32)
    want = {ort_run(a, x).tobytes(), ort_run(b, x).tobytes()}
    for _ in range(3):
        procs = [subprocess.Popen([sys.executable, "-m", "layertap", "add-outputs", str(src), "-o", str(out), "--tensor", "H"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) for src in (a, b)]
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
        assert ort_run(out, x).tobytes() in want
        assert sorted(q.name for q in out.parent.iterdir()) == sorted({"t.onnx", *_locations(out)})
        assert not leftovers(out.parent)


# -- 5. SIGTERM and SIGHUP clean up like SIGINT ----------------------------------------
SIGNAL_AFTER = textwrap.dedent(
    """
    import importlib, os, signal, sys
    module, attr, sig = sys.argv[1:4]
    target = importlib.import_module(module)
    original = getattr(target, attr)

    def hooked(*args, **kwargs):
        result = original(*args, **kwargs)
        os.kill(os.getpid(), getattr(signal, sig))  # arrives while the temporary files exist
        return result

    setattr(target, attr, hooked)
    from layertap.cli.main import main
    sys.exit(main(sys.argv[4:]))
    """
)


def _signalled(tmp: Path, module: str, attr: str, sig: str, argv: list[str]):
    script = tmp / "signal_after.py"
    script.write_text(SIGNAL_AFTER)
    return subprocess.run([sys.executable, str(script), module, attr, sig, *argv], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": SRC})


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_signal_during_data_copy_cleans_up(tmp_path, sig):
    src = matmul_model(tmp_path / "a", data="w.bin", seed=1)
    out = tmp_path / "out" / "t.onnx"
    out.parent.mkdir()
    assert cli("add-outputs", str(src), "-o", str(out), "--tensor", "H").returncode == 0
    before = hash_tree(tmp_path)
    other = matmul_model(tmp_path / "b", data="w.bin", seed=2)
    before = {**before, **hash_tree(tmp_path / "b")}
    r = _signalled(tmp_path, "layertap.onnxfile.outputs", "copy_data", sig, ["add-outputs", str(other), "-o", str(out), "--tensor", "Y"])
    one_error(r.returncode, r.stderr, r.stdout, expect=sig, status=128 + getattr(signal, sig))
    assert not leftovers(tmp_path)
    assert {k: v for k, v in hash_tree(tmp_path).items() if k in before} == before
    _pair_ok(out, src)


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_signal_during_export_removes_work_folder(tmp_path, sig):
    spec = tiny_file(tmp_path) + ":make"
    out = tmp_path / "e.onnx"
    r = _signalled(tmp_path, "layertap.exporting.export", "_finish_graph", sig,
                   ["export", spec, "--input", "2x4", "--exporter", "torchscript", "-o", str(out)])
    one_error(r.returncode, r.stderr, r.stdout, expect=sig, status=128 + getattr(signal, sig))
    assert not out.exists()
    assert not leftovers(tmp_path), leftovers(tmp_path)


HELD_IN = textwrap.dedent(
    """
    import importlib, sys, time
    from pathlib import Path
    module, attr, gate, drops = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4] == "drops"
    target = importlib.import_module(module)
    original = getattr(target, attr)

    def wait_for_gate():
        while not (gate / "open").exists():
            time.sleep(0.01)

    def held(*args, **kwargs):
        # a long native call the test signals: with "drops", one whose library then catches what the
        # signal raised and goes on, as torch.onnx.export does when it tries its next capture strategy
        (gate / "ready").touch()
        try:
            wait_for_gate()
        except BaseException as e:
            if not drops:
                raise
            (gate / "dropped").write_text(type(e).__name__)
        wait_for_gate()
        return original(*args, **kwargs)

    setattr(target, attr, held)
    from layertap.cli.main import main
    sys.exit(main(sys.argv[5:]))
    """
)


def _signalled_inside(tmp: Path, module: str, attr: str, sig: str, drops: bool, argv: list[str]):
    """Run ``layertap ARGV`` with ``module.attr`` held at a gate; send ``sig`` while it waits there. A
    dropped signal is acknowledged before the gate opens; one that is not must end the command by itself."""
    gate = tmp / "gate"
    gate.mkdir()
    script = tmp / "held_in.py"
    script.write_text(HELD_IN)
    proc = subprocess.Popen([sys.executable, str(script), module, attr, str(gate), "drops" if drops else "raises", *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": SRC})
    try:
        _until(proc, gate / "ready")
        proc.send_signal(getattr(signal, sig))
        if drops:
            _until(proc, gate / "dropped")
            (gate / "open").touch()
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out, err


def _until(proc: subprocess.Popen, path: Path) -> None:
    """Wait for the held child to make ``path``; the time limit only keeps a broken run from hanging."""
    deadline = time.monotonic() + 120
    while not path.exists():
        assert proc.poll() is None, f"exit {proc.returncode} before {path.name}: {proc.stderr.read() if proc.stderr else ''}"
        assert time.monotonic() < deadline, f"the child never made {path.name}"
        time.sleep(0.01)


SIGNALS_INSIDE = [("SIGINT", True), ("SIGTERM", True), ("SIGINT", False)]


@pytest.mark.parametrize(("sig", "drops"), SIGNALS_INSIDE, ids=["SIGINT-dropped", "SIGTERM-dropped", "SIGINT"])
def test_signal_inside_the_data_copy_stops_add_outputs(tmp_path, sig, drops):
    """A signal that lands while add-outputs copies the external data, even one the copy's library drops:
    exit 128+N, nothing published, the input and the earlier output as they were."""
    src = matmul_model(tmp_path / "a", data="w.bin", seed=1)
    out = tmp_path / "out" / "t.onnx"
    out.parent.mkdir()
    assert cli("add-outputs", str(src), "-o", str(out), "--tensor", "H").returncode == 0
    other = matmul_model(tmp_path / "b", data="w.bin", seed=2)
    before, names = hash_tree(tmp_path), sorted(p.name for p in out.parent.iterdir())
    code, stdout, err = _signalled_inside(tmp_path, "layertap.onnxfile.outputs", "copy_data", sig, drops,
                                          ["add-outputs", str(other), "-o", str(out), "--tensor", "Y"])
    one_error(code, err, stdout, expect="interrupted" if sig == "SIGINT" else sig, status=128 + getattr(signal, sig))
    assert not leftovers(tmp_path), leftovers(tmp_path)
    assert {k: v for k, v in hash_tree(tmp_path).items() if k in before} == before
    assert sorted(p.name for p in out.parent.iterdir()) == names
    _pair_ok(out, src)


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_signal_the_exporter_drops_still_stops_export(tmp_path, sig):
    """A signal inside torch.onnx.export that the exporter catches and drops (it goes on with its next way
    to capture the model, which succeeds): exit 128+N, no file, no work folder, the earlier output kept."""
    spec = tiny_file(tmp_path) + ":make"
    out = tmp_path / "e.onnx"
    matmul_model(tmp_path, name="e.onnx")  # an earlier output
    before = hash_tree(tmp_path)
    code, stdout, err = _signalled_inside(tmp_path, "torch.onnx", "export", sig, True,
                                          ["export", spec, "--input", "2x4", "--no-verify", "-o", str(out)])
    one_error(code, err, stdout, expect="interrupted" if sig == "SIGINT" else sig, status=128 + getattr(signal, sig))
    assert not leftovers(tmp_path), leftovers(tmp_path)
    assert {k: v for k, v in hash_tree(tmp_path).items() if k in before} == before


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_signal_after_a_forward_removes_the_values_it_spilled(tmp_path, monkeypatch, sig):
    """A signal right after a PyTorch forward whose values spilled to disk (a small --memory-budget), before
    the compare holds that sample: the spilled values go with everything else."""
    out = tmp_path / "r18.onnx"
    assert cli("export", "torchvision:resnet18", "--input", "1x3x64x64", "--exporter", "torchscript", "--no-verify",
               "-o", str(out)).returncode == 0
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    r = _signalled(tmp_path, "layertap.comparing.torch_ref", "run_torch", sig,
                   ["compare", "torchvision:resnet18", str(out), "--input", "1x3x64x64", "--samples", "3",
                    "--memory-budget", "1"])
    one_error(r.returncode, r.stderr, r.stdout, expect=sig, status=128 + getattr(signal, sig))
    spilled = [q.name for q in temp.iterdir() if q.name.startswith("layertap")]  # torch keeps caches of its own there
    assert not spilled, spilled


# -- 6. model code that exits or prints ---------------------------------------------
EXITS = {
    "import": "import sys\nsys.exit(0)\n",
    "factory": "import sys\ndef bye():\n    sys.exit('bye')\n",
    "forward": textwrap.dedent("""
        import sys
        def bye():
            class Quit(Tiny):
                def forward(self, x):
                    sys.exit(0)
            return Quit()
        """),
}


@pytest.mark.parametrize("where", list(EXITS))
def test_model_code_sys_exit_is_exit_2(tmp_path, capsys, where):
    path = tmp_path / f"exits_{where}.py"
    path.write_text(EXITS[where] if where == "import" else TINY_PY + EXITS[where])
    out = tmp_path / "a.npz"
    line = refused(tmp_path, ["extract", f"{path}:{'make' if where == 'import' else 'bye'}", "--tap", "body.0",
                              "--input", "2x4", "-o", str(out)], capsys, expect="sys.exit")
    assert "model code" in line
    assert not out.exists()


def test_model_print_does_not_break_json(tmp_path, capsys):
    spec = tiny_file(tmp_path, """
        def chatty():
            class Chatty(Tiny):
                def forward(self, x):
                    print("hello from forward")
                    return super().forward(x)
            print("hello from the factory")
            return Chatty()
        """) + ":chatty"
    assert main(["layers", spec, "--input", "2x4", "--json"]) == 0
    cap = capsys.readouterr()
    json.loads(cap.out)  # nothing but the JSON on stdout
    assert "hello from forward" in cap.err


# -- 7-10. bounded time and memory --------------------------------------------------
def _as_limit(gib: int):
    def apply():
        resource.setrlimit(resource.RLIMIT_AS, (gib << 30, gib << 30))
    return apply


def _one_warning(err: str, expect: str) -> None:
    warnings = [ln for ln in err.splitlines() if ln.startswith("layertap: warning: ")]
    assert len(warnings) == 1, err
    assert expect in warnings[0], warnings[0]
    assert "Traceback" not in err and "layertap: error" not in err


def test_deep_torchscript_scope_is_linear(tmp_path):
    """7: a node name with 40,000 scope levels (80 KB) once took 4.8 GB; now it is ignored with a warning."""
    src = matmul_model(tmp_path)
    proto = onnx.load(str(src))
    proto.graph.node[0].name = "/" + "/".join(["a"] * 40_000) + "/MatMul"
    proto.graph.node[1].name = "/body/Relu"
    onnx.save(proto, str(src))
    r = cli("layers", str(src), "--json", preexec=_as_limit(3))
    assert r.returncode == 0, r.stderr[-500:]
    _one_warning(r.stderr, "40000 module levels")
    assert {row["name"] for row in json.loads(r.stdout)["rows"]} >= {"H", "Y"}


def _with_metadata(path: Path, value: str) -> Path:
    proto = onnx.load(str(path))
    helper.set_model_props(proto, {"layertap.taps": value})
    onnx.save(proto, str(path))
    return path


@pytest.mark.parametrize("value", ["[" * 200_000 + "]" * 200_000, "{not json", '{"name": "H"}'])
def test_bad_taps_metadata_is_a_warning(tmp_path, value):
    """8: bad layertap.taps metadata (200k-deep JSON, not JSON, not a list) is ignored; tensors still work."""
    src = _with_metadata(matmul_model(tmp_path), value)
    r = cli("run", str(src), "--tap", "H", "--input", "X=2x3", "--json")  # given inputs: no generated-inputs note
    assert r.returncode == 0, r.stderr[-500:]
    _one_warning(r.stderr, "layertap.taps metadata")
    assert "H" in {row["name"] for row in json.loads(r.stdout)["rows"]}


def test_huge_random_input_is_checked_before_allocating(tmp_path, capsys):
    """9: --input X=1x3x100000x100000 on a fixed 2x3 model: the shape error, not MemoryError."""
    src = matmul_model(tmp_path)
    refused(tmp_path, ["run", str(src), "--input", "X=1x3x100000x100000"], capsys, expect="must have shape 2x3")
    refused(tmp_path, ["run", str(src), "--input", "1x3x100000x100000"], capsys, expect="must have shape 2x3")


def test_huge_random_input_for_pytorch_is_refused_before_allocating(tmp_path, capsys):
    spec = tiny_file(tmp_path) + ":make"
    refused(tmp_path, ["extract", spec, "--tap", "body.0", "--input", "100000x100000x100000", "-o", str(tmp_path / "a.npz")],
            capsys, expect="GiB")


def _sparse_npy(path: Path, shape: tuple[int, ...]) -> Path:
    """A .npy whose header says ``shape`` (float32), its data a hole: no disk used."""
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": shape})
        f.truncate(f.tell() + int(np.prod(shape)) * 4)
    return path


def test_big_npy_header_checked_first(tmp_path):
    """9: a 10 GB .npy of the wrong shape fails on its header, never read (3 GiB address-space cap)."""
    src = matmul_model(tmp_path)
    big = _sparse_npy(tmp_path / "big.npy", (50_000, 50_000))
    before = hash_tree(tmp_path / "m") if (tmp_path / "m").exists() else {}
    r = cli("run", str(src), "--input", f"X={big}", preexec=_as_limit(3))
    one_error(r.returncode, r.stderr, r.stdout, expect="must have shape 2x3")
    assert big.stat().st_size > 10**10 and before == (hash_tree(tmp_path / "m") if before else {})


def test_npy_input_is_memory_mapped_and_native(tmp_path, capsys):
    """9, 14: a right-shaped .npy runs (mapped), and big-endian data is converted, not refused."""
    src = matmul_model(tmp_path)
    x = np.arange(6, dtype=">f4").reshape(2, 3)
    np.save(tmp_path / "be.npy", x)
    out = tmp_path / "acts.npz"
    assert main(["run", str(src), "--input", f"X={tmp_path / 'be.npy'}", "-o", str(out)]) == 0
    capsys.readouterr()
    with np.load(out) as saved:
        np.testing.assert_allclose(saved["output"], ort_run(src, x.astype(np.float32)))


def _sparse_safetensors(path: Path, tensors: dict[str, tuple[int, ...]]) -> Path:
    header, offset = {}, 0
    for name, shape in tensors.items():
        n = int(np.prod(shape)) * 4
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little") + blob)
        f.truncate(f.tell() + offset)
    return path


def test_big_safetensors_with_wrong_key_fails_on_its_header(tmp_path):
    """9: a 16 GB safetensors file with a wrong key gives the key diff (8 GiB address-space cap)."""
    spec = tiny_file(tmp_path) + ":make"
    big = _sparse_safetensors(tmp_path / "big.safetensors", {"body.0.weight": (8, 4), "huge": (64_000, 64_000)})
    r = cli("layers", spec, "--weights", str(big), preexec=_as_limit(8))
    line = one_error(r.returncode, r.stderr, r.stdout, expect="unexpected key: huge")
    assert "missing keys" in line


def test_many_named_inputs_stay_linear():
    """10: 25,000 named --input cost about what positional ones cost (the duplicate check was quadratic)."""
    from layertap.inputs import parse_inputs

    def timed(texts):
        t0 = time.perf_counter()
        parse_inputs(texts)
        return time.perf_counter() - t0

    n = 25_000
    positional = timed(["2x3"] * n)
    named = timed([f"x{i}=2x3" for i in range(n)])
    assert named < 3 * positional + 1.0, (named, positional)


# -- 14. messages that point the right way ---------------------------------------------
@pytest.mark.parametrize("writer", ["pickle", "torch.save"])
def test_os_system_pickle_names_the_global_and_the_flag(tmp_path, capsys, writer):
    import pickle

    import torch

    class Evil:
        def __reduce__(self):
            return (os.system, ("true",))

    evil = tmp_path / "evil.pt"
    if writer == "pickle":
        evil.write_bytes(pickle.dumps(Evil()))
    else:  # torch's zip archive
        torch.save({"w": Evil()}, evil)
    spec = tiny_file(tmp_path) + ":make"
    line = refused(tmp_path, ["layers", spec, "--weights", str(evil)], capsys, expect="--unsafe-load-pickle")
    assert "a pickled object that calls posix.system (not a plain state dict)" in line


def test_duplicate_initializer_names_are_refused(tmp_path, capsys):
    src = matmul_model(tmp_path)
    proto = onnx.load(str(src))
    proto.graph.initializer.append(numpy_helper.from_array(np.zeros((3, 3), np.float32), "W"))
    onnx.save(proto, str(src))
    refused(tmp_path, ["run", str(src)], capsys, expect="duplicate graph initializer names: W")


def test_longest_valid_output_name(tmp_path, capsys):
    """A 250-byte file name works: temporary names are cut to fit NAME_MAX."""
    src = matmul_model(tmp_path / "a", data="w.bin")
    name = "n" * (250 - len(".onnx")) + ".onnx"
    out = tmp_path / name
    assert main(["add-outputs", str(src), "-o", str(out), "--tensor", "H"]) == 0
    assert main(["run", str(out), "-o", str(tmp_path / ("n" * 246 + ".npz"))]) == 0
    capsys.readouterr()
    _pair_ok(out, src)
    assert not leftovers(tmp_path)


# -- 11. external-data confinement sees every tensor ---------------------------------
def _external(t: onnx.TensorProto, location: str) -> onnx.TensorProto:
    t.data_location = TensorProto.EXTERNAL
    t.ClearField("raw_data")
    t.ClearField("float_data")
    for k, v in (("location", location), ("offset", "0"), ("length", "4")):
        e = t.external_data.add()
        e.key, e.value = k, v
    return t


def _hidden_in(where: str) -> onnx.ModelProto:
    """A model whose only escaping external reference hides in ``where``."""
    one = numpy_helper.from_array(np.ones(1, np.float32), "c")
    secret = _external(numpy_helper.from_array(np.ones(1, np.float32), "s"), "../secret.txt")
    if where == "sparse attribute":
        values = _external(numpy_helper.from_array(np.ones(1, np.float32), "v"), "../secret.txt")
        sparse = helper.make_sparse_tensor(values, numpy_helper.from_array(np.zeros(1, np.int64), "i"), [4])
        hidden = helper.make_node("Constant", [], ["k"], sparse_value=sparse)
    else:
        hidden = helper.make_node("Constant", [], ["k"], value=secret)
    if where == "function If branch":
        then = helper.make_graph([hidden], "then", [], [helper.make_tensor_value_info("k", TensorProto.FLOAT, [1])])
        other = helper.make_graph([helper.make_node("Constant", [], ["k"], value=one)], "else", [],
                                  [helper.make_tensor_value_info("k", TensorProto.FLOAT, [1])])
        body = [helper.make_node("Constant", [], ["b"], value=numpy_helper.from_array(np.array(True), "b")),
                helper.make_node("If", ["b"], ["k"], then_branch=then, else_branch=other),
                helper.make_node("Add", ["x", "k"], ["y"])]
    else:
        body = [hidden, helper.make_node("Add", ["x", "k"], ["y"])]
    fn = helper.make_function("local", "F", ["x"], ["y"], body, [helper.make_opsetid("", 17)])
    g = helper.make_graph([helper.make_node("F", ["X"], ["H"], domain="local"), helper.make_node("Relu", ["H"], ["Y"])],
                          "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1])])
    m = helper.make_model(g, functions=[fn], opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("where", ["function body", "function If branch", "sparse attribute"])
def test_external_data_hidden_in_functions_and_sparse_tensors(tmp_path, capsys, where):
    folder = tmp_path / "m"
    folder.mkdir()
    (tmp_path / "secret.txt").write_text("top secret")
    src = folder / "m.onnx"
    src.write_bytes(_hidden_in(where).SerializeToString())
    out = folder / "o.onnx"
    refused(tmp_path, ["add-outputs", str(src), "-o", str(out), "--tensor", "H"], capsys, expect="outside")
    assert not out.exists()


# -- 12. control characters in names never reach the terminal ----------------------------
def test_escape_sequences_in_names_are_escaped(tmp_path, capsys):
    src = matmul_model(tmp_path)
    proto = onnx.load(str(src))
    evil = "H\x1b[2J\x07"
    for n in proto.graph.node:
        n.output[:] = [evil if o == "H" else o for o in n.output]
        n.input[:] = [evil if i == "H" else i for i in n.input]
    onnx.save(proto, str(src))
    assert main(["layers", str(src)]) == 0
    table = capsys.readouterr()
    assert "\x1b" not in table.out + table.err and "\\x1b[2J" in table.out
    line = refused(tmp_path, ["run", str(src), "--tap", "H\x1b[2K"], capsys, expect="did you mean")
    assert "\x1b" not in line and "\\x1b" in line


MODELS_14 = """
    class Infinite(Tiny):
        def forward(self, x):
            return super().forward(x) / 0.0

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = torch.jit.script(nn.Sequential(nn.Linear(4, 8), nn.ReLU()))
            self.head = nn.Linear(8, 2)

        def forward(self, x):
            return self.head(self.inner(x))

    def infinite():
        return Infinite()

    def scripted():
        return Outer()

    def compiled():
        model = torch.compile(make(), backend="eager")
        model(torch.randn(2, 4))  # already run once
        return model
    """


def test_export_with_inf_outputs_reports_them(tmp_path):
    spec = tiny_file(tmp_path, MODELS_14) + ":infinite"
    r = cli("export", spec, "--input", "2x4", "--exporter", "torchscript", "-o", str(tmp_path / "inf.onnx"))
    assert r.returncode == 0, r.stderr
    assert "RuntimeWarning" not in r.stderr and "Traceback" not in r.stderr
    assert "inf or NaN" in r.stdout


@pytest.mark.parametrize("tap, expect", [("inner.0", "is inside 'inner'"), ("inner", "TorchScript module")])
def test_scripted_submodule_is_named_not_the_input(tmp_path, capsys, tap, expect):
    spec = tiny_file(tmp_path, MODELS_14) + ":scripted"
    line = refused(tmp_path, ["extract", spec, "--tap", tap, "--input", "2x4", "-o", str(tmp_path / "a.npz")], capsys,
                   expect=expect)
    assert "check --input" not in line


def test_compiled_model_is_tapped_through_the_original(tmp_path, capsys):
    spec = tiny_file(tmp_path, MODELS_14) + ":compiled"
    out = tmp_path / "a.npz"
    assert main(["extract", spec, "--tap", "body.0", "--input", "2x4", "-o", str(out)]) == 0
    capsys.readouterr()
    with np.load(out) as saved:
        assert saved["body.0"].shape == (2, 8)
    line = refused(tmp_path, ["extract", spec, "--tap", "_orig_mod.body.0", "--input", "2x4", "-o", str(tmp_path / "b.npz")],
                   capsys, expect="'body.0'")
    assert "_orig_mod" in line


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_during_the_publishing_rename_names_the_output_it_wrote(tmp_path, sig):
    """A signal that lands while the output is renamed into place runs its handler only once the rename
    returned: the command still stops with 128+N, and its one line says the output was written in full
    (never that no output changed), and that output is complete."""
    src = matmul_model(tmp_path / "a", seed=1)
    out = tmp_path / "t.onnx"
    code, stdout, err = _signalled_inside(tmp_path, "os", "replace", sig, True,
                                          ["add-outputs", str(src), "-o", str(out), "--tensor", "H"])
    assert code == 128 + getattr(signal, sig), err
    line = err.strip().splitlines()[-1]  # after the command's own "wrote ..." line
    assert line.startswith("layertap: error: ") and ("interrupted" if sig == "SIGINT" else sig) in line, err
    assert f"{out} had been written in full" in line and "no output was changed" not in line, line
    assert "Traceback" not in err
    assert not leftovers(tmp_path), leftovers(tmp_path)
    _pair_ok(out, src)
