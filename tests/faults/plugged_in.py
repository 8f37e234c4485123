"""A worker process with broken telemetry or logging installed: do its locks live?

Run as ``python -m tests.faults.plugged_in KIND URL``. The process installs
one broken part (OpenTelemetry's providers can be set once per process,
hence a process of its own), holds a watched lock and a plain one for three
lock durations, and prints what it saw as one JSON line. ``KIND`` is one of
:data:`KINDS`.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
import uuid
from typing import Any

import redis

#: The broken part each kind installs.
KINDS = {
    "meter_raises": "a MeterProvider whose exemplar filter raises on every measurement",
    "exporter_blocks": "a SimpleSpanProcessor whose exporter takes 5 s per span",
    "processor_raises": "a span processor that raises in on_end",
    "handler_blocks": "a WARNING log handler that takes 5 s per record",
}
LOCK_MS = 1000
#: How long the locks must outlive the broken part: three lock durations.
OUTLIVE_S = 3 * LOCK_MS / 1000
#: When a third lock is stolen, for a WARNING to log (``handler_blocks``).
STEAL_AT_S = 0.5


def install(kind: str) -> None:
    """Install the broken part ``kind`` names."""
    if kind == "meter_raises":
        from opentelemetry import metrics  # noqa: PLC0415
        from opentelemetry.sdk.metrics import ExemplarFilter, MeterProvider  # noqa: PLC0415
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: PLC0415

        class Raises(ExemplarFilter):
            def should_sample(self, *args: Any, **kwargs: Any) -> bool:
                raise RuntimeError("an exemplar filter's bug")

        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider([reader], exemplar_filter=Raises()))
    elif kind in ("exporter_blocks", "processor_raises"):
        from opentelemetry import trace  # noqa: PLC0415
        from opentelemetry.sdk.trace import SpanProcessor, TracerProvider  # noqa: PLC0415
        from opentelemetry.sdk.trace.export import (  # noqa: PLC0415
            SimpleSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )

        class Sleeps(SpanExporter):
            def export(self, spans: Any) -> SpanExportResult:
                time.sleep(5)
                return SpanExportResult.SUCCESS

        class RaisesOnEnd(SpanProcessor):
            def on_end(self, span: Any) -> None:
                raise RuntimeError("a span processor's bug")

        provider = TracerProvider()
        if kind == "exporter_blocks":
            provider.add_span_processor(SimpleSpanProcessor(Sleeps()))
        else:
            provider.add_span_processor(RaisesOnEnd())
        trace.set_tracer_provider(provider)
    elif kind == "handler_blocks":

        class Stalls(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                time.sleep(5)

        logging.getLogger().addHandler(Stalls(logging.WARNING))
    else:
        raise SystemExit(f"unknown kind {kind!r}: one of {', '.join(KINDS)}")


class Watcher:
    """A ``notify`` target that keeps when it was told what."""

    def __init__(self) -> None:
        self.told: list[tuple[float, str]] = []

    def tell(self, message: Any) -> None:
        self.told.append((time.monotonic(), message.reason))


def run(kind: str, url: str) -> dict[str, Any]:
    """Hold the locks through ``kind``'s broken part; return what happened."""
    install(kind)
    from actors import QueueKeys, get_stats, get_tracked_job_ids, start_link, track_job  # noqa: PLC0415

    keys = QueueKeys(f"plugged-{kind}")
    direct = redis.Redis.from_url(url, socket_timeout=5)
    tokens = {job_id: str(uuid.uuid4()) for job_id in ("watched", "plain", "stolen")}
    for job_id, token in tokens.items():
        direct.set(keys.lock(job_id), token, px=LOCK_MS)
    lost: list[tuple[str, str]] = []
    errors: list[str] = []
    manager = start_link(
        connection=url,
        keys=keys,
        lock_duration=LOCK_MS,
        on_lock_renewal_failed=lambda items: lost.extend((i.job_id, i.reason) for i in items),
        on_error=lambda exc: errors.append(repr(exc)),
    )
    watcher = Watcher()
    started = time.monotonic()
    track_job(manager, "watched", tokens["watched"], notify=watcher)
    track_job(manager, "plain", tokens["plain"])
    track_job(manager, "stolen", tokens["stolen"])
    time.sleep(STEAL_AT_S)
    direct.set(keys.lock("stolen"), "another worker", px=60_000)
    time.sleep(max(0.0, started + OUTLIVE_S - time.monotonic()))
    held = {job_id: direct.get(keys.lock(job_id)) == tokens[job_id].encode() for job_id in tokens}
    stats = get_stats(manager, timeout=5)
    return {
        "kind": kind,
        "held": held,
        "tracked": sorted(get_tracked_job_ids(manager, timeout=5)),
        "lost": sorted(lost),
        "errors": errors,
        "told": [(round((at - started) * 1000), reason) for at, reason in watcher.told],
        "renewed": stats.renewed,
        "records_dropped": stats.records_dropped,
    }


def main(argv: list[str]) -> None:
    """Print the run's outcome as one JSON line; exit without waiting for the broken part."""
    outcome = run(argv[1], argv[2])
    print(json.dumps(outcome), flush=True)
    # The broken part may still block a thread: it must not hold up the exit.
    os._exit(0)


if __name__ == "__main__":
    threading.excepthook = lambda args: None
    main(sys.argv)
