"""Defects of the read-back that tells a stolen lock from an expired one, on both engines.

When the script reports a lock lost, the manager reads the key back: a
missing key is "expired", any other holder's value is "stolen", and a lock
still holding the job's token is kept for the next tick. Every test names its
defect in its docstring's first line. Locks are short (``TTL`` ms, so the
interval is ``TTL // 4``) and every wait is a polling deadline derived from
those durations.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytest

from actors import QueueKeys, get_stats, is_tracked, track_job
from actors.lost import STOLEN
from actors.scripts import UnconfirmedLossError
from tests.support import Recorder, alive, new_token, set_locks, wait_ticks

if TYPE_CHECKING:
    from collections.abc import Iterator

    import redis

    from actors import ManagerRef
    from tests.support import Server

KEYS = QueueKeys("readback")
TTL = 400  # ms: renew window 200 ms, interval and threshold 100 ms
INTERVAL_S = TTL / 4 / 1000
#: Ample for a tick to run and report, on a loaded machine: ticks come every interval.
REPORT_S = 20 * INTERVAL_S
#: How long another holder's lock lives: past the end of the test, so that it
#: can only be found "stolen", never "expired".
THEIRS_MS = 50 * TTL
#: Ticks to let run after a report, to see that it is not repeated.
MORE_TICKS = 4

#: Another worker's lock value that is not UTF-8, whatever our token.
FOREIGN = b"\xff\xfeother-worker"


@pytest.fixture(params=[False, True], ids=["bytes-replies", "decoded-replies"])
def manager_client(
    request: pytest.FixtureRequest, engine_server: Server, engine_client: redis.Redis
) -> Iterator[redis.Redis]:
    """A client of the engine for the manager, with or without ``decode_responses``.

    It asks for ``engine_client`` so that the server is flushed around the test.
    """
    client = engine_server.client(decode_responses=request.param)
    yield client
    client.close()


def _start(recorder: Recorder, client: redis.Redis, tokens: dict[str, str]) -> ManagerRef:
    """Take the jobs' locks, track them, and wait until each was renewed once."""
    manager = recorder.start(client, KEYS, lock_duration=TTL)
    for job_id, token in tokens.items():
        track_job(manager, job_id, token)
    recorder.wait_renewed(tokens, REPORT_S)
    return manager


def _take_over(client: redis.Redis, job_id: str, value: bytes) -> None:
    # As another worker writes it once our lock is gone: its own bytes, its own TTL.
    client.set(KEYS.lock(job_id), value, px=THEIRS_MS)


@pytest.mark.parametrize(
    ("token", "theirs"),
    [
        pytest.param(None, FOREIGN, id="foreign-bytes"),
        # Decoded with replacement, b"\xff" reads as our token "\ufffd".
        pytest.param("\ufffd", b"\xff", id="token-U+FFFD"),
    ],
)
def test_a_lock_taken_over_with_bytes_that_are_not_utf8_is_reported_stolen(
    engine_client: redis.Redis, manager_client: redis.Redis, token: str | None, theirs: bytes
) -> None:
    """Defect: a lock another holder took with non-UTF-8 bytes is never reported lost.

    With ``decode_responses=True`` the read-back raised UnicodeDecodeError,
    which is no RedisError: every tick failed whole (``on_error`` each time,
    nothing counted renewed) and the job was never reported. With any client,
    the value was decoded with replacement before the comparison, so
    ``b"\\xff"`` equalled a token ``"\\ufffd"``: "still held", retried forever.
    """
    tokens = {"taken": token or new_token(), "kept": new_token()}
    set_locks(engine_client, KEYS, tokens, TTL)
    recorder = Recorder()
    manager = _start(recorder, manager_client, tokens)

    _take_over(engine_client, "taken", theirs)
    recorder.wait(recorder.lost, REPORT_S, "the report of the lock taken over")
    reported = time.monotonic()
    wait_ticks(manager, MORE_TICKS, timeout=MORE_TICKS * REPORT_S)

    lost = [(item.job_id, item.token, item.reason) for item in recorder.lost()]
    assert lost == [("taken", tokens["taken"], STOLEN)], "reported once, as stolen"
    assert not is_tracked(manager, "taken")
    assert recorder.errors() == [], "a lock taken over is no failed tick"
    assert recorder.renewed(since=reported)["kept"] >= 1, "the other job stopped being renewed"
    assert alive(engine_client, KEYS, {"kept": tokens["kept"]}) == {"kept"}
    assert engine_client.get(KEYS.lock("taken")) == theirs, "the other holder's lock was touched"
    assert get_stats(manager).errors == 0


def test_a_read_back_failing_with_no_redis_error_keeps_the_job_and_says_so(
    engine_server: Server, engine_client: redis.Redis
) -> None:
    """Defect: a read-back raising anything but a RedisError fails the whole tick.

    The exception escaped the read-back, so the renewals the script did make
    were never counted (``on_locks_renewed`` silent, ``renewed`` stuck) and
    ``on_error`` got a bare exception instead of the failed read-back's
    :class:`UnconfirmedLossError`. The job whose lock could not be read back
    must stay tracked (its lock is in an unknown state), and say so each tick.
    """

    class ReplyRefused(Exception):
        """What the client's own GET reply callback raises."""

    def refuse(response: Any, **options: Any) -> Any:
        raise ReplyRefused(f"cannot parse {response!r}")

    client = engine_server.client()
    # A user's client may parse replies its own way; here GET's parsing fails.
    client.set_response_callback("GET", refuse)
    try:
        tokens = {"taken": new_token(), "kept": new_token()}
        set_locks(engine_client, KEYS, tokens, TTL)
        recorder = Recorder()
        manager = _start(recorder, client, tokens)

        _take_over(engine_client, "taken", FOREIGN)
        recorder.wait(recorder.errors, REPORT_S, "the failed read-back's error")
        failing = time.monotonic()
        wait_ticks(manager, MORE_TICKS, timeout=MORE_TICKS * REPORT_S)

        errors = recorder.errors()
        assert errors, "the failed read-back was silent"
        assert all(isinstance(error, UnconfirmedLossError) for error in errors), errors
        assert all(isinstance(error.__cause__, ReplyRefused) for error in errors), errors
        assert is_tracked(manager, "taken"), "a job whose lock may be held was dropped"
        assert recorder.lost() == [], "a loss nobody could confirm was reported"
        assert recorder.renewed(since=failing)["kept"] >= 1, "the other job stopped being renewed"
        assert alive(engine_client, KEYS, {"kept": tokens["kept"]}) == {"kept"}
    finally:
        client.close()
