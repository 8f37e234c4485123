"""Checks of the built documentation site.

``links SITE``: every internal link and image of every page of the built site points at a
file that exists, and every ``#fragment`` at an element of that page with that id.

``browse SITE OUT``: serves the site on a free loopback port, loads the home page, a guide
and an API page in headless Chromium (the Debian ``chromium`` package), saves a screenshot
of each in OUT, and fails when a page renders blank or when any internal link of the
served site answers with an error. On those pages and on every API page it also measures
the layout at a 1280 px wide viewport, and fails when a code block (a ``pre``) is wider
than its container or scrolls sideways, or when a cell of a docstring table (Parameters,
Raises, ...) is clipped: cut off by the table's scrolling box or the content column, or
its content spilling out of it.

Run through ``make docs`` and ``make docs-check``.
"""

from __future__ import annotations

import argparse
import functools
import html
import http.server
import json
import re
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
#: The browser window, in CSS pixels: the layout is measured at this width.
VIEWPORT = (1280, 1400)
#: The query that makes the test server add LAYOUT_SCRIPT to a page, for --dump-dom to read.
LAYOUT_QUERY = "site-check=layout"
#: The id of the element LAYOUT_SCRIPT writes its findings into, as JSON.
LAYOUT_ID = "site-check-layout"
#: Measures the page once it has loaded (and the theme has wrapped its tables); writes
#: ``{"width", "pre", "cells", "problems"}`` into a hidden element at the end of the body.
#: A box may pass its limit by one pixel (sub-pixel rounding).
LAYOUT_SCRIPT = """
(() => {
  const SLACK = 1;
  const measure = () => {
    const problems = [];
    const article = document.querySelector("article");
    const shown = (el) => el.getClientRects().length > 0;
    const inner = (el) => {
      const r = el.getBoundingClientRect(), s = getComputedStyle(el);
      const left = r.left + el.clientLeft + parseFloat(s.paddingLeft);
      return {left, right: r.left + el.clientLeft + el.clientWidth - parseFloat(s.paddingRight)};
    };
    const longest = (el) => el.textContent.split("\\n")
      .reduce((a, b) => (b.length > a.length ? b : a), "").trim().slice(0, 70);
    const owner = (el) => {
      for (let node = el.closest(".doc-contents"); node; node = node.previousElementSibling) {
        if (node.classList.contains("doc-heading")) return node.id;
      }
      const heading = el.closest(".doc") && el.closest(".doc").querySelector(".doc-heading");
      return heading ? heading.id : "the page";
    };
    let pres = 0, cells = 0;
    for (const pre of article ? article.querySelectorAll("pre") : []) {
      if (!shown(pre)) continue;
      pres += 1;
      const box = pre.getBoundingClientRect();
      const room = inner(pre.parentElement);
      const where = `pre #${pres} (${owner(pre)}, longest line "${longest(pre)}")`;
      if (box.left < room.left - SLACK || box.right > room.right + SLACK) {
        problems.push(`${where} is ${Math.round(box.width)} px wide in a container of ` +
          `${Math.round(room.right - room.left)} px`);
      }
      for (const el of [pre, ...pre.querySelectorAll(":scope > code")]) {
        if (el.scrollWidth > el.clientWidth + SLACK) {
          problems.push(`${where} scrolls sideways: ${el.scrollWidth} px of ` +
            `${el.tagName.toLowerCase()} in ${el.clientWidth} px`);
        }
      }
    }
    const column = article ? inner(article) : {left: 0, right: innerWidth};
    for (const table of article ? article.querySelectorAll(".doc-contents table") : []) {
      if (!shown(table)) continue;
      // What can be seen of the table: the content column, cut by every box that clips.
      let limit = column.right;
      for (let el = table; el && el !== article; el = el.parentElement) {
        if (getComputedStyle(el).overflowX !== "visible") limit = Math.min(limit, inner(el).right);
      }
      let title = "";
      for (let node = table; node && !title; node = node.parentElement) {
        const before = node.previousElementSibling;
        const section = before && before.querySelector(".doc-section-title");
        if (section) title = section.textContent.trim().replace(/:$/, "");
        if (node.classList.contains("doc-contents")) break;
      }
      const heads = [...table.querySelectorAll("thead th")].map((th) => th.textContent.trim());
      for (const cell of table.querySelectorAll("th, td")) {
        cells += 1;
        const r = cell.getBoundingClientRect();
        const head = heads[cell.cellIndex] || `column ${cell.cellIndex + 1}`;
        const where = `${title || "docstring"} table of ${owner(table)}: cell ` +
          `"${cell.textContent.trim().slice(0, 40)}" (${head})`;
        if (r.right > limit + SLACK) {
          problems.push(`${where} is clipped: it ends at ${Math.round(r.right)} px, ` +
            `the table can be seen up to ${Math.round(limit)} px`);
        } else if (cell.scrollWidth > cell.clientWidth + SLACK) {
          problems.push(`${where} overflows: ${cell.scrollWidth} px of content in ` +
            `${cell.clientWidth} px`);
        }
      }
    }
    if (!article) problems.push("no article element to measure");
    const out = document.createElement("div");
    out.id = "@LAYOUT_ID@";
    out.hidden = true;
    const width = document.documentElement.clientWidth;
    out.textContent = JSON.stringify({width, pre: pres, cells, problems});
    document.body.append(out);
  };
  addEventListener("load", () => requestAnimationFrame(() => setTimeout(measure, 100)));
})();
""".replace("@LAYOUT_ID@", LAYOUT_ID)


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

    def do_GET(self) -> None:
        """Serve the site; a page asked for with LAYOUT_QUERY comes with LAYOUT_SCRIPT."""
        parts = urlsplit(self.path)
        page = Path(self.translate_path(parts.path))
        if page.is_dir():
            page = page / "index.html"
        if parts.query != LAYOUT_QUERY or page.suffix != ".html" or not page.is_file():
            super().do_GET()
            return
        text = page.read_text(encoding="utf-8")
        body = text.replace("</body>", f"<script>{LAYOUT_SCRIPT}</script></body>", 1).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


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
            f"--window-size={VIEWPORT[0]},{VIEWPORT[1]}",
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


def api_pages(site: Path) -> list[str]:
    """Return the site path of every page of the API reference."""
    return sorted(
        f"{page.parent.relative_to(site).as_posix()}/"
        for page in (site / "reference").rglob("index.html")
    )


def _layout(url: str, dom: str) -> tuple[str, list[str]]:
    """Read what LAYOUT_SCRIPT found in a dumped page: a summary, and one line per problem."""
    found = re.search(rf'<div id="{LAYOUT_ID}"[^>]*>(.*?)</div>', dom, re.DOTALL)
    if found is None:
        return "not measured", [f"{url}: layout not measured (the page's script did not run)"]
    result = json.loads(html.unescape(found.group(1)))
    problems = [f"{url}: {problem}" for problem in result["problems"]]
    if result["width"] != VIEWPORT[0]:
        problems.append(f"{url}: measured at {result['width']} px wide, not {VIEWPORT[0]} px")
    summary = f"{result['pre']} pre, {result['cells']} table cells at {result['width']} px"
    return summary, problems


def browse(site: Path, out: Path) -> list[str]:
    """Screenshot the chosen pages in headless Chromium, measure them; return what looks wrong."""
    out.mkdir(parents=True, exist_ok=True)
    server, base = _serve(site)
    problems: list[str] = []
    measured = dict(PAGES)
    for path in api_pages(site.resolve()):
        measured.setdefault(f"api-{path.removeprefix('reference/').strip('/') or 'index'}", path)
    try:
        with tempfile.TemporaryDirectory() as profile:
            for name, path in measured.items():
                url = base + path
                line = name
                if name in PAGES:
                    shot = out / f"{name}.png"
                    shot.unlink(missing_ok=True)
                    taken = _browser(f"--screenshot={shot}", url, profile=profile)
                    if not shot.exists():
                        problems.append(f"{url}: no screenshot ({taken.stderr.strip()[-300:]})")
                        continue
                    share = _background_share(shot)
                    if share > MAX_BACKGROUND:
                        problems.append(
                            f"{url}: blank ({share:.1%} of the screenshot is one colour)"
                        )
                    line += f": {shot} (background {share:.1%}"
                else:
                    line += f": {path} ("
                dom = _browser("--dump-dom", f"{url}?{LAYOUT_QUERY}", profile=profile).stdout
                text = " ".join("".join(_parse(dom).text).split())
                if len(text) < MIN_TEXT:
                    problems.append(f"{url}: blank ({len(text)} characters of text)")
                summary, wrong = _layout(url, dom)
                problems += wrong
                state = "fits" if not wrong else f"{len(wrong)} layout problem(s)"
                separator = ", " if name in PAGES else ""
                print(f"{line}{separator}{len(text)} characters; {summary}: {state})")
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
