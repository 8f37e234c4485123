"""Run the bullmq tier against the newest bullmq-py release the ``bullmq`` extra allows.

Usage::

    python -m tests.compat.latest [PYTEST ARGS...]

CI pins one bullmq-py release (the ``test`` extra); users get the newest one in
the range of the ``bullmq`` extra. This builds a throwaway virtual environment,
installs the checkout with its ``test`` extra, upgrades bullmq-py to the newest
release in that range, and runs ``tests/bullmq`` there (``PYTEST ARGS`` replace
the defaults). The environment is deleted afterwards. Only the standard library
is used, so any Python 3.10+ runs it. The exit status is pytest's.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: What pytest runs when no arguments are given.
DEFAULT_ARGS = ["tests/bullmq", "-q", "-p", "no:randomly", "--timeout", "600"]


def extra_range(pyproject: str) -> str:
    """Return the version range of the ``bullmq`` extra, as ``">=3.4.4,<3.5"``.

    Raises:
        ValueError: The pyproject has no ``bullmq = ["bullmq..."]`` extra.
    """
    found = re.search(r'^bullmq = \["bullmq([^"]+)"\]$', pyproject, re.MULTILINE)
    if found is None:
        raise ValueError('pyproject.toml has no extra line `bullmq = ["bullmq<range>"]`')
    return found.group(1)


def pinned(pyproject: str) -> str:
    """Return the bullmq-py release the ``test`` extra pins (what CI runs)."""
    found = re.search(r'^\s*"bullmq==([^"]+)",$', pyproject, re.MULTILINE)
    return found.group(1) if found else "none"


def _run(*command: str) -> None:
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True, cwd=ROOT)


def main(argv: list[str]) -> int:
    """Build the environment, run the tests in it, delete it; return pytest's status."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    wanted = extra_range(text)
    venv = Path(tempfile.mkdtemp(prefix="bullmq-latest-"))
    python = str(venv / "bin" / "python")
    try:
        _run(sys.executable, "-m", "venv", str(venv))
        _run(python, "-m", "pip", "install", "--quiet", "--upgrade", "pip")
        _run(python, "-m", "pip", "install", "--quiet", f"{ROOT}[test]")
        # After the test extra, whose pin this replaces: pip names the broken pin, and goes on.
        _run(python, "-m", "pip", "install", "--quiet", "--upgrade", f"bullmq{wanted}")
        version = subprocess.run(
            [python, "-c", "import bullmq; print(bullmq.__version__)"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        print(
            f"bullmq-py {version}: the newest release in {wanted} (CI pins {pinned(text)})",
            flush=True,
        )
        done = subprocess.run(
            [python, "-m", "pytest", *(argv or DEFAULT_ARGS)], check=False, cwd=ROOT
        )
        print(f"tests/bullmq against bullmq-py {version}: pytest exit status {done.returncode}")
        return done.returncode
    finally:
        shutil.rmtree(venv, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
