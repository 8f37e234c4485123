"""The deadlines a tick looks at before it renews: hold deadlines and watched locks' validity.

A claim with a ``max_hold`` ends at its hold deadline (``"max_hold"``); a
watched lock (a lease's, a ``notify`` target's) is let go at its validity
deadline, when no renewal was confirmed in time (``"unconfirmed"``, see
:mod:`actors.validity`). Pure: each function changes the job table and
returns a :class:`~actors.tally.Tally` of what to report, and to whom.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from actors.lost import MAX_HOLD, UNCONFIRMED, LostLock
from actors.tally import Tally

if TYPE_CHECKING:
    from actors.jobs import JobTable
    from actors.stats import Counters

__all__ = ["expire_holds", "unconfirmed"]


def expire_holds(jobs: JobTable, now: int) -> Tally:
    """End the claims past their hold deadline; a lock with none left is let go, and reported.

    Args:
        jobs: The table.
        now: The tick's time, in monotonic ms.
    """
    tally = Tally()
    for job_id in jobs.overdue(now):
        deadline = jobs.watches[job_id].deadline
        detail = f"held past its hold deadline by {now - (deadline or now)} ms"
        ended = jobs.expire(job_id, now)
        tally.tell(job_id, ended, MAX_HOLD, detail)
        held, claims, gone = ended
        if gone:
            tally.ended.append((job_id, held, MAX_HOLD, claims))
            tally.lost.append(LostLock(job_id, held, MAX_HOLD, detail))
        else:
            tally.ended.append((job_id, held, None, claims))
    return tally


def unconfirmed(
    jobs: JobTable,
    now: int,
    counters: Counters | None = None,
    *,
    paused: int = 0,
    answered_late: bool = False,
) -> Tally:
    """Let go of the watched locks past their deadline at ``now``, saying what was measured.

    Args:
        jobs: The table; its deadlines move on to the renewals confirmed.
        now: Monotonic ms (after a renewal, when its answer was read).
        counters: The manager's counters, for the ticks failed since the
            last that worked and the last error.
        paused: How long the manager did not run past its timer, in ms, when
            that is longer than a thread timer's resolution; 0 otherwise.
        answered_late: The renewal whose answer was just read came too late.
    """
    tally = Tally()
    for job_id in jobs.confirm(now):
        validity = jobs.valid[job_id]
        facts = [
            f"no renewal confirmed for {now - validity.confirmed} ms (trusted for "
            f"{validity.span} ms after a confirmed send, lock_duration "
            f"{jobs.lock_duration} ms)"
        ]
        if answered_late:
            facts.append("a renewal's answer came only after the deadline")
        if counters is not None and counters.failed_streak:
            facts.append(
                f"{counters.failed_streak} tick(s) failed since, the last with "
                f"{counters.last_error}"
            )
        if paused:
            facts.append(f"the manager did not run for {paused} ms past its timer (a pause)")
        tally.lost.append(tally.forget(jobs, job_id, UNCONFIRMED, detail="; ".join(facts)))
    return tally
