"""A griffe extension for the API pages: the package's docstrings are Google style with Sphinx
markup inside (``code`` and :func:`target` roles, ``::`` before a literal block). mkdocstrings
reads Markdown, where a role would show as ``:func:`` text: each role becomes inline code of the
name it points at, and a literal-block ``::`` a plain colon (the indented block after it is
already code in Markdown)."""

from __future__ import annotations

import re

from griffe import Extension, Object

#: :func:`~a.b.c`, :class:`a.b.C`, :mod:`text <a.b>`; ``~`` keeps the last part only, as Sphinx shows it
_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|exc|data|obj|const|ref|term):`(~?)([^`<]*?)\s*(?:<([^`>]+)>)?`")
_LITERAL_MARKER = re.compile(r"(\S)::$", re.MULTILINE)


def _role(match: re.Match) -> str:
    short, text, target = match.group(1), match.group(2), match.group(3)
    name = text or target or ""
    if short:
        name = name.rsplit(".", 1)[-1]
    return f"`{name}`"


def markdown_docstring(text: str) -> str:
    """``text`` with its Sphinx roles as inline code and its literal-block markers as colons."""
    return _LITERAL_MARKER.sub(r"\1:", _ROLE.sub(_role, text))


class SphinxRoles(Extension):
    """Rewrites every docstring of the loaded package as Markdown (see the module docstring)."""

    def on_object(self, *, obj: Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown_docstring(obj.docstring.value)
