"""The code in the README and in every page of the docs site: it closes, compiles and runs.

Every fenced block names its language and closes. Every Python block compiles, and what it
takes from ``actors`` exists and is called with arguments its signature accepts. Blocks marked
``<!-- test: run -->`` run as scripts against the test server, after the page's
``<!-- test: setup ... -->`` code and before its ``<!-- test: teardown ... -->`` code (HTML
comments: the site and GitHub show neither). The site's own checks (strict build, internal
links) are ``make docs``; the link checker is proved here on a site built to be broken.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest

if TYPE_CHECKING:
    import redis

    from tests.support.server import Server

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(p for p in DOCS.rglob("*.md") if "_tools" not in p.parts)]
FENCE = re.compile(r"^\s*```(\S*)\s*$")
RUN = "<!-- test: run -->"
#: A line that includes a file, or a section of one, into a block (``pymdownx.snippets``).
SNIPPET = re.compile(r'--8<-- "([^"]+)"')
HIDDEN = re.compile(r"^<!-- test: (setup|teardown)\n(.*?)^-->$", re.DOTALL | re.MULTILINE)

#: Run before an example: every ``redis.Redis`` it builds reaches the test server.
REDIRECT = """\
import redis

class _TestServer(redis.Redis):
    def __init__(self, *args, **options):
        options.update(host={host!r}, port={port!r}, db={db!r})
        super().__init__(*args, **options)

redis.Redis = _TestServer
"""


@dataclass(frozen=True)
class Block:
    """One fenced block of a page."""

    line: int
    language: str
    code: str
    run: bool


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def code_blocks(text: str, name: str = "README.md") -> list[Block]:
    """Return each fenced block, with the line of its opening fence.

    Raises:
        AssertionError: A fence opens inside a block, or the last block never closes.
    """
    blocks: list[Block] = []
    opened: tuple[int, str, bool] | None = None
    lines: list[str] = []
    before = ""
    for number, line in enumerate(text.splitlines(), start=1):
        fence = FENCE.match(line)
        if fence is None:
            if opened is not None:
                lines.append(line)
            elif line.strip():
                before = line.strip()
            continue
        if opened is None:
            opened, lines = (number, fence.group(1), before == RUN), []
        elif fence.group(1):
            raise AssertionError(
                f"{name}:{number}: a ```{fence.group(1)} fence opens inside the block "
                f"opened at line {opened[0]}"
            )
        else:
            blocks.append(Block(opened[0], opened[1], "\n".join(lines) + "\n", opened[2]))
            opened, before = None, ""
    assert opened is None, f"{name}:{opened[0]}: this block never closes"
    return blocks


def hidden(text: str, part: str) -> str:
    """The page's hidden ``setup`` or ``teardown`` code, empty if it has none."""
    return "".join(code for kind, code in HIDDEN.findall(text) if kind == part)


def section(text: str, name: str) -> str:
    """The lines of ``text`` between its ``--8<-- [start:name]`` and ``--8<-- [end:name]`` marks.

    Raises:
        AssertionError: The file has no such section.
    """
    mark = r"^[^\n]*--8<-- \[{}:" + re.escape(name) + r"\]"
    found = re.search(
        mark.format("start") + r"[^\n]*\n(.*?)" + mark.format("end"),
        text,
        re.DOTALL | re.MULTILINE,
    )
    assert found is not None, f"no section {name!r}"
    return found.group(1)


def included(code: str) -> str:
    """A block's code with each snippet line (``--8<-- "path[:section]"``) replaced as MkDocs does.

    Paths are from the repository's root (``pymdownx.snippets``' ``base_path``).
    """
    lines = []
    for line in code.splitlines(keepends=True):
        snippet = SNIPPET.fullmatch(line.strip())
        if snippet is None:
            lines.append(line)
            continue
        path, _, name = snippet.group(1).partition(":")
        text = (ROOT / path).read_text(encoding="utf-8")
        lines.append(section(text, name) if name else text)
    return "".join(lines)


def python_blocks(page: Path) -> list[Block]:
    return [
        Block(block.line, block.language, included(block.code), block.run)
        for block in code_blocks(page.read_text(encoding="utf-8"), _name(page))
        if block.language == "python"
    ]


def compiled(block: Block, name: str) -> ast.Module:
    # Some blocks show the body of a coroutine: await at top level is theirs.
    tree = compile(
        block.code,
        f"{name}:{block.line}",
        "exec",
        flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT,
    )
    assert isinstance(tree, ast.Module)
    return tree


def _imports(tree: ast.Module) -> tuple[dict[str, Any], dict[str, ModuleType], list[str]]:
    """The names and modules a block takes from ``actors``, and the names that do not exist."""
    names: dict[str, Any] = {}
    modules: dict[str, ModuleType] = {}
    mistakes: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "actors":
            module = importlib.import_module(str(node.module))
            for alias in node.names:
                if hasattr(module, alias.name):
                    names[alias.asname or alias.name] = getattr(module, alias.name)
                else:
                    mistakes.append(f"line {node.lineno}: {node.module} has no {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "actors":
                    modules[alias.asname or alias.name] = importlib.import_module(alias.name)
    return names, modules, mistakes


def api_mistakes(tree: ast.Module) -> list[str]:
    """What a block takes from ``actors`` that does not exist, or calls with bad arguments."""
    names, modules, mistakes = _imports(tree)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and not hasattr(modules[node.value.id], node.attr)
        ):
            mistakes.append(f"line {node.lineno}: {node.value.id} has no {node.attr}")
        if not isinstance(node, ast.Call) or any(isinstance(a, ast.Starred) for a in node.args):
            continue
        target = None
        if isinstance(node.func, ast.Name):
            target = names.get(node.func.id)
        elif isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name):
            target = getattr(modules.get(node.func.value.id), node.func.attr, None)
        if not callable(target):
            continue
        keywords = {k.arg: None for k in node.keywords if k.arg is not None}
        try:
            inspect.signature(target).bind(*[None] * len(node.args), **keywords)
        except TypeError as error:
            mistakes.append(f"line {node.lineno}: {ast.unparse(node.func)}(...): {error}")
    return mistakes


def script(server: Server, *parts: str) -> subprocess.CompletedProcess[str]:
    """Run the parts as one script, every ``redis.Redis`` pointed at the test server.

    A ``from __future__`` import of a block goes first, where Python wants it.
    """
    where = urlsplit(server.url)
    db = int(where.path.lstrip("/") or 0)
    prelude = REDIRECT.format(host=where.hostname, port=where.port, db=db)
    lines = "\n".join(parts).splitlines()
    future = [line for line in lines if line.startswith("from __future__ import")]
    rest = [line for line in lines if not line.startswith("from __future__ import")]
    return subprocess.run(
        [sys.executable, "-c", "\n".join([*future, prelude, *rest])],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )


def runnable() -> list[Any]:
    return [
        pytest.param(page, block, id=f"{_name(page)}:{block.line}")
        for page in PAGES
        for block in python_blocks(page)
        if block.run
    ]


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_code_fence_closes_and_names_its_language(page: Path) -> None:
    blocks = code_blocks(page.read_text(encoding="utf-8"), _name(page))

    unnamed = [block.line for block in blocks if not block.language]
    assert unnamed == [], f"fences without a language at {_name(page)} lines {unnamed}"


@pytest.mark.parametrize(
    "text",
    [
        "```sh\nmake test\n```\n\nmake fuzz\n```\n\nLayout:\n\n```\nactors/\n```\n",
        "```python\nx = 1\n```python\n",
        "```sh\nmake test\n",
    ],
    ids=["stray-closing-fence", "fence-inside-a-block", "never-closed"],
)
def test_a_broken_fence_is_found(text: str) -> None:
    with pytest.raises(AssertionError):
        code_blocks(text)


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_python_block_compiles_and_uses_the_api_as_it_is(page: Path) -> None:
    for block in python_blocks(page):
        tree = compiled(block, _name(page))

        assert api_mistakes(tree) == [], f"{_name(page)}:{block.line}"


@pytest.mark.parametrize(
    "code",
    [
        "from actors import track_jobs\n",
        "import actors\nactors.QueueKey('mail')\n",
        "from actors import track_job\ntrack_job(manager, '42', token, notfiy=me)\n",
        "from actors.api import start_link\nstart_link(conn, keys)\n",
    ],
    ids=["missing-name", "missing-attribute", "unknown-keyword", "too-many-positional"],
)
def test_a_block_that_drifted_from_the_api_is_found(code: str) -> None:
    block = Block(1, "python", code, run=False)

    assert api_mistakes(compiled(block, "page.md")) != []


def test_the_readme_and_the_guides_hold_python_to_check() -> None:
    assert len(python_blocks(README)) >= 3
    assert python_blocks(README)[0].run
    assert sum(len(python_blocks(page)) for page in PAGES) >= 10
    assert len(runnable()) >= 4


def test_the_readme_first_example_runs_quietly_against_a_real_server(
    server: Server, redis_client: redis.Redis
) -> None:
    # Given the README's first Python block (no hidden setup: it stands alone)
    first = python_blocks(README)[0].code

    # When it runs as a script against the test server
    result = script(server, first)

    # Then it succeeds, with logging on and nothing to warn about, and leaves no lock behind
    assert result.returncode == 0, result.stderr
    assert "logging.basicConfig" in first
    assert result.stderr == ""
    assert result.stdout == ""
    assert redis_client.keys("emq:mail:*") == []


@pytest.mark.parametrize(("page", "block"), runnable())
def test_a_marked_example_runs_against_a_real_server(
    server: Server, redis_client: redis.Redis, page: Path, block: Block
) -> None:
    # Given a block marked to run, and its page's hidden setup and teardown
    text = page.read_text(encoding="utf-8")

    # When they run as one script against the test server
    result = script(server, hidden(text, "setup"), block.code, hidden(text, "teardown"))

    # Then it succeeds without a warning or an error on stderr
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_a_snippet_line_is_replaced_by_the_section_it_names() -> None:
    code = 'import sqlite3\n--8<-- "examples/fenced_store.py:store"\nstore = None\n'

    expanded = included(code)

    assert expanded.startswith("import sqlite3\n")
    assert "class FencedStore:" in expanded
    assert "def main(" not in expanded
    assert "8<" not in expanded
    assert expanded.endswith("store = None\n")
    with pytest.raises(AssertionError):
        included('--8<-- "examples/fenced_store.py:nowhere"\n')


def test_the_readme_is_at_most_200_lines() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 200


def _make_test_line(page: Path) -> str:
    (line,) = [
        line
        for line in page.read_text(encoding="utf-8").splitlines()
        if line.startswith("make test ")
    ]
    return line


def test_the_readme_and_the_docs_describe_make_test_alike() -> None:
    readme = _make_test_line(README)

    assert _make_test_line(DOCS / "index.md") == readme
    assert _make_test_line(DOCS / "guides" / "getting-started.md") == readme


def test_where_to_start_points_at_every_guide() -> None:
    home = (DOCS / "index.md").read_text(encoding="utf-8")
    table = home.split("## Where to start", 1)[1].split("\n## ", 1)[0]
    linked = set(re.findall(r"\]\((guides/[^)#]+\.md)", table))

    guides = {f"guides/{page.name}" for page in (DOCS / "guides").glob("*.md")}
    assert guides - linked == set()
    assert {"guides/fencing.md", "guides/troubleshooting.md"} <= linked


def _slug(heading: str) -> str:
    """The anchor MkDocs and GitHub give a heading: lower case, punctuation gone, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_of_the_readme_reaches_a_file_and_a_heading() -> None:
    text = README.read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    local = [link for link in links if not urlsplit(link).scheme]

    assert len(local) >= 10
    for link in local:
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.is_file(), f"README.md links to {link}: no such file"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", target.read_text(encoding="utf-8"), re.MULTILINE)
            assert anchor in {_slug(h) for h in headings}, (
                f"README.md links to {link}: no such heading"
            )


def _site_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("site_check", DOCS / "_tools" / "site_check.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_link_check_finds_a_missing_page_and_a_missing_anchor(tmp_path: Path) -> None:
    # Given a built site whose home page links to a page that exists, one that does not,
    # and an anchor that its target page lacks
    (tmp_path / "guide").mkdir()
    (tmp_path / "guide" / "index.html").write_text(
        '<h2 id="install">Install</h2><a href="../#top">home</a>', encoding="utf-8"
    )
    (tmp_path / "index.html").write_text(
        '<p id="top"></p><a href="guide/#install">ok</a><a href="gone/">gone</a>'
        '<a href="guide/#nowhere">bad anchor</a><a href="https://example.org/x">out</a>',
        encoding="utf-8",
    )

    # When the site is checked
    problems = _site_check().broken_links(tmp_path)

    # Then exactly the two broken links are named
    assert len(problems) == 2, problems
    assert any("gone/" in p and "no such file" in p for p in problems)
    assert any("nowhere" in p for p in problems)
