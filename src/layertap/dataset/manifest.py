"""``manifest.json``: what an OUT_DIR holds, and what ``--resume`` checks.

It is rewritten atomically after each shard lands, so at any moment it lists
exactly the complete shards. Its text depends only on the options, the data
and the shards (no times, no host names): an interrupted and resumed run
writes the same bytes as an uninterrupted one.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import LayertapError
from ..files.writes import atomic_write_bytes

FORMAT_VERSION = 1
NAME = "manifest.json"
# option key -> how the user wrote it, for "cannot resume: --dtype was ..."
_FLAGS = {
    "format": "--format", "dtype": "--dtype", "pool": "--pool", "shard_size": "--shard-size",
    "batch_size": "--batch-size", "limit": "--limit", "skip_bad": "--skip-bad", "device": "--device",
    "taps": "--tap", "preprocessing": "preprocessing (--image-size/--mean/--std)",
}


class Manifest:
    """The manifest of one OUT_DIR; shard records are kept by shard index.

    A record is ``{"index", "file", "source": [a, b], "ids": [...], "skipped": [...]}`` (and
    ``"labels"`` beside ``ids`` when the source has labels: then ``data.classes`` is in the header):
    shard ``index`` holds the samples ``a <= i < b`` of the source, less the skipped ones.
    """

    def __init__(self, out: Path, header: dict, status: str = "running") -> None:
        self.out = out
        self.header = header
        self.status = status
        self.taps: list[dict] | None = None
        self.shards: dict[int, dict] = {}
        self.total: int | None = None  # source samples, once known
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_lock")  # a Ray actor gets a copy without the lock
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # -- reading ---------------------------------------------------------
    @classmethod
    def read(cls, out: Path) -> "Manifest":
        """Parse ``out/manifest.json`` (a clear error if it is not one of ours)."""
        path = out / NAME
        try:
            d = json.loads(path.read_text())
            m = cls(out, {k: d[k] for k in ("model", "data", "options", "preprocessing")}, d["status"])
            m.taps = d["taps"]
            m.total = d.get("source_count")
            ids, skipped, labels = d["ids"], d.get("skipped", []), d.get("labels")
            for s in d["shards"]:
                a, b = s["source"]
                m.shards[s["index"]] = {
                    "index": s["index"], "file": s["file"], "source": [a, b], "ids": ids[s["start"]:s["stop"]],
                    "skipped": [x for x in skipped if a <= x["index"] < b],
                }
                if labels is not None:
                    m.shards[s["index"]]["labels"] = labels[s["start"]:s["stop"]]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise LayertapError(f"'{path}' is not a layertap manifest ({type(e).__name__}: {e}); use a new OUT_DIR") from None
        return m

    @property
    def data(self) -> dict:
        """The manifest as JSON-ready data (what the file holds)."""
        shards: list[dict] = []
        ids: list[Any] = []
        skipped: list[dict] = []
        labels: list[int] | None = [] if self.header.get("data", {}).get("classes", False) is not False else None
        for k in sorted(self.shards):
            r = self.shards[k]
            shards.append({"index": k, "file": r["file"], "start": len(ids), "stop": len(ids) + len(r["ids"]), "source": r["source"]})
            ids.extend(r["ids"])
            skipped.extend(r["skipped"])
            if labels is not None:
                labels.extend(r.get("labels", []))

        return {
            "layertap": {"version": __version__, "manifest_format": FORMAT_VERSION},
            "status": self.status,
            **self.header,
            "taps": self.taps,
            "count": len(ids),
            "source_count": self.total,
            "shards": shards,
            "ids": ids,
            **({"labels": labels} if labels is not None else {}),
            "skipped": skipped,
        }

    # -- writing ---------------------------------------------------------
    def write(self) -> None:
        """Replace ``manifest.json`` atomically."""
        with self._lock:
            atomic_write_bytes(self.out / NAME, dumps(self.data).encode())

    def add_shard(self, record: dict) -> None:
        """Record a shard that is on disk and rewrite the manifest."""
        with self._lock:
            self.shards[record["index"]] = record
        self.write()

    def set_taps(self, taps: list[dict]) -> None:
        """The taps' names, keys, per-sample shapes and dtypes (from the first batch)."""
        if self.taps is not None and self.taps != taps:
            old = {t["name"]: t for t in self.taps}
            raise LayertapError(
                f"cannot resume '{self.out}': the taps now give {_taps_text(taps)}, the run started with {_taps_text(list(old.values()))}"
            )
        self.taps = taps

    def finish(self, total: int) -> None:
        """Mark the run complete."""
        self.total = total
        self.status = "complete"
        self.write()

    # -- resuming --------------------------------------------------------
    def check_same(self, header: dict) -> None:
        """Refuse to resume with other options, naming the first difference."""
        for section in ("model", "data", "options", "preprocessing"):
            old, new = self.header.get(section), header.get(section)
            if old == new:
                continue
            if isinstance(old, dict) and isinstance(new, dict):
                for key in sorted(set(old) | set(new)):
                    if old.get(key) != new.get(key):
                        raise self._differs(_FLAGS.get(key, f"{section} {key}"), old.get(key), new.get(key))
            raise self._differs(_FLAGS.get(section, section), old, new)

    def _differs(self, what: str, old: Any, new: Any) -> LayertapError:
        return LayertapError(
            f"cannot resume '{self.out}': {what} was {_short(old)}, now {_short(new)}; "
            "rerun with the same options, or write to a new OUT_DIR"
        )


def dumps(data: dict) -> str:
    """One line per top-level key, one per record in lists of records: readable and diffable.

    Example:
        >>> print(dumps({"a": 1, "shards": [{"file": "x"}, {"file": "y"}]}), end="")
        {
         "a": 1,
         "shards": [
          {"file": "x"},
          {"file": "y"}
         ]
        }
    """
    def one(v: Any) -> str:
        return json.dumps(v, ensure_ascii=False, separators=(", ", ": "))

    lines = []
    for k, v in data.items():
        if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            body = ",\n".join(f"  {one(x)}" for x in v)
            lines.append(f" {one(k)}: [\n{body}\n ]")
        else:
            lines.append(f" {one(k)}: {one(v)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _taps_text(taps: list[dict]) -> str:
    return ", ".join(f"{t['name']} {'x'.join(map(str, t['shape'])) or 'scalar'} {t['dtype']}" for t in taps)
