"""Counters a manager keeps about its ticks."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Stats"]


@dataclass(frozen=True, slots=True)
class Stats:
    """A snapshot of one manager's counters, from :func:`actors.get_stats`."""

    #: Queue name the manager renews for.
    queue: str
    #: Timer ticks handled so far, with or without due jobs.
    ticks: int
    #: Lock renewals that succeeded, counted per job.
    renewed: int
    #: Jobs reported lost (lock gone or held by another token).
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
