"""MkDocs hook: the reference pages, generated from the code at build time.

- ``docs/cli.md`` holds the marker ``<!-- layertap-cli -->``; it becomes one section per
  subcommand (usage, description, options by group, the tool's examples), read from
  ``layertap.cli.main.build_parser()`` of this checkout, so the page cannot drift from the parser.
- ``docs/api.md`` holds ``<!-- layertap-api -->``; it becomes one mkdocstrings ``:::`` block per
  name of ``layertap.__all__``, at the module that defines it (the package imports its names
  lazily, which static analysis cannot follow).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

MARKER = "<!-- layertap-cli -->"
API_MARKER = "<!-- layertap-api -->"
SRC = Path(__file__).resolve().parents[2] / "src"


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, cli_markdown())
    if API_MARKER in markdown:
        markdown = markdown.replace(API_MARKER, api_markdown())
    return markdown


def _import_src() -> None:
    if str(SRC) not in sys.path:
        sys.path.insert(0, str(SRC))


def api_markdown() -> str:
    """A ``:::`` block per public name: functions first, then classes, each group in ``__all__`` order."""
    _import_src()
    import layertap

    exports = layertap._EXPORTS
    names = [n for n in layertap.__all__ if not n[0].isupper()] + [n for n in layertap.__all__ if n[0].isupper()]
    parts = []
    for i, name in enumerate(names):
        if i == 0 or name[0].isupper() != names[i - 1][0].isupper():
            parts += ["## Classes" if name[0].isupper() else "## Functions", ""]
        parts += [f"::: {_defined_at(exports[name], name)}", "    options:", "      heading_level: 3", ""]
    return "\n".join(parts)


def _defined_at(module: str, name: str) -> str:
    """``layertap.fixing.fix.fix`` for ``(".fixing", "fix")``: where the package imports a name
    from a subpackage that has a submodule of the same name, the dotted path would name the module."""
    path = "layertap" + module
    folder = SRC.joinpath(*path.split("."))
    if (folder / f"{name}.py").exists() or (folder / name).is_dir():
        path += f".{name}"
    return f"{path}.{name}"


def cli_markdown() -> str:
    """Markdown for every subcommand of ``layertap``, in the order ``layertap --help`` lists them."""
    _import_src()
    from layertap.cli.main import build_parser

    parser, _tools = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help for c in sub._choices_actions}
    rows = [f"| [`{name}`](#layertap-{name}) | {_escape(helps.get(name) or '')} |" for name in sub.choices]
    parts = ["## layertap", "", _usage(parser), "", "| command | does |", "|---|---|", *rows, "",
             "`layertap --version` prints the version; every command takes `--debug` (tracebacks) and `--help`.", ""]
    for name, command in sub.choices.items():
        parts += [f"## layertap {name}", "", _escape(helps.get(name) or ""), "", _usage(command)]
        if command.description and command.description != helps.get(name):
            parts += ["", _escape(command.description)]
        parts += ["", _options(command)]
        if command.epilog:
            parts += ["", "Examples:", "", "```text", *_examples(command.epilog), "```"]
        parts.append("")
    return "\n".join(parts)


def _usage(parser: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(parser.prog, width=80)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups, prefix="")
    return "```text\n" + formatter.format_help().strip() + "\n```"


def _options(parser: argparse.ArgumentParser) -> str:
    out: list[str] = []
    formatter = parser._get_formatter()
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if a.help is not argparse.SUPPRESS]
        if not actions:
            continue
        out += [f"**{group.title}**", "", "| argument | meaning |", "|---|---|"]
        for action in actions:
            out.append(f"| {_flags(action)} | {_escape(_help(formatter, action))} |")
        out.append("")
    return "\n".join(out)


def _flags(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    takes_value = action.nargs != 0
    metavar = action.metavar or action.dest.upper() if takes_value else ""
    if isinstance(metavar, tuple):
        metavar = " ".join(metavar)
    *short, last = action.option_strings
    return ", ".join([*(f"`{s}`" for s in short), f"`{last} {metavar}`" if metavar else f"`{last}`"])


def _help(formatter: argparse.HelpFormatter, action: argparse.Action) -> str:
    text = formatter._expand_help(action) if action.help else ""
    if action.choices and not isinstance(action, argparse._SubParsersAction) and "{" not in text:
        text += f" (one of: {', '.join(map(str, action.choices))})"
    return " ".join(text.split())


def _examples(epilog: str) -> list[str]:
    lines = [line[2:] if line.startswith("  ") else line for line in epilog.splitlines()]
    return [line for line in lines if line.strip() and line.strip() != "examples:"]


def _escape(text: str) -> str:
    """Plain help text as Markdown table-safe text: pipes, angle brackets and stars taken literally."""
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;").replace("*", "\\*")
