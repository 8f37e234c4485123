"""The process-wide OpenTelemetry SDK tracer provider, for tests that add span processors."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

__all__ = ["sdk_tracer_provider"]


def sdk_tracer_provider() -> TracerProvider:
    """Return the SDK provider every tracer of the process uses, setting it on first use.

    OpenTelemetry lets a process set its provider once, and the provider keeps
    every processor added to it: a test's processor must stop doing anything
    when the test ends.
    """
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        trace.set_tracer_provider(TracerProvider())
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    return provider
