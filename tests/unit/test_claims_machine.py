"""Several holders of each lock against a plain model, driven step by step by hypothesis.

A real manager runs with its public seams: a manual clock, a timer that
fires only when the machine says, and an in-memory lock table as its
renewer. On each job's lock a worker tracks plainly, job actors track with
``notify``, leases come and go; holders untrack (by token, or naming their
target), track a lost lock again, hold past their own ``max_hold``; other
workers steal or delete locks; the manager stops and another takes over.

What it proves, after every step:

- the manager tracks exactly the locks some claim holds, and each tick
  renews exactly those that are due: a lock is renewed while any claim on its
  current token remains, and a claim's deadline ends that claim alone;
- each target (an actor, a lease) is told at most once per lock, and exactly
  once if the lock is lost, let go or the manager stops while it watches;
  tracking a lost lock again tells nobody twice and renews nothing;
- the failure callback reports each lost lock once;
- every lease whose lock ends for a reason other than its own exit has been
  told, so a thread or task blocked in ``wait()`` wakes.

The targets are told on the manager's delivery thread: an asked tick returns
once its own tells were made, but a track's (a lost lock tracked again, a
new token) may come just after its answer, so the machine waits for what the
model expects before it compares. No Redis is involved.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import actors
from actors import ExtendLocks, Lease, LockLost, LostLock, ManagerRef, QueueKeys
from actors.messages import TrackJob, UntrackJob
from actors.timing import Timing
from tests.support import LockTable, ManualClock, ManualTimers, settle

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from actors.messages import BatchOutcome, Reason

JOB_IDS = ["j0", "j1", "j2"]
jobs = st.sampled_from(JOB_IDS)
holds = st.one_of(st.none(), st.integers(1, 150))
#: Most seconds to wait for a tell the model expects: only a lost tell waits that long.
TELL_TIMEOUT = 10.0


class Calls(LockTable):
    """The lock table, noting the ids of every renewal call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[list[str]] = []

    def __call__(self, job_ids: Sequence[str], tokens: Sequence[str]) -> BatchOutcome:
        self.calls.append(list(job_ids))
        return super().__call__(job_ids, tokens)


class Actor:
    """A job actor's reference (a ``notify`` target): keeps what it is told, and by whom."""

    def __init__(self, name: str, manager: Callable[[], int], heard: threading.Condition) -> None:
        self.name = name
        self.manager = manager
        self.heard = heard
        self.told: list[Any] = []
        self.by: list[int] = []

    def tell(self, message: Any) -> None:
        with self.heard:
            self.told.append(message)
            self.by.append(self.manager())
            self.heard.notify_all()

    def __repr__(self) -> str:
        return self.name


class Told(Lease):
    """A lease that keeps what the manager told it, and which manager."""

    def __init__(self, manager: Callable[[], int], heard: threading.Condition, *args: Any) -> None:
        super().__init__(*args)
        self.manager = manager
        self.heard = heard
        self.told: list[Any] = []
        self.by: list[int] = []

    def tell(self, message: Any) -> None:
        # The lease takes it first: what it says is what it was told.
        super().tell(message)
        with self.heard:
            self.told.append(message)
            self.by.append(self.manager())
            self.heard.notify_all()


#: The plain claim's key in the model (a worker's track without a target).
PLAIN = "plain"


@dataclass
class Lock:
    """One job's lock in the model: its token, stamp and claims (key -> deadline)."""

    token: str
    stamp: int = 0
    claims: dict[Any, int | None] = field(default_factory=dict)
    kept: set[int] = field(default_factory=set)

    def targets(self) -> list[Any]:
        return [key for key in self.claims if key is not PLAIN]


@dataclass
class Gone:
    """A lock some of whose claims ended by a loss: why (``None``: it lives on), and who ended."""

    reason: Reason | None
    ended: list[Any]


class ClaimsMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        self.timers = ManualTimers()
        self.table = Calls()
        #: Which manager runs now: a lock tracked again on a new one is news to it.
        self.generation = 0
        #: Notified at each tell, on the manager's delivery thread.
        self.heard = threading.Condition()
        self.actors = [Actor(name, self._generation, self.heard) for name in ("A", "B")]
        self.leases: list[Told] = []
        self.open: list[Told] = []
        self.reports: list[LostLock] = []
        # The model.
        self.locks: dict[str, Lock] = {}
        self.current: dict[str, str] = {}
        self.gone: dict[tuple[str, str], Gone] = {}
        self.expected: dict[int, list[LockLost]] = {}
        self.expected_reports: list[tuple[str, str, str]] = []
        self.tokens = 0

    @initialize(duration=st.integers(20, 400))
    def start(self, duration: int) -> None:
        self.timing = Timing(duration)
        self._start_manager()
        for job_id in JOB_IDS:
            self._take(job_id)

    def _generation(self) -> int:
        return self.generation

    def _start_manager(self) -> None:
        self.manager: ManagerRef = actors.start_link(
            renewer=self.table,
            keys=QueueKeys("claims"),
            lock_duration=self.timing.lock_duration,
            on_lock_renewal_failed=self.reports.extend,
            clock=self.clock,
            timer=self.timers,
        )
        settle(self.manager)

    def teardown(self) -> None:
        if hasattr(self, "manager"):
            actors.stop(self.manager)
            self._stopped()
            self.each_target_is_told_what_the_model_says()
            # Every lease ended: left, or told why, so no waiter is left blind.
            for held in self.open:
                assert held.wait(5.0), held

    # -- the model's steps ---------------------------------------------------

    def _tell(self, target: Any, job_id: str, token: str, reason: Reason) -> None:
        self.expected.setdefault(id(target), []).append(LockLost(job_id, token, reason))

    def _end(self, job_id: str, keys: list[Any], reason: Reason, whole: bool) -> None:
        """Claims ``keys`` of the job's lock end by ``reason``; ``whole``: the lock is let go."""
        lock = self.locks[job_id]
        for key in keys:
            if key is not PLAIN:
                self._tell(key, job_id, lock.token, reason)
            del lock.claims[key]
        gone = self.gone.setdefault((job_id, lock.token), Gone(None, []))
        gone.ended.extend(keys)
        if whole:
            gone.reason = reason
            self.expected_reports.append((job_id, lock.token, reason))
        if not lock.claims:
            del self.locks[job_id]

    def _track(self, job_id: str, key: Any, max_hold: int | None, *, kept: bool = False) -> None:
        token = self.current[job_id]
        gone = self.gone.get((job_id, token))
        if gone is not None and gone.reason is not None:
            # Lost: not tracked again; a target not told yet is told now, once.
            if key is not PLAIN and not any(k is key for k in gone.ended):
                self._tell(key, job_id, token, gone.reason)
                gone.ended.append(key)
            return
        if gone is not None and any(k is key for k in gone.ended):
            return  # this claim ended at its deadline: it does not begin again
        now = self.clock.now
        deadline = None if max_hold is None else now + max_hold
        lock = self.locks.get(job_id)
        if lock is None:
            lock = self.locks[job_id] = Lock(token, now)
        if key in lock.claims:
            if lock.claims[key] is None:
                lock.claims[key] = deadline
        else:
            lock.claims[key] = deadline
            if kept:
                lock.kept.add(id(key))

    def _take(self, job_id: str) -> None:
        self.tokens += 1
        token = f"token-{self.tokens}"
        self.table.held[job_id] = token
        self.current[job_id] = token

    def _stopped(self) -> None:
        for job_id in list(self.locks):
            lock = self.locks[job_id]
            for key in lock.targets():
                self._tell(key, job_id, lock.token, "manager_stopped")
        self.locks.clear()
        self.gone.clear()

    # -- rules -----------------------------------------------------------------

    @precondition(lambda self: any(job_id not in self.locks for job_id in JOB_IDS))
    @rule(data=st.data())
    def a_new_run_takes_a_free_job(self, data: st.DataObject) -> None:
        self._take(data.draw(st.sampled_from([j for j in JOB_IDS if j not in self.locks])))

    @rule(job_id=jobs, holder=st.sampled_from([PLAIN, 0, 1]), max_hold=holds)
    def track(self, job_id: str, holder: str | int, max_hold: int | None) -> None:
        """The worker tracks plainly, or an actor with ``notify``; again, maybe."""
        notify = None if holder == PLAIN else self.actors[int(holder)]
        self.manager.ask(TrackJob(job_id, self.current[job_id], None, notify, max_hold))
        self._track(job_id, PLAIN if notify is None else notify, max_hold)

    @rule(job_id=jobs, max_hold=holds)
    def enter_a_lease(self, job_id: str, max_hold: int | None) -> None:
        held = Told(
            self._generation, self.heard, self.manager, job_id, self.current[job_id], max_hold
        )
        held.__enter__()
        settle(self.manager)
        self.leases.append(held)
        self.open.append(held)
        self._track(job_id, held, max_hold, kept=True)

    @precondition(lambda self: self.open)
    @rule(data=st.data())
    def leave_a_lease(self, data: st.DataObject) -> None:
        held = data.draw(st.sampled_from(self.open))
        held.__exit__(None, None, None)
        self.open.remove(held)
        lock = self.locks.get(held.job_id)
        if lock is not None and lock.token == held.token and held in lock.claims:
            del lock.claims[held]
            if not lock.claims:
                del self.locks[held.job_id]

    @rule(job_id=jobs, by_token=st.booleans())
    def untrack_without_a_target(self, job_id: str, by_token: bool) -> None:
        """Ends every claim but the leases'."""
        token = self.current[job_id] if by_token else None
        self.manager.ask(UntrackJob(job_id, token))
        lock = self.locks.get(job_id)
        if lock is None:
            return
        for key in [k for k in lock.claims if id(k) not in lock.kept]:
            del lock.claims[key]
        if not lock.claims:
            del self.locks[job_id]

    @rule(job_id=jobs, actor=st.sampled_from([0, 1]))
    def an_actor_untracks_its_own_claim(self, job_id: str, actor: int) -> None:
        target = self.actors[actor]
        self.manager.ask(UntrackJob(job_id, self.current[job_id], target))
        lock = self.locks.get(job_id)
        if lock is not None and target in lock.claims:
            del lock.claims[target]
            if not lock.claims:
                del self.locks[job_id]

    @rule(job_id=jobs, steal=st.booleans())
    def the_lock_is_lost_behind_the_jobs_back(self, job_id: str, steal: bool) -> None:
        if steal:
            self.tokens += 1
            self.table.held[job_id] = f"thief-{self.tokens}"
        else:
            self.table.held.pop(job_id, None)

    @rule(data=st.data())
    def time_passes(self, data: st.DataObject) -> None:
        deadline = self.timers.deadline
        if deadline > self.clock.now:
            self.clock.advance(data.draw(st.integers(0, deadline - self.clock.now)))

    @rule(late=st.integers(0, 3))
    def the_timer_fires(self, late: int) -> None:
        scheduled = self.timers.deadline
        self.clock.now = max(self.clock.now, scheduled + late)
        self._tick(scheduled, ExtendLocks(scheduled))

    @rule()
    def renew_now(self) -> None:
        self._tick(self.clock.now, ExtendLocks())

    @rule()
    def the_manager_stops_and_another_takes_over(self) -> None:
        actors.stop(self.manager)
        self._stopped()
        self.generation += 1
        self._start_manager()

    def _tick(self, at: int, message: ExtendLocks) -> None:
        now = self.clock.now
        calls = len(self.table.calls)
        self.manager.ask(message)
        for job_id in list(self.locks):
            lock = self.locks[job_id]
            ended = [k for k, d in lock.claims.items() if d is not None and d <= now]
            if ended:
                self._end(job_id, ended, "max_hold", whole=len(ended) == len(lock.claims))
        threshold = self.timing.threshold
        due = [
            job_id
            for job_id, lock in self.locks.items()
            if (lock.stamp < at if lock.targets() else lock.stamp + threshold < at)
        ]
        sent = self.table.calls[calls:]
        assert sorted(sent[0] if sent else []) == sorted(due), (sent, due)
        for job_id in due:
            lock = self.locks[job_id]
            value = self.table.held.get(job_id)
            if value == lock.token:
                lock.stamp = at
            else:
                reason: Reason = "expired" if value is None else "stolen"
                self._end(job_id, list(lock.claims), reason, whole=True)

    # -- invariants --------------------------------------------------------------

    @invariant()
    def the_manager_tracks_exactly_the_claimed_locks(self) -> None:
        assert sorted(actors.get_tracked_job_ids(self.manager)) == sorted(self.locks)

    @invariant()
    def each_target_is_told_what_the_model_says(self) -> None:
        targets: list[Actor | Told] = [*self.actors, *self.leases]

        def heard_all() -> bool:
            return all(
                sum(isinstance(m, LockLost) for m in target.told)
                >= len(self.expected.get(id(target), []))
                for target in targets
            )

        with self.heard:
            self.heard.wait_for(heard_all, TELL_TIMEOUT)
            for target in targets:
                told = [m for m in target.told if isinstance(m, LockLost)]
                expected = self.expected.get(id(target), [])
                assert sorted(map(repr, told)) == sorted(map(repr, expected)), (target, told)
                # At most once per lock by each manager.
                by = [
                    g
                    for m, g in zip(target.told, target.by, strict=True)
                    if isinstance(m, LockLost)
                ]
                once = Counter((m.job_id, m.token, g) for m, g in zip(told, by, strict=True))
                assert max(once.values(), default=0) <= 1, told

    @invariant()
    def each_lost_lock_is_reported_once(self) -> None:
        reported = [(item.job_id, item.token, item.reason) for item in self.reports]
        assert sorted(reported) == sorted(self.expected_reports)

    @invariant()
    def each_open_lease_says_what_it_was_told(self) -> None:
        for held in self.open:
            told = [m for m in held.told if isinstance(m, LockLost)]
            if told:
                assert held.reason == told[0].reason
            elif held._manager is self.manager:
                assert not held.lost


ClaimsMachine.TestCase.settings = settings(max_examples=120, stateful_step_count=30, deadline=None)
test_claims_against_model = ClaimsMachine.TestCase
