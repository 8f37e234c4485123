"""Leases against a plain model, driven step by step by hypothesis.

A real manager runs with its public seams: a fake clock (``clock=``), a timer
that fires only when the machine's ``timer_fires`` rule says so
(``timer=ManualTimers()``), and an in-memory lock table as its renewer. Jobs
open and leave leases; other workers steal or delete their locks; time
passes; ticks run on the grid (late by a random amount) or as a "renew now";
a renewal call fails now and then, and is tried again soon; the manager may
stop and be replaced. The model says, for each lease, whether and why its
lock is lost after every step:

- ``max_hold``: at the first tick whose clock is at or past the deadline;
- ``stolen`` / ``expired``: at the first tick that renews the job (a leased
  job is due at every tick: ``stamp < tick time``) and finds another token or
  no key;
- ``manager_stopped``: when the manager stops with the job tracked (a new
  manager then takes over), or at once for a lease entered on a stopped one;
- ``unconfirmed``: as soon as the clock reaches the lock's deadline (the last
  confirmed renewal's send, or the taking, plus ``lock_duration`` minus the
  safety margin) with no newer confirmation, seen by the lease itself at its
  first look; the manager tells it at its next tick or at the timer's fire
  for that deadline, and at the answer of a renewal that came too late (the
  renewer may pause the clock during a call, as a paused process or a slow
  round trip would).

What it proves: every lease says exactly what the model says after every
step (never early, never late, never a wrong reason); a lease never says
``unconfirmed`` before its deadline and always says it at its deadline; the
manager tells each lease at most once, and only about its own lock; a lease
left with its lock held never changes again; the manager tracks exactly the
held leases; the timer is armed for the first of the grid, the retry of a
failed renewal and the earliest deadline, never again for a time it just
fired for. No Redis is involved.
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
from actors.messages import EXPIRED, STOLEN, BatchOutcome, Reason
from actors.timing import Timing, default_safety_margin, next_tick
from tests.support import ManualClock, ManualTimers

JOB_IDS = [f"job-{i}" for i in range(5)]
ids = st.sampled_from(JOB_IDS)
holds = st.one_of(st.none(), st.integers(1, 1500))

#: The first pause before a failed renewal is tried again, in ms (it doubles
#: with each failure in a row, up to a quarter of the interval).
FIRST_RETRY_MS = 10


class Table:
    """The server's lock keys, in memory; its next call may fail as a dropped connection would."""

    def __init__(self) -> None:
        self.held: dict[str, str] = {}
        self.fail_next = False
        #: The ids of every call, in order.
        self.calls: list[list[str]] = []
        #: Ms the next call takes on the clock (a pause of the process or the server).
        self.pause_next = 0
        self.clock: ManualClock | None = None

    def __call__(self, job_ids: Sequence[str], tokens: Sequence[str]) -> BatchOutcome:
        self.calls.append(list(job_ids))
        if self.pause_next and self.clock is not None:
            self.clock.advance(self.pause_next)
            self.pause_next = 0
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
    #: What the lease says.
    reason: Reason | None = None
    #: Whether its lock was renewed at least once.
    renewed: bool = False
    #: What the manager told the lease, if it did.
    told: Reason | None = None
    #: Whether the current manager renews the lock for the lease.
    tracked: bool = True
    open: bool = True

    def tell(self, reason: Reason) -> None:
        """The manager lets the lock go and tells the lease (its first word stands)."""
        self.told = reason
        self.reason = self.reason or reason
        self.tracked = False


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
        #: How long a lock is trusted after a confirmed send.
        self.span = duration - default_safety_margin(self.timing)
        self.table.clock = self.clock
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
        #: The manager's next grid tick, the retry of a failed renewal, and
        #: how many renewals failed in a row.
        self.grid = self.clock.now + self.timing.interval
        self.retry: int | None = None
        self.failures = 0

    def teardown(self) -> None:
        if hasattr(self, "manager"):
            actors.stop(self.manager)

    def _open(self) -> dict[str, Model]:
        return {m.lease.job_id: m for m in self.leases if m.open}

    def _held(self) -> list[Model]:
        """Leases the manager should be renewing."""
        return [m for m in self.leases if m.open and m.tracked]

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
        model.reason, model.tracked = "manager_stopped", False

    def _done(self) -> list[Model]:
        """Open leases whose job has run a while: its lock was renewed, or lost."""
        return [m for m in self.leases if m.open and (m.reason is not None or m.renewed)]

    @precondition(lambda self: self._done())
    @rule(data=st.data())
    def leave(self, data: st.DataObject) -> None:
        """A job that has run a while finishes and leaves its lease."""
        model = data.draw(st.sampled_from(self._done()))
        model.lease.__exit__(None, None, None)
        model.open = model.tracked = False
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

    @rule(pause=st.integers(1, 600))
    def the_next_call_pauses(self, pause: int) -> None:
        """The next renewal's answer comes ``pause`` ms after it was sent."""
        self.table.pause_next = pause

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
        self._tick(self.clock.now, ExtendLocks(), "now")

    @rule(late=st.lists(st.one_of(st.integers(0, 3), st.floats(0, 2.5)), min_size=1, max_size=6))
    def timer_fires(self, late: list[float]) -> None:
        """The timer fires a few times in a row, each late by a few ms or by intervals."""
        for each in late:
            scheduled = self.timers.deadline
            lateness = int(each) if isinstance(each, int) else int(each * self.timing.interval)
            self.clock.now = max(self.clock.now, scheduled + lateness)
            if scheduled == self.grid:
                # The grid's tick, at the retry's time too, does the retry's work.
                if self.retry == scheduled:
                    self.retry = None
                self._tick(scheduled, ExtendLocks(scheduled), "grid")
            elif scheduled == self.retry:
                self.retry = None
                self._tick(self.clock.now, ExtendLocks(scheduled), "retry")
            else:
                self._tick(self.clock.now, ExtendLocks(scheduled), "deadline")
            assert self.timers.deadline > scheduled, "armed again for a fired time"
            self.each_lease_says_what_the_model_says()

    @rule()
    def renew_now(self) -> None:
        self._tick(self.clock.now, ExtendLocks(), "now")

    @precondition(lambda self: len(self.table.calls) >= 3)
    @rule()
    def manager_restarts(self) -> None:
        """The manager stops (its held leases are told) and a new one takes over."""
        actors.stop(self.manager)
        self.stopped.append(self.manager)
        for model in self._held():
            model.tell("manager_stopped")
        self._start_manager()
        self.retry, self.failures = None, 0

    def _unconfirmed(self, now: int) -> None:
        """The manager lets go of every held lock whose deadline is at or before ``now``."""
        for model in self._held():
            if model.stamp + self.span <= now:
                model.tell("unconfirmed")

    def _answered(self, answered: int, *, failed: bool) -> None:
        """A renewal answered: one that failed is tried again soon, one that worked ends that."""
        if failed:
            self.failures += 1
            wait = FIRST_RETRY_MS << min(self.failures - 1, 16)
            self.retry = answered + max(1, min(self.timing.interval // 4, wait))
        else:
            self.failures, self.retry = 0, None

    def _tick(self, at: int, message: ExtendLocks, kind: str) -> None:
        """Run the tick of ``message``, which selects and stamps at ``at``; follow it in the model.

        ``kind``: what the tick is for, ``"grid"``, ``"retry"``, ``"deadline"``
        (the timer's fire for a watched lock's deadline) or ``"now"``.
        """
        now = self.clock.now
        fails = self.table.fail_next
        pause = self.table.pause_next
        calls = len(self.table.calls)
        self.manager.ask(message)
        if kind == "deadline":
            # The timer's fire for a watched deadline: it renews nothing.
            assert self.table.calls[calls:] == []
            self._unconfirmed(now)
            return
        if kind == "grid":
            # The next grid time, from the clock as the tick began.
            self.grid = next_tick(at, self.timing.interval, now)
        for model in self._held():
            if model.deadline is not None and model.deadline <= now:
                model.tell("max_hold")
        self._unconfirmed(now)
        due = [model for model in self._held() if model.stamp < at]
        # The tick checked exactly the due leases' locks, in one call.
        sent = self.table.calls[calls:]
        assert len(sent) == (1 if due else 0), (sent, due)
        assert sorted(sent[0] if sent else []) == sorted(m.lease.job_id for m in due)
        answered = now + (pause if due else 0)
        if due:
            assert self.clock.now == answered
            self._answered(answered, failed=fails)
        if not fails:
            for model in due:
                value = self.table.held.get(model.lease.job_id)
                if value != model.token:
                    model.tell(EXPIRED if value is None else STOLEN)
        # A deadline that passed while the call was out: lost, even if the
        # call renewed the lock (nobody had confirmed it in time).
        self._unconfirmed(answered)
        if not fails:
            for model in due:
                if model.tracked:
                    model.stamp = at
                    model.renewed = True

    # -- invariants ----------------------------------------------------------

    @invariant()
    def each_lease_says_what_the_model_says(self) -> None:
        now = self.clock.now
        for model in self.leases:
            held = model.lease
            if model.open and model.reason is None and model.stamp + self.span <= now:
                # The lease reads its deadline itself, before any tick.
                model.reason = "unconfirmed"
            assert held.reason == model.reason, (held, model, now)
            assert held.lost == (model.reason is not None)
            assert held.wait(0) == (model.reason is not None)

    @invariant()
    def never_unconfirmed_before_the_deadline_never_held_past_it(self) -> None:
        now = self.clock.now
        for model in self.leases:
            held, deadline = model.lease, model.lease.deadline
            if not model.open or deadline is None:
                continue
            assert deadline == model.stamp + self.span, (held, model)
            if held.reason == "unconfirmed":
                assert deadline <= now
            if held.reason is None:
                assert now < deadline

    @invariant()
    def the_manager_tells_each_lease_at_most_once_and_only_its_own_loss(self) -> None:
        for model in self.leases:
            if model.told is not None:
                expected = [LockLost(model.lease.job_id, model.token, model.told)]
                assert model.lease.told == expected, model
            else:
                assert model.lease.told == [], model

    @invariant()
    def the_timer_waits_for_the_grid_the_retry_or_an_earlier_deadline(self) -> None:
        retry = [] if self.retry is None else [self.retry]
        deadlines = [m.stamp + self.span for m in self._held()]
        assert self.timers.deadline == min([self.grid, *retry, *deadlines]), (
            self.grid,
            self.retry,
            deadlines,
        )

    @invariant()
    def the_manager_tracks_exactly_the_held_leases(self) -> None:
        tracked = actors.get_tracked_job_ids(self.manager)
        assert sorted(tracked) == sorted(m.lease.job_id for m in self._held())


LeaseMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
test_leases_against_model = LeaseMachine.TestCase
