"""The lock manager: one actor, one timer, one batched renewal per tick.

A port of EchoMQ's ``LockManager`` GenServer to a pykka ``ThreadingActor``.
Job actors tell it which jobs they hold and release; every interval its timer
tells it :class:`~actors.messages.ExtendLocks`, and it renews every due lock
in one round trip. Lost locks are untracked and reported; a Redis fault
untracks nothing and the next tick retries.

All state lives on the actor's thread: other threads reach it only through
messages, which its :class:`~actors.ref.ManagerRef` checks in their thread.
Here are the actor's life, its one dispatch path and the order of a tick's
steps; what each step decides is a pure function of its own module, and what
the manager has to say goes through its :class:`~actors.report.Reporter`.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

import pykka

from actors import _telemetry, deadlines, stopping
from actors import messages as m
from actors.alarm import Alarm
from actors.apply import apply_outcome
from actors.doors import ProxyDoors
from actors.handlers import Handlers
from actors.isolation import InChild, check_process_options, link_for, require_isolation
from actors.jobs import JobTable, LostLocks
from actors.mailbox import TicksFirst
from actors.operations import OPERATIONS
from actors.outcome import BatchOutcome
from actors.rechecks import recheck_scheduled
from actors.ref import ManagerRef
from actors.report import Reporter
from actors.schedule import DEFAULT_LOCK_DURATION, monotonic_ms
from actors.scripts import DEFAULT_MAX_BATCH
from actors.settings import check_settings
from actors.timer import ThreadTimer, resolution_ms

if TYPE_CHECKING:
    import queue
    from collections.abc import Callable

    from actors.connection import Client
    from actors.keys import QueueKeys
    from actors.lost import LostLock
    from actors.renewer import Renewer
    from actors.tally import Note, Tally
    from actors.timer import Timer, TimerFactory

__all__ = ["LockManager"]

logger = logging.getLogger(__name__)


class LockManager(Handlers, ProxyDoors, pykka.ThreadingActor):
    """Renews the locks of the jobs a worker holds on one queue.

    Start it with :func:`actors.start_link` (or ``LockManager.start(...)``
    with the same keywords). Talk to it with the module's helpers, with
    ``ref.proxy()``, or with the messages of :mod:`actors.messages`.

    Args: the keywords of :func:`actors.start_link`, which says what each one does.

    Raises:
        TypeError: An argument has the wrong type.
        ValueError: A duration is out of range, the client's encoding is not
            UTF-8, or the queue's keys cannot live in one hash slot of the
            cluster client given.
    """

    use_daemon_thread = True

    @staticmethod
    def _create_actor_inbox() -> queue.Queue[Any]:
        # pykka's hook for an actor type's mailbox.
        return TicksFirst()

    def __init__(
        self,
        *,
        connection: Client | str | None = None,
        keys: QueueKeys,
        lock_duration: int = DEFAULT_LOCK_DURATION,
        lock_renew_time: int | None = None,
        on_lock_renewal_failed: Callable[[list[LostLock]], object] | None = None,
        on_locks_renewed: Callable[[list[str]], object] | None = None,
        on_error: Callable[[Exception], object] | None = None,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_hold: int | None = None,
        renewer: Renewer | None = None,
        clock: Callable[[], int] | None = None,
        timer: TimerFactory | None = None,
        safety_margin: int | None = None,
        isolation: str = "thread",
    ) -> None:
        super().__init__()
        mailbox = self.actor_inbox
        assert isinstance(mailbox, TicksFirst)
        self._mailbox = mailbox
        process = require_isolation(isolation) == "process"
        if process:
            check_process_options(lock_duration, renewer, clock, timer)
        self._settings = settings = check_settings(
            connection=None if process else connection,
            keys=keys,
            lock_duration=lock_duration,
            lock_renew_time=lock_renew_time,
            on_lock_renewal_failed=on_lock_renewal_failed,
            on_locks_renewed=on_locks_renewed,
            on_error=on_error,
            max_batch=max_batch,
            max_hold=max_hold,
            renewer=InChild() if process else renewer,
            clock=clock,
            timer=timer,
            safety_margin=safety_margin,
        )
        self._timing = timing = settings.timing
        #: The default safety margin of a watched lock, in milliseconds.
        self.safety_margin = settings.safety_margin
        self._max_hold = settings.max_hold
        self._renewer = settings.renewer
        self._reporter = Reporter(keys, timing, on_lock_renewal_failed, on_locks_renewed, on_error)
        self.queue_name = keys.name
        self.clock: Callable[[], int] = clock or monotonic_ms
        self._make_timer: TimerFactory = timer or self._thread_timer
        self.thread: threading.Thread | None = None
        self._jobs = JobTable(timing.lock_duration, self.safety_margin)
        #: The recently lost locks: each holder is told of a loss once, however
        #: often it tracks the same lock again, and the lock is not renewed again.
        self._lost = LostLocks()
        #: Who to tell of a lost lock, told once the step at hand is done.
        self._notes: list[Note] = []
        self._alarm = Alarm(keys.name, self.clock, timing.interval)
        #: With ``isolation="process"``, the child that renews; the job table
        #: then mirrors its claims.
        self._link = link_for(self, connection, keys, settings) if process else None
        # The reference every caller gets: it checks each door in the
        # caller's thread (see actors.ref); pykka offers no other hook.
        self._actor_ref = ManagerRef(self, self)

    def _thread_timer(self, fire: Callable[[int], None], name: str) -> Timer:
        return ThreadTimer(fire, name, self.clock)

    def trusted_for(self, safety_margin: int | None = None) -> int:
        """Return how long a watched lock is trusted after a confirmed renewal's send, in ms."""
        return self._settings.trusted_for(safety_margin)

    def on_start(self) -> None:
        """Arm the timer for the first tick."""
        self.thread = threading.current_thread()
        if self._link is not None:
            self._link.start()
            return
        try:
            self._alarm.start(self._make_timer(self._fire, f"LockManager-timer-{self.queue_name}"))
        except BaseException:
            self._shutdown()
            raise
        logger.debug(
            "LockManager for queue %r started: lock_duration=%d ms, interval=%d ms",
            self.queue_name,
            self._timing.lock_duration,
            self._timing.interval,
        )

    def on_stop(self) -> None:
        """Tell every job that asked to be told, and release the timer and the client."""
        self._shutdown()
        logger.debug("LockManager for queue %r stopped", self.queue_name)

    def on_failure(self, *_exc_info: object) -> None:
        """Likewise if the actor dies: nobody renews those locks now."""
        self._shutdown()

    def _shutdown(self) -> None:
        # From here on every sender is refused (see actors.stopping).
        self._mailbox.close()
        self._notes.extend(stopping.let_go(self._jobs).notes)
        asks = stopping.refuse_the_rest(self._mailbox, self._notes, self._lost)
        self._deliver()
        stopping.answer_stopped(asks, self.queue_name)
        parts = {
            "timer": self._alarm.close(),
            "renewer": self._renewer,
            "child process": self._link,
        }
        stopping.close_quietly(self.queue_name, parts)

    def _fire(self, scheduled: int) -> None:
        tick = m.ExtendLocks(scheduled)
        # One timer thread, and the next fire is armed only by this tick's
        # handling: at most one tick is ever marked to go first.
        self._mailbox.tick = tick
        self.actor_ref.tell(tick)

    def on_receive(self, message: Any) -> Any:
        """Handle one message; a malformed or unknown one is logged and dropped."""
        try:
            if self._link is not None:
                # Forwarded; an ask the child answers takes its envelope along.
                return self._link.receive(message, self._mailbox.current)
            return self.handle(message)
        except BaseException:
            # A BaseException too: left to pykka, it would stop every actor
            # of the process. Only the type is named: a repr is the sender's
            # code, and may raise.
            logger.warning(
                "LockManager for queue %r dropped a %s message",
                self.queue_name,
                type(message).__name__,
                exc_info=True,
            )
            return None

    def handle(self, message: Any) -> Any:
        """Handle ``message`` on the calling thread, which must be the manager's."""
        if self._link is not None:
            return self._link.handle(message)
        return self._dispatch(message)

    def _dispatch(self, message: Any) -> Any:
        # One dict lookup: tracks arrive by the hundred thousand.
        handler = _HANDLERS.get(type(message))
        if handler is None:
            logger.warning(
                "LockManager for queue %r ignored an unknown %s message",
                self.queue_name,
                type(message).__name__,
            )
            return None
        return handler(self, message)

    def _on_extend(self, message: m.ExtendLocks) -> None:
        scheduled = recheck_scheduled(message)
        if scheduled is None or not self._alarm.at_deadline(scheduled):
            self._tick(scheduled)
            return
        # The timer's fire at a watched lock's deadline: tell who is past it, nothing else.
        now = self._alarm.now(scheduled)
        try:
            if self._jobs.valid:
                self._reporter.lost(self._unconfirmed(now, max(0, now - scheduled)).lost)
        finally:
            self._alarm.rearm(self._jobs.deadlines)
            self._deliver()

    def _tick(self, scheduled: int | None) -> None:
        """Let go of what is past its deadline, renew what is due, say what happened."""
        counters = self._reporter.counters
        counters.ticks += 1
        times = self._alarm.times(scheduled)
        if times is None:
            return
        now, at, on_grid = times
        try:
            if on_grid:
                self._reporter.late(now - at)
            if self._jobs.watches:
                self._reporter.lost(self._take(deadlines.expire_holds(self._jobs, now)).lost)
                if self._jobs.valid:
                    self._reporter.lost(self._unconfirmed(now, now - at if on_grid else 0).lost)
            due, tokens = self._jobs.due(at, self._timing.threshold)
            if due:
                started = time.perf_counter()
                oldest = self._jobs.oldest(due)
                calls = -(-len(due) // self._settings.max_batch)
                with _telemetry.tick_span(self.queue_name, len(due)) as span:
                    outcome: BatchOutcome | BaseException
                    try:
                        # The one round trip: actors.renewer, one EVALSHA per chunk.
                        answer: object = self._renewer(due, tokens)
                        if not isinstance(answer, BatchOutcome):
                            name = type(answer).__name__
                            raise TypeError(f"the renewer returned {name}, not a BatchOutcome")
                        outcome = answer
                    except BaseException as exc:
                        # Nothing is known to have run (see actors.apply).
                        outcome = exc
                    # Read once the answer is back: the margin is never overstated.
                    answered = self._alarm.now(now) if isinstance(outcome, BatchOutcome) else now
                    tally = apply_outcome(self._jobs, due, tokens, outcome, at, answered, counters)
                    self._take(tally)
                    margin = self._timing.lock_duration - (answered - oldest)
                    ran = calls if isinstance(outcome, BatchOutcome) else None
                    span.record(tally, ran, counters.lateness_ms, margin)
                counters.tick(len(due), calls, (time.perf_counter() - started) * 1000)
                # Callbacks run after the span and the bookkeeping: their time
                # is theirs, and whatever they do finds the manager consistent.
                # The failed call took time: a deadline may have passed meanwhile.
                # Looked at before the callbacks run: what a callback's time
                # allows others to do (an untrack from another thread) the
                # tick must not report.
                late: list[LostLock] = []
                if tally.failure is not None and self._jobs.valid:
                    late = self._unconfirmed(self._alarm.now(now)).lost
                self._reporter.renewal(tally, now, margin)
                self._reporter.lost(late)
        finally:
            # Whatever happened above, the timer ticks again.
            if on_grid:
                self._alarm.advance(at, now, self._jobs.deadlines)
            elif self._jobs.valid:
                self._alarm.arm(self._jobs.deadlines)
            self._deliver()

    def _unconfirmed(self, now: int, late: int = 0) -> Tally:
        paused = late if late > resolution_ms() else 0
        return self._take(
            deadlines.unconfirmed(self._jobs, now, self._reporter.counters, paused=paused)
        )

    def _take(self, tally: Tally) -> Tally:
        """Queue the tally's notes to deliver and remember its losses; return it."""
        self._notes.extend(tally.notes)
        for job_id, token, reason, claims in tally.ended:
            self._lost.add(job_id, token, reason, claims)
        return tally

    def _tell_now(self, notes: list[Note]) -> None:
        self._notes.extend(notes)
        self._deliver()

    def _deliver(self) -> None:
        # Told only once the step's bookkeeping is done: a target that calls
        # back in (untrack, track, queries) finds the manager consistent.
        notes, self._notes = self._notes, []
        self._reporter.tell(notes)

    @property
    def calling_back(self) -> bool:
        """Whether the manager's thread runs user code now (a callback, a target's ``tell``)."""
        return self._reporter.calling

    def put_before_ticks(self, envelope: Any) -> None:
        """Put ``envelope`` in the mailbox, every tick after it (see ManagerRef.ask)."""
        self._mailbox.put_before_ticks(envelope)


#: Each message's handler, found through the one table of operations.
_HANDLERS: dict[type, Callable[[LockManager, Any], Any]] = {
    operation.message: getattr(LockManager, operation.handler) for operation in OPERATIONS
}
