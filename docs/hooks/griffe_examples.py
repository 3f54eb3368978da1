"""Griffe extension for the API page: the project's ``Example:`` docstring sections read as Google
style ``Examples:`` sections, so their doctests render as Python code blocks (Griffe parses only
the plural title as an examples section; the singular one would be an admonition of plain text).
"""

from __future__ import annotations

import re

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:[ \t]*$", re.MULTILINE)


class ExampleSections(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _EXAMPLE.sub(r"\1Examples:", obj.docstring.value)
