"""What a user plugs in around a manager never costs a lock or a watcher's warning.

Telemetry and logging the application installs (a meter, a span processor or
exporter, a log handler) that raises or stalls, a callback that sleeps, a
``notify`` target whose ``tell`` blocks: each once stopped renewals, failed a
confirmed renewal, or told a watcher after the server could expire its lock.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest

from actors import QueueKeys, lease, start_link, stop, track_job
from tests.faults.plugged_in import KINDS, OUTLIVE_S
from tests.support import Inbox, take_locks

if TYPE_CHECKING:
    import redis

    from actors.embedded import EmbeddedServer
    from tests.faults.conftest import FaultRecord

LOCK_MS = 1000
RUNS = range(int(os.environ.get("FAULT_RUNS", "1")))


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_broken_telemetry_or_logging_costs_no_lock(
    run: int, kind: str, private_server: EmbeddedServer, record: FaultRecord
) -> None:
    # Given a worker process with the broken part installed, holding a watched
    # and a plain lock, and a third that another worker steals at 0.5 s
    record.fault = KINDS[kind]
    record.asserted = "every healthy lock held for 3 TTLs; only the stolen one reported"
    child = subprocess.run(
        [sys.executable, "-m", "tests.faults.plugged_in", kind, private_server.url],
        capture_output=True,
        text=True,
        timeout=OUTLIVE_S + 60,
        check=False,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    seen: dict[str, Any] = json.loads(child.stdout.splitlines()[-1])
    record.locks_lost = sum(not held for job_id, held in seen["held"].items() if job_id != "stolen")
    record.false_reports = len([job_id for job_id, _ in seen["lost"] if job_id != "stolen"])
    record.notes = {"renewed": seen["renewed"], "records_dropped": seen["records_dropped"]}
    # Then after three lock durations both healthy locks are held by their
    # tokens and still tracked, the watcher heard nothing, no tick failed
    assert seen["held"] == {"watched": True, "plain": True, "stolen": False}
    assert seen["tracked"] == ["plain", "watched"]
    assert seen["told"] == []
    assert seen["errors"] == []
    # and the stolen lock was reported, once
    assert seen["lost"] == [["stolen", "stolen"]]
    if kind in ("meter_raises", "processor_raises"):
        # and what the broken part could not take was dropped, and counted
        assert seen["records_dropped"] > 0


class Blocks(Inbox):
    """A ``notify`` target whose ``tell`` blocks until the test ends (against the rule)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def tell(self, message: Any) -> None:
        self.entered.set()
        self.release.wait(30)
        super().tell(message)


def expires_at(direct: redis.Redis, key: str) -> float:
    """``time.monotonic()`` at which the server expires ``key`` if nobody renews it."""
    before = time.monotonic()
    pttl = int(direct.pttl(key))
    assert pttl > 0
    return before + pttl / 1000


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("who", ["a callback sleeps 3 s", "another target's tell blocks"])
def test_a_watcher_is_told_before_expiry_whatever_other_user_code_does(
    run: int, who: str, private_server: EmbeddedServer, direct: redis.Redis, record: FaultRecord
) -> None:
    # Given a watched lock, a lease on another, and user code that stalls: a
    # callback that sleeps 3 s at its first call, or a target (listed first)
    # whose tell blocks
    record.fault = f"{who}, then Redis paused (SIGSTOP)"
    record.asserted = "every watcher told before the server could expire its lock"
    keys = QueueKeys("plugged-watchers")
    sleeping = threading.Event()

    def renewed(_ids: list[str]) -> None:
        if who.startswith("a callback") and not sleeping.is_set():
            sleeping.set()
            time.sleep(3)

    tokens = take_locks(direct, keys, ["blocked", "watched", "leased"], LOCK_MS)
    manager = start_link(
        connection=private_server.url,
        keys=keys,
        lock_duration=LOCK_MS,
        on_locks_renewed=renewed,
    )
    blocks, watcher = Blocks(), Inbox()
    try:
        if who.startswith("another"):
            track_job(manager, "blocked", tokens["blocked"], notify=blocks)
        track_job(manager, "watched", tokens["watched"], notify=watcher)
        with lease(manager, "leased", tokens["leased"]) as held:
            # When the callback sleeps (or right away), the server pauses
            if who.startswith("a callback"):
                assert sleeping.wait(3 * LOCK_MS / 1000), "no renewal within 3 TTLs"
            expired = min(expires_at(direct, keys.lock(j)) for j in ("watched", "leased"))
            fault = time.monotonic()
            private_server.pause()
            try:
                assert held.wait(timeout=LOCK_MS / 1000 + 5), "the lease was never told"
                leased_told = time.monotonic()
                deadline = time.monotonic() + LOCK_MS / 1000 + 5
                while not watcher.timed and time.monotonic() < deadline:
                    time.sleep(0.005)
            finally:
                private_server.resume()
        ((watcher_told, message),) = watcher.timed
        record.notes = {
            "watcher_ahead_ms": round((expired - watcher_told) * 1000),
            "lease_ahead_ms": round((expired - leased_told) * 1000),
            "told_ms": round((watcher_told - fault) * 1000),
        }
        record.locks_lost = 0
        # Then the target and the lease heard before the server could expire the locks
        assert message.reason == "unconfirmed"
        assert watcher_told < expired
        assert leased_told < expired
        if who.startswith("another"):
            assert blocks.entered.is_set()
    finally:
        blocks.release.set()
        stop(manager)
