"""Entry point: build the parser from the tools, run one, map errors to exits.

Exit status: 0 success, 1 the numbers disagree, 2 bad input or usage. A user
error prints one line ``layertap: error: ...`` on stderr and no traceback
unless ``--debug`` is given.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NoReturn, Sequence

from ..errors import LayertapError

# subcommand -> "module:Class" under layertap.cli.tools; imported when the parser is built
TOOLS = {
    "layers": "layers:LayersTool",
    "extract": "extract:ExtractTool",
    "export": "export:ExportTool",
    "add-outputs": "add_outputs:AddOutputsTool",
    "run": "run:RunTool",
    "compare": "compare:CompareTool",
    "demo": "demo:DemoTool",
}


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one line and exit 2."""

    def error(self, message: str) -> NoReturn:
        raise LayertapError(f"{message} (see '{self.prog} --help')")


def _load_tool(spec: str):
    module, cls = spec.split(":")
    return getattr(importlib.import_module(f"layertap.cli.tools.{module}"), cls)()


def build_parser() -> tuple[argparse.ArgumentParser, dict]:
    parser = _Parser(prog="layertap", description="What does layer X of my model output?")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    tools = {}
    for name, spec in TOOLS.items():
        tool = _load_tool(spec)
        p = sub.add_parser(name, help=tool.help, description=tool.help)
        p.add_argument("--debug", action="store_true", help="show tracebacks")
        tool.add_arguments(p)
        tools[name] = tool
    return parser, tools


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``layertap`` with ``argv``; return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        parser, tools = build_parser()
        ns = parser.parse_args(argv)
        if not ns.command:
            parser.print_help()
            return 2
        return int(tools[ns.command].run(ns) or 0)
    except LayertapError as e:
        if debug:
            raise
        _error(str(e))
        return e.exit_code
    except KeyboardInterrupt:
        _error("interrupted")
        return 130
    except SystemExit:
        raise
    except BaseException as e:
        if debug:
            raise
        _error(f"{type(e).__name__}: {_first_line(e)} (rerun with --debug for the traceback)")
        return 2


def _error(message: str) -> None:
    sys.stderr.write(f"layertap: error: {_first_line(message)}\n")


def _first_line(e: object) -> str:
    text = str(e).strip() or type(e).__name__
    return " ".join(text.split())  # one line, whatever the message held


def _version() -> str:
    from .. import __version__

    return f"layertap {__version__}"
