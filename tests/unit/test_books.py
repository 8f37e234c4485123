"""Applying a renewal's outcome to the job table, without an actor and without Redis."""

from __future__ import annotations

from redis.exceptions import ResponseError

from actors.apply import apply_outcome
from actors.jobs import Claim, JobTable
from actors.messages import EXPIRED, STOLEN, UNCONFIRMED, LockLost
from actors.renewer import BatchOutcome, ChunkError
from actors.report import Counters
from tests.support import Inbox

LOCK = 30_000
AT = 10_000


def tracked(*job_ids: str, ts: int = 0) -> JobTable:
    """A table holding ``job_ids``, each with the token ``"t-" + id``, taken at ``ts``."""
    jobs = JobTable(LOCK)
    for job_id in job_ids:
        jobs.track(job_id, f"t-{job_id}", ts)
    return jobs


def batch(jobs: JobTable) -> tuple[list[str], list[str]]:
    """Every tracked job as one batch, with its tokens."""
    ids = jobs.ids()
    return ids, [jobs.tokens[job_id] for job_id in ids]


def test_a_batch_renewed_whole_is_stamped_and_reported_renewed() -> None:
    jobs = tracked("a", "b")
    due, tokens = batch(jobs)

    tally = apply_outcome(jobs, due, tokens, BatchOutcome([], []), AT, AT)

    assert tally.renewed == ["a", "b"]
    assert tally.lost == [] and tally.notes == [] and tally.failure is None
    assert jobs.stamps == {"a": AT, "b": AT}


def test_an_expired_lock_is_untracked_and_reported_with_its_token() -> None:
    jobs = tracked("a", "b", ts=AT - LOCK - 1)
    due, tokens = batch(jobs)

    tally = apply_outcome(jobs, due, tokens, BatchOutcome(["a"], []), AT, AT)

    assert tally.renewed == ["b"]
    [lost] = tally.lost
    assert (lost.job_id, lost.token, lost.reason) == ("a", "t-a", EXPIRED)
    assert "expired" in lost.detail
    assert jobs.ids() == ["b"]
    assert jobs.stamps["b"] == AT
    assert tally.ended == [("a", "t-a", EXPIRED, (Claim(None, None),))]


def test_a_stolen_lock_tells_its_target_once_and_is_remembered_as_stolen() -> None:
    jobs = tracked("a")
    target = Inbox()
    jobs.track("a", "t-a", 0, notify=target)
    due, tokens = batch(jobs)

    tally = apply_outcome(jobs, due, tokens, BatchOutcome(["a"], [], {"a": STOLEN}), AT, AT)

    assert [lost.reason for lost in tally.lost] == [STOLEN]
    assert tally.notes == [(target, LockLost("a", "t-a", STOLEN))]
    [(job_id, token, reason, claims)] = tally.ended
    assert (job_id, token, reason) == ("a", "t-a", STOLEN)
    assert [claim.target for claim in claims] == [None, target]
    assert "a" not in jobs
    assert target.got == []  # told by the manager, not by the function


def test_the_jobs_of_a_chunk_that_did_not_run_keep_their_stamp_and_stay_tracked() -> None:
    jobs = tracked("a", "b", "c", "d")
    due, tokens = batch(jobs)
    error = ResponseError("BUSY")

    tally = apply_outcome(jobs, due, tokens, BatchOutcome([], [ChunkError(2, 4, error)]), AT, AT)

    assert tally.renewed == ["a", "b"]
    assert tally.lost == []
    assert tally.failure is error
    assert tally.unknown == 2
    assert jobs.stamps == {"a": AT, "b": AT, "c": 0, "d": 0}


def test_a_renewer_that_raised_changes_nothing_and_reports_its_error() -> None:
    jobs = tracked("a", "b")
    due, tokens = batch(jobs)
    error = ConnectionError("refused")

    tally = apply_outcome(jobs, due, tokens, error, AT, AT)

    assert tally.failure is error
    assert tally.unknown == 2
    assert tally.renewed == [] and tally.lost == []
    assert jobs.stamps == {"a": 0, "b": 0}


def test_a_base_exception_from_the_renewer_is_reported_as_an_error() -> None:
    jobs = tracked("a")
    due, tokens = batch(jobs)

    tally = apply_outcome(jobs, due, tokens, KeyboardInterrupt(), AT, AT)

    assert isinstance(tally.failure, RuntimeError)
    assert "KeyboardInterrupt" in str(tally.failure)
    assert jobs.ids() == ["a"]


def test_an_id_reported_twice_in_one_batch_is_lost_once() -> None:
    jobs = tracked("a", "b")
    due, tokens = batch(jobs)

    tally = apply_outcome(jobs, due, tokens, BatchOutcome(["a", "a"], []), AT, AT)

    assert [lost.job_id for lost in tally.lost] == ["a"]
    assert tally.renewed == ["b"]


def test_ids_the_renewer_made_up_are_dropped() -> None:
    jobs = tracked("a", "b")
    jobs.track("elsewhere", "t-e", 0)
    due, tokens = ["a", "b"], ["t-a", "t-b"]

    tally = apply_outcome(jobs, due, tokens, BatchOutcome(["ghost", "elsewhere"], []), AT, AT)

    assert tally.renewed == ["a", "b"]
    assert tally.lost == []
    assert "elsewhere" in jobs
    assert jobs.stamps["elsewhere"] == 0


def test_a_watched_lock_answered_after_its_deadline_is_lost_unconfirmed() -> None:
    jobs = JobTable(LOCK, safety_margin=1000)
    target = Inbox()
    jobs.track("a", "t-a", 0, notify=target)
    jobs.track("b", "t-b", 0)
    due, tokens = batch(jobs)
    counters = Counters()
    counters.failed_streak, counters.last_error = 2, "ConnectionError: refused"
    answered = LOCK - 1000  # the deadline itself

    tally = apply_outcome(jobs, due, tokens, BatchOutcome([], []), AT, answered, counters)

    assert tally.renewed == ["b"]
    [lost] = tally.lost
    assert (lost.job_id, lost.reason) == ("a", UNCONFIRMED)
    assert "answer came only after the deadline" in lost.detail
    assert "2 tick(s) failed since, the last with ConnectionError: refused" in lost.detail
    assert [note for _, note in tally.notes] == [LockLost("a", "t-a", UNCONFIRMED)]
    assert "a" not in jobs


def test_a_confirmed_renewal_moves_a_watched_locks_deadline_on() -> None:
    jobs = JobTable(LOCK, safety_margin=1000)
    jobs.track("a", "t-a", 0, notify=Inbox())
    due, tokens = batch(jobs)

    tally = apply_outcome(jobs, due, tokens, BatchOutcome([], []), AT, AT + 5)

    assert tally.renewed == ["a"]
    assert jobs.valid["a"].deadline == AT + LOCK - 1000
    assert jobs.earliest == AT + LOCK - 1000
