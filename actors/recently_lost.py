"""The locks a manager lost recently, so a lost lock is neither renewed nor reported twice.

Pure bookkeeping: no I/O, no threads.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Final, NamedTuple

from actors.claims import Claim

if TYPE_CHECKING:
    from collections.abc import Sequence

    from actors.lost import Reason
    from actors.messages import Notify

__all__ = ["RECENTLY_LOST", "Gone", "LostLocks"]

#: How many lost ``(job, token)`` pairs a manager remembers, the oldest
#: forgotten first: a lock tracked again within that many losses of its own
#: is neither renewed nor reported again.
RECENTLY_LOST: Final = 10_000


class Gone(NamedTuple):
    """What a manager remembers of a lost lock, or of a lock some of whose claims ended."""

    #: Why the lock was lost, or ``None`` while it is renewed for other claims.
    reason: Reason | None
    #: Who was told (or, for the plain claim, ``None``): each told once.
    told: tuple[Notify | None, ...]


class LostLocks:
    """The recently lost locks, by ``(job, token)``: at most ``size``, the least recent forgotten.

    A lost lock is never held again with the same token (a new run of the job
    takes a new one), so the pairs of locks lost long ago are not needed; the
    recent ones are, for a holder that tracks its lost lock again (a progress
    hook, a target that tracks in its ``tell``), which must not start the
    lock's renewal, or its reports, over again.

    Args:
        size: Most pairs remembered.
    """

    __slots__ = ("_gone", "size")

    def __init__(self, size: int = RECENTLY_LOST) -> None:
        self.size = size
        self._gone: OrderedDict[tuple[str, str], Gone] = OrderedDict()

    def __len__(self) -> int:
        return len(self._gone)

    def get(self, job_id: str, token: str) -> Gone | None:
        """Return what is remembered of the lock, and remember it longest now."""
        key = (job_id, token)
        gone = self._gone.get(key)
        if gone is not None:
            self._gone.move_to_end(key)
        return gone

    def add(self, job_id: str, token: str, reason: Reason | None, told: Sequence[Claim]) -> None:
        """Remember that the claims ``told`` of the lock ended (and, with a reason, the lock)."""
        key = (job_id, token)
        gone = self._gone.pop(key, None)
        known = () if gone is None else gone.told
        added = tuple(claim.target for claim in told if not any(k is claim.target for k in known))
        if gone is not None and gone.reason is not None:
            reason = gone.reason
        self._gone[key] = Gone(reason, known + added)
        if len(self._gone) > self.size:
            self._gone.popitem(last=False)

    def told(self, job_id: str, token: str, target: Notify) -> None:
        """Remember that ``target`` was told of the lock's loss."""
        self.add(job_id, token, None, (Claim(target, None),))
