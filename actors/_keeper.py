"""The keeper of an embedded server: it ends the server once its owner is gone.

Run as a script (``python -I _keeper.py [folder]``) by
:class:`actors.embedded.EmbeddedServer`, on the standard library alone. When
its owner ends in any way, SIGKILL included, its stdin pipe closes; the keeper
then kills the server it was last told of and removes the folder.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import sys
import time

__all__ = ["KEEPER_WAIT_S"]

#: Most seconds the keeper waits for a killed server to be gone before removing its folder.
KEEPER_WAIT_S = 5.0


def _keep(folder: str | None) -> None:
    """Kill the server named last on stdin (one pid a line, ``0`` for none) once stdin closes."""
    # A Ctrl-C reaches the whole group; the keeper acts only once its owner is gone.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    handle: int | None = None
    pid = 0
    for line in sys.stdin.buffer:
        if handle is not None:
            os.close(handle)
            handle = None
        pid = int(line)
        if pid and hasattr(os, "pidfd_open"):
            # Opened before the owner reaps the server: it names that very process.
            with contextlib.suppress(OSError):
                handle = os.pidfd_open(pid)
    if pid:
        _end(pid, handle)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


def _end(pid: int, handle: int | None) -> None:
    try:
        if handle is not None:
            signal.pidfd_send_signal(handle, signal.SIGKILL)
            # A process handle becomes readable once the process has ended.
            select.select([handle], [], [], KEEPER_WAIT_S)
            return
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + KEEPER_WAIT_S
    while time.monotonic() < deadline and _exists(pid):
        time.sleep(0.01)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


if __name__ == "__main__":
    _keep(sys.argv[1] if len(sys.argv) > 1 else None)
