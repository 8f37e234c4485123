"""A manager with ``isolation="process"``: renewals in a child process, the same doors.

Each test starts a manager whose child renews on the run's real server, with
short locks (``TTL`` ms), and checks what a worker relies on.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest
import redis

from actors import (
    ExtendLocks,
    LockLost,
    ManagerStopped,
    QueueKeys,
    RedisRenewer,
    Timing,
    get_active_job_count,
    get_stats,
    get_tracked_job_ids,
    is_tracked,
    lease,
    start_link,
    stop,
    track_job,
    untrack_job,
)
from actors.embedded import EmbeddedServer
from actors.messages import TrackJob
from actors.process.shared import SharedValidity
from actors.timing import default_safety_margin
from tests.faults.proxy import FaultProxy
from tests.isolation.conftest import children, gone
from tests.support import Inbox, Recorder, lowest_pttl, take_locks, wait_for

if TYPE_CHECKING:
    from actors import ManagerRef
    from tests.faults.conftest import FaultRecord
    from tests.support import Server

KEYS = QueueKeys("isolated")
#: Lock duration in ms: long enough that a child starved on a loaded machine
#: is not taken for hung (silent for a trust window, 875 ms here).
TTL = 1000
#: Seconds to wait for something a few ticks bring.
SOON_S = 10 * TTL / 1000
SCRIPT = Path(__file__).with_name("worker_script.py")
#: Longest a step that must not wait for the child may take, on a loaded machine.
STOP_S = 2.0


def _start(server: Server, **options: Any) -> ManagerRef:
    options.setdefault("lock_duration", TTL)
    options.setdefault("connection", server.url)
    return start_link(keys=KEYS, isolation="process", **options)


def _hold_gil(seconds: float) -> None:
    """Block every thread of this process: a C call that keeps the GIL (PyDLL does)."""
    ctypes.PyDLL(None).usleep(int(seconds * 1_000_000))


def test_locks_are_renewed_by_the_child_and_callbacks_run_in_the_worker(
    server: Server, redis_client: redis.Redis
) -> None:
    recorder = Recorder()
    threads: set[threading.Thread] = set()

    def renewed(ids: list[str]) -> None:
        threads.add(threading.current_thread())
        recorder.on_locks_renewed(ids)

    manager = _start(server, on_locks_renewed=renewed)
    tokens = take_locks(redis_client, KEYS, ["a", "b"], TTL)
    for job_id, token in tokens.items():
        track_job(manager, job_id, token)
    # Three renewals take longer than one TTL: only renewals keep the locks.
    wait_for(lambda: min(recorder.renewed()[j] for j in tokens) >= 3, SOON_S, "three renewals")
    assert all(redis_client.get(KEYS.lock(j)) == t.encode() for j, t in tokens.items())
    assert sorted(get_tracked_job_ids(manager)) == ["a", "b"]
    stats = get_stats(manager)
    assert stats.renewed >= 6
    assert stats.script_calls >= stats.renewing_ticks >= 3
    assert threads == {manager._manager.delivery}
    assert [pid for pid in children() if pid != os.getpid()]


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_gil_hold_of_three_lock_durations_loses_the_lock_only_in_thread_mode(
    server: Server, redis_client: redis.Redis, isolation: str, record: FaultRecord
) -> None:
    record.fault = f"GIL-holding C call in the worker, 3x the TTL ({isolation} mode)"
    record.asserted = (
        "lock held, nothing reported" if isolation == "process" else "lock lost; told at first look"
    )
    manager = start_link(connection=server.url, keys=KEYS, lock_duration=TTL, isolation=isolation)
    tokens = take_locks(redis_client, KEYS, ["held"], TTL)
    with lease(manager, "held", tokens["held"]) as held:
        # Renewed once, so the renewing side surely has the lock before the hold.
        wait_for(lambda: get_stats(manager).renewed, SOON_S, "a renewal")
        _hold_gil(3 * TTL / 1000)
        key_held = redis_client.get(KEYS.lock("held")) == tokens["held"].encode()
        try:
            held.check()
            told = None
        except LockLost as lost:
            told = lost.reason
    print(f"\n{isolation}: after a {3 * TTL} ms GIL hold, lock held={key_held}, lease told={told}")
    record.notes = {"lock_held_after": key_held, "told": told}
    if isolation == "process":
        assert key_held
        assert told is None
    else:
        # Expired at the server, and the job learns it at its first look.
        assert not key_held
        assert told == "unconfirmed"


def test_a_track_that_waits_is_renewed_through_a_gil_hold_right_after(
    server: Server, redis_client: redis.Redis
) -> None:
    manager = _start(server)
    try:
        tokens = take_locks(redis_client, KEYS, ["at-once"], TTL)
        # Tracked, and at once a C call holds the GIL for three lock durations:
        # no thread of the worker runs until it ends.
        # (Without wait=True the hold starts before the child hears of the lock: it expires.)
        track_job(manager, "at-once", tokens["at-once"], wait=True, timeout=SOON_S)
        _hold_gil(3 * TTL / 1000)
        held = redis_client.get(KEYS.lock("at-once")) == tokens["at-once"].encode()
    finally:
        stop(manager)
    # Waited for: the child had the lock before the hold, and renewed it throughout.
    assert held


def test_a_lease_reads_its_deadline_from_the_childs_confirmed_renewals(
    server: Server, redis_client: redis.Redis
) -> None:
    manager = _start(server)
    tokens = take_locks(redis_client, KEYS, ["leased"], TTL)
    with lease(manager, "leased", tokens["leased"]) as held:
        held.check()
        # Set once the worker's manager has taken the claim (it answers at once).
        wait_for(lambda: held.deadline and isinstance(held._validity, SharedValidity), SOON_S)
        first = held.deadline
        assert first is not None
        # Each confirmed renewal moves it on, with no word from the manager's thread.
        wait_for(lambda: (held.deadline or 0) > first + TTL // 2, SOON_S, "a later deadline")
        assert not held.lost
    assert not is_tracked(manager, "leased")


def test_a_notify_target_is_told_in_the_worker_on_a_teller_thread(
    server: Server, redis_client: redis.Redis
) -> None:
    recorder = Recorder()
    manager = _start(server, on_lock_renewal_failed=recorder.on_lock_renewal_failed)
    tokens = take_locks(redis_client, KEYS, ["watched"], TTL)
    told_on: list[threading.Thread] = []

    class Target(Inbox):
        def tell(self, message: Any) -> None:
            told_on.append(threading.current_thread())
            super().tell(message)

    target = Target()
    track_job(manager, "watched", tokens["watched"], notify=target)
    redis_client.set(KEYS.lock("watched"), "another-worker")
    got = wait_for(lambda: target.got, SOON_S, "the target told")
    assert got == [LockLost("watched", tokens["watched"], "stolen")]
    # A thread of the manager's own for targets: not behind the callbacks.
    assert [thread.name for thread in told_on] == [f"LockManager-tell-{KEYS.name}-0"]
    assert told_on[0] is not manager._manager.delivery
    wait_for(recorder.lost, SOON_S, "on_lock_renewal_failed")
    assert not is_tracked(manager, "watched")


def test_after_an_untrack_with_wait_no_loss_of_that_lock_is_reported(
    server: Server, redis_client: redis.Redis
) -> None:
    recorder = Recorder()
    manager = _start(server, on_lock_renewal_failed=recorder.on_lock_renewal_failed)
    tokens = take_locks(redis_client, KEYS, [f"j{i}" for i in range(20)], TTL)
    for job_id, token in tokens.items():
        track_job(manager, job_id, token)
    for job_id in tokens:
        untrack_job(manager, job_id, wait=True)
        # The worker releases its lock at once: no tick may find it gone.
        redis_client.delete(KEYS.lock(job_id))
        assert not is_tracked(manager, job_id)
    ticks = get_stats(manager).ticks
    wait_for(lambda: get_stats(manager).ticks >= ticks + 3, SOON_S, "three more ticks")
    assert recorder.lost() == []


def test_no_loss_is_reported_of_a_watched_lock_released_while_the_child_renews_it(
    server: Server, redis_client: redis.Redis
) -> None:
    # Given watched locks, renewed by the child at every tick
    recorder = Recorder()
    target = Inbox()
    manager = _start(
        server,
        on_locks_renewed=recorder.on_locks_renewed,
        on_lock_renewal_failed=recorder.on_lock_renewal_failed,
    )
    tokens = take_locks(redis_client, KEYS, [f"w{i}" for i in range(150)], 10 * TTL)
    for job_id, token in tokens.items():
        track_job(manager, job_id, token, notify=target)
    recorder.wait_renewed(tokens, SOON_S)
    # When each is untracked with wait=True and released at once, while ticks go on
    pause = TTL / 4 / 1000 / 10
    for job_id in tokens:
        untrack_job(manager, job_id, notify=target, wait=True)
        redis_client.delete(KEYS.lock(job_id))
        time.sleep(pause)
    ticks = get_stats(manager).ticks
    wait_for(lambda: get_stats(manager).ticks >= ticks + 2, SOON_S, "two more ticks")
    # Then nobody heard of a loss: a tick the child began before the untrack
    # reached it found the lock gone, and the worker dropped that word
    assert recorder.lost() == []
    assert target.got == []
    stop(manager)


def _unread_by_server(port: int) -> int:
    """Bytes sent to the server on ``port`` over IPv4 loopback that it has not read yet."""
    unread = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, state, queues = fields[1], fields[3], fields[4]
        if state == "01" and int(local.split(":")[1], 16) == port:
            unread += int(queues.split(":")[1], 16)
    return unread


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux' socket table")
def test_a_job_untracked_while_the_child_renews_it_is_not_reported_renewed() -> None:
    # Given a process-mode manager on its own server
    lock_ms = 10 * TTL  # the child's reads wait over a second: the pause below is far shorter
    recorder = Recorder()
    with EmbeddedServer() as private:
        direct = redis.Redis.from_url(private.url, socket_timeout=10)
        manager = recorder.start(private.url, KEYS, lock_duration=lock_ms, isolation="process")
        try:
            # (its child up and connected: an asked tick renewed a first job)
            warm = take_locks(direct, KEYS, ["w"], lock_ms)
            track_job(manager, "w", warm["w"], ts=manager.clock() - lock_ms)
            manager.ask(ExtendLocks(), timeout=SOON_S)
            assert recorder.renewed() == {"w": 1}
            # and two more, due
            tokens = take_locks(direct, KEYS, ["u1", "u2"], lock_ms)
            due = manager.clock() - lock_ms
            for job_id, token in tokens.items():
                track_job(manager, job_id, token, ts=due, wait=True)
            # When a renewal the child sends waits in the paused server's socket
            private.pause()
            try:
                manager.tell(ExtendLocks())
                wait_for(
                    lambda: _unread_by_server(private.port) > 0,
                    SOON_S,
                    "the child's renewal waiting in the server's socket",
                )
                # and the worker untracks one of its jobs meanwhile
                untrack_job(manager, "u1", wait=True)
                untracked = time.monotonic()
            finally:
                private.resume()
            # Then that renewal, which sent both, is reported for the job still tracked only
            recorder.wait_renewed({"u2": tokens["u2"]}, SOON_S, since=untracked)
            assert "u1" not in recorder.renewed(since=untracked)
            assert get_stats(manager).last_batch == 2
            assert sorted(get_tracked_job_ids(manager)) == ["u2", "w"]
            assert recorder.errors() == [] and recorder.lost() == []
        finally:
            stop(manager)
            direct.close()


def test_stop_leaves_no_child_no_zombie_and_no_file(
    server: Server, redis_client: redis.Redis
) -> None:
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    manager = _start(server)
    tokens = take_locks(redis_client, KEYS, ["kept"], TTL)
    track_job(manager, "kept", tokens["kept"])
    [child] = wait_for(children, SOON_S, "the child")
    # The shared memory is a memfd: no path in any file system. (Standard
    # streams are the worker's own: pytest's capture is a deleted temp file.)
    fds = [fd for fd in os.listdir(f"/proc/{child}/fd") if int(fd) > 2]
    paths = [os.readlink(f"/proc/{child}/fd/{fd}") for fd in fds]
    assert not [p for p in paths if p.startswith(("/tmp", "/dev/shm", "/var/tmp"))]
    assert stop(manager)
    with pytest.raises(ChildProcessError):
        os.waitpid(child, os.WNOHANG)  # reaped already: not a zombie of ours
    assert not Path(f"/proc/{child}").exists()
    assert children() == []
    # A normal stop leaves the lock to the worker's own release.
    assert redis_client.get(KEYS.lock("kept")) == tokens["kept"].encode()
    if os.path.isdir("/dev/shm"):
        assert not [n for n in set(os.listdir("/dev/shm")) - shm_before if "actors" in n]


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_a_killed_worker_leaves_no_lock_but_those_another_worker_holds(
    server: Server, redis_client: redis.Redis, isolation: str, record: FaultRecord
) -> None:
    record.fault = f"worker SIGKILLed ({isolation} mode)"
    # Process mode: locks long enough that their TTL cannot be what removes
    # them. Thread mode: nothing releases them; a short TTL shows that bound.
    lock_ms = 20_000 if isolation == "process" else 1_000
    record.asserted = (
        "its locks deleted within a quarter of the TTL; another worker's lock kept"
        if isolation == "process"
        else "its locks live until their TTL"
    )
    tokens = take_locks(redis_client, KEYS, ["k1", "k2", "k3"], lock_ms)
    worker = subprocess.Popen(
        [
            sys.executable,
            str(SCRIPT),
            server.url,
            KEYS.name,
            str(lock_ms),
            isolation,
            *(f"{j}={t}" for j, t in tokens.items()),
        ],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        text=True,
    )
    try:
        assert worker.stdout is not None
        assert worker.stdout.readline().strip() == "ready"
        child = None
        if isolation == "process":
            [child] = wait_for(lambda: children(worker.pid), SOON_S, "the worker's child")
        # Another worker took k3 meanwhile (its lock expired and was taken again).
        redis_client.set(KEYS.lock("k3"), "another-worker", px=lock_ms)
        # What the locks have left as the worker dies (a slow start leaves less than a TTL).
        read_at = time.monotonic()
        left_ms = lowest_pttl(redis_client, KEYS, ["k1", "k2"])
        killed = time.monotonic()
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        wait_for(
            lambda: redis_client.exists(KEYS.lock("k1"), KEYS.lock("k2")) == 0,
            10 + 2 * lock_ms / 1000,
            "the dead worker's locks gone",
            interval=0.001,
        )
        released_ms = (time.monotonic() - killed) * 1000
        if child is not None:
            wait_for(lambda: gone(child), 10, "the child's end")
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    record.notes = {"locks_gone_ms": round(released_ms, 1), "ttl_ms": lock_ms}
    print(f"\nSIGKILL of the worker: its locks gone after {released_ms:.1f} ms (TTL {lock_ms} ms)")
    assert redis_client.get(KEYS.lock("k3")) == b"another-worker"
    if isolation == "process":
        assert released_ms < lock_ms / 4
    else:
        # Nobody deletes them: they go when the TTL they had left runs out, not before.
        # PTTL ran after read_at: they expire at read_at + left_ms or later (to the ms).
        lived_ms = released_ms + (killed - read_at) * 1000
        assert lived_ms >= left_ms - 1


def test_a_worker_that_exits_normally_ends_its_child_and_leaves_its_locks(
    server: Server, redis_client: redis.Redis
) -> None:
    # Given a worker whose child renews its locks
    lock_ms = 20_000
    tokens = take_locks(redis_client, KEYS, ["e1", "e2"], lock_ms)
    worker = subprocess.Popen(
        [sys.executable, str(SCRIPT), server.url, KEYS.name, str(lock_ms), "process"]
        + [f"{j}={t}" for j, t in tokens.items()],
        stdout=subprocess.PIPE,
        env={
            **os.environ,
            "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
            "WORKER_THEN": "exit",
        },
        text=True,
    )
    assert worker.stdout is not None
    assert worker.stdout.readline().strip() == "ready"
    [child] = wait_for(lambda: children(worker.pid), SOON_S, "the worker's child")
    # When the worker's program ends without stopping its manager
    assert worker.wait(SOON_S + 10) == 0
    # Then its child is gone, and the locks are left to the worker's own release
    wait_for(lambda: gone(child), SOON_S, "the child's end")
    assert redis_client.mget([KEYS.lock(j) for j in tokens]) == [
        t.encode() for t in tokens.values()
    ]


def test_a_child_cut_off_from_redis_keeps_its_jobs_and_renews_them_after(
    server: Server, redis_client: redis.Redis
) -> None:
    # Given a child renewing 2,000 ms locks through a proxy
    lock_ms = 2000
    errors: list[Exception] = []
    recorder = Recorder()
    address = urlsplit(server.url)
    with FaultProxy(address.hostname or "127.0.0.1", address.port or 6379) as proxy:
        manager = _start(
            server,
            connection=proxy.url,
            lock_duration=lock_ms,
            on_error=errors.append,
            on_locks_renewed=recorder.on_locks_renewed,
            on_lock_renewal_failed=recorder.on_lock_renewal_failed,
        )
        tokens = take_locks(redis_client, KEYS, ["c1", "c2"], lock_ms)
        for job_id, token in tokens.items():
            track_job(manager, job_id, token)
        recorder.wait_renewed(tokens, SOON_S + 5)
        # When every connection to Redis is reset for 0.7 TTL, right after a
        # renewal: the renewal due meanwhile fails, retries included
        with proxy.fault("reset"):
            time.sleep(0.7 * lock_ms / 1000)
        since = time.monotonic()
        # Then the failure was reported, no job was let go, nothing was
        # reported lost, and the next ticks renew all
        wait_for(lambda: errors, lock_ms / 1000, "a failed tick reported")
        recorder.wait_renewed(tokens, lock_ms / 1000 + 5, since=since)
        assert sorted(get_tracked_job_ids(manager)) == sorted(tokens)
        assert recorder.lost() == []
        assert redis_client.mget([KEYS.lock(j) for j in tokens]) == [
            t.encode() for t in tokens.values()
        ]
        stop(manager)


def test_bad_isolation_and_refused_seams_fail_at_the_caller(server: Server) -> None:
    with pytest.raises(ValueError, match="isolation"):
        start_link(connection=server.url, keys=KEYS, isolation="fork")
    with pytest.raises(TypeError, match="isolation"):
        start_link(connection=server.url, keys=KEYS, isolation=1)  # type: ignore[arg-type]
    timing = Timing(TTL)
    renewer = RedisRenewer(server.url, KEYS, timing, default_safety_margin(timing))
    try:
        with pytest.raises(TypeError, match="renewer"):
            start_link(keys=KEYS, renewer=renewer, isolation="process")
    finally:
        renewer.close()
    with pytest.raises(TypeError, match="clock"):
        start_link(connection=server.url, keys=KEYS, clock=lambda: 0, isolation="process")
    with pytest.raises(ValueError, match="lock_duration"):
        start_link(connection=server.url, keys=KEYS, lock_duration=50, isolation="process")
    assert children() == []


def test_every_target_of_stolen_locks_is_told_though_a_callback_tracks_a_new_one(
    server: Server, redis_client: redis.Redis
) -> None:
    # Given 256 locks, each watched by a target of its own (the table's first pruning size)
    targets = {f"t{i}": Inbox() for i in range(256)}
    tracked_again: list[bool] = []

    def on_lost(_: list[object]) -> None:
        # A callback that calls back in with a new target, once.
        if not tracked_again:
            tracked_again.append(True)
            manager.ask(TrackJob("new", "token", notify=Inbox()))  # handled there and then

    manager = _start(server, on_lock_renewal_failed=on_lost)
    tokens = take_locks(redis_client, KEYS, list(targets), 10 * TTL)
    for job_id, token in tokens.items():
        track_job(manager, job_id, token, notify=targets[job_id])
    wait_for(lambda: get_stats(manager).renewed >= len(targets), SOON_S, "a renewal of each")
    # When every lock is stolen
    redis_client.mset({KEYS.lock(job_id): "another-worker" for job_id in targets})
    # Then every target is told, once
    wait_for(lambda: all(t.got for t in targets.values()), SOON_S, "every target told")
    assert all(len(t.got) == 1 for t in targets.values())
    stop(manager)


def test_a_fork_of_the_worker_ends_at_once_and_leaves_the_child_alone(
    server: Server, redis_client: redis.Redis
) -> None:
    # Given a worker renewing from its child
    manager = _start(server)
    tokens = take_locks(redis_client, KEYS, ["forked"], 10 * TTL)
    track_job(manager, "forked", tokens["forked"])
    [child] = wait_for(children, SOON_S, "the child")
    # When it forks, and the fork ends normally (its exit hooks run)
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the fork: run the exit hooks as a normal exit would, then leave
        import atexit  # noqa: PLC0415  (only the fork needs it)

        atexit._run_exitfuncs()
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    took = time.monotonic() - started
    # Then the fork ended at once, and the worker's manager and child go on
    assert os.waitstatus_to_exitcode(status) == 0
    assert took < STOP_S
    assert children() == [child]
    assert is_tracked(manager, "forked")
    stop(manager)


def test_queries_are_answered_from_the_worker_while_the_child_cannot_answer(
    server: Server, redis_client: redis.Redis
) -> None:
    # Given a manager whose child is stopped (SIGSTOP)
    answers: list[object] = []

    class Asking(Inbox):
        def tell(self, message: Any) -> None:
            try:
                answers.append(is_tracked(manager, "watched"))
            except ManagerStopped:
                answers.append("stopped")
            super().tell(message)

    manager = _start(server)
    tokens = take_locks(redis_client, KEYS, ["watched", "plain"], 10 * TTL)
    track_job(manager, "watched", tokens["watched"], notify=Asking())
    track_job(manager, "plain", tokens["plain"])
    [child] = wait_for(children, SOON_S, "the child")
    os.kill(child, signal.SIGSTOP)
    try:
        # Then what the worker tracks is answered at once, from the worker itself
        started = time.monotonic()
        assert is_tracked(manager, "plain", timeout=STOP_S)
        assert get_active_job_count(manager, timeout=STOP_S) == 2
        assert sorted(get_tracked_job_ids(manager, timeout=STOP_S)) == ["plain", "watched"]
        assert time.monotonic() - started < STOP_S
    finally:
        # A child silent for a trust window is killed meanwhile: it may be gone.
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGCONT)
    # And a target told of the stop is told once the manager has stopped, as in thread mode
    stop(manager)
    assert answers == ["stopped"]


#: Another worker: once told to on its stdin, takes the lock the moment a renewal refreshed it.
STEAL_AFTER_RENEWAL = """
import sys, time, redis
client = redis.Redis.from_url(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()
last = client.pttl(sys.argv[2])
while True:
    now = client.pttl(sys.argv[2])
    if now > last:
        client.set(sys.argv[2], "another worker")
        break
    last = now
    time.sleep(0.001)
"""


@pytest.mark.parametrize("run", range(3))
def test_a_renewal_applied_past_its_deadline_is_reported_lost_not_renewed(
    run: int, server: Server, redis_client: redis.Redis
) -> None:
    # Given a watched lock, renewed by the child, and another worker that takes
    # it right after the child's next renewal
    recorder = Recorder()
    manager = _start(server, **recorder.callbacks())
    tokens = take_locks(redis_client, KEYS, ["watched"], TTL)
    thief = subprocess.Popen(
        [sys.executable, "-c", STEAL_AFTER_RENEWAL, server.url, KEYS.lock("watched")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert thief.stdout is not None and thief.stdin is not None
        assert thief.stdout.readline().strip() == "ready"
        track_job(manager, "watched", tokens["watched"], notify=Inbox())
        recorder.wait_renewed(["watched"], SOON_S)
        thief.stdin.write("go\n")
        thief.stdin.flush()
        # When a GIL hold in the worker spans that renewal and its deadline
        # (the child renews on, and its words wait in the pipe)
        _hold_gil(1.5 * TTL / 1000)
        after = time.monotonic()
        thief.wait(SOON_S)
        wait_for(recorder.lost, SOON_S, "the loss")
        # Then the worker reports the lock lost, and no renewal of it after the hold
        assert [(item.job_id, item.reason) for item in recorder.lost()][:1] in (
            [("watched", "unconfirmed")],
            [("watched", "stolen")],
        )
        assert recorder.renewed(since=after)["watched"] == 0
    finally:
        thief.kill()
        stop(manager)
