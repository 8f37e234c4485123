"""Takes: a script that takes a job's lock, run by the child that renews it.

The child tracks the job a take took before it answers, and the worker's
deadline for that lock reads the cell the child writes: a worker that reads
the answer late (a GIL hold) finds its lock renewed and its deadline right. A
take runs on a client of its own, so one that hangs holds no renewal back; one
whose child dies or whose manager stops fails at once, its lock left to expire.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from typing import TYPE_CHECKING

import pytest

from actors import QueueKeys, get_stats, is_tracked, start_link, stop, track_job
from actors.messages import TrackJob
from actors.process.take import Source, TakeLost
from actors.timing import monotonic_ms
from tests.bullmq.slowlink import slow_link
from tests.isolation.conftest import children
from tests.support import take_locks, wait_for
from tests.support.fakes import JobActor, told

if TYPE_CHECKING:
    from collections.abc import Iterator

    import redis

    from actors import ManagerRef
    from tests.support import Server

KEYS = QueueKeys("takes")
#: Lock duration, in ms: ticks every quarter of it.
TTL = 1000
#: Longest wait for anything that should happen within a few ticks, in seconds.
SOON_S = 10 * TTL / 1000

#: Takes job ``ARGV[3]``'s lock with token ``ARGV[1]`` for ``ARGV[2]`` ms, and
#: answers as bullmq's ``moveToActive`` does: the job's id second.
TAKE = "redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]); return {0, ARGV[3]}"


@pytest.fixture
def manager(server: Server) -> Iterator[ManagerRef]:
    manager = start_link(connection=server.url, keys=KEYS, lock_duration=TTL, isolation="process")
    try:
        yield manager
    finally:
        stop(manager)


def held_throughout(client: redis.Redis, job_id: str, token: str, seconds: float) -> bool:
    """Whether ``job_id``'s lock holds ``token`` at every look for ``seconds``."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        if client.get(KEYS.lock(job_id)) != token.encode():
            return False
        time.sleep(0.01)
    return True


def test_the_child_renews_what_a_take_took_and_the_worker_s_deadline_reads_it(
    manager: ManagerRef, redis_client: redis.Redis
) -> None:
    taker = manager.taker()
    assert taker is not None
    # Given a take the child ran, answered with the server's raw reply,
    taken = taker(Source(TAKE), [KEYS.lock("j")], ["t1", TTL, "j"], "t1").result(SOON_S)
    assert (taken.answer, taken.job_id) == ([0, b"j"], "j")
    assert taken.sent_ms <= monotonic_ms()
    # when the worker does nothing with it for three lock durations (a GIL hold),
    # then the child renewed the lock throughout,
    assert held_throughout(redis_client, "j", "t1", 3 * TTL / 1000)
    # and once the worker tracks it, watched, from the take's send, its deadline
    # is the child's last renewal (read while the child is stopped: from the
    # cell it wrote, not from anything it could say now): nobody is told "unconfirmed".
    [child] = children()
    job = JobActor.start()
    os.kill(child, signal.SIGSTOP)
    try:
        validity = manager.ask(TrackJob("j", "t1", taken.sent_ms, job), timeout=SOON_S)
        assert validity.confirmed >= taken.sent_ms + 2 * TTL
        assert validity.deadline > monotonic_ms()
    finally:
        os.kill(child, signal.SIGCONT)
    renewed = get_stats(manager).renewed
    wait_for(lambda: get_stats(manager).renewed > renewed + 1, SOON_S, "two more renewals")
    assert told(job) == []
    assert is_tracked(manager, "j")
    assert held_throughout(redis_client, "j", "t1", TTL / 1000)


def test_a_take_that_hangs_holds_no_renewal_back_and_a_stop_ends_it(
    manager: ManagerRef, redis_client: redis.Redis
) -> None:
    tokens = take_locks(redis_client, KEYS, ["r"], TTL)
    track_job(manager, "r", tokens["r"])
    taker = manager.taker()
    assert taker is not None
    # Given a take sent to a server that accepts the connection and never answers,
    with socket.create_server(("127.0.0.1", 0)) as mute:
        port = mute.getsockname()[1]
        take = taker(Source(TAKE, {"host": "127.0.0.1", "port": port}), ["k"], ["t", 1, "x"], "t")
        # then the other locks are renewed on time meanwhile,
        assert held_throughout(redis_client, "r", tokens["r"], 3 * TTL / 1000)
        assert not take.done()
        assert get_stats(manager).max_tick_lateness_ms < TTL / 4
        # and a stop ends the take: it fails at once, it is never left waiting.
        stopped = time.monotonic()
        stop(manager)
        with pytest.raises(TakeLost):
            take.result(SOON_S)
        assert time.monotonic() - stopped < SOON_S


def test_a_take_whose_child_dies_fails_and_its_lock_is_left_to_expire(
    server: Server, manager: ManagerRef, redis_client: redis.Redis
) -> None:
    taker = manager.taker()
    assert taker is not None
    [child] = children()
    # Given a take the server ran, whose answer is on its way (a slow link),
    redis_client.script_load(TAKE)  # no NOSCRIPT round trip first
    delay_ms = 2 * TTL
    with slow_link(server.url, delay_ms) as (url, _):
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        source = Source(TAKE, {"host": "127.0.0.1", "port": port})
        take = taker(source, [KEYS.lock("j")], ["t1", TTL, "j"], "t1")
        # (Behind the new connection's handshake: a few round trips at most.)
        ran = 5 * delay_ms / 1000
        wait_for(lambda: redis_client.exists(KEYS.lock("j")), ran, "the take to run")
        # when the child is killed before it could read the answer,
        os.kill(child, signal.SIGKILL)
        # then the take fails at once (bullmq retries a fetch that fails so),
        with pytest.raises(TakeLost):
            take.result(SOON_S)
    # nobody renews the lock it took: it expires, and a stalled check hands the job on;
    wait_for(lambda: not redis_client.exists(KEYS.lock("j")), 2 * TTL / 1000, "the lock to expire")
    # and the next child takes again.
    taken = wait_for(
        lambda: taker(Source(TAKE), [KEYS.lock("k")], ["t2", TTL, "k"], "t2").result(SOON_S),
        SOON_S,
        "the next child to take",
        ignore=(TakeLost,),
    )
    assert taken.job_id == "k"
    assert children() != [child]
    assert held_throughout(redis_client, "k", "t2", 2 * TTL / 1000)
