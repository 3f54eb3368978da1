"""Named arrays saved as ``.npz`` or ``.safetensors``, atomically, every name kept."""

from __future__ import annotations

import os
import urllib.parse
import zipfile
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import LayertapError, unique_names
from .writes import atomic_path, check_output_path


def npz_member(name: str) -> str:
    """The ``.npz`` key for an array name: the name itself, so ``np.load(f)[name]`` works
    (TorchScript tensor names such as ``/layer1/layer1.0/relu/Relu_output_0`` included).

    A key is stored as the zip member ``KEY.npy``, which unzip tools take as a path. A
    leading ``/`` is kept: ``unzip``, Python's ``zipfile`` and ``bsdtar`` drop it and
    extract inside the target folder. A name that could still land outside that
    folder (a ``..`` part, a backslash, a control character) is percent-encoded.

    Example:
        >>> npz_member("layer1#0"), npz_member("/layer1/Relu_output_0"), npz_member("../../x")
        ('layer1#0', '/layer1/Relu_output_0', '%2E%2E/%2E%2E/x')
    """
    unsafe = (
        "\\" in name or any(ord(c) < 32 or ord(c) == 127 for c in name)
        or any(part == ".." for part in name.split("/"))
    )
    if not unsafe:
        return name
    return _escaped(name, "/")


def file_stem(name: str) -> str:
    """A file name for an array name, escaped as :func:`npz_member` escapes, and a ``/`` too
    (a file in a folder has no sub-paths): ``np.load(folder / (file_stem(name) + ".npy"))``.

    Example:
        >>> file_stem("layer1.0"), file_stem("/layer1/Relu_output_0"), file_stem("..")
        ('layer1.0', '%2Flayer1%2FRelu_output_0', '%2E%2E')
    """
    unsafe = (
        any(c in name for c in "/\\%") or name in ("", ".", "..") or any(ord(c) < 32 or ord(c) == 127 for c in name)
    )  # "%" too: an escaped name never equals another name kept as it is
    return _escaped(name, "") if unsafe else name


def _escaped(name: str, keep: str) -> str:
    """``name`` percent-encoded but for ``keep`` and the characters tap and tensor names use; a
    ``..`` part (or a whole name of dots) encoded."""
    encoded = urllib.parse.quote(name, safe=keep + "#[]:.,=+-_ ")
    parts = encoded.split("/") if keep else [encoded]
    return "/".join(p.replace(".", "%2E") if p in (".", "..") else p for p in parts)


def save_arrays(path: str | os.PathLike, arrays: dict, notify: Callable[[str], None] | None = None) -> Path:
    """Save name -> numpy array as ``.npz`` or ``.safetensors``, atomically.

    Keys are the names exactly (tap names contain '.', '#', '[' and ':', ONNX tensor
    names '/'); in ``.npz`` a name that could land outside the folder when the file is
    unzipped is percent-encoded (see :func:`npz_member`) and ``notify`` gets a line
    naming its key.

    Example:
        >>> import numpy as np, tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "a.npz")
        >>> _ = save_arrays(p, {"layer1#0": np.zeros(2), "/fc/Gemm_output_0": np.ones(1)})
        >>> saved = np.load(p)
        >>> saved.files, saved["/fc/Gemm_output_0"]
        (['layer1#0', '/fc/Gemm_output_0'], array([1.]))
    """
    out = check_output_path(path, suffixes=(".npz", ".safetensors"))
    arrays = {k: np.asarray(v, order="C") for k, v in arrays.items()}  # ascontiguousarray makes 0-d 1-d
    with atomic_path(out) as tmp:
        if out.suffix.lower() == ".npz":
            members = unique_names(((npz_member(k), v) for k, v in arrays.items()), what="npz members",
                                   hint="write .safetensors instead, which keeps names as they are")
            for name in arrays:
                if npz_member(name) != name and notify is not None:
                    notify(f"{name!r} is saved under the key {npz_member(name)!r}: as a zip member path it could "
                           "land outside the folder the .npz is unzipped in (.safetensors keeps every name)")
            _write_npz(tmp, members)
        else:
            try:
                from safetensors.numpy import save_file
            except ImportError as e:
                raise LayertapError("writing .safetensors needs the 'safetensors' package; pip install safetensors") from e
            save_file(arrays, str(tmp))
    return out


def _write_npz(path: Path, members: dict) -> None:
    """What ``np.savez`` writes, without passing names as keyword arguments (a tap
    named ``file`` or ``allow_pickle`` would collide with savez's own parameters)."""
    with zipfile.ZipFile(path, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as z:
        for key, value in members.items():
            with z.open(key + ".npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asanyarray(value), allow_pickle=False)
