"""Griffe extension: the docstrings' Sphinx markup, as the API reference should show it.

The docstrings are Google style with reST inline markup (``:class:`LockManager```,
``:mod:`~actors.keys```), which Markdown would print as is. Each role becomes an
optional cross-reference: a link when its target is on the site, plain code otherwise
(``redis.Redis``, ``pykka.ActorRef``), so a reference to another library never fails
the strict build. An attribute documented by ``#:`` comments above it gets them as its
docstring.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import griffe

if TYPE_CHECKING:
    from collections.abc import Iterator

#: A Google-style "Example:" section is an admonition whose ``>>>`` lines Markdown would quote;
#: "Examples:" is parsed into code blocks.
EXAMPLE = re.compile(r"^(\s*)Example:[ \t]*$", re.MULTILINE)
ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const):`(~?)([^`]+)`")


def _walk(obj: griffe.Object | griffe.Alias) -> Iterator[griffe.Object]:
    if isinstance(obj, griffe.Alias):
        return
    yield obj
    for member in obj.members.values():
        yield from _walk(member)


@functools.cache
def _source(path: str) -> list[str]:
    return Path(path).read_text(encoding="utf-8").splitlines()


def _comment_docstring(obj: griffe.Object) -> str | None:
    """The ``#:`` comment lines right above an attribute (Sphinx's way to document one)."""
    if not isinstance(obj.filepath, Path) or obj.lineno is None:
        return None
    lines = _source(str(obj.filepath))
    above: list[str] = []
    number = obj.lineno - 2
    while number >= 0 and lines[number].strip().startswith("#:"):
        above.insert(0, lines[number].strip()[2:].strip())
        number -= 1
    return "\n".join(above) or None


def _target(obj: griffe.Object, name: str) -> str:
    name = name.strip().rstrip("()")
    if name.startswith("."):
        name = name.lstrip(".")
    try:
        return obj.resolve(name.split(".")[0]) + name[len(name.split(".")[0]) :]
    except (griffe.NameResolutionError, ValueError):
        return name


class SphinxRoles(griffe.Extension):
    """Read ``#:`` comments, and turn every ``:role:`target``` of the package into an autoref."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:  # noqa: D102
        for obj in _walk(pkg):
            if obj.docstring is None and obj.is_attribute:
                comment = _comment_docstring(obj)
                if comment:
                    obj.docstring = griffe.Docstring(comment, parent=obj)
            if obj.docstring is None:
                continue

            def link(match: re.Match[str], obj: griffe.Object = obj) -> str:
                short, name = match.group(1), match.group(2)
                title = name.rsplit(".", 1)[-1] if short else name
                identifier = _target(obj, name)
                return f'<autoref identifier="{identifier}" optional><code>{title}</code></autoref>'

            text = EXAMPLE.sub(r"\1Examples:", obj.docstring.value)
            obj.docstring.value = ROLE.sub(link, text)
