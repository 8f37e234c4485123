"""Log records carry fields: ``queue`` on each, ``job_id`` on those about a job, and ``reason``.

Read through a JSON formatter, as a user of JSON logs reads them, against the real server.
"""

from __future__ import annotations

import io
import json
import logging
from typing import TYPE_CHECKING, Any

import pykka
import pytest

from actors import lease, start_link, stop, track_job
from tests.integration.conftest import THRESHOLD, hold, on_a_dead_server, queue_keys
from tests.support import ManualClock, settle, take_locks, tick, wait_for

if TYPE_CHECKING:
    from collections.abc import Iterator

    import redis

    from tests.conftest import StartManager
    from tests.support import Server

#: The fields a JSON formatter adds from ``extra=``: everything not on a bare LogRecord.
_BARE = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}
#: Most per-job loss records of one tick (as the reporter logs them).
SHOWN = 20


class JsonFormatter(logging.Formatter):
    """One JSON object per record: level, logger, message, and the record's extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        fields = {k: v for k, v in record.__dict__.items() if k not in _BARE}
        return json.dumps(
            {
                "level": record.levelname,
                "logger": record.name,
                "message": record.getMessage(),
                **fields,
            },
            default=str,
        )


class JsonLogs:
    """The ``actors`` records written so far, each parsed back from its JSON line."""

    def __init__(self, stream: io.StringIO) -> None:
        self._stream = stream

    def __call__(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self._stream.getvalue().splitlines()]


@pytest.fixture
def json_logs() -> Iterator[JsonLogs]:
    """A JSON handler on the ``actors`` logger for the test, at INFO."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("actors")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield JsonLogs(stream)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_each_lost_lock_is_a_record_with_queue_job_id_and_reason(
    redis_client: redis.Redis, start_manual: StartManager, json_logs: JsonLogs
) -> None:
    keys, clock = queue_keys(), ManualClock()
    manager = start_manual(redis_client, keys, clock)
    for job_id in ["kept", "stolen", "gone", "żółw-\U0001f422"]:
        track_job(manager, job_id, hold(redis_client, keys, job_id))
    redis_client.set(keys.lock("stolen"), "another-worker", px=20000)
    redis_client.delete(keys.lock("gone"), keys.lock("żółw-\U0001f422"))
    clock.advance(THRESHOLD + 1)

    tick(manager)

    records = json_logs()
    losses = {r["job_id"]: r for r in records if "lost the lock of job" in r["message"]}
    assert set(losses) == {"stolen", "gone", "żółw-\U0001f422"}
    assert {k: r["reason"] for k, r in losses.items()} == {
        "stolen": "stolen",
        "gone": "expired",
        "żółw-\U0001f422": "expired",
    }
    assert all(r["queue"] == keys.name and r["level"] == "WARNING" for r in losses.values())
    assert all(repr(job_id) in r["message"] for job_id, r in losses.items())
    # The hint that follows the first expired lock names its job too.
    (hint,) = [r for r in records if "was gone when it was renewed" in r["message"]]
    assert hint["queue"] == keys.name
    assert hint["job_id"] in {"gone", "żółw-\U0001f422"}
    # Every record has its queue.
    assert all(r.get("queue") == keys.name for r in records)


def test_a_burst_of_losses_is_bounded_records_and_one_summary(
    redis_client: redis.Redis, start_manual: StartManager, json_logs: JsonLogs
) -> None:
    keys, clock = queue_keys(), ManualClock()
    manager = start_manual(redis_client, keys, clock)
    ids = [f"j{i}" for i in range(SHOWN + 30)]
    for job_id, token in take_locks(redis_client, keys, ids, 20000).items():
        track_job(manager, job_id, token)
    redis_client.delete(*(keys.lock(job_id) for job_id in ids))
    clock.advance(THRESHOLD + 1)

    tick(manager)

    records = json_logs()
    per_job = [r for r in records if "lost the lock of job" in r["message"]]
    (summary,) = [r for r in records if "more job(s)" in r["message"]]
    assert len(per_job) == SHOWN
    assert summary["count"] == 30
    assert summary["reasons"] == ["expired"]
    assert summary["queue"] == keys.name


def test_a_failed_tick_and_a_dead_holder_carry_their_fields(
    redis_client: redis.Redis, start_manual: StartManager, json_logs: JsonLogs
) -> None:
    # A failed tick: about the batch, with its queue and how many jobs it kept.
    keys, failing = on_a_dead_server(start_manual, "j1")
    tick(failing)
    (error,) = [r for r in json_logs() if r["level"] == "ERROR"]
    assert (error["queue"], error["jobs"]) == (keys.name, 1)

    # A holder that died without untracking: a record naming its job.
    other, clock2 = queue_keys(), ManualClock()
    manager = start_manual(redis_client, other, clock2)
    holder = pykka.ThreadingActor.start()
    track_job(manager, "orphan", hold(redis_client, other, "orphan"), notify=holder)
    settle(manager)
    holder.stop()
    clock2.advance(THRESHOLD + 1)
    tick(manager)
    (dead,) = [r for r in json_logs() if "no longer alive" in r["message"]]
    assert (dead["queue"], dead["job_id"]) == (other.name, "orphan")


def test_process_mode_losses_carry_the_same_fields(
    server: Server, redis_client: redis.Redis, json_logs: JsonLogs
) -> None:
    keys = queue_keys()
    manager = start_link(connection=server.url, keys=keys, lock_duration=1000, isolation="process")
    try:
        token = take_locks(redis_client, keys, ["p1"], 1000)["p1"]
        with lease(manager, "p1", token):
            redis_client.set(keys.lock("p1"), "another-worker", px=20000)
            wait_for(
                lambda: any(r.get("job_id") == "p1" for r in json_logs()),
                10,
                "the loss's record",
            )
    finally:
        stop(manager)
    (loss,) = [r for r in json_logs() if r.get("job_id") == "p1"]
    assert (loss["queue"], loss["reason"]) == (keys.name, "stolen")
