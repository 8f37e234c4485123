"""The process-wide OpenTelemetry SDK meter provider, read in memory and scraped by Prometheus."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from opentelemetry import metrics
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import start_http_server

__all__ = ["Metering", "metric_points", "sdk_metering"]


@dataclass(frozen=True)
class Metering:
    """The readers of the process's meter provider."""

    #: Read by the tests directly (cumulative: every point since the start).
    memory: InMemoryMetricReader
    #: The URL of a Prometheus endpoint on loopback, serving the same instruments.
    scrape_url: str


_metering: Metering | None = None
_lock = threading.Lock()


def sdk_metering() -> Metering:
    """Set the SDK meter provider on first use (a process sets it once); return its readers.

    Tests tell their points apart by the queue's name: each uses a queue of its own.
    """
    global _metering  # noqa: PLW0603
    with _lock:
        if _metering is None:
            memory = InMemoryMetricReader()
            metrics.set_meter_provider(
                MeterProvider(metric_readers=[memory, PrometheusMetricReader()])
            )
            server, _thread = start_http_server(0, addr="127.0.0.1")
            _metering = Metering(memory, f"http://127.0.0.1:{server.server_port}/metrics")
        return _metering


def metric_points(metering: Metering, name: str, queue: str) -> list[Any]:
    """The data points of instrument ``name`` whose ``bullmq.queue.name`` is ``queue``, now."""
    data = metering.memory.get_metrics_data()
    found = []
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    found += [
                        point
                        for point in metric.data.data_points
                        if (point.attributes or {}).get("bullmq.queue.name") == queue
                    ]
    return found
