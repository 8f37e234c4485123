"""Griffe extension: the docstrings' Sphinx markup, as the API reference should show it.

The docstrings are Google style with reST inline markup (``:class:`LockManager```,
``:mod:`~actors.keys```), which Markdown would print as is. Each role becomes an
optional cross-reference: a link when its target is on the site, plain code otherwise
(``redis.Redis``, ``pykka.ActorRef``), so a reference to another library never fails
the strict build. A reST literal block (a paragraph ending in ``::`` and the indented
lines after it) becomes a fenced code block. An attribute documented by ``#:`` comments
above it gets them as its docstring.
"""

from __future__ import annotations

import functools
import re
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

import griffe

if TYPE_CHECKING:
    from collections.abc import Iterator

#: A Google-style "Example:" section is an admonition whose ``>>>`` lines Markdown would quote;
#: "Examples:" is parsed into code blocks.
EXAMPLE = re.compile(r"^(\s*)Example:[ \t]*$", re.MULTILINE)
#: A reST literal block: a line ending in ``::``, a blank line, then lines indented deeper.
LITERAL = re.compile(
    r"^(?P<indent>[ \t]*)(?P<text>[^\n]*?)(?P<space>[ \t]*)::[ \t]*\n"
    r"(?P<block>(?:[ \t]*\n)+(?:(?P=indent)[ \t]+[^\n]*\n(?:[ \t]*\n)*)+)",
    re.MULTILINE,
)
#: A fenced code block, kept whole by ``re.split``.
FENCE = re.compile(r"(^[ \t]*```[^\n]*\n.*?^[ \t]*```[ \t]*$)", re.MULTILINE | re.DOTALL)
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


def _fence(match: re.Match[str]) -> str:
    """One reST literal block as a Markdown fence.

    At the top level the fence starts the line (indented four spaces it would be
    Markdown's own code block); inside a section it keeps the block's own indentation,
    so it stays part of the item it belongs to.
    """
    indent, text, space = match.group("indent"), match.group("text"), match.group("space")
    raw = match.group("block").strip("\n")
    block = textwrap.dedent(raw)
    at = raw[: len(raw) - len(raw.lstrip())] if indent else ""
    # "text::" reads "text:"; "text ::" and a lone "::" say nothing themselves.
    lead = f"{indent}{text}{'' if space else ':'}\n\n" if text else ""
    body = textwrap.indent(block, at, lambda line: bool(line.strip()))
    return f"{lead}{at}```python\n{body}\n{at}```\n\n"


def _markdown(text: str) -> str:
    """Literal blocks fenced, then roles linked outside the fences."""
    text = LITERAL.sub(_fence, EXAMPLE.sub(r"\1Examples:", text + "\n"))
    return text.rstrip("\n")


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

            parts = FENCE.split(_markdown(obj.docstring.value))
            # Odd parts are fenced code: roles there are code too.
            obj.docstring.value = "".join(
                part if index % 2 else ROLE.sub(link, part) for index, part in enumerate(parts)
            )
