"""The manager against a plain model, driven step by step by hypothesis.

The actor runs for real; only its clock and its Redis call are replaced (by
a fake clock and an in-memory lock table), and the timer is the machine's
``advance`` rule, which fires each tick with ``ask`` so every step finishes
before the next. No Redis is involved.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pykka
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    rule,
)
from redis.exceptions import ConnectionError as RedisConnectionError

from actors import LockManager, QueueKeys
from actors.messages import ExtendLocks, GetTrackedJobIds, TrackJob, UntrackJob
from actors.schedule import Timing
from actors.scripts import BatchOutcome, ChunkError

ids = st.sampled_from([f"job-{i}" for i in range(8)])


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


class FakeLocks:
    """The server's lock keys, and what every renewal call asked for."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.held: dict[str, str] = {}
        self.raise_next = False
        self.fail_chunk_next = False
        self.calls: list[tuple[int, list[str]]] = []

    def __call__(self, job_ids: Sequence[str], tokens: Sequence[str]) -> BatchOutcome:
        self.calls.append((self.clock.now, list(job_ids)))
        if self.raise_next:
            self.raise_next = False
            raise RedisConnectionError("connection refused")
        if self.fail_chunk_next:
            # The server refused the second half (BUSY): those jobs' state is unknown.
            self.fail_chunk_next = False
            half = len(job_ids) // 2
            failed = [
                j
                for j, t in zip(job_ids[:half], tokens[:half], strict=True)
                if self.held.get(j) != t
            ]
            return BatchOutcome(failed, [ChunkError(half, len(job_ids), RuntimeError("BUSY"))])
        return BatchOutcome(
            [j for j, t in zip(job_ids, tokens, strict=True) if self.held.get(j) != t], []
        )


class ManagerMachine(RuleBasedStateMachine):
    tracked_ids = Bundle("tracked_ids")

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.locks = FakeLocks(self.clock)
        self.ref: pykka.ActorRef[LockManager] | None = None
        # The model: what the manager should track, with each job's token and
        # the time of its tracking or last renewal ...
        self.tokens: dict[str, str] = {}
        self.stamps: dict[str, int] = {}
        # ... and, per job, when the manager last tried to renew it.
        self.last_attempt: dict[str, int] = {}
        self.reported: Counter[str] = Counter()
        self.errors = 0
        self.token_counter = 0

    @initialize(
        duration=st.integers(8, 400),
        renew_fraction=st.one_of(st.none(), st.floats(0.1, 0.95)),
    )
    def start(self, duration: int, renew_fraction: float | None) -> None:
        renew = None if renew_fraction is None else max(2, int(duration * renew_fraction))
        self.timing = Timing(duration, renew)
        self.next_tick = self.clock.now + self.timing.interval
        self.ref = LockManager.start(
            connection="redis://127.0.0.1:1/0",
            keys=QueueKeys("q"),
            lock_duration=duration,
            lock_renew_time=renew,
            on_lock_renewal_failed=self.reported.update,
            on_error=self._on_error,
            _clock=self.clock,
            _renewer=self.locks,
            _autostart_timer=False,
        )

    def _on_error(self, exc: Exception) -> None:
        self.errors += 1

    def teardown(self) -> None:
        if self.ref is not None:
            self.ref.stop()

    # -- rules -----------------------------------------------------------

    @rule(target=tracked_ids, job_id=ids)
    def track(self, job_id: str) -> str:
        assert self.ref is not None
        self.token_counter += 1
        token = f"token-{self.token_counter}"
        self.locks.held[job_id] = token
        self.ref.tell(TrackJob(job_id, token))
        self.tokens[job_id] = token
        self.stamps[job_id] = self.last_attempt[job_id] = self.clock.now
        del self.reported[job_id]
        return job_id

    @rule(job_id=consumes(tracked_ids))
    def untrack(self, job_id: str) -> None:
        assert self.ref is not None
        self.ref.tell(UntrackJob(job_id))
        self.tokens.pop(job_id, None)
        self.locks.held.pop(job_id, None)

    @rule(job_id=ids)
    def lose_lock(self, job_id: str) -> None:
        # Another worker took the job, or the lock expired behind our back.
        self.locks.held.pop(job_id, None)

    @rule()
    def backend_raises_next(self) -> None:
        self.locks.raise_next = True

    @rule()
    def backend_refuses_a_chunk_next(self) -> None:
        self.locks.fail_chunk_next = True

    @rule(data=st.data())
    def time_passes_within_the_interval(self, data: st.DataObject) -> None:
        room = self.next_tick - self.clock.now
        if room > 0:
            self.clock.now += data.draw(st.integers(0, room))

    @rule(ticks=st.integers(1, 3), jitter=st.integers(0, 2))
    def timer_fires(self, ticks: int, jitter: int) -> None:
        assert self.ref is not None
        # A timer may run late, but by less than one interval.
        jitter = min(jitter, self.timing.interval - 1)
        for _ in range(ticks):
            self.clock.now = max(self.clock.now, self.next_tick + jitter)
            self._no_job_waited_too_long()
            self._tick()
            self.next_tick += self.timing.interval

    def _tick(self) -> None:
        assert self.ref is not None
        now = self.clock.now
        due = [j for j in self.tokens if self.stamps[j] + self.timing.threshold < now]
        calls_before = len(self.locks.calls)
        raises, refuses = self.locks.raise_next, self.locks.fail_chunk_next

        self.ref.ask(ExtendLocks())

        calls = self.locks.calls[calls_before:]
        assert len(calls) == (1 if due else 0)
        if not due:
            return
        sent = calls[0][1]
        # Exactly the due jobs, in one call: none before its threshold.
        assert sorted(sent) == sorted(due)
        for job_id in sent:
            self.last_attempt[job_id] = now
        if raises:
            return  # nothing is known to have run: every job keeps its stamp
        ran = sent[: len(sent) // 2] if refuses else sent
        for job_id in ran:
            if self.locks.held.get(job_id) == self.tokens[job_id]:
                self.stamps[job_id] = now
            else:
                del self.tokens[job_id]

    def _no_job_waited_too_long(self) -> None:
        limit = self.timing.renew_time + self.timing.interval
        for job_id in self.tokens:
            waited = self.clock.now - self.last_attempt[job_id]
            assert waited <= limit, (job_id, waited, limit)
            assert waited < self.timing.lock_duration

    # -- invariants ------------------------------------------------------

    @invariant()
    def tracked_ids_agree(self) -> None:
        if self.ref is not None:
            tracked: list[str] = self.ref.ask(GetTrackedJobIds(), block=True)
            assert sorted(tracked) == sorted(self.tokens)

    @invariant()
    def a_lost_job_is_reported_exactly_once(self) -> None:
        assert all(count == 1 for count in self.reported.values()), self.reported
        assert not set(self.reported) & set(self.tokens)


ManagerMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_manager_against_model = ManagerMachine.TestCase
