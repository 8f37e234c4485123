"""``python -m actors``: the ``echomq-locks`` command line."""

from __future__ import annotations

from actors.cli import main

if __name__ == "__main__":
    raise SystemExit(main(prog="python -m actors"))
