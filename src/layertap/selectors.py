"""Tap selectors: the one grammar every command uses to name a point of a model.

Grammar (public and stable: every command and the Python API accept exactly this)::

    TAP   := [ALIAS "="] PATH ["#" CALL | "@" POS] [":" PORT] {"[" INDEX "]"}
    PATH  := module path as in model.named_modules(); "" is the root module
    CALL  := integer, 0-based, negative counts from the last call
    POS   := integer, a token position (0-based, negative counts from the end of the
             sequence): the value at that position, from whichever call computed it
    PORT  := "output" (default) | "input"
    INDEX := integer | key

This module is pure Python (no torch, no onnx) so that every side can use it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Iterable, Sequence

from .errors import SelectorError

Index = int | str

_FORBIDDEN = "=#@:[]"
_TAP_RE = re.compile(
    r"""^
    (?:(?P<alias>[^=\#@:\[\]\s]+)=)?
    (?P<path>[^=\#@:\[\]\s]*)
    (?:\#(?P<call>[^:\[\]@]*))?
    (?:@(?P<pos>[^:\[\]]*))?
    (?::(?P<port>[^\[\]]*))?
    (?P<index>(?:\[[^\[\]]*\])*)
    $""",
    re.VERBOSE,
)
_INDEX_RE = re.compile(r"\[([^\[\]]*)\]")
_INT_RE = re.compile(r"^-?\d+$")


@dataclass(frozen=True)
class Tap:
    """One parsed selector.

    Attributes:
        path: module path as in ``named_modules()``; ``""`` is the root.
        call: which call of the module (``None`` = every call).
        port: ``"output"`` or ``"input"``.
        index: keys/positions applied, in order, to the selected value.
        alias: the user's name for the captured tensor, if any.
        pos: a token position (``PATH@POS``): the value at that position of the
            sequence axis (axis 1), from the call that computed it; ``None`` otherwise.

    Example:
        >>> t = Tap.parse("emb=layer2.1.relu#-1:input[0]")
        >>> (t.alias, t.path, t.call, t.port, t.index, t.name)
        ('emb', 'layer2.1.relu', -1, 'input', (0,), 'emb')
        >>> Tap.parse("fc:output").name
        'fc'
        >>> t = Tap.parse("model.layers.1@-1")
        >>> (t.path, t.pos, t.call, t.name)
        ('model.layers.1', -1, None, 'model.layers.1@-1')
    """

    path: str
    call: int | None = None
    port: str = "output"
    index: tuple[Index, ...] = ()
    alias: str | None = None
    pos: int | None = None

    @classmethod
    def parse(cls, text: str | Tap) -> Tap:
        """Parse selector text; raise :class:`SelectorError` naming the fault."""
        if isinstance(text, Tap):
            return text
        if not isinstance(text, str):
            raise SelectorError(f"tap selector must be a string, got {type(text).__name__}")
        text = text.strip()
        m = _TAP_RE.match(text)
        if m is None:
            raise SelectorError(_explain(text))
        call = _parse_call(text, m.group("call"))
        pos = _parse_pos(text, m.group("pos"))
        if call is not None and pos is not None:
            raise SelectorError(f"bad tap {text!r}: #CALL and @POS both pick a call; give one of them")
        port = m.group("port")
        if port is None or port == "":
            if port == "":
                raise SelectorError(f"bad tap {text!r}: empty port after ':'; use ':input' or ':output'")
            port = "output"
        if port not in ("input", "output"):
            raise SelectorError(f"bad tap {text!r}: unknown port {port!r}; use ':input' or ':output'")
        index = tuple(_parse_index(text, raw) for raw in _INDEX_RE.findall(m.group("index")))
        path = m.group("path")
        if path.startswith(".") or path.endswith(".") or ".." in path:
            raise SelectorError(f"bad tap {text!r}: module path {path!r} has an empty component")
        return cls(path=path, call=call, port=port, index=index, alias=m.group("alias"), pos=pos)

    @property
    def canonical(self) -> str:
        """Selector text without alias and without spelled-out defaults."""
        return self._text(self.call)

    @property
    def name(self) -> str:
        """Name of the captured value: the alias, else the canonical text."""
        if self.alias:
            return self.alias
        return self.canonical or "output"

    def name_for_call(self, call: int) -> str:
        """Name for one call of a tap that did not pick a call (``PATH#k``).

        Example:
            >>> Tap.parse("layer2.0.relu[0]").name_for_call(1)
            'layer2.0.relu#1[0]'
            >>> Tap.parse("r=layer2.0.relu").name_for_call(1)
            'r#1'
        """
        if self.alias:
            return f"{self.alias}#{call}"
        return self._text(call)

    def with_call(self, call: int | None) -> "Tap":
        """The same tap pinned to one call."""
        return replace(self, call=call)

    def with_pos(self, pos: int | None) -> "Tap":
        """The same tap at another token position (``None``: every position, the whole value)."""
        return replace(self, pos=pos)

    def _text(self, call: int | None) -> str:
        out = self.path
        if call is not None:
            out += f"#{call}"
        if self.pos is not None:
            out += f"@{self.pos}"
        if self.port == "input":
            out += ":input"
        for i in self.index:
            out += f"[{i}]"
        return out

    def __str__(self) -> str:
        return (f"{self.alias}=" if self.alias else "") + self.canonical


def parse_taps(texts: Iterable[str | Tap]) -> list[Tap]:
    """Parse many selectors; reject two taps that would get the same name.

    Example:
        >>> [t.name for t in parse_taps(["layer1", "x=fc:input"])]
        ['layer1', 'x']
    """
    taps = [Tap.parse(t) for t in texts]
    seen: dict[str, Tap] = {}
    for t in taps:
        if t.name in seen:
            raise SelectorError(
                f"two taps are both named {t.name!r}; give one an alias (NAME=selector)"
            )
        seen[t.name] = t
    return taps


def index_text(index: Sequence[Index]) -> str:
    """Render an index chain as it is written in a selector: ``[0][logits]``."""
    return "".join(f"[{i}]" for i in index)


def _parse_call(text: str, raw: str | None) -> int | None:
    return _parse_int(text, raw, "call", "#")


def _parse_pos(text: str, raw: str | None) -> int | None:
    return _parse_int(text, raw, "token position", "@")


def _parse_int(text: str, raw: str | None, what: str, mark: str) -> int | None:
    """The integer after ``mark`` in tap ``text`` (``None`` when absent)."""
    if raw is None:
        return None
    if not _INT_RE.match(raw):
        raise SelectorError(f"bad tap {text!r}: {what} {raw!r} after '{mark}' must be an integer like {mark}0 or {mark}-1")
    return int(raw)


def _parse_index(text: str, raw: str) -> Index:
    raw = raw.strip()
    if raw == "":
        raise SelectorError(f"bad tap {text!r}: empty [] index; write [0] or [key]")
    if _INT_RE.match(raw):
        return int(raw)
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":
        return raw[1:-1]
    return raw


def _explain(text: str) -> str:
    if text.count("[") != text.count("]"):
        return f"bad tap {text!r}: unbalanced brackets; index as NAME[0] or NAME[key]"
    if text.count("=") > 1:
        return f"bad tap {text!r}: more than one '='; the form is ALIAS=PATH"
    if any(c.isspace() for c in text):
        return f"bad tap {text!r}: spaces are not allowed in a selector"
    return (
        f"bad tap {text!r}: expected [ALIAS=]PATH[#CALL|@POS][:input|:output][INDEX]..., "
        "e.g. layer2.1.relu#1 or fc:input or enc.layers.3[0] or model.layers.1@-1"
    )
