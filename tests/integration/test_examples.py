"""Every example runs against a real server, with short durations, and does what it says."""

from __future__ import annotations

import redis
from bullmq.queue_keys import QueueKeys as BullMQKeys

from examples import bullmq_compat, health_check, multi_queue, supervisor_tree
from tests.conftest import Server

# Short but wide: a tick may run hundreds of ms late on a busy machine and no
# lock may be lost for it (renew window 750 ms, tick 375 ms).
LOCK_MS = 1500


def _kinds(result: supervisor_tree.Result, job_id: str) -> list[str]:
    return [event.kind for event in result.events if event.job_id == job_id]


def test_supervisor_tree_abandons_the_stolen_job_and_restarts_the_crashed_actor(
    server: Server, redis_client: redis.Redis
) -> None:
    # Given a tree of four jobs that each work three TTLs,
    # when another worker takes job-2's lock and job-3's actor crashes mid-way
    result = supervisor_tree.run(
        server.url,
        jobs=4,
        lock_duration=LOCK_MS,
        work_ms=3 * LOCK_MS,
        step_ms=100,
        steal="job-2",
        crash="job-3",
        provoke_after_ms=800,
    )

    # then only the stolen lock was reported lost, and its work abandoned
    assert result.lost == ["job-2"]
    assert result.stats.lost == 1
    assert result.abandoned == ["job-2"]
    assert _kinds(result, "job-2")[-3:] == ["lost", "abandon", "abandoned"]
    # and the actor left the thief's lock alone (compare-and-delete refused)
    abandoned = [e for e in result.events if e.job_id == "job-2" and e.kind == "abandoned"]
    assert abandoned[0].detail.endswith("lock not ours: left as it is")

    # and the crashed actor was restarted once, after its job was untracked
    assert result.crashed == ["job-3"]
    assert result.untracked_after_crash == ["job-3"]
    assert result.restarts == {"job-1": 0, "job-2": 0, "job-3": 1, "job-4": 0}
    kinds = _kinds(result, "job-3")
    assert kinds.index("crashed") < kinds.index("untracked") < kinds.index("restarted")

    # and nothing renewed the crashed actor's lock after the untrack: it ran
    # out, the restarted actor waited for that, took the job again and finished
    events = [event for event in result.events if event.job_id == "job-3"]
    untracked_at = next(event.at for event in events if event.kind == "untracked")
    retaken_at = [event.at for event in events if event.kind == "acquired"][1]
    assert "waiting" in kinds
    assert not [e for e in events if e.kind == "renewed" and untracked_at < e.at < retaken_at]
    assert retaken_at - untracked_at < 2 * LOCK_MS / 1000

    # and the others finished and released their locks
    assert result.finished == ["job-1", "job-3", "job-4"]
    assert result.unfinished == []
    assert redis_client.keys("emq:supervised:*:lock") == []
    assert result.server_script_calls == result.stats.script_calls > 0


def test_multi_queue_renews_each_queue_with_its_own_manager(
    server: Server, redis_client: redis.Redis
) -> None:
    # Given a worker holding two jobs on each of two queues, one manager per queue,
    # when it holds them past one TTL
    result = multi_queue.run(
        server.url, queues=("mail", "video"), jobs_per_queue=2, lock_duration=LOCK_MS
    )

    # then every lock outlived its TTL, each renewed by its own queue's manager only
    assert result.held_ms > LOCK_MS
    for name, queue in result.queues.items():
        assert queue.job_ids == [f"{name}-1", f"{name}-2"]
        assert queue.held_past_ttl
        assert queue.lost == []
        assert set(queue.renewed) == set(queue.job_ids)
        assert queue.stats.queue == name
        # and never more than one script call per tick
        assert 0 < queue.stats.script_calls <= queue.stats.ticks
    # and the locks were released at the end
    assert redis_client.keys("emq:*:lock") == []


def test_health_check_tells_a_lost_lock_from_a_stopped_manager(
    server: Server, redis_client: redis.Redis
) -> None:
    # Given a supervisor checking a manager that tracks three jobs,
    # when one job's lock disappears and then the manager stops
    result = health_check.run(server.url, lock_duration=LOCK_MS, jobs=3)

    # then it is healthy while it renews
    assert result.healthy.healthy, result.healthy.reason
    assert result.healthy.active == 3
    assert sorted(result.healthy.tracked) == ["job-1", "job-2", "job-3"]
    assert result.healthy.stats is not None
    assert result.healthy.stats.renewed >= 3

    # and still healthy after a lost lock, which it untracked
    assert result.after_lost_lock.healthy, result.after_lost_lock.reason
    assert result.after_lost_lock.active == 2
    assert "job-1" not in result.after_lost_lock.tracked
    assert result.after_lost_lock.stats is not None
    assert result.after_lost_lock.stats.lost == 1

    # and unhealthy once stopped
    assert not result.after_stop.healthy
    assert "stopped" in result.after_stop.reason


def test_bullmq_compat_renews_bullmq_keys_and_clears_the_stalled_set(
    server: Server, redis_client: redis.Redis
) -> None:
    # Given jobs locked as BullMQ's move-to-active locks them, and marked by
    # a stalled checker's round,
    # when the manager with prefix "bull" renews them
    result = bullmq_compat.run(server.url, queue="payments", jobs=3, lock_duration=LOCK_MS)

    # then the keys are the ones BullMQ itself builds
    bull = BullMQKeys("bull")
    assert result.lock_keys == [bull.toKey("payments", n) + ":lock" for n in ("1", "2", "3")]
    assert result.stalled_key == bull.getKeys("payments")["stalled"]

    # and the first renewal took every id out of the stalled set
    assert result.stalled_before == {"1", "2", "3"}
    assert result.stalled_after == set()

    # and the locks outlived their TTL, nothing lost
    assert result.held_past_ttl
    assert all(0 < ttl <= LOCK_MS for ttl in result.ttl_after_ms.values())
    assert result.lost == []
    assert redis_client.keys("bull:payments:*:lock") == []
