"""The base class every CLI tool derives from."""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any, Iterator, Sequence

from ...errors import LayertapError, printable
from ..args import ArgGroup, Args
from ..console import say, status, stdout_closed, stdout_console

#: where ``--json`` output goes while stdout is redirected to stderr (set by cli.main)
JSON_OUT: Any = None


class Tool:
    """One ``layertap`` subcommand: a name, its argument groups, and ``run``.

    Subclasses set ``name``, ``help``, ``groups`` and ``examples`` (command lines shown at the
    end of ``--help``; ``"  # why"`` after a command explains it) and implement ``run``,
    which returns the exit status (0 ok, 1 numbers disagree). User errors are
    raised as :class:`~layertap.errors.LayertapError` (exit 2).

    The command line is parsed once (:meth:`parse`): the tool's own options
    first (:meth:`parse_own`, which also names the files the command reads),
    then every group in its ``order``. ``run`` gets the resulting
    :class:`~layertap.cli.args.Args` and reads its attributes only.
    """

    name: str = ""
    help: str = ""
    description: str = ""  # the command's own --help text, when longer than its line in `layertap --help`
    groups: Sequence[ArgGroup] = ()
    examples: Sequence[str] = ()

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        for group in self.groups:
            group.add(parser)
        self.add_own_arguments(parser)

    def add_own_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Options only this tool has."""

    def parse(self, ns: argparse.Namespace) -> Args:
        """Turn the namespace into typed values, checking each option once, before any work."""
        args = Args(argv=list(getattr(ns, "argv", None) or []))
        args.own = self.parse_own(ns, args)
        for group in sorted(self.groups, key=lambda g: g.order):
            group.parse(ns, args)
        self.finish(ns, args)
        return args

    def parse_own(self, ns: argparse.Namespace, args: Args) -> Any:
        """The tool's own options as a typed object; may set ``args.reads``. Runs before the groups."""
        return None

    def finish(self, ns: argparse.Namespace, args: Args) -> None:
        """Put the tool's own flags into the groups' option objects (``--memory-budget`` into the runtime
        options, say), so the library gets each option in one object. Runs after the groups."""

    def run(self, args: Args) -> int:
        raise NotImplementedError

    # -- output helpers ----------------------------------------------------
    @staticmethod
    def print_table(table: Any, as_json: bool = False) -> None:
        """Print a :class:`~layertap.tables.Table` as rich text or JSON."""
        if as_json:
            (JSON_OUT or sys.stdout).write(table.to_json() + "\n")
            return

        console = stdout_console()
        console.print(table)
        for line in table.footer():
            console.print(printable(line), markup=False, highlight=False)

    say = staticmethod(say)


@contextlib.contextmanager
def running(info: Any, method: str, args: tuple, kwargs: dict, *, spinner: bool = True) -> Iterator[None]:
    """Turn an error raised by the user's model into a one-line user error (layertap's
    own errors pass unchanged); ``spinner=False`` when the block reports its own progress."""
    from ...pytorch.example_inputs import run_failed

    with status(f"running {info.spec}.{method}") if spinner else contextlib.nullcontext():
        try:
            yield
        except LayertapError:
            raise
        except Exception as e:
            if isinstance(e, BrokenPipeError) and stdout_closed():  # the model printed to a closed pipe
                raise
            raise run_failed(e, info, method, args, kwargs) from e
