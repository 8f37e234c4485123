"""Run a bullmq-py test suite twice, stock and with the integration, and compare.

Usage::

    python -m tests.compat.run PATH... [-- PYTEST ARGS...]

Each ``PATH`` is a folder or file of tests written for stock bullmq-py
(bullmq's own ``python/tests``, for instance). Those tests reach
``localhost:6379``, so a private server is started there for the run (the
port must be free). Each test runs in a pytest process of its own, with at
most :data:`TEST_S` seconds (a hang is an outcome too), stock and with
:mod:`tests.compat.actors_everywhere` installed; its outcome with the
integration must equal its outcome stock, and the exit status is 1 when one
does not. The processes start from a temporary folder, with the plugin's
folder on ``PYTHONPATH``: bullmq's suite is a package named ``tests`` too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from actors.embedded import EmbeddedServer

#: The folder of the plugin, importable as a top-level module from there.
PLUGINS = Path(__file__).resolve().parent
#: Longest run of one test, in seconds.
TEST_S = 120
#: pytest's exit status for "every test passed".
PASSED = 0


def _pytest(args: list[str], folder: str, timeout: float | None = None) -> tuple[int, str]:
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
            cwd=folder,
            env={**os.environ, "PYTHONPATH": str(PLUGINS)},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return -1, ""
    return done.returncode, done.stdout


def collect(tests: list[str], folder: str) -> list[str]:
    """Return the ids of the tests under ``tests``, each starting with its file's full path."""
    root = os.path.commonpath(
        [path if os.path.isdir(path) else os.path.dirname(path) for path in tests]
    )
    _, out = _pytest(["--collect-only", f"--rootdir={root}", *tests], folder)
    return [f"{root}/{line}" for line in out.splitlines() if "::" in line]


def outcome(test: str, extra: list[str], folder: str, *plugin: str) -> str:
    """Run one test; return "passed", "failed" or "hung"."""
    status, _ = _pytest([test, *plugin, *extra], folder, TEST_S)
    if status == -1:
        return "hung"
    return "passed" if status == PASSED else "failed"


def main(argv: list[str]) -> int:
    """Compare each test's outcomes; print a line per test and a summary line."""
    split = argv.index("--") if "--" in argv else len(argv)
    tests = [str(Path(path).resolve()) for path in argv[:split]]
    extra = argv[split + 1 :]
    differ = 0
    with tempfile.TemporaryDirectory() as folder, EmbeddedServer(port=6379):
        ids = collect(tests, folder)
        for test in ids:
            stock = outcome(test, extra, folder)
            ours = outcome(test, extra, folder, "-p", "actors_everywhere")
            differ += stock != ours
            mark = "" if stock == ours else "   <- differs"
            print(f"{test}: stock {stock}, with the integration {ours}{mark}", flush=True)
    print(f"{len(ids)} tests: {len(ids) - differ} with the same outcome, {differ} different")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
