"""A thousand jobs hold their locks at once; another worker steals 1% of them.

Each job is an asyncio task in its own ``async with lease(...)``, racing its
lease against the end of the run. Exactly the stolen jobs learn it, each
once, with the reason ``"stolen"``, within one renew window (plus one tick of
slack) of the theft; the others never hear a word, even a whole renew window
later, and all of them leave their leases without an error.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import TYPE_CHECKING

import pytest
import redis

import actors
from actors import LockLost, ManagerRef, QueueKeys, aio
from tests.conftest import Server
from tests.leases.tools import LOCK_MS, MARGIN_MS, TIMING, CountingLease
from tests.support import Recorder, new_token, take_locks, wait_for

if TYPE_CHECKING:
    from tests.conftest import StartManager

KEYS = QueueKeys("many")
JOBS = 1000
STOLEN = JOBS // 100
BUDGET_S = 4 * LOCK_MS / 1000


@pytest.fixture
def manager(
    engine_server: Server, engine_client: redis.Redis, start_manager: StartManager
) -> ManagerRef:
    recorder = Recorder()
    manager = start_manager(
        connection=engine_server.url, keys=KEYS, lock_duration=LOCK_MS, **recorder.callbacks()
    )
    manager.recorder = recorder  # type: ignore[attr-defined]
    return manager


def test_exactly_the_stolen_leases_learn_it_once(
    manager: ManagerRef, engine_client: redis.Redis
) -> None:
    recorder: Recorder = manager.recorder  # type: ignore[attr-defined]
    ids = [f"job-{n}" for n in range(JOBS)]
    tokens = take_locks(engine_client, KEYS, ids, LOCK_MS)
    stolen = set(random.Random().sample(ids, STOLEN))
    leases = {job_id: CountingLease(manager, job_id, tokens[job_id]) for job_id in ids}
    learned: dict[str, float] = {}

    async def job(held: CountingLease, done: asyncio.Event) -> None:
        async with held:
            lost = asyncio.ensure_future(held.wait_async())
            finished = asyncio.ensure_future(done.wait())
            await asyncio.wait({lost, finished}, return_when=asyncio.FIRST_COMPLETED)
            if lost.done() and lost.result():
                learned[held.job_id] = time.monotonic()
            lost.cancel()
            finished.cancel()

    def steal() -> float:
        pipe = engine_client.pipeline(transaction=False)
        for job_id in stolen:
            pipe.set(KEYS.lock(job_id), new_token(), px=LOCK_MS)
        pipe.execute()
        return time.monotonic()

    async def main() -> float:
        done = asyncio.Event()
        started = time.monotonic()
        jobs = [asyncio.ensure_future(job(held, done)) for held in leases.values()]
        # Given a thousand jobs whose locks were all renewed at least once,
        await asyncio.to_thread(recorder.wait_renewed, ids, BUDGET_S, since=started)
        # when another worker takes 1% of them at random,
        stolen_at = await asyncio.to_thread(steal)
        # then the stolen ones learn it within a renew window, plus a tick
        deadline = stolen_at + (TIMING.renew_time + MARGIN_MS) / 1000
        while len(learned) < STOLEN and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        # and a whole renew window later nobody else has heard a thing.
        ticks = (await aio.get_stats(manager)).ticks
        while (await aio.get_stats(manager)).ticks < ticks + 3:
            await asyncio.sleep(TIMING.interval / 4000)
        done.set()
        await asyncio.wait_for(asyncio.gather(*jobs), BUDGET_S)
        return stolen_at

    stolen_at = asyncio.run(main())

    assert set(learned) == stolen
    slowest_ms = (max(learned.values()) - stolen_at) * 1000
    assert slowest_ms <= TIMING.renew_time + MARGIN_MS, f"slowest learned after {slowest_ms:.0f} ms"
    for job_id, held in leases.items():
        if job_id in stolen:
            assert held.told == [LockLost(job_id, tokens[job_id], "stolen")], job_id
            assert held.reason == "stolen"
        else:
            assert held.told == [], job_id
            assert not held.lost
    assert sorted((item, item.reason) for item in recorder.lost()) == sorted(
        (job_id, "stolen") for job_id in stolen
    )
    stats = actors.get_stats(manager)
    assert (stats.lost, stats.tracked) == (STOLEN, 0)


def test_leases_held_in_one_thread_learn_each_theft_once(
    manager: ManagerRef, engine_client: redis.Redis
) -> None:
    # Given a thousand leases entered by one thread (a batch worker)
    ids = [f"job-{n}" for n in range(JOBS)]
    tokens = take_locks(engine_client, KEYS, ids, LOCK_MS)
    stolen = set(random.Random().sample(ids, STOLEN))
    leases = [CountingLease(manager, job_id, tokens[job_id]) for job_id in ids]
    for held in leases:
        held.__enter__()
    try:
        # when another worker takes 1% of them and deletes another 1%,
        gone = set(random.Random().sample(sorted(set(ids) - stolen), STOLEN))
        pipe = engine_client.pipeline(transaction=False)
        for job_id in stolen:
            pipe.set(KEYS.lock(job_id), new_token(), px=LOCK_MS)
        for job_id in gone:
            pipe.delete(KEYS.lock(job_id))
        pipe.execute()

        # then check() tells exactly those, with the right reason
        def lost() -> dict[str, str | None]:
            return {held.job_id: held.reason for held in leases if held.lost}

        wait_for(lambda: len(lost()) == 2 * STOLEN, BUDGET_S, "20 lost leases")
        assert lost() == {job_id: "stolen" for job_id in stolen} | {
            job_id: "expired" for job_id in gone
        }
    finally:
        for held in leases:
            held.__exit__(None, None, None)
    assert all(len(held.told) == (held.job_id in stolen | gone) for held in leases)
    assert actors.get_stats(manager).tracked == 0
