"""The checker on hand-written histories: clean ones pass, each kind of failure is counted."""

from __future__ import annotations

from typing import Any

from tests.chaos.checker import build_runs, check

MS = 1_000_000
LOCK_MS = 1000
CONFIG = {"kind": "config", "seed": 7, "lock_ms": LOCK_MS, "grace_ms": 100}


def run(event: str, job: str, token: str, t_ms: int, base: str = "thread", **more: Any) -> Any:
    worker = more.pop("worker", f"{base}#1")
    return {
        "kind": "run",
        "event": event,
        "job": job,
        "attempt": 1,
        "token": token,
        "worker": worker,
        "base": base,
        "t": t_ms * MS,
        **more,
    }


def fault(kind: str, target: str, start_ms: int, end_ms: int, **more: Any) -> Any:
    return {
        "kind": "fault",
        "fault": kind,
        "target": target,
        "start": start_ms * MS,
        "end": end_ms * MS,
        **more,
    }


def job(job_id: str, state: str = "completed") -> list[Any]:
    return [
        {"kind": "job", "event": "added", "job": job_id, "t": 0},
        {"kind": "job", "event": "final", "job": job_id, "state": state, "t": 99_000 * MS},
    ]


def test_a_clean_history_passes() -> None:
    records = [
        CONFIG,
        *job("1"),
        *job("2"),
        run("started", "1", "a", 10),
        run("finished", "1", "a", 500, outcome="failed"),
        run("started", "1", "b", 600, base="bullmq"),
        run("finished", "1", "b", 900, base="bullmq", outcome="completed"),
        run("started", "2", "c", 10),
        run("finished", "2", "c", 20, outcome="completed"),
    ]
    verdict = check(records)
    assert verdict.ok
    assert (verdict.jobs, verdict.runs, verdict.seed) == (2, 3, 7)
    assert verdict.counts["stale writes accepted"] == 0


def test_a_run_started_while_another_is_in_hand_is_an_overlap() -> None:
    records = [
        CONFIG,
        *job("1"),
        run("started", "1", "a", 0),
        run("started", "1", "b", 400, base="process"),
        run("finished", "1", "a", 500, outcome="completed"),
        run("finished", "1", "b", 800, base="process", outcome="completed"),
    ]
    verdict = check(records)
    assert len(verdict.overlaps) == 1
    assert "100.0 ms" in verdict.overlaps[0].what
    assert [r["token"] for r in verdict.overlaps[0].window] == ["a", "b", "a", "b"]
    assert not verdict.ok


def test_a_run_ends_when_told_of_its_loss() -> None:
    records = [
        CONFIG,
        *job("1"),
        fault("partition", "thread", 100, 1500),
        run("started", "1", "a", 0),
        run("lost", "1", "a", 900, reason="unconfirmed"),
        run("started", "1", "b", 1200, base="bullmq"),
        run("finished", "1", "b", 1300, base="bullmq", outcome="completed"),
    ]
    verdict = check(records)
    assert verdict.ok
    assert verdict.losses == 1


def test_a_told_arriving_after_the_next_run_started_is_an_overlap() -> None:
    records = [
        CONFIG,
        *job("1"),
        fault("partition", "thread", 100, 1500),
        run("started", "1", "a", 0),
        run("started", "1", "b", 1200, base="bullmq"),
        run("lost", "1", "a", 1250, reason="unconfirmed"),
        run("finished", "1", "b", 1300, base="bullmq", outcome="completed"),
    ]
    assert len(check(records).overlaps) == 1


def test_a_paused_process_and_its_grace_are_not_in_hand() -> None:
    records = [
        CONFIG,
        *job("1"),
        fault("stop", "thread", 100, 2000),
        run("started", "1", "a", 0),
        run("started", "1", "b", 1500, base="bullmq"),
        # Told 50 ms after the resume: inside the 100 ms grace.
        run("lost", "1", "a", 2050, reason="unconfirmed"),
        run("finished", "1", "b", 2500, base="bullmq", outcome="completed"),
    ]
    assert check(records).ok
    # Told 150 ms after it: 50 ms past the grace, both in hand.
    late = [*records[:-2], run("lost", "1", "a", 2150), records[-1]]
    verdict = check(late)
    assert len(verdict.overlaps) == 1
    assert "50.0 ms" in verdict.overlaps[0].what


def test_a_pause_of_another_worker_excuses_nothing() -> None:
    records = [
        CONFIG,
        *job("1"),
        fault("stop", "process", 100, 2000),
        run("started", "1", "a", 0),
        run("started", "1", "b", 1500, base="bullmq"),
        run("lost", "1", "a", 1600, reason="stolen"),
        run("finished", "1", "b", 2500, base="bullmq", outcome="completed"),
    ]
    verdict = check(records)
    assert len(verdict.overlaps) == 1
    assert len(verdict.unexplained_losses) == 1


def test_a_killed_incarnation_holds_nothing_after_the_kill() -> None:
    records = [
        CONFIG,
        *job("1"),
        fault("kill", "thread", 300, 900, incarnation="thread#1"),
        run("started", "1", "a", 0),
        run("started", "1", "b", 1400, base="bullmq"),
        run("finished", "1", "b", 1500, base="bullmq", outcome="completed"),
    ]
    assert check(records).ok
    (killed, _) = build_runs(records)
    assert (killed.ended_by, killed.end) == ("killed", 300 * MS)
    # The kill of another incarnation does not end this one's run.
    other = [records[0], *records[1:3], fault("kill", "thread", 300, 900, incarnation="thread#0")]
    other += records[4:]
    assert len(check(other).overlaps) == 1


def test_a_loss_explained_by_a_fault_on_its_worker_or_redis() -> None:
    for target in ("thread", "redis"):
        records = [
            CONFIG,
            *job("1"),
            fault("redis-stop" if target == "redis" else "gil", target, 100, 400),
            run("started", "1", "a", 0),
            # Within the fault's end plus the lock duration (1,000 ms).
            run("lost", "1", "a", 1399, reason="unconfirmed"),
            run("started", "1", "b", 2000, base="bullmq"),
            run("finished", "1", "b", 2100, base="bullmq", outcome="completed"),
        ]
        assert check(records).ok, target


def test_a_loss_after_the_fault_window_is_unexplained() -> None:
    records = [
        CONFIG,
        *job("1"),
        fault("partition", "thread", 100, 400),
        run("started", "1", "a", 0),
        run("lost", "1", "a", 1401, reason="unconfirmed"),
        run("started", "1", "b", 2000, base="bullmq"),
        run("finished", "1", "b", 2100, base="bullmq", outcome="completed"),
    ]
    verdict = check(records)
    assert len(verdict.unexplained_losses) == 1
    assert [r["kind"] for r in verdict.unexplained_losses[0].window] == ["run", "fault", "run"]
    assert "FAILED" not in verdict.unexplained_losses[0].what


def test_a_loss_with_no_fault_at_all_is_unexplained() -> None:
    records = [
        CONFIG,
        *job("1"),
        run("started", "1", "a", 0),
        run("lost", "1", "a", 300, reason="stolen"),
        run("started", "1", "b", 400),
        run("finished", "1", "b", 500, outcome="completed"),
    ]
    assert len(check(records).unexplained_losses) == 1


def test_jobs_never_finished_or_left_active_are_counted() -> None:
    records = [
        CONFIG,
        *job("1", state="active"),
        *job("2"),
        *job("3"),
        run("started", "1", "a", 0),
        run("finished", "1", "a", 100, outcome="failed"),
        run("started", "2", "b", 0),
        run("finished", "2", "b", 100, outcome="completed"),
        run("started", "2", "c", 200),
        run("started", "3", "d", 0),
        run("finished", "3", "d", 100, outcome="completed"),
    ]
    verdict = check(records)
    assert [finding.what for finding in verdict.unfinished] == [
        "job 1: no run finished it; final state active",
        "job 2: run c never ended",
    ]


def test_an_exited_worker_holds_nothing_after_its_exit() -> None:
    records = [
        CONFIG,
        *job("1"),
        {"kind": "exit", "worker": "thread#1", "t": 200 * MS},
        run("started", "1", "a", 0),
        run("started", "1", "b", 5000, base="bullmq"),
        run("finished", "1", "b", 5100, base="bullmq", outcome="completed"),
    ]
    verdict = check(records)
    assert verdict.ok
    assert verdict.unexpected_exits == 1


def test_a_run_whose_fetch_was_answered_after_a_pause_is_excused_within_the_grace() -> None:
    # The thread worker's fetch took the lock before its pause; the answer came after it.
    records = [
        CONFIG,
        *job("1"),
        fault("gil", "thread", 0, 2000),
        run("started", "1", "b", 1500, base="bullmq"),
        run("started", "1", "a", 2010),
        run("lost", "1", "a", 2090, reason="unconfirmed"),
        run("finished", "1", "b", 2500, base="bullmq", outcome="completed"),
    ]
    assert check(records).ok
    late = [*records[:-2], run("lost", "1", "a", 2130), records[-1]]
    assert len(check(late).overlaps) == 1


def write(store: str, job: str, token: str, t_ms: int, *, accepted: bool, **more: Any) -> Any:
    return {
        "kind": "write",
        "store": store,
        "job": job,
        "token": token,
        "accepted": accepted,
        "t0": t_ms * MS,
        "t": (t_ms + 1) * MS,
        **more,
    }


def test_an_overlap_left_by_a_node_run_is_the_peers_and_not_counted() -> None:
    # A stopped Node.js worker's lock expired; ours took the job; nothing tells the Node.js run.
    node: dict[str, Any] = {"base": "node", "watched": False}
    records = [
        CONFIG,
        *job("1"),
        fault("stop", "node", 100, 2000),
        run("started", "1", "n", 50, taken=40 * MS, **node),
        run("started", "1", "a", 1500, taken=1490 * MS),
        run("finished", "1", "n", 2600, outcome="completed", **node),
        run("finished", "1", "a", 3000, outcome="completed"),
    ]
    verdict = check(records)
    assert verdict.ok
    assert len(verdict.peer_overlaps) == 1
    # The same with our run the older one (taken first) is ours to answer for.
    ours_older = [
        CONFIG,
        *job("1"),
        run("started", "1", "a", 50, taken=40 * MS),
        run("started", "1", "n", 1500, taken=1490 * MS, **node),
        run("finished", "1", "a", 2600, outcome="completed"),
        run("finished", "1", "n", 3000, outcome="completed", **node),
    ]
    verdict = check(ours_older)
    assert len(verdict.overlaps) == 1
    assert not verdict.peer_overlaps


def test_a_fenced_write_accepted_after_a_higher_fence_or_anothers_equal_fence_is_stale() -> None:
    base = [
        CONFIG,
        *job("1"),
        run("started", "1", "a", 0),
        run("finished", "1", "a", 10, outcome="completed"),
    ]
    clean = [
        *base,
        write("fenced", "1", "b", 1, accepted=True, fence=2, seq=1),
        write("fenced", "1", "a", 2, accepted=False, fence=1, seq=2),
        write("fenced", "1", "b", 3, accepted=True, fence=2, seq=3),
    ]
    assert check(clean).ok
    lower = [*base, clean[-3], write("fenced", "1", "a", 2, accepted=True, fence=1, seq=2)]
    assert len(check(lower).stale_writes) == 1
    equal = [*base, clean[-3], write("fenced", "1", "a", 2, accepted=True, fence=2, seq=2)]
    assert len(check(equal).stale_writes) == 1


def test_a_guarded_write_applied_after_a_later_run_took_the_lock_is_stale() -> None:
    records = [
        CONFIG,
        *job("1"),
        fault("partition", "thread", 0, 100),
        run("started", "1", "a", 0, taken=0),
        run("lost", "1", "a", 100),
        run("started", "1", "b", 6000, taken=5990 * MS),
        run("finished", "1", "b", 6500, outcome="completed"),
    ]
    before = write("guarded", "1", "a", 5000, accepted=True)
    assert check([*records, before]).ok
    after = write("guarded", "1", "a", 6100, accepted=True)
    assert len(check([*records, after]).stale_writes) == 1
    refused = write("guarded", "1", "a", 6100, accepted=False)
    assert check([*records, refused]).ok


def test_a_run_that_took_the_lock_later_with_no_higher_fence_is_counted() -> None:
    records = [
        CONFIG,
        *job("1"),
        fault("partition", "thread", 0, 100),
        run("started", "1", "a", 0, taken=0),
        run("lost", "1", "a", 100),
        run("started", "1", "b", 6000, taken=5990 * MS),
        run("finished", "1", "b", 6500, outcome="completed"),
        write("fenced", "1", "a", 50, accepted=True, fence=3, seq=1),
    ]
    risen = write("fenced", "1", "b", 6100, accepted=True, fence=4, seq=2)
    assert check([*records, risen]).ok
    same = write("fenced", "1", "b", 6100, accepted=True, fence=3, seq=2)
    found = check([*records, same]).stale_writes
    assert any("not above" in finding.what for finding in found)


def test_a_job_id_handed_out_again_after_a_restart_is_another_job() -> None:
    # The server restarted empty: id "1" of the first server is wiped, the second's is new.
    first: dict[str, Any] = {"created": 100}
    second: dict[str, Any] = {"created": 9000}
    records = [
        CONFIG,
        {"kind": "job", "event": "added", "job": "1", "t": 0, **first},
        {"kind": "job", "event": "added", "job": "1", "t": 9000 * MS, **second},
        fault("redis-restart", "redis", 5000, 6000),
        run("started", "1", "a", 10, **first),
        run("lost", "1", "a", 6200, reason="expired", **first),
        run("started", "1", "b", 9100, **second),
        run("finished", "1", "b", 9500, outcome="completed", **second),
        {"kind": "job", "event": "final", "job": "1", "state": "wiped", "t": 99_000 * MS, **first},
        {
            "kind": "job",
            "event": "final",
            "job": "1",
            "state": "completed",
            "t": 99_000 * MS,
            **second,
        },
    ]
    verdict = check(records)
    assert verdict.ok, verdict
    assert (verdict.jobs, verdict.wiped) == (2, 1)
    # Without the restart, a job gone from the server is unfinished.
    no_restart = [r for r in records if r.get("fault") != "redis-restart"]
    assert len(check(no_restart).unfinished) == 1


def test_a_refused_move_is_explained_by_a_pause_between_its_send_and_its_refusal() -> None:
    records = [
        CONFIG,
        *job("1"),
        run("started", "1", "a", 0),
        run("lost", "1", "a", 100, seen=8000 * MS, reason="move refused"),
        fault("stop", "thread", 200, 7900),
        run("started", "1", "b", 6000, base="bullmq"),
        run("finished", "1", "b", 6500, base="bullmq", outcome="completed"),
    ]
    assert check(records).ok
    unexplained = [*records[:3], run("lost", "1", "a", 100, reason="move refused"), *records[4:]]
    assert len(check(unexplained).unexplained_losses) == 1


def added(job_id: str, sent_ms: int, t_ms: int, state: str, created: int) -> list[Any]:
    named = {"job": job_id, "created": created}
    return [
        {"kind": "job", "event": "added", "sent": sent_ms * MS, "t": t_ms * MS, **named},
        {"kind": "job", "event": "final", "state": state, "t": 99_000 * MS, **named},
    ]


def test_a_job_whose_adding_a_failover_undid_is_counted_apart() -> None:
    # The replica held every write up to 5000 ms; the old primary took writes until 8000.
    failover = fault("failover", "redis", 4990, 8000, synced=5000 * MS)
    records = [CONFIG, failover, *added("7", 6000, 6001, "wiped", created=6000)]
    verdict = check(records)
    assert verdict.ok, verdict
    assert (verdict.jobs, verdict.undone_adds, verdict.wiped) == (1, 1, 0)
    # Answered before the replica was known to hold everything: the replica has it.
    replicated = [CONFIG, failover, *added("7", 4000, 4001, "wiped", created=4000)]
    assert len(check(replicated).unfinished) == 1
    # Sent after the old primary was a replica again: no failover undid it.
    after = [CONFIG, failover, *added("7", 8100, 8101, "wiped", created=8100)]
    assert len(check(after).unfinished) == 1
    # A failover that undoes an add does not excuse a job that is still there, unfinished.
    left = [CONFIG, failover, *added("7", 6000, 6001, "wait", created=6000)]
    assert len(check(left).unfinished) == 1


def test_a_completion_a_failover_undid_lets_the_job_run_again() -> None:
    named: dict[str, Any] = {"created": 100}
    records = [
        CONFIG,
        *added("1", 0, 1, "completed", created=100),
        fault("failover", "redis", 4990, 8000, synced=5000 * MS),
        run("started", "1", "a", 4000, taken=4000 * MS, **named),
        # Sent to the old primary after the replica's last confirmation: undone.
        run("finished", "1", "a", 6000, seen=6001 * MS, outcome="completed", **named),
        # Its lock, as the replica had it, expired; a stalled check gave the job to another.
        run("started", "1", "b", 10_000, base="bullmq", taken=10_000 * MS, **named),
        run("finished", "1", "b", 10_500, base="bullmq", outcome="completed", **named),
    ]
    verdict = check(records)
    assert verdict.ok, verdict
    assert verdict.undone_completions == 1
    assert not verdict.reruns
    # Without the failover, the rerun is listed (not counted).
    plain = [r for r in records if r.get("fault") != "failover"]
    verdict = check(plain)
    assert verdict.ok
    assert verdict.undone_completions == 0
    assert [f.what.split(":")[0] for f in verdict.reruns] == ["job 1@100"]


def test_a_failover_excuses_no_overlap_and_no_stale_write() -> None:
    # The old primary still took run a's writes; run b took the job on the new one.
    records = [
        CONFIG,
        *job("1"),
        fault("failover", "redis", 4990, 8000, synced=5000 * MS),
        run("started", "1", "a", 4000, taken=4000 * MS),
        run("started", "1", "b", 7000, base="bullmq", taken=7000 * MS),
        run("lost", "1", "a", 7500, reason="unconfirmed"),
        run("finished", "1", "b", 7600, base="bullmq", outcome="completed"),
    ]
    verdict = check(records)
    assert len(verdict.overlaps) == 1
    # An unconfirmed guarded write is not accepted, and is no stale write.
    unconfirmed = write("guarded", "1", "a", 7200, accepted=False, unconfirmed=True)
    assert not check([*records, unconfirmed]).stale_writes
    accepted = write("guarded", "1", "a", 7200, accepted=True)
    assert len(check([*records, accepted]).stale_writes) == 1


def test_a_loss_during_a_replicated_fault_is_explained() -> None:
    records = [
        CONFIG,
        *job("1"),
        fault("replica-cut", "redis", 1000, 3000, synced=1000 * MS),
        run("started", "1", "a", 0),
        run("lost", "1", "a", 3500, reason="unconfirmed"),
        run("started", "1", "b", 6000, base="bullmq"),
        run("finished", "1", "b", 6500, base="bullmq", outcome="completed"),
    ]
    assert check(records).ok


def test_primary_changes_beyond_the_failover_faults_are_unasked() -> None:
    records = [
        CONFIG,
        fault("failover", "redis", 1000, 4000, synced=1000 * MS),
        fault("failover", "redis", 5000, 6000, error="timed out"),
        {"kind": "note", "what": "switches", "count": 2, "t": 9000 * MS},
    ]
    assert check(records).unasked_failovers == 1
    assert check(records[:2]).unasked_failovers == 0


def test_a_lagging_failover_may_undo_what_the_primary_took_since_the_cut() -> None:
    # The link was cut at 5000 ms, the replica promoted at 8000 lacking those three seconds.
    lagging = fault("lagging-failover", "redis", 4990, 11_000, synced=5000 * MS, lag_s=3.0)
    records = [CONFIG, lagging, *added("7", 6000, 6001, "wiped", created=6000)]
    verdict = check(records)
    assert verdict.ok, verdict
    assert verdict.undone_adds == 1


def test_a_run_whose_take_came_before_a_completion_is_no_rerun() -> None:
    # Its fetch took the lock on the old primary; a GIL hold delayed its news past the completion.
    records = [
        CONFIG,
        *job("1"),
        run("started", "1", "a", 1000, base="process", taken=1000 * MS),
        run("finished", "1", "a", 1500, base="process", outcome="completed"),
        run("started", "1", "b", 6000, taken=900 * MS),
        run("lost", "1", "b", 6000, reason="take unconfirmed"),
    ]
    verdict = check(records)
    assert not verdict.reruns
    assert verdict.undone_completions == 0


def hold(holder: str, start_ms: int, end_ms: int, target: str = "bullmq") -> Any:
    return {
        "kind": "hold",
        "target": target,
        "holder": holder,
        "start": start_ms * MS,
        "end": end_ms * MS,
        "t": end_ms * MS,
    }


def test_a_run_behind_another_that_held_the_loop_is_not_in_hand() -> None:
    # Run a (bullmq) was told at the resume; run c of the same worker held the loop until 3000.
    records = [
        CONFIG,
        *job("1"),
        fault("stop", "bullmq", 100, 2100),
        run("started", "1", "a", 0, base="bullmq"),
        run("started", "1", "b", 2600, base="process"),
        run("lost", "1", "a", 3050, base="bullmq", reason="unconfirmed"),
        run("finished", "1", "b", 3500, base="process", outcome="completed"),
    ]
    assert len(check(records).overlaps) == 1
    assert check([*records, hold("c", 1400, 3000)]).ok
    # The run that held the loop itself, or the other run of the job, is not excused.
    assert len(check([*records, hold("a", 1400, 3000)]).overlaps) == 1
    assert len(check([*records, hold("c", 1400, 3000, target="thread")]).overlaps) == 1


def test_a_fault_of_the_replica_explains_only_unconfirmed_losses() -> None:
    records = [
        CONFIG,
        *job("1"),
        fault("replica-cut", "redis", 1000, 3000, synced=1000 * MS),
        run("started", "1", "a", 0),
        run("lost", "1", "a", 3500, reason="expired"),
        run("started", "1", "b", 6000, base="bullmq"),
        run("finished", "1", "b", 6500, base="bullmq", outcome="completed"),
    ]
    assert len(check(records).unexplained_losses) == 1
    failover = [fault("failover", "redis", 1000, 3000, synced=1000 * MS), *records[3:]]
    assert check([CONFIG, *job("1"), *failover]).ok


def test_a_run_told_before_it_started_holds_the_job_for_no_time() -> None:
    # Its take went to the old primary in a failover; the new one gave the job to run a.
    records = [
        CONFIG,
        *job("1"),
        fault("failover", "redis", 1000, 4000, synced=1000 * MS),
        run("started", "1", "a", 2000, base="bullmq", taken=2000 * MS),
        run("started", "1", "b", 2100, taken=1900 * MS),
        run("lost", "1", "b", 2100, reason="take: stolen"),
        run("finished", "1", "a", 2500, base="bullmq", outcome="completed"),
    ]
    assert check(records).ok
