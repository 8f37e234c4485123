"""A manager's decisions over its books, without an actor and without Redis.

Each decision changes the :class:`~actors.books.Books` and says what it
decided in a :class:`~actors.books.Report`: the ids renewed, the locks lost,
the error, and one word per target to tell.
"""

from __future__ import annotations

from typing import Any

import pykka
from redis.exceptions import ResponseError

from actors.books import Books, Report
from actors.jobs import Claim
from actors.messages import (
    EXPIRED,
    MANAGER_STOPPED,
    MAX_HOLD,
    STOLEN,
    UNCONFIRMED,
    BatchOutcome,
    ChunkError,
    LockLost,
    LostLock,
)
from tests.support import Inbox

LOCK = 30_000
MARGIN = 1000
AT = 10_000


def tracked(*job_ids: str, ts: int = 0) -> Books:
    """Books holding ``job_ids``, each with the token ``"t-" + id``, taken at ``ts``."""
    books = Books(LOCK, MARGIN)
    for job_id in job_ids:
        assert books.track(job_id, f"t-{job_id}", ts, None, None, False, None, Report())
    return books


def watch(
    books: Books,
    job_id: str,
    target: Inbox | pykka.ActorRef[Any],
    ts: int = 0,
    *,
    max_hold: int | None = None,
    keep: bool = False,
    releasing: bool = False,
) -> Report:
    """Add ``target``'s claim on the job's lock (token ``"t-" + id``); return what it said."""
    report = Report()
    books.track(job_id, f"t-{job_id}", ts, target, max_hold, keep, None, report, releasing)
    return report


def batch(books: Books) -> tuple[list[str], list[str]]:
    """Every tracked job as one batch, with its tokens."""
    ids = books.jobs.ids()
    return ids, [books.jobs.tokens[job_id] for job_id in ids]


def apply(
    books: Books,
    outcome: BatchOutcome | BaseException,
    *,
    answered: int = AT,
    why: str = "",
    changes: int | None = None,
    due: tuple[list[str], list[str]] | None = None,
) -> Report:
    """Apply ``outcome`` to a batch of every tracked job, renewed at :data:`AT`."""
    ids, tokens = batch(books) if due is None else due
    report = Report()
    books.apply(ids, tokens, outcome, AT, answered, report, changes=changes, why=why)
    return report


def told(report: Report) -> list[tuple[Inbox, LockLost]]:
    """Each target told, with what (the targets are the tests' inboxes)."""
    return [(target, lost) for target, lost in report.tells if isinstance(target, Inbox)]


# -- a renewal's answer ------------------------------------------------------------


def test_a_batch_renewed_whole_is_stamped_and_reported_renewed() -> None:
    books = tracked("a", "b")

    report = apply(books, BatchOutcome([], []))

    assert report.renewed == ["a", "b"]
    assert report.lost == [] and report.tells == [] and report.error is None
    assert books.jobs.stamps == {"a": AT, "b": AT}


def test_an_expired_lock_is_untracked_and_reported_with_its_token() -> None:
    books = tracked("a", "b", ts=AT - LOCK - 1)

    report = apply(books, BatchOutcome(["a"], []))

    assert report.renewed == ["b"]
    [lost] = report.lost
    assert (lost.job_id, lost.token, lost.reason) == ("a", "t-a", EXPIRED)
    assert "expired" in lost.detail
    assert books.jobs.ids() == ["b"]
    assert books.jobs.stamps["b"] == AT
    # Remembered: a track of the same lock again renews nothing.
    assert books.lost.get("a", "t-a") == (EXPIRED, (None,))


def test_a_lock_gone_before_its_ttl_ran_out_says_it_was_deleted_or_lost_by_the_server() -> None:
    books = tracked("a", ts=AT - 100)

    [lost] = apply(books, BatchOutcome(["a"], [], {"a": EXPIRED})).lost

    assert "100 ms after its last renewal" in lost.detail
    assert "deleted, or lost by the server" in lost.detail


def test_a_stolen_lock_tells_its_target_once_and_is_remembered_as_stolen() -> None:
    books = tracked("a")
    target = Inbox()
    watch(books, "a", target)

    report = apply(books, BatchOutcome(["a"], [], {"a": STOLEN}))

    assert [lost.reason for lost in report.lost] == [STOLEN]
    assert "another worker's token" in report.lost[0].detail
    assert told(report) == [(target, LockLost("a", "t-a", STOLEN))]
    assert books.lost.get("a", "t-a") == (STOLEN, (None, target))
    assert "a" not in books.jobs
    assert target.got == []  # told by the manager's delivery, not by the books


def test_the_jobs_of_a_chunk_that_did_not_run_keep_their_stamp_and_stay_tracked() -> None:
    books = tracked("a", "b", "c", "d")
    error = ResponseError("BUSY")

    report = apply(books, BatchOutcome([], [ChunkError(2, 4, error)]))

    assert report.renewed == ["a", "b"]
    assert report.lost == []
    assert report.error is error
    assert report.unknown == 2
    assert books.jobs.stamps == {"a": AT, "b": AT, "c": 0, "d": 0}


def test_a_renewer_that_raised_changes_nothing_and_reports_its_error() -> None:
    books = tracked("a", "b")
    error = ConnectionError("refused")

    report = apply(books, error)

    assert report.error is error
    assert report.unknown == 2
    assert report.renewed == [] and report.lost == []
    assert books.jobs.stamps == {"a": 0, "b": 0}


def test_a_base_exception_from_the_renewer_is_reported_as_an_error() -> None:
    books = tracked("a")

    report = apply(books, KeyboardInterrupt())

    assert isinstance(report.error, RuntimeError)
    assert "KeyboardInterrupt" in str(report.error)
    assert books.jobs.ids() == ["a"]


def test_an_id_reported_twice_in_one_batch_is_lost_once() -> None:
    books = tracked("a", "b")

    report = apply(books, BatchOutcome(["a", "a"], []))

    assert [lost.job_id for lost in report.lost] == ["a"]
    assert report.renewed == ["b"]


def test_ids_the_renewer_made_up_are_dropped() -> None:
    books = tracked("a", "b", "elsewhere")

    report = apply(
        books, BatchOutcome(["ghost", "elsewhere"], []), due=(["a", "b"], ["t-a", "t-b"])
    )

    assert report.renewed == ["a", "b"]
    assert report.lost == []
    assert "elsewhere" in books.jobs
    assert books.jobs.stamps["elsewhere"] == 0


def test_a_renewal_answered_after_the_books_changed_touches_only_the_locks_it_sent() -> None:
    # The renewal runs on its own thread while the manager goes on: an
    # untrack, or a new token, may come before its answer.
    books = tracked("a", "b", "c")
    due = batch(books)
    changes = books.jobs.changes
    books.jobs.untrack("a", None, None)
    books.track("b", "t-new", 5, None, None, False, None, Report())

    report = apply(books, BatchOutcome(["a", "b"], [], {"b": STOLEN}), changes=changes, due=due)

    assert report.lost == [] and report.renewed == ["c"]
    assert books.jobs.tokens == {"b": "t-new", "c": "t-c"}
    # The new lock of b keeps the stamp of its taking: it was not renewed.
    assert books.jobs.stamps == {"b": 5, "c": AT}


def test_a_watched_lock_answered_after_its_deadline_is_lost_unconfirmed() -> None:
    books = tracked("b")
    target = Inbox()
    watch(books, "a", target)
    why = "2 tick(s) failed since, the last with ConnectionError: refused"
    answered = LOCK - MARGIN  # the deadline itself

    report = apply(books, BatchOutcome([], []), answered=answered, why=why)

    assert report.renewed == ["b"]
    [lost] = report.lost
    assert (lost.job_id, lost.reason) == ("a", UNCONFIRMED)
    assert "no renewal confirmed for 29000 ms" in lost.detail
    assert "answer came only after the deadline" in lost.detail
    assert why in lost.detail
    assert [note for _, note in told(report)] == [LockLost("a", "t-a", UNCONFIRMED)]
    assert "a" not in books.jobs


def test_a_renewal_applied_after_its_own_deadline_is_lost_and_never_renewed_too() -> None:
    # A process-mode worker applies a child's tick late (a GIL hold in the
    # worker): the renewal sent at AT was confirmed, but its deadline passed.
    books = tracked("b")
    target = Inbox()
    watch(books, "a", target)
    books.jobs.stamp(["a", "b"], AT, raise_only=True)
    report = Report()

    renewed = books.settle(["a", "b"], AT + LOCK - MARGIN, report, why="a pause")

    assert renewed == ["b"]
    assert [(lost.job_id, lost.reason) for lost in report.lost] == [("a", UNCONFIRMED)]
    assert report.lost[0].detail.endswith("a pause")
    assert [note for _, note in told(report)] == [LockLost("a", "t-a", UNCONFIRMED)]
    assert "a" not in books.jobs and "b" in books.jobs


def test_a_renewal_that_raised_after_a_watched_deadline_lets_that_lock_go_unconfirmed() -> None:
    # The failed call took its time: the deadline passed while it was out, and
    # nobody confirmed the lock. Decided with the failure, before its callbacks.
    books = tracked("b")
    target = Inbox()
    watch(books, "a", target)
    error = ConnectionError("reset")

    report = apply(books, error, answered=LOCK - MARGIN, why="1 tick(s) failed since")

    assert report.error is error
    assert [(lost.job_id, lost.reason) for lost in report.lost] == [("a", UNCONFIRMED)]
    assert "1 tick(s) failed since" in report.lost[0].detail
    assert told(report) == [(target, LockLost("a", "t-a", UNCONFIRMED))]
    assert books.jobs.ids() == ["b"]


def test_a_confirmed_renewal_moves_a_watched_locks_deadline_on() -> None:
    books = Books(LOCK, MARGIN)
    watch(books, "a", Inbox())

    report = apply(books, BatchOutcome([], []), answered=AT + 5)

    assert report.renewed == ["a"]
    assert books.jobs.valid["a"].deadline == AT + LOCK - MARGIN
    assert books.jobs.deadlines.earliest == AT + LOCK - MARGIN


def test_a_lock_its_holder_is_deleting_found_gone_is_no_loss() -> None:
    books = Books(LOCK, MARGIN)
    target = Inbox()
    watch(books, "a", target, releasing=True)

    report = apply(books, BatchOutcome(["a"], [], {"a": EXPIRED}))

    assert report.lost == [] and report.tells == [] and report.renewed == []
    assert "a" not in books.jobs


def test_a_claim_not_releasing_a_lock_found_gone_hears_of_it_from_the_next_renewal() -> None:
    books = tracked("a")
    mover, watcher = Inbox(), Inbox()
    watch(books, "a", mover, releasing=True)
    watch(books, "a", watcher)

    report = apply(books, BatchOutcome(["a"], [], {"a": EXPIRED}))
    assert report.lost == [] and report.tells == []
    assert [claim.target for claim in books.jobs.claims("a")] == [None, watcher]

    report = apply(books, BatchOutcome(["a"], [], {"a": EXPIRED}))
    assert told(report) == [(watcher, LockLost("a", "t-a", EXPIRED))]
    assert [lost.reason for lost in report.lost] == [EXPIRED]


def test_a_job_taken_again_with_the_token_of_its_released_lock_is_renewed_and_watched() -> None:
    # A retry fetched at once by the same worker may carry the token of the run that moved it.
    books = tracked("a")
    first, second = Inbox(), Inbox()
    watch(books, "a", first, releasing=True)
    apply(books, BatchOutcome(["a"], [], {"a": EXPIRED}))

    report = Report()
    assert books.track("a", "t-a", AT + 1, second, None, False, None, report)
    assert report.tells == [] and "a" in books.jobs

    # Renewed as any lock: found gone now, it is lost and its new holder is told.
    report = apply(books, BatchOutcome(["a"], [], {"a": EXPIRED}))
    assert told(report) == [(second, LockLost("a", "t-a", EXPIRED))]
    assert [lost.reason for lost in report.lost] == [EXPIRED]


def test_a_lock_its_holder_is_deleting_found_stolen_is_lost() -> None:
    books = tracked("a")
    target = Inbox()
    watch(books, "a", target, releasing=True)

    report = apply(books, BatchOutcome(["a"], [], {"a": STOLEN}))

    assert [lost.reason for lost in report.lost] == [STOLEN]
    assert told(report) == [(target, LockLost("a", "t-a", STOLEN))]


# -- tracks ---------------------------------------------------------------------


def test_a_new_token_tells_each_watcher_of_the_old_lock_it_is_stolen() -> None:
    books = Books(LOCK, MARGIN)
    a, b = Inbox(), Inbox()
    watch(books, "j", a)
    watch(books, "j", b)

    report = Report()
    assert books.track("j", "t-again", 5, None, None, False, None, report)

    assert told(report) == [(a, LockLost("j", "t-j", STOLEN)), (b, LockLost("j", "t-j", STOLEN))]
    assert "took the job again with the token 't-again'" in report.tells[0][1].detail
    assert report.lost == []  # the job is held: by this worker's new run
    assert books.jobs.tokens == {"j": "t-again"}


def test_a_lost_lock_tracked_again_is_not_renewed_and_a_new_target_is_told_once() -> None:
    books = tracked("a")
    first = Inbox()
    watch(books, "a", first)
    apply(books, BatchOutcome(["a"], [], {"a": EXPIRED}))
    late = Inbox()

    again = watch(books, "a", late)
    twice = watch(books, "a", late)
    first_again = watch(books, "a", first)

    assert told(again) == [(late, LockLost("a", "t-a", EXPIRED))]
    assert twice.tells == [] and first_again.tells == []
    assert "a" not in books.jobs


def test_a_claim_ended_by_its_hold_limit_does_not_begin_again() -> None:
    books = tracked("j")
    target = Inbox()
    watch(books, "j", target, max_hold=100)
    books.expire_holds(100, Report())

    assert watch(books, "j", target, ts=150).tells == []

    assert books.jobs.claims("j") == (Claim(None, None),)


# -- what a tick looks at ----------------------------------------------------------


def test_a_claims_hold_limit_ends_that_claim_alone_and_tells_its_target() -> None:
    books = tracked("j")
    target = Inbox()
    watch(books, "j", target, max_hold=100)

    early = Report()
    books.expire_holds(99, early)
    report = Report()
    books.expire_holds(130, report)

    assert not early
    assert told(report) == [(target, LockLost("j", "t-j", MAX_HOLD))]
    assert report.tells[0][1].detail == "held past its hold limit by 30 ms"
    # The plain claim keeps the lock renewed: no loss is reported.
    assert report.lost == []
    assert "j" in books.jobs and not books.jobs.watched("j")


def test_the_last_claims_hold_limit_lets_the_lock_go_and_reports_it() -> None:
    books = Books(LOCK, MARGIN)
    target = Inbox()
    watch(books, "j", target, max_hold=100)

    report = Report()
    books.expire_holds(100, report)

    assert [(lost.job_id, lost.token, lost.reason) for lost in report.lost] == [
        ("j", "t-j", MAX_HOLD)
    ]
    assert told(report) == [(target, LockLost("j", "t-j", MAX_HOLD))]
    assert "j" not in books.jobs
    assert books.lost.get("j", "t-j") == (MAX_HOLD, (target,))


def test_a_watched_lock_past_its_deadline_is_let_go_unconfirmed() -> None:
    books = tracked("plain")
    target = Inbox()
    watch(books, "a", target)

    before = Report()
    assert books.unconfirmed(LOCK - MARGIN - 1, before) == []
    report = Report()
    assert books.unconfirmed(LOCK - MARGIN, report, why="the manager did not run") == ["a"]

    assert not before
    [lost] = report.lost
    assert (lost.job_id, lost.reason) == ("a", UNCONFIRMED)
    assert lost.detail.endswith("; the manager did not run")
    assert told(report) == [(target, LockLost("a", "t-a", UNCONFIRMED))]
    assert books.jobs.ids() == ["plain"]


class Holder(pykka.ThreadingActor):
    """A job actor: a holder that dies when it stops."""


def test_a_dead_holders_claim_ends_untold_and_its_orphaned_lock_is_handed_back() -> None:
    books = tracked("shared")
    dead, living = Holder.start(), Holder.start()
    watch(books, "shared", dead)
    watch(books, "alone", dead)
    watch(books, "kept", living)
    dead.stop()

    report = Report()
    ended, orphans = books.bury(report)

    assert ended == ["shared", "alone"]
    assert orphans == [("alone", "t-alone")]
    assert not report
    assert books.jobs.ids() == ["shared", "kept"]
    assert not books.jobs.watched("shared")


class Hostile(Inbox):
    """A target whose own ``is_alive`` would stop, block or lie on the manager's thread."""

    def is_alive(self) -> bool:
        raise SystemExit("not on the manager's thread")


class HostileRef(pykka.ActorRef[Any]):
    """A pykka reference whose override of ``is_alive`` must never be called."""

    def is_alive(self) -> bool:
        raise SystemExit("not on the manager's thread")


class PosingAsRef(Inbox):
    """A target whose ``__class__`` says it is a pykka ref, and raises when read."""

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        raise RuntimeError("not on the manager's thread")


def test_no_code_of_a_target_runs_to_say_whether_it_is_alive() -> None:
    # A target's is_alive (or __class__) that raised, even a BaseException, or
    # blocked once stopped or froze every renewal: only a plain pykka ref's
    # own event is read; any other target is taken as alive.
    books = Books(LOCK, MARGIN)
    watch(books, "plain-object", Hostile())
    watch(books, "posing", PosingAsRef())
    subclassed = Holder.start()
    subclassed.__class__ = HostileRef
    watch(books, "subclassed-ref", subclassed)
    plain = Holder.start()
    watch(books, "plain-ref", plain)

    assert books.bury(Report()) == ([], [])
    subclassed.__class__ = pykka.ActorRef  # pykka's own stop asks is_alive too
    subclassed.stop()
    subclassed.__class__ = HostileRef
    plain.stop()
    assert books.bury(Report()) == (["plain-ref"], [("plain-ref", "t-plain-ref")])
    assert books.jobs.ids() == ["plain-object", "posing", "subclassed-ref"]


def test_letting_go_tells_every_watcher_the_manager_stopped_and_nobody_else() -> None:
    books = tracked("plain")
    a, b = Inbox(), Inbox()
    watch(books, "j", a)
    watch(books, "j", b, keep=True)

    report = Report()
    books.let_go(report)

    assert told(report) == [
        (a, LockLost("j", "t-j", MANAGER_STOPPED)),
        (b, LockLost("j", "t-j", MANAGER_STOPPED)),
    ]
    assert report.lost == []
    assert books.jobs.ids() == ["plain"]


def test_forgetting_a_lock_reports_it_once_with_the_token_it_had() -> None:
    books = tracked("a")

    report = Report()
    books.forget("a", STOLEN, report, detail="seen")

    assert report.lost == [LostLock(LockLost("a", "t-a", STOLEN))]
    assert report.lost[0].token == "t-a" and report.lost[0].detail == "seen"
    assert "a" not in books.jobs


def test_an_untrack_tells_nobody() -> None:
    books = Books(LOCK, MARGIN)
    target = Inbox()
    watch(books, "j", target)

    ended = books.jobs.untrack("j", "t-j", None)

    assert ended is not None and ended.last
    assert "j" not in books.jobs
    assert books.lost.get("j", "t-j") is None


def test_a_batch_renewed_whole_with_the_books_unchanged_may_be_stamped_later() -> None:
    # The manager then reports first and stamps after: apply would do no more.
    books = tracked("a", "b")
    due = books.jobs.due(AT, 100).ids
    taken = books.jobs.changes

    assert books.renewed_whole(due, BatchOutcome([], []), taken)
    assert not books.renewed_whole(due, BatchOutcome(["a"], []), taken)
    assert not books.renewed_whole(due, RuntimeError("down"), taken)
    books.jobs.untrack("b", None, None)
    assert not books.renewed_whole(due, BatchOutcome([], []), taken)


def test_a_batch_with_a_watched_lock_is_never_stamped_later() -> None:
    books = tracked("a")
    books.track("w", "t-w", 0, Inbox(), None, False, None, Report())
    due = books.jobs.due(AT, 100).ids

    assert not books.renewed_whole(due, BatchOutcome([], []), books.jobs.changes)


def test_a_same_token_retry_tracked_while_the_moves_renewal_is_out_keeps_its_lock() -> None:
    # A retry fetched at once takes the job again with the token of the run
    # that moved it, and is tracked (a claim of its own, not releasing) while
    # the renewal that found the move's deletion is on its way. That renewal
    # ran before the retry's fetch set the lock again: the retry keeps it.
    books = tracked("a")
    first, second = Inbox(), Inbox()
    watch(books, "a", first, releasing=True)
    flight, changes = batch(books), books.jobs.changes

    report = Report()
    assert books.track("a", "t-a", AT + 1, second, None, False, None, report)
    assert report.tells == []

    report = apply(books, BatchOutcome(["a"], [], {"a": EXPIRED}), due=flight, changes=changes)

    assert report.tells == [] and report.lost == [] and report.renewed == []
    assert books.jobs.watched("a") and not books.jobs.releasing("a")
    assert [claim.target for claim in books.jobs.claims("a")] == [None, second]
    # Not stamped: due at the next tick, whose renewal says whether the lock holds.
    assert books.jobs.stamps["a"] < AT
