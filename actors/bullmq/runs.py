"""The runs a bullmq worker holds, from the fetch that takes each lock to its move.

A run is one job held with one token, kept on the worker's event loop; its
losses go to the worker as bullmq-py's events and to the ``AbortSignal``.
"""

from __future__ import annotations

import contextvars
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bullmq.abort_controller import AbortController, AbortError, AbortSignal

from actors.jobs import Validity
from actors.messages import UNCONFIRMED
from actors.ref import UNREAD
from actors.timing import monotonic_ms

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable, Iterable

    from actors.ref import Reply


__all__ = [
    "LOCK_LOST",
    "RUN_TOKEN",
    "LockController",
    "LockSignal",
    "Run",
    "Runs",
    "Trust",
    "abort_reason",
    "monotonic_from_wall",
    "wall_ms",
]

logger = logging.getLogger("actors.bullmq")

#: How the reason of an ``AbortSignal`` aborted for a lost lock begins.
LOCK_LOST = "lock lost"

#: Why a run is lost when the same worker takes its job again with a new token.
_TAKEN_AGAIN = "taken again"

#: How many runs replaced by a newer one :class:`Runs` remembers, the oldest forgotten first.
_SUPERSEDED_KEPT = 1024

#: The token of the run of a job that the current task is processing.
RUN_TOKEN: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "actors_bullmq_run_token", default=None
)


class Trust:
    """Until when one run's lock is trusted: its deadline, read by the run's signal itself.

    From the taking of the lock (``taken_ms + span``) until the manager has
    answered the run's track, then the manager's own
    :class:`~actors.jobs.Validity` of the lock, which follows the renewals it
    confirms (the child's, in process mode). Read from any thread: a few
    attribute reads, no lock, no wait.
    """

    __slots__ = ("clock", "reply", "span", "taken_ms", "validity")

    def __init__(self, taken_ms: int, span: int, clock: Callable[[], int] = monotonic_ms) -> None:
        #: When the lock was taken (the fetch's send), in the manager's monotonic ms.
        self.taken_ms = taken_ms
        #: How long a lock is trusted after a confirmed send (or its taking), in ms.
        self.span = span
        #: The manager's clock.
        self.clock = clock
        #: Where the manager answers the track (through the worker's outbox).
        self.reply: Reply | None = None
        #: The lock's validity as the manager keeps it, once it has answered.
        self.validity: Validity | None = None

    @property
    def deadline(self) -> int:
        """Monotonic ms past which the lock may be gone at the server."""
        # Until the manager has read the track, the taking's deadline holds.
        reply = self.reply
        if reply is not None and reply.value is not UNREAD:
            # Not a Validity: the manager stopped, or the run ended before it read the track.
            self.reply = None
            if isinstance(reply.value, Validity):
                self.validity = reply.value
        validity = self.validity
        return self.taken_ms + self.span if validity is None else validity.deadline

    def passed(self) -> bool:
        """Whether the deadline has come: the lock may be another worker's by now."""
        try:
            now = self.clock()
        except Exception:
            return False  # a clock that raises: the manager's own timer judges then
        return now >= self.deadline


class LockSignal(AbortSignal):  # type: ignore[misc]
    """bullmq's ``AbortSignal``, aborted from any thread once the lock is, or may be, lost.

    bullmq's own signal is an ``asyncio.Event``, set on the loop only, so it
    reads ``False`` behind a processor that blocks the loop. This one also
    keeps the loss in a plain attribute the manager's teller thread writes,
    and reads the run's deadline itself (:class:`Trust`): a processor whose
    process was paused past it (SIGSTOP, a GIL hold) reads ``True`` at its
    first look, before the manager could say so. Waiters of :meth:`wait`
    wake once the loop runs.
    """

    def __init__(self) -> None:
        super().__init__()
        self._lost: str | None = None
        self._job_id = ""
        self._trust: Trust | None = None

    def watch(self, job_id: str, trust: Trust | None) -> None:
        """Read ``trust``'s deadline at each look from now on (``None``: no deadline)."""
        self._job_id = job_id
        self._trust = trust

    @property
    def aborted(self) -> bool:
        """Whether the signal was aborted, or the lock is known or may be lost."""
        if self._lost is not None or self._event.is_set():
            return True
        trust = self._trust
        if trust is not None and trust.passed():
            self.lose(abort_reason(self._job_id, UNCONFIRMED))
            return True
        return False

    @property
    def reason(self) -> str | None:
        """Why: the abort's reason, or the lost lock's."""
        if not self.aborted:
            return None
        return self._reason if self._event.is_set() else self._lost

    def throw_if_aborted(self) -> None:
        """Raise ``AbortError`` if the signal reads aborted."""
        if self.aborted:
            raise AbortError(self.reason)

    def lose(self, reason: str) -> None:
        """Mark the lock lost, from any thread; the loop aborts the signal itself later."""
        if self._lost is None:
            self._lost = reason


class LockController(AbortController):  # type: ignore[misc]
    """bullmq's ``AbortController``, with a :class:`LockSignal`."""

    def __init__(self) -> None:
        self.signal: LockSignal = LockSignal()


@dataclass(frozen=True, slots=True)
class Run:
    """One run of a job this worker holds, from its fetch to its move."""

    #: The token its lock holds.
    token: str
    #: When the lock was taken, in wall-clock milliseconds (bullmq's ``ts``).
    wall_ms: int
    #: Aborts the signal the processor was given, if it asked for one.
    controller: AbortController | None = None
    #: Why the manager reported the lock lost, if it did.
    lost: str | None = None
    #: A move of the job was sent and not yet answered.
    moving: bool = False
    #: The task processing it (bullmq's ``processJob``), once it has started.
    task: asyncio.Task[Any] | None = None
    #: Until when its lock is trusted (``None``: renewal is off).
    trust: Trust | None = None

    def but(self, **changes: Any) -> Run:
        """A copy with ``changes``: ``dataclasses.replace`` at a third of its cost, per move."""
        fields: dict[str, Any] = {
            "token": self.token,
            "wall_ms": self.wall_ms,
            "controller": self.controller,
            "lost": self.lost,
            "moving": self.moving,
            "task": self.task,
            "trust": self.trust,
        }
        fields.update(changes)
        return Run(**fields)


def wall_ms() -> int:
    """Return the wall-clock time in milliseconds, as bullmq stamps a job."""
    return time.time_ns() // 1_000_000


def monotonic_from_wall(wall: int) -> int:
    """Return the monotonic time, in ms, of a wall-clock instant in the recent past."""
    return monotonic_ms() - max(0, wall_ms() - wall)


class Runs:
    """The table of runs, by job id; used on the worker's loop only.

    ``untrack(job_id, token)`` stops the renewal of a run's lock; ``changed()``
    is called whenever a run ends, so a close waiting for it looks again.
    """

    def __init__(
        self,
        worker: Any,
        name: str,
        untrack: Callable[[str, str], None],
        changed: Callable[[], None],
    ) -> None:
        self._worker = worker
        self._name = name
        self._untrack = untrack
        self._changed = changed
        self._runs: dict[str, Run] = {}
        #: The ``(job_id, token)`` of runs replaced by a newer run of their job (an ordered set).
        self._superseded: dict[tuple[str, str], None] = {}

    def get(self, job_id: str) -> Run | None:
        """Return the job's run, if this worker holds it."""
        return self._runs.get(job_id)

    def items(self) -> Iterable[tuple[str, Run]]:
        """Return each held job's id and run."""
        return self._runs.items()

    def ids(self) -> list[str]:
        """Return the held jobs' ids."""
        return list(self._runs)

    def __len__(self) -> int:
        return len(self._runs)

    def clear(self) -> None:
        """Forget every run."""
        self._runs.clear()
        self._superseded.clear()

    def stale(self, job_id: str, token: str, controller: AbortController | None) -> bool:
        """Whether the run of ``job_id`` held with ``token`` was replaced by a newer one.

        Its processor starts late (the loop was blocked): this worker took the
        job again since, with another token, and that run holds the lock now.
        Its ``controller`` is aborted at once; it is neither tracked nor renewed.
        """
        if (job_id, token) not in self._superseded:
            return False
        run = self._runs.get(job_id)
        if run is not None and run.token == token:
            return False  # taken again with this very token: the current run
        if controller is not None:
            controller.abort(abort_reason(job_id, _TAKEN_AGAIN))
        return True

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Return each job as bullmq-py's ``tracked_jobs`` shows it."""
        return {
            job_id: {"token": run.token, "ts": run.wall_ms, "abort_controller": run.controller}
            for job_id, run in self._runs.items()
        }

    def started(
        self,
        job_id: str,
        token: str,
        ts: int,
        controller: AbortController | None,
        task: asyncio.Task[Any] | None,
    ) -> bool:
        """Record that the job's processor started; return whether it is a new run."""
        run = self._runs.get(job_id)
        if run is None or run.token != token:
            self.replace(job_id, Run(token, ts, controller, task=task))
            return True
        self._runs[job_id] = run = run.but(controller=controller, task=task)
        if controller is not None and run.lost is not None:
            controller.abort(abort_reason(job_id, run.lost))
        _watch(job_id, run)
        return False

    def trusted(self, job_id: str, token: str, trust: Trust | None) -> None:
        """Give the run holding ``token`` the deadline its lock is trusted until."""
        run = self._runs.get(job_id)
        if run is not None and run.token == token:
            self._runs[job_id] = run = run.but(trust=trust)
            _watch(job_id, run)

    def fetched(self, job_id: str, run: Run) -> None:
        """Record a run the fetch took, unless the job already has a run of that token."""
        current = self._runs.get(job_id)
        if current is None or current.token != run.token:
            self.replace(job_id, run)
            self._changed()

    def replace(self, job_id: str, run: Run) -> None:
        """Make ``run`` the job's run; a live run it replaces has lost its lock."""
        old = self._runs.get(job_id)
        self._runs[job_id] = run
        _watch(job_id, run)
        if old is not None and old.token != run.token:
            _watch(job_id, old, over=True)
            superseded = self._superseded
            superseded[(job_id, old.token)] = None
            if len(superseded) > _SUPERSEDED_KEPT:
                del superseded[next(iter(superseded))]
        if old is not None and old.token != run.token and not old.moving and old.lost is None:
            # Taken again by this worker: the old run's processor must hear its lock is gone.
            self._report_lost([(job_id, old, _TAKEN_AGAIN)])

    def moving(self, job_id: str, token: str) -> bool:
        """Mark the run holding ``token`` as being moved; return whether one was."""
        run = self._runs.get(job_id)
        if run is None or run.token != token or run.moving:
            return False
        self._runs[job_id] = run = run.but(moving=True)
        _watch(job_id, run)
        return True

    def moved(self, job_id: str, token: str, *, stayed: bool) -> None:
        """The move of the run holding ``token`` ended: the job left, or ``stayed`` active."""
        run = self._runs.get(job_id)
        if run is None or run.token != token:
            return
        if stayed:
            self._runs[job_id] = run = run.but(moving=False)
            _watch(job_id, run)
        else:
            self.release(job_id, token)

    def release(self, job_id: str, token: str) -> None:
        """Untrack the run holding ``token``, if it is still the job's run."""
        run = self._runs.get(job_id)
        if run is not None and run.token == token:
            del self._runs[job_id]
            _watch(job_id, run, over=True)
            self._untrack(job_id, token)
            self._changed()

    def release_unstarted(self, job_id: str, token: str) -> None:
        """Untrack the run of ``job_id`` held with ``token`` if its processor never started."""
        run = self._runs.get(job_id)
        if run is not None and run.token == token and run.task is None:
            self.release(job_id, token)

    def lost(self, lost: list[tuple[str, str, str]]) -> None:
        """Report the runs whose locks the manager lost: ``(job id, token, why)`` each."""
        reported = []
        for job_id, token, why in lost:
            run = self._runs.get(job_id)
            # Gone, or expired while moving (the move deleted it); another token: an
            # earlier run, told when replaced. A steal is a loss even during a move.
            moved = run is not None and run.moving and why == "expired"
            if run is None or run.lost is not None or moved or token != run.token:
                continue
            self._runs[job_id] = run.but(lost=why)
            reported.append((job_id, run, why))
        self._report_lost(reported)

    def _report_lost(self, lost: list[tuple[str, Run, str]]) -> None:
        """Abort each run's signal, then emit the events bullmq-py emits, once per report."""
        for job_id, run, why in lost:
            if run.controller is not None:
                run.controller.abort(abort_reason(job_id, why))
        if lost:
            self.emit("lockRenewalFailed", [job_id for job_id, _, _ in lost])
            for job_id, _, _ in lost:
                self.emit("error", Exception(f"could not renew lock for job {job_id}"))

    def emit(self, event: str, *args: object) -> None:
        """Emit a worker event; a listener that raises becomes an "error" event, as in bullmq-py."""
        try:
            self._worker.emit(event, *args)
        except Exception as error:
            if event == "error":
                logger.warning(
                    "an 'error' listener of queue %r raised",
                    self._name,
                    exc_info=True,
                    extra={"queue": self._name},
                )
            else:
                self.emit("error", error)


def _watch(job_id: str, run: Run, *, over: bool = False) -> None:
    """Have the run's signal read its lock's deadline while it holds the lock.

    Not once the run is ``over``, nor while a move of its own deletes the lock.
    """
    controller = run.controller
    if controller is None:
        return
    signal = getattr(controller, "signal", None)
    if isinstance(signal, LockSignal):
        signal.watch(job_id, None if over or run.moving else run.trust)


def abort_reason(job_id: str, why: str) -> str:
    """Return the reason a run's signal is aborted with: ``"lock lost (stolen): job 42"``."""
    return f"{LOCK_LOST} ({why}): job {job_id}"
