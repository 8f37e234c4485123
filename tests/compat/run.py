"""Run a bullmq-py test suite twice, stock and with the integration, and compare.

Usage::

    python -m tests.compat.run PATH... [-- PYTEST ARGS...]

Each ``PATH`` is a folder or file of tests written for stock bullmq-py
(bullmq's own ``python/tests``, for instance). Those tests reach ``localhost:6379``, so a
private server is started there for the run (the port must be free). Each
test's outcome with :mod:`tests.compat.actors_everywhere` installed must
equal its outcome stock; the exit status is 1 when one does not. Both runs
start from a temporary folder, with the plugin's folder on ``PYTHONPATH``:
bullmq's suite is a package named ``tests`` too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from actors.embedded import EmbeddedServer

#: The folder of the plugin, importable as a top-level module from there.
PLUGINS = Path(__file__).resolve().parent


def outcomes(tests: list[str], extra: list[str], *plugin: str) -> dict[str, str]:
    """Run pytest on ``tests``; return each test's outcome by id."""
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.xml"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                *tests,
                "-q",
                "-p",
                "no:cacheprovider",
                f"--junitxml={report}",
                *plugin,
                *extra,
            ],
            cwd=folder,
            env={**os.environ, "PYTHONPATH": str(PLUGINS)},
            check=False,
        )
        found = {}
        for case in ET.parse(report).iter("testcase"):
            name = f"{case.get('classname')}::{case.get('name')}"
            kinds = {child.tag for child in case}
            found[name] = next(
                (kind for kind in ("failure", "error", "skipped") if kind in kinds), "passed"
            )
        return found


def main(argv: list[str]) -> int:
    """Compare the suite's outcomes; print the differences and a summary line."""
    split = argv.index("--") if "--" in argv else len(argv)
    tests = [str(Path(path).resolve()) for path in argv[:split]]
    extra = argv[split + 1 :]
    with EmbeddedServer(port=6379):
        stock = outcomes(tests, extra)
        ours = outcomes(tests, extra, "-p", "actors_everywhere")
    differ = sorted(
        name for name in stock.keys() | ours.keys() if stock.get(name) != ours.get(name)
    )
    for name in differ:
        print(f"{name}: stock {stock.get(name)}, with the integration {ours.get(name)}")
    same = len(stock) - len(differ)
    print(f"{len(stock)} tests: {same} with the same outcome, {len(differ)} different")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
