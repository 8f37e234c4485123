"""The lock manager: one actor, one timer, one batched renewal per tick.

A port of EchoMQ's ``LockManager`` GenServer to a pykka ``ThreadingActor``.
Job actors tell it which jobs they hold and release (``handle_cast`` of
``:track_job`` and ``:untrack_job``: :meth:`LockManager._on_track` and
:meth:`LockManager._on_untrack`); every interval its timer tells it
``ExtendLocks`` (``handle_info(:extend_locks)``: :meth:`LockManager._on_extend`),
and it renews every due lock in one round trip. Lost locks are untracked and
reported; a Redis fault untracks nothing and the next tick retries.

All state lives on the actor's thread: other threads reach it only through
messages, which its :class:`~actors.ref.ManagerRef` checks in their thread.
The round trip runs on a renewal thread of the manager's, so a slow or dead
server never holds up a message or a watched lock's deadline; its answer
comes back as a message. Each step decides first (:class:`~actors.books.Books`),
re-arms the timer, and only then reports, on the delivery and teller threads
(see :mod:`actors.report`): no user code runs on the manager's thread, and
its log lines are written on its record thread.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Final

import pykka
from pykka._envelope import Envelope
from pykka.messages import _ActorStop

import actors.messages as m
from actors.books import Books, Report
from actors.keys import QueueKeys
from actors.messages import MANAGER_STOPPED, BatchOutcome, ChunkError, LockLost
from actors.ref import ManagerRef, ManagerStopped, Outbox, Posted, Reply
from actors.report import Reporter
from actors.scripts import DEFAULT_MAX_BATCH, RedisRenewer, require_replicas
from actors.telemetry import Log, span_facts, tick_span
from actors.timer import Alarm, ThreadTimer
from actors.timing import (
    DEFAULT_LOCK_DURATION,
    MAX_DURATION_MS,
    Timing,
    check_safety_margin,
    default_safety_margin,
    monotonic_ms,
    require_callback,
    require_int,
    resolution_ms,
    yield_interpreter,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from actors.connection import Client
    from actors.jobs import Validity
    from actors.messages import LostLock, Renewer
    from actors.report import Stats
    from actors.scripts import Replicas
    from actors.telemetry import RecordThread
    from actors.timer import Timer, TimerFactory

__all__ = ["ISOLATIONS", "LockManager", "require_isolation"]

logger = Log(__name__)

#: The isolation modes a manager accepts.
ISOLATIONS: Final = ("thread", "process")

#: First pause before a failed tick is tried again, in ms; it doubles with
#: each failure in a row, up to a quarter of the interval.
RETRY_MS: Final = 10
#: Most seconds a stopping manager waits for the renewal on its way (a
#: client without a timeout may wait forever; its thread is then left).
STOP_RENEWAL_S: Final = 10.0


def require_isolation(isolation: object) -> str:
    """Return ``isolation`` if it is one of :data:`ISOLATIONS`; raise otherwise."""
    if not isinstance(isolation, str):
        raise TypeError(f"isolation must be a str, got {type(isolation).__name__}")
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation must be 'thread' or 'process', got {isolation!r}")
    return str.__str__(isolation)


# -- the mailbox and the manager's own messages ---------------------------------------


@dataclass(frozen=True, slots=True)
class Fired:
    """The manager's timer fired for ``at`` (internal: the timer's own, not a user's)."""

    at: int


@dataclass(frozen=True, slots=True)
class Landed:
    """A renewal's answer came back from the renewal thread (internal)."""

    outcome: BatchOutcome | BaseException
    #: When the answer was read, in monotonic ms.
    answered: int
    #: How long the round trip and the bookkeeping took, in ms.
    elapsed_ms: float
    #: How many dead holders' locks were deleted, or why that failed.
    released: int | BaseException


#: Most seconds a closing mailbox waits for the puts already begun.
CLOSE_WAIT_S: Final = 1.0

#: Put in the mailbox's queue to wake a waiting ``get``: the messages are in its deques.
_WAKE: Final = object()

#: Most messages put without a wake before one wakes the manager all the same.
QUIET_MAX: Final = 256


class TicksFirst:
    """A manager's mailbox: first in, first out, but for its timer's fires and renewals' answers.

    A burst of tells would otherwise hold each tick behind it. Nothing is lost
    by the jump (tracks carry their caller's time; an untrack that must not
    race a tick waits), and nobody else can send what jumps: the reference refuses it.

    A message put with ``wake=False`` (see :meth:`ManagerRef.tell`) waits,
    with ``quiet``, for the next message the manager gets (its timer ticks
    every interval) and is read before it: nothing jumps it. Without
    ``quiet`` it is put as any other.

    pykka's mailbox protocol (``put``, ``get``, ``empty``), read by the
    manager's thread alone. The messages wait in deques (appends and pops
    are atomic), numbered in the order put, and a ``queue.SimpleQueue`` (C,
    no condition variable) only wakes the reader: a sender takes no lock. A
    lock shared by many callers stalls them all behind whichever one the
    interpreter switched out while it held it (eight callers told three times
    slower).
    """

    def __init__(self, urgent: tuple[type, ...] = (), *, quiet: bool = False) -> None:
        #: The manager's own messages, which jump the queue.
        self.urgent = urgent or (Fired, Landed)
        #: Whether a message put with ``wake=False`` waits for the next one.
        self.quiet = quiet
        #: The envelope taken last: an ask whose answer comes later takes its reply.
        self.current: Any = None
        #: Set as the manager begins to stop: a message is then either in
        #: already (answered, or refused by the manager's last pass over the
        #: mailbox) or refused here, never left unread.
        self.closed = False
        #: One item per sender between its look at :attr:`closed` and its put
        #: (appends and pops are atomic): :meth:`close` waits until it is empty.
        self._putting: list[None] = []
        #: Set when :meth:`close` stopped waiting for a sender still putting:
        #: whatever that sender puts is read by nobody, so it is refused.
        self._late = False
        self._wake: queue.SimpleQueue[object] = queue.SimpleQueue()
        #: Numbers the messages as they are put (``next`` on it is atomic).
        self._numbers = itertools.count()
        #: The number of the message put last.
        self.last = -1
        #: (number, envelope) of the messages that jump the line.
        self._first: collections.deque[tuple[int, Any]] = collections.deque()
        #: (number, envelope) of every other message put with a wake.
        self._line: collections.deque[tuple[int, Any]] = collections.deque()
        #: (number, envelope) of the messages put without one.
        self._quiet: collections.deque[tuple[int, Any]] = collections.deque()

    def put(self, item: Any, /) -> None:
        """Add an envelope (pykka's mailbox protocol): see :meth:`post`."""
        self.post(item)

    def post(self, item: Any, /, *, wake: bool = True) -> int:
        """Add an envelope, the manager's own messages before every other; return its number.

        Raises:
            pykka.ActorDeadError: The manager is stopping.
        """
        putting = self._putting
        putting.append(None)
        try:
            if self.closed:
                raise pykka.ActorDeadError("the manager is stopping")
            numbered = (next(self._numbers), item)
            if type(item.message) in self.urgent:
                self._first.append(numbered)
                wake = True
            elif wake or not self.quiet:
                self._line.append(numbered)
                wake = True
            else:
                quiet = self._quiet
                quiet.append(numbered)
                wake = len(quiet) >= QUIET_MAX
            self.last = numbered[0]
            if wake:
                self._wake.put(_WAKE)
        finally:
            putting.pop()
        if self._late:
            # In after the manager's last look at its mailbox: never read.
            raise pykka.ActorDeadError("the manager is stopping")
        return numbered[0]

    def wake(self) -> None:
        """Wake the reader: what was put without a wake is read now."""
        self._wake.put(_WAKE)

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """Take the next envelope, waiting for one unless ``block`` is false.

        Raises:
            queue.Empty: Nothing came (``block`` false, or ``timeout`` passed).
        """
        while True:
            item = self._next()
            if item is not None:
                self.current = item
                return item
            # A wake left by a message taken already only brings us back here.
            self._wake.get(block, timeout)

    def _next(self) -> Any:
        """The next envelope: the oldest quiet one before what jumps, else as ``put`` says."""
        first, line, quiet = self._first, self._line, self._quiet
        if quiet:
            number = quiet[0][0]
            if not first or number < first[0][0]:
                # Read before what was put after it, and after the line put before it.
                return (line if line and line[0][0] < number else quiet).popleft()[1]
        if first:
            return first.popleft()[1]
        if line:
            return line.popleft()[1]
        return None

    def get_nowait(self) -> Any:
        """Take the next envelope.

        Raises:
            queue.Empty: The mailbox is empty.
        """
        return self.get(block=False)

    def empty(self) -> bool:
        """Whether no envelope is waiting (on the manager's thread, as ``get``)."""
        return not (self._first or self._line or self._quiet)

    def close(self) -> None:
        """Refuse every message from now on; return once every put begun before is in."""
        self.closed = True
        deadline = time.monotonic() + CLOSE_WAIT_S
        # A sender past its look at ``closed`` puts within a few bytecodes;
        # one held up there (a debugger, a signal handler on its thread) is
        # not waited for past the deadline: its put then refuses itself.
        while self._putting and time.monotonic() < deadline:
            time.sleep(0.0001)
        if self._putting:
            self._late = True


# -- the renewal thread -----------------------------------------------------------


@dataclass(slots=True)
class Flight:
    """A renewal on its way: its batch, and what waits for its answer."""

    due: list[str]
    tokens: list[str]
    #: The tick's time: the renewed locks' new stamp, in monotonic ms.
    at: int
    #: The oldest stamp of the batch, for the least margin a lock had.
    oldest: int
    #: The table's changes count when the batch was taken.
    changes: int
    #: How late the tick ran, in ms (0 off the grid).
    late_ms: int
    #: The locks of dead holders to delete first: ``(job_id, token)``.
    release: list[tuple[str, str]]
    #: Asked ticks to answer once the renewal's report was delivered.
    replies: list[pykka.Future[Any]] = field(default_factory=list)
    #: The numbers of the tells this tick made before its renewal: awaited by the replies too.
    told: range = range(0)


class Renewals(threading.Thread):
    """The thread a manager renews on: one batch at a time, each answer posted back (``post``)."""

    def __init__(
        self,
        name: str,
        queue_name: str,
        renewer: Renewer,
        lock_duration: int,
        clock: Callable[[], int],
        post: Callable[[Landed], None],
        records: RecordThread,
    ) -> None:
        super().__init__(name=name, daemon=True)
        records.attach(self)
        self._records = records
        self._queue_name = queue_name
        self._renewer = renewer
        self._lock_duration = lock_duration
        self._clock = clock
        self._post = post
        self._flights: queue.SimpleQueue[tuple[Flight, int] | None] = queue.SimpleQueue()

    def send(self, flight: Flight, calls: int) -> None:
        """Renew ``flight``'s batch (in ``calls`` script calls) and post the answer."""
        self._flights.put((flight, calls))

    def end(self) -> None:
        """Finish the renewal on its way, then end; wait for it (not from the thread itself)."""
        self._flights.put(None)
        if self.ident is not None and threading.current_thread() is not self:
            self.join(STOP_RENEWAL_S)
            if self.is_alive():
                logger.warning(
                    "LockManager for queue %r: its renewal did not end within %g s (a client "
                    "without a socket timeout?); its thread is left behind",
                    self._queue_name,
                    STOP_RENEWAL_S,
                    extra={"queue": self._queue_name},
                )

    def run(self) -> None:
        """Say once whether the server answers, then renew each batch sent."""
        with contextlib.suppress(BaseException):  # a renewer's own code: it must not end the thread
            probe = getattr(self._renewer, "probe", None)
            if probe is not None:
                probe()
        while (item := self._flights.get()) is not None:
            flight, calls = item
            started = time.perf_counter()
            released = self._release(flight.release)
            outcome: BatchOutcome | BaseException
            try:
                outcome, answered = self._renew(flight, calls)
            except BaseException as exc:
                # The span or the clock failed around the renewal: the tick
                # counts as failed (its jobs keep their stamps), the thread lives on.
                outcome, answered = exc, flight.at
            elapsed = (time.perf_counter() - started) * 1000
            with contextlib.suppress(pykka.ActorDeadError):  # stopping: nobody is left to tell
                self._post(Landed(outcome, answered, elapsed, released))

    def _renew(self, flight: Flight, calls: int) -> tuple[BatchOutcome | BaseException, int]:
        started = time.time_ns()
        outcome: BatchOutcome | BaseException
        try:
            # The one round trip: the scripts module, one EVALSHA per chunk.
            answer: object = self._renewer(flight.due, flight.tokens) if flight.due else None
            outcome = _checked(answer) if flight.due else BatchOutcome([], [])
        except BaseException as exc:
            # Nothing is known to have run (see Books.apply).
            outcome = exc
        answered = self._clock()
        if flight.due:
            # Its span is written after the fact: a span processor never holds up a renewal.
            margin = self._lock_duration - (answered - flight.oldest)
            facts = span_facts(outcome, calls, float(flight.late_ms), float(margin))
            ended = time.time_ns()
            self._records.put(tick_span, self._queue_name, len(flight.due), started, ended, facts)
        return outcome, answered

    def _release(self, locks: list[tuple[str, str]]) -> int | BaseException:
        if not locks:
            return 0
        try:
            release = getattr(self._renewer, "release", None)
            return 0 if release is None else int(release(locks))
        except BaseException as exc:
            return exc


# -- the manager ------------------------------------------------------------------


class LockManager(pykka.ThreadingActor):
    """Renews the locks of the jobs a worker holds on one queue.

    Start it with :func:`actors.start_link` (or ``LockManager.start(...)``
    with the same keywords). Talk to it with the module's helpers, with
    ``ref.proxy()``, or with the messages of :mod:`actors.messages`. With
    ``isolation="process"`` the same call starts the process-mode manager
    (:class:`actors.process.ProcessLockManager`).

    Args: the keywords of :func:`actors.start_link`, which says what each one
    does, and what it raises.
    """

    use_daemon_thread = True

    #: Whether an outbox's messages that change nothing are skipped (see ``_on_posted``).
    _skips_passing: ClassVar[bool] = True
    #: The manager class of each isolation mode but ``"thread"``.
    _kinds: ClassVar[dict[str, type[LockManager]]] = {}

    def __init_subclass__(cls, *, isolation: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if isolation is not None:
            LockManager._kinds[require_isolation(isolation)] = cls

    @classmethod
    def start(cls, *args: Any, **kwargs: Any) -> ManagerRef:
        """Start a manager of the ``isolation`` asked for; return its reference."""
        if cls is LockManager:
            kind = LockManager._kinds.get(require_isolation(kwargs.get("isolation", "thread")))
            if kind is not None:
                return kind.start(*args, **kwargs)
        ref = super().start(*args, **kwargs)
        assert isinstance(ref, ManagerRef)
        return ref

    @staticmethod
    def _create_actor_inbox() -> TicksFirst:
        # pykka's hook for an actor type's mailbox; the timer's grid reads the quiet tells.
        return TicksFirst(quiet=True)

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
        replicas: int | Replicas | None = None,
    ) -> None:
        if require_isolation(isolation) != "thread":
            raise TypeError(f"start a manager of isolation={isolation!r} with start_link")
        self._setup(
            keys=keys,
            lock_duration=lock_duration,
            lock_renew_time=lock_renew_time,
            on_lock_renewal_failed=on_lock_renewal_failed,
            on_locks_renewed=on_locks_renewed,
            on_error=on_error,
            max_batch=max_batch,
            max_hold=max_hold,
            clock=clock,
            timer=timer,
            safety_margin=safety_margin,
        )
        if renewer is None:
            if connection is None:
                raise TypeError("connection is required (a redis.Redis, a RedisCluster or a URL)")
            renewer = RedisRenewer(
                connection, keys, self._timing, self.safety_margin, self._max_batch, replicas
            )
        elif require_replicas(replicas) is not None:
            raise TypeError(
                "replicas= is for the Redis renewer: a renewer= confirms its own writes"
            )
        elif connection is not None:
            raise TypeError("pass connection or renewer, not both")
        elif not callable(renewer):
            raise TypeError(f"renewer must be callable, got {type(renewer).__name__}")
        self._renewer = renewer
        self._renewals = Renewals(
            f"LockManager-renewal-{self.queue_name}",
            self.queue_name,
            renewer,
            self._timing.lock_duration,
            self.clock,
            self._post,
            self._reporter.records,
        )
        #: The renewal on its way, if any, and the tick that waits for it to land.
        self._flight: Flight | None = None
        self._waiting: tuple[int | None, list[pykka.Future[Any]]] | None = None
        try:
            self._start_threads()
        except BaseException:
            _close_quietly(self.queue_name, "renewer", renewer)
            raise

    def _setup(
        self,
        *,
        keys: QueueKeys,
        lock_duration: int,
        lock_renew_time: int | None,
        on_lock_renewal_failed: Callable[[list[LostLock]], object] | None,
        on_locks_renewed: Callable[[list[str]], object] | None,
        on_error: Callable[[Exception], object] | None,
        max_batch: int,
        max_hold: int | None,
        clock: Callable[[], int] | None,
        timer: TimerFactory | None,
        safety_margin: int | None,
        validity: Callable[[str, int, int], Validity] | None = None,
    ) -> None:
        """Check the keywords both modes share and build what both keep (in the caller's thread)."""
        super().__init__()
        if not isinstance(keys, QueueKeys):
            raise TypeError(f"keys must be a QueueKeys, got {type(keys).__name__}")
        self._timing = timing = Timing(lock_duration, lock_renew_time)
        #: The default safety margin of a watched lock, in milliseconds.
        self.safety_margin = (
            default_safety_margin(timing)
            if safety_margin is None
            else check_safety_margin(safety_margin, timing)
        )
        for name, callback in (
            ("on_lock_renewal_failed", on_lock_renewal_failed),
            ("on_locks_renewed", on_locks_renewed),
            ("on_error", on_error),
            ("clock", clock),
            ("timer", timer),
        ):
            require_callback(callback, name)
        if clock is not None and (isinstance(probe := clock(), bool) or not isinstance(probe, int)):
            raise TypeError(
                f"clock must return int milliseconds (as time.monotonic_ns() // 1_000_000), "
                f"got {type(probe).__name__}"
            )
        self._max_hold = (
            None if max_hold is None else require_int(max_hold, "max_hold", maximum=MAX_DURATION_MS)
        )
        self._max_batch = require_int(max_batch, "max_batch")
        self.keys = keys
        self.queue_name = keys.name
        self.clock: Callable[[], int] = clock or monotonic_ms
        self._make_timer: TimerFactory = timer or self._thread_timer
        mailbox = self.actor_inbox
        assert isinstance(mailbox, TicksFirst)
        self._mailbox: TicksFirst = mailbox
        self._books = Books(timing.lock_duration, self.safety_margin, validity)
        self._reporter = Reporter(
            keys,
            timing,
            on_lock_renewal_failed,
            on_locks_renewed,
            on_error,
            tracked=self._books.jobs.__len__,
        )
        #: The thread user code runs on.
        self.delivery = self._reporter.thread
        #: What a track has to tell (kept empty until a track tells something).
        self._told = Report()
        self._alarm = Alarm(keys.name, self.clock, timing.interval)
        #: The manager's own thread, once it has started.
        self.thread: threading.Thread | None = None
        # The reference every caller gets: it checks each door in the
        # caller's thread (see actors.ref); pykka offers no other hook.
        self._actor_ref = ManagerRef(self, self)

    def _thread_timer(self, fire: Callable[[int], None], name: str) -> Timer:
        return ThreadTimer(fire, name, self.clock, records=self._reporter.records)

    def trusted_for(self, safety_margin: int | None = None) -> int:
        """Return how long a watched lock is trusted after a confirmed renewal's send, in ms.

        Thread-safe. Raises ``TypeError``/``ValueError`` for a bad ``safety_margin``.
        """
        timing = self._timing
        if safety_margin is None:
            return timing.lock_duration - self.safety_margin
        return timing.lock_duration - check_safety_margin(safety_margin, timing)

    def flush(self, timeout: float) -> bool:
        """Return once every target told so far was told and every record so far written.

        Thread-safe; for tests and diagnostics: an asked tick answers once its
        own report is delivered and its targets told, and its log lines follow.
        ``False`` after ``timeout`` seconds (a target or a log handler that blocks).
        """
        return self._reporter.flush(timeout)

    def runs_user_code(self, thread: threading.Thread) -> bool:
        """Whether ``thread`` runs user code for this manager (callbacks, targets, records)."""
        return self._reporter.owns(thread)

    @property
    def replicas(self) -> Replicas | None:
        """The replicas each renewal waits for, or ``None`` (a ``renewer=`` confirms its own)."""
        confirm: Replicas | None = getattr(self._renewer, "replicas", None)
        return confirm

    def fencing(self) -> tuple[Client, QueueKeys]:
        """Return the client and keys a lease takes its fence with (thread-safe).

        Raises:
            RuntimeError: The manager renews through a renewer with no client.
        """
        client = getattr(self._renewer, "connection", None)
        if client is None:
            raise RuntimeError(
                "this manager renews through a renewer with no connection: take the fence "
                "with actors.fence(client, keys, job_id, token)"
            )
        return client, self.keys

    def taker(self) -> Callable[..., Any] | None:
        """Return ``None``: this manager renews from the worker, which runs such a script itself."""
        return None

    def failures(self) -> str:
        """The ticks failed since the last that worked (read from any thread: a snapshot)."""
        return self._reporter.counters.failures()

    def outbox(self) -> Outbox:
        """Return a new :class:`Outbox` of this manager (thread-safe)."""
        return Outbox(self._mailbox, self.clock)

    # -- life -----------------------------------------------------------------------

    def _start_threads(self) -> None:
        """Start the threads and arm the first tick, in the caller's thread, once all is checked."""
        timer = self._make_timer(self._fire, f"LockManager-timer-{self.queue_name}")
        self._reporter.start()
        self._renewals.start()
        self._alarm.start(timer)

    def on_start(self) -> None:
        """Say the manager started (its threads run already)."""
        self.thread = threading.current_thread()
        self._reporter.records.attach()
        logger.debug(
            "LockManager for queue %r started: lock_duration=%d ms, interval=%d ms",
            self.queue_name,
            self._timing.lock_duration,
            self._timing.interval,
        )

    def on_stop(self) -> None:
        """Tell every watcher that nobody renews its lock now; end the threads, close the client."""
        self._shutdown()

    def on_failure(self, *_exc_info: object) -> None:
        """Likewise if the actor dies: nobody renews those locks now."""
        self._shutdown()

    def _shutdown(self) -> None:
        # From here on every sender is refused.
        self._mailbox.close()
        report = Report()
        self._books.let_go(report)
        asks = self._refuse_the_rest(report)
        self._reporter.send(report)
        self._reporter.meters.close()
        error = ManagerStopped(f"LockManager for queue {self.queue_name!r} is stopped")
        for reply in asks:
            reply.set_exception((ManagerStopped, error, None))
        # Waits for the renewal on its way, if any: nobody asking waits with it.
        self._close_parts()
        logger.debug("LockManager for queue %r stopped", self.queue_name)
        # Last: its end writes what the manager logged, the stop's own lines included.
        self.delivery.end()

    def _close_parts(self) -> None:
        flight, self._flight = self._flight, None
        waiting, self._waiting = self._waiting, None
        for reply in [*(flight.replies if flight else []), *(waiting[1] if waiting else [])]:
            reply.set(None)  # the tick ran, or had nothing to renew that still matters
        _close_quietly(self.queue_name, "timer", self._alarm.close())
        _close_quietly(self.queue_name, "renewal thread", self._renewals, "end")
        _close_quietly(self.queue_name, "renewer", self._renewer)

    def _refuse_the_rest(self, report: Report) -> list[pykka.Future[Any]]:
        """Take the mailbox's rest; return its asks, to answer as stopped.

        An untold ``TrackJob`` target hears ``"manager_stopped"``; a second stop gets ``None``.
        """
        told = {(id(target), message.job_id) for target, message in report.tells}
        lost = self._books.lost
        asks: list[pykka.Future[Any]] = []
        while True:
            try:
                envelope = self._mailbox.get_nowait()
            except queue.Empty:
                return asks
            message = envelope.message
            posted = message.take() if type(message) is Posted else [(message, None)]
            for item, reply in posted:
                if reply is not None:
                    reply.value = None
                if type(item) is m.TrackJob and item.notify is not None:
                    target, job_id, token = item.notify, item.job_id, item.token
                    if (id(target), job_id) not in told and not lost.was_told(
                        job_id, token, target
                    ):
                        told.add((id(target), job_id))
                        report.tells.append((target, LockLost(job_id, token, MANAGER_STOPPED)))
            if envelope.reply_to is None:
                continue
            if type(message) is _ActorStop:
                envelope.reply_to.set(None)
            else:
                asks.append(envelope.reply_to)

    def _fire(self, at: int) -> None:
        # On the timer's thread: the fire jumps the queue (see TicksFirst).
        self._mailbox.put(Envelope(Fired(at), reply_to=None))

    def _post(self, landed: Landed) -> None:
        # On the renewal thread: the answer jumps the queue too.
        self._mailbox.put(Envelope(landed, reply_to=None))

    # -- messages -------------------------------------------------------------------

    def _handle_receive(self, message: Any) -> Any:
        # pykka's dispatch looks for its own messages first: the manager's go straight in.
        if type(message) in self._handlers:
            return self.on_receive(message)
        return super()._handle_receive(message)

    def on_receive(self, message: Any) -> Any:
        """Handle one message; a malformed or unknown one is logged and dropped."""
        handler = self._handlers.get(type(message))
        try:
            if handler is None:
                logger.warning(
                    "LockManager for queue %r ignored an unknown %s message",
                    self.queue_name,
                    type(message).__name__,
                    extra={"queue": self.queue_name},
                )
                return None
            return handler(self, message)
        except BaseException:
            # A BaseException too (pykka would stop every actor); no repr: it is the sender's code.
            logger.warning(
                "LockManager for queue %r dropped a %s message",
                self.queue_name,
                type(message).__name__,
                exc_info=True,
                extra={"queue": self.queue_name},
            )
            with contextlib.suppress(BaseException):
                self._arm()  # whatever failed, the next tick still comes
            return None

    def _reply_later(self) -> pykka.Future[Any] | None:
        """Take the current ask's reply, to set it later; ``None`` for a tell."""
        envelope = self._mailbox.current
        reply: pykka.Future[Any] | None = envelope.reply_to
        envelope.reply_to = None  # pykka then sets nothing
        return reply

    def _on_track(self, message: m.TrackJob) -> Validity | None:
        """``handle_cast({:track_job, job_id, token, ts})``: add the claim."""
        job_id, notify = message.job_id, message.notify
        margin = message.safety_margin
        if margin is not None:
            # Checked against this manager's windows.
            margin = check_safety_margin(margin, self._timing)
        now = self._alarm.now(message.ts or 0)
        # A stamp is never later than now: a lock never looks younger than it is.
        ts = now if message.ts is None or message.ts > now else message.ts
        hold = self._max_hold if message.max_hold is None else message.max_hold
        # Kept empty between tracks: a track seldom has anything to tell.
        report = self._told
        made = self._books.track(
            job_id, message.token, ts, notify, hold, message.keep, margin, report, message.releasing
        )
        if report.tells:
            # Told at once: the old lock's targets learn it is another run's now.
            self._told = Report()
            self._reporter.send(report)
        if not made or notify is None:
            return None
        validity = self._books.jobs.valid.get(job_id)
        if validity is not None:
            self._alarm.sooner(self._books.jobs.deadlines.earliest)
        # The lock's validity, for a lease to read its deadline itself.
        return validity

    def _on_untrack(self, message: m.UntrackJob) -> None:
        """``handle_cast({:untrack_job, job_id})``: end the caller's claims."""
        self._books.jobs.untrack(message.job_id, message.token, message.notify)

    def _on_posted(self, message: Posted) -> None:
        """An outbox's tracks and untracks, in order, each answered in its reply.

        The messages of a job this manager does not track, which one claim
        tracks and then untracks, change nothing: they are skipped.
        """
        items = message.take()
        books = self._books
        skipped = _passing(
            items,
            lambda job_id, token: (
                job_id not in books.jobs and not (books.lost and books.lost.get(job_id, token))
            ),
        )
        if not self._skips_passing:
            skipped.clear()
        for item, reply in items:
            if item.job_id in skipped:
                reply.value = None
            else:
                reply.value = self.on_receive(item)

    # -- the tick -------------------------------------------------------------------

    def _on_extend(self, message: m.ExtendLocks) -> None:
        """``handle_info(:extend_locks)``: renew every due lock, then arm the next tick."""
        reply = self._reply_later()
        try:
            self._on_time(message.scheduled, reply)
        except BaseException:
            if reply is not None:
                reply.set_exception()
            raise

    def _on_fired(self, message: Fired) -> None:
        self._on_time(message.at, None)

    def _on_time(self, scheduled: int | None, reply: pykka.Future[Any] | None) -> None:
        replies = [] if reply is None else [reply]
        taken = self._alarm.take(scheduled)
        if taken is None:
            self._reporter.send(Report(), replies)
            return
        kind, now, at, late = taken
        if kind == "deadline":
            # The fire at a watched lock's deadline: tell who is past it, nothing else.
            report = Report()
            self._books.unconfirmed(now, report, why=self._why(late))
            self._arm()
            self._reporter.send(report, replies)
            return
        self._reporter.counters.ticks += 1
        if kind == "grid":
            self._alarm.advance(at, now)
            self._reporter.late(now - at)
        if self._flight is not None:
            # One renewal at a time: this tick runs once the one on its way lands.
            grid, waiting = self._waiting or (None, [])
            self._waiting = (at if kind == "grid" else grid, waiting + replies)
            self._arm()
            return
        self._renew(now, at, late, replies)

    def _renew(self, now: int, at: int, late: int, replies: list[pykka.Future[Any]]) -> None:
        """Let go of what is past its limits, send what is due, say what was decided."""
        books, jobs = self._books, self._books.jobs
        report = Report()
        orphans: list[tuple[str, str]] = []
        if jobs.watches:
            books.expire_holds(now, report)
            orphans = self._bury(report)
        if jobs.valid:
            books.unconfirmed(now, report, why=self._why(late))
        due, tokens, oldest = jobs.due(at, self._timing.threshold)
        self._arm()
        if not (due or orphans):
            self._reporter.send(report, replies)
            return
        told = range(0)
        if report:
            # What this tick decided is told now, not once the renewal lands.
            told = self._reporter.send(report)
        oldest = at if oldest is None else oldest
        flight = Flight(due, tokens, at, oldest, jobs.changes, late, orphans, replies, told)
        self._flight = flight
        self._renewals.send(flight, -(-len(due) // self._max_batch))

    def _bury(self, report: Report) -> list[tuple[str, str]]:
        """End the claims of the holders that died; return the locks no claim holds any more."""
        ended, orphans = self._books.bury(report)
        for job_id in ended:
            logger.warning(
                "LockManager for queue %r: a holder of job %r is no longer alive and did not "
                "untrack it; its claim ends%s",
                self.queue_name,
                job_id,
                "" if job_id in self._books.jobs else ", and its lock is deleted if still held",
                extra={"queue": self.queue_name, "job_id": job_id},
            )
        return orphans

    def _on_landed(self, landed: Landed) -> None:
        flight, self._flight = self._flight, None
        if flight is None:
            return
        if isinstance(landed.released, BaseException):
            logger.warning(
                "LockManager for queue %r: could not delete the locks of dead holders: %s: %s",
                self.queue_name,
                type(landed.released).__name__,
                landed.released,
                extra={"queue": self.queue_name},
            )
        report = Report()
        whole = self._books.renewed_whole(flight.due, landed.outcome, flight.changes)
        if whole:
            # Stamped once the report is on its way: only this thread reads
            # the stamps, and it reads them after this handler. (A copy for
            # the callback, which may change its list meanwhile.)
            report.renewed.extend(flight.due)
        else:
            self._books.apply(
                flight.due,
                flight.tokens,
                landed.outcome,
                flight.at,
                landed.answered,
                report,
                changes=flight.changes,
                why=self._why(0),
            )
        self._renewed(report, len(flight.due), flight, landed)
        self._arm()
        self._reporter.send(report, flight.replies, flight.told)
        if whole:
            # In slices, yielding between them: the delivery and the asker it
            # wakes need not wait for all of them.
            self._books.jobs.stamp(flight.due, flight.at, pause=yield_interpreter)
        if self._waiting is not None:
            grid, replies = self._waiting
            self._waiting = None
            now = self._alarm.now(landed.answered)
            at = now if grid is None else grid
            self._renew(now, at, max(0, now - at) if grid is not None else 0, replies)

    def _renewed(self, report: Report, jobs: int, flight: Flight, landed: Landed) -> None:
        """Count a renewal, and try again soon after a failed one."""
        counters = self._reporter.counters
        if jobs:
            calls = -(-jobs // self._max_batch)
            self._reporter.batch(jobs, calls, landed.elapsed_ms)
        margin = self._timing.lock_duration - (landed.answered - flight.oldest)
        self._reporter.renewal(report, landed.answered, margin if jobs else None)
        if report.error is None:
            self._alarm.retry_at(None)
            return
        # The jobs of a failed renewal keep their stamps: a renew-now soon finds
        # them due again, on a new connection, as soon as the server answers.
        pause = min(self._timing.interval // 4, RETRY_MS << min(counters.failed_streak - 1, 16))
        self._alarm.retry_at(landed.answered + max(1, pause))

    def _arm(self) -> None:
        jobs = self._books.jobs
        self._alarm.arm(jobs.deadlines.earliest if jobs.valid else None)

    def _why(self, late_ms: int) -> str:
        """What else a loss found now says: the ticks failed since, a pause of the process."""
        facts = [self._reporter.counters.failures()]
        if late_ms > resolution_ms():
            facts.append(f"the manager did not run for {late_ms} ms past its timer (a pause)")
        return "; ".join(filter(None, facts))

    # -- the doors of a pykka proxy (the reference turns each call into its message;
    # a body runs only for a message handed to the actor some other way)

    def track_job(self, *args: Any, **kwargs: Any) -> None:
        """Renew a job's lock (see :class:`~actors.TrackJob`)."""
        self.on_receive(m.TrackJob(*args, **kwargs))

    def untrack_job(self, *args: Any, **kwargs: Any) -> None:
        """End claims on a job's lock (see :class:`~actors.UntrackJob`)."""
        self.on_receive(m.UntrackJob(*args, **kwargs))

    def get_active_job_count(self) -> int:
        """Return how many jobs are tracked."""
        return len(self._books.jobs)

    def get_tracked_job_ids(self) -> list[str]:
        """Return the ids of the tracked jobs."""
        return self._books.jobs.ids()

    def is_tracked(self, job_id: str) -> bool:
        """Return whether ``job_id`` is tracked."""
        return job_id in self._books.jobs

    def get_stats(self) -> Stats:
        """Return a snapshot of the manager's counters."""
        counters = self._reporter.counters
        now = self._alarm.now(0)
        dropped = self._reporter.records.dropped
        return counters.snapshot(self.queue_name, len(self._books.jobs), now, dropped)

    def extend_locks(self) -> None:
        """Renew every due lock now; the timer's grid is left alone."""
        self._on_time(None, None)

    #: Each message's handler: an operation is a row here, its message and its helper.
    _handlers: ClassVar[dict[type, Callable[[Any, Any], Any]]] = {
        m.TrackJob: _on_track,
        m.UntrackJob: _on_untrack,
        Posted: _on_posted,
        # The queries' handlers are their proxy doors.
        m.GetActiveJobCount: lambda self, _: self.get_active_job_count(),
        m.GetTrackedJobIds: lambda self, _: self.get_tracked_job_ids(),
        m.IsTracked: lambda self, message: self.is_tracked(message.job_id),
        m.GetStats: lambda self, _: self.get_stats(),
        m.ExtendLocks: _on_extend,
        Fired: _on_fired,
        Landed: _on_landed,
    }


def _passing(
    items: list[tuple[m.TrackJob | m.UntrackJob, Reply]], unknown: Callable[[str, str], bool]
) -> set[str]:
    """The jobs whose messages among ``items`` change nothing.

    One claim (a token and a target) tracks the job first and untracks it
    last, no other message names it, and the books know nothing of the job
    and token (``unknown``): a claim made and ended, with nobody to tell.
    """
    claims: dict[str, tuple[str, int] | None] = {}
    last: dict[str, bool] = {}
    for item, _ in items:
        job_id = item.job_id
        if type(item) is m.TrackJob:
            claim = (item.token, id(item.notify))
            if job_id not in claims:
                claims[job_id] = claim if item.notify is not None else None
            elif claims[job_id] != claim:
                claims[job_id] = None
            last[job_id] = False
        else:
            if claims.get(job_id) != (item.token, id(item.notify)):
                claims[job_id] = None
            last[job_id] = True
    return {
        job_id
        for job_id, claim in claims.items()
        if claim is not None and last[job_id] and unknown(job_id, claim[0])
    }


def _checked(answer: object) -> BatchOutcome:
    """Return a renewer's answer if it is a well-formed :class:`BatchOutcome`, else raise."""
    if not isinstance(answer, BatchOutcome):
        raise TypeError(f"the renewer returned {type(answer).__name__}, not a BatchOutcome")
    reasons = answer.reasons
    if not (
        _all(answer.failed, list, str)
        and _all(answer.errors, list, ChunkError)
        and _all(reasons, dict, str)
        and all(type(reason) is str for reason in reasons.values())
    ):
        raise TypeError("the renewer returned a malformed BatchOutcome (see actors.messages)")
    return answer


def _all(items: object, kind: type, item: type) -> bool:
    """Whether ``items`` is exactly a ``kind`` of exactly ``item`` members (a dict: keys)."""
    return type(items) is kind and all(type(each) is item for each in items)  # type: ignore[attr-defined]


def _close_quietly(queue_name: str, what: str, part: object, method: str = "close") -> None:
    """Call the part's ``close()`` (or ``method``), if it has one; log a failure, never raise."""
    close = getattr(part, method, None)
    if close is None:
        return
    try:
        close()
    except BaseException:
        # Left to pykka, a BaseException here would stop every actor.
        logger.warning(
            "LockManager for queue %r: closing its %s failed",
            queue_name,
            what,
            exc_info=True,
            extra={"queue": queue_name},
        )
