"""What a manager records, and the thread it is written on: log lines, metrics, spans.

Logging handlers, meters, span processors and exporters are the application's
code: a manager's own threads (its actor, timer, renewal and child-reader
threads) never run them. Each manager writes its records on a
:class:`RecordThread` of its own; a record that would wait behind more than
:data:`MAX_WAITING_RECORDS`, or whose writing raised, is dropped and counted
(:attr:`~actors.Stats.records_dropped`). A renewal is never dropped.

OpenTelemetry is optional: one ``extend_locks`` span per renewing tick, and
metric instruments. Active only when ``opentelemetry-api`` can be imported (``pip install
'echomq-actors[otel]'``); otherwise every call is a no-op. The API's global
providers are used, so the application picks the SDK and exporters, before or
after the managers start. Attribute names follow BullMQ's Node.js
``LockManager`` where it has one, so one dashboard filter catches every
runtime; the rest live under ``echomq.lock.*``.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import sys
import threading
import weakref
from typing import TYPE_CHECKING, Any, Final, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from actors.messages import BatchOutcome

__all__ = [
    "ATTR_CALLS",
    "ATTR_ERROR_TYPE",
    "ATTR_FAILED",
    "ATTR_FAILED_IDS",
    "ATTR_JOBS",
    "ATTR_LATENESS",
    "ATTR_MARGIN",
    "ATTR_OPERATION",
    "ATTR_QUEUE",
    "ATTR_REASON",
    "MAX_FAILED_IDS",
    "MAX_WAITING_RECORDS",
    "METRIC_FAILED_TICKS",
    "METRIC_LOSSES",
    "METRIC_MARGIN",
    "METRIC_RENEWALS",
    "METRIC_TICK_DURATION",
    "METRIC_TICK_LATENESS",
    "METRIC_TRACKED",
    "OPERATION",
    "SPAN_NAME",
    "Log",
    "Meters",
    "RecordThread",
    "span_facts",
    "tick_span",
]

#: Name of the span each renewing tick opens.
SPAN_NAME = "extend_locks"
#: Span attribute: the queue's name (BullMQ's name for it).
ATTR_QUEUE = "bullmq.queue.name"
#: Span attribute: the operation, :data:`OPERATION` (BullMQ's name for it).
ATTR_OPERATION = "bullmq.queue.operation"
#: The value of :data:`ATTR_OPERATION`, as BullMQ's lock manager sets it.
OPERATION = "extendLocks"
#: Span attribute: how many jobs the tick tried to renew.
ATTR_JOBS = "echomq.lock.jobs"
#: Span attribute: how many of them had lost their lock.
ATTR_FAILED = "echomq.lock.failed"
#: Span attribute: the ids of those jobs, at most :data:`MAX_FAILED_IDS` of them.
ATTR_FAILED_IDS = "echomq.lock.failed_ids"
#: Span attribute: how many script calls the tick sent.
ATTR_CALLS = "echomq.lock.script_calls"
#: Span attribute: the class name of the error that failed the tick
#: (OpenTelemetry's semantic convention).
ATTR_ERROR_TYPE = "error.type"
#: Span attribute: how late the last timer tick ran against its grid, in ms.
ATTR_LATENESS = "echomq.lock.tick_lateness_ms"
#: Span attribute: the least time a due lock had left when renewed, in ms.
ATTR_MARGIN = "echomq.lock.margin_ms"
#: Most lost ids one span lists; the count is always exact.
MAX_FAILED_IDS = 100

#: Counter (``{lock}``): renewals the server confirmed.
METRIC_RENEWALS = "echomq.lock.renewals"
#: Counter (``{lock}``): locks lost, by :data:`ATTR_REASON`.
METRIC_LOSSES = "echomq.lock.losses"
#: Counter (``{tick}``): ticks whose Redis call failed (every lock kept, retried).
METRIC_FAILED_TICKS = "echomq.lock.failed_ticks"
#: Histogram (``s``): how long a renewing tick's Redis call took.
METRIC_TICK_DURATION = "echomq.lock.tick.duration"
#: Histogram (``s``): how late each timer tick ran against its grid.
METRIC_TICK_LATENESS = "echomq.lock.tick.lateness"
#: Histogram (``s``): per renewing tick, the least time a renewed lock had left.
METRIC_MARGIN = "echomq.lock.margin"
#: Gauge (``{lock}``): the locks the process's managers of a queue track.
METRIC_TRACKED = "echomq.lock.tracked"
#: Metric attribute of :data:`METRIC_LOSSES`: the loss's reason (``"stolen"``, ``"expired"``...).
ATTR_REASON = "echomq.lock.reason"
#: Bucket bounds of the histograms, in seconds: from a local round trip to a lock's life.
_BOUNDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5, 10, 30)

T = TypeVar("T")
_lock = threading.Lock()
#: The managers' meters, read by the tracked-locks gauge; a closed one leaves.
_LIVE: weakref.WeakSet[Meters] = weakref.WeakSet()

#: Records at most waiting for a manager's record thread: past it, new ones are dropped.
MAX_WAITING_RECORDS: Final = 10_000
#: The attribute of a thread that names the record thread its log lines go to.
_SINK: Final = "actors_records"


class RecordThread(threading.Thread):
    """The thread one manager writes its log lines, measurements and spans on.

    Nothing waits for it: :meth:`put` never blocks, and what the application
    installed (a handler, a meter, a span processor) raises or stalls here
    alone, costing records, never a renewal or a watcher's warning.
    """

    def __init__(self, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self._queue: queue.SimpleQueue[tuple[Callable[..., object], tuple[Any, ...], Any] | None]
        self._queue = queue.SimpleQueue()
        self._lock = threading.Lock()
        #: Records dropped so far: behind, or raised while written.
        self.dropped = 0
        self._warned = False

    def attach(self, thread: threading.Thread | None = None) -> None:
        """Send the log lines of ``thread`` (default: the calling one) here, from now on."""
        setattr(thread or threading.current_thread(), _SINK, self)

    def put(self, write: Callable[..., object], *args: Any, **kwargs: Any) -> None:
        """Write ``write(*args, **kwargs)`` on this thread, unless too many wait already."""
        if self._queue.qsize() >= MAX_WAITING_RECORDS:
            self._drop(None)
            return
        self._queue.put((write, args, kwargs))

    def flush(self, timeout: float) -> bool:
        """Return once every record put so far is written (or dropped); ``False`` on timeout."""
        written = threading.Event()
        self._queue.put((written.set, (), None))
        return written.wait(timeout)

    def end(self, timeout: float) -> None:
        """Write what waits, then end; wait ``timeout`` seconds at most (not from this thread)."""
        self._queue.put(None)
        if self.ident is not None and threading.current_thread() is not self:
            self.join(timeout)

    def run(self) -> None:
        """Write each record in turn, until :meth:`end`."""
        while (item := self._queue.get()) is not None:
            write, args, kwargs = item
            try:
                write(*args, **(kwargs or {}))
            except BaseException as exc:
                self._drop(exc)

    def _drop(self, error: BaseException | None) -> None:
        with self._lock:
            self.dropped += 1
            warn = error is not None and not self._warned
            self._warned = self._warned or warn
        if warn and threading.current_thread() is self:
            # Once: the handler that raised may be the one this line goes to.
            with contextlib.suppress(BaseException):
                logging.getLogger("actors.telemetry").warning(
                    "%s: writing a record raised; it is dropped, as every record whose "
                    "writing raises (counted in Stats.records_dropped)",
                    self.name,
                    exc_info=error,
                )


class Log:
    """A module's logger: on a thread attached to a :class:`RecordThread`, written there.

    Elsewhere (a caller's thread) it logs at once, as ``logging.getLogger(name)``
    would.
    """

    __slots__ = ("logger",)

    def __init__(self, name: str) -> None:
        #: The standard logger the records go to.
        self.logger = logging.getLogger(name)

    def debug(self, msg: str, *args: Any, **kwargs: Any) -> None:
        """Log at DEBUG."""
        self._log(logging.DEBUG, msg, args, **kwargs)

    def info(self, msg: str, *args: Any, **kwargs: Any) -> None:
        """Log at INFO."""
        self._log(logging.INFO, msg, args, **kwargs)

    def warning(self, msg: str, *args: Any, **kwargs: Any) -> None:
        """Log at WARNING."""
        self._log(logging.WARNING, msg, args, **kwargs)

    def error(self, msg: str, *args: Any, **kwargs: Any) -> None:
        """Log at ERROR."""
        self._log(logging.ERROR, msg, args, **kwargs)

    def exception(self, msg: str, *args: Any, **kwargs: Any) -> None:
        """Log at ERROR with the exception being handled."""
        kwargs.setdefault("exc_info", True)
        self._log(logging.ERROR, msg, args, **kwargs)

    def log(self, level: int, msg: str, *args: Any, **kwargs: Any) -> None:
        """Log at ``level``: here, or on the calling thread's record thread."""
        self._log(level, msg, args, **kwargs)

    def _log(
        self,
        level: int,
        msg: str,
        args: tuple[Any, ...],
        *,
        exc_info: Any = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        logger = self.logger
        if not logger.isEnabledFor(level):
            return
        sink: RecordThread | None = getattr(threading.current_thread(), _SINK, None)
        if sink is None:
            # Two frames up: the module that logged, as logging.Logger would name it.
            logger.log(level, msg, *args, exc_info=exc_info, extra=extra, stacklevel=3)
            return
        # Made here (the caller's module, line, thread and time); only handled there.
        if isinstance(exc_info, BaseException):
            exc_info = (type(exc_info), exc_info, exc_info.__traceback__)
        elif exc_info and not isinstance(exc_info, tuple):
            exc_info = sys.exc_info()
        # An exception among the arguments is read as ``%s`` reads it: a waiting record
        # keeps no traceback (nor the frames it holds) alive but its exc_info's.
        args = tuple(str(arg) if isinstance(arg, BaseException) else arg for arg in args)
        caller = sys._getframe(2)  # the frame logging.Logger.findCaller would find
        code = caller.f_code
        record = logger.makeRecord(
            logger.name,
            level,
            code.co_filename,
            caller.f_lineno,
            msg,
            args,
            exc_info or None,
            code.co_name,
            extra,
        )
        sink.put(logger.handle, record)


def _optional(make: Callable[[], T]) -> Callable[[], T | None]:
    """Return a getter of ``make()``, made at the first call; ``None`` without OpenTelemetry."""
    made: list[T | None] = []

    def get() -> T | None:
        if not made:
            with _lock:
                if not made:
                    try:
                        made.append(make())
                    except ImportError:
                        made.append(None)
        return made[0]

    return get


def _make_tracer() -> Any:
    from opentelemetry import trace  # noqa: PLC0415 (optional: only when a span records)

    # A proxy until the application sets a provider: set-up order does not matter.
    return trace.get_tracer("actors")


_get_tracer = _optional(_make_tracer)


def span_facts(
    outcome: BatchOutcome | BaseException, calls: int, late_ms: float, margin_ms: float
) -> tuple[dict[str, Any], tuple[str, str] | None]:
    """What a tick's span says, as plain data: its attributes, and its error's type and message.

    Read on the renewal thread: a span waiting for the record thread keeps no
    exception (nor its traceback's frames) and no batch alive.
    """
    attributes: dict[str, Any] = {}
    error: BaseException | None = None
    if isinstance(outcome, BaseException):
        error = outcome
    else:
        attributes[ATTR_FAILED] = len(outcome.failed)
        attributes[ATTR_CALLS] = calls
        if outcome.failed:
            attributes[ATTR_FAILED_IDS] = list(outcome.failed[:MAX_FAILED_IDS])
        if outcome.errors:
            error = outcome.errors[0].error
    attributes[ATTR_LATENESS] = late_ms
    attributes[ATTR_MARGIN] = margin_ms
    if error is None:
        return attributes, None
    attributes[ATTR_ERROR_TYPE] = type(error).__name__
    return attributes, (type(error).__name__, str(error))


def tick_span(
    queue: str,
    jobs: int,
    started_ns: int,
    ended_ns: int,
    facts: tuple[dict[str, Any], tuple[str, str] | None],
) -> None:
    """Write the span of a renewing tick of ``jobs`` due jobs, from what the tick measured.

    Written after the tick, on the record thread: ``started_ns`` and
    ``ended_ns`` are the round trip's times (``time.time_ns()``), ``facts``
    what :func:`span_facts` read of its outcome.
    """
    tracer = _get_tracer()
    if tracer is None:
        return
    attributes, error = facts
    span = tracer.start_span(
        SPAN_NAME,
        attributes={ATTR_QUEUE: queue, ATTR_OPERATION: OPERATION, ATTR_JOBS: jobs},
        start_time=started_ns,
        record_exception=False,
        set_status_on_exception=False,
    )
    try:
        if span.is_recording():
            span.set_attributes(attributes)
            if error is not None:
                from opentelemetry.trace import Status, StatusCode  # noqa: PLC0415 (optional)

                kind, message = error
                span.add_event("exception", {"exception.type": kind, "exception.message": message})
                span.set_status(Status(StatusCode.ERROR, f"{kind}: {message}"))
    finally:
        span.end(end_time=ended_ns)


class _Instruments:
    """The process's instruments, made once on the API's global meter provider."""

    def __init__(self, metrics: Any) -> None:
        meter = metrics.get_meter("actors")
        self.renewals = meter.create_counter(METRIC_RENEWALS, "{lock}", "Lock renewals confirmed")
        self.losses = meter.create_counter(METRIC_LOSSES, "{lock}", "Locks lost, by reason")
        self.failed_ticks = meter.create_counter(
            METRIC_FAILED_TICKS, "{tick}", "Ticks whose Redis call failed"
        )
        histogram = meter.create_histogram
        self.duration = histogram(
            METRIC_TICK_DURATION,
            "s",
            "Time a renewing tick's Redis call took",
            explicit_bucket_boundaries_advisory=_BOUNDS,
        )
        self.lateness = histogram(
            METRIC_TICK_LATENESS,
            "s",
            "How late a timer tick ran",
            explicit_bucket_boundaries_advisory=_BOUNDS,
        )
        self.margin = histogram(
            METRIC_MARGIN,
            "s",
            "Least time a renewed lock had left, per renewing tick",
            explicit_bucket_boundaries_advisory=_BOUNDS,
        )
        self.observation = metrics.Observation
        meter.create_observable_gauge(
            METRIC_TRACKED, [self._tracked], "{lock}", "Locks the managers track"
        )

    def _tracked(self, _options: Any) -> Iterable[Any]:
        # Summed by queue: two managers of one queue in a process are one gauge.
        counts: dict[str, int] = {}
        for meters in list(_LIVE):
            try:
                count = meters.tracked()
            except Exception:  # a stopping manager: skipped this once
                continue
            counts[meters.queue] = counts.get(meters.queue, 0) + count
        return [self.observation(n, {ATTR_QUEUE: queue}) for queue, n in counts.items()]


def _make_instruments() -> _Instruments:
    from opentelemetry import metrics  # noqa: PLC0415 (optional)

    # Proxies until the application sets a provider: set-up order does not matter.
    return _Instruments(metrics)


_get_instruments = _optional(_make_instruments)


class Meters:
    """What one manager records to the metric instruments; does nothing without OpenTelemetry.

    Each measurement is written through ``post`` (a :meth:`RecordThread.put`),
    never on the thread that measured; the tracked-locks gauge calls
    ``tracked`` on the reader's thread.
    """

    __slots__ = ("__weakref__", "_attributes", "_instruments", "_post", "queue", "tracked")

    def __init__(self, queue: str, tracked: Callable[[], int], post: Callable[..., None]) -> None:
        self.queue = queue
        #: How many locks the manager tracks; read from any thread.
        self.tracked = tracked
        self._post = post
        self._attributes = {ATTR_QUEUE: queue}
        self._instruments = _get_instruments()
        if self._instruments is not None:
            _LIVE.add(self)

    def renewed(self, count: int) -> None:
        """Count ``count`` confirmed renewals."""
        if self._instruments is not None and count:
            self._post(self._instruments.renewals.add, count, self._attributes)

    def lost(self, reasons: Iterable[str]) -> None:
        """Count one lost lock per reason given."""
        if self._instruments is None:
            return
        by_reason: dict[str, int] = {}
        for reason in reasons:
            by_reason[reason] = by_reason.get(reason, 0) + 1
        for reason, count in by_reason.items():
            self._post(
                self._instruments.losses.add, count, {**self._attributes, ATTR_REASON: reason}
            )

    def failed_tick(self) -> None:
        """Count a tick whose Redis call failed."""
        if self._instruments is not None:
            self._post(self._instruments.failed_ticks.add, 1, self._attributes)

    def tick(self, elapsed_ms: float) -> None:
        """Record how long a renewing tick's call took, in ms."""
        if self._instruments is not None:
            self._post(self._instruments.duration.record, elapsed_ms / 1000, self._attributes)

    def late(self, late_ms: float) -> None:
        """Record how late a timer tick ran, in ms."""
        if self._instruments is not None:
            late_s = max(0.0, late_ms) / 1000
            self._post(self._instruments.lateness.record, late_s, self._attributes)

    def margin(self, margin_ms: float) -> None:
        """Record the least time a renewed lock had left at a tick, in ms."""
        if self._instruments is not None:
            margin_s = max(0.0, margin_ms) / 1000
            self._post(self._instruments.margin.record, margin_s, self._attributes)

    def close(self) -> None:
        """Leave the tracked-locks gauge: the manager stopped."""
        _LIVE.discard(self)
