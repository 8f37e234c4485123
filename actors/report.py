"""What a manager tells the world: counters, records, and user code on threads of its own.

The :class:`Reporter` counts on the manager's thread and hands what it has to
say to three kinds of thread, none of which the manager waits for: its
records (log lines, measurements) to the record thread
(:class:`~actors.telemetry.RecordThread`), each :class:`~actors.books.Report`'s
callbacks to the delivery thread, in order, and the lost locks' targets to
the tellers (:class:`Tellers`). No user code runs on the manager's thread: a
callback finds the manager whole and cannot keep it from renewing, and a slow
callback or target delays no target's warning but its own.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import pykka

from actors.messages import EXPIRED
from actors.telemetry import Log, Meters, RecordThread
from actors.timing import resolution_ms

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from actors.books import Report
    from actors.keys import QueueKeys
    from actors.messages import LockLost, LostLock, Notify
    from actors.timing import Timing

__all__ = [
    "STOP_WAIT_S",
    "Counters",
    "DeliveryThread",
    "Reporter",
    "Stats",
    "Tellers",
]

logger = Log("actors.lock_manager")

#: Threads telling targets past which a WARNING says that targets' ``tell`` hold them up.
WARN_TELLERS: Final = 64
#: Seconds the tellers wait for a busy teller to be free before they start another.
HELD_UP_S: Final = 0.01
#: Most seconds a stopping manager waits for its last tells and records.
STOP_WAIT_S: Final = 1.0

#: Most ids one loss warning lists; the count is always exact.
_SHOWN = 20


@dataclass(frozen=True, slots=True)
class Stats:
    """A snapshot of one manager's counters, from :func:`actors.get_stats`."""

    #: Queue name the manager renews for.
    queue: str
    #: Ticks handled so far (the timer's and manual ones), with or without due jobs.
    ticks: int
    #: Lock renewals that succeeded, counted per job.
    renewed: int
    #: Jobs reported lost (lock gone, held by another token, or held past ``max_hold``).
    lost: int
    #: Ticks whose Redis call failed, in whole or in part.
    errors: int
    #: Script calls the ticks sent or tried to send (one per ``max_batch``
    #: due jobs, counted even when the connection failed).
    script_calls: int
    #: Jobs tracked now.
    tracked: int
    #: Due jobs the last renewing tick sent; ``0`` before the first one.
    last_batch: int
    #: Duration of the last renewing tick (the round trip and the bookkeeping,
    #: not the callbacks), in milliseconds.
    last_tick_ms: float
    #: Duration of the longest renewing tick so far, in milliseconds.
    max_tick_ms: float
    #: Milliseconds since the last tick that renewed at least one lock,
    #: on the monotonic clock; ``None`` before the first one.
    last_renewal_age_ms: float | None
    #: How late the last timer tick ran against its grid time, in milliseconds.
    tick_lateness_ms: float = 0.0
    #: How late the latest-running timer tick so far ran, in milliseconds.
    max_tick_lateness_ms: float = 0.0
    #: The least time a lock had left when its renewal's answer came back, in
    #: milliseconds (never overstated); ``None`` before the first renewal.
    min_lock_margin_ms: float | None = None
    #: Ticks that sent due jobs to the server (their renewal failed or not).
    renewing_ticks: int = 0
    #: Log lines, measurements and spans dropped: the application's handler,
    #: meter or span processor raised, or fell :data:`~actors.telemetry.MAX_WAITING_RECORDS` behind.
    records_dropped: int = 0


class Counters:
    """The running counts behind :class:`Stats`, kept on the manager's thread."""

    __slots__ = (
        "errors",
        "failed_streak",
        "last_batch",
        "last_error",
        "last_renewal",
        "last_tick_ms",
        "lateness_ms",
        "lost",
        "max_lateness_ms",
        "max_tick_ms",
        "min_margin_ms",
        "renewed",
        "renewing_ticks",
        "script_calls",
        "ticks",
    )

    def __init__(self) -> None:
        self.ticks = 0
        self.renewed = 0
        self.lost = 0
        self.errors = 0
        self.script_calls = 0
        self.renewing_ticks = 0
        self.last_batch = 0
        self.last_tick_ms = 0.0
        self.max_tick_ms = 0.0
        #: Monotonic ms of the last tick that renewed a lock.
        self.last_renewal: int | None = None
        self.lateness_ms = 0.0
        self.max_lateness_ms = 0.0
        self.min_margin_ms: float | None = None
        #: Ticks whose Redis call failed since the last one that worked.
        self.failed_streak = 0
        #: The last failed tick's error, as ``"Type: message"``, or ``""``.
        self.last_error = ""

    def batch(self, jobs: int, calls: int, elapsed_ms: float) -> None:
        """Count one renewing tick: how many jobs it sent, in how many calls, how long it took."""
        self.renewing_ticks += 1
        self.script_calls += calls
        self.last_batch = jobs
        self.last_tick_ms = elapsed_ms
        self.max_tick_ms = max(self.max_tick_ms, elapsed_ms)

    def margin(self, margin_ms: float) -> None:
        """Record the least time a renewed lock had left."""
        if self.min_margin_ms is None or margin_ms < self.min_margin_ms:
            self.min_margin_ms = margin_ms

    def failures(self) -> str:
        """Say how many ticks failed since the last that worked, and with what; ``""`` if none."""
        if not self.failed_streak:
            return ""
        return f"{self.failed_streak} tick(s) failed since, the last with {self.last_error}"

    def snapshot(self, queue: str, tracked: int, now: int, dropped: int = 0) -> Stats:
        """Return the counts as a :class:`Stats`, ``now`` in monotonic ms."""
        last = self.last_renewal
        return Stats(
            queue=queue,
            ticks=self.ticks,
            renewed=self.renewed,
            lost=self.lost,
            errors=self.errors,
            script_calls=self.script_calls,
            tracked=tracked,
            last_batch=self.last_batch,
            last_tick_ms=self.last_tick_ms,
            max_tick_ms=self.max_tick_ms,
            last_renewal_age_ms=None if last is None else float(now - last),
            tick_lateness_ms=self.lateness_ms,
            max_tick_lateness_ms=self.max_lateness_ms,
            min_lock_margin_ms=self.min_margin_ms,
            renewing_ticks=self.renewing_ticks,
            records_dropped=dropped,
        )


class _Done:
    """Sets a step's replies once each part of its report is delivered or told."""

    __slots__ = ("_left", "_lock", "_replies")

    def __init__(self, parts: int, replies: Sequence[pykka.Future[Any]]) -> None:
        self._left = parts
        self._lock = threading.Lock()
        self._replies = replies

    def __call__(self) -> None:
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            for reply in self._replies:
                reply.set(None)


def _nothing() -> None:
    pass


class DeliveryThread(threading.Thread):
    """The thread a manager calls its callbacks on, one report after another."""

    def __init__(
        self, name: str, deliver: Callable[[Report], None], ending: Callable[[], None]
    ) -> None:
        super().__init__(name=name, daemon=True)
        self._deliver = deliver
        self._ending = ending
        self._queue: queue.SimpleQueue[tuple[Report, Callable[[], None]] | None]
        self._queue = queue.SimpleQueue()

    def put(self, report: Report, then: Callable[[], None] = _nothing) -> None:
        """Queue ``report``; call ``then`` once it is delivered."""
        self._queue.put((report, then))

    def end(self) -> None:
        """Deliver what is queued, then end."""
        self._queue.put(None)

    def run(self) -> None:
        """Deliver each report, then call its ``then``; until :meth:`end`."""
        while (item := self._queue.get()) is not None:
            report, then = item
            try:
                self._deliver(report)
            except BaseException:
                pass  # each callback's failure is logged by itself: the next report goes on
            finally:
                then()
        self._ending()


#: What a teller is handed: one target, the messages of one report for it, and their numbers.
_Group = tuple["Notify", list["LockLost"], range]


class _Teller(threading.Thread):
    """A thread of :class:`Tellers`: it tells one target at a time (user code runs on it)."""

    def __init__(self, tellers: Tellers, name: str) -> None:
        super().__init__(name=name, daemon=True)
        #: The pool it belongs to.
        self.tellers = tellers
        self.groups: queue.SimpleQueue[_Group | None] = queue.SimpleQueue()
        #: Groups handed to it and not told yet (under the pool's lock).
        self.load = 0

    def run(self) -> None:
        """Tell each group handed over; until handed ``None``."""
        while (group := self.groups.get()) is not None:
            target, messages, numbers = group
            try:
                _tell(self.tellers.queue_name, target, messages)
            finally:
                self.tellers.told(self, target, numbers)


class Tellers(threading.Thread):
    """Tells the targets of lost locks, each target on one thread of the pool at a time.

    The manager hands each report's tells to this thread in one put. It gives
    a target's messages to the teller telling that target already, if one
    is (so a target hears its messages in order, one at a time), else to an
    idle teller, else, if none is freed within :data:`HELD_UP_S`, to a new
    one: a teller whose target's ``tell`` blocks (against
    :class:`~actors.Notify`'s rule) holds up only that target. Past
    :data:`WARN_TELLERS` threads, a WARNING says so, once.
    """

    def __init__(self, queue_name: str, records: RecordThread) -> None:
        super().__init__(name=f"LockManager-tellers-{queue_name}", daemon=True)
        self.queue_name = queue_name
        self._records = records
        records.attach(self)
        self._inbox: queue.SimpleQueue[list[_Group] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._tellers: list[_Teller] = []
        self._idle: queue.SimpleQueue[_Teller] = queue.SimpleQueue()
        #: The teller telling each target now, by the target's id (its load counts the groups).
        self._telling: dict[int, _Teller] = {}
        #: The numbers of the tells not done yet, the last number given, and
        #: who waits for which numbers.
        self._pending: set[int] = set()
        self._last = 0
        self._waiting: list[tuple[set[int], Callable[[], None]]] = []
        self._warned = False

    def tell(self, tells: Sequence[tuple[Notify, LockLost]]) -> range:
        """Tell each target its messages (in order, one thread a target); return their numbers."""
        groups: dict[int, tuple[Notify, list[LockLost]]] = {}
        for target, message in tells:
            groups.setdefault(id(target), (target, []))[1].append(message)
        with self._lock:
            first = self._last + 1
            self._last += len(tells)
            self._pending.update(range(first, self._last + 1))
        handed: list[_Group] = []
        number = first
        for target, messages in groups.values():
            handed.append((target, messages, range(number, number + len(messages))))
            number += len(messages)
        self._inbox.put(handed)
        return range(first, first + len(tells))

    def when_told(self, numbers: Iterable[int] | None, then: Callable[[], None]) -> None:
        """Call ``then`` once the tells of ``numbers`` (``None``: all so far) are done."""
        with self._lock:
            left = set(self._pending) if numbers is None else self._pending.intersection(numbers)
            if left:
                self._waiting.append((left, then))
                return
        then()

    def owns(self, thread: threading.Thread) -> bool:
        """Whether ``thread`` is this pool's (its dispatcher or a teller)."""
        return thread is self or getattr(thread, "tellers", None) is self

    def end(self, deadline: float) -> None:
        """Tell what is queued, then end the threads; wait until ``deadline`` (monotonic s).

        Whoever still waits for a tell then (held up in a target) is let go.
        """
        self._inbox.put(None)
        here = threading.current_thread()
        if self.ident is not None and here is not self:
            self.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            tellers = list(self._tellers)
        for teller in tellers:
            if teller.ident is not None and teller is not here:
                teller.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            waiting, self._waiting = self._waiting, []
        for _, then in waiting:
            then()

    def run(self) -> None:
        """Hand each group to a teller; until :meth:`end`."""
        while (groups := self._inbox.get()) is not None:
            for group in groups:
                self._hand(group)
        with self._lock:
            tellers = list(self._tellers)
        for teller in tellers:
            teller.groups.put(None)

    def told(self, teller: _Teller, target: Notify, numbers: range) -> None:
        """A teller told ``target`` the tells of ``numbers``: set who waited for them."""
        with self._lock:
            self._pending.difference_update(numbers)
            for waiting in self._waiting:
                waiting[0].difference_update(numbers)
            ready = [then for left, then in self._waiting if not left]
            if ready:
                self._waiting = [w for w in self._waiting if w[0]]
            teller.load -= 1
            if not teller.load:
                self._telling.pop(id(target), None)
                self._idle.put(teller)
        for then in ready:
            then()

    def _hand(self, group: _Group) -> None:
        target = group[0]
        with self._lock:
            teller = self._telling.get(id(target))
            if teller is not None:
                teller.load += 1
        if teller is None:
            teller = self._teller()
            with self._lock:
                teller.load += 1
                self._telling[id(target)] = teller
        teller.groups.put(group)

    def _teller(self) -> _Teller:
        """An idle teller; a new one if none is freed within :data:`HELD_UP_S`."""
        with contextlib.suppress(queue.Empty):
            return self._idle.get(timeout=HELD_UP_S if self._tellers else 0)
        count = len(self._tellers)
        if count >= WARN_TELLERS and not self._warned:
            self._warned = True
            logger.warning(
                "LockManager for queue %r: %d threads tell targets, most of them held up in "
                "a target's tell() (a tell must not block): each holds up its own target only",
                self.queue_name,
                count,
                extra={"queue": self.queue_name},
            )
        teller = _Teller(self, f"LockManager-tell-{self.queue_name}-{count}")
        self._records.attach(teller)
        while True:
            try:
                teller.start()
                break
            except RuntimeError:
                logger.warning(
                    "LockManager for queue %r: no thread could be started to tell a target; "
                    "trying again, or waiting for one to be free",
                    self.queue_name,
                    exc_info=True,
                    extra={"queue": self.queue_name},
                )
            with contextlib.suppress(queue.Empty):
                return self._idle.get(timeout=1.0)
        with self._lock:
            self._tellers.append(teller)
        return teller


class TellsInBatches:
    """A target of this package's own that takes the messages of one report in one call."""

    def tell_batch(self, messages: list[LockLost]) -> None:
        """Take ``messages``, each a :class:`~actors.LockLost` of one report."""
        raise NotImplementedError


def _tell(queue_name: str, target: Notify, messages: list[LockLost]) -> None:
    # The target's class, read without running its code: only this package's take a batch.
    if issubclass(type(target), TellsInBatches):
        _attempt(queue_name, target, lambda: target.tell_batch(messages), messages)  # type: ignore[attr-defined]
        return
    for message in messages:
        _attempt(queue_name, target, lambda m=message: target.tell(m), [message])  # type: ignore[misc]


def _attempt(
    queue_name: str, target: Notify, tell: Callable[[], object], messages: list[LockLost]
) -> None:
    try:
        tell()
    except pykka.ActorDeadError:
        # The holder is gone: nobody is left to tell.
        logger.debug("LockManager for queue %r: a dead target skipped", queue_name)
    except BaseException:
        logger.warning(
            "LockManager for queue %r: could not tell a %s that job %s lost its lock",
            queue_name,
            type(target).__name__,
            ", ".join(repr(message.job_id) for message in messages),
            exc_info=True,
            extra={"queue": queue_name},
        )


def on_a_delivery_thread() -> bool:
    """Whether the caller is user code of a manager (a callback, a target, a log handler)."""
    return isinstance(threading.current_thread(), (DeliveryThread, _Teller, RecordThread))


class Reporter:
    """Counts and logs on the manager's thread; delivers on the manager's delivery thread.

    ``on_failed``, ``on_renewed`` and ``on_error`` (each may be ``None``) get
    the lost jobs, the renewed ids and a failed tick's error.
    """

    def __init__(
        self,
        keys: QueueKeys,
        timing: Timing,
        on_failed: Callable[[list[LostLock]], object] | None,
        on_renewed: Callable[[list[str]], object] | None,
        on_error: Callable[[Exception], object] | None,
        tracked: Callable[[], int] = lambda: 0,
    ) -> None:
        self.counters = Counters()
        #: The thread the manager's log lines, measurements and spans are written on.
        self.records = RecordThread(f"LockManager-records-{keys.name}")
        #: The metric instruments' recorder; ``tracked`` tells the gauge the locks tracked.
        self.meters = Meters(keys.name, tracked, self.records.put)
        self._keys = keys
        self._timing = timing
        self._on_failed = on_failed
        self._on_renewed = on_renewed
        self._on_error = on_error
        self._late_streak = 0
        self._hinted = False
        #: The thread callbacks run on.
        self.thread = DeliveryThread(f"LockManager-delivery-{keys.name}", self._deliver, self._end)
        self.records.attach(self.thread)
        #: The threads targets are told on.
        self.tellers = Tellers(keys.name, self.records)

    @property
    def wants_renewed(self) -> bool:
        """Whether somebody listens to ``on_locks_renewed``."""
        return self._on_renewed is not None

    # -- on the manager's thread -------------------------------------------------

    def late(self, late_ms: int) -> None:
        """Record how late a timer tick ran; warn when over a quarter of the renew window."""
        counters = self.counters
        self.meters.late(late_ms)
        counters.lateness_ms = float(late_ms)
        counters.max_lateness_ms = max(counters.max_lateness_ms, float(late_ms))
        if late_ms <= self._timing.renew_time / 4:
            self._late_streak = 0
            return
        self._late_streak += 1
        if self._late_streak > 1:
            return
        resolution = resolution_ms()
        if late_ms <= resolution:
            # Within what any thread's wake-up costs: the windows are too short.
            logger.warning(
                "LockManager for queue %r: a tick ran %d ms late, more than a quarter of the "
                "%d ms renew window although within a thread timer's resolution (%d ms): "
                "durations are in milliseconds, and windows this short cannot be kept",
                self._keys.name,
                late_ms,
                self._timing.renew_time,
                resolution,
                extra={"queue": self._keys.name, "late_ms": late_ms},
            )
            return
        logger.warning(
            "LockManager for queue %r: a tick ran %d ms late (more than a quarter of the "
            "%d ms renew window): something holds this process's GIL or CPU; a job that "
            "blocks in C code needs isolation='process'",
            self._keys.name,
            late_ms,
            self._timing.renew_time,
            extra={"queue": self._keys.name, "late_ms": late_ms},
        )

    def batch(self, jobs: int, calls: int, elapsed_ms: float) -> None:
        """Count one renewing tick: the jobs it sent, in how many calls, how long it took."""
        self.counters.batch(jobs, calls, elapsed_ms)
        self.meters.tick(elapsed_ms)

    def renewal(
        self, report: Report, now: int, margin_ms: int | None, renewed: int | None = None
    ) -> None:
        """Count and log a renewal's outcome: its renewals and its error or success."""
        counters = self.counters
        count = len(report.renewed) if renewed is None else renewed
        if count:
            counters.last_renewal = now
            counters.renewed += count
            self.meters.renewed(count)
            if margin_ms is not None:
                counters.margin(float(margin_ms))
                self.meters.margin(float(margin_ms))
        if report.error is None:
            if counters.failed_streak:
                logger.warning(
                    "LockManager for queue %r: renewals resumed after %d failed tick(s)",
                    self._keys.name,
                    counters.failed_streak,
                    extra={"queue": self._keys.name},
                )
            counters.failed_streak = 0
            counters.last_error = ""
            return
        exc = report.error
        counters.errors += 1
        self.meters.failed_tick()
        counters.failed_streak += 1
        counters.last_error = f"{type(exc).__name__}: {exc}"
        # A traceback only on the first failure of a streak (a long outage).
        logger.error(
            "LockManager for queue %r: renewal of %d job(s) failed, retrying: %s: %s",
            self._keys.name,
            report.unknown,
            type(exc).__name__,
            exc,
            exc_info=exc if counters.failed_streak == 1 else None,
            extra={"queue": self._keys.name, "jobs": report.unknown},
        )

    def start(self) -> None:
        """Start the record, delivery and tellers' threads."""
        self.records.start()
        self.thread.start()
        self.tellers.start()

    def flush(self, timeout: float) -> bool:
        """Return once every target told so far was told and every record written.

        ``False`` if that took more than ``timeout`` seconds (a target or a
        handler that blocks).

        Raises:
            RuntimeError: Called from the manager's user code, which would wait for itself.
        """
        if self.owns(threading.current_thread()):
            raise RuntimeError("a LockManager's user code cannot wait for its own tells")
        deadline = time.monotonic() + timeout
        told = threading.Event()
        self.tellers.when_told(None, told.set)
        if not told.wait(timeout):
            return False
        return self.records.flush(max(0.0, deadline - time.monotonic()))

    def owns(self, thread: threading.Thread) -> bool:
        """Whether ``thread`` runs user code for this manager (callbacks, targets, records)."""
        return thread is self.thread or thread is self.records or self.tellers.owns(thread)

    def send(
        self, report: Report, replies: Sequence[pykka.Future[Any]] = (), told: range = range(0)
    ) -> range:
        """Count and log the report's losses; tell its targets, deliver it, then set the replies.

        A reply is set once the callbacks ran and the report's targets were
        told, and those of ``told`` (an earlier report of the same step).

        Returns:
            The numbers of the report's tells, for a later report's ``told``.
        """
        self._log_lost(report.lost)
        waiting = []
        for reply in replies:
            if getattr(reply, "undelivered", False):
                reply.set(None)  # asked by user code: its own report comes after it
            else:
                waiting.append(reply)
        numbers = self.tellers.tell(report.tells) if report.tells else range(0)
        if not waiting:
            if report.renewed or report.lost or report.error is not None:
                self.thread.put(report)
            return numbers
        done = _Done(2, waiting)
        self.tellers.when_told([*told, *numbers], done)
        self.thread.put(report, done)
        return numbers

    def _end(self) -> None:
        # On the delivery thread, after the last report: the last tells and records, bounded.
        deadline = time.monotonic() + STOP_WAIT_S
        self.tellers.end(deadline)
        self.records.end(max(0.0, deadline - time.monotonic()))

    def _log_lost(self, lost: Sequence[LostLock]) -> None:
        if not lost:
            return
        self.counters.lost += len(lost)
        self.meters.lost(item.reason for item in lost)
        name = self._keys.name
        # One record per job (its fields filter by job and reason), the first _SHOWN of a tick.
        for item in lost[:_SHOWN]:
            logger.warning(
                "LockManager for queue %r: lost the lock of job %r (%s%s)",
                name,
                item.job_id,
                item.reason,
                f": {item.detail}" if item.detail else "",
                extra={
                    "queue": name,
                    "job_id": item.job_id,
                    "reason": item.reason,
                    "detail": item.detail,
                },
            )
        if len(lost) > _SHOWN:
            rest = lost[_SHOWN:]
            logger.warning(
                "LockManager for queue %r: lost the locks of %d more job(s) at this tick: %s",
                name,
                len(rest),
                ", ".join(sorted({item.reason for item in rest})),
                extra={
                    "queue": name,
                    "count": len(rest),
                    "reasons": sorted({item.reason for item in rest}),
                },
            )
        expired = next((item for item in lost if item.reason == EXPIRED), None)
        if expired is not None and not self._hinted:
            self._hinted = True
            logger.warning(
                "LockManager for queue %r: the lock %r was gone when it was renewed. If the "
                "worker takes its locks for less than this manager's lock_duration (%d ms), "
                "start the manager with the worker's lock duration; if no such key ever "
                "existed, check the prefix (%r; BullMQ uses 'bull') and the queue name",
                name,
                self._keys.key_prefix + expired.job_id + ":lock",
                self._timing.lock_duration,
                self._keys.prefix,
                extra={"queue": name, "job_id": expired.job_id, "reason": expired.reason},
            )

    # -- on the delivery thread ---------------------------------------------------

    def _deliver(self, report: Report) -> None:
        if report.renewed:
            self._call(self._on_renewed, report.renewed, "on_locks_renewed")
        if report.lost:
            self._call(self._on_failed, report.lost, "on_lock_renewal_failed")
        if report.error is not None:
            self._call(self._on_error, report.error, "on_error")

    def _call(self, callback: Callable[[Any], object] | None, arg: Any, name: str) -> None:
        if callback is None:
            return
        try:
            callback(arg)
        except BaseException:
            # SystemExit too: it would end the delivery of every later report.
            logger.exception(
                "LockManager for queue %r: %s raised",
                self._keys.name,
                name,
                extra={"queue": self._keys.name},
            )
