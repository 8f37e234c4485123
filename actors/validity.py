"""Until when a watched lock is certainly still held at the server.

A lock somebody watches (a ``notify`` target, a lease) is trusted until the
monotonic time at which the last renewal the server confirmed was sent (for
a new lock, when it was taken), plus ``lock_duration``, minus a safety
margin. Pure bookkeeping: no I/O, no threads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["Deadlines", "Validity"]


class Validity:
    """Until when one watched lock is certainly still held at the server: shared, read anywhere.

    One per watched lock (per job and token), written only on the manager's
    thread; a lease reads :attr:`deadline` from the job's thread (an ``int``
    attribute: one read, no lock).
    """

    __slots__ = ("confirmed", "deadline", "span")

    def __init__(self, confirmed: int, span: int) -> None:
        #: Monotonic ms at which the last confirmed renewal was sent (or the lock taken).
        self.confirmed = confirmed
        #: How long after :attr:`confirmed` the lock is trusted: ``lock_duration - margin``.
        self.span = span
        #: Monotonic ms past which the lock may be gone at the server.
        self.deadline = confirmed + span

    def __repr__(self) -> str:
        return f"Validity(confirmed={self.confirmed}, deadline={self.deadline})"


class Deadlines:
    """The watched locks' :class:`Validity`, by job id, and the earliest of their deadlines."""

    __slots__ = ("earliest", "valid")

    def __init__(self) -> None:
        #: The watched locks' validity, by job id.
        self.valid: dict[str, Validity] = {}
        #: No watched lock's deadline is earlier than this (ms), or ``None``:
        #: never later than the truth, sometimes earlier (a lock untracked since).
        self.earliest: int | None = None

    def watch(self, job_id: str, stamp: int, span: int) -> None:
        """Trust ``job_id``'s lock ``span`` ms past a confirmed send (from ``stamp`` if new)."""
        validity = self.valid.get(job_id)
        if validity is None:
            validity = self.valid[job_id] = Validity(stamp, span)
        elif validity.span != span:
            validity.span = span
            validity.deadline = validity.confirmed + span
            self.earliest = min(v.deadline for v in self.valid.values())
        if self.earliest is None or validity.deadline < self.earliest:
            self.earliest = validity.deadline

    def unwatch(self, job_id: str) -> None:
        """Forget the lock's validity; the earliest deadline is then that of the others."""
        validity = self.valid.pop(job_id, None)
        if validity is not None and validity.deadline == self.earliest:
            # A stale earliest would arm the timer for a deadline nobody has.
            self.earliest = min((v.deadline for v in self.valid.values()), default=None)

    def confirm(self, stamps: Mapping[str, int], now: int) -> list[str]:
        """Move each deadline to its lock's last confirmed renewal; return the ids past it.

        Args:
            stamps: Each tracked lock's last renewal (or taking), in monotonic ms.
            now: Monotonic ms, read after the renewals' answer came.

        Returns:
            The ids of the watched locks whose deadline came at or before ``now``.
        """
        overdue: list[str] = []
        earliest: int | None = None
        for job_id, validity in self.valid.items():
            if validity.deadline <= now:
                overdue.append(job_id)
                continue
            stamp = stamps[job_id]
            if stamp > validity.confirmed:
                validity.confirmed = stamp
                validity.deadline = stamp + validity.span
            if earliest is None or validity.deadline < earliest:
                earliest = validity.deadline
        self.earliest = earliest
        return overdue
