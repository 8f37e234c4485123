"""What a manager counts about its ticks, and the snapshot it answers with."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Counters", "Stats"]


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
    #: The least time a lock had left when it was renewed (how close a lock
    #: came to expiring), in milliseconds, measured when the renewal's answer
    #: came back (never overstated); ``None`` before the first renewal.
    min_lock_margin_ms: float | None = None


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
        "script_calls",
        "ticks",
    )

    def __init__(self) -> None:
        self.ticks = 0
        self.renewed = 0
        self.lost = 0
        self.errors = 0
        self.script_calls = 0
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

    def tick(self, batch: int, calls: int, elapsed_ms: float) -> None:
        """Count one renewing tick."""
        self.script_calls += calls
        self.last_batch = batch
        self.last_tick_ms = elapsed_ms
        self.max_tick_ms = max(self.max_tick_ms, elapsed_ms)

    def late(self, lateness_ms: float) -> None:
        """Record how late a timer tick ran."""
        self.lateness_ms = lateness_ms
        self.max_lateness_ms = max(self.max_lateness_ms, lateness_ms)

    def margin(self, margin_ms: float) -> None:
        """Record the least time a renewed lock had left."""
        if self.min_margin_ms is None or margin_ms < self.min_margin_ms:
            self.min_margin_ms = margin_ms

    def snapshot(self, queue: str, tracked: int, now: int) -> Stats:
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
        )
