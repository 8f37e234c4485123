"""The job table: batch order, claims, the watched locks' deadlines, the locks lost lately."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from actors.jobs import STAMP_SLICE, Claim, Ended, JobTable, LostLocks, Validity
from tests.support import Silent

THRESHOLD = 100
LOCK = 30_000
MARGIN = 1000


def table(lock_duration: int = LOCK) -> JobTable:
    """An empty table for locks of ``lock_duration`` ms, watched with :data:`MARGIN`."""
    return JobTable(lock_duration, MARGIN)


def table_with_renewed(count: int, at: int) -> JobTable:
    """``count`` jobs renewed once at ``at``."""
    jobs = table()
    for i in range(count):
        jobs.track(f"old-{i}", "t", 0)
    due = jobs.due(at, THRESHOLD).ids
    jobs.stamp(due, at)
    return jobs


def test_a_job_tracked_after_a_big_batch_is_first_in_the_next_one() -> None:
    jobs = table_with_renewed(1000, at=1000)
    jobs.track("new", "t", 1050)

    due, tokens, _ = jobs.due(1200, THRESHOLD)

    assert due[0] == "new"
    assert sorted(due[1:]) == sorted(f"old-{i}" for i in range(1000))
    assert len(tokens) == len(due)


def test_the_batch_names_the_oldest_stamp_of_its_jobs_watched_ones_too() -> None:
    # The least margin a tick reports comes from it.
    jobs = table()
    jobs.track("a", "t", 500)
    jobs.track("b", "t", 300)
    jobs.track("watched", "t", 1150, notify=Silent())

    assert jobs.due(1200, THRESHOLD).oldest == 300
    jobs.stamp(["a", "b"], 1200)
    # Only the watched lock is checked now: it is the oldest.
    assert jobs.due(1210, THRESHOLD) == (["watched"], ["t"], 1150)
    jobs.stamp(["watched"], 1210)
    assert jobs.due(1210, THRESHOLD) == ([], [], None)


def test_once_renewed_it_takes_its_tracking_order_again() -> None:
    jobs = table_with_renewed(3, at=1000)
    jobs.track("new", "t", 1050)
    due = jobs.due(1200, THRESHOLD).ids
    jobs.stamp(due, 1200)

    due = jobs.due(1400, THRESHOLD).ids

    assert due == ["old-0", "old-1", "old-2", "new"]


def test_a_fresh_job_not_yet_due_is_not_in_the_batch() -> None:
    jobs = table_with_renewed(3, at=1000)
    jobs.track("new", "t", 1150)

    due = jobs.due(1200, THRESHOLD).ids

    assert due == ["old-0", "old-1", "old-2"]
    assert "new" in jobs.fresh


def test_a_watched_fresh_job_checked_every_tick_goes_first() -> None:
    jobs = table_with_renewed(3, at=1000)
    jobs.track("watched", "t", 1150, notify=Silent())

    due = jobs.due(1200, THRESHOLD).ids

    assert due == ["watched", "old-0", "old-1", "old-2"]


def test_the_same_token_again_is_not_a_new_lock_but_a_new_token_is() -> None:
    jobs = table_with_renewed(2, at=1000)
    jobs.track("old-1", "t", 1050)
    assert "old-1" not in jobs.fresh
    jobs.track("old-1", "another", 1050)
    assert "old-1" in jobs.fresh


def test_a_fresh_job_whose_renewal_failed_stays_fresh() -> None:
    jobs = table_with_renewed(2, at=1000)
    jobs.track("a", "t", 1050)
    jobs.track("b", "t", 1060)
    due = jobs.due(1200, THRESHOLD).ids
    assert due[:2] == ["a", "b"]

    # "a" was in a chunk that failed: only the rest are stamped.
    jobs.stamp([job_id for job_id in due if job_id != "a"], 1200)

    assert list(jobs.fresh) == ["a"]
    assert jobs.due(1250, THRESHOLD)[0] == ["a"]


def test_untracking_forgets_that_it_was_fresh() -> None:
    jobs = table()
    jobs.track("a", "t", 0)
    jobs.untrack("a")
    assert jobs.fresh == {}


def test_when_every_job_is_due_the_batch_is_the_whole_table_unrenewed_first() -> None:
    jobs = table_with_renewed(3, at=1000)
    jobs.track("new", "t", 1050)
    jobs.untrack("old-1")

    due, tokens, oldest = jobs.due(5000, THRESHOLD)

    assert due == ["new", "old-0", "old-2"]
    assert tokens == ["t", "t", "t"]
    assert oldest == 1000


def test_a_table_emptied_and_filled_again_with_older_stamps_is_due_again() -> None:
    jobs = table_with_renewed(2, at=5000)
    for job_id in ("old-0", "old-1"):
        jobs.untrack(job_id)
    jobs.track("old-0", "t", 100)

    assert jobs.due(300, THRESHOLD).ids == ["old-0"]


def test_tracks_of_one_millisecond_share_one_stamp() -> None:
    # Memory: a burst of tracks keeps one int per millisecond, not one per job.
    jobs = table()
    for i in range(3):
        jobs.track(f"j{i}", "t", int("123456789"))

    assert len({id(ts) for ts in jobs.stamps.values()}) == 1


def test_jobs_tracked_and_untracked_between_ticks_leave_nothing_behind() -> None:
    jobs = table()
    for i in range(20_000):
        jobs.track(f"j{i}", "t", 0)
        jobs.untrack(f"j{i}")
    jobs.track("kept", "t", 0)

    assert len(jobs._fresh) < 10_000
    assert list(jobs.fresh) == ["kept"]


def test_a_job_tracked_again_while_fresh_counts_from_its_last_taking() -> None:
    jobs = table()
    jobs.track("a", "t", 0)
    jobs.track("b", "t", 0)
    jobs.untrack("a")
    jobs.track("a", "t", 10)
    jobs.track("b", "t2", 20)

    assert list(jobs.fresh) == ["a", "b"]
    assert jobs.due(1000, THRESHOLD).ids == ["a", "b"]


def test_stamping_pauses_between_slices_and_can_keep_later_stamps() -> None:
    jobs = table()
    ids = [f"j{i}" for i in range(STAMP_SLICE + 1)]
    for job_id in ids:
        jobs.track(job_id, "t", 0)
    jobs.track("j0", "t2", 900)  # a newer lock, taken after the renewal ran
    pauses: list[None] = []

    jobs.stamp(ids, 500, pause=lambda: pauses.append(None), raise_only=True)

    assert len(pauses) == 2
    assert jobs.stamps["j0"] == 900
    assert jobs.stamps["j1"] == jobs.stamps[ids[-1]] == 500
    assert jobs.fresh == {}


operations = st.lists(
    st.one_of(
        st.tuples(st.just("track"), st.integers(0, 7), st.sampled_from(["t1", "t2"])),
        st.tuples(st.just("untrack"), st.integers(0, 7), st.none()),
        st.tuples(st.just("tick"), st.integers(1, 120), st.booleans()),
    ),
    max_size=40,
)


@given(operations)
def test_every_due_job_and_only_those_with_the_unrenewed_first(
    ops: list[tuple[str, int, object]],
) -> None:
    jobs = table()
    renewed: set[str] = set()
    now = 1000
    for op, value, extra in ops:
        if op == "track":
            job_id = f"j{value}"
            if jobs.tokens.get(job_id) != extra:
                renewed.discard(job_id)
            jobs.track(job_id, str(extra), now)
        elif op == "untrack":
            jobs.untrack(f"j{value}")
            renewed.discard(f"j{value}")
        else:
            now += value
            due, tokens, _ = jobs.due(now, THRESHOLD)
            expected = {j for j, ts in jobs.stamps.items() if ts + THRESHOLD < now}
            assert sorted(due) == sorted(expected)
            assert tokens == [jobs.tokens[j] for j in due]
            kinds = [job_id in renewed for job_id in due]
            assert kinds == sorted(kinds), "a renewed job came before one never renewed"
            # ``extra``: the whole batch renewed, or only its second half (the
            # first was in a chunk that failed).
            done = due if extra else due[len(due) // 2 :]
            jobs.stamp(done, now)
            renewed.update(done)


def test_each_target_of_a_lock_is_kept_once_in_the_order_it_asked() -> None:
    a, b = Silent(), Silent()
    jobs = table()
    jobs.track("j", "t", 0, notify=a)
    jobs.track("j", "t", 10, notify=b)
    jobs.track("j", "t", 20, notify=a)
    jobs.track("plain", "t", 0)
    jobs.track("held", "t", 0, max_hold=1000)

    assert jobs.watches["j"].targets == (a, b)
    assert jobs.stamps["j"] == 0
    # A job tracked once, plainly, stays in the flat dicts only.
    assert "plain" not in jobs.watches
    # Waited on, it is checked at every tick; held only to a deadline, it is not.
    assert jobs.due(50, THRESHOLD)[0] == ["j"]


def test_each_holder_adds_its_own_claim_and_the_same_holder_again_adds_none() -> None:
    a = Silent()
    jobs = table()
    jobs.track("j", "t", 0)
    jobs.track("j", "t", 5)  # a progress hook: the same plain claim
    jobs.track("j", "t", 10, notify=a, max_hold=100)
    jobs.track("j", "t", 20, notify=a, max_hold=500)  # the same claim: its deadline stays

    assert jobs.claims("j") == (Claim(None, None), Claim(a, 110))
    assert jobs.stamps["j"] == 0


def test_a_lock_is_over_its_hold_limit_from_the_first_claims_hold_end_on() -> None:
    a = Silent()
    jobs = table()
    jobs.track("j", "t", 0)
    jobs.track("j", "t", 0, notify=a, max_hold=100)

    assert jobs.over_hold(99) == []
    assert jobs.over_hold(100) == ["j"]


def test_ending_some_claims_keeps_the_lock_while_one_is_left() -> None:
    a, b = Silent(), Silent()
    jobs = table()
    jobs.track("j", "t", 0)
    jobs.track("j", "t", 0, notify=a, max_hold=100)
    jobs.track("j", "t", 0, notify=b)

    ended = jobs.end_claims("j", lambda claim: claim.target is not None)

    assert ended == Ended("t", (Claim(a, 100), Claim(b, None)), last=False)
    assert jobs.claims("j") == (Claim(None, None),)
    # Plain again: nobody watches it, it has no deadline, and it is due at its threshold only.
    assert "j" not in jobs.watches and "j" not in jobs.valid and "j" in jobs
    assert jobs.end_claims("j", lambda claim: True) == Ended("t", (Claim(None, None),), True)
    assert "j" not in jobs


def test_an_untrack_naming_a_target_ends_its_claim_alone() -> None:
    a, b = Silent(), Silent()
    jobs = table()
    jobs.track("j", "t", 0)
    jobs.track("j", "t", 0, notify=a, keep=True)
    jobs.track("j", "t", 0, notify=b)

    ended = jobs.untrack("j", "t", notify=a)

    assert ended == ("t", (Claim(a, None, keep=True),), False)
    assert jobs.claims("j") == (Claim(None, None), Claim(b, None))


def test_an_untrack_without_a_target_leaves_the_kept_claims() -> None:
    a, b = Silent(), Silent()
    jobs = table()
    jobs.track("j", "t", 0)
    jobs.track("j", "t", 0, notify=a, keep=True)
    jobs.track("j", "t", 0, notify=b)

    ended = jobs.untrack("j")

    assert ended == ("t", (Claim(None, None), Claim(b, None)), False)
    assert jobs.claims("j") == (Claim(a, None, keep=True),)
    assert jobs.untrack("j", "t", notify=a) == ("t", (Claim(a, None, keep=True),), True)
    assert "j" not in jobs


def test_a_new_token_hands_back_every_target_of_the_old_lock() -> None:
    a, b, c = Silent(), Silent(), Silent()
    jobs = table()
    jobs.track("j", "old", 0, notify=a)
    jobs.track("j", "old", 0, notify=b)

    replaced = jobs.track("j", "new", 10, notify=c)

    assert replaced == ("old", (a, b))
    assert jobs.watches["j"].targets == (c,)
    assert jobs.claims("j") == (Claim(c, None),)


def test_a_new_token_without_a_target_leaves_no_watch() -> None:
    a, b = Silent(), Silent()
    jobs = table()
    jobs.track("j", "old", 0, notify=a)
    jobs.track("j", "old", 0, notify=b)

    assert jobs.track("j", "new", 10) == ("old", (a, b))
    assert "j" not in jobs.watches


def test_each_claim_keeps_its_own_hold_deadline() -> None:
    a, b = Silent(), Silent()
    jobs = table()
    jobs.track("j", "t", 0, notify=a, max_hold=100)
    jobs.track("j", "t", 60, notify=b, max_hold=100)

    assert jobs.watches["j"].targets == (a, b)
    assert jobs.watches["j"].hold_end == 100
    assert jobs.over_hold(100) == ["j"]
    ended = jobs.end_claims("j", lambda claim: claim.hold_end is not None and claim.hold_end <= 100)
    assert ended == ("t", (Claim(a, 100),), False)
    assert jobs.watches["j"].hold_end == 160


def test_a_lost_lock_hands_back_every_claim() -> None:
    a, b = Silent(), Silent()
    jobs = table()
    jobs.track("j", "t", 0, notify=a)
    jobs.track("j", "t", 0, notify=b, keep=True)

    ended = jobs.untrack("j", everyone=True)

    assert ended == ("t", (Claim(a, None), Claim(b, None, keep=True)), True)
    assert "j" not in jobs.watches and "j" not in jobs


def test_the_lost_locks_remembered_are_bounded_the_least_recent_forgotten_first() -> None:
    lost = LostLocks(size=3)
    for i in range(3):
        lost.add(f"j{i}", "t", "stolen", ())
    assert lost.get("j0", "t") is not None  # j0 is now the most recent

    lost.add("j3", "t", "expired", ())

    assert len(lost) == 3
    assert lost.get("j1", "t") is None
    assert lost.get("j0", "t") == ("stolen", ())


def test_a_lost_lock_remembers_each_target_told_once_and_its_first_reason() -> None:
    a, b = Silent(), Silent()
    lost = LostLocks()
    lost.add("j", "t", None, (a,))  # a's claim ended, the lock lived on
    lost.add("j", "t", "expired", (None, a))
    lost.add("j", "t", "stolen", (b, a))

    assert lost.get("j", "t") == ("expired", (a, None, b))
    assert lost.was_told("j", "t", a) and lost.was_told("j", "t", None)
    assert not lost.was_told("j", "t", Silent())
    assert not lost.was_told("j", "other", a)


_steps = st.lists(
    st.tuples(
        st.sampled_from(["track", "untrack", "untrack_target", "stamp", "confirm"]),
        st.sampled_from(["a", "b", "c"]),
        st.sampled_from(["t1", "t2"]),
        st.sampled_from([None, 0, 1]),
        st.integers(0, 50),
        st.one_of(st.none(), st.integers(1, 40)),
    ),
    max_size=40,
)


@given(_steps)
def test_the_earliest_deadline_is_always_that_of_a_watched_lock(
    steps: list[tuple[str, str, str, int | None, int, int | None]],
) -> None:
    # A stale earliest deadline arms the manager's timer for a fire nobody needs.
    jobs = JobTable(lock_duration=100, safety_margin=10)
    targets = [Silent(), Silent()]
    now = 0
    for kind, job_id, token, target, step, margin in steps:
        now += step
        notify = None if target is None else targets[target]
        if kind == "track":
            jobs.track(job_id, token, now, notify, None, False, margin if notify else None)
        elif kind == "untrack":
            jobs.untrack(job_id, token)
        elif kind == "untrack_target" and notify is not None:
            jobs.untrack(job_id, None, notify)
        elif kind == "stamp" and job_id in jobs:
            jobs.stamp([job_id], now)
        elif kind == "confirm":
            for overdue in jobs.confirm(now):
                jobs.untrack(overdue, everyone=True)
        deadlines = [validity.deadline for validity in jobs.valid.values()]
        assert jobs.deadlines.earliest == min(deadlines, default=None)
        # Exactly the locks somebody watches have a deadline.
        assert set(jobs.valid) == {j for j, watch in jobs.watches.items() if watch.targets}


def test_a_watched_lock_is_trusted_lock_duration_minus_its_margin_after_its_taking() -> None:
    jobs = table()
    jobs.track("j", "t", 500, notify=Silent())
    jobs.track("careful", "t", 500, notify=Silent(), margin=5000)

    assert jobs.valid["j"].deadline == 500 + LOCK - MARGIN
    assert jobs.valid["careful"].deadline == 500 + LOCK - 5000
    assert jobs.deadlines.earliest == 500 + LOCK - 5000


def test_the_most_careful_watchers_margin_sets_the_locks_deadline() -> None:
    jobs = table()
    jobs.track("j", "t", 0, notify=Silent(), margin=200)
    careful = Silent()
    jobs.track("j", "t", 0, notify=careful, margin=4000)

    assert jobs.valid["j"].deadline == LOCK - 4000
    jobs.untrack("j", "t", notify=careful)
    assert jobs.valid["j"].deadline == LOCK - 200
    assert jobs.deadlines.earliest == LOCK - 200


def test_a_confirmed_renewal_moves_the_deadline_and_a_passed_deadline_is_said() -> None:
    jobs = table()
    jobs.track("j", "t", 0, notify=Silent())
    jobs.track("k", "t", 0, notify=Silent())
    jobs.stamp(["j", "k"], 4000)

    assert jobs.confirm(4010) == []
    assert jobs.valid["j"].deadline == 4000 + LOCK - MARGIN
    # Past its deadline, a lock is said lost even if a renewal of it was just stamped:
    # nobody had confirmed it at its deadline.
    jobs.stamp(["k"], 4000 + LOCK)
    assert jobs.confirm(4000 + LOCK - MARGIN) == ["j", "k"]


def test_an_older_stamp_never_moves_a_deadline_back() -> None:
    jobs = table()
    jobs.track("j", "t", 1000, notify=Silent())
    jobs.stamps["j"] = 0  # a renewal sent before the taking was confirmed

    jobs.confirm(10)

    assert jobs.valid["j"].deadline == 1000 + LOCK - MARGIN


def test_a_watched_locks_record_is_released_once_nobody_watches_it() -> None:
    # A shared record (process mode) frees its cell on release: none may leak.
    built: list[tuple[str, int, int]] = []
    released: list[str] = []

    class Record(Validity):
        __slots__ = ("job_id",)

        def __init__(self, job_id: str, confirmed: int, span: int) -> None:
            super().__init__(confirmed, span)
            self.job_id = job_id
            built.append((job_id, confirmed, span))

        def release(self) -> None:
            released.append(self.job_id)

    jobs = JobTable(LOCK, MARGIN, Record)
    a = Silent()
    jobs.track("j", "t", 7, notify=a)
    jobs.track("k", "t", 7, notify=a)
    jobs.track("l", "t", 7, notify=a)

    jobs.untrack("j")
    jobs.track("k", "new", 9)  # a new lock: nobody watches it
    jobs.untrack("l", everyone=True)

    assert built == [("j", 7, LOCK - MARGIN), ("k", 7, LOCK - MARGIN), ("l", 7, LOCK - MARGIN)]
    assert released == ["j", "k", "l"]
    assert jobs.valid == {}


def test_a_claim_releasing_its_lock_marks_the_lock_until_it_says_otherwise() -> None:
    a = Silent()
    jobs = table()
    jobs.track("j", "t", 0)
    jobs.track("j", "t", 0, notify=a, releasing=True)
    assert jobs.releasing("j")

    # The same claim again, not releasing: the release failed, the lock is held on.
    jobs.track("j", "t", 10, notify=a)
    assert not jobs.releasing("j")
    assert jobs.claims("j") == (Claim(None, None), Claim(a, None))


def test_a_plain_release_keeps_the_lock_renewed_at_its_threshold_only() -> None:
    jobs = table()
    jobs.track("j", "t", 0, releasing=True)

    assert jobs.releasing("j") and not jobs.watched("j")
    assert jobs.due(THRESHOLD, THRESHOLD)[0] == []
    assert jobs.due(THRESHOLD + 1, THRESHOLD)[0] == ["j"]


def test_the_change_count_moves_only_when_a_lock_is_let_go_or_replaced() -> None:
    jobs = table()
    jobs.track("j", "t", 0)
    jobs.track("k", "t", 0, notify=Silent())
    before = jobs.changes

    jobs.track("j", "t", 5)  # the same lock again
    jobs.stamp(["j", "k"], 10)
    jobs.track("k", "t", 0, notify=Silent())  # another claim
    assert jobs.changes == before

    jobs.track("j", "new", 20)
    assert jobs.changes == before + 1
    jobs.untrack("j")
    assert jobs.changes == before + 2
    jobs.untrack("k", everyone=True)
    assert jobs.changes == before + 3
