"""Leases against a plain model, driven step by step by hypothesis.

A real manager runs with its public seams: a fake clock (``clock=``), a timer
that fires only when the machine's ``timer_fires`` rule says so
(``timer=ManualTimers()``), and an in-memory lock table as its renewer. Jobs
open and leave leases; other workers steal or delete their locks; time
passes; ticks run on the grid (late by a random amount) or as a "renew now";
a renewal call fails now and then; the manager may stop and be replaced. The model says, for
each lease, whether and why its lock is lost after every step:

- ``max_hold``: at the first tick whose clock is at or past the deadline;
- ``stolen`` / ``expired``: at the first tick that renews the job (a leased
  job is due at every tick: ``stamp < tick time``) and finds another token or
  no key;
- ``manager_stopped``: when the manager stops with the job tracked (a new
  manager then takes over), or at once for a lease entered on a stopped one.

What it proves: every lease says exactly what the model says after every
step (never early, never late, never a wrong reason); the manager tells each
lease at most once, and only about its own lock; a lease left with its lock
held never changes again; the manager tracks exactly the held, unlost leases.
No Redis is involved.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from redis.exceptions import ConnectionError as RedisConnectionError

import actors
from actors import ExtendLocks, Lease, LockLost, ManagerRef, QueueKeys
from actors.lost import Reason
from actors.schedule import Timing
from actors.scripts import EXPIRED, STOLEN, BatchOutcome
from tests.support import ManualClock, ManualTimers

JOB_IDS = [f"job-{i}" for i in range(5)]
ids = st.sampled_from(JOB_IDS)
holds = st.one_of(st.none(), st.integers(1, 1500))


class Table:
    """The server's lock keys, in memory; its next call may fail as a dropped connection would."""

    def __init__(self) -> None:
        self.held: dict[str, str] = {}
        self.fail_next = False
        #: The ids of every call, in order.
        self.calls: list[list[str]] = []

    def __call__(self, job_ids: Sequence[str], tokens: Sequence[str]) -> BatchOutcome:
        self.calls.append(list(job_ids))
        if self.fail_next:
            self.fail_next = False
            raise RedisConnectionError("connection reset")
        failed = [j for j, t in zip(job_ids, tokens, strict=True) if self.held.get(j) != t]
        return BatchOutcome(failed, [], {j: STOLEN if j in self.held else EXPIRED for j in failed})

    def close(self) -> None:
        pass


class Told(Lease):
    """A lease that keeps what the manager told it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.told: list[Any] = []

    def tell(self, message: Any) -> None:
        self.told.append(message)
        super().tell(message)


@dataclass
class Model:
    """What one lease should say."""

    lease: Told
    token: str
    #: When its lock was taken or last renewed, on the fake clock.
    stamp: int
    #: When the manager stops renewing it (``max_hold``), or ``None``.
    deadline: int | None
    reason: Reason | None = None
    #: Whether its lock was renewed at least once.
    renewed: bool = False
    #: Whether the manager, rather than the lease itself, is to say so.
    told: bool = False
    open: bool = True


class LeaseMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        self.timers = ManualTimers()
        self.table = Table()
        self.leases: list[Model] = []
        self.tokens = 0

    @initialize(
        duration=st.integers(8, 400),
        max_hold=st.one_of(st.none(), st.integers(100, 3000)),
        first=st.lists(st.tuples(ids, holds), min_size=1, max_size=3, unique_by=lambda t: t[0]),
    )
    def start(
        self, duration: int, max_hold: int | None, first: list[tuple[str, int | None]]
    ) -> None:
        self.timing = Timing(duration)
        self.max_hold = max_hold
        self.stopped: list[ManagerRef] = []
        self._start_manager()
        for job_id, hold in first:
            self._enter(self.manager, job_id, hold)

    def _start_manager(self) -> None:
        self.manager: ManagerRef = actors.start_link(
            renewer=self.table,
            keys=QueueKeys("q"),
            lock_duration=self.timing.lock_duration,
            max_hold=self.max_hold,
            clock=self.clock,
            timer=self.timers,
        )

    def teardown(self) -> None:
        if hasattr(self, "manager"):
            actors.stop(self.manager)

    def _open(self) -> dict[str, Model]:
        return {m.lease.job_id: m for m in self.leases if m.open}

    def _held(self) -> list[Model]:
        """Leases the manager should be renewing."""
        return [m for m in self.leases if m.open and m.reason is None]

    # -- rules -------------------------------------------------------------

    def _free(self) -> list[str]:
        return [job_id for job_id in JOB_IDS if job_id not in self._open()]

    def _enter(self, manager: ManagerRef, job_id: str, max_hold: int | None) -> Model:
        self.tokens += 1
        token = f"token-{self.tokens}"
        self.table.held[job_id] = token
        held = Told(manager, job_id, token, max_hold)
        held.__enter__()
        hold = max_hold if max_hold is not None else self.max_hold
        now = self.clock.now
        model = Model(held, token, now, None if hold is None else now + hold)
        self.leases.append(model)
        return model

    @precondition(lambda self: self._free())
    @rule(data=st.data(), max_hold=holds)
    def enter(self, data: st.DataObject, max_hold: int | None) -> None:
        """A job takes its lock and enters a lease (one lease per job at a time)."""
        self._enter(self.manager, data.draw(st.sampled_from(self._free())), max_hold)

    @precondition(lambda self: self.stopped and self._free())
    @rule(data=st.data())
    def enter_on_a_stopped_manager(self, data: st.DataObject) -> None:
        model = self._enter(self.stopped[-1], data.draw(st.sampled_from(self._free())), None)
        model.reason = "manager_stopped"

    def _done(self) -> list[Model]:
        """Open leases whose job has run a while: its lock was renewed, or lost."""
        return [m for m in self.leases if m.open and (m.reason is not None or m.renewed)]

    @precondition(lambda self: self._done())
    @rule(data=st.data())
    def leave(self, data: st.DataObject) -> None:
        """A job that has run a while finishes and leaves its lease."""
        model = data.draw(st.sampled_from(self._done()))
        model.lease.__exit__(None, None, None)
        model.open = False
        # The worker deletes its lock once done.
        if self.table.held.get(model.lease.job_id) == model.token:
            del self.table.held[model.lease.job_id]

    @precondition(lambda self: self._held())
    @rule(data=st.data(), steal=st.booleans())
    def lose_lock(self, data: st.DataObject, steal: bool) -> None:
        """Another worker takes a held job, or its lock expires behind the job's back."""
        job_id = data.draw(st.sampled_from(sorted(m.lease.job_id for m in self._held())))
        if steal:
            self.tokens += 1
            self.table.held[job_id] = f"thief-{self.tokens}"
        else:
            self.table.held.pop(job_id, None)

    @rule()
    def the_next_call_fails(self) -> None:
        self.table.fail_next = True

    @rule(data=st.data())
    def time_passes(self, data: st.DataObject) -> None:
        deadline = self.timers.deadline
        if deadline > self.clock.now:
            self.clock.advance(data.draw(st.integers(0, deadline - self.clock.now)))

    @precondition(lambda self: self._held())
    @rule(data=st.data(), edge=st.sampled_from(["deadline", "due"]), past=st.integers(-1, 1))
    def a_tick_at_an_edge(self, data: st.DataObject, edge: str, past: int) -> None:
        """A "renew now" right at, just before or just after one lease's edge."""
        model = data.draw(st.sampled_from(self._held()))
        if edge == "deadline" and model.deadline is not None:
            at = model.deadline + past
        else:
            at = model.stamp + past
        self.clock.now = max(self.clock.now, at)
        self._tick(at=self.clock.now, message=ExtendLocks())

    @rule(late=st.lists(st.one_of(st.integers(0, 3), st.floats(0, 2.5)), min_size=1, max_size=6))
    def timer_fires(self, late: list[float]) -> None:
        """The timer fires a few times in a row, each late by a few ms or by intervals."""
        for each in late:
            scheduled = self.timers.deadline
            lateness = int(each) if isinstance(each, int) else int(each * self.timing.interval)
            self.clock.now = max(self.clock.now, scheduled + lateness)
            self._tick(at=scheduled, message=ExtendLocks(scheduled))
            self.each_lease_says_what_the_model_says()

    @rule()
    def renew_now(self) -> None:
        self._tick(at=self.clock.now, message=ExtendLocks())

    @precondition(lambda self: len(self.table.calls) >= 3)
    @rule()
    def manager_restarts(self) -> None:
        """The manager stops (its held leases are told) and a new one takes over."""
        actors.stop(self.manager)
        self.stopped.append(self.manager)
        for model in self._held():
            model.reason, model.told = "manager_stopped", True
        self._start_manager()

    def _tick(self, at: int, message: ExtendLocks) -> None:
        now = self.clock.now
        fails = self.table.fail_next
        calls = len(self.table.calls)
        self.manager.ask(message)
        held = self._held()
        for model in held:
            if model.deadline is not None and model.deadline <= now:
                model.reason, model.told = "max_hold", True
        due = [model for model in held if model.reason is None and model.stamp < at]
        # The tick checked exactly the due leases' locks, in one call.
        sent = self.table.calls[calls:]
        assert len(sent) == (1 if due else 0), (sent, due)
        assert sorted(sent[0] if sent else []) == sorted(m.lease.job_id for m in due)
        if fails:
            return  # nothing is known to have run: each is retried next tick
        for model in due:
            value = self.table.held.get(model.lease.job_id)
            if value == model.token:
                model.stamp = at
                model.renewed = True
            else:
                model.reason = EXPIRED if value is None else STOLEN
                model.told = True

    # -- invariants ----------------------------------------------------------

    @invariant()
    def each_lease_says_what_the_model_says(self) -> None:
        for model in self.leases:
            held = model.lease
            assert held.reason == model.reason, (held, model)
            assert held.lost == (model.reason is not None)
            assert held.wait(0) == (model.reason is not None)

    @invariant()
    def the_manager_tells_each_lease_at_most_once_and_only_its_own_loss(self) -> None:
        for model in self.leases:
            if model.told:
                assert model.reason is not None
                expected = [LockLost(model.lease.job_id, model.token, model.reason)]
                assert model.lease.told == expected, model
            else:
                assert model.lease.told == [], model

    @invariant()
    def the_manager_tracks_exactly_the_held_leases(self) -> None:
        tracked = actors.get_tracked_job_ids(self.manager)
        assert sorted(tracked) == sorted(m.lease.job_id for m in self._held())


LeaseMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
test_leases_against_model = LeaseMachine.TestCase
