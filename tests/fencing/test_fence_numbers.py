"""Fencing numbers across the whole life of a job id: holders, removals and re-adds.

BullMQ users give jobs their own ids (deduplication) and remove finished jobs,
so one id can name several jobs in turn. A rule-based machine drives a real
server through what workers and BullMQ do to a few such ids (add, take the
lock, take fences, lose the lock, remove, add again) beside a plain model of
who held each id and what numbers they got, and a store keyed by job id alone
that writes with the Fencing guide's SQL. After every step: every number handed
out for an id is larger than every earlier one of that id, each holder's write
is taken, every stale holder's write is refused, and the server holds nothing
but the jobs' hashes and locks.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass, field

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from actors import LockLost, QueueKeys, fence
from actors.fencing import FENCE_FIELD, FENCE_SCRIPT
from actors.scripts import script_source
from tests.support import new_token

KEYS = QueueKeys("reused")
IDS = ("dedup-1", "dedup-2")
TTL_MS = 60_000
EXAMPLES = int(os.environ.get("FENCE_EXAMPLES", "60"))

#: The guide's table and statement (docs/guides/fencing.md), keyed by job id alone.
TABLE = "CREATE TABLE results (job_id TEXT PRIMARY KEY, fence INTEGER, value TEXT)"
WRITE = (
    "INSERT INTO results (job_id, fence, value) VALUES (:job_id, :fence, :value) "
    "ON CONFLICT (job_id) DO UPDATE SET fence = excluded.fence, value = excluded.value "
    "WHERE excluded.fence >= results.fence"
)

ids = st.sampled_from(IDS)


@dataclass
class JobId:
    """What the model knows of one id: its job, its holder, every number it gave."""

    added: bool = False
    holder: str | None = None
    #: Every number handed out for this id, in order, over all its jobs.
    numbers: list[int] = field(default_factory=list)
    #: Each holder's last number, in the order they took their first.
    holders: dict[str, int] = field(default_factory=dict)

    def stale(self) -> list[str]:
        """Holders that a later holder followed: every one but the last to take a number."""
        return list(self.holders)[:-1]


class ReusedIds(RuleBasedStateMachine):
    """Job ids taken, given up, removed and added again, on a real server."""

    client: redis.Redis

    def __init__(self) -> None:
        super().__init__()
        self.client.flushall()
        self.model = {job_id: JobId() for job_id in IDS}
        self.store = sqlite3.connect(":memory:")
        self.store.execute(TABLE)

    def teardown(self) -> None:
        self.store.close()

    def _write(self, job_id: str, number: int, value: str) -> bool:
        with self.store:
            changed = self.store.execute(
                WRITE, {"job_id": job_id, "fence": number, "value": value}
            ).rowcount
        return changed == 1

    def _handed(self, job_id: str, token: str, number: int) -> None:
        job = self.model[job_id]
        assert all(number > earlier for earlier in job.numbers), (job_id, number, job.numbers)
        job.numbers.append(number)
        job.holders.pop(token, None)
        job.holders[token] = number
        # A holder writes its number when it starts, so it wins at once.
        assert self._write(job_id, number, token), (job_id, number)

    @rule(job_id=ids)
    def add(self, job_id: str) -> None:
        job = self.model[job_id]
        if job.added:
            return
        # As BullMQ adds a job with a custom id: its hash, no lock yet.
        self.client.hset(KEYS.key_prefix + job_id, mapping={"name": "work", "timestamp": 1})
        job.added = True

    @precondition(lambda self: any(j.added and j.holder is None for j in self.model.values()))
    @rule(data=st.data())
    def take(self, data: st.DataObject) -> None:
        free = [i for i, j in self.model.items() if j.added and j.holder is None]
        job_id = data.draw(st.sampled_from(free))
        token = new_token()
        assert self.client.set(KEYS.lock(job_id), token, nx=True, px=TTL_MS)
        self.model[job_id].holder = token
        self._handed(job_id, token, fence(self.client, KEYS, job_id, token))

    @precondition(lambda self: any(j.holder for j in self.model.values()))
    @rule(data=st.data(), times=st.integers(1, 5))
    def fence_again(self, data: st.DataObject, times: int) -> None:
        held = [i for i, j in self.model.items() if j.holder]
        job_id = data.draw(st.sampled_from(held))
        token = self.model[job_id].holder
        assert token is not None
        for _ in range(times):
            self._handed(job_id, token, fence(self.client, KEYS, job_id, token))

    @precondition(lambda self: any(j.holder for j in self.model.values()))
    @rule(data=st.data(), remove=st.booleans())
    def lose(self, data: st.DataObject, remove: bool) -> None:
        """The lock goes (expired, or a stalled check); with ``remove`` the job goes too."""
        held = [i for i, j in self.model.items() if j.holder]
        job_id = data.draw(st.sampled_from(held))
        job = self.model[job_id]
        self.client.delete(KEYS.lock(job_id))
        job.holder = None
        if remove:
            self.client.delete(KEYS.key_prefix + job_id)
            job.added = False

    @precondition(lambda self: any(j.holder for j in self.model.values()))
    @rule(data=st.data())
    def remove_and_add_again_in_one_round_trip(self, data: st.DataObject) -> None:
        """The holder fences, the job is removed, added again, taken and fenced, back to back.

        One round trip: the server runs the five commands one after the other,
        as close in time as they can be.
        """
        held = [i for i, j in self.model.items() if j.holder]
        job_id = data.draw(st.sampled_from(held))
        job = self.model[job_id]
        old, new = job.holder, new_token()
        assert old is not None
        lock, hash_key = KEYS.lock(job_id), KEYS.key_prefix + job_id
        script = self.client.register_script(script_source(FENCE_SCRIPT))
        pipe = self.client.pipeline(transaction=False)
        script(keys=[lock, hash_key], args=[old, FENCE_FIELD], client=pipe)
        pipe.delete(lock, hash_key)
        pipe.hset(hash_key, mapping={"name": "work", "timestamp": 2})
        pipe.set(lock, new, nx=True, px=TTL_MS)
        script(keys=[lock, hash_key], args=[new, FENCE_FIELD], client=pipe)
        last, *_, first = pipe.execute()
        self._handed(job_id, old, last)
        job.holder = new
        self._handed(job_id, new, first)

    @precondition(lambda self: any(j.stale() for j in self.model.values()))
    @rule(data=st.data())
    def a_stale_holder_writes(self, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from([i for i, j in self.model.items() if j.stale()]))
        job = self.model[job_id]
        token = data.draw(st.sampled_from(job.stale()))
        # it gets no new number, and its last one is refused by the store
        with pytest.raises(LockLost):
            fence(self.client, KEYS, job_id, token)
        assert not self._write(job_id, job.holders[token], "stale " + token), (job_id, token)

    @invariant()
    def the_store_holds_the_latest_holders_write(self) -> None:
        for job_id, job in self.model.items():
            if job.holders:
                row = self.store.execute(
                    "SELECT fence, value FROM results WHERE job_id = ?", (job_id,)
                ).fetchone()
                assert row == (job.numbers[-1], list(job.holders)[-1]), job_id

    @invariant()
    def nothing_but_the_jobs_and_their_locks(self) -> None:
        allowed = {KEYS.key_prefix + i for i in IDS} | {KEYS.lock(i) for i in IDS}
        found = {k.decode() if isinstance(k, bytes) else k for k in self.client.keys("*")}
        assert found <= allowed, found - allowed
        for job_id, job in self.model.items():
            stored = self.client.hget(KEYS.key_prefix + job_id, FENCE_FIELD)
            if job.added and stored is not None:
                assert int(stored) == job.numbers[-1]


@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")
def test_numbers_never_repeat_across_the_holders_of_a_reused_job_id(
    engine_client: redis.Redis,
) -> None:
    ReusedIds.client = engine_client
    run_state_machine_as_test(
        ReusedIds,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
