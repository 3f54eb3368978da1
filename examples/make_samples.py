"""Write a small sample folder for ``layertap extract --data`` (seeded random content).

    python examples/make_samples.py images                      # 24 PNG/JPEG images of mixed sizes in images/
    python examples/make_samples.py arrays --npy --shape 3x32x32  # 24 .npy arrays in arrays/

Images go into two sub-folders (``cats/``, ``dogs/``) so the sample ids show
their relative paths.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description="write a small sample folder (seeded)")
    p.add_argument("folder", type=Path)
    p.add_argument("--count", type=int, default=24)
    p.add_argument("--npy", action="store_true", help="write float32 .npy arrays instead of images")
    p.add_argument("--shape", default="3x32x32", help="array shape for --npy (default 3x32x32)")
    a = p.parse_args()
    rng = np.random.default_rng(0)
    a.folder.mkdir(parents=True, exist_ok=True)
    for i in range(a.count):
        if a.npy:
            shape = tuple(int(d) for d in a.shape.split("x"))
            np.save(a.folder / f"sample{i:04d}.npy", rng.standard_normal(shape).astype(np.float32))
            continue
        from PIL import Image

        sub = a.folder / ("cats" if i % 2 else "dogs")
        sub.mkdir(exist_ok=True)
        h, w = (int(v) for v in rng.integers(48, 128, 2))
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(sub / f"{i:04d}.{'jpg' if i % 3 == 0 else 'png'}")
    print(f"wrote {a.count} {'arrays' if a.npy else 'images'} to {a.folder}/")


if __name__ == "__main__":
    main()
