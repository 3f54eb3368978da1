"""HTML for an extraction over a dataset (``extract --data``, ``lt.load_features``).

Only the first samples are read (the features stay on disk): thumbnails show
sample 0, histograms and stats cover the first ``samples`` rows of each tap.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .html import cards, esc, section
from .tensors import MAX_TENSORS, tensors_fragment

SAMPLES = 8  # rows read per tap for the pictures and numbers


def features_fragment(feats: Any, *, samples: int = SAMPLES) -> str:
    """Summary of an OUT_DIR and cards for its taps over the first ``samples`` samples.

    ``feats`` is what ``lt.load_features`` returns (``.ids``, ``.taps``, ``[tap]``
    sliceable, ``.manifest.data``).

    Example:
        >>> from types import SimpleNamespace
        >>> class F(SimpleNamespace):
        ...     def __getitem__(self, tap): return np.ones((20, 4, 3, 3))
        ...     def __len__(self): return 20
        >>> f = F(ids=[f"img{i}.png" for i in range(20)], taps=["layer1"], skipped=[], complete=True,
        ...       manifest=SimpleNamespace(data={"options": {"format": "npy", "dtype": "float16"}, "shards": [1, 2]}))
        >>> html = features_fragment(f)
        >>> "first 8 of 20 samples" in html and "img0.png" in html and "float16" in html
        True
    """
    data = getattr(getattr(feats, "manifest", None), "data", {}) or {}
    options = data.get("options") or {}
    n = len(feats)
    k = min(samples, n)
    items: list[tuple[str, Any]] = [("samples", n), ("taps", len(feats.taps)), ("shards", len(data.get("shards") or []))]
    items += [(key, options[key]) for key in ("format", "dtype", "pool") if options.get(key) not in (None, "none")]
    skipped = getattr(feats, "skipped", [])
    if skipped:
        items.append(("skipped", len(skipped)))
    if not getattr(feats, "complete", True):
        items.append(("state", "incomplete"))
    shown_ids = ", ".join(esc(i) for i in list(feats.ids)[:k])
    arrays = {tap: np.asarray(feats[tap][:k]) for tap in list(feats.taps)[:MAX_TENSORS]}
    note = (f'<p class="muted">Pictures of sample 0 and value histograms over the first {k} of {n} samples '
            f"(read from disk; the rest stay there): {shown_ids}</p>")
    body = tensors_fragment(arrays) if k else '<p class="muted">no samples</p>'
    return cards(items, css={"skipped": "warn", "state": "bad"}) + section("tapped features", note, body, anchor="features")
