"""The tracked jobs of one manager: pure bookkeeping, no I/O, no threads."""

from __future__ import annotations

from itertools import compress
from typing import TYPE_CHECKING, NamedTuple

from actors.schedule import due_mask

if TYPE_CHECKING:
    from collections.abc import Sequence

    from actors.messages import Notify

__all__ = ["JobTable", "Watch"]


class Watch(NamedTuple):
    """What a few jobs carry beyond their token: who to tell, and until when."""

    #: Each told :class:`~actors.LockLost` once when the lock is lost, in the
    #: order they asked; empty for nobody.
    targets: tuple[Notify, ...]
    #: Monotonic ms after which the manager stops renewing, or ``None``.
    deadline: int | None


class JobTable:
    """Each tracked job's token and when its lock was last known fresh.

    Two flat dicts (id to token, id to monotonic ms) rather than a record per
    job: CPython's garbage collector does not track dicts that hold only
    strings and ints, so 100,000 tracked jobs add nothing to each collection,
    and stamping a tick's renewals stores one shared int, allocating nothing
    per job. The few jobs with a ``notify`` or a hold deadline keep a
    :class:`Watch` in a third dict.

    A lock not yet renewed goes first in its tick's batch. A batch of every
    job takes a while (about a second for 100,000), and a job tracked during
    the previous one would otherwise sit at its end, renewed that long after
    it was due; the jobs renewed before have their place in every batch, so
    their gaps do not change.
    """

    __slots__ = ("fresh", "stamps", "tokens", "watches")

    def __init__(self) -> None:
        self.tokens: dict[str, str] = {}
        #: Monotonic ms of the lock's taking or of its last renewal: never
        #: later than the moment the server set its TTL.
        self.stamps: dict[str, int] = {}
        self.watches: dict[str, Watch] = {}
        #: The jobs whose lock this manager has not renewed yet (an ordered set).
        self.fresh: dict[str, None] = {}

    def __len__(self) -> int:
        return len(self.tokens)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self.tokens

    def track(
        self,
        job_id: str,
        token: str,
        ts: int,
        notify: Notify | None = None,
        max_hold: int | None = None,
    ) -> tuple[str, tuple[Notify, ...]] | None:
        """Track a job.

        The same token again is the same lock: it keeps its older stamp (a job
        tracked over and over, by a progress hook, is still renewed on time),
        its hold deadline (it cannot slide), and everybody who asked to be
        told of its loss; ``notify`` joins them unless it is one of them
        already (the same object). A new token is a new lock: all of that
        starts again.

        Args:
            job_id: The job's id.
            token: The value its lock holds.
            ts: When the lock was taken, in monotonic ms.
            notify: Who to tell of the lock's loss too, or ``None``.
            max_hold: Most ms to renew the lock from ``ts``, or ``None`` for no
                limit; a lock that has a hold deadline keeps it.

        Returns:
            When a new token replaces a lock somebody waits on: the old token
            and everybody to tell that it is lost (another holder has the job
            now), in the order they asked. ``None`` otherwise.
        """
        held = self.tokens.get(job_id)
        if held is None and notify is None and max_hold is None:
            # A plain new job, as most are: nothing else to look at.
            self.tokens[job_id] = token
            self.stamps[job_id] = ts
            self.fresh[job_id] = None
            return None
        replaced = None
        if held != token:
            self.tokens[job_id] = token
            self.stamps[job_id] = ts
            self.fresh[job_id] = None
            gone = self.watches.pop(job_id, None)
            if held is not None and gone is not None and gone.targets:
                replaced = (held, gone.targets)
            old = None
        else:
            old = self.watches.get(job_id)
        if old is not None:
            targets = old.targets
            deadline = old.deadline if old.deadline is not None else _deadline(ts, max_hold)
        else:
            targets = ()
            deadline = _deadline(ts, max_hold)
        # By identity: an actor's ``actor_ref`` is one object, and comparing
        # with ``==`` would run a target's own code on the manager's thread.
        if notify is not None and not any(target is notify for target in targets):
            targets = (*targets, notify)
        if targets or deadline is not None:
            self.watches[job_id] = Watch(targets, deadline)
        return replaced

    def untrack(self, job_id: str, token: str | None = None) -> tuple[str, Watch | None] | None:
        """Forget a job (only if it holds ``token``, when given).

        Returns:
            Its token and watch, or ``None`` if it was not tracked (with that token).
        """
        held = self.tokens.get(job_id)
        if held is None or (token is not None and token != held):
            return None
        del self.tokens[job_id]
        del self.stamps[job_id]
        self.fresh.pop(job_id, None)
        token = held
        return token, self.watches.pop(job_id, None)

    def ids(self) -> list[str]:
        """Return the tracked ids, in tracking order."""
        return list(self.tokens)

    def due(self, now: int, threshold: int) -> tuple[list[str], list[str]]:
        """Return the due ids and their tokens, the locks not yet renewed first.

        A job is due when ``ts + threshold < now``; a job somebody waits on
        (a ``notify`` target: a lease, a job actor) is checked at every tick,
        ``ts < now``, so that a lost lock is found within one interval: those
        jobs cost twice the renewals of the others, the price of being told
        in time.
        """
        stamps, tokens = self.stamps, self.tokens
        # One mask for both: the two dicts gain and lose the same keys at the
        # same moments, so they keep the same order.
        mask = due_mask(stamps, now, threshold)
        due = list(compress(stamps, mask))
        due_tokens = list(compress(tokens.values(), mask))
        if self.watches:
            cutoff = now - threshold
            watched = [
                job_id
                for job_id, watch in self.watches.items()
                if watch.targets and cutoff <= stamps[job_id] < now
            ]
            due.extend(watched)
            due_tokens.extend(map(tokens.__getitem__, watched))
        if self.fresh and due:
            return self._fresh_first(due, due_tokens, now, threshold)
        return due, due_tokens

    def _fresh_first(
        self, due: list[str], due_tokens: list[str], now: int, threshold: int
    ) -> tuple[list[str], list[str]]:
        stamps, watches = self.stamps, self.watches
        cutoff = now - threshold
        # The fresh jobs in ``due``: old enough, or watched and checked at
        # every tick (the rule above); found without a pass over ``due``.
        first = [
            job_id
            for job_id in self.fresh
            if stamps[job_id] < cutoff
            or (
                (watch := watches.get(job_id)) is not None
                and watch.targets
                and stamps[job_id] < now
            )
        ]
        if not first:
            return due, due_tokens
        first_tokens = list(map(self.tokens.__getitem__, first))
        count = len(first)
        if due[-count:] == first:
            # As a rule the fresh jobs are the newest, last in tracking
            # order: moving them is a slice, not a pass over the batch.
            return first + due[:-count], first_tokens + due_tokens[:-count]
        fresh = self.fresh
        rest = [i for i, job_id in enumerate(due) if job_id not in fresh]
        return first + [due[i] for i in rest], first_tokens + [due_tokens[i] for i in rest]

    def oldest(self, job_ids: list[str]) -> int:
        """Return the oldest stamp among ``job_ids`` (not empty)."""
        return min(map(self.stamps.__getitem__, job_ids))

    def stamp(self, job_ids: Sequence[str], ts: int) -> None:
        """Stamp ``job_ids`` (in the order :meth:`due` gave) as renewed at ``ts`` (monotonic ms)."""
        fresh = self.fresh
        if fresh:
            # The fresh ones lead (see due); renewed once, they are fresh no more.
            for job_id in job_ids:
                if job_id not in fresh:
                    break
                del fresh[job_id]
        stamps = self.stamps
        for job_id in job_ids:
            stamps[job_id] = ts

    def overdue(self, now: int) -> list[str]:
        """Return the ids held past their deadline."""
        return [
            job_id
            for job_id, watch in self.watches.items()
            if watch.deadline is not None and watch.deadline <= now
        ]


def _deadline(ts: int, max_hold: int | None) -> int | None:
    return None if max_hold is None else ts + max_hold
