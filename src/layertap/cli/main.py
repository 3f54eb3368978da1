"""Entry point: build the parser from the tools, run one, map errors to exits.

Exit status: 0 success, 1 the numbers disagree, 2 bad input or usage. A user
error prints one line ``layertap: error: ...`` on stderr and no traceback
unless ``--debug`` is given. A stdout whose reader has gone (``layertap layers
m.onnx | head``) ends the command quietly with status 141 (128 + SIGPIPE), as
``git log | head`` does.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import sys
import textwrap
import warnings
from typing import Iterator, NoReturn, Sequence

from .. import __version__
from ..errors import LayertapError, LayertapWarning, one_line, printable
from ..files.reads import operation
from ..files.signals import Terminated, published, raise_if_stopped, signals_stop, stopped_by
from .console import quiet_exit, stdout_closed

# subcommand -> "module:Class" under layertap.cli.tools; imported when the parser is built
TOOLS = {
    "layers": "layers:LayersTool",
    "extract": "extract:ExtractTool",
    "export": "export:ExportTool",
    "add-outputs": "add_outputs:AddOutputsTool",
    "run": "run:RunTool",
    "compare": "compare:CompareTool",
    "fix": "fix:FixTool",
    "repro": "repro:ReproTool",
    "demo": "demo:DemoTool",
}


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line and exit 2."""

    def error(self, message: str) -> NoReturn:
        raise LayertapError(f"{message} (see '{self.prog} --help')")


class HelpFormatter(argparse.HelpFormatter):
    """Help fitted to the terminal width that never splits a word (a long name such as
    ``convert_float_to_float16`` moves whole to the next line); an example command too long
    for a line is cut between its arguments and continued with ``\\``, as a shell reads it."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), max(width, 20), break_long_words=False, break_on_hyphens=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        width = max(width, 20)
        lines: list[str] = []
        for line in text.splitlines():
            body = line.lstrip()
            lead = indent + line[: len(line) - len(body)]
            if body.startswith("layertap "):  # an example command: cut between arguments, continued with \
                parts = _command_lines(body, width - len(lead) - 6)
                cont = [" \\"] * (len(parts) - 1) + [""]
                lines.extend((lead if i == 0 else lead + "    ") + part + cont[i] for i, part in enumerate(parts))
            else:
                more = lead + ("  " if body.startswith("#") else "")  # a comment's next lines under its text
                lines.extend(textwrap.wrap(body, width, initial_indent=lead, subsequent_indent=more,
                                           break_long_words=False, break_on_hyphens=False) or [""])
        return "\n".join(lines)


def _command_lines(command: str, width: int) -> list[str]:
    """A command cut into lines of at most ``width`` where it can be: before an option, never
    between an option and its value.

    Example:
        >>> _command_lines("layertap run a.onnx --tap x -o acts.npz", 24)
        ['layertap run a.onnx', '--tap x -o acts.npz']
    """
    units: list[str] = []
    for word in command.split():
        if units and not word.startswith("-") and (units[-1].startswith("-") and " " not in units[-1] or not units[-1].startswith("-")):
            units[-1] += " " + word
        else:
            units.append(word)
    lines: list[str] = []
    for unit in units:
        if lines and len(lines[-1]) + 1 + len(unit) <= width:
            lines[-1] += " " + unit
        else:
            lines.append(unit)
    return lines


def examples_epilog(examples: Sequence[str]) -> str | None:
    """A tool's examples as the epilog of its ``--help``: ``examples:``, then each command indented
    (a ``  # comment`` after a command goes on the line below it).

    Example:
        >>> print(examples_epilog(["layertap layers torchvision:resnet18  # every module call"]))
        examples:
          layertap layers torchvision:resnet18
              # every module call
    """
    if not examples:
        return None
    lines = ["examples:"]
    for example in examples:
        command, _, comment = example.partition("  # ")
        lines.append(f"  {command.strip()}")
        if comment:
            lines.append(f"      # {comment.strip()}")
    return "\n".join(lines)


def _load_tool(spec: str):
    module, cls = spec.split(":")
    return getattr(importlib.import_module(f"layertap.cli.tools.{module}"), cls)()


def build_parser() -> tuple[argparse.ArgumentParser, dict]:
    parser = _Parser(prog="layertap", description="What does layer X of my model output?", formatter_class=HelpFormatter,
                     epilog="run 'layertap COMMAND --help' for a command's options and examples")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    tools = {}
    for name, spec in TOOLS.items():
        tool = _load_tool(spec)
        p = sub.add_parser(name, help=tool.help, description=tool.description or tool.help, formatter_class=HelpFormatter,
                           epilog=examples_epilog(tool.examples))
        p.add_argument("--debug", action="store_true", help="show tracebacks")
        tool.add_arguments(p)
        tools[name] = tool
    return parser, tools


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``layertap`` with ``argv``; return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    with signals_stop():  # also while an error is reported: it asks stopped_by() what stopped the command
        return _main(argv)


def _main(argv: list[str]) -> int:
    debug = "--debug" in argv
    try:
        parser, tools = build_parser()
        ns, extra = parser.parse_known_args(argv)
        if not ns.command:
            parser.print_help()
            return 2
        if extra:  # argparse would point at the top-level help; the subcommand's own lists its options
            raise LayertapError(f"unrecognized arguments: {' '.join(extra)} (see 'layertap {ns.command} --help')")
        ns.argv = argv  # a command that keeps partial results names the command line that continues it
        with _operation(), _warnings_one_line(), _json_stdout(getattr(ns, "json", False)):
            code = _run_tool(tools[ns.command], ns)
        raise_if_stopped()  # a signal some library dropped still stops the command, as it stopped its outputs
        sys.stdout.flush()  # output still buffered fails here, where a closed pipe ends quietly
        return code
    except BrokenPipeError as e:
        if stdout_closed():  # `layertap ... | head`: the reader has what it wanted
            return quiet_exit()
        if debug:
            raise
        return _unexpected(e)
    except (Terminated, KeyboardInterrupt) as e:
        return _stopped(e)
    except SystemExit:
        raise
    except BaseException as e:
        # a library that turned the interrupt into an error of its own (torch's exporter), or dropped it
        stop = interrupt_in(e) or stopped_by()
        if stop is not None and not debug:
            return _stopped(stop)
        if debug:
            raise
        if isinstance(e, LayertapError):
            _error(str(e))
            return e.exit_code
        return _unexpected(e)


def interrupt_in(e: BaseException) -> BaseException | None:
    """The SIGINT (``KeyboardInterrupt``) or SIGTERM/SIGHUP (:class:`Terminated`) behind ``e``: itself, or one
    of the exceptions it was raised from or while handling; ``None`` when there is none.

    Example:
        >>> try:
        ...     try:
        ...         raise KeyboardInterrupt
        ...     except KeyboardInterrupt:
        ...         raise AttributeError("module 'torch._dynamo' has no attribute 'exc'")
        ... except AttributeError as e:
        ...     type(interrupt_in(e)).__name__
        'KeyboardInterrupt'
    """
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, (KeyboardInterrupt, Terminated)):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


def _stopped(e: BaseException) -> int:
    """A command stopped by a signal: one line, and 128 + the signal's number (130 for SIGINT). An output
    published before the signal was handled is complete, and the line names it."""
    kept = _kept(e)
    written = [] if kept else published()  # a command that keeps partial results says what it kept itself
    shown = ", ".join(written[:3]) + (f" and {len(written) - 3} more" if len(written) > 3 else "")
    done = f"{shown} had been written in full when it arrived" if written else ""
    if isinstance(e, Terminated):
        base = kept or "temporary files were removed" + ("" if written else " and no output was changed")
        _error(f"stopped by {e.name}; " + "; ".join(w for w in (base, done) if w))
        return 128 + e.signum
    said = "; ".join(w for w in (kept, done) if w)
    _error(f"interrupted; {said}" if said else "interrupted")
    return 130


def _unexpected(e: BaseException) -> int:
    """An error that is neither the user's nor a signal, as one line (--debug shows its traceback)."""
    _error(f"{type(e).__name__}: {one_line(e)} (rerun with --debug for the traceback)")
    return 2


def _kept(stop: BaseException) -> str:
    """What a command stopped by a signal kept, when it keeps partial results (it sets ``stop.kept``)."""
    return str(getattr(stop, "kept", ""))


def _run_tool(tool, ns: argparse.Namespace) -> int:
    # argparse's --help/--version exit while parsing, before this point: a
    # SystemExit from here on comes from code the command ran (the user's model).
    try:
        return int(tool.run(tool.parse(ns)) or 0)
    except SystemExit as e:
        if stdout_closed():  # rich, in the model's code too, exits on a write to a closed pipe
            raise BrokenPipeError(errno.EPIPE, "stdout was closed") from None
        raise LayertapError(
            f"the model code called sys.exit({e.code!r}) while 'layertap {ns.command}' was running it; "
            "layertap stopped (exit 2): make the model's import, factory and forward return instead of exiting"
        ) from None


@contextlib.contextmanager
def _warnings_one_line() -> Iterator[None]:
    """layertap's own warnings (something in an input was ignored) as one ``layertap: warning:`` line."""
    shown: set[str] = set()
    with warnings.catch_warnings():
        default = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if not issubclass(category, LayertapWarning):
                return default(message, category, filename, lineno, file, line)
            text = printable(one_line(message))
            if text not in shown:
                shown.add(text)
                sys.stderr.write(f"layertap: warning: {text}\n")
            return None

        warnings.showwarning = show
        yield


def _operation():
    return operation()


@contextlib.contextmanager
def _json_stdout(as_json: bool) -> Iterator[None]:
    """With ``--json``, anything else printed to stdout (the model's own print) goes to stderr."""
    if not as_json:
        yield
        return
    from .tools import base  # noqa: PLC0415 -- cli.main imports no tool: they load when the parser is built

    base.JSON_OUT = sys.stdout
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        base.JSON_OUT = None


def _error(message: str) -> None:
    sys.stderr.write(f"layertap: error: {printable(one_line(message))}\n")


def _version() -> str:
    return f"layertap {__version__}"
