"""What a track does to a manager's books: a new claim, or a word about a lock lost already.

Pure: each function changes the job table and returns a
:class:`~actors.tally.Tally` of who is to be told, and what to remember.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from actors.claims import Claim
from actors.lost import STOLEN, LockLost
from actors.tally import Tally

if TYPE_CHECKING:
    from actors.jobs import Gone, JobTable
    from actors.messages import Notify

__all__ = ["track", "tracked_again"]


def track(
    jobs: JobTable,
    job_id: str,
    token: str,
    ts: int,
    notify: Notify | None,
    max_hold: int | None,
    keep: bool,
    margin: int | None,
) -> Tally:
    """Add the claim (see :meth:`~actors.jobs.JobTable.track`).

    A new token on a lock somebody waits on ends the old lock's claims: the
    job was taken again, and each target of the old lock learns it belongs
    to another run now (``"stolen"``).
    """
    tally = Tally()
    replaced = jobs.track(job_id, token, ts, notify, max_hold, keep, margin)
    if replaced is not None:
        old_token, targets = replaced
        detail = f"this worker took the job again with the token {token!r}"
        tally.notes.extend(
            (target, LockLost(job_id, old_token, STOLEN, detail)) for target in targets
        )
        tally.ended.append((job_id, old_token, STOLEN, tuple(Claim(t, None) for t in targets)))
    return tally


def tracked_again(gone: Gone, job_id: str, token: str, notify: Notify | None) -> Tally | None:
    """Handle a track of a lock lost recently, or ``None`` if it is a track like any other.

    Args:
        gone: What the manager remembers of the lock.
        job_id: The job's id.
        token: The lock's token.
        notify: The claim's target, or ``None``.

    Returns:
        ``None`` when the claim is to be made; otherwise who is to be told.
    """
    if gone.reason is None:
        # The lock is renewed for other claims: only this claim ended (its
        # max_hold), and it does not begin again.
        return Tally() if any(known is notify for known in gone.told) else None
    # The lock is lost: it is not renewed again, nor reported again. A
    # target that did not hear of it yet hears now, once.
    tally = Tally()
    if notify is not None and not any(known is notify for known in gone.told):
        tally.ended.append((job_id, token, None, (Claim(notify, None),)))
        tally.notes.append((notify, LockLost(job_id, token, gone.reason)))
    return tally
