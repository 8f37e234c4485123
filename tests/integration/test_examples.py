"""Every example runs as a user runs it, against a real server, and does what it says.

The examples are run as scripts, never imported: each is a file a user reads
and copies. They all start at once (each mostly waits on its locks' TTLs) and
each test reads its own one's output; their queues do not overlap.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from bullmq.queue_keys import QueueKeys as BullMQKeys

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.conftest import Server

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = (
    "basic",
    "supervisor_tree",
    "manager_restart",
    "health_check",
    "multi_queue",
    "bullmq_compat",
    "lease_thread",
    "lease_asyncio",
    "lease_actor",
    "supervisor_tree process",
    "stalled_checker",
    "fenced_store",
)
#: The examples' lock TTL, in milliseconds.
LOCK_MS = 1500
#: The slowest example ends within 10 TTLs (its own deadline), plus start-up on a busy machine.
TIMEOUT_S = 10 * LOCK_MS / 1000 + 30

Runs = dict[str, subprocess.Popen[str]]


@pytest.fixture(scope="module")
def runs(server: Server) -> Iterator[Runs]:
    env = {**os.environ, "REDIS_URL": server.url}
    started = {
        name: subprocess.Popen(
            [sys.executable, f"examples/{name.split()[0]}.py", *name.split()[1:]],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in EXAMPLES
    }
    yield started
    for process in started.values():
        if process.poll() is None:
            process.kill()
        process.communicate()


def output(runs: Runs, name: str) -> list[str]:
    """Wait for the example ``name``; fail unless it exited 0. Return its output lines."""
    stdout, stderr = runs[name].communicate(timeout=TIMEOUT_S)
    assert runs[name].returncode == 0, stdout + stderr
    return stdout.splitlines()


def lock_keys(server: Server, pattern: str) -> list[bytes | str]:
    client = server.client()
    try:
        return client.keys(pattern)
    finally:
        client.close()


def test_basic_holds_a_lock_past_its_ttl_and_leaves_nothing_behind(
    runs: Runs, server: Server
) -> None:
    # Given one job's lock tracked by a manager for two TTLs (1 s each)
    lines = output(runs, "basic")

    # then the lock was still held, and untracked and released at the end
    assert lines == ["lock held after 2000 ms: True"]
    assert lock_keys(server, "emq:basic:*") == []


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_supervisor_tree_abandons_the_stolen_job_and_restarts_the_crashed_actor(
    runs: Runs, server: Server, isolation: str
) -> None:
    # Given four job actors under a one-for-one supervisor (renewing from a
    # thread, or from a child process),
    # when another worker takes job-2's lock and job-3's actor crashes
    lines = output(runs, "supervisor_tree" if isolation == "thread" else "supervisor_tree process")

    # then only the stolen lock was reported lost, and its actor abandoned the
    # work; the crashed actor was replaced by one that took the job again
    # once the lock ran out, and finished it
    outcomes = {
        "job-1": "finished",
        "job-2": "abandoned: lock stolen",
        "job-3": "finished",
        "job-4": "finished",
    }
    assert lines == [f"outcomes: {outcomes}", "lost: ['job-2 (stolen)']"]
    # and every lock was released (the thief's ran out)
    assert lock_keys(server, f"emq:supervised-{isolation}:*") == []


def test_manager_restart_keeps_every_lock_alive_after_the_manager_stops(
    runs: Runs, server: Server
) -> None:
    # Given five locks held through a manager, when the manager stops
    lines = output(runs, "manager_restart")

    # then a new one was started once and tracks all five again
    assert "manager stopped; restarts: 1; new one tracks 5" in lines
    # and two TTLs later (nothing left to renew them otherwise) all are still held
    assert f"5 of 5 locks held {2 * LOCK_MS} ms after the stop" in lines
    assert lock_keys(server, "emq:restartable:*") == []


def test_health_check_tells_a_lost_lock_from_a_stopped_manager(runs: Runs, server: Server) -> None:
    # Given a manager renewing three jobs, checked while renewing, after one job
    # lost its lock, and once stopped
    lines = output(runs, "health_check")

    # then it is healthy until it stops, and the check says why
    assert lines == [
        "renewing      healthy=True tracked=3 reason=ok",
        "after a loss  healthy=True tracked=2 reason=ok",
        "stopped       healthy=False tracked=- reason=stopped: no lock is renewed",
    ]
    assert lock_keys(server, "emq:checked:*") == []


def test_multi_queue_renews_each_queue_with_its_own_manager(runs: Runs, server: Server) -> None:
    # Given two jobs on each of three queues, one manager per queue,
    # when the worker holds them for one and a half TTLs
    lines = output(runs, "multi_queue")

    # then every lock outlived its TTL, nothing was lost
    assert lines[0] == f"6 of 6 locks held after {1.5 * LOCK_MS:.0f} ms; lost: []"
    # and each queue's manager renewed that queue's jobs and no others, each in
    # fewer script calls than renewals (both jobs in one call per tick)
    for line, name in zip(lines[1:], ("emails", "images", "reports"), strict=True):
        match = re.fullmatch(
            rf"{name} +renewed (.*) \((\d+) renewals in (\d+) script calls\)", line
        )
        assert match, line
        assert match[1] == f"['{name}-1', '{name}-2']"
        assert 2 <= int(match[3]) < int(match[2])
        assert lock_keys(server, f"emq:{name}:*") == []


def test_bullmq_compat_renews_bullmq_keys_and_clears_the_stalled_set(
    runs: Runs, server: Server
) -> None:
    # Given jobs locked as BullMQ's move-to-active locks them and marked by a
    # stalled checker's round, when the manager with prefix "bull" renews them
    lines = output(runs, "bullmq_compat")

    # then the first renewal took every id out of the set BullMQ itself names
    stalled = BullMQKeys("bull").getKeys("payments")["stalled"]
    assert lines[:2] == [
        f"{stalled} before renewal: ['1', '2', '3']",
        f"{stalled} after renewal: []",
    ]
    # and past one TTL every lock, as BullMQ names it, was still held with time left
    for n, line in zip("123", lines[2:5], strict=True):
        key = BullMQKeys("bull").toKey("payments", n) + ":lock"
        match = re.fullmatch(rf"{re.escape(key)}: held, (\d+) ms left", line)
        assert match, line
        assert 0 < int(match[1]) <= LOCK_MS
    assert lines[5] == "3 of 3 locks held past one TTL; lost: []"
    assert lock_keys(server, "bull:payments:*:lock") == []


def test_the_lease_examples_run_as_scripts_and_say_how_their_job_ended(runs: Runs) -> None:
    # Given each lease example run as a user runs it (tests/leases/test_examples.py
    # checks what each does), then each ends as it says
    assert re.fullmatch(r"did \d+ steps; lock lost: stolen", output(runs, "lease_thread")[-1])
    assert output(runs, "lease_asyncio")[-1] == "('cancelled: lock stolen', 1)"
    assert re.fullmatch(r"\['lost \(stolen\) after \d+ steps'\]", output(runs, "lease_actor")[-1])


def test_the_recipes_run_as_scripts_and_say_what_they_did(runs: Runs) -> None:
    # Given the Recipes guide's two examples run as a user runs them
    # (tests/integration/test_recipes.py checks each part), then each did what it says:
    # the checker handed back the job nobody renewed and left the renewed one active
    stalled = output(runs, "stalled_checker")
    assert len(stalled) == 3, stalled
    dropped = re.fullmatch(r"job (\d+): stalled, now waiting", stalled[0])
    assert dropped, stalled
    assert re.fullmatch(r"job \d+: renewed, now active", stalled[1]), stalled
    assert stalled[2] == f"reported stalled: ['{dropped[1]}']"
    # ...and the fenced store refused the paused holder's write, not the new holder's
    lines = output(runs, "fenced_store")
    first, second = (
        re.fullmatch(r"holder \d: fence (\d+), claim accepted: True", line) for line in lines[:2]
    )
    assert first and second, lines
    assert int(first[1]) < int(second[1])
    assert lines[2:] == [
        f"holder 1 writes with fence {first[1]}: accepted: False",
        f"holder 2 writes with fence {second[1]}: accepted: True",
        f"row: ({second[1]}, 'invoice by holder 2')",
    ]
