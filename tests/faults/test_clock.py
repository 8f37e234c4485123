"""A wall-clock step of an hour, either way, delays or skips no renewal.

The system clock cannot be stepped safely on a shared machine, so the check
runs in a child process whose wall clock (``time.time`` and ``datetime``) is
replaced by one that jumps: see ``clock_step_script.py``, runnable alone.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from actors.embedded import EmbeddedServer
    from tests.faults.conftest import FaultRecord

SCRIPT = Path(__file__).with_name("clock_step_script.py")
ROOT = Path(__file__).resolve().parents[2]


def test_wall_clock_steps_of_an_hour_keep_1000_locks_alive(
    private_server: EmbeddedServer, record: FaultRecord
) -> None:
    # Given 1,000 locks of 1,000 ms renewed for 10 s by a manager in a child process
    # When its wall clock jumps +1 h, -1 h and -1 h during the run
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--url", private_server.url, "--jobs", "1000",
         "--lock-duration", "1000", "--seconds", "10"],
        capture_output=True, text=True, timeout=120, cwd=ROOT, check=False,
    )  # fmt: skip
    assert done.stdout, done.stderr
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    record.fault = "wall clock stepped +1 h, -1 h, -1 h"
    record.asserted = (
        "1,000 locks of 1 s (one of them leased) alive after 10 s; no gap between renewals "
        ">= the TTL; the lease never told"
    )
    record.locks_lost = 1000 - int(figures["alive"])
    record.false_reports = int(figures["lost"])
    record.notes = {"worst_gap_ms": figures["worst_gap_ms"], "ticks": figures["ticks"]}

    # Then the steps happened, every lock is alive, none was reported lost,
    # the lease was never told "unconfirmed", and no job ever waited as long
    # as its lock lasts
    assert figures["wall_steps_s"] == [3600, -3600, -3600]
    assert figures["alive"] == 1000
    assert figures["lost"] == 0
    assert figures["lease_lost"] is None
    assert figures["worst_gap_ms"] < 1000
    assert done.returncode == 0, done.stderr
