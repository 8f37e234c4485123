"""Attacks on thread- and process-mode managers: a fork, a crowd of managers, a late server.

Each test drives real managers against the run's real server (or a proxy in
front of it) and waits on durations derived from its locks, never a guess.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pytest

from actors import QueueKeys, Timing, get_stats, stop, track_job
from tests.faults.proxy import FaultProxy
from tests.isolation.conftest import children
from tests.support import Recorder, job_ids, take_locks, wait_for, watch_locks

if TYPE_CHECKING:
    import redis

    from tests.support import Server

ROOT = Path(__file__).resolve().parents[2]
LOCK_MS = 1000
TIMING = Timing(LOCK_MS)
#: Seconds within which a tracked job is renewed once, with a margin for a loaded machine.
FIRST_ROUND_S = 3 * TIMING.interval / 1000 + 10
#: The crowd's lock TTL, in ms: 24 managers on 2 loaded cores may run a tick
#: a second late, and a lock must outlive that (the test is about shared state).
CROWD_LOCK_MS = 4000
CROWD_FIRST_ROUND_S = 3 * Timing(CROWD_LOCK_MS).interval / 1000 + 10

# The worker of the fork attack, in a process of its own so that its fork copies
# no pytest (a forked pytest worker would run tests or talk to xdist's channel).
FORK_SCRIPT = r"""
import json, os, sys, threading, time
import redis
from actors import QueueKeys, start_link, stop, track_job, untrack_job, get_stats, lease
from actors.messages import ExtendLocks
from tests.support import Recorder, take_locks

url, queue, mode, lock_ms = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
keys = QueueKeys(queue)
direct = redis.Redis.from_url(url, socket_timeout=10)
recorder = Recorder()
manager = recorder.start(url, keys, lock_duration=lock_ms, isolation=mode)
tokens = take_locks(direct, keys, ["keep", "orphan", "leased"], 30_000)
for job_id in ("keep", "orphan"):
    track_job(manager, job_id, tokens[job_id])
held = lease(manager, "leased", tokens["leased"]).__enter__()
recorder.wait_renewed(tokens, 3 * lock_ms / 4 / 1000 + 10)
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    # The child: every door a careless fork (a multiprocessing worker, a
    # daemonizing library) may use on the copy of the manager, then a normal
    # exit (atexit, interpreter shutdown), after staying alive for 3 TTLs.
    os.close(read)
    tried = {}
    for name, call in [
        ("untrack", lambda: untrack_job(manager, "keep")),
        ("renew_now", lambda: manager.tell(ExtendLocks())),
        ("lease_exit", lambda: held.__exit__(None, None, None)),
        ("stop", lambda: stop(manager, timeout=lock_ms / 1000)),
    ]:
        # Each door on a thread of its own, given 2 TTLs: a door that never
        # returns in the copy is noted, not waited for.
        def attempt(name=name, call=call):
            try:
                call()
                tried[name] = "ok"
            except BaseException as exc:
                tried[name] = type(exc).__name__
        started = time.monotonic()
        door = threading.Thread(target=attempt, daemon=True)
        door.start()
        door.join(2 * lock_ms / 1000)
        tried.setdefault(name, "hung")
        tried[name + "_s"] = round(time.monotonic() - started, 3)
    os.write(write, json.dumps(tried).encode())
    os.close(write)
    time.sleep(3 * lock_ms / 1000)
    sys.exit(0)
os.close(write)
# The parent: stops renewing "orphan" at once; only a renewing child would keep it.
untrack_job(manager, "orphan", wait=True, timeout=10)
forked = time.monotonic()
missing, orphan_gone_after = set(), None
while True:
    _, status = os.waitpid(pid, os.WNOHANG)
    if _:
        break
    if time.monotonic() - forked > 30:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        status = -1
        break
    for job_id in ("keep", "leased"):
        if direct.get(keys.lock(job_id)) != tokens[job_id].encode():
            missing.add(job_id)
    if orphan_gone_after is None and not direct.exists(keys.lock("orphan")):
        orphan_gone_after = time.monotonic() - forked
    time.sleep(0.02)
exited = time.monotonic()
told = json.loads(os.read(read, 65536) or b"{}")
recorder.wait_renewed(["keep", "leased"], 3 * lock_ms / 4 / 1000 + 10, since=exited)
for job_id in ("keep", "leased"):
    if direct.get(keys.lock(job_id)) != tokens[job_id].encode():
        missing.add(job_id)
print(json.dumps({
    "child_status": status, "child_tried": told, "missing": sorted(missing),
    "orphan_gone_after_s": orphan_gone_after, "lease_lost": held.reason,
    "lost": [(x.job_id, x.reason) for x in recorder.lost()],
    "stats_lost": get_stats(manager, timeout=10).lost,
}))
held.__exit__(None, None, None)
stop(manager, timeout=10)
"""


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_forked_child_neither_renews_nor_releases_and_the_parent_keeps_renewing(
    mode: str, server: Server, redis_client: redis.Redis
) -> None:
    # Catches: a fork's copy of a manager (its threads, its renewer child's socket,
    # its atexit stop) that renews, releases or stops the parent's locks.
    queue = f"fork-{mode}-{os.getpid()}"
    done = subprocess.run(
        [sys.executable, "-c", FORK_SCRIPT, server.url, queue, mode, str(LOCK_MS)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    # The child exited normally, and no door of its copy touched the parent's manager
    assert outcome["child_status"] == 0, outcome
    # A renewing child would keep "orphan" alive: it must expire within its TTL (+ margin)
    assert outcome["orphan_gone_after_s"] is not None, f"orphan renewed by the child: {outcome}"
    assert outcome["orphan_gone_after_s"] < LOCK_MS / 1000 + 2, outcome
    # A releasing or untracking child would lose "keep" or the lease; the parent renews both
    assert outcome["missing"] == [], outcome
    assert outcome["lease_lost"] is None, outcome
    assert outcome["lost"] == [] and outcome["stats_lost"] == 0, outcome
    # and each door of the copy answered at once: a message is refused (the
    # manager runs in another process), leaving the lease and stopping do nothing
    tried = outcome["child_tried"]
    assert {door: tried[door] for door in ("untrack", "renew_now", "lease_exit", "stop")} == {
        "untrack": "RuntimeError",
        "renew_now": "RuntimeError",
        "lease_exit": "ok",
        "stop": "ok",
    }, tried
    assert max(tried[f"{door}_s"] for door in ("untrack", "renew_now", "lease_exit", "stop")) < 1


def _live_threads() -> set[threading.Thread]:
    return {thread for thread in threading.enumerate() if thread.is_alive()}


def test_many_managers_in_one_process_start_renew_and_stop_with_nothing_left(
    server: Server, redis_client: redis.Redis
) -> None:
    # Catches: managers that share state by accident (a global, a registry slot, one
    # child for two queues) or leak a thread or a child process at stop.
    before_threads = _live_threads()
    before_children = set(children())
    recorders: dict[str, Recorder] = {}
    managers = {}
    tokens: dict[str, dict[str, str]] = {}
    plan = [(f"crowd-t{i}", "thread") for i in range(20)] + [
        (f"crowd-p{i}", "process") for i in range(4)
    ]
    try:
        for queue, mode in plan:
            keys = QueueKeys(queue)
            recorders[queue] = recorder = Recorder()
            managers[queue] = recorder.start(
                server.url, keys, lock_duration=CROWD_LOCK_MS, isolation=mode
            )
            # Same job ids in every queue: only the queue's prefix tells them apart.
            tokens[queue] = take_locks(redis_client, keys, job_ids(3), 30_000)
            for job_id, token in tokens[queue].items():
                track_job(managers[queue], job_id, token)
        assert len(set(children()) - before_children) == 4
        for queue, recorder in recorders.items():
            recorder.wait_renewed(tokens[queue], CROWD_FIRST_ROUND_S)
        # Every lock renewed to its own manager's TTL, and each queue's renewals its own
        for queue, _mode in plan:
            seen = watch_locks(redis_client, QueueKeys(queue), tokens[queue], 0)
            assert seen.missing == set(), queue
            assert 0 < (seen.lowest_pttl or 0) <= CROWD_LOCK_MS, queue
            assert recorders[queue].lost() == [] and recorders[queue].errors() == []
            assert set(recorders[queue].renewed()) == set(tokens[queue])
    finally:
        stopped = [stop(manager, timeout=30) for manager in managers.values()]
    assert all(stopped)
    for queue, manager in managers.items():
        assert not manager.is_alive(), queue
    wait_for(lambda: not (set(children()) - before_children), 10, "the 4 children to end")
    wait_for(lambda: _live_threads() <= before_threads, 10, "every manager thread to end")


def _unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_process_child_that_cannot_reach_redis_warns_once_and_renews_once_reachable(
    server: Server, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # Catches: a child that dies, spins, floods the log, or never renews after a start
    # with the server out of reach.
    caplog.set_level(logging.INFO, logger="actors")
    keys = QueueKeys("late-server")
    port = _unused_port()
    recorder = Recorder()
    tokens = take_locks(redis_client, keys, job_ids(3), 60_000)
    manager = recorder.start(
        f"redis://127.0.0.1:{port}/0", keys, lock_duration=LOCK_MS, isolation="process"
    )
    for job_id, token in tokens.items():
        track_job(manager, job_id, token)
    # Some ticks fail while nobody listens
    wait_for(
        lambda: get_stats(manager, timeout=10).errors >= 3,
        20 * TIMING.interval / 1000 + 10,
        "three failed ticks",
    )
    [child] = children()
    upstream = urlsplit(server.url)
    assert upstream.hostname is not None and upstream.port is not None
    with FaultProxy(upstream.hostname, upstream.port, port=port):
        reachable = time.monotonic()
        recorder.wait_renewed(tokens, FIRST_ROUND_S + TIMING.interval / 1000, since=reachable)
        seen = watch_locks(redis_client, keys, tokens, 0)
        assert seen.missing == set() and 0 < (seen.lowest_pttl or 0) <= LOCK_MS
        assert children() == [child], "the child was not restarted: it survived the outage"
        assert recorder.lost() == []
        stop(manager, timeout=30)
    # One WARNING that the server is out of reach (naming it), not one per tick or per
    # retry (each failed tick is an ERROR line by design); the recovery is said once.
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and r.name.startswith("actors")
    ]
    unreachable = [text for text in warnings if "cannot reach" in text]
    assert len(unreachable) == 1, warnings
    assert f"127.0.0.1:{port}" in unreachable[0]
    assert [text for text in warnings if text not in unreachable] == [
        "LockManager for queue 'late-server': renewals resumed after "
        f"{_streak(warnings)} failed tick(s)"
    ], warnings


def _streak(warnings: list[str]) -> str:
    for text in warnings:
        if "renewals resumed after " in text:
            return text.split("renewals resumed after ")[1].split()[0]
    return "?"
