"""The tracked jobs of one manager: their locks, who claims each, and until when each is trusted.

Pure bookkeeping: no I/O, no threads.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from itertools import compress
from typing import TYPE_CHECKING, Final, NamedTuple

from actors.timing import due_mask

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from actors.messages import Notify, Reason

__all__ = [
    "PLAIN",
    "PLAIN_ONLY",
    "RECENTLY_LOST",
    "STAMP_SLICE",
    "Claim",
    "Deadlines",
    "Due",
    "Ended",
    "Holders",
    "JobTable",
    "LostLocks",
    "Validity",
]


class Claim(NamedTuple):
    """One holder's claim on a lock: who it is, and until when it wants the lock renewed."""

    #: Told :class:`~actors.LockLost` if the lock is lost while the claim
    #: holds; ``None`` for the plain claim of a worker that tracks without one.
    target: Notify | None
    #: Monotonic ms at which this claim's ``max_hold`` ends it, or ``None``.
    hold_end: int | None
    #: Ended only by an untrack that names :attr:`target` (a lease's claim).
    keep: bool = False
    #: This claim's ``safety_margin`` in ms, or ``None`` for the manager's.
    margin: int | None = None
    #: The holder is deleting the lock itself (a move): its loss is no loss.
    releasing: bool = False


class Holders(NamedTuple):
    """The claims of a lock that is more than one plain claim without a hold limit."""

    #: Every claim on the lock's current token, in the order they were made.
    claims: tuple[Claim, ...]
    #: The claims' targets, in the same order: a lock with any is checked at every tick.
    targets: tuple[Notify, ...]
    #: The earliest of the claims' hold ends, or ``None``.
    hold_end: int | None


class Ended(NamedTuple):
    """What an untrack, a loss or a hold limit took from one lock."""

    #: The lock's token.
    token: str
    #: The claims that ended, in the order they were made.
    claims: tuple[Claim, ...]
    #: Whether no claim is left: the job is no longer tracked.
    last: bool


#: Earlier than any monotonic ms: the newest stamp of an empty table.
_NEVER: Final = -(2**63)
#: Ids :attr:`JobTable._fresh` may hold beyond twice the tracked jobs before it is read.
_FRESH_SLACK: Final = 4096
#: Stamps between two pauses of :meth:`JobTable.stamp` (about half a millisecond's work).
STAMP_SLICE: Final = 8192

#: The claim of a job tracked plainly, without a hold limit: the only one most
#: jobs have, stored as no :class:`Holders` at all.
PLAIN: Final = Claim(None, None)
#: The claims of a plainly tracked job.
PLAIN_ONLY: Final = (PLAIN,)


def _with_claim(claims: tuple[Claim, ...], claim: Claim) -> tuple[Claim, ...]:
    """Return ``claims`` with ``claim`` added, or merged into its target's earlier one.

    A claim made again keeps its place and its hold end, which cannot slide.
    """
    # By identity: an actor's ``actor_ref`` is one object, and comparing
    # with ``==`` would run a target's own code on the manager's thread.
    for i, made in enumerate(claims):
        if made.target is claim.target:
            hold_end = claim.hold_end if made.hold_end is None else made.hold_end
            if hold_end == made.hold_end and claim.releasing == made.releasing:
                return claims
            merged = made._replace(hold_end=hold_end, releasing=claim.releasing)
            return (*claims[:i], merged, *claims[i + 1 :])
    return (*claims, claim)


def _split(
    claims: tuple[Claim, ...], ends: Callable[[Claim], bool]
) -> tuple[tuple[Claim, ...], tuple[Claim, ...]]:
    return (
        tuple(claim for claim in claims if ends(claim)),
        tuple(claim for claim in claims if not ends(claim)),
    )


class Validity:
    """Until when one watched lock is certainly still held at the server: shared, read anywhere.

    One per watched lock, written only on the manager's thread; a lease
    reads :attr:`deadline` from the job's thread (two attribute reads, no lock).
    """

    __slots__ = ("confirmed", "span")

    def __init__(self, confirmed: int, span: int) -> None:
        #: Monotonic ms at which the last confirmed renewal was sent (or the lock taken).
        self.confirmed = confirmed
        #: How long after :attr:`confirmed` the lock is trusted, in ms.
        self.span = span

    @property
    def deadline(self) -> int:
        """Monotonic ms past which the lock may be gone at the server."""
        return self.confirmed + self.span

    def release(self) -> None:
        """Called once the lock is no longer watched (a shared record frees its cell)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(confirmed={self.confirmed}, deadline={self.deadline})"


class Deadlines:
    """The watched locks' :class:`Validity`, by job id, and the earliest of their deadlines.

    The earliest is kept with a heap whose entries go stale (a lock unwatched,
    a deadline moved) and are dropped once they reach its top: a burst of
    untracks costs a pop each, not a pass over the others each.
    """

    __slots__ = ("_heap", "_order", "_queued", "earliest", "new", "valid")

    def __init__(self, validity: Callable[[str, int, int], Validity] | None = None) -> None:
        #: The watched locks' validity, by job id.
        self.valid: dict[str, Validity] = {}
        #: The earliest deadline of a watched lock (ms), or ``None``.
        self.earliest: int | None = None
        self.new = validity or (lambda _job_id, confirmed, span: Validity(confirmed, span))
        self._heap: list[tuple[int, int, str, Validity]] = []
        self._order = itertools.count()
        #: The least deadline each watched lock has in the heap: a later one needs no entry.
        self._queued: dict[str, int] = {}

    def watch(self, job_id: str, stamp: int, span: int) -> None:
        """Trust ``job_id``'s lock ``span`` ms past a confirmed send (from ``stamp`` if new)."""
        validity = self.valid.get(job_id)
        if validity is None:
            validity = self.valid[job_id] = self.new(job_id, stamp, span)
            self._queued.pop(job_id, None)
        elif validity.span == span:
            return
        validity.span = span
        self._push(job_id, validity)
        self.earliest = self._top()

    def _push(self, job_id: str, validity: Validity) -> None:
        deadline = validity.deadline
        queued = self._queued.get(job_id)
        if queued is None or deadline < queued:
            # A later deadline than its entry's: that entry, once on top, moves it there.
            heapq.heappush(self._heap, (deadline, next(self._order), job_id, validity))
            self._queued[job_id] = deadline
            if len(self._heap) > 2 * len(self.valid) + 2:
                # Stale entries outnumber the live ones: built anew (amortized, a push each).
                self._rebuild()

    def _rebuild(self) -> None:
        order = self._order
        self._heap = [(v.deadline, next(order), job_id, v) for job_id, v in self.valid.items()]
        heapq.heapify(self._heap)
        self._queued = {job_id: deadline for deadline, _, job_id, _ in self._heap}

    def unwatch(self, job_id: str) -> None:
        """Forget the lock's validity; the earliest deadline is then that of the others."""
        validity = self.valid.pop(job_id, None)
        if validity is None:
            return
        self._queued.pop(job_id, None)
        validity.release()
        if validity.deadline == self.earliest:
            self.earliest = self._top()

    def confirm(self, stamps: Mapping[str, int], now: int) -> list[str]:
        """Move each deadline to its lock's last confirmed renewal; return the ids past it.

        A lock whose deadline came at or before ``now`` is returned even if a
        renewal of it was just confirmed: a job that looked then was told it may be lost.
        """
        overdue: list[str] = []
        heap: list[tuple[int, int, str, Validity]] = []
        order = self._order
        for job_id, validity in self.valid.items():
            if validity.deadline <= now:
                overdue.append(job_id)
                continue
            stamp = stamps[job_id]
            validity.confirmed = max(validity.confirmed, stamp)
            heap.append((validity.deadline, next(order), job_id, validity))
        heapq.heapify(heap)
        self._heap = heap
        self._queued = {job_id: deadline for deadline, _, job_id, _ in heap}
        self.earliest = heap[0][0] if heap else None
        return overdue

    def _top(self) -> int | None:
        """The earliest deadline, once the heap's stale entries on top are dropped."""
        heap, valid = self._heap, self.valid
        while heap:
            deadline, _, job_id, validity = heap[0]
            if valid.get(job_id) is not validity:
                heapq.heappop(heap)
            elif validity.deadline != deadline:
                # Moved since (a span, a confirmation read elsewhere): in at its deadline now.
                heapq.heappop(heap)
                if self._queued.get(job_id) == deadline:
                    del self._queued[job_id]
                self._push(job_id, validity)
            else:
                return deadline
        return None


class Due(NamedTuple):
    """A tick's due jobs, as :meth:`JobTable.due` picks them."""

    #: The due ids, the locks not yet renewed first.
    ids: list[str]
    #: Their tokens, in the same order.
    tokens: list[str]
    #: The oldest of their stamps (monotonic ms), or ``None`` when none is due.
    oldest: int | None


class JobTable:
    """Each tracked job's token, when its lock was last known fresh, and who claims it.

    Two flat dicts (id to token, id to monotonic ms) rather than a record per
    job: CPython's garbage collector does not track dicts of only strings and
    ints, and stamping a tick's renewals stores one shared int (so do the
    tracks of one millisecond). The few jobs with more than the one plain
    claim keep their :class:`Holders` in a third dict.

    A lock not yet renewed goes first in its tick's batch: a job tracked during
    a long batch (about a second for 100,000) is not renewed a batch late.
    """

    __slots__ = (
        "_exact",
        "_fresh",
        "_ts",
        "changes",
        "deadlines",
        "lock_duration",
        "margin",
        "newest",
        "stamps",
        "tokens",
        "touched",
        "watches",
    )

    def __init__(
        self,
        lock_duration: int,
        safety_margin: int,
        validity: Callable[[str, int, int], Validity] | None = None,
    ) -> None:
        self.lock_duration = lock_duration
        self.margin = safety_margin
        #: The watched locks' validity and the earliest of their deadlines.
        self.deadlines = Deadlines(validity)
        self.tokens: dict[str, str] = {}
        #: Monotonic ms of the lock's taking or of its last renewal: never
        #: later than the moment the server set its TTL.
        self.stamps: dict[str, int] = {}
        self.watches: dict[str, Holders] = {}
        #: No stamp is later than this (ms): when it is due, every job is.
        self.newest = _NEVER
        #: Ids in the order their locks were taken, holding every lock not yet
        #: renewed: a pointer each, where a set would cost a hash slot. Ids
        #: untracked or taken again since are dropped when it is read.
        self._fresh: list[str] = []
        #: Whether :attr:`_fresh` holds each fresh id once and nothing else.
        self._exact = True
        #: The stamp of the last track: the tracks of one millisecond share it.
        self._ts = _NEVER
        #: Counts the locks let go or replaced: a renewal whose batch was taken
        #: at the same count needs no look at which of its jobs are still held.
        self.changes = 0
        #: When kept (a ``dict``, not ``None``), the ids whose lock or claims
        #: changed since it was last emptied, in order: what a child must hear.
        self.touched: dict[str, None] | None = None

    @property
    def valid(self) -> dict[str, Validity]:
        """The watched locks' validity, by job id."""
        return self.deadlines.valid

    def __len__(self) -> int:
        return len(self.tokens)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self.tokens

    @property
    def fresh(self) -> dict[str, None]:
        """The jobs whose lock this manager has not renewed yet, in the order they were taken."""
        return dict.fromkeys(self._live_fresh())

    def _live_fresh(self) -> list[str]:
        """Return :attr:`_fresh` with each id once, at its last taking, tracked ones only."""
        if not self._exact:
            tokens = self.tokens
            # reversed twice: an id taken again counts from its last taking.
            latest = dict.fromkeys(reversed(self._fresh))
            self._fresh = [job_id for job_id in reversed(latest) if job_id in tokens]
            self._exact = True
        return self._fresh

    def _taken(self, job_id: str, ts: int) -> None:
        """Stamp a new lock ``ts`` and put it among the fresh ones."""
        if ts == self._ts:
            ts = self._ts
        else:
            self._ts = ts
        self.stamps[job_id] = ts
        if ts > self.newest:  # noqa: PLR1730 (no call of max on the hot path)
            self.newest = ts
        fresh = self._fresh
        fresh.append(job_id)
        if len(fresh) > _FRESH_SLACK + 2 * len(self.tokens):
            # Tracked and untracked with no tick between: read it to drop the gone.
            self._live_fresh()

    def claims(self, job_id: str) -> tuple[Claim, ...]:
        """Return the claims on ``job_id``'s lock (none if it is not tracked)."""
        if job_id not in self.tokens:
            return ()
        watch = self.watches.get(job_id)
        return PLAIN_ONLY if watch is None else watch.claims

    def releasing(self, job_id: str) -> bool:
        """Whether a holder of ``job_id``'s lock is deleting it itself (see :class:`Claim`)."""
        watch = self.watches.get(job_id)
        return watch is not None and any(claim.releasing for claim in watch.claims)

    def watched(self, job_id: str) -> bool:
        """Whether somebody watches ``job_id``'s lock (a claim with a target)."""
        watch = self.watches.get(job_id)
        return watch is not None and bool(watch.targets)

    def track(
        self,
        job_id: str,
        token: str,
        ts: int,
        notify: Notify | None = None,
        max_hold: int | None = None,
        keep: bool = False,
        margin: int | None = None,
        releasing: bool = False,
    ) -> tuple[str, tuple[Notify, ...]] | None:
        """Add a claim on a job's lock.

        A claim is named by its target (``notify``, compared by identity). The
        same token again is the same lock: it keeps its older stamp (a progress
        hook's tracks never delay a renewal) and its claims. A new token is a
        new lock: every claim of the old one ends. ``ts`` (when the lock was taken)
        is monotonic ms; ``max_hold`` counts ms from it. The rest are :class:`Claim`'s.

        Returns:
            When a new token replaces a lock somebody waits on: the old token
            and everybody to tell that it is lost (another holder has the job
            now), in the order they asked. ``None`` otherwise.
        """
        held = self.tokens.get(job_id)
        if self.touched is not None:
            self.touched[job_id] = None
        if held is None and notify is None and max_hold is None and not releasing:
            # A plain new job, as most are: nothing else to look at.
            self.tokens[job_id] = token
            self._taken(job_id, ts)
            return None
        if (
            held == token
            and notify is None
            and max_hold is None
            and not releasing
            and job_id not in self.watches
        ):
            return None  # the one plain claim, made again (a progress hook)
        replaced = None
        claims: tuple[Claim, ...]
        if held != token:
            if held is not None:
                self.changes += 1
                if self._fresh:
                    self._exact = False  # it may be among them already
            self.tokens[job_id] = token
            self._taken(job_id, ts)
            gone = self.watches.pop(job_id, None)
            self.deadlines.unwatch(job_id)
            if held is not None and gone is not None and gone.targets:
                replaced = (held, gone.targets)
            claims = ()
        else:
            claims = self.claims(job_id)
        hold_end = None if max_hold is None else ts + max_hold
        self._keep(job_id, _with_claim(claims, Claim(notify, hold_end, keep, margin, releasing)))
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

        ``notify`` ends only that target's claim; ``None`` ends every claim not
        kept for its target (the leases'); ``everyone`` ends them all (the lock is lost).

        Returns:
            What ended, or ``None`` if the job was not tracked (with that token).
        """
        held = self.tokens.get(job_id)
        if held is None or (token is not None and token != held):
            return None
        watch = self.watches.get(job_id)
        if watch is None:
            if notify is not None and not everyone:
                return Ended(held, (), False)
            # The one plain claim, as most jobs have: inlined, an untrack is hot.
            del self.tokens[job_id]
            del self.stamps[job_id]
            self.changes += 1
            if self._fresh:
                self._exact = False
            if not self.tokens:
                self.newest = _NEVER
            if self.touched is not None:
                self.touched[job_id] = None
            return Ended(held, PLAIN_ONLY, True)
        ended: tuple[Claim, ...]
        kept: tuple[Claim, ...]
        if everyone:
            ended, kept = watch.claims, ()
        elif notify is not None:
            ended, kept = _split(watch.claims, lambda claim: claim.target is notify)
        else:
            ended, kept = _split(watch.claims, lambda claim: not claim.keep)
        return self._end(job_id, held, ended, kept)

    def end_claims(self, job_id: str, ends: Callable[[Claim], bool]) -> Ended:
        """End the claims on a tracked ``job_id``'s lock for which ``ends`` is true."""
        ended, kept = _split(self.claims(job_id), ends)
        return self._end(job_id, self.tokens[job_id], ended, kept)

    def _end(
        self, job_id: str, held: str, ended: tuple[Claim, ...], kept: tuple[Claim, ...]
    ) -> Ended:
        if not kept:
            self._drop(job_id)
        elif ended:
            self._keep(job_id, kept)
            if self.touched is not None:
                self.touched[job_id] = None
        return Ended(held, ended, not kept)

    def _keep(self, job_id: str, claims: tuple[Claim, ...]) -> None:
        only = claims[0]
        if (
            len(claims) == 1
            and only.target is None
            and only.hold_end is None
            and not only.releasing
        ):
            self.watches.pop(job_id, None)
            self.deadlines.unwatch(job_id)
            return
        ends = [claim.hold_end for claim in claims if claim.hold_end is not None]
        targets = tuple(claim.target for claim in claims if claim.target is not None)
        self.watches[job_id] = Holders(claims, targets, min(ends) if ends else None)
        if not targets:
            self.deadlines.unwatch(job_id)
            return
        # One deadline per lock: the most careful of its watchers' margins.
        margin = max(self.margin if c.margin is None else c.margin for c in claims if c.target)
        self.deadlines.watch(job_id, self.stamps[job_id], self.lock_duration - margin)

    def _drop(self, job_id: str) -> None:
        self.changes += 1
        if self.touched is not None:
            self.touched[job_id] = None
        del self.tokens[job_id]
        del self.stamps[job_id]
        if self._fresh:
            self._exact = False
        if not self.tokens:
            self.newest = _NEVER
        self.watches.pop(job_id, None)
        self.deadlines.unwatch(job_id)

    def confirm(self, now: int) -> list[str]:
        """Move each watched lock's deadline to its last confirmed renewal; return those past it.

        Call it with the time the renewals' answer was read (after
        :meth:`stamp`), or with any time to look for deadlines passed.
        """
        return self.deadlines.confirm(self.stamps, now)

    def ids(self) -> list[str]:
        """Return the tracked ids, in tracking order."""
        return list(self.tokens)

    def due(self, now: int, threshold: int) -> Due:
        """Return the due ids and their tokens, the locks not yet renewed first.

        A job is due when ``ts + threshold < now``; a job somebody waits on
        (a ``notify`` target: a lease, a job actor) is checked at every tick,
        ``ts < now``, so that a lost lock is found within one interval.
        """
        stamps, tokens = self.stamps, self.tokens
        if self.newest + threshold < now:
            # Every job is due, as when one batch renewed them all: no pass in Python.
            due = list(stamps)
            due_tokens = list(tokens.values())
            oldest = min(stamps.values(), default=None)
            if self._fresh and due:
                due, due_tokens = self._fresh_first(due, due_tokens, now, threshold, every=True)
            return Due(due, due_tokens, oldest)
        # One mask for all three: the two dicts gain and lose keys together, in one order.
        mask = due_mask(stamps, now, threshold)
        due = list(compress(stamps, mask))
        due_tokens = list(compress(tokens.values(), mask))
        oldest = min(compress(stamps.values(), mask), default=None)
        if self.watches:
            cutoff = now - threshold
            watched = [
                job_id
                for job_id, watch in self.watches.items()
                if watch.targets and cutoff <= stamps[job_id] < now
            ]
            if watched:
                due.extend(watched)
                due_tokens.extend(map(tokens.__getitem__, watched))
                # Later than the cutoff: older than any plainly due stamp only when none is due.
                oldest = min(map(stamps.__getitem__, watched)) if oldest is None else oldest
        if self._fresh and due:
            due, due_tokens = self._fresh_first(due, due_tokens, now, threshold)
        return Due(due, due_tokens, oldest)

    def _fresh_first(
        self,
        due: list[str],
        due_tokens: list[str],
        now: int,
        threshold: int,
        *,
        every: bool = False,
    ) -> tuple[list[str], list[str]]:
        stamps, watches = self.stamps, self.watches
        cutoff = now - threshold
        fresh = self._live_fresh()
        # The fresh jobs in ``due`` (the rule above), found without a pass over
        # ``due``; all of them when ``every`` job is due.
        first = (
            fresh
            if every
            else [
                job_id
                for job_id in fresh
                if stamps[job_id] < cutoff
                or (
                    (watch := watches.get(job_id)) is not None
                    and watch.targets
                    and stamps[job_id] < now
                )
            ]
        )
        if not first:
            return due, due_tokens
        count = len(first)
        if due[-count:] == first:
            # As a rule the fresh jobs are the newest, last: moving them is a slice.
            if count == len(due):
                return due, due_tokens
            return first + due[:-count], due_tokens[-count:] + due_tokens[:-count]
        first_tokens = list(map(self.tokens.__getitem__, first))
        led = dict.fromkeys(first)
        rest = [i for i, job_id in enumerate(due) if job_id not in led]
        return first + [due[i] for i in rest], first_tokens + [due_tokens[i] for i in rest]

    def stamp(
        self,
        job_ids: Sequence[str],
        ts: int,
        pause: Callable[[], object] | None = None,
        *,
        raise_only: bool = False,
    ) -> None:
        """Stamp ``job_ids`` (in the order :meth:`due` gave) as renewed at ``ts`` (monotonic ms).

        With ``pause``, it is called before each :data:`STAMP_SLICE` stamps (a
        thread yields the interpreter there). With ``raise_only``, a later stamp
        stays (a renewal confirmed by another side, after a newer lock was taken).
        """
        if self._fresh:
            fresh = self._live_fresh()
            # The fresh ones lead (see due); renewed once, they are fresh no more.
            if list(job_ids[: len(fresh)]) == fresh:
                self._fresh = []  # all of them, as after a burst of tracks
            else:
                left = dict.fromkeys(fresh)
                for job_id in job_ids:
                    if job_id not in left:
                        break
                    del left[job_id]
                self._fresh = list(left)
        stamps = self.stamps
        size = STAMP_SLICE if pause is not None else max(len(job_ids), 1)
        for start in range(0, len(job_ids), size):
            if pause is not None:
                pause()
            if raise_only:
                for job_id in job_ids[start : start + size]:
                    if stamps[job_id] < ts:  # noqa: PLR1730 (no call of max per job)
                        stamps[job_id] = ts
            else:
                for job_id in job_ids[start : start + size]:
                    stamps[job_id] = ts
        self.newest = max(self.newest, ts)

    def over_hold(self, now: int) -> list[str]:
        """Return the ids of the jobs with a claim whose hold end is at or before ``now``."""
        return [
            job_id
            for job_id, watch in self.watches.items()
            if watch.hold_end is not None and watch.hold_end <= now
        ]


#: How many lost ``(job, token)`` pairs a manager remembers, the oldest
#: forgotten first: a lock tracked again within that many losses of its own
#: is neither renewed nor reported again.
RECENTLY_LOST: Final = 10_000


class LostLocks:
    """The recently lost locks, by ``(job, token)``: at most ``size``, the least recent forgotten.

    Each with why it was lost (``None`` while other claims still renew it)
    and who was told, so that a holder tracking its lost lock again (a progress
    hook) restarts neither its renewal nor its reports.
    """

    __slots__ = ("_lost", "size")

    def __init__(self, size: int = RECENTLY_LOST) -> None:
        self.size = size
        self._lost: OrderedDict[tuple[str, str], tuple[Reason | None, tuple[Notify | None, ...]]]
        self._lost = OrderedDict()

    def __len__(self) -> int:
        return len(self._lost)

    def get(
        self, job_id: str, token: str
    ) -> tuple[Reason | None, tuple[Notify | None, ...]] | None:
        """Return why the lock was lost and who was told, and remember it longest now."""
        key = (job_id, token)
        known = self._lost.get(key)
        if known is not None:
            self._lost.move_to_end(key)
        return known

    def was_told(self, job_id: str, token: str, target: Notify | None) -> bool:
        """Whether ``target`` was told of the loss of the lock (or its claim ended)."""
        known = self._lost.get((job_id, token))
        return known is not None and any(told is target for told in known[1])

    def add(
        self, job_id: str, token: str, reason: Reason | None, told: Sequence[Notify | None]
    ) -> None:
        """Remember that the claims of ``told`` on the lock ended (with a reason: the lock too)."""
        key = (job_id, token)
        known = self._lost.pop(key, None)
        before: tuple[Notify | None, ...] = () if known is None else known[1]
        added = tuple(t for t in told if not any(k is t for k in before))
        if known is not None and known[0] is not None:
            reason = known[0]
        self._lost[key] = (reason, before + added)
        if len(self._lost) > self.size:
            self._lost.popitem(last=False)
