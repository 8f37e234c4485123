"""The demo, run as ``make demo`` runs it: its summary, its exit code, its view and its picture.

Two runs start at once: a quiet one on the test server (whose EVALSHA count
it reads, so nothing else may run there) and a live one without matplotlib on
a private server of its own, as ``make demo`` starts one.
"""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.conftest import Server

ROOT = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: How to get the picture, as the demo says when matplotlib is missing.
INSTALL_HINT = "pip install '.[demo]'"
#: Three jobs of two TTLs each: job-2's lock is stolen, job-3's actor crashes.
SHORT = ["--jobs", "3", "--lock-duration", "1500", "--work-ms", "3000", "--step-ms", "100"]
#: The slowest path (provoked at 1.25 TTLs, a TTL to run out, the work again), tripled.
TIMEOUT_S = 3 * (1.25 * 1.5 + 1.5 + 3.0) + 30
# `python -m examples.demo` in an interpreter where importing matplotlib fails.
WITHOUT_MATPLOTLIB = (
    "import runpy, sys; sys.modules['matplotlib'] = None; "
    "runpy.run_module('examples.demo', run_name='__main__', alter_sys=True)"
)


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("demo")


@pytest.fixture(scope="module")
def runs(server: Server, out: Path) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    env = {key: value for key, value in os.environ.items() if key != "REDIS_URL"}
    quiet = ["-m", "examples.demo", "--quiet", "--out", str(out / "quiet"), *SHORT]
    live = ["-c", WITHOUT_MATPLOTLIB, "--out", str(out / "live"), *SHORT]
    started = {
        "quiet": _start(quiet, {**env, "REDIS_URL": server.url}, out / "quiet.txt"),
        # A live table although stdout is no terminal: rich honours TTY_COMPATIBLE.
        "live": _start(live, {**env, "TTY_COMPATIBLE": "1", "COLUMNS": "160"}, out / "live.txt"),
    }
    yield started
    for process in started.values():
        if process.poll() is None:
            process.kill()
        process.wait()


def _start(args: list[str], env: dict[str, str], output: Path) -> subprocess.Popen[bytes]:
    # Output to a file, not a pipe: a full pipe nobody reads yet would stall the run.
    with output.open("w") as file:
        return subprocess.Popen(
            [sys.executable, *args], cwd=ROOT, env=env, stdout=file, stderr=subprocess.STDOUT
        )


def finished(process: subprocess.Popen[bytes], output: Path) -> str:
    """Wait for a run; fail unless it exited 0. Return its output."""
    process.wait(timeout=TIMEOUT_S)
    text = output.read_text()
    assert process.returncode == 0, text
    return text


def test_demo_quiet_run_summarises_only_the_provoked_failures(
    runs: dict[str, subprocess.Popen[bytes]], server: Server, out: Path
) -> None:
    # Given the demo in its quiet mode on a short configuration,
    # when it runs as `make demo` runs it
    stdout = finished(runs["quiet"], out / "quiet.txt")

    # then it says that only the provoked lock was lost
    assert "unprovoked: 0" in stdout
    assert "jobs finished:        2 of 3" in stdout
    assert "result:               OK" in stdout
    # and quiet means the summary only: no event lines
    assert "acquired" not in stdout

    summary = json.loads((out / "quiet" / "summary.json").read_text())
    assert summary["ok"] is True
    assert summary["provoked_lost"] == ["job-2"] == summary["abandoned"]
    assert summary["unprovoked_lost"] == []
    assert summary["crashed"] == ["job-3"]
    # and nothing renewed the crashed actor's lock until the restarted one took the job again
    assert summary["restarted"] == ["job-3"] == summary["untracked_after_crash"]
    assert sorted(summary["finished"]) == ["job-1", "job-3"]
    # and each tick with due jobs cost one script call, as the server counted
    assert summary["renewing_ticks"] > 0
    assert summary["server_evalsha_calls"] == summary["renewing_ticks"]
    assert summary["manager_script_calls"] == summary["renewing_ticks"]
    assert summary["script_calls_per_renewing_tick"] == 1.0
    # and every lock was released or ran out
    client = server.client()
    try:
        assert client.keys("emq:demo:*") == []
    finally:
        client.close()

    # and it drew a real picture
    picture = out / "quiet" / "timeline.png"
    assert summary["timeline"] == str(picture)
    width, height = _png_size(picture)
    assert width > 800
    assert height > 500
    assert picture.stat().st_size > 20_000


def test_demo_live_view_runs_without_matplotlib_and_says_how_to_get_the_picture(
    runs: dict[str, subprocess.Popen[bytes]], out: Path
) -> None:
    # Given no matplotlib, and a console rich takes for a terminal,
    # when the demo runs on its own private server
    stdout = finished(runs["live"], out / "live.txt")

    # then it still succeeds, draws no picture and says how to get one
    summary = json.loads((out / "live" / "summary.json").read_text())
    assert summary["ok"] is True
    assert summary["unprovoked_lost"] == []
    assert summary["timeline"] is None
    assert not (out / "live" / "timeline.png").exists()
    assert INSTALL_HINT in stdout
    # and the live table showed each job with its lock's TTL, the restarted actor too
    assert "lock TTL (PTTL)" in stdout
    assert "job-3#1" in stdout
    assert "this worker" in stdout
    # and the abandoned job's row shows the work it had done, not none
    plain = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", stdout)
    abandoned = re.findall(r"│ job-2 .*│ abandoned .*│\s+(\d+\.\d)/3\.0 s │", plain)
    assert abandoned, plain
    assert float(abandoned[-1]) > 0
    # and the crash it provoked says so, where pykka logs it
    crash = [line for line in plain.splitlines() if "Unhandled exception in JobActor" in line]
    assert crash, plain
    assert all("ERROR pykka (provoked on purpose):" in line for line in crash)
