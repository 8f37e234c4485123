"""Optional OpenTelemetry spans: one ``extend_locks`` span per renewing tick.

Active only when ``opentelemetry-api`` is installed
(``pip install 'echomq-actors[otel]'``); otherwise nothing is imported and
every call here is a no-op.
"""

from __future__ import annotations

import contextlib
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["ATTR_FAILED", "ATTR_JOBS", "ATTR_QUEUE", "SPAN_NAME", "TickSpan", "tick_span"]

#: Name of the span each renewing tick opens.
SPAN_NAME = "extend_locks"
#: Span attribute: the queue's name.
ATTR_QUEUE = "echomq.queue.name"
#: Span attribute: how many jobs the tick tried to renew.
ATTR_JOBS = "echomq.lock.jobs"
#: Span attribute: how many of them had lost their lock.
ATTR_FAILED = "echomq.lock.failed"
#: Span attribute: how many script calls the tick sent.
ATTR_CALLS = "echomq.lock.script_calls"

_tracer: Any = None
_available = importlib.util.find_spec("opentelemetry") is not None


class TickSpan:
    """What a tick reports to its span; does nothing without OpenTelemetry."""

    __slots__ = ("_span",)

    def __init__(self, span: Any) -> None:
        self._span = span

    def finish(self, failed: int, calls: int) -> None:
        """Record the tick's outcome."""
        if self._span is not None:
            self._span.set_attribute(ATTR_FAILED, failed)
            self._span.set_attribute(ATTR_CALLS, calls)

    def error(self, exc: BaseException) -> None:
        """Record the error that failed the tick."""
        if self._span is not None:
            from opentelemetry.trace import Status, StatusCode

            self._span.record_exception(exc)
            self._span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))


def _get_tracer() -> Any:
    global _tracer  # noqa: PLW0603
    if _tracer is None:
        from opentelemetry import trace

        _tracer = trace.get_tracer("actors")
    return _tracer


@contextlib.contextmanager
def tick_span(queue: str, jobs: int) -> Iterator[TickSpan]:
    """Open the span of one renewing tick."""
    if not _available:
        yield TickSpan(None)
        return
    with _get_tracer().start_as_current_span(
        SPAN_NAME,
        attributes={ATTR_QUEUE: queue, ATTR_JOBS: jobs},
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield TickSpan(span)
