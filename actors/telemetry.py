"""Optional OpenTelemetry: one ``extend_locks`` span per renewing tick, and metric instruments.

Active only when ``opentelemetry-api`` can be imported (``pip install
'echomq-actors[otel]'``); otherwise every call is a no-op. The API's global
providers are used, so the application picks the SDK and exporters, before or
after the managers start. Attribute names follow BullMQ's Node.js
``LockManager`` where it has one, so one dashboard filter catches every
runtime; the rest live under ``echomq.lock.*``.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Sequence

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
    "METRIC_FAILED_TICKS",
    "METRIC_LOSSES",
    "METRIC_MARGIN",
    "METRIC_RENEWALS",
    "METRIC_TICK_DURATION",
    "METRIC_TICK_LATENESS",
    "METRIC_TRACKED",
    "OPERATION",
    "SPAN_NAME",
    "Meters",
    "TickSpan",
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


class TickSpan:
    """What a tick reports to its span; does nothing without OpenTelemetry."""

    __slots__ = ("_span",)

    def __init__(self, span: Any) -> None:
        self._span = span

    def finish(self, failed: Sequence[str], calls: int) -> None:
        """Record the tick's outcome: the ids whose lock was lost, the script calls sent."""
        span = self._span
        if span is None or not span.is_recording():
            return
        span.set_attribute(ATTR_FAILED, len(failed))
        span.set_attribute(ATTR_CALLS, calls)
        if failed:
            span.set_attribute(ATTR_FAILED_IDS, list(failed[:MAX_FAILED_IDS]))

    def lateness(self, late_ms: float, margin_ms: float) -> None:
        """Record how late the tick ran and the least time a due lock had left."""
        span = self._span
        if span is None or not span.is_recording():
            return
        span.set_attribute(ATTR_LATENESS, late_ms)
        span.set_attribute(ATTR_MARGIN, margin_ms)

    def record(
        self, outcome: BatchOutcome | BaseException, calls: int, late_ms: float, margin_ms: float
    ) -> None:
        """Record a renewal's outcome (or error), the tick's lateness and least margin (ms)."""
        if isinstance(outcome, BaseException):
            self.error(outcome)
        else:
            self.finish(outcome.failed, calls)
            if outcome.errors:
                self.error(outcome.errors[0].error)
        self.lateness(late_ms, margin_ms)

    def error(self, exc: BaseException) -> None:
        """Record the error that failed the tick, in whole or in part."""
        span = self._span
        if span is None or not span.is_recording():
            return
        from opentelemetry.trace import Status, StatusCode  # noqa: PLC0415 (optional: only when a span records)

        span.record_exception(exc)
        span.set_attribute(ATTR_ERROR_TYPE, type(exc).__name__)
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))


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


@contextlib.contextmanager
def tick_span(queue: str, jobs: int) -> Iterator[TickSpan]:
    """Open the span of one tick renewing ``jobs`` due jobs; yield its :class:`TickSpan`."""
    tracer = _get_tracer()
    if tracer is None:
        yield TickSpan(None)
        return
    with tracer.start_as_current_span(
        SPAN_NAME,
        attributes={ATTR_QUEUE: queue, ATTR_OPERATION: OPERATION, ATTR_JOBS: jobs},
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield TickSpan(span)


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

    Recorded on the manager's thread (the SDK only aggregates there); the
    tracked-locks gauge calls ``tracked`` on the reader's thread.
    """

    __slots__ = ("__weakref__", "_attributes", "_instruments", "queue", "tracked")

    def __init__(self, queue: str, tracked: Callable[[], int]) -> None:
        self.queue = queue
        #: How many locks the manager tracks; read from any thread.
        self.tracked = tracked
        self._attributes = {ATTR_QUEUE: queue}
        self._instruments = _get_instruments()
        if self._instruments is not None:
            _LIVE.add(self)

    def renewed(self, count: int) -> None:
        """Count ``count`` confirmed renewals."""
        if self._instruments is not None and count:
            self._instruments.renewals.add(count, self._attributes)

    def lost(self, reasons: Iterable[str]) -> None:
        """Count one lost lock per reason given."""
        if self._instruments is None:
            return
        by_reason: dict[str, int] = {}
        for reason in reasons:
            by_reason[reason] = by_reason.get(reason, 0) + 1
        for reason, count in by_reason.items():
            self._instruments.losses.add(count, {**self._attributes, ATTR_REASON: reason})

    def failed_tick(self) -> None:
        """Count a tick whose Redis call failed."""
        if self._instruments is not None:
            self._instruments.failed_ticks.add(1, self._attributes)

    def tick(self, elapsed_ms: float) -> None:
        """Record how long a renewing tick's call took, in ms."""
        if self._instruments is not None:
            self._instruments.duration.record(elapsed_ms / 1000, self._attributes)

    def late(self, late_ms: float) -> None:
        """Record how late a timer tick ran, in ms."""
        if self._instruments is not None:
            self._instruments.lateness.record(max(0.0, late_ms) / 1000, self._attributes)

    def margin(self, margin_ms: float) -> None:
        """Record the least time a renewed lock had left at a tick, in ms."""
        if self._instruments is not None:
            self._instruments.margin.record(max(0.0, margin_ms) / 1000, self._attributes)

    def close(self) -> None:
        """Leave the tracked-locks gauge: the manager stopped."""
        _LIVE.discard(self)
