"""The tracked jobs of one manager: pure bookkeeping, no I/O, no threads.

The records a table keeps live beside it, one idea each: the claims
(:mod:`actors.claims`), a watched lock's deadline (:mod:`actors.validity`)
and the recently lost locks (:mod:`actors.recently_lost`); they stay
importable from here.
"""

from __future__ import annotations

from itertools import compress
from typing import TYPE_CHECKING

from actors.claims import PLAIN_ONLY, Claim, Ended, Holders, ending, past, with_claim
from actors.recently_lost import RECENTLY_LOST, Gone, LostLocks
from actors.schedule import DEFAULT_LOCK_DURATION, Timing, default_safety_margin, due_mask
from actors.validity import Deadlines, Validity

if TYPE_CHECKING:
    from collections.abc import Sequence

    from actors.messages import Notify

__all__ = [
    "RECENTLY_LOST",
    "Claim",
    "Ended",
    "Gone",
    "Holders",
    "JobTable",
    "LostLocks",
    "Validity",
]


class JobTable:
    """Each tracked job's token, when its lock was last known fresh, and who claims it.

    Two flat dicts (id to token, id to monotonic ms) rather than a record per
    job: CPython's garbage collector does not track dicts that hold only
    strings and ints, so 100,000 tracked jobs add nothing to each collection,
    and stamping a tick's renewals stores one shared int, allocating nothing
    per job. A job tracked once, plainly and without a deadline, has one
    implicit claim; the few with more (a ``notify`` target, a lease, a hold
    deadline) keep their :class:`Holders` (the claims) in a third dict.

    A lock not yet renewed goes first in its tick's batch. A batch of every
    job takes a while (about a second for 100,000), and a job tracked during
    the previous one would otherwise sit at its end, renewed that long after
    it was due; the jobs renewed before have their place in every batch, so
    their gaps do not change.

    Each lock somebody watches (a ``notify`` target, a lease) also has a
    :class:`Validity`: its deadline, moved on by each confirmed renewal.

    Args:
        lock_duration: The locks' TTL in ms.
        safety_margin: The default margin of a watched lock's deadline, in
            ms; half the timer interval of ``lock_duration`` when ``None``.
    """

    __slots__ = ("deadlines", "fresh", "lock_duration", "margin", "stamps", "tokens", "watches")

    def __init__(
        self, lock_duration: int = DEFAULT_LOCK_DURATION, safety_margin: int | None = None
    ) -> None:
        self.lock_duration = lock_duration
        self.margin = (
            default_safety_margin(Timing(lock_duration)) if safety_margin is None else safety_margin
        )
        #: The watched locks' validity and the earliest of their deadlines.
        self.deadlines = Deadlines()
        self.tokens: dict[str, str] = {}
        #: Monotonic ms of the lock's taking or of its last renewal: never
        #: later than the moment the server set its TTL.
        self.stamps: dict[str, int] = {}
        self.watches: dict[str, Holders] = {}
        #: The jobs whose lock this manager has not renewed yet (an ordered set).
        self.fresh: dict[str, None] = {}

    @property
    def valid(self) -> dict[str, Validity]:
        """The watched locks' validity, by job id."""
        return self.deadlines.valid

    @property
    def earliest(self) -> int | None:
        """No watched lock's deadline is earlier than this (ms), or ``None``."""
        return self.deadlines.earliest

    def __len__(self) -> int:
        return len(self.tokens)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self.tokens

    def claims(self, job_id: str) -> tuple[Claim, ...]:
        """Return the claims on ``job_id``'s lock (none if it is not tracked)."""
        if job_id not in self.tokens:
            return ()
        watch = self.watches.get(job_id)
        return PLAIN_ONLY if watch is None else watch.claims

    def track(
        self,
        job_id: str,
        token: str,
        ts: int,
        notify: Notify | None = None,
        max_hold: int | None = None,
        keep: bool = False,
        margin: int | None = None,
    ) -> tuple[str, tuple[Notify, ...]] | None:
        """Add a claim on a job's lock.

        A claim is named by its target (``notify``, compared by identity; the
        plain claim has none). The same token again is the same lock: it keeps
        its older stamp (a job tracked over and over, by a progress hook, is
        still renewed on time), and every other claim; a claim made again is
        the same claim, whose hold deadline cannot slide. A new token is a
        new lock: every claim of the old one ends.

        Args:
            job_id: The job's id.
            token: The value its lock holds.
            ts: When the lock was taken, in monotonic ms.
            notify: Who makes the claim and is told of the lock's loss, or
                ``None`` for the plain claim.
            max_hold: Most ms to renew the lock for this claim, from ``ts``,
                or ``None`` for no limit.
            keep: End the claim only by an untrack that names ``notify``.
            margin: The claim's safety margin in ms (``None``: the table's).

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
        if held == token and notify is None and max_hold is None and job_id not in self.watches:
            return None  # the one plain claim, made again (a progress hook)
        replaced = None
        claims: tuple[Claim, ...]
        if held != token:
            self.tokens[job_id] = token
            self.stamps[job_id] = ts
            self.fresh[job_id] = None
            gone = self.watches.pop(job_id, None)
            self.deadlines.unwatch(job_id)
            if held is not None and gone is not None and gone.targets:
                replaced = (held, gone.targets)
            claims = ()
        else:
            watch = self.watches.get(job_id)
            claims = PLAIN_ONLY if watch is None else watch.claims
        deadline = None if max_hold is None else ts + max_hold
        self._keep(job_id, with_claim(claims, Claim(notify, deadline, keep, margin)))
        return replaced

    def untrack(
        self,
        job_id: str,
        token: str | None = None,
        notify: Notify | None = None,
        *,
        everyone: bool = False,
    ) -> Ended | None:
        """End claims on a job's lock (only if it holds ``token``, when given).

        Args:
            job_id: The job's id.
            token: The token the lock must hold, or ``None`` for any.
            notify: End only the claim this target made. ``None`` ends every
                claim but those kept for their target (the leases'): the
                plain claim and every ``notify`` target's.
            everyone: End every claim (the lock is lost).

        Returns:
            What ended, or ``None`` if the job was not tracked (with that token).
        """
        held = self.tokens.get(job_id)
        if held is None or (token is not None and token != held):
            return None
        watch = self.watches.get(job_id)
        if watch is None:
            if notify is not None and not everyone:
                return held, (), False
            # The one plain claim, as most jobs have: inlined, an untrack is hot.
            # (A lock without a Holders has no Validity either.)
            del self.tokens[job_id]
            del self.stamps[job_id]
            self.fresh.pop(job_id, None)
            return held, PLAIN_ONLY, True
        ended, kept = ending(watch.claims, notify, everyone=everyone)
        if not kept:
            self._drop(job_id)
        elif ended:
            self._keep(job_id, kept)
        return held, ended, not kept

    def expire(self, job_id: str, now: int) -> Ended:
        """End the claims on ``job_id``'s lock whose deadline is at or before ``now``.

        Args:
            job_id: A job :meth:`overdue` returned.
            now: The tick's time, in monotonic ms.
        """
        token, watch = self.tokens[job_id], self.watches[job_id]
        ended, kept = past(watch.claims, now)
        if kept:
            self._keep(job_id, kept)
        else:
            self._drop(job_id)
        return token, ended, not kept

    def _keep(self, job_id: str, claims: tuple[Claim, ...]) -> None:
        if len(claims) == 1 and claims[0].target is None and claims[0].deadline is None:
            self.watches.pop(job_id, None)
            self.deadlines.unwatch(job_id)
            return
        deadlines = [claim.deadline for claim in claims if claim.deadline is not None]
        targets = tuple(claim.target for claim in claims if claim.target is not None)
        self.watches[job_id] = Holders(claims, targets, min(deadlines) if deadlines else None)
        if not targets:
            self.deadlines.unwatch(job_id)
            return
        # One deadline per lock: the most careful of its watchers' margins.
        margin = max(self.margin if c.margin is None else c.margin for c in claims if c.target)
        self.deadlines.watch(job_id, self.stamps[job_id], self.lock_duration - margin)

    def _drop(self, job_id: str) -> None:
        del self.tokens[job_id]
        del self.stamps[job_id]
        self.fresh.pop(job_id, None)
        self.watches.pop(job_id, None)
        self.deadlines.unwatch(job_id)

    def confirm(self, now: int) -> list[str]:
        """Move each watched lock's deadline to its last confirmed renewal; return those past it.

        Call it with the time the renewals' answer was read (after
        :meth:`stamp`), or with any time to look for deadlines passed. A
        lock whose deadline came at or before ``now`` is returned even if a
        renewal of it was just confirmed: at its deadline nobody had
        confirmed it, and a job that looked then was told it may be lost.

        Args:
            now: Monotonic ms, read after the answer came.

        Returns:
            The ids of the watched locks past their deadline, still tracked.
        """
        return self.deadlines.confirm(self.stamps, now)

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
        """Return the ids of the jobs with a claim past its deadline (see :meth:`expire`)."""
        return [
            job_id
            for job_id, watch in self.watches.items()
            if watch.deadline is not None and watch.deadline <= now
        ]
