"""The base class every CLI tool derives from."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Sequence

from ..args import ArgGroup


class Tool:
    """One ``layertap`` subcommand: a name, its argument groups, and ``run``.

    Subclasses set ``name``, ``help`` and ``groups`` and implement ``run``,
    which returns the exit status (0 ok, 1 numbers disagree). User errors are
    raised as :class:`~layertap.errors.LayertapError` (exit 2).
    """

    name: str = ""
    help: str = ""
    groups: Sequence[ArgGroup] = ()

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        for group in self.groups:
            group.add(parser)
        self.add_own_arguments(parser)

    def add_own_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Options only this tool has."""

    def run(self, ns: argparse.Namespace) -> int:
        raise NotImplementedError

    # -- output helpers ----------------------------------------------------
    @staticmethod
    def print_table(table: Any, as_json: bool = False) -> None:
        """Print a :class:`~layertap.report.Table` as rich text or JSON."""
        if as_json:
            sys.stdout.write(table.to_json() + "\n")
            return

        console = stdout_console()
        console.print(table)
        for line in table.footer():
            console.print(line, markup=False, highlight=False)

    @staticmethod
    def say(message: str) -> None:
        """A status line on stderr (keeps stdout clean for --json)."""
        from rich.console import Console

        Console(stderr=True, width=10_000 if not sys.stderr.isatty() else None).print(
            message, markup=False, highlight=False, soft_wrap=True
        )


def stdout_console():
    """A rich console for stdout; wide when piped so names and paths are never cut.

    On a terminal rich fits the window; piped output (a file, ``less``, CI
    logs) would otherwise get rich's 80-column default and cut module paths.
    """
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 200)
