"""Applying a renewal's outcome to the job table: a pure function, no actor, no I/O.

:func:`apply_outcome` stamps the renewed locks, untracks the lost ones,
moves the watched locks' deadlines on and returns what the manager is to
report, and to whom.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from actors.deadlines import unconfirmed
from actors.lost import EXPIRED, STOLEN
from actors.outcome import BatchOutcome
from actors.tally import Tally

if TYPE_CHECKING:
    from actors.jobs import JobTable
    from actors.lost import Reason
    from actors.stats import Counters

__all__ = ["apply_outcome", "found"]


def apply_outcome(
    jobs: JobTable,
    due: list[str],
    tokens: list[str],
    outcome: BatchOutcome | BaseException,
    at: int,
    answered: int,
    counters: Counters | None = None,
) -> Tally:
    """Stamp the renewed locks at ``at``, untrack the lost ones; return both, and who to tell.

    A renewal that raised renews nothing and loses nothing: every job keeps
    its stamp, and the next tick tries them all again. So does each job of a
    chunk that did not run. Only ids of this batch count: a renewer's report
    of any other is dropped, and an id reported twice is lost once. The
    renewals confirmed then move the watched locks' deadlines on, unless
    their answer came after a deadline (that lock is let go,
    ``"unconfirmed"``, and is not reported renewed).

    Args:
        jobs: The table the batch was taken from.
        due: The batch's ids, as :meth:`~actors.jobs.JobTable.due` gave them.
        tokens: Their tokens, in the same order.
        outcome: What the renewer returned, or what it raised.
        at: The tick's time, in monotonic ms: the renewed locks' new stamp.
        answered: When the renewer's answer was read, in monotonic ms.
        counters: The manager's counters, for what an ``"unconfirmed"`` loss says.

    Returns:
        The renewed ids, the lost locks, a note for each target of a lost
        lock, what to remember of each loss, and the error to report: what
        the renewer raised, or the first chunk's that did not run.
    """
    if not isinstance(outcome, BatchOutcome):
        # A BaseException too: left to pykka, it would stop every actor.
        error = outcome if isinstance(outcome, Exception) else RuntimeError(repr(outcome))
        return Tally(failure=error, unknown=len(due))
    tally = Tally()
    if not outcome.failed and not outcome.errors:
        jobs.stamp(due, at)
        tally.renewed = due
    else:
        token_of = dict(zip(due, tokens, strict=True))
        failed = {job_id for job_id in outcome.failed if job_id in token_of}
        for job_id in dict.fromkeys(outcome.failed):
            if job_id in token_of:
                reason = outcome.reasons.get(job_id, EXPIRED)
                detail = found(jobs, job_id, reason, at)
                lost = tally.forget(jobs, job_id, reason, token_of[job_id], detail=detail)
                tally.lost.append(lost)
        for chunk in outcome.errors:
            failed.update(due[chunk.start : chunk.stop])
            tally.unknown += chunk.stop - chunk.start
        if outcome.errors:
            tally.failure = outcome.errors[0].error
        tally.renewed = [job_id for job_id in due if job_id not in failed]
        jobs.stamp(tally.renewed, at)
    if jobs.valid:
        late = unconfirmed(jobs, answered, counters, answered_late=True)
        gone = {lost.job_id for lost in late.lost}
        tally.renewed = [job_id for job_id in tally.renewed if job_id not in gone]
        tally.lost.extend(late.lost)
        tally.notes.extend(late.notes)
        tally.ended.extend(late.ended)
    return tally


def found(jobs: JobTable, job_id: str, reason: Reason, at: int) -> str:
    """Say what a renewal that found the lock lost tells, from what is known already."""
    stamp = jobs.stamps.get(job_id)
    age = "" if stamp is None else f"{at - stamp} ms after its last renewal or taking"
    if reason == STOLEN:
        return f"the lock holds another worker's token (found {age})"
    duration = jobs.lock_duration
    if stamp is not None and at - stamp < duration:
        return (
            f"the lock key was gone {age}, before its {duration} ms could run out: "
            f"deleted, or lost by the server (a restart, a failover)"
        )
    return f"the lock key was gone {age}: it expired ({duration} ms without a renewal)"
