"""The demo's supervision tree: :mod:`examples.supervisor_tree`, with what a display needs.

The same one-for-one tree, plus what the live view reads: each child's state
and work done, the events of every actor (acquired, waiting, crashed,
restarted, finished, abandoned), a cap on restarts, and a crash injected on
request (:class:`Crash`, raising :class:`ProvokedCrash`).
"""

from __future__ import annotations

import collections
import contextlib
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pykka

import actors

if TYPE_CHECKING:
    import redis

#: Lock TTL, in milliseconds: short, so the example ends in seconds.
LOCK_MS = 1500
#: Most events the supervisor keeps: a tree that runs for days keeps the latest.
MAX_EVENTS = 500
#: Restarts of one job's actor before the supervisor gives the job up.
MAX_RESTARTS = 3
#: How a job actor ends, short of a crash.
FINAL = ("finished", "abandoned", "gave up")

# Delete the lock only while it holds our token: after a loss it is someone else's.
RELEASE = """
if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) end
return 0
"""


@dataclass(frozen=True)
class Setup:
    """What every job actor needs; durations in milliseconds."""

    manager: actors.ManagerRef
    client: redis.Redis
    keys: actors.QueueKeys
    lock_ms: int
    #: How long a job works in all, and one step of it (a loss is noted between steps).
    work_ms: int
    step_ms: int


@dataclass(frozen=True, slots=True)
class Report:
    """Job actor to supervisor: what happened to the job. The supervisor's events too."""

    at: float  #: When, on ``time.monotonic()``.
    job_id: str
    generation: int  #: Which actor of the job: 0, then one more per restart.
    kind: str  #: acquired, waiting, crashed, restarted, or one of :data:`FINAL`.
    token: str = ""
    detail: str = ""
    done_ms: int = 0  #: Work the actor had done when it reported, in milliseconds.


@dataclass(frozen=True, slots=True)
class Child:
    """The supervisor's record of one job: its actor, which one it is, its last report."""

    ref: pykka.ActorRef[Any] | None
    generation: int = 0
    state: str = "starting"
    token: str = ""
    done_ms: int = 0  #: Work done by the time of the last report, in milliseconds.


@dataclass(frozen=True, slots=True)
class Crash:
    """Raise in the job actor, as a bug in the job would (fault injection)."""


class ProvokedCrash(RuntimeError):
    """The fault :class:`Crash` injects: pykka logs it with its traceback, as any crash."""


@dataclass(frozen=True, slots=True)
class _Next:
    """Job actor to itself: take the lock, or do one more step of work."""


class JobActor(pykka.ThreadingActor):
    """Holds one job's lock while it works, and releases it at the end."""

    use_daemon_thread = True

    def __init__(self, boss: pykka.ActorRef[Any], setup: Setup, job_id: str, gen: int) -> None:
        super().__init__()
        self._boss, self._setup, self._job_id, self._gen = boss, setup, job_id, gen
        self._token, self._done_ms, self._end = "", 0, ("stopped", "")
        self._lost: actors.LockLost | None = None
        # A crashed actor's lock runs out within one TTL; wait for it twice that.
        self._give_up_at = time.monotonic() + 2 * setup.lock_ms / 1000

    def on_start(self) -> None:
        """Begin by taking the lock."""
        self.actor_ref.tell(_Next())

    def on_receive(self, message: Any) -> None:
        """Note a lost lock, crash on request, or go on with the job."""
        if isinstance(message, actors.LockLost):
            # The token names the lock the report is about: only ours counts.
            if message.token == self._token:
                self._lost = message
        elif isinstance(message, Crash):
            raise ProvokedCrash(f"provoked on purpose: {self._job_id}'s actor crashes")
        elif isinstance(message, _Next):
            self._next()

    def _next(self) -> None:
        step_ms = self._setup.step_ms
        if self._lost is not None:
            self._finish("abandoned", f"lock {self._lost.reason}")
        elif not self._token:
            self._take()
        elif self._done_ms < self._setup.work_ms:
            time.sleep(step_ms / 1000)  # one step of the job's real work
            self._done_ms += step_ms
            self.actor_ref.tell(_Next())
        else:
            self._finish("finished")

    def _take(self) -> None:
        setup, token = self._setup, str(uuid.uuid4())
        if setup.client.set(setup.keys.lock(self._job_id), token, nx=True, px=setup.lock_ms):
            self._token = token
            actors.track_job(setup.manager, self._job_id, token, notify=self.actor_ref)
            self._report("acquired")
        elif time.monotonic() < self._give_up_at:
            self._report("waiting", "the lock is still taken")
            time.sleep(setup.step_ms / 1000)
        else:
            self._finish("gave up", "the lock stayed taken")
            return
        self.actor_ref.tell(_Next())

    def _finish(self, kind: str, detail: str = "") -> None:
        self._end = (kind, detail)
        self.stop()

    def on_stop(self) -> None:
        """Untrack the job, release its lock if still ours, report how the job ended."""
        kind, detail = self._end
        if self._token:
            # Untrack first: a tick already queued would find the lock gone and report it lost.
            actors.untrack_job(self._setup.manager, self._job_id, wait=True)
            lock = self._setup.keys.lock(self._job_id)
            ours = self._setup.client.eval(RELEASE, 1, lock, self._token)
            release = "lock released" if ours else "lock left to its new holder"
            detail = f"{detail}; {release}" if detail else release
        self._report(kind, detail)

    def on_failure(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        """Tell the supervisor; cleaning up is its business now."""
        self._report("crashed", repr(exc))

    def _report(self, kind: str, detail: str = "") -> None:
        report = Report(
            time.monotonic(), self._job_id, self._gen, kind, self._token, detail, self._done_ms
        )
        # A stopped supervisor is shutting the tree down: nobody is left to tell.
        with contextlib.suppress(pykka.ActorDeadError):
            self._boss.tell(report)


class Supervisor(pykka.ThreadingActor):
    """Starts one job actor per job and restarts the one that crashes (one-for-one).

    Args:
        job_ids: The jobs, one actor each.
        setup: What every job actor needs.
    """

    use_daemon_thread = True

    def __init__(self, job_ids: list[str], setup: Setup) -> None:
        super().__init__()
        self._setup = setup
        self.children = {job_id: Child(None) for job_id in job_ids}
        self.events: collections.deque[Report] = collections.deque(maxlen=MAX_EVENTS)

    def on_start(self) -> None:
        """Start every job's actor."""
        for job_id in self.children:
            self._start(job_id, 0)

    def on_stop(self) -> None:
        """Stop the job actors still running."""
        for child in self.children.values():
            if child.ref is not None:
                child.ref.stop()

    def on_receive(self, message: Any) -> None:
        """Handle a job actor's report."""
        if not isinstance(message, Report):
            return
        child = self.children[message.job_id]
        # A late report from an earlier, crashed actor of the job is not about this one.
        if message.generation != child.generation:
            return
        if message.kind != child.state:
            self.events.append(message)
        if message.kind != "crashed":
            ref = None if message.kind in FINAL else child.ref
            self.children[message.job_id] = Child(
                ref, child.generation, message.kind, message.token, message.done_ms
            )
            return
        # The crashed actor cannot clean up: stop renewing its lock, which then runs out.
        actors.untrack_job(self._setup.manager, message.job_id)
        if child.generation < MAX_RESTARTS:
            self._start(message.job_id, child.generation + 1)
        else:
            self.children[message.job_id] = Child(None, child.generation, "gave up")

    def _start(self, job_id: str, gen: int) -> None:
        self.children[job_id] = Child(JobActor.start(self.actor_ref, self._setup, job_id, gen), gen)
        if gen:
            self.events.append(Report(time.monotonic(), job_id, gen, "restarted"))

    def crash(self, job_id: str) -> None:
        """Crash the actor working on ``job_id`` (fault injection; call through a proxy)."""
        ref = self.children[job_id].ref
        if ref is not None:
            ref.tell(Crash())

    def status(self) -> tuple[dict[str, Child], list[Report]]:
        """Return each job's record and the recent events (call through a proxy)."""
        return dict(self.children), list(self.events)
