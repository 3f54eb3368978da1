"""Exceptions that carry the CLI exit status.

Every error a user can cause raises :class:`LayertapError` (exit 2) with a
one-line message that names the bad input and says what to do. Numbers that
disagree (a failed verification or comparison) are not exceptions: reports
carry ``.ok`` and the CLI turns ``ok=False`` into exit 1.
"""

from __future__ import annotations

import difflib
import re
from typing import Any, Iterable

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


#: what a missing ExecuTorch names (``.pte`` programs are an optional extra)
EXECUTORCH_INSTALL = "pip install 'layertap[executorch]'"


def missing_executorch() -> "LayertapError":
    """The one-line error for an ExecuTorch program without ExecuTorch installed.

    Example:
        >>> str(missing_executorch()).startswith("ExecuTorch programs (.pte) need ExecuTorch")
        True
    """
    return LayertapError(f"ExecuTorch programs (.pte) need ExecuTorch, which is not installed: {EXECUTORCH_INSTALL}")


#: what a missing LiteRT names (``.tflite`` programs are an optional extra)
LITERT_INSTALL = "pip install 'layertap[litert]'"


def missing_litert() -> "LayertapError":
    """The one-line error for a LiteRT program without LiteRT's packages installed.

    Example:
        >>> str(missing_litert()).endswith("pip install 'layertap[litert]'")
        True
    """
    return LayertapError("LiteRT programs (.tflite) need litert-torch, ai-edge-litert and ai-edge-quantizer, which "
                         f"are not installed: {LITERT_INSTALL}")


class LayertapError(ValueError):
    """A problem with the user's input: bad name, bad file, bad option.

    Example:
        >>> raise LayertapError("unknown module 'layer9'")
        Traceback (most recent call last):
        ...
        layertap.errors.LayertapError: unknown module 'layer9'
    """

    exit_code = 2


class SelectorError(LayertapError):
    """A tap selector that does not parse or does not resolve."""


class ModelSpecError(LayertapError):
    """A MODEL spec or weights file that cannot be loaded."""


class InputSpecError(LayertapError):
    """An ``--input`` spec or input array that does not fit."""


class OnnxFileError(LayertapError):
    """An ONNX file that is unreadable, unsafe, or lacks what was asked."""


class LayertapWarning(UserWarning):
    """Something in an input was ignored (the CLI prints one ``layertap: warning:`` line)."""


def close_matches(word: str, candidates: Iterable[str], n: int = 5) -> list[str]:
    """Return up to ``n`` candidates close to ``word``, best first.

    Example:
        >>> close_matches("layer4.0.conv", ["layer4.0.conv1", "layer4.0.bn1", "fc"])
        ['layer4.0.conv1', 'layer4.0.bn1']
    """
    pool = list(dict.fromkeys(candidates))
    found = difflib.get_close_matches(word, pool, n=n, cutoff=0.6)
    if not found:
        # Dotted paths: a user who types "conv1" usually means some "*.conv1".
        tail = [c for c in pool if c.endswith("." + word) or c == word]
        found = tail[:n]
    return found


def printable(text: str) -> str:
    """``text`` with control characters (terminal escapes, newlines) shown as ``\\xNN``.

    Names come from untrusted files: an ONNX tensor named ``ESC[2J`` must not
    clear the user's terminal. Every place that prints a name goes through here
    (error lines, tables, status lines).

    Example:
        >>> print(printable("relu" + chr(27) + "[2J"))
        relu\\x1b[2J
    """
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def unknown_name(kind: str, name: str, candidates: Iterable[str], hint: str = "") -> str:
    """Format the standard 'unknown X' message with close matches.

    Example:
        >>> unknown_name("module", "layer4.0.conv", ["layer4.0.conv1"])
        "unknown module 'layer4.0.conv'; did you mean: layer4.0.conv1"
    """
    msg = f"unknown {kind} {name!r}"
    matches = close_matches(name, candidates)
    if matches:
        msg += "; did you mean: " + ", ".join(matches)
    if hint:
        msg += f" ({hint})"
    return msg


_ALIAS_HINT = "give the tap an alias (NAME=selector) that no other output uses"


def unique_names(*groups: Iterable[tuple[str, Any]], what: str = "outputs", hint: str = _ALIAS_HINT) -> dict[str, Any]:
    """Join ``(name, value)`` pairs into one dict; refuse a name given twice.

    Every command that names its results (taps, flattened model outputs,
    ONNX outputs) builds the dict here, so a collision is an error, never a
    silently dropped value.

    Example:
        >>> unique_names([("output", 1)], [("body.0", 2)])
        {'output': 1, 'body.0': 2}
        >>> unique_names([("output", 1)], [("output", 2)])
        Traceback (most recent call last):
        ...
        layertap.errors.LayertapError: two outputs are both named 'output'; give the tap an alias (NAME=selector) that no other output uses
    """
    out: dict[str, Any] = {}
    for group in groups:
        for name, value in group:
            if name in out:
                raise LayertapError(f"two {what} are both named {name!r}; {hint}")
            out[name] = value
    return out


def one_line(error: object, *, first: bool = False, limit: int | None = None) -> str:
    """An error's text as the one line a user sees: its lines joined (``first``: the first only),
    whitespace collapsed, a runtime's ``Exception from src/...`` trail left out, cut at ``limit``
    characters; the type's name when the text is empty. Every error message that quotes
    another library's error (ONNX Runtime, OpenVINO, PyTorch, a converter) goes through here.

    Example:
        >>> one_line(RuntimeError("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT :" + chr(10) + "  bad dims"))
        '[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : bad dims'
        >>> one_line(RuntimeError("Exception from src/core.cpp:1:" + chr(10) + "Device FOO is not registered" + chr(10)))
        'Device FOO is not registered'
        >>> one_line(OSError("no such file" + chr(10) + "  (see the docs)"), first=True), one_line(KeyError())
        ('no such file', 'KeyError')
    """
    lines = [" ".join(line.split()) for line in str(error).splitlines()]
    lines = [line for line in lines if line]
    kept = [line for line in lines if not line.startswith("Exception from ")] or lines
    if not kept:
        return type(error).__name__
    text = kept[0] if first else " ".join(kept)
    return text[:limit] if limit is not None else text
