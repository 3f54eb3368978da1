"""``layertap extract MODEL|FILE.onnx --tap ... --data PATH -o OUT_DIR``: features of a whole dataset."""

from __future__ import annotations

import shlex
import sys
from dataclasses import replace
from pathlib import Path

from ...dataset.manifest import NAME, Manifest
from ...errors import LayertapError
from ...files.signals import Terminated
from ..args import Args, ReportArgs, need
from ..console import stdout_console


def run_dataset(args: Args) -> int:
    """Extract over ``--data`` into OUT_DIR; print what was written (every path was checked by parse)."""
    from ...dataset.extraction import extract_dataset

    d = need(args.dataset, "no --data")
    m = args.model
    try:
        feats = extract_dataset(
            m.text if m.is_onnx else m.model, d.data, args.tap_texts, d.out, batch_size=d.batch_size, format=d.format,
            pool=d.pool, resume=d.resume, device=d.device, dataset_options=replace(d.options, stop_early=args.own),
            runtime_options=args.runtime, sample_options=d.sampling,
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
    out = Path(need(args.dataset, "no --data").out)
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
