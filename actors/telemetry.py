"""Optional OpenTelemetry spans: one ``extend_locks`` span per renewing tick.

Active only when ``opentelemetry-api`` can be imported (``pip install
'echomq-actors[otel]'``), on the first renewing tick; otherwise every call is a
no-op. Attribute names follow BullMQ's Node.js ``LockManager`` where it has
one, so one dashboard filter catches every runtime; the rest live under
``echomq.lock.*``.
"""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

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
    "MAX_FAILED_IDS",
    "OPERATION",
    "SPAN_NAME",
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

_UNSET: Any = object()
_tracer: Any = _UNSET
_lock = threading.Lock()


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


def _get_tracer() -> Any:
    global _tracer  # noqa: PLW0603
    if _tracer is _UNSET:
        with _lock:
            if _tracer is _UNSET:
                try:
                    from opentelemetry import trace  # noqa: PLC0415 (optional: only when a span records)
                except ImportError:
                    _tracer = None
                else:
                    # A proxy until the application sets a provider: set-up order does not matter.
                    _tracer = trace.get_tracer("actors")
    return _tracer


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
