"""A private server never outlives the process that started it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from actors.embedded import KEEPER_WAIT_S, EmbeddedServer
from tests.support import default_engine, wait_for

#: A parent that starts a server, says its pid and folder, and waits to be killed.
PARENT = """
import sys, time
from actors.embedded import EmbeddedServer
server = EmbeddedServer(sys.argv[1]).start()
print(server.pid, server.data_dir, flush=True)
time.sleep(600)
"""
#: Most seconds a parent takes to start its server, on a loaded machine.
START_S = 30.0


def gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie nobody reaped yet has ended too)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False
    return stat.rsplit(")", 1)[1].split()[0] in {"Z", "X"}


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL", "SIGKILL to its process group"])
def test_a_killed_parent_leaves_no_server_and_no_folder(how: str) -> None:
    # Given a process that started a private server
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, default_engine()],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert parent.stdout is not None
    pid_text, folder_text = parent.stdout.readline().decode().split(maxsplit=1)
    pid, folder = int(pid_text), Path(folder_text.strip())
    try:
        assert not gone(pid) and folder.is_dir()
        # when it is killed (as a CI timeout kills a run: its whole group)
        if how == "SIGTERM":
            parent.send_signal(signal.SIGTERM)
        elif how == "SIGKILL":
            parent.kill()
        else:
            os.killpg(parent.pid, signal.SIGKILL)
        parent.wait(START_S)

        # then its server ends and the server's folder is removed
        wait_for(lambda: gone(pid), START_S, "the server to end")
        wait_for(lambda: not folder.exists(), KEEPER_WAIT_S + START_S, "the folder's removal")
    finally:
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(folder, ignore_errors=True)
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        parent.stdout.close()


def test_a_server_restarted_is_still_kept(tmp_path: Path) -> None:
    # Given a server restarted (a new process) in a folder of the caller's
    server = EmbeddedServer(default_engine(), data_dir=tmp_path).start()
    try:
        first = server.pid
        server.restart()
        second = server.pid
        assert first is not None and second is not None and gone(first)

        # when it is stopped, the server ends and the caller's folder stays
        server.stop()
        wait_for(lambda: gone(second), START_S, "the server to end")
        assert tmp_path.is_dir()
    finally:
        server.kill()
