"""The manager against a plain model, driven step by step by hypothesis.

The actor runs for real; its clock, its renewer and its timer are the public
seams (``clock=``, ``renewer=``, ``timer=ManualTimer``): a fake clock, an
in-memory lock table, and a timer that fires only when the machine's
``timer_fires`` rule says, late by a random amount, with ``ask`` so every step
finishes before the next. No Redis is involved.

What it proves, beyond "the tracked ids agree with the model":
- each tick sends exactly the jobs the model says are due, selected at the
  tick's grid time, so lateness never makes a job due a tick early: a job
  renewed on one grid tick is never renewed on the next;
- no lock is treated as younger than it is: a renewal's stamp is never later
  than the moment the renewal was sent;
- the worst gap between two renewal attempts of a job is ``lock_renew_time``
  plus the lateness of the ticks since its last attempt;
- a lost job is reported exactly once, with its token and reason;
- a failed renewal is tried again soon (10 ms after its answer, twice as
  long for each failure in a row, at most a quarter of the interval), and a
  renewal that works ends the retries;
- the timer is armed for the next grid time or the retry, whichever comes
  first, never again for a time it just fired for, and a user's "renew now"
  never moves the grid.
"""

from __future__ import annotations

from collections import Counter

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

from actors import LostLock, ManagerRef, ManualTimer, QueueKeys, start_link
from actors.messages import EXPIRED, STOLEN, ExtendLocks, GetTrackedJobIds, TrackJob, UntrackJob
from actors.timing import Timing, next_tick
from tests.support import LockTable, ManualClock

ids = st.sampled_from([f"job-{i}" for i in range(8)])

#: The first pause before a failed renewal is tried again, in ms (it doubles
#: with each failure in a row, up to a quarter of the interval).
FIRST_RETRY_MS = 10


class ManagerMachine(RuleBasedStateMachine):
    tracked_ids = Bundle("tracked_ids")

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        self.locks = LockTable(clock=self.clock)
        self.timer = ManualTimer()
        self.ref: ManagerRef | None = None
        # The model: what the manager should track, each job's token, and
        # the stamp the manager should hold for it ...
        self.tokens: dict[str, str] = {}
        self.stamps: dict[str, int] = {}
        # ... per job, the (fake) time of its last renewal attempt, and the
        # grid time of its last renewal by the timer.
        self.last_attempt: dict[str, int] = {}
        self.late_since: dict[str, int] = {}
        self.expected: dict[tuple[str, str], str] = {}
        self.last_grid_renewal: dict[str, int] = {}
        self.reported: Counter[str] = Counter()
        self.reports: list[LostLock] = []
        self.token_counter = 0
        # ... and when the timer should fire: the next grid time, the retry
        # after a failed renewal (if any), and the failures in a row.
        self.grid = 0
        self.retry: int | None = None
        self.failures = 0

    @initialize(
        duration=st.integers(8, 400),
        renew_fraction=st.one_of(st.none(), st.floats(0.1, 0.95)),
    )
    def start(self, duration: int, renew_fraction: float | None) -> None:
        renew = None if renew_fraction is None else max(2, int(duration * renew_fraction))
        self.timing = Timing(duration, renew)
        self.ref = start_link(
            keys=QueueKeys("q"),
            lock_duration=duration,
            lock_renew_time=renew,
            on_lock_renewal_failed=self._on_failed,
            renewer=self.locks,
            clock=self.clock,
            timer=lambda fire, name: self.timer,
        )
        # Armed by the time start_link returns: one interval from now.
        assert self.timer.deadline == self.clock.now + self.timing.interval
        self.grid = self.timer.deadline

    def _on_failed(self, lost: list[LostLock]) -> None:
        self.reports.extend(lost)
        self.reported.update(str(item) for item in lost)

    def teardown(self) -> None:
        if self.ref is not None:
            self.ref.stop()
            assert self.timer.closed

    # -- rules -----------------------------------------------------------

    @rule(target=tracked_ids, job_id=ids, taken=st.floats(0, 1))
    def track(self, job_id: str, taken: float) -> str:
        """A worker took the lock up to one interval ago and tracks it now."""
        assert self.ref is not None
        self.token_counter += 1
        token = f"token-{self.token_counter}"
        ts = self.clock.now - int(taken * self.timing.interval)
        self.locks.held[job_id] = token
        self.ref.tell(TrackJob(job_id, token, ts=ts))
        self.tokens[job_id] = token
        self.stamps[job_id] = self.last_attempt[job_id] = ts
        self.late_since[job_id] = 0
        self.last_grid_renewal.pop(job_id, None)
        self.reported.pop(job_id, None)
        return job_id

    @rule(job_id=ids)
    def track_again_with_the_same_token(self, job_id: str) -> None:
        # A progress hook: must never restart the job's clock.
        assert self.ref is not None
        if job_id in self.tokens:
            self.ref.tell(TrackJob(job_id, self.tokens[job_id], ts=self.clock.now))

    @rule(job_id=consumes(tracked_ids))
    def untrack(self, job_id: str) -> None:
        assert self.ref is not None
        self.ref.tell(UntrackJob(job_id))
        self.tokens.pop(job_id, None)
        self.locks.held.pop(job_id, None)

    @rule(job_id=ids, steal=st.booleans())
    def lose_lock(self, job_id: str, steal: bool) -> None:
        # Another worker took the job, or the lock expired behind our back.
        if steal:
            self.locks.held[job_id] = "someone-else"
        else:
            self.locks.held.pop(job_id, None)

    @rule()
    def backend_raises_next(self) -> None:
        self.locks.raise_next = True

    @rule()
    def backend_refuses_a_chunk_next(self) -> None:
        self.locks.refuse_half_next = True

    @rule(data=st.data())
    def time_passes_before_the_next_tick(self, data: st.DataObject) -> None:
        assert self.timer.deadline is not None
        room = self.timer.deadline - self.clock.now
        if room > 0:
            self.clock.now += data.draw(st.integers(0, room))

    @rule(late=st.one_of(st.integers(0, 3), st.floats(0, 0.99), st.floats(1, 2.5)))
    def timer_fires(self, late: float) -> None:
        """The timer fires, late by a few ms, by part of an interval, or by more."""
        assert self.ref is not None and self.timer.deadline is not None
        scheduled = self.timer.deadline
        lateness = int(late) if isinstance(late, int) else int(late * self.timing.interval)
        self.clock.now = max(self.clock.now, scheduled + lateness)
        if scheduled == self.grid:
            # The grid's tick selects and stamps at its grid time; at the
            # retry's time too, it does the retry's work.
            if self.retry == scheduled:
                self.retry = None
            self._tick(scheduled, ExtendLocks(scheduled), on_grid=True)
            # The next grid time, or the latest one already missed: never a burst.
            self.grid = next_tick(scheduled, self.timing.interval, self.clock.now)
            assert self.clock.now - self.timing.interval < self.grid
        else:
            # The retry of a failed renewal: a renew now, at the time it runs.
            assert scheduled == self.retry, (scheduled, self.grid, self.retry)
            self.retry = None
            self._tick(self.clock.now, ExtendLocks(scheduled), late=self.clock.now - scheduled)
        following = self.timer.deadline
        assert following is not None and following > scheduled, "armed again for a fired time"

    @rule()
    def renew_now(self) -> None:
        """A user's manual tick: renews what is due now, leaves the grid alone."""
        self._tick(self.clock.now, ExtendLocks())

    def _tick(
        self, at: int, message: ExtendLocks, *, on_grid: bool = False, late: int | None = None
    ) -> None:
        """Run the tick of ``message``, which selects and stamps at ``at``; check it.

        ``late``: how late the timer's fire ran (``now - at`` when ``None``).
        """
        assert self.ref is not None
        now = self.clock.now
        late = now - at if late is None else late
        threshold = self.timing.threshold
        due = [j for j in self.tokens if self.stamps[j] + threshold < at]
        calls_before = len(self.locks.sent)
        raises, refuses = self.locks.raise_next, self.locks.refuse_half_next

        self.ref.ask(message)

        # A late tick delays the jobs it renews, and, when it overran whole
        # intervals, the catch-up tick after it: the lateness adds up.
        for job_id in self.tokens:
            self.late_since[job_id] = self.late_since.get(job_id, 0) + late
        calls = self.locks.sent[calls_before:]
        assert len(calls) == (1 if due else 0)
        if not due:
            return
        sent = calls[0][1]
        # A renewal that failed, in whole or in part, is tried again soon; one
        # that worked ends the retries.
        if raises or refuses:
            self.failures += 1
            pause = FIRST_RETRY_MS << min(self.failures - 1, 16)
            self.retry = now + max(1, min(self.timing.interval // 4, pause))
        else:
            self.failures, self.retry = 0, None
        # Exactly the due jobs, in one call: none before its threshold.
        assert sorted(sent) == sorted(due)
        for job_id in sent:
            # The worst gap between two attempts: renew_time, plus how late
            # the ticks since ran (a failed attempt is retried on the next tick).
            waited = now - self.last_attempt[job_id]
            assert waited <= self.timing.renew_time + self.late_since[job_id], (job_id, waited)
            self.last_attempt[job_id] = now
            self.late_since[job_id] = 0
            if on_grid:
                # At the minimum: never on two grid ticks in a row.
                previous = self.last_grid_renewal.get(job_id)
                assert previous is None or at - previous > self.timing.interval
        if raises:
            return  # nothing is known to have run: every job keeps its stamp
        ran = sent[: len(sent) // 2] if refuses else sent
        for job_id in ran:
            if self.locks.held.get(job_id) == self.tokens[job_id]:
                # Never younger than it is: stamped no later than it was sent.
                assert at <= now
                self.stamps[job_id] = at
                if on_grid:
                    self.last_grid_renewal[job_id] = at
            else:
                held = self.locks.held.get(job_id)
                self.expected[job_id, self.tokens.pop(job_id)] = EXPIRED if held is None else STOLEN

    # -- invariants ------------------------------------------------------

    @invariant()
    def the_timer_waits_for_the_grid_or_the_retry(self) -> None:
        retry = self.grid if self.retry is None else self.retry
        assert self.timer.deadline == min(self.grid, retry), (self.grid, self.retry)

    @invariant()
    def tracked_ids_agree(self) -> None:
        if self.ref is not None:
            tracked: list[str] = self.ref.ask(GetTrackedJobIds())
            assert sorted(tracked) == sorted(self.tokens)

    @invariant()
    def a_lost_job_is_reported_exactly_once_with_its_token_and_reason(self) -> None:
        assert all(count == 1 for count in self.reported.values()), self.reported
        assert not set(self.reported) & set(self.tokens)
        assert {(item.job_id, item.token): item.reason for item in self.reports} == self.expected


ManagerMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_manager_against_model = ManagerMachine.TestCase
