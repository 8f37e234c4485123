"""What a manager says as it starts and stops.

An unreachable server is named at once; a dead target is not named at all.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pykka
import pytest
import redis

from actors import QueueKeys, start_link, stop, track_job
from actors.embedded import free_port
from tests.support import Server, take_locks, wait_for

KEYS = QueueKeys("words")
#: Seconds for the first look at the server, with a margin for a loaded machine.
SOON_S = 10.0


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_server_that_does_not_answer_is_said_once_at_start(
    caplog: pytest.LogCaptureFixture, isolation: str
) -> None:
    # Given a URL where no server listens, and no job tracked yet
    url = f"redis://127.0.0.1:{free_port()}/0"
    with caplog.at_level(logging.WARNING, logger="actors"):
        manager = start_link(connection=url, keys=KEYS, lock_duration=1000, isolation=isolation)
        # Then the manager says so at start, naming where it looked, and keeps going
        wait_for(
            lambda: [
                r for r in caplog.records if "cannot reach its Redis server" in r.getMessage()
            ],
            SOON_S,
            "the warning",
        )
        said = [r for r in caplog.records if "cannot reach its Redis server" in r.getMessage()]
        assert len(said) == 1
        assert url in said[0].getMessage()
        assert said[0].levelno == logging.WARNING
        assert manager.is_alive()
    stop(manager)


def test_a_reachable_server_is_not_complained_about(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="actors"):
        manager = start_link(connection=server.url, keys=KEYS, lock_duration=1000)
        stop(manager)
    assert [r.getMessage() for r in caplog.records if r.name.startswith("actors")] == []


class Job(pykka.ThreadingActor):
    def on_receive(self, message: Any) -> Any:
        return None


def test_stopping_skips_a_target_that_is_gone_without_a_traceback(
    server: Server, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    manager = start_link(connection=server.url, keys=KEYS, lock_duration=60_000)
    tokens = take_locks(redis_client, KEYS, ["j"], 60_000)
    job = Job.start()
    track_job(manager, "j", tokens["j"], notify=job)
    job.stop()
    # When the manager stops before any tick saw the holder gone
    with caplog.at_level(logging.DEBUG, logger="actors"):
        started = time.monotonic()
        stop(manager)
    assert time.monotonic() - started < SOON_S
    # Then the dead target is skipped quietly
    loud = [r for r in caplog.records if r.levelno >= logging.INFO and r.name.startswith("actors")]
    assert loud == []
    assert not [r for r in caplog.records if r.exc_info]
