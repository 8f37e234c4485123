"""The tracked jobs of one manager: pure bookkeeping, no I/O, no threads."""

from __future__ import annotations

from collections import OrderedDict
from itertools import compress
from typing import TYPE_CHECKING, Final, NamedTuple

from actors.schedule import DEFAULT_LOCK_DURATION, Timing, default_safety_margin, due_mask

if TYPE_CHECKING:
    from collections.abc import Sequence

    from actors.lost import Reason
    from actors.messages import Notify

__all__ = [
    "RECENTLY_LOST",
    "Claim",
    "Ended",
    "Gone",
    "JobTable",
    "LostLocks",
    "Validity",
    "Watch",
]

#: How many lost ``(job, token)`` pairs a manager remembers, the oldest
#: forgotten first: a lock tracked again within that many losses of its own
#: is neither renewed nor reported again.
RECENTLY_LOST: Final = 10_000


class Claim(NamedTuple):
    """One holder's claim on a lock: who it is, and until when it wants the lock renewed."""

    #: Told :class:`~actors.LockLost` if the lock is lost while the claim
    #: holds; ``None`` for the plain claim of a worker that tracks without one.
    target: Notify | None
    #: Monotonic ms after which this claim ends (its ``max_hold``), or ``None``.
    deadline: int | None
    #: Ended only by an untrack that names :attr:`target` (a lease's claim).
    keep: bool = False
    #: This claim's ``safety_margin`` in ms, or ``None`` for the manager's.
    margin: int | None = None


class Validity:
    """Until when a watched lock is certainly still held at the server: shared, read anywhere.

    One per watched lock (per job and token), written only on the manager's
    thread; a lease reads :attr:`deadline` from the job's thread (an ``int``
    attribute: one read, no lock). The deadline is the monotonic time at
    which the last renewal the server confirmed was sent (for a new lock,
    when it was taken), plus ``lock_duration``, minus the safety margin.
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


class Watch(NamedTuple):
    """The claims of a lock that is more than one plain claim without a deadline."""

    #: Every claim on the lock's current token, in the order they were made.
    claims: tuple[Claim, ...]
    #: The claims' targets, in the same order: a lock with any is checked at every tick.
    targets: tuple[Notify, ...]
    #: The earliest of the claims' deadlines, or ``None``.
    deadline: int | None


#: What an untrack, a loss or a deadline took from one lock: its token, the
#: claims that ended (in the order they were made), and whether none is left
#: (the job is no longer tracked). A plain tuple: an untrack by the hundred
#: thousand builds one each.
Ended = tuple[str, tuple[Claim, ...], bool]

#: The claim of a job tracked plainly, without a deadline: the only one most
#: jobs have, stored as no :class:`Watch` at all.
_PLAIN: Final = Claim(None, None)
_PLAIN_ONLY: Final = (_PLAIN,)


class JobTable:
    """Each tracked job's token, when its lock was last known fresh, and who claims it.

    Two flat dicts (id to token, id to monotonic ms) rather than a record per
    job: CPython's garbage collector does not track dicts that hold only
    strings and ints, so 100,000 tracked jobs add nothing to each collection,
    and stamping a tick's renewals stores one shared int, allocating nothing
    per job. A job tracked once, plainly and without a deadline, has one
    implicit claim; the few with more (a ``notify`` target, a lease, a hold
    deadline) keep a :class:`Watch` of their claims in a third dict.

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

    __slots__ = (
        "earliest",
        "fresh",
        "lock_duration",
        "margin",
        "stamps",
        "tokens",
        "valid",
        "watches",
    )

    def __init__(
        self, lock_duration: int = DEFAULT_LOCK_DURATION, safety_margin: int | None = None
    ) -> None:
        self.lock_duration = lock_duration
        self.margin = (
            default_safety_margin(Timing(lock_duration)) if safety_margin is None else safety_margin
        )
        #: The watched locks' validity, by job id.
        self.valid: dict[str, Validity] = {}
        #: No watched lock's deadline is earlier than this (ms), or ``None``:
        #: never later than the truth, sometimes earlier (a lock untracked since).
        self.earliest: int | None = None
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

    def claims(self, job_id: str) -> tuple[Claim, ...]:
        """Return the claims on ``job_id``'s lock (none if it is not tracked)."""
        if job_id not in self.tokens:
            return ()
        watch = self.watches.get(job_id)
        return _PLAIN_ONLY if watch is None else watch.claims

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
            self._unwatch(job_id)
            if held is not None and gone is not None and gone.targets:
                replaced = (held, gone.targets)
            claims = ()
        else:
            watch = self.watches.get(job_id)
            claims = _PLAIN_ONLY if watch is None else watch.claims
        deadline = None if max_hold is None else ts + max_hold
        # By identity: an actor's ``actor_ref`` is one object, and comparing
        # with ``==`` would run a target's own code on the manager's thread.
        for i, claim in enumerate(claims):
            if claim.target is notify:
                if claim.deadline is None and deadline is not None:
                    claims = (*claims[:i], claim._replace(deadline=deadline), *claims[i + 1 :])
                break
        else:
            claims = (*claims, Claim(notify, deadline, keep, margin))
        self._keep(job_id, claims)
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
            # (A lock without a Watch has no Validity either.)
            del self.tokens[job_id]
            del self.stamps[job_id]
            self.fresh.pop(job_id, None)
            return held, _PLAIN_ONLY, True
        ended: tuple[Claim, ...]
        kept: tuple[Claim, ...]
        if everyone:
            ended, kept = watch.claims, ()
        elif notify is not None:
            ended = tuple(claim for claim in watch.claims if claim.target is notify)
            kept = tuple(claim for claim in watch.claims if claim.target is not notify)
        else:
            ended = tuple(claim for claim in watch.claims if not claim.keep)
            kept = tuple(claim for claim in watch.claims if claim.keep)
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
        ended = tuple(c for c in watch.claims if c.deadline is not None and c.deadline <= now)
        kept = tuple(c for c in watch.claims if c.deadline is None or c.deadline > now)
        if kept:
            self._keep(job_id, kept)
        else:
            self._drop(job_id)
        return token, ended, not kept

    def _keep(self, job_id: str, claims: tuple[Claim, ...]) -> None:
        if len(claims) == 1 and claims[0].target is None and claims[0].deadline is None:
            self.watches.pop(job_id, None)
            self._unwatch(job_id)
            return
        deadlines = [claim.deadline for claim in claims if claim.deadline is not None]
        targets = tuple(claim.target for claim in claims if claim.target is not None)
        self.watches[job_id] = Watch(claims, targets, min(deadlines) if deadlines else None)
        if not targets:
            self._unwatch(job_id)
            return
        # One deadline per lock: the most careful of its watchers' margins.
        margin = max(self.margin if c.margin is None else c.margin for c in claims if c.target)
        span = self.lock_duration - margin
        validity = self.valid.get(job_id)
        if validity is None:
            validity = self.valid[job_id] = Validity(self.stamps[job_id], span)
        elif validity.span != span:
            validity.span = span
            validity.deadline = validity.confirmed + span
            self.earliest = min(v.deadline for v in self.valid.values())
        if self.earliest is None or validity.deadline < self.earliest:
            self.earliest = validity.deadline

    def _unwatch(self, job_id: str) -> None:
        """Forget the lock's validity; the earliest deadline is then that of the others."""
        validity = self.valid.pop(job_id, None)
        if validity is not None and validity.deadline == self.earliest:
            # A stale earliest would arm the timer for a deadline nobody has.
            self.earliest = min((v.deadline for v in self.valid.values()), default=None)

    def _drop(self, job_id: str) -> None:
        del self.tokens[job_id]
        del self.stamps[job_id]
        self.fresh.pop(job_id, None)
        self.watches.pop(job_id, None)
        self._unwatch(job_id)

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
        stamps = self.stamps
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
