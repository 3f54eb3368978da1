"""``layertap extract MODEL|FILE.onnx --tap ... --data PATH -o OUT_DIR``: features of a whole dataset."""

from __future__ import annotations

import argparse
import sys

from ..args import ArgGroup, ReportArgs, nonneg_int, positive_int


def _floats(text: str) -> list[float]:
    try:
        return [float(v) for v in text.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 0.485,0.456,0.406, got {text!r}") from None


class DatasetArgs(ArgGroup):
    """``--data`` and the options of extraction over a dataset."""

    def add(self, parser: argparse.ArgumentParser) -> None:
        from ...dataset.arrays import DTYPES, POOLS
        from ...dataset.shards import FORMATS

        g = parser.add_argument_group("dataset (with --data; -o is then an OUT_DIR)")
        g.add_argument("--data", metavar="PATH", help="folder of images, of .npy/.npz samples, or a datasets save_to_disk folder")
        g.add_argument("--batch-size", type=positive_int, default=64, metavar="N", help="samples per forward (default 64)")
        g.add_argument("--workers", type=nonneg_int, default=0, metavar="N", help="DataLoader workers that load ahead (default 0)")
        g.add_argument("--format", choices=FORMATS, default="safetensors", help="shard format (default safetensors)")
        g.add_argument("--dtype", choices=DTYPES, default="float32", help="dtype of floating features (default float32)")
        g.add_argument("--pool", choices=POOLS, default="none", help="pool spatial (NCHW) or token (NTD) axes (default none)")
        g.add_argument("--shard-size", type=positive_int, default=1024, metavar="SIZE", help="samples per shard file (default 1024)")
        g.add_argument("--resume", action="store_true", help="continue an interrupted run in OUT_DIR (same options)")
        g.add_argument("--limit", type=positive_int, metavar="N", help="only the first N samples")
        g.add_argument("--device", default="cpu", metavar="cpu|cuda", help="PyTorch device (default cpu)")
        g.add_argument("--skip-bad", action="store_true", help="skip unreadable samples (listed in the manifest) instead of stopping")
        g.add_argument("--image-size", metavar="SIZE|HxW", help="image size when the model's config has none")
        g.add_argument("--mean", type=_floats, metavar="R,G,B", help="per-channel mean of pixels in [0,1] (default: model config, else 0)")
        g.add_argument("--std", type=_floats, metavar="R,G,B", help="per-channel std (default: model config, else 1)")
        g.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                       help="run on Ray Data: a local Ray without ADDRESS, else join the cluster at ADDRESS (e.g. auto, ray://head:10001)")


def run_dataset(ns: argparse.Namespace) -> int:
    """Extract over ``--data`` into OUT_DIR; print what was written."""
    from ...dataset.api import extract_dataset
    from ...errors import LayertapError
    from ..main import Terminated

    if not ns.output:
        raise LayertapError("--data needs -o OUT_DIR (a new or empty folder, or one to --resume)")
    ReportArgs.check(ns, inputs=(ns.data,))  # before any work, like every output
    try:
        feats = extract_dataset(
            ns.model, ns.data, ns.tap, ns.output, batch_size=ns.batch_size, shard_size=ns.shard_size, format=ns.format,
            dtype=ns.dtype, pool=ns.pool, resume=ns.resume, limit=ns.limit, workers=ns.workers, device=ns.device,
            method=ns.method, stop_early=ns.stop_early, skip_bad=ns.skip_bad, image_size=ns.image_size, mean=ns.mean,
            std=ns.std, weights=ns.weights, config=ns.config, unsafe_pickle=ns.unsafe_load_pickle,
            engine="ray" if ns.ray is not None else "local", ray_address=ns.ray or None,
        )
    except (KeyboardInterrupt, Terminated) as stop:
        stop.kept = _kept_note(ns)  # type: ignore[union-attr]  # main's exit line says it
        raise
    _print_summary(feats)
    if ns.report:
        from ...reports import report_page

        summary = [("model", ns.model), ("data", ns.data), ("written to", str(feats.path))]
        ReportArgs.write(ns, report_page(feats, f"extract from {ns.model} over {ns.data}", summary=summary))
    return 0


def _kept_note(ns: argparse.Namespace) -> str:
    """After Ctrl-C (or SIGTERM): how many complete shards OUT_DIR keeps, and the command that goes on."""
    import shlex
    from pathlib import Path

    from ...dataset.manifest import NAME, Manifest
    from ...errors import LayertapError

    out = Path(ns.output)
    try:
        shards = Manifest.read(out).shards if (out / NAME).is_file() else {}
    except LayertapError:
        shards = {}
    if not shards:
        return f"no shard was complete, so '{out}' keeps nothing; run the same command to start again"
    samples = sum(len(r["ids"]) for r in shards.values())
    argv = list(getattr(ns, "argv", None) or sys.argv[1:])
    command = shlex.join(["layertap", *argv, *([] if "--resume" in argv else ["--resume"])])
    return f"{len(shards)} complete shard(s) ({samples} samples) are kept in '{out}'; to go on, run: {command}"


def _print_summary(feats) -> None:
    from rich.markup import escape
    from rich.table import Table

    from ..console import stdout_console

    table = Table(title=f"{len(feats)} samples", title_justify="left")
    for col in ("tap", "shape per sample", "dtype"):
        table.add_column(col)
    for t in feats.manifest.data["taps"] or []:
        table.add_row(escape(t["name"]), "x".join(str(d) for d in t["shape"]) or "scalar", t["dtype"])
    stdout_console().print(table)
    skipped = feats.skipped
    note = f" ({len(skipped)} skipped, listed in manifest.json)" if skipped else ""
    written, kept = feats.written or 0, feats.kept or 0
    if kept and not written:
        sys.stderr.write(f"nothing to do: all {kept} shard(s) in {feats.path} were written by the earlier run{note}\n")
    elif kept:
        sys.stderr.write(f"wrote {written} new shard(s) ({kept} kept from the earlier run) and manifest.json to {feats.path}{note}\n")
    else:
        sys.stderr.write(f"wrote {written} shard(s) and manifest.json to {feats.path}{note}\n")
