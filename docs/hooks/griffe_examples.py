"""Griffe extension for the API page: the project's docstrings read as Markdown.

- ``Example:`` sections become Google style ``Examples:`` sections, so their doctests render as
  Python code blocks (Griffe parses only the plural title as an examples section; the singular
  one would be an admonition of plain text);
- Sphinx cross-reference roles (``:func:`~layertap.runtimes.run```, ``:class:`Tap```) become
  inline code of the name as Sphinx would show it (the last part after ``~``), instead of the
  role's raw text.
"""

from __future__ import annotations

import re

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:[ \t]*$", re.MULTILINE)
_ROLE = re.compile(r":(?:func|class|meth|attr|mod|data|exc|obj):`(~?)([^`]+)`")


def _role(m: re.Match) -> str:
    name = m.group(2)
    return f"`{name.rsplit('.', 1)[-1] if m.group(1) else name}`"


class ExampleSections(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(_role, _EXAMPLE.sub(r"\1Examples:", obj.docstring.value))
