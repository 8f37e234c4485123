"""What a manager decides, as pure functions over its books: no I/O, no threads, no user code.

Each decision changes the books and adds what is to be said to a
:class:`Report`; the manager delivers the report once its step is done.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pykka

from actors.jobs import JobTable, LostLocks
from actors.messages import (
    EXPIRED,
    MANAGER_STOPPED,
    MAX_HOLD,
    STOLEN,
    UNCONFIRMED,
    BatchOutcome,
    LockLost,
    LostLock,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from actors.jobs import Claim, Ended, Validity
    from actors.messages import Notify, Reason

__all__ = ["Books", "Report"]


@dataclass(slots=True)
class Report:
    """What one step decided, for the callbacks and the targets: delivered once, in this order."""

    #: The ids renewed, for ``on_locks_renewed``.
    renewed: list[str] = field(default_factory=list)
    #: The lost locks, already untracked, for ``on_lock_renewal_failed``.
    lost: list[LostLock] = field(default_factory=list)
    #: The error of a renewal that did not run (or of its first chunk that
    #: did not), for ``on_error``.
    error: Exception | None = None
    #: How many ids of the batch are in an unknown state (their calls did not run).
    unknown: int = 0
    #: One :class:`~actors.LockLost` per target whose claim ended, in the order
    #: the claims were made: told after the callbacks.
    tells: list[tuple[Notify, LockLost]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.renewed or self.lost or self.error or self.tells)


class Books:
    """A manager's job table and its memory of lost locks, and the decisions over them."""

    __slots__ = ("jobs", "lost")

    def __init__(
        self,
        lock_duration: int,
        safety_margin: int,
        validity: Callable[[str, int, int], Validity] | None = None,
    ) -> None:
        self.jobs = JobTable(lock_duration, safety_margin, validity)
        self.lost = LostLocks()

    def track(
        self,
        job_id: str,
        token: str,
        ts: int,
        notify: Notify | None,
        max_hold: int | None,
        keep: bool,
        margin: int | None,
        report: Report,
        releasing: bool = False,
    ) -> bool:
        """Add a claim; return whether it was made (not a lock lost lately, tracked again).

        A lock lost lately is neither renewed nor reported again; a target that
        did not hear of it yet hears now, once. A new token on a watched lock
        tells the old lock's targets ``"stolen"``.
        """
        lost = self.lost
        known = lost.get(job_id, token) if lost else None
        if known is not None:
            reason, told = known
            if reason is not None:
                # Lost: never renewed again; a target not told yet is told now, once.
                if notify is not None and not any(t is notify for t in told):
                    lost.add(job_id, token, None, (notify,))
                    report.tells.append((notify, LockLost(job_id, token, reason)))
                return False
            if any(t is notify for t in told):
                return False  # this claim ended (its hold limit) while others keep the lock
        replaced = self.jobs.track(job_id, token, ts, notify, max_hold, keep, margin, releasing)
        if replaced is not None:
            old, targets = replaced
            detail = f"this worker took the job again with the token {token!r}"
            report.tells.extend((t, LockLost(job_id, old, STOLEN, detail)) for t in targets)
            self.lost.add(job_id, old, STOLEN, targets)
        return True

    def expire_holds(self, now: int, report: Report) -> None:
        """End the claims past their hold limit; a lock with none left is let go, and reported."""
        jobs = self.jobs
        for job_id in jobs.over_hold(now):
            hold_end = jobs.watches[job_id].hold_end or now
            detail = f"held past its hold limit by {now - hold_end} ms"
            ended = jobs.end_claims(
                job_id, lambda claim: claim.hold_end is not None and claim.hold_end <= now
            )
            self._tell(job_id, ended, MAX_HOLD, detail, report)
            if ended.last:
                report.lost.append(LostLock(LockLost(job_id, ended.token, MAX_HOLD, detail)))
            self._remember(job_id, ended, MAX_HOLD if ended.last else None)

    def unconfirmed(self, now: int, report: Report, *, why: str = "") -> list[str]:
        """Let go of the watched locks past their deadline at ``now``; return their ids.

        ``why`` (failed ticks, a pause) is added to each loss's detail.
        """
        jobs = self.jobs
        if not jobs.valid:
            return []
        overdue = jobs.confirm(now)
        for job_id in overdue:
            validity = jobs.valid[job_id]
            detail = (
                f"no renewal confirmed for {now - validity.confirmed} ms (trusted for "
                f"{validity.span} ms after a confirmed send, lock_duration "
                f"{jobs.lock_duration} ms)"
            )
            self.forget(job_id, UNCONFIRMED, report, detail="; ".join(filter(None, [detail, why])))
        return overdue

    def apply(
        self,
        due: list[str],
        tokens: list[str],
        outcome: BatchOutcome | BaseException,
        at: int,
        answered: int,
        report: Report,
        *,
        changes: int | None = None,
        why: str = "",
    ) -> None:
        """Stamp the renewed locks at ``at``, untrack the lost ones, and say both in ``report``.

        A renewal that raised, or a chunk that did not run, renews and loses
        nothing: its jobs keep their stamps for the next try. Only ids of this
        batch still held with the batch's token count (an untrack or a new
        token may have come first), and an id reported twice is lost once. A
        watched lock whose renewal's answer (read at ``answered``, monotonic
        ms) came after its deadline is let go, ``"unconfirmed"``.

        ``changes`` is the table's :attr:`~actors.jobs.JobTable.changes` when
        the batch was taken (``None``: it cannot have changed since); ``why``
        is added to the detail of a late answer's loss.
        """
        jobs = self.jobs
        late = "a renewal's answer came only after the deadline"
        if not isinstance(outcome, BatchOutcome):
            # A BaseException too: left to pykka, it would stop every actor.
            error = outcome if isinstance(outcome, Exception) else RuntimeError(repr(outcome))
            report.error = report.error or error
            report.unknown += len(due)
            # The failed call took time: a watched deadline may have passed meanwhile.
            self.unconfirmed(answered, report, why=why)
            return
        settled = changes is None or changes == jobs.changes
        if settled and not outcome.failed and not outcome.errors:
            jobs.stamp(due, at)
            renewed = due
        else:
            held = jobs.tokens
            token_of = dict(zip(due, tokens, strict=True))
            failed = {job_id for job_id in outcome.failed if job_id in token_of}
            for job_id in dict.fromkeys(outcome.failed):
                token = token_of.get(job_id)
                if token is not None and held.get(job_id) == token:
                    reason = outcome.reasons.get(job_id, EXPIRED)
                    if reason == EXPIRED and jobs.releasing(job_id):
                        self.released(job_id)
                        continue
                    detail = self._found(job_id, reason, at)
                    self.forget(job_id, reason, report, token=token, detail=detail)
            for chunk in outcome.errors:
                failed.update(due[chunk.start : chunk.stop])
                report.unknown += chunk.stop - chunk.start
            if outcome.errors and report.error is None:
                report.error = outcome.errors[0].error
            renewed = [
                job_id
                for job_id, token in zip(due, tokens, strict=True)
                if job_id not in failed and (settled or held.get(job_id) == token)
            ]
            jobs.stamp(renewed, at)
        report.renewed.extend(self.settle(renewed, answered, report, why=f"{late}; {why}"))

    def settle(
        self, renewed: list[str], answered: int, report: Report, *, why: str = ""
    ) -> list[str]:
        """Let go of the watched locks past their deadline; return ``renewed`` without them.

        After a renewal's stamps, at ``answered``: a lock whose answer came
        after its deadline is lost ``"unconfirmed"``, never renewed too. ``why`` is
        added to each loss's detail.
        """
        if not self.jobs.valid:
            return renewed
        gone = set(self.unconfirmed(answered, report, why=why.strip("; ")))
        return [job_id for job_id in renewed if job_id not in gone] if gone else renewed

    def renewed_whole(
        self, due: list[str], outcome: BatchOutcome | BaseException, changes: int
    ) -> bool:
        """Whether a renewal renewed all of ``due`` with the books as it found them.

        Then :meth:`apply` would only stamp ``due`` and report it renewed:
        no lock is lost or watched, and nothing was let go or replaced since
        the batch was taken (``changes``, see :meth:`apply`).
        """
        return (
            type(outcome) is BatchOutcome
            and not outcome.failed
            and not outcome.errors
            and changes == self.jobs.changes
            and not self.jobs.valid
        )

    def _found(self, job_id: str, reason: Reason, at: int) -> str:
        """Say what a renewal that found the lock lost tells, from what is known already."""
        stamp = self.jobs.stamps.get(job_id)
        age = "" if stamp is None else f"{at - stamp} ms after its last renewal or taking"
        if reason == STOLEN:
            return f"the lock holds another worker's token (found {age})"
        duration = self.jobs.lock_duration
        if stamp is not None and at - stamp < duration:
            return (
                f"the lock key was gone {age}, before its {duration} ms could run out: "
                f"deleted, or lost by the server (a restart, a failover)"
            )
        return f"the lock key was gone {age}: it expired ({duration} ms without a renewal)"

    def bury(self, report: Report) -> tuple[list[str], list[tuple[str, str]]]:
        """End the claims of targets that are no longer alive: a pykka monitor's ``DOWN``.

        A target is dead when it is a ``pykka.ActorRef`` whose actor stopped or
        crashed; any other is taken as alive. Nobody is told: the holder is gone.

        Returns:
            The ids whose claims ended, and the ``(job_id, token)`` of each lock
            no claim holds any more, to delete if it still holds its token.
        """
        jobs = self.jobs
        ended_ids: list[str] = []
        orphans: list[tuple[str, str]] = []
        for job_id, watch in list(jobs.watches.items()):
            dead = [target for target in watch.targets if not _alive(target)]
            if not dead:
                continue
            ended = jobs.end_claims(job_id, _by_any_of(dead))
            self._remember(job_id, ended, None)
            ended_ids.append(job_id)
            if ended.last:
                orphans.append((job_id, ended.token))
        return ended_ids, orphans

    def let_go(self, report: Report) -> None:
        """Untrack every watched lock, telling each target ``"manager_stopped"`` ."""
        for job_id in list(self.jobs.watches):
            ended = self.jobs.untrack(job_id, everyone=True)
            if ended is not None:
                self._tell(job_id, ended, MANAGER_STOPPED, "the manager stopped", report)

    def forget(
        self,
        job_id: str,
        reason: Reason,
        report: Report,
        *,
        token: str | None = None,
        detail: str = "",
    ) -> None:
        """Untrack a job whose lock is lost, tell each of its targets, and report the loss."""
        ended = self.jobs.untrack(job_id, everyone=True)
        held = token or (ended.token if ended is not None else "")
        if ended is not None:
            self._tell(job_id, ended, reason, detail, report)
            self._remember(job_id, ended, reason)
        report.lost.append(LostLock(LockLost(job_id, held, reason, detail)))

    def released(self, job_id: str) -> None:
        """End the claims releasing a lock found gone (their move deleted it): nobody told.

        Not remembered as lost: the same token may take the job again (a
        retry fetched at once). Claims that were not releasing it (such a
        retry's, tracked while the renewal was on its way) keep it tracked:
        the next renewal finds whether it holds, and says so if not.
        """
        self.jobs.end_claims(job_id, lambda claim: claim.releasing)

    def _tell(self, job_id: str, ended: Ended, reason: Reason, detail: str, report: Report) -> None:
        # One LockLost each: a target that raises its message must not leave
        # its traceback on another's.
        report.tells.extend(
            (claim.target, LockLost(job_id, ended.token, reason, detail))
            for claim in ended.claims
            if claim.target is not None
        )

    def _remember(self, job_id: str, ended: Ended, reason: Reason | None) -> None:
        self.lost.add(job_id, ended.token, reason, [claim.target for claim in ended.claims])


def _by_any_of(targets: list[Notify]) -> Callable[[Claim], bool]:
    def made_by(claim: Claim) -> bool:
        return any(claim.target is target for target in targets)

    return made_by


def _alive(target: object) -> bool:
    # The read of a plain pykka ref's event, with no code of the target's run
    # (no __class__, no override, no property): it could block or raise.
    if type(target) is not pykka.ActorRef:
        return True
    stopped = target.actor_stopped
    return type(stopped) is not threading.Event or not stopped.is_set()
