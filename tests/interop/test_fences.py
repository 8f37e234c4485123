"""Fences taken on jobs that BullMQ's own runtimes hold, complete, recover and remove.

A fence is one field of the job's hash, raised only while the lock holds the
caller's token. bullmq-py and BullMQ for Node.js are the judges: a fenced job
must read, complete, stall and go away exactly as any other job, a running
Node.js worker must keep the jobs it holds, and each holder's numbers must be
larger than every earlier holder's while a stale holder is refused.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import pytest
from bullmq import Job, Queue

from actors import LockLost, fence, get_stats, track_job, untrack_job
from actors.fencing import FENCE_FIELD
from tests.fencing.test_fence_numbers import TABLE, WRITE
from tests.interop.peers import (
    HOLD_S,
    LOCK_MS,
    PREFIX,
    RECOVER_S,
    RENEW_MS,
    Checks,
    Held,
    check_once,
    check_until_stalled,
    stall_count,
)
from tests.support import wait_for

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable

    import redis

    from actors import ManagerRef, QueueKeys
    from tests.conftest import Server
    from tests.interop.peers import NodePeer, Peer, PythonPeer

pytestmark = pytest.mark.both_engines

#: Fences each holder takes in a row.
FENCES = 3

#: Times BullMQ's own lock manager must renew each lock while fences are taken.
RENEWALS = 2

#: A job id of the user's own, as BullMQ users give for deduplication.
CUSTOM_ID = "report-7"


# -- what bullmq-py does and reads, on a Queue of its own ----------------------------


def on_bullmq_py(server: Server, keys: QueueKeys, action: Callable[[Any], Awaitable[Any]]) -> Any:
    """Run ``action`` with a bullmq-py ``Queue`` of the test's queue; return its result."""

    async def run() -> Any:
        queue = Queue(keys.name, {"connection": server.url, "prefix": PREFIX})
        try:
            return await action(queue)
        finally:
            await queue.close()

    return asyncio.run(run())


def complete(
    server: Server, keys: QueueKeys, held: Held, result: object, *, remove: bool = False
) -> None:
    """Complete a held job with bullmq-py's ``Job.moveToCompleted`` and the holder's token.

    With ``remove``, as a worker with ``removeOnComplete`` does: the job goes at once.
    """

    async def move(queue: Any) -> None:
        job = await Job.fromId(queue, held.id)
        assert job is not None, f"bullmq-py found no job {held.id}"
        if remove:
            job.opts["removeOnComplete"] = True
        await job.moveToCompleted(result, held.token)

    on_bullmq_py(server, keys, move)


def read(server: Server, keys: QueueKeys, job_id: str) -> dict[str, Any]:
    """What bullmq-py reads of a job: its state and the fields a user looks at."""

    async def load(queue: Any) -> dict[str, Any]:
        job = await Job.fromId(queue, job_id)
        assert job is not None, f"bullmq-py found no job {job_id}"
        return {
            "state": await queue.getJobState(job_id),
            "name": job.name,
            "data": job.data,
            "returnvalue": job.returnvalue,
            "attemptsMade": job.attemptsMade,
            "stalledCounter": job.stalledCounter,
            "failedReason": job.failedReason,
        }

    found: dict[str, Any] = on_bullmq_py(server, keys, load)
    return found


def remove(server: Server, keys: QueueKeys, job_id: str) -> None:
    """Remove a job with bullmq-py's ``Job.remove``."""

    async def drop(queue: Any) -> None:
        job = await Job.fromId(queue, job_id)
        assert job is not None, f"bullmq-py found no job {job_id}"
        await job.remove()

    on_bullmq_py(server, keys, drop)


# -- what the server holds --------------------------------------------------------


def text(value: bytes | str) -> str:
    """A reply of the (raw) client, as text."""
    return value.decode() if isinstance(value, bytes) else value


def queue_keys(client: redis.Redis, keys: QueueKeys) -> set[str]:
    """Every key of the queue, by SCAN."""
    found = client.scan_iter(match=keys.key_prefix + "*", count=1000)
    return {text(key) for key in found}


def keys_of(client: redis.Redis, keys: QueueKeys, job_ids: Iterable[str]) -> set[str]:
    """The keys named after any of ``job_ids``: its hash, its lock, its logs..."""
    own = {keys.key_prefix + job_id for job_id in job_ids}
    return {key for key in queue_keys(client, keys) if key in own or key.rpartition(":")[0] in own}


def fields(client: redis.Redis, keys: QueueKeys, job_id: str) -> dict[str, str]:
    """The job's hash, decoded."""
    raw = client.hgetall(keys.key_prefix + job_id)
    return {text(name): text(value) for name, value in raw.items()}


def rising(numbers: list[int]) -> bool:
    """Whether ``numbers`` strictly increase."""
    return all(a < b for a, b in pairwise(numbers))


def refusal(client: redis.Redis, keys: QueueKeys, held: Held) -> LockLost:
    """The ``LockLost`` a holder's ``fence()`` raises; fail if it hands out a number."""
    with pytest.raises(LockLost) as raised:
        fence(client, keys, held.id, held.token)
    assert (raised.value.job_id, raised.value.token) == (held.id, held.token)
    return raised.value


# -- the tests --------------------------------------------------------------------


def test_fenced_jobs_add_no_key_and_complete_read_and_go_as_any_other(
    python_peer: PythonPeer,
    manager: ManagerRef,
    engine_server: Server,
    engine_client: redis.Redis,
    keys: QueueKeys,
) -> None:
    # given two jobs bullmq-py took by hand, both tracked by our manager
    ids = python_peer.add(2)
    fenced, plain = python_peer.fetch(2)
    assert sorted([fenced.id, plain.id]) == sorted(ids)
    for job in (fenced, plain):
        track_job(manager, job.id, job.token)
    keys_before = queue_keys(engine_client, keys)
    fenced_before = fields(engine_client, keys, fenced.id)
    plain_before = fields(engine_client, keys, plain.id)

    # when the holder of one of them takes fences in a row
    taken = [fence(engine_client, keys, fenced.id, fenced.token) for _ in range(FENCES)]

    # then they rise, and they are one field of that job's hash alone: no key
    # was added, no other field or job changed
    assert rising(taken)
    assert queue_keys(engine_client, keys) == keys_before
    assert fields(engine_client, keys, fenced.id) == {**fenced_before, FENCE_FIELD: str(taken[-1])}
    assert fields(engine_client, keys, plain.id) == plain_before
    assert python_peer.states(ids) == dict.fromkeys(ids, "active")

    # when the holder takes a fence before each of BullMQ's stalled checks,
    # run back to back over three lock durations
    fenced_at = time.monotonic()
    checks = Checks()
    while time.monotonic() - fenced_at < HOLD_S:
        taken.append(fence(engine_client, keys, fenced.id, fenced.token))
        check_once(python_peer, engine_client, keys, checks)

    # then the numbers went on rising, and the fenced job kept its lock as
    # the plain one did: never reported stalled, never lost, still active
    assert rising(taken)
    assert checks.ran_after(fenced_at + LOCK_MS / 1000) >= 2, checks
    assert checks.stalled == []
    assert get_stats(manager).lost == 0
    for job in (fenced, plain):
        assert engine_client.get(keys.lock(job.id)) == job.token.encode(), job
        assert stall_count(engine_client, keys, job.id) == 0, job
    assert python_peer.states(ids) == dict.fromkeys(ids, "active")

    # when bullmq-py completes both jobs with their holders' tokens (BullMQ's
    # worker untracks a job once it moved it)
    for job in (fenced, plain):
        complete(engine_server, keys, job, {"done": job.id})
        untrack_job(manager, job.id, wait=True)

    # then it reads the fenced job back exactly as the plain one: completed once,
    # with its own data and return value
    data = {job_id: {"n": n} for n, job_id in enumerate(ids)}
    for job in (fenced, plain):
        assert read(engine_server, keys, job.id) == {
            "state": "completed",
            "name": "interop",
            "data": data[job.id],
            "returnvalue": {"done": job.id},
            "attemptsMade": 1,
            "stalledCounter": 0,
            "failedReason": None,
        }, job
    # and the former holder, whose lock BullMQ deleted, gets no fence
    assert refusal(engine_client, keys, fenced).reason == "expired"

    # when bullmq-py removes both jobs
    for job in (fenced, plain):
        remove(engine_server, keys, job.id)

    # then no key of either remains, the fenced one's hash and its number included
    assert keys_of(engine_client, keys, ids) == set()
    assert python_peer.states(ids) == dict.fromkeys(ids, "unknown")


def test_the_fence_keeps_counting_across_holders_and_refuses_the_stale_one(
    python_peer: PythonPeer,
    manager: ManagerRef,
    engine_server: Server,
    engine_client: redis.Redis,
    keys: QueueKeys,
) -> None:
    # given a job bullmq-py took by hand, tracked by our manager, whose holder took fences
    (job_id,) = python_peer.add(1)
    (first,) = python_peer.fetch(1)
    track_job(manager, first.id, first.token)
    earlier = [fence(engine_client, keys, job_id, first.token) for _ in range(FENCES)]

    # when the manager lets it go, BullMQ's stalled check moves it back to wait
    # and another bullmq-py holder takes it
    untrack_job(manager, job_id, wait=True)
    recovery = check_until_stalled(python_peer, engine_client, keys, [job_id])
    assert recovery.stalled == [job_id]
    (second,) = python_peer.fetch(1)
    assert second.id == job_id
    assert second.token != first.token
    track_job(manager, second.id, second.token)
    later = fence(engine_client, keys, job_id, second.token)

    # then the new holder's number is larger than every one the first holder got
    assert rising(earlier)
    assert later > max(earlier)
    # and the first holder is refused: the lock holds another token; no number was spent
    assert refusal(engine_client, keys, first).reason == "stolen"
    assert fence(engine_client, keys, job_id, second.token) > later
    assert engine_client.get(keys.lock(job_id)) == second.token.encode()

    # when the new holder completes it, as a worker with removeOnComplete does
    complete(engine_server, keys, second, {"done": job_id}, remove=True)
    untrack_job(manager, job_id, wait=True)

    # then the job and every key named after it are gone, and neither holder gets a fence
    assert keys_of(engine_client, keys, [job_id]) == set()
    assert python_peer.states([job_id]) == {job_id: "unknown"}
    assert refusal(engine_client, keys, first).reason == "expired"
    assert refusal(engine_client, keys, second).reason == "expired"


@pytest.mark.node
def test_a_running_nodejs_worker_keeps_jobs_we_fence_and_its_successor_fences_higher(
    node_peer: NodePeer,
    python_peer: PythonPeer,
    manager: ManagerRef,
    engine_server: Server,
    engine_client: redis.Redis,
    keys: QueueKeys,
) -> None:
    # given a running Node.js BullMQ worker that holds two jobs, renewing their
    # locks with its own lock manager and running its own stalled checker
    ids = node_peer.add(2)
    node_peer.hold(concurrency=2)
    wait_for(
        lambda: len(node_peer.events("active")) == len(ids),
        RECOVER_S,
        f"the Node.js worker took {len(ids)} jobs",
    )
    theirs = [Held(str(event["id"]), str(event["token"])) for event in node_peer.events("active")]
    assert sorted(job.id for job in theirs) == sorted(ids)

    # when we take fences with its tokens until its lock manager renewed every lock twice
    taken: dict[str, list[int]] = {job.id: [] for job in theirs}
    renewals = dict.fromkeys(ids, 0)

    def expiry(job_id: str) -> float:
        # The expiry instant, not the TTL: a renewal moves it later however
        # long this loop takes between two looks (a loaded machine).
        return time.monotonic() + engine_client.pttl(keys.lock(job_id)) / 1000

    last_expiry = {job_id: expiry(job_id) for job_id in ids}

    def fenced_through_renewals() -> bool:
        for job in theirs:
            taken[job.id].append(fence(engine_client, keys, job.id, job.token))
            expires = expiry(job.id)
            # More than a round trip and PTTL's rounding later: renewed meanwhile.
            if expires > last_expiry[job.id] + 0.05:
                renewals[job.id] += 1
                last_expiry[job.id] = expires
        return min(renewals.values()) >= RENEWALS

    wait_for(
        fenced_through_renewals,
        RECOVER_S,
        f"the Node.js worker renewed each lock {RENEWALS} times",
        interval=RENEW_MS / 1000 / 2,
    )

    # then the numbers rose, and the worker was not disturbed: it still holds
    # both jobs under its tokens, and nothing stalled or failed
    for job in theirs:
        assert rising(taken[job.id]), job
        assert engine_client.get(keys.lock(job.id)) == job.token.encode(), job
        assert stall_count(engine_client, keys, job.id) == 0, job
    assert node_peer.events("stalled") == []
    assert node_peer.events("error") == []
    assert node_peer.states(ids) == dict.fromkeys(ids, "active")

    # when the Node.js worker dies, bullmq-py's stalled check recovers its jobs
    # and bullmq-py takes them again, tracked by our manager
    node_peer.kill()
    recovery = check_until_stalled(python_peer, engine_client, keys, ids)
    assert sorted(recovery.stalled) == sorted(ids)
    ours = python_peer.fetch(len(ids))
    assert sorted(job.id for job in ours) == sorted(ids)
    for job in ours:
        track_job(manager, job.id, job.token)

    # then each new holder's number is larger than every one the dead worker got,
    # and the dead worker's tokens get none
    for job in ours:
        assert fence(engine_client, keys, job.id, job.token) > max(taken[job.id]), job
    for job in theirs:
        assert refusal(engine_client, keys, job).reason == "stolen"

    # when bullmq-py completes them
    for job in ours:
        complete(engine_server, keys, job, {"done": job.id})
        untrack_job(manager, job.id, wait=True)

    # then it reads each back completed once, with its data and return value
    for job in ours:
        found = read(engine_server, keys, job.id)
        assert (found["state"], found["returnvalue"]) == ("completed", {"done": job.id}), found
        assert found["data"] == {"n": ids.index(job.id)}, found
        assert (found["attemptsMade"], found["stalledCounter"]) == (1, 1), found


def test_a_job_id_removed_and_added_again_fences_above_its_old_job(
    peer: Peer,
    engine_server: Server,
    engine_client: redis.Redis,
    keys: QueueKeys,
) -> None:
    # given a job with the user's own id, added and taken by a BullMQ runtime,
    # whose holder took fences and wrote to a store keyed by job id alone
    store = sqlite3.connect(":memory:")
    store.execute(TABLE)

    def write(number: int, value: str) -> bool:
        with store:
            changed = store.execute(WRITE, {"job_id": CUSTOM_ID, "fence": number, "value": value})
        return changed.rowcount == 1

    assert peer.add(1, job_id=CUSTOM_ID) == [CUSTOM_ID]
    (first,) = peer.fetch(1)
    old = [fence(engine_client, keys, CUSTOM_ID, first.token) for _ in range(FENCES)]
    assert write(old[-1], "first")

    # when bullmq-py completes it as a worker with removeOnComplete does, and the
    # same id is added again and taken by a new holder
    complete(engine_server, keys, first, {"done": 1}, remove=True)
    assert keys_of(engine_client, keys, [CUSTOM_ID]) == set()
    assert peer.add(1, job_id=CUSTOM_ID) == [CUSTOM_ID]
    (second,) = peer.fetch(1)
    assert (second.id, second.token != first.token) == (CUSTOM_ID, True)
    new = fence(engine_client, keys, CUSTOM_ID, second.token)

    # then the new job's first number is above every number of the old one, so
    # the store takes the new holder's write and refuses the old holder's
    assert rising([*old, new])
    assert write(new, "second")
    assert not write(old[-1], "stale first")
    assert store.execute("SELECT fence, value FROM results").fetchall() == [(new, "second")]
    # and the old holder gets no new number
    assert refusal(engine_client, keys, first).reason == "stolen"

    # when the new job is completed and removed too, nothing of either is left
    complete(engine_server, keys, second, {"done": 2}, remove=True)
    assert keys_of(engine_client, keys, [CUSTOM_ID]) == set()
    store.close()
