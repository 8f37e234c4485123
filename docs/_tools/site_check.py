"""Checks of the built documentation site.

``links SITE``: every internal link and image of every page of the built site points at a
file that exists, and every ``#fragment`` at an element of that page with that id.

``browse SITE OUT``: serves the site on a free loopback port, loads the home page, a guide
and an API page in headless Chromium (the Debian ``chromium`` package), saves a screenshot
of each in OUT, and fails when a page renders blank or when any internal link of the
served site answers with an error.

Run through ``make docs`` and ``make docs-check``.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

#: The pages ``browse`` looks at: the home page, one guide, one API page.
PAGES = {
    "home": "",
    "guide-leases": "guides/leases/",
    "api-manager": "reference/manager/",
}
#: A page whose main text is shorter than this is taken for blank.
MIN_TEXT = 200
#: A screenshot whose most common colour covers more than this share of it is taken for blank.
MAX_BACKGROUND = 0.985


class _Page(HTMLParser):
    """Collects a page's links, image sources, element ids and the text of its article."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.links: list[str] = []
        self.ids: set[str] = set()
        self.text: list[str] = []
        self._article = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if values.get("id"):
            self.ids.add(str(values["id"]))
        if tag == "a" and values.get("name"):
            self.ids.add(str(values["name"]))
        for name in ("href", "src"):
            if tag in {"a", "img", "link", "script"} and values.get(name):
                self.links.append(str(values[name]))
        if tag == "article" or self._article:
            self._article += 1

    def handle_endtag(self, tag: str) -> None:
        if self._article:
            self._article -= 1

    def handle_data(self, data: str) -> None:
        if self._article:
            self.text.append(data)


def _parse(html: str) -> _Page:
    page = _Page()
    page.feed(html)
    return page


def _is_internal(link: str) -> bool:
    parts = urlsplit(link)
    return not (parts.scheme or parts.netloc or link.startswith(("mailto:", "javascript:")))


def _target_file(site: Path, page: Path, link: str) -> Path:
    path = unquote(urlsplit(link).path)
    if path.startswith("/"):  # the 404 page's links start at the site's root
        target = (site / path.lstrip("/")).resolve()
    else:
        target = (page.parent / path).resolve() if path else page
    if target.is_dir():
        target = target / "index.html"
    return target


def broken_links(site: Path) -> list[str]:
    """Return one line per broken internal link or fragment in the built site."""
    site = site.resolve()
    pages = {path: _parse(path.read_text(encoding="utf-8")) for path in site.rglob("*.html")}
    problems: list[str] = []
    for path, page in sorted(pages.items()):
        for link in page.links:
            if not _is_internal(link):
                continue
            target = _target_file(site, path, link)
            where = f"{path.relative_to(site)}: {link}"
            if not target.is_relative_to(site) or not target.exists():
                problems.append(f"{where}: no such file")
                continue
            fragment = unquote(urlsplit(link).fragment)
            if fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else set()
                if fragment not in ids:
                    problems.append(f"{where}: no element with id {fragment!r}")
    return problems


def _serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """Log nothing: failures are reported by the checks."""


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    raise SystemExit("no chromium on PATH: apt-get install -y chromium")


def _browser(*arguments: str, profile: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            _chromium(),
            "--headless",
            "--no-sandbox",  # root in a container has no user namespace for the sandbox
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            f"--user-data-dir={profile}",
            "--window-size=1280,1400",
            "--virtual-time-budget=3000",
            *arguments,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _background_share(png: Path) -> float:
    # Only docs-check needs Pillow (the test extra's matplotlib brings it), not make docs.
    from PIL import Image  # noqa: PLC0415

    with Image.open(png) as image:
        colours = image.convert("RGB").getcolors(maxcolors=1 << 24) or []
        total = image.width * image.height
    return max(count for count, _ in colours) / total if colours else 1.0


def _crawl(base: str) -> list[str]:
    """Fetch every internal page, asset and fragment of the served site, from its home page."""
    seen: set[str] = set()
    ids: dict[str, set[str]] = {}
    fragments: list[tuple[str, str, str]] = []
    problems: list[str] = []
    queue = [base]
    while queue:
        url = queue.pop()
        if url in seen:
            continue
        seen.add(url)
        try:
            with urllib.request.urlopen(url, timeout=10) as answer:
                body = answer.read()
                kind = answer.headers.get_content_type()
        except urllib.error.URLError as error:
            problems.append(f"{url}: {error}")
            continue
        if kind != "text/html":
            continue
        page = _parse(body.decode("utf-8"))
        ids[url] = page.ids
        for link in page.links:
            if not _is_internal(link):
                continue
            absolute = urljoin(url, link)
            target, _, fragment = absolute.partition("#")
            if fragment:
                fragments.append((url, target, unquote(fragment)))
            if target.startswith(base) and target not in seen:
                queue.append(target)
    for page_url, target, fragment in fragments:
        if target in ids and fragment not in ids[target]:
            problems.append(f"{page_url}: link to {target}#{fragment}: no such id")
    return problems


def browse(site: Path, out: Path) -> list[str]:
    """Screenshot the chosen pages in headless Chromium; return what looks wrong."""
    out.mkdir(parents=True, exist_ok=True)
    server, base = _serve(site)
    problems: list[str] = []
    try:
        with tempfile.TemporaryDirectory() as profile:
            for name, path in PAGES.items():
                url = base + path
                shot = out / f"{name}.png"
                shot.unlink(missing_ok=True)
                taken = _browser(f"--screenshot={shot}", url, profile=profile)
                if not shot.exists():
                    problems.append(f"{url}: no screenshot ({taken.stderr.strip()[-300:]})")
                    continue
                share = _background_share(shot)
                if share > MAX_BACKGROUND:
                    problems.append(f"{url}: blank ({share:.1%} of the screenshot is one colour)")
                dom = _browser("--dump-dom", url, profile=profile).stdout
                text = " ".join("".join(_parse(dom).text).split())
                if len(text) < MIN_TEXT:
                    problems.append(f"{url}: blank ({len(text)} characters of text)")
                print(f"{name}: {shot} ({len(text)} characters, background {share:.1%})")
        problems += _crawl(base)
    finally:
        server.shutdown()
    return problems


def main(argv: list[str] | None = None) -> int:
    """Run one check; print every problem and return 1 if there is one."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("links").add_argument("site", type=Path)
    shots = commands.add_parser("browse")
    shots.add_argument("site", type=Path)
    shots.add_argument("out", type=Path)
    arguments = parser.parse_args(argv)
    if not (arguments.site / "index.html").exists():
        parser.error(f"{arguments.site} holds no built site: run make docs first")
    if arguments.command == "links":
        problems = broken_links(arguments.site)
    else:
        problems = browse(arguments.site, arguments.out)
    for problem in problems:
        print(problem, file=sys.stderr)
    if not problems and arguments.command == "links":
        print(f"{arguments.site}: every internal link and fragment resolves")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
