"""The demo: run as `make demo` runs it, its summary, its exit code and its picture."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from examples import demo, timeline
from tests.conftest import Server

ROOT = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# Three jobs of three TTLs each; wide margins for a busy machine.
SHORT = ["--jobs", "3", "--lock-duration", "1500", "--work-ms", "4500", "--step-ms", "100"]


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_demo_quiet_run_summarises_only_the_provoked_failures(
    server: Server, redis_client: redis.Redis, tmp_path: Path
) -> None:
    # Given the demo in its quiet mode, without a terminal, on a short configuration,
    env = {**os.environ, "REDIS_URL": server.url}
    # when it runs as `make demo` runs it
    done = subprocess.run(
        [sys.executable, "examples/demo.py", "--quiet", "--out", str(tmp_path), *SHORT],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    # then it exits 0 and says that only the provoked lock was lost
    assert done.returncode == 0, done.stdout + done.stderr
    assert "unprovoked: 0" in done.stdout
    assert "jobs finished:        2 of 3" in done.stdout
    assert "result:               OK" in done.stdout
    # and quiet means the summary only: no event lines
    assert "acquired" not in done.stdout

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["ok"] is True
    assert summary["provoked_lost"] == ["job-2"] == summary["abandoned"]
    assert summary["unprovoked_lost"] == []
    assert summary["restarted"] == ["job-3"] == summary["untracked_after_crash"]
    assert sorted(summary["finished"]) == ["job-1", "job-3"]
    # and each tick with due jobs cost one script call, as the server counted
    assert summary["renewing_ticks"] > 0
    assert summary["server_evalsha_calls"] == summary["renewing_ticks"]
    assert summary["script_calls_per_renewing_tick"] == 1.0

    # and it drew a real PNG picture
    picture = tmp_path / "timeline.png"
    assert summary["timeline"] == str(picture)
    width, height = _png_size(picture)
    assert width > 800
    assert height > 500
    assert picture.stat().st_size > 20_000


def test_demo_live_view_runs_without_matplotlib_and_says_how_to_get_the_picture(
    server: Server,
    redis_client: redis.Redis,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Given no matplotlib, and the live view on a console that is no terminal,
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setenv("COLUMNS", "160")
    config = demo.Config(
        jobs=3, lock_duration=1500, work_ms=4500, step_ms=100, live=True, out=tmp_path
    )

    # when the demo runs
    summary = demo.run_demo(server.url, config)

    # then it still succeeds, draws no picture and prints how to get one
    assert summary.ok
    assert summary.unprovoked_lost == []
    assert summary.timeline is None
    assert not (tmp_path / "timeline.png").exists()
    out = capsys.readouterr().out
    assert timeline.INSTALL_HINT in out
    # and the live table showed each job with its lock's TTL
    assert "lock TTL (PTTL)" in out
    assert "job-3#1" in out


def test_job_trace_follows_a_crashed_job_through_its_two_locks() -> None:
    # Given a job taken, renewed, crashed, then taken again and finished
    events = [
        (0.0, "j", "acquired"),
        (1.0, "j", "renewed"),
        (1.2, "other", "renewed"),
        (1.5, "j", "crashed"),
        (1.5, "j", "restarted"),
        (3.1, "j", "acquired"),
        (4.0, "j", "renewed"),
        (4.5, "j", "finished"),
    ]

    # when its trace is built with a 2 s TTL
    trace = timeline.job_trace("j", events, 2.0)

    # then the first lock runs out one TTL after its last renewal, untracked at the crash
    first, second = trace.locks
    assert first.sets == [0.0, 1.0]
    assert (first.how, first.untracked_at, first.end) == ("expired", 1.5, 3.0)
    # and the second one is released at the end
    assert second.sets == [3.1, 4.0]
    assert (second.how, second.end) == ("released", 4.5)
    assert [kind for _, kind in trace.marks] == ["crashed", "restarted"]
