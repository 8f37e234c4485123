"""Defects a hostile review of leases, aio and the bullmq adapter found, on a real server.

Every test names its defect in its docstring's first line and fails while the
defect is there. Locks are short (``TTL`` ms: renew window ``TTL // 2``,
interval ``TTL // 4``) so that a lock nobody renews is gone within a second;
every wait is a multiple of those durations or a polling deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pykka
import redis
import redis.asyncio
from bullmq import Worker

from actors import QueueKeys, aio, is_tracked, lease, start_link, track_job
from actors.bullmq import use_actor_lock_manager
from tests.support import take_locks, wait_for, watch_locks

if TYPE_CHECKING:
    from actors import ManagerRef
    from tests.conftest import Server

KEYS = QueueKeys("review-leases")
TTL = 400  # ms: renew window 200 ms, interval 100 ms
#: Long enough for a lock nobody renews to expire, with a margin.
WATCH_S = 3 * TTL / 1000


def _manager(client: redis.Redis, **options: Any) -> ManagerRef:
    """A manager on ``client``'s server, with a client of its own whose timeouts fit ``TTL``."""
    kwargs = client.connection_pool.connection_kwargs
    url = f"redis://{kwargs['host']}:{kwargs['port']}/{kwargs.get('db', 0)}"
    return start_link(connection=url, keys=KEYS, lock_duration=TTL, **options)


# -- two leases on one job -----------------------------------------------------


def test_a_lease_whose_job_is_leased_again_with_a_new_token_is_never_told(
    redis_client: redis.Redis,
) -> None:
    """Defect: a second lease of the same job with a new token silently unsubscribes the first.

    ``JobTable.track`` with a new token drops the old lock's ``Watch``: the
    first lease (its lock now holds another token: it is stolen) is no longer
    renewed, and never learns it. Its job goes on as if it held the lock —
    the double run a lease exists to prevent. This is what a worker sees when
    a stalled job is handed back to it with a fresh token while the first run
    is still going.
    """
    manager = _manager(redis_client)
    first_token = take_locks(redis_client, KEYS, ["j"], TTL)["j"]
    with lease(manager, "j", first_token) as first:
        # The job is taken again (a new token on its lock), and leased again.
        redis_client.set(KEYS.lock("j"), "second-token", px=TTL)
        with lease(manager, "j", "second-token") as second:
            lost = first.wait(WATCH_S)
            assert not second.lost
        assert lost, "the first lease's lock holds another token, yet it was never told"
        assert first.reason == "stolen"


def test_leaving_one_of_two_leases_on_one_lock_strands_the_other(
    redis_client: redis.Redis,
) -> None:
    """Defect: leaving one of two leases of the same (job, token) stops renewal under the other.

    The second lease replaces the first one's notify target; leaving the
    first untracks the lock by its token (the same token), which drops the
    second's watch without a word. The second lease is still held, its lock
    is no longer renewed and expires, and ``lost`` stays ``False``. Either
    the second ``__enter__`` should be refused (``RuntimeError``), or a lease
    should untrack only what it added itself.
    """
    manager = _manager(redis_client)
    tokens = take_locks(redis_client, KEYS, ["j"], TTL)
    first = lease(manager, "j", tokens["j"]).__enter__()
    second = lease(manager, "j", tokens["j"])
    try:
        second.__enter__()
    except RuntimeError:
        first.__exit__(None, None, None)
        return  # refused: nothing can be stranded
    try:
        first.__exit__(None, None, None)
        seen = watch_locks(redis_client, KEYS, tokens, WATCH_S)
        stranded = bool(seen.missing) and not second.lost
    finally:
        second.__exit__(None, None, None)
    assert not stranded, "the held lease's lock expired and the lease was never told"


# -- leaving a lease it does not hold -------------------------------------------


def test_leaving_a_lease_never_entered_untracks_the_job(redis_client: redis.Redis) -> None:
    """Defect: ``__exit__`` of a lease that was never entered untracks whatever holds its lock.

    A lease built but never entered (an ``ExitStack`` that registered the
    exit before an ``__enter__`` that raised, say) sends ``UntrackJob`` on
    exit: a job tracked by somebody else with the same token stops being
    renewed. Leaving a lease that is not held should raise ``RuntimeError``,
    as entering one twice does, and touch nothing.
    """
    manager = _manager(redis_client)
    tokens = take_locks(redis_client, KEYS, ["j"], TTL)
    track_job(manager, "j", tokens["j"])
    never_entered = lease(manager, "j", tokens["j"])
    with contextlib.suppress(RuntimeError):
        never_entered.__exit__(None, None, None)
    assert is_tracked(manager, "j"), "a lease never entered untracked the job on exit"


def test_leaving_a_lease_twice_untracks_the_jobs_next_lock(redis_client: redis.Redis) -> None:
    """Defect: a second ``__exit__`` of a left lease untracks the job again.

    After the lease is left, the job is tracked again with the same token
    (a progress hook, or a new lease); leaving the old lease once more sends
    another ``UntrackJob`` and that lock is no longer renewed. The second
    exit should be a no-op (or raise), like the first exit's second half.
    """
    manager = _manager(redis_client)
    tokens = take_locks(redis_client, KEYS, ["j"], TTL)
    held = lease(manager, "j", tokens["j"])
    with held:
        pass
    track_job(manager, "j", tokens["j"])
    with contextlib.suppress(RuntimeError):
        held.__exit__(None, None, None)
    assert is_tracked(manager, "j"), "leaving a left lease again untracked the job's lock"


# -- odd timeouts ---------------------------------------------------------------


def test_wait_with_a_nan_timeout_spins_a_core_until_the_manager_answers(
    redis_client: redis.Redis,
) -> None:
    """Defect: ``Lease.wait(float("nan"))`` busy-loops at 100 % CPU while the track is unanswered.

    ``wait`` passes the timeout straight to the pykka future's ``get``, whose
    loop never sees ``nan`` run out and re-waits with ``Condition.wait(nan)``,
    which returns at once: the watchdog thread burns a core for as long as the
    manager is busy (a long tick, a slow callback). A ``nan`` timeout should
    be refused (``ValueError``) or treated as ``threading.Event.wait`` treats
    it (return at once).
    """
    busy = threading.Event()
    release = threading.Event()

    def slow_callback(_ids: list[str]) -> None:
        busy.set()
        release.wait(10 * WATCH_S)

    manager = _manager(redis_client, on_locks_renewed=slow_callback)
    tokens = take_locks(redis_client, KEYS, ["busy", "j"], TTL)
    track_job(manager, "busy", tokens["busy"])
    # The manager's thread is now inside a callback: the lease's track waits.
    assert busy.wait(10 * WATCH_S), "no renewal came"
    held = lease(manager, "j", tokens["j"]).__enter__()
    spent: list[float] = []
    outcome: list[object] = []

    def watchdog() -> None:
        started = time.thread_time()
        try:
            outcome.append(held.wait(math.nan))
        except ValueError as error:
            outcome.append(error)
        spent.append(time.thread_time() - started)

    thread = threading.Thread(target=watchdog, daemon=True)
    thread.start()
    held_for = WATCH_S
    thread.join(held_for)
    release.set()
    thread.join(10 * WATCH_S)
    held.__exit__(None, None, None)
    assert outcome, "wait(nan) never returned"
    # A waiting thread uses next to no CPU; a spinning one uses all it gets.
    assert spent[0] < held_for / 4, f"wait(nan) burned {spent[0]:.2f} s of CPU"


# -- aio ------------------------------------------------------------------------


def test_aio_stop_from_a_callback_deadlocks_where_stop_does_not(
    redis_client: redis.Redis,
) -> None:
    """Defect: ``aio.stop`` awaited on the manager's own thread waits for that thread forever.

    ``actors.stop`` from a callback stops the manager after the current
    message; ``aio.stop`` (documented as its awaitable form) runs the same
    call on an executor thread, which is not the manager's, so it waits for
    the manager to finish while the manager waits for it: without a timeout
    it hangs, with one it raises ``pykka.Timeout``. It should check
    ``on_own_thread()`` first, as ``aio.untrack_job`` and the queries do.
    """
    outcome: list[object] = []
    asked = threading.Event()

    def callback(_ids: list[str]) -> None:
        if asked.is_set():
            return
        asked.set()
        try:
            asyncio.run(aio.stop(manager, timeout=WATCH_S))
            outcome.append("stopped")
        except pykka.Timeout as error:
            outcome.append(error)

    manager = _manager(redis_client, on_locks_renewed=callback)
    tokens = take_locks(redis_client, KEYS, ["j"], TTL)
    track_job(manager, "j", tokens["j"])
    wait_for(lambda: outcome, 10 * WATCH_S, "the callback's aio.stop to return")
    assert outcome == ["stopped"]
    wait_for(lambda: not manager.is_alive(), 10 * WATCH_S, "the manager to stop")


# -- the bullmq adapter ---------------------------------------------------------


def test_a_dict_connection_with_a_pool_renews_on_another_server(server: Server) -> None:
    """Defect: a worker connection ``{"connection_pool": pool}`` is renewed on localhost:6379.

    bullmq-py passes a dict's keywords to ``redis.asyncio.Redis``, which
    honours ``connection_pool`` (host and port come from the pool). The
    adapter drops ``connection_pool`` (one of its "own settings") and keeps
    nothing of the pool, so the renewal client gets redis-py's defaults —
    another server, or none: every lock of the worker goes unrenewed, seen
    only as ``error`` events. It should read the pool's settings (as it
    does for a client) or refuse the dict at install.
    """
    parts = urlsplit(server.url)
    host, port = parts.hostname, parts.port

    async def scenario() -> dict[str, Any] | None:
        pool = redis.asyncio.ConnectionPool(host=host, port=port, db=2)
        worker = Worker(
            "review",
            None,
            {"connection": {"connection_pool": pool}, "autorun": False, "lockDuration": 2000},
        )
        try:
            try:
                installed = use_actor_lock_manager(worker)
            except (TypeError, ValueError):
                return None  # refused at install: the user learns it at once
            conn = installed.connection
            assert isinstance(conn, redis.Redis)
            return dict(conn.connection_pool.connection_kwargs)
        finally:
            await worker.close()
            await pool.aclose()

    kwargs = asyncio.run(scenario())
    if kwargs is None:
        return
    assert (kwargs.get("host"), kwargs.get("port"), kwargs.get("db")) == (host, port, 2)


def test_the_old_run_of_a_redelivered_job_untracks_the_new_runs_lock(server: Server) -> None:
    """Defect: the processor wrapper releases a job by id, so an old run untracks its re-run's lock.

    A stalled job handed back to the same worker runs again with a new token
    while its first run goes on (``concurrency > 1``). When the first run's
    processor returns, ``releasing`` untracks the job by id, without its
    token: the new run's lock is no longer renewed (and its later loss is
    dropped as "released"). The wrapper is given the token; it should
    untrack only that lock (bullmq's own ``untrack_job(job.id)`` in
    ``processJob``'s ``finally`` has the same flaw and needs the same care).
    """

    class Job:
        def __init__(self, job_id: str) -> None:
            self.id = job_id

    async def process(job: Any, token: str) -> None:
        return None

    async def scenario() -> bool:
        worker = Worker(
            "review", process, {"connection": server.url, "autorun": False, "lockDuration": TTL}
        )
        try:
            installed = use_actor_lock_manager(worker)
            installed.start()
            now = time.time_ns() // 1_000_000
            installed.track_job("1", "first-token", now)
            # Taken again, with a new token, while the first run still runs.
            installed.track_job("1", "second-token", now)
            # The first run's processor returns.
            await worker.processor(Job("1"), "first-token")
            manager = installed.manager
            assert manager is not None
            return await aio.is_tracked(manager, "1")
        finally:
            await worker.close()

    assert asyncio.run(scenario()), "the re-run's lock was untracked by the first run"
