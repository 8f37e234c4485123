"""Each way a lock is lost reaches the job's own code, and no sooner or later than it should.

A job holds its lock through a lease; the test causes the loss and measures
when the job's code (a thread blocked in ``held.wait()``, or a task awaiting
``held.wait_async()``) learns it. The bounds come from the durations:

- stolen or expired: a leased lock is checked (renewed) at every tick, so the
  loss is found by the next tick, at most one interval later, and the job
  learns it in that very tick (before the next one could start);
- max_hold: at the first tick after the deadline (one interval), never before;
- manager_stopped: while the manager stops.

The bounds of ticks get half an interval of slack for a late timer and the
round trip on a loaded machine; the others :data:`~tests.leases.tools.MARGIN_MS`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import redis

import actors
from actors import LockLost, ManagerRef, QueueKeys, RedisRenewer
from actors.messages import Reason
from actors.timing import default_safety_margin
from tests.conftest import Server
from tests.leases.tools import LOCK_MS, MARGIN_MS, TIMING, CountingLease, Noting
from tests.support import Recorder, new_token, take_locks, wait_for

KEYS = QueueKeys("leases")
JOB = "job-1"
MAX_HOLD_MS = 300  # not on the tick grid: the deadline falls between two ticks
#: The longest any one scenario may take, in seconds.
BUDGET_S = 4 * LOCK_MS / 1000

Provoke = Callable[[float], float]


@dataclass
class Setup:
    manager: ManagerRef
    renewer: Noting
    recorder: Recorder
    client: redis.Redis


@dataclass
class Run:
    held: CountingLease
    cause_at: float
    learned_at: float | None


@pytest.fixture
def setup(engine_server: Server, engine_client: redis.Redis) -> Iterator[Setup]:
    renewer = Noting(RedisRenewer(engine_server.url, KEYS, TIMING, default_safety_margin(TIMING)))
    recorder = Recorder()
    manager = actors.start_link(
        renewer=renewer, keys=KEYS, lock_duration=LOCK_MS, **recorder.callbacks()
    )
    yield Setup(manager, renewer, recorder, engine_client)
    actors.stop(manager)


def run_in_thread(
    manager: ManagerRef, token: str, provoke: Provoke, max_hold: int | None, *, finish: bool
) -> Run:
    """The job waits in a thread of its own; ``provoke`` runs in the test's thread.

    With ``finish`` the lease is left as soon as ``provoke`` returns (the job
    finished); otherwise it is left once the job has learned of the loss.
    """
    learned: list[float] = []
    entered_at = time.monotonic()
    with CountingLease(manager, JOB, token, max_hold) as held:

        def job() -> None:
            if held.wait(BUDGET_S):
                learned.append(time.monotonic())

        thread = threading.Thread(target=job)
        thread.start()
        cause_at = provoke(entered_at)
        if not finish:
            thread.join(BUDGET_S)
    thread.join(BUDGET_S)
    return Run(held, cause_at, learned[0] if learned else None)


def run_in_asyncio(
    manager: ManagerRef, token: str, provoke: Provoke, max_hold: int | None, *, finish: bool
) -> Run:
    """The job is a task awaiting the lease; ``provoke`` runs on a helper thread."""

    async def job(held: CountingLease) -> float | None:
        return time.monotonic() if await held.wait_async(BUDGET_S) else None

    async def main() -> Run:
        entered_at = time.monotonic()
        async with CountingLease(manager, JOB, token, max_hold) as held:
            task = asyncio.ensure_future(job(held))
            cause_at = await asyncio.to_thread(provoke, entered_at)
            if not finish:
                await asyncio.wait({task}, timeout=BUDGET_S)
        return Run(held, cause_at, await asyncio.wait_for(task, BUDGET_S))

    return asyncio.run(main())


RUNNERS = {"thread": run_in_thread, "asyncio": run_in_asyncio}


def _after_a_renewal(setup: Setup, entered_at: float) -> None:
    # Right after a renewal: the next check of the lock is a whole renew
    # window away, the worst case for finding a loss.
    setup.recorder.wait_renewed([JOB], BUDGET_S, since=entered_at)


def provoker(setup: Setup, reason: str) -> Provoke:
    lock = KEYS.lock(JOB)

    def stolen(entered_at: float) -> float:
        _after_a_renewal(setup, entered_at)
        setup.client.set(lock, new_token(), px=LOCK_MS)  # another worker took the job
        return time.monotonic()

    def expired(entered_at: float) -> float:
        _after_a_renewal(setup, entered_at)
        setup.client.pexpire(lock, 1)  # its TTL runs out on the server
        return time.monotonic() + 0.001

    def max_hold(entered_at: float) -> float:
        return entered_at + MAX_HOLD_MS / 1000  # nothing to do: the deadline passes

    def manager_stopped(entered_at: float) -> float:
        _after_a_renewal(setup, entered_at)
        stopping_at = time.monotonic()
        actors.stop(setup.manager)
        return stopping_at

    return {
        "stolen": stolen,
        "expired": expired,
        "max_hold": max_hold,
        "manager_stopped": manager_stopped,
    }[reason]


@pytest.mark.parametrize("mode", list(RUNNERS))
@pytest.mark.parametrize("reason", ["stolen", "expired", "max_hold", "manager_stopped"])
def test_the_job_learns_each_loss_once_within_its_bound(
    setup: Setup, mode: str, reason: Reason
) -> None:
    # Given a job holding its lock through a lease, and waiting on it
    token = take_locks(setup.client, KEYS, [JOB], LOCK_MS)[JOB]
    max_hold = MAX_HOLD_MS if reason == "max_hold" else None

    # when the lock is lost for `reason`
    run = RUNNERS[mode](setup.manager, token, provoker(setup, reason), max_hold, finish=False)

    # then the job's code learned it, once, with the reason
    assert run.learned_at is not None, f"the job never learned its lock was {reason}"
    assert run.held.losses() == [LockLost(JOB, token, reason)]
    assert run.held.lost
    assert run.held.reason == reason
    with pytest.raises(LockLost) as raised:
        run.held.check()
    assert (raised.value.job_id, raised.value.token, raised.value.reason) == (JOB, token, reason)

    # and within the bound its durations set, never before the cause
    waited_ms = (run.learned_at - run.cause_at) * 1000
    assert waited_ms >= 0, f"learned {-waited_ms:.0f} ms before the cause"
    bound_ms = {
        "stolen": TIMING.interval + TIMING.interval // 2,
        "expired": TIMING.interval + TIMING.interval // 2,
        "max_hold": TIMING.interval + TIMING.interval // 2,
        "manager_stopped": MARGIN_MS,
    }[reason]
    assert waited_ms <= bound_ms, f"learned {waited_ms:.0f} ms after the cause (bound {bound_ms})"

    if reason in ("stolen", "expired"):
        # found by the first renewal call after the cause, and learned in that
        # tick: before the next tick could have started
        found_at = setup.renewer.first_call_with(JOB, after=run.cause_at)
        assert found_at is not None
        assert (run.learned_at - found_at) * 1000 < TIMING.interval
    if reason != "manager_stopped":
        stats = actors.get_stats(setup.manager)
        assert (stats.lost, stats.tracked) == (1, 0)
        # The callback runs on the manager's delivery thread: perhaps after the stats.
        setup.recorder.wait(setup.recorder.lost, BUDGET_S, "the manager's on_lost report")
        assert [(item, item.reason) for item in setup.recorder.lost()] == [(JOB, reason)]


@pytest.mark.parametrize("mode", list(RUNNERS))
def test_a_job_that_finishes_normally_never_sees_a_loss(setup: Setup, mode: str) -> None:
    # Given a job that holds its lock across several renewals,
    token = take_locks(setup.client, KEYS, [JOB], LOCK_MS)[JOB]

    def work(entered_at: float) -> float:
        wait_for(
            lambda: setup.recorder.renewed(since=entered_at)[JOB] >= 2,
            BUDGET_S,
            "two renewals",
        )
        return time.monotonic()

    # when it finishes and leaves its lease,
    run = RUNNERS[mode](setup.manager, token, work, None, finish=True)
    # and deletes its lock at once, as a worker completing the job does
    setup.client.delete(KEYS.lock(JOB))
    left_at = time.monotonic()
    ticks = actors.get_stats(setup.manager).ticks

    # then, over a whole renew window of ticks after, nothing was lost
    wait_for(
        lambda: actors.get_stats(setup.manager).ticks >= ticks + 3,
        BUDGET_S,
        "three more ticks",
    )
    assert run.learned_at is None
    assert run.held.told == []
    assert not run.held.lost
    assert run.held.reason is None
    run.held.check()
    assert setup.recorder.lost() == []
    assert setup.renewer.first_call_with(JOB, after=left_at) is None
    assert actors.get_stats(setup.manager).lost == 0
