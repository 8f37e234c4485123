"""What a step of a tick decided: renewed ids, lost locks, errors, and who is to hear of it.

The functions that decide (:func:`actors.apply.apply_outcome`, those of
:mod:`actors.deadlines`) change a :class:`~actors.jobs.JobTable` and return a
:class:`Tally`; the manager only says what it holds. Pure: no I/O, no threads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from actors.lost import LockLost, LostLock

if TYPE_CHECKING:
    from actors.claims import Claim, Ended
    from actors.jobs import JobTable
    from actors.lost import Reason
    from actors.messages import Notify

__all__ = ["Note", "Remembered", "Tally"]

#: A word for one target: who, and the loss it is told.
Note = tuple["Notify", LockLost]
#: A lock's claims that ended, for :class:`~actors.jobs.LostLocks` to
#: remember: job, token, the reason (``None`` while other claims keep the
#: lock renewed) and the claims.
Remembered = tuple[str, str, "Reason | None", "tuple[Claim, ...]"]


@dataclass(slots=True)
class Tally:
    """What to report, and to whom."""

    #: The ids renewed, for ``on_locks_renewed``.
    renewed: list[str] = field(default_factory=list)
    #: The lost locks, for ``on_lock_renewal_failed``.
    lost: list[LostLock] = field(default_factory=list)
    #: One :class:`~actors.LockLost` per target whose claim ended, in the order
    #: the claims were made.
    notes: list[Note] = field(default_factory=list)
    #: What the manager's memory of lost locks is to keep.
    ended: list[Remembered] = field(default_factory=list)
    #: The error of a renewal that did not run, or of its first chunk that did not.
    failure: Exception | None = None
    #: How many ids of the batch are in an unknown state (their calls did not run).
    unknown: int = 0

    def tell(self, job_id: str, ended: Ended, reason: Reason, detail: str = "") -> None:
        """Add a note for each target among the claims that ``ended``."""
        # One LockLost each: a target that raises its message must not leave
        # its traceback on another's.
        held, claims, _ = ended
        self.notes.extend(
            (claim.target, LockLost(job_id, held, reason, detail))
            for claim in claims
            if claim.target is not None
        )

    def forget(
        self,
        jobs: JobTable,
        job_id: str,
        reason: Reason,
        token: str | None = None,
        *,
        remember: bool = True,
        detail: str = "",
    ) -> LostLock:
        """Untrack a job whose lock is lost, noting a word for each who asked to be told.

        Args:
            jobs: The table to untrack it from.
            job_id: The job's id.
            reason: Why the lock is lost.
            token: The lost lock's token, when the caller knows it.
            remember: Keep the loss in :attr:`ended` (not as the manager stops).
            detail: One line of what was measured.

        Returns:
            The loss, as ``on_lock_renewal_failed`` receives it (not added to
            :attr:`lost`: the caller decides whether it is reported).
        """
        ended = jobs.untrack(job_id, everyone=True)
        if ended is None:
            return LostLock(job_id, token or "", reason, detail)
        self.tell(job_id, ended, reason, detail)
        held, claims, _ = ended
        if remember:
            self.ended.append((job_id, held, reason, claims))
        return LostLock(job_id, token or held, reason, detail)
