"""``layertap extract MODEL|FILE.onnx --tap ... --data PATH -o OUT_DIR``: features of a whole dataset."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from ..args import ArgGroup, Args, ReportArgs, add_sample_options, nonneg_int, positive_int


@dataclass(frozen=True)
class DatasetOptions:
    """The options of extraction over ``--data`` (``data`` is None without it)."""

    data: str
    out: str  # -o OUT_DIR
    batch_size: int
    workers: int
    format: str
    dtype: str
    pool: str
    shard_size: int | str  # samples, or a size (256MB)
    resume: bool
    limit: int | None
    device: str
    skip_bad: bool
    image_size: str | None
    mean: list[float] | None
    std: list[float] | None
    ray: str | None
    columns: list[str] | None


class DatasetArgs(ArgGroup):
    """``--data`` and the options of extraction over a dataset."""

    def add(self, parser: argparse.ArgumentParser) -> None:
        from ...dataset.arrays import DTYPES, POOLS
        from ...dataset.job import DEFAULT_SHARD_SIZE
        from ...dataset.shards import FORMATS

        g = parser.add_argument_group("dataset (with --data; -o is then an OUT_DIR)")
        g.add_argument("--data", metavar="PATH", help="folder of images, of .npy/.npz samples, or a datasets save_to_disk folder")
        g.add_argument("--batch-size", type=positive_int, default=64, metavar="N", help="samples per forward (default 64)")
        g.add_argument("--workers", type=nonneg_int, default=0, metavar="N", help="DataLoader workers that load ahead (default 0)")
        g.add_argument("--format", choices=FORMATS, default="safetensors", help="shard format (default safetensors)")
        g.add_argument("--dtype", choices=DTYPES, default="float32", help="dtype of floating features (default float32)")
        g.add_argument("--pool", choices=POOLS, default="none", help="pool spatial (NCHW) or token (NTD) axes (default none)")
        g.add_argument("--shard-size", default=DEFAULT_SHARD_SIZE, metavar="N|SIZE",
                       help=f"samples per shard file (1024), or the size of a shard's features (256MB, 1GiB; default "
                            f"{DEFAULT_SHARD_SIZE}: samples per shard from the taps' bytes per sample)")
        g.add_argument("--resume", action="store_true", help="continue an interrupted run in OUT_DIR (same options)")
        g.add_argument("--limit", type=positive_int, metavar="N", help="only the first N samples")
        g.add_argument("--device", default="cpu", metavar="cpu|cuda", help="PyTorch device (default cpu)")
        g.add_argument("--skip-bad", action="store_true", help="skip unreadable samples (listed in the manifest) instead of stopping")
        add_sample_options(g)
        g.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                       help="run on Ray Data: a local Ray without ADDRESS, else join the cluster at ADDRESS (e.g. auto, ray://head:10001)")

    def parse(self, ns: argparse.Namespace, args: Args) -> None:
        if ns.data is not None:
            from ...dataset.job import parse_shard_size

            samples, _ = parse_shard_size(ns.shard_size)  # a typo fails before the model loads
            args.dataset = DatasetOptions(ns.data, ns.output, ns.batch_size, ns.workers, ns.format, ns.dtype, ns.pool,
                                          samples or ns.shard_size, ns.resume, ns.limit, ns.device, ns.skip_bad, ns.image_size,
                                          ns.mean, ns.std, ns.ray, ns.columns)


def run_dataset(args: Args) -> int:
    """Extract over ``--data`` into OUT_DIR; print what was written (every path was checked by parse)."""
    from ...dataset.api import extract_dataset
    from ..main import Terminated

    d: DatasetOptions = args.dataset
    m = args.model
    try:
        feats = extract_dataset(
            m.text, d.data, args.tap_texts, d.out, batch_size=d.batch_size, shard_size=d.shard_size, format=d.format,
            dtype=d.dtype, pool=d.pool, resume=d.resume, limit=d.limit, workers=d.workers, device=d.device,
            method=m.method, stop_early=args.own, skip_bad=d.skip_bad, image_size=d.image_size, mean=d.mean,
            std=d.std, weights=m.weights, config=m.config, unsafe_pickle=m.unsafe_pickle,
            weights_key=m.weights_key, weights_strict=m.weights_strict,
            engine="ray" if d.ray is not None else "local", ray_address=d.ray or None, columns=d.columns,
            **args.runtime,
        )
    except (KeyboardInterrupt, Terminated) as stop:
        stop.kept = _kept_note(args)  # type: ignore[union-attr]  # main's exit line says it
        raise
    _print_summary(feats)
    if args.report:
        from ...reports import report_page

        summary = [("model", m.text), ("data", d.data), ("written to", str(feats.path))]
        ReportArgs.write(args, report_page(feats, f"extract from {m.text} over {d.data}", summary=summary))
    return 0


def _kept_note(args: Args) -> str:
    """After Ctrl-C (or SIGTERM): how many complete shards OUT_DIR keeps, and the command that goes on."""
    import shlex
    from pathlib import Path

    from ...dataset.manifest import NAME, Manifest
    from ...errors import LayertapError

    out = Path(args.dataset.out)
    try:
        shards = Manifest.read(out).shards if (out / NAME).is_file() else {}
    except LayertapError:
        shards = {}
    if not shards:
        return f"no shard was complete, so '{out}' keeps nothing; run the same command to start again"
    samples = sum(len(r["ids"]) for r in shards.values())
    argv = list(args.argv or sys.argv[1:])
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
