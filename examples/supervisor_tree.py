"""A one-for-one supervisor over a LockManager and a pool of job actors.

pykka has no supervisors, so this example builds a small one on two pykka
hooks: a job actor's ``on_failure`` tells the supervisor it crashed, its
``on_stop`` tells it that it ended normally. The tree looks like this::

    Supervisor
    ├── LockManager          renews every lock the job actors hold
    ├── JobActor job-1       takes a lock, works, releases it
    ├── JobActor job-2
    └── ...

Each job actor takes its job as a queue's move-to-active would (``SET NX PX``
with a fresh UUID token), tells the manager to track it, works in steps for
longer than the lock's TTL, then releases the lock only if it still holds it
and tells the manager to untrack it.

The supervisor handles two failures:

- a job actor crashes: the supervisor untracks its job (the lock then expires,
  as a real queue needs before another worker may take the job) and starts a
  fresh actor for the same job, which takes the lock again once it is free;
- the manager reports a lost lock (someone else holds the job now): the
  supervisor tells that job's actor to abandon the work, which the actor
  checks between two steps.

Run it with ``python examples/supervisor_tree.py``; it uses ``REDIS_URL`` or
starts a private server.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pykka
import redis

import actors
from actors import LockManager, QueueKeys, Stats, UntrackJob
from actors.embedded import server_url

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from types import TracebackType

__all__ = [
    "Abandon",
    "Crash",
    "CrashJob",
    "Event",
    "JobActor",
    "JobView",
    "Note",
    "Result",
    "Snapshot",
    "Supervisor",
    "main",
    "release_lock",
    "run",
    "steal_lock",
]

logger = logging.getLogger(__name__)

# Delete the lock only while it still holds our token: after a lost lock it
# belongs to another worker. EVAL rather than EVALSHA keeps the server's
# EVALSHA count the manager's alone, which the demo reports.
_RELEASE = """
if redis.call("GET", KEYS[1]) == ARGV[1] then
    return redis.call("DEL", KEYS[1])
end
return 0
"""

#: Final outcomes of a job.
FINISHED, ABANDONED, GAVE_UP, STOPPED = "finished", "abandoned", "gave up", "stopped"


def release_lock(client: redis.Redis, keys: QueueKeys, job_id: str, token: str) -> bool:
    """Delete ``job_id``'s lock if it still holds ``token``; return whether it did."""
    return bool(client.eval(_RELEASE, 1, keys.lock(job_id), token))


def steal_lock(client: redis.Redis, keys: QueueKeys, job_id: str, lock_duration: int) -> None:
    """Put another worker's token in ``job_id``'s lock, as if the job had moved on."""
    client.set(keys.lock(job_id), f"another-worker-{uuid.uuid4()}", px=lock_duration, xx=True)


# -- messages ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Event:
    """One thing that happened in the tree, for logs, views and tests."""

    #: When, in seconds on the monotonic clock.
    at: float
    #: The job it concerns.
    job_id: str
    #: What happened: acquired, waiting, renewed, lost, abandon, abandoned,
    #: finished, crashed, untracked, restarted, gave up, stolen, crash.
    kind: str
    #: Free text for people.
    detail: str = ""


@dataclass(frozen=True, slots=True)
class JobView:
    """What the supervisor knows of one job right now."""

    job_id: str
    #: Name of the actor working on it; the suffix counts restarts.
    worker: str
    #: waiting, working, or a final outcome (finished, abandoned, ...).
    state: str
    #: The token of the lock the current actor took, or ``""``.
    token: str
    #: Work done, in milliseconds.
    done_ms: int
    renewals: int
    restarts: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The supervisor's view, answered to :class:`GetSnapshot`."""

    jobs: tuple[JobView, ...]
    events: tuple[Event, ...]
    #: Every job reached a final outcome.
    done: bool


@dataclass(frozen=True, slots=True)
class Abandon:
    """Supervisor to job actor: stop working on the job at the next step."""

    reason: str


@dataclass(frozen=True, slots=True)
class Crash:
    """To a job actor: raise, as a bug in the job's code would (fault injection)."""

    reason: str


@dataclass(frozen=True, slots=True)
class CrashJob:
    """To the supervisor: crash the actor working on ``job_id`` (fault injection)."""

    job_id: str


@dataclass(frozen=True, slots=True)
class Note:
    """To the supervisor: put something that happened outside the tree in its log."""

    job_id: str
    kind: str
    detail: str = ""
    #: When, in seconds on the monotonic clock.
    at: float = 0.0


@dataclass(frozen=True, slots=True)
class GetSnapshot:
    """Ask the supervisor for a :class:`Snapshot`."""


@dataclass(frozen=True, slots=True)
class GetManager:
    """Ask the supervisor for its manager's ``ActorRef``."""


@dataclass(frozen=True, slots=True)
class _Progress:
    job_id: str
    generation: int
    state: str
    token: str
    done_ms: int
    detail: str
    at: float


@dataclass(frozen=True, slots=True)
class _Exited:
    job_id: str
    generation: int
    outcome: str
    detail: str
    at: float


@dataclass(frozen=True, slots=True)
class _LocksLost:
    job_ids: tuple[str, ...]
    at: float


@dataclass(frozen=True, slots=True)
class _LocksRenewed:
    job_ids: tuple[str, ...]
    at: float


@dataclass(frozen=True, slots=True)
class _Acquire:
    pass


@dataclass(frozen=True, slots=True)
class _Step:
    pass


# -- the job actor ----------------------------------------------------------


class JobActor(pykka.ThreadingActor):
    """Works on one job while the manager keeps its lock alive.

    Args:
        supervisor: Where progress and the end of the actor are reported.
        manager: The lock manager of the job's queue.
        client: A client for taking and releasing the lock.
        keys: The job's queue.
        job_id: The job.
        generation: How many times the supervisor restarted this job's actor.
        lock_duration: TTL of the lock the actor takes, in milliseconds.
        work_ms: How long the job works in all, in milliseconds.
        step_ms: Length of one step of work, in milliseconds; cancellation
            is checked between steps.
    """

    use_daemon_thread = True

    def __init__(
        self,
        *,
        supervisor: pykka.ActorRef[Supervisor],
        manager: pykka.ActorRef[LockManager],
        client: redis.Redis,
        keys: QueueKeys,
        job_id: str,
        generation: int,
        lock_duration: int,
        work_ms: int,
        step_ms: int,
    ) -> None:
        super().__init__()
        self._supervisor = supervisor
        self._manager = manager
        self._client = client
        self._keys = keys
        self._job_id = job_id
        self._generation = generation
        self._lock_duration = lock_duration
        self._work_ms = work_ms
        self._step_ms = step_ms
        self._token = ""
        self._done_ms = 0
        self._cancelled = ""
        self._outcome = STOPPED
        # A lock left by a crashed actor expires within one TTL; wait twice that.
        self._give_up_at = time.monotonic() + 2 * lock_duration / 1000

    def on_start(self) -> None:
        """Start by taking the job's lock."""
        self.actor_ref.tell(_Acquire())

    def on_receive(self, message: Any) -> None:
        """Run one step of the job's life."""
        if isinstance(message, _Acquire):
            self._acquire()
        elif isinstance(message, _Step):
            self._step()
        elif isinstance(message, Abandon):
            # Only noted here: the work in progress ends at the next step.
            self._cancelled = message.reason
        elif isinstance(message, Crash):
            raise RuntimeError(message.reason)
        else:
            logger.warning("%s ignored unknown message %r", self._job_id, message)

    def _acquire(self) -> None:
        token = str(uuid.uuid4())
        # As a queue's move-to-active does: the lock is ours only if free.
        if self._client.set(self._keys.lock(self._job_id), token, nx=True, px=self._lock_duration):
            self._token = token
            actors.track_job(self._manager, self._job_id, token)
            self._report("working", "took the lock")
            self.actor_ref.tell(_Step())
            return
        if time.monotonic() >= self._give_up_at:
            self._outcome = GAVE_UP
            self.stop()
            return
        self._report("waiting", "lock held by another token")
        # Poll: a real worker would get the job back from the queue once a
        # stalled checker saw its lock expire.
        time.sleep(min(self._step_ms, self._lock_duration // 4) / 1000)
        self.actor_ref.tell(_Acquire())

    def _step(self) -> None:
        if self._cancelled:
            # The lock is someone else's now: leave it to them.
            self._outcome = ABANDONED
            self.stop()
            return
        # One slice of the job's real work.
        time.sleep(self._step_ms / 1000)
        self._done_ms += self._step_ms
        if self._done_ms < self._work_ms:
            self._report("working", "")
            self.actor_ref.tell(_Step())
            return
        self._outcome = FINISHED
        self.stop()

    def on_stop(self) -> None:
        """Release the lock if still ours, untrack the job, tell the supervisor."""
        released = False
        if self._token:
            self._untrack()
            released = release_lock(self._client, self._keys, self._job_id, self._token)
        detail = "lock released" if released else "lock not ours: left as it is"
        if self._outcome == ABANDONED:
            detail = f"{self._cancelled}; {detail}"
        self._tell_supervisor(
            _Exited(self._job_id, self._generation, self._outcome, detail, time.monotonic())
        )

    def on_failure(
        self,
        exception_type: type[BaseException] | None,
        exception_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Tell the supervisor; the job's lock is its business now."""
        self._tell_supervisor(
            _Exited(
                self._job_id,
                self._generation,
                "crashed",
                f"{getattr(exception_type, '__name__', 'error')}: {exception_value}",
                time.monotonic(),
            )
        )

    def _untrack(self) -> None:
        # Wait until the manager has untracked the job before deleting the
        # lock: a tick already running would otherwise find the lock gone and
        # report it lost. The manager never asks a job actor, so this cannot
        # deadlock.
        try:
            self._manager.ask(UntrackJob(self._job_id), timeout=self._lock_duration / 1000)
        except (pykka.ActorDeadError, pykka.Timeout):
            logger.debug("%s: the manager did not confirm the untrack", self._job_id)

    def _report(self, state: str, detail: str) -> None:
        self._tell_supervisor(
            _Progress(
                self._job_id,
                self._generation,
                state,
                self._token,
                self._done_ms,
                detail,
                time.monotonic(),
            )
        )

    def _tell_supervisor(self, message: object) -> None:
        # A dead supervisor means the tree is shutting down: nobody is left to tell.
        with contextlib.suppress(pykka.ActorDeadError):
            self._supervisor.tell(message)


# -- the supervisor ---------------------------------------------------------


@dataclass
class _Child:
    ref: pykka.ActorRef[JobActor] | None
    generation: int = 0
    state: str = "starting"
    token: str = ""
    done_ms: int = 0
    renewals: int = 0


class Supervisor(pykka.ThreadingActor):
    """Starts the manager and one job actor per job, and restarts crashed ones.

    One-for-one: a crash restarts only the actor that crashed.

    Args:
        url: The server's URL.
        keys: The queue's keys.
        job_ids: One job actor is started for each.
        lock_duration: Lock TTL, in milliseconds.
        work_ms: How long each job works, in milliseconds.
        step_ms: Length of one step of work, in milliseconds.
        max_restarts: Restarts allowed per job before the supervisor gives up.
        manager_class: The manager to start (a subclass may observe ticks).
    """

    use_daemon_thread = True

    def __init__(
        self,
        *,
        url: str,
        keys: QueueKeys,
        job_ids: Sequence[str],
        lock_duration: int,
        work_ms: int,
        step_ms: int,
        max_restarts: int = 3,
        manager_class: type[LockManager] = LockManager,
    ) -> None:
        super().__init__()
        self._url = url
        self._keys = keys
        self._job_ids = list(job_ids)
        self._lock_duration = lock_duration
        self._work_ms = work_ms
        self._step_ms = step_ms
        self._max_restarts = max_restarts
        self._manager_class = manager_class
        self._children: dict[str, _Child] = {}
        self._events: list[Event] = []
        # Bounded waits: a tick of the manager or a step never hangs on a dead server.
        self._client = redis.Redis.from_url(url, socket_timeout=max(lock_duration / 4000, 0.05))
        self._manager: pykka.ActorRef[LockManager] | None = None

    def on_start(self) -> None:
        """Start the manager, then the job actors."""
        me = self.actor_ref

        # The manager calls these on its own thread: tell, never wait.
        def lost(job_ids: list[str]) -> None:
            _tell(me, _LocksLost(tuple(job_ids), time.monotonic()))

        def renewed(job_ids: list[str]) -> None:
            _tell(me, _LocksRenewed(tuple(job_ids), time.monotonic()))

        self._manager = self._manager_class.start(
            connection=self._url,
            keys=self._keys,
            lock_duration=self._lock_duration,
            on_lock_renewal_failed=lost,
            on_locks_renewed=renewed,
        )
        for job_id in self._job_ids:
            self._children[job_id] = _Child(None)
            self._start_child(job_id)

    def on_stop(self) -> None:
        """Stop the job actors, then the manager."""
        self._shutdown()

    def on_failure(
        self,
        exception_type: type[BaseException] | None,
        exception_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Do not leave threads behind if the supervisor itself fails."""
        self._shutdown()

    def _shutdown(self) -> None:
        for child in self._children.values():
            if child.ref is not None:
                child.ref.stop()
        if self._manager is not None:
            actors.stop(self._manager)
        self._client.close()

    def _start_child(self, job_id: str) -> None:
        assert self._manager is not None
        child = self._children[job_id]
        child.ref = JobActor.start(
            supervisor=self.actor_ref,
            manager=self._manager,
            client=self._client,
            keys=self._keys,
            job_id=job_id,
            generation=child.generation,
            lock_duration=self._lock_duration,
            work_ms=self._work_ms,
            step_ms=self._step_ms,
        )
        child.state, child.token, child.done_ms = "starting", "", 0

    def on_receive(self, message: Any) -> Any:
        """Handle reports from the children and the manager, and queries."""
        if isinstance(message, _Progress):
            self._on_progress(message)
        elif isinstance(message, _Exited):
            self._on_exited(message)
        elif isinstance(message, _LocksLost):
            self._on_lost(message)
        elif isinstance(message, _LocksRenewed):
            for job_id in message.job_ids:
                if job_id in self._children:
                    self._children[job_id].renewals += 1
                self._record(message.at, job_id, "renewed")
        elif isinstance(message, CrashJob):
            child = self._children.get(message.job_id)
            if child is not None and child.ref is not None:
                self._record(time.monotonic(), message.job_id, "crash", "fault injected")
                _tell(child.ref, Crash(f"fault injected into {message.job_id}"))
        elif isinstance(message, Note):
            self._record(
                message.at or time.monotonic(), message.job_id, message.kind, message.detail
            )
        elif isinstance(message, GetSnapshot):
            return self._snapshot()
        elif isinstance(message, GetManager):
            return self._manager
        else:
            logger.warning("supervisor ignored unknown message %r", message)
        return None

    def _on_progress(self, message: _Progress) -> None:
        child = self._children.get(message.job_id)
        if child is None or child.generation != message.generation:
            return
        if message.state != child.state:
            kind = "acquired" if message.state == "working" else message.state
            self._record(message.at, message.job_id, kind, message.detail)
        child.state, child.token, child.done_ms = message.state, message.token, message.done_ms

    def _on_exited(self, message: _Exited) -> None:
        child = self._children.get(message.job_id)
        if child is None or child.generation != message.generation:
            return
        child.ref = None
        self._record(message.at, message.job_id, message.outcome, message.detail)
        if message.outcome != "crashed":
            child.state = message.outcome
            return
        # The crashed actor cannot be trusted to clean up: stop renewing its
        # lock here, so the lock expires and the job can be taken again.
        assert self._manager is not None
        actors.untrack_job(self._manager, message.job_id)
        self._record(time.monotonic(), message.job_id, "untracked", "after the crash")
        if child.generation >= self._max_restarts:
            child.state = GAVE_UP
            self._record(time.monotonic(), message.job_id, GAVE_UP, "too many restarts")
            return
        child.generation += 1
        self._start_child(message.job_id)
        self._record(time.monotonic(), message.job_id, "restarted", f"restart #{child.generation}")

    def _on_lost(self, message: _LocksLost) -> None:
        for job_id in message.job_ids:
            self._record(message.at, job_id, "lost", "renewal found another token or no lock")
            child = self._children.get(job_id)
            if child is not None and child.ref is not None:
                _tell(child.ref, Abandon("lock lost"))
                self._record(time.monotonic(), job_id, "abandon", "told the job actor")

    def _record(self, at: float, job_id: str, kind: str, detail: str = "") -> None:
        self._events.append(Event(at, job_id, kind, detail))

    def _snapshot(self) -> Snapshot:
        views = tuple(
            JobView(
                job_id=job_id,
                worker=f"{job_id}#{child.generation}",
                state=child.state,
                token=child.token,
                done_ms=child.done_ms,
                renewals=child.renewals,
                restarts=child.generation,
            )
            for job_id, child in self._children.items()
        )
        done = all(child.ref is None for child in self._children.values())
        return Snapshot(views, tuple(self._events), done)


def _tell(ref: pykka.ActorRef[Any], message: object) -> None:
    try:
        ref.tell(message)
    except pykka.ActorDeadError:
        logger.debug("%r not delivered: the actor has stopped", message)


# -- running the tree -------------------------------------------------------


@dataclass(frozen=True)
class Result:
    """What a run of the tree did."""

    #: Jobs whose work completed.
    finished: list[str]
    #: Jobs whose actor abandoned the work after a lost lock.
    abandoned: list[str]
    #: Jobs the manager reported lost.
    lost: list[str]
    #: Jobs whose lock the run stole on purpose.
    stolen: list[str]
    #: Jobs whose actor crashed, once per crash.
    crashed: list[str]
    #: Jobs the supervisor untracked after a crash.
    untracked_after_crash: list[str]
    #: Restarts per job.
    restarts: dict[str, int]
    #: Everything that happened, in order.
    events: list[Event]
    #: The manager's counters at the end.
    stats: Stats
    #: EVALSHA calls that ran on the server during the run (the manager's script calls).
    server_script_calls: int
    #: When the run started, in seconds on the monotonic clock.
    started_at: float
    #: Jobs that neither finished nor were abandoned.
    unfinished: list[str] = field(default_factory=list)


def _evalsha_calls(client: redis.Redis) -> int:
    stats: dict[str, Any] = client.info("commandstats").get("cmdstat_evalsha", {})
    # A NOSCRIPT answer counts as a failed call: only the others ran the script.
    return int(stats.get("calls", 0)) - int(stats.get("failed_calls", 0))


def run(
    url: str,
    *,
    jobs: int = 4,
    queue: str = "supervised",
    lock_duration: int = 2000,
    work_ms: int | None = None,
    step_ms: int = 200,
    steal: str | None = "job-2",
    crash: str | None = "job-3",
    provoke_after_ms: int | None = None,
    timeout_s: float | None = None,
    manager_class: type[LockManager] = LockManager,
    on_poll: Callable[[Snapshot, pykka.ActorRef[LockManager]], None] | None = None,
    poll_s: float = 0.1,
) -> Result:
    """Run the tree until every job has an outcome, stealing one lock and crashing one actor.

    Args:
        url: The server's URL.
        jobs: How many jobs (``job-1``, ``job-2``, ...), one actor each.
        queue: The queue's name.
        lock_duration: Lock TTL, in milliseconds.
        work_ms: Work per job in milliseconds; three TTLs when ``None``.
        step_ms: Length of one step of work, in milliseconds.
        steal: Job whose lock is handed to another worker mid-way, or ``None``.
        crash: Job whose actor is crashed mid-way, or ``None``.
        provoke_after_ms: When to steal and crash, in milliseconds after the
            start; one TTL when ``None``.
        timeout_s: Give up waiting after this many seconds; derived from the
            durations when ``None``.
        manager_class: The manager to start.
        on_poll: Called on this thread with each snapshot while waiting.
        poll_s: Time between two snapshots, in seconds.

    Returns:
        What happened.

    Raises:
        TimeoutError: Some job had no outcome within ``timeout_s``.
    """
    work = work_ms if work_ms is not None else 3 * lock_duration
    provoke_at = provoke_after_ms if provoke_after_ms is not None else lock_duration
    # The slowest path: provoke, wait for the crashed lock to expire, redo the work.
    timeout = timeout_s or (provoke_at + 2 * lock_duration + work) / 1000 * 3 + 10
    keys = QueueKeys(queue)
    job_ids = [f"job-{n}" for n in range(1, jobs + 1)]
    client = redis.Redis.from_url(url, socket_timeout=10)
    calls_before = _evalsha_calls(client)

    # Step 1: start the tree; the supervisor starts the manager and the job actors.
    started = time.monotonic()
    supervisor = Supervisor.start(
        url=url,
        keys=keys,
        job_ids=job_ids,
        lock_duration=lock_duration,
        work_ms=work,
        step_ms=step_ms,
        manager_class=manager_class,
    )
    try:
        manager: pykka.ActorRef[LockManager] = supervisor.ask(GetManager(), block=True)
        stolen: list[str] = []
        provoked = False
        deadline = started + timeout
        while True:
            snapshot: Snapshot = supervisor.ask(GetSnapshot(), block=True)
            if on_poll is not None:
                on_poll(snapshot, manager)
            if snapshot.done:
                break
            now = time.monotonic()
            if now > deadline:
                raise TimeoutError(f"jobs still running after {timeout:.0f} s")
            # Step 2: mid-way, another worker takes one job's lock and one
            # job actor crashes.
            if not provoked and now - started >= provoke_at / 1000:
                provoked = True
                if steal is not None:
                    steal_lock(client, keys, steal, lock_duration)
                    stolen.append(steal)
                    supervisor.tell(
                        Note(steal, "stolen", "another worker's token", time.monotonic())
                    )
                if crash is not None:
                    supervisor.tell(CrashJob(crash))
            time.sleep(poll_s)
        # Step 3: read the manager's counters before the tree stops.
        stats = actors.get_stats(manager, timeout=10)
    finally:
        supervisor.stop()
    server_calls = _evalsha_calls(client) - calls_before
    client.close()

    # Reports from several threads reach the supervisor in any order.
    events = sorted(snapshot.events, key=lambda event: event.at)
    finals = {view.job_id: view.state for view in snapshot.jobs}
    return Result(
        finished=[job_id for job_id, state in finals.items() if state == FINISHED],
        abandoned=[job_id for job_id, state in finals.items() if state == ABANDONED],
        lost=[event.job_id for event in events if event.kind == "lost"],
        stolen=stolen,
        crashed=[event.job_id for event in events if event.kind == "crashed"],
        untracked_after_crash=[event.job_id for event in events if event.kind == "untracked"],
        restarts={view.job_id: view.restarts for view in snapshot.jobs},
        events=events,
        stats=stats,
        server_script_calls=server_calls,
        started_at=started,
        unfinished=[
            job_id for job_id, state in finals.items() if state not in (FINISHED, ABANDONED)
        ],
    )


def main() -> int:
    """Run the tree on ``REDIS_URL`` or a private server and print what happened."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    with server_url() as url:
        result = run(url)
    for event in result.events:
        if event.kind != "renewed":
            at = event.at - result.started_at
            print(f"{at:6.2f}s  {event.job_id:6}  {event.kind:10} {event.detail}")
    print(f"finished: {result.finished}; abandoned: {result.abandoned}; lost: {result.lost}")
    print(f"restarts: {result.restarts}; renewals: {result.stats.renewed}")
    # Only the stolen lock may be lost.
    return 0 if sorted(result.lost) == sorted(result.stolen) and not result.unfinished else 1


if __name__ == "__main__":
    raise SystemExit(main())
