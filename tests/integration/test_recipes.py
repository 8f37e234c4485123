"""The Recipes guide's code (``examples/stalled_checker.py``, ``examples/fenced_store.py``).

The stalled checker against a real server and bullmq-py's own fetch; the fenced store with
fences from :func:`actors.fence`, a holder replaced after a real stalled check, and the
statements a Postgres store sends, run on SQLite (no Postgres server runs here).
"""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from typing import TYPE_CHECKING, Any

import pytest

import actors
from actors import LockLost, QueueKeys
from examples.fenced_store import CLAIM, READ, TABLE, WRITE, FencedStore
from examples.stalled_checker import StalledChecker, add, fetch, state

if TYPE_CHECKING:
    from pathlib import Path

    import redis

    from tests.conftest import Server, StartManager

#: The jobs' lock TTL, in milliseconds.
LOCK_MS = 500
#: The checker's ``stalledInterval``, in milliseconds.
INTERVAL_MS = 250
#: Longest wait for a lapsed lock's job to be reported: its TTL, two checks, a busy machine.
STALL_S = 15.0


def fetched(server: Server, queue: str) -> tuple[str, str]:
    """Add a job and take it with bullmq-py's fetch, never renewed; its id and token."""
    asyncio.run(add(server.url, queue))
    return asyncio.run(fetch(server.url, queue, LOCK_MS))


# -- the stalled-check-only peer ---------------------------------------------------------


def test_the_checker_hands_a_job_whose_lock_lapsed_back_to_wait(
    server: Server, redis_client: redis.Redis
) -> None:
    # Given a job taken by a worker that then renews nothing
    job_id, _ = fetched(server, "recipe-lapsed")

    # When the checker runs until it reports the job
    with StalledChecker(server.url, "recipe-lapsed", interval_ms=INTERVAL_MS) as checker:
        checker.wait_stalled(job_id, STALL_S)
        thread = checker._thread

    # Then the job waits again, reported once, and the checker's thread is gone
    assert asyncio.run(state(server.url, "recipe-lapsed", job_id)) == "waiting"
    assert checker.stalled == [job_id]
    assert checker.checks >= 2
    assert not thread.is_alive()


def test_the_checker_leaves_alone_a_job_whose_lock_is_renewed(
    server: Server, redis_client: redis.Redis, start_manager: StartManager
) -> None:
    # Given a job taken the same way, its lock renewed by a manager
    job_id, token = fetched(server, "recipe-renewed")
    keys = QueueKeys("recipe-renewed", prefix="bull")
    manager = start_manager(connection=server.url, keys=keys, lock_duration=LOCK_MS)
    actors.track_job(manager, job_id, token)

    # When the checker runs for four TTLs' worth of checks
    with StalledChecker(server.url, "recipe-renewed", interval_ms=INTERVAL_MS) as checker:
        checker.wait_checks(4 * LOCK_MS // INTERVAL_MS + 1, timeout=60)

    # Then nothing was reported stalled and the job is still active under its token
    assert checker.stalled == []
    assert asyncio.run(state(server.url, "recipe-renewed", job_id)) == "active"
    assert redis_client.get(keys.lock(job_id)) == token.encode()


def test_a_check_the_server_refuses_makes_the_waits_raise(
    server: Server, redis_client: redis.Redis
) -> None:
    # Given a queue whose stalled set is not a set: BullMQ's check fails on it
    redis_client.set("bull:recipe-broken:stalled", "not a set")

    # When a test waits on the checker, then the wait raises with the server's error
    with (
        StalledChecker(server.url, "recipe-broken", interval_ms=INTERVAL_MS) as checker,
        pytest.raises(RuntimeError, match="ResponseError"),
    ):
        checker.wait_checks(2, timeout=STALL_S)


# -- the fenced store --------------------------------------------------------------------


def take(client: redis.Redis, keys: QueueKeys, job_id: str) -> str:
    """Take a free lock with a new token, as a fetch does."""
    token = str(uuid.uuid4())
    assert client.set(keys.lock(job_id), token, nx=True, px=30_000)
    return token


def test_a_holder_paused_past_a_stalled_check_is_refused_by_the_store(
    server: Server, redis_client: redis.Redis, tmp_path: Path
) -> None:
    store = FencedStore(sqlite3.connect(tmp_path / "results.db"))
    keys = QueueKeys("recipe-fenced", prefix="bull")
    # Given holder 1 took a job and its fence, claimed the row, and then was paused
    job_id, first = fetched(server, "recipe-fenced")
    first_fence = actors.fence(redis_client, keys, job_id, first)
    assert store.claim(job_id, first_fence)

    # When its lock lapses, a stalled check hands the job back and holder 2 takes it
    with StalledChecker(server.url, "recipe-fenced", interval_ms=INTERVAL_MS) as checker:
        checker.wait_stalled(job_id, STALL_S)
    again, second = asyncio.run(fetch(server.url, "recipe-fenced", 30_000))
    assert again == job_id
    second_fence = actors.fence(redis_client, keys, job_id, second)
    assert second_fence > first_fence
    assert store.claim(job_id, second_fence)

    # Then holder 1, waking, gets no new fence and its write with the old one is refused
    with pytest.raises(LockLost):
        actors.fence(redis_client, keys, job_id, first)
    assert store.write(job_id, first_fence, "by holder 1") is False
    assert store.read(job_id) == (second_fence, None)
    # ...while holder 2 writes, as often as it likes
    assert store.write(job_id, second_fence, "by holder 2")
    assert store.write(job_id, second_fence, "by holder 2, again")
    assert store.read(job_id) == (second_fence, "by holder 2, again")


def test_without_a_claim_a_stale_write_lands_until_the_new_holder_writes(
    redis_client: redis.Redis, tmp_path: Path
) -> None:
    store = FencedStore(sqlite3.connect(tmp_path / "results.db"))
    keys = QueueKeys("recipe-unclaimed")
    redis_client.hset(keys.key_prefix + "9", mapping={"name": "job", "data": "{}"})
    # Given two holders in turn, neither of which claimed the row when it started
    first = take(redis_client, keys, "9")
    first_fence = actors.fence(redis_client, keys, "9", first)
    redis_client.delete(keys.lock("9"))
    second = take(redis_client, keys, "9")
    second_fence = actors.fence(redis_client, keys, "9", second)

    # When the stale holder writes before the new one has written anything
    landed = store.write("9", first_fence, "by holder 1")

    # Then the store took it (it had seen no larger fence), and readers saw it until
    # holder 2's write replaced it: what claiming at the start prevents
    assert landed is True
    assert store.read("9") == (first_fence, "by holder 1")
    assert store.write("9", second_fence, "by holder 2")
    assert store.read("9") == (second_fence, "by holder 2")


class PsycopgStyle:
    """A sqlite3 connection that takes psycopg's ``%s`` markers.

    The store sends it the statements it would send to Postgres; SQLite runs them.
    """

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self.sent: list[str] = []

    def cursor(self) -> PsycopgStyle:
        return self

    def execute(self, sql: str, parameters: tuple[object, ...] = ()) -> None:
        assert "?" not in sql
        self.sent.append(sql)
        self._cursor = self.db.execute(sql.replace("%s", "?"), parameters)

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount

    def fetchone(self) -> Any:
        return self._cursor.fetchone()

    def close(self) -> None:
        self._cursor.close()

    def commit(self) -> None:
        self.db.commit()


@pytest.mark.parametrize("dialect", ["sqlite", "postgres statements"])
def test_the_store_refuses_every_fence_below_the_largest_it_saw(
    tmp_path: Path, dialect: str
) -> None:
    db = sqlite3.connect(tmp_path / "results.db")
    postgres = PsycopgStyle(db)
    store = FencedStore(db) if dialect == "sqlite" else FencedStore(postgres, placeholder="%s")

    # A first claim makes the row; a later fence's claim moves it on, keeping no result
    assert store.read("1") is None
    assert store.claim("1", 3)
    assert store.claim("1", 5)
    assert store.read("1") == (5, None)
    # A smaller fence is refused, to claim or to write, and changes nothing
    assert store.claim("1", 4) is False
    assert store.write("1", 4, "stale") is False
    assert store.read("1") == (5, None)
    # The same fence writes; a larger one's claim keeps the result until it writes its own
    assert store.write("1", 5, "five")
    assert store.claim("1", 6)
    assert store.read("1") == (6, "five")
    assert store.write("1", 5, "five again") is False
    assert store.write("1", 6, "six")
    assert store.read("1") == (6, "six")
    # Rows of other job ids are their own
    assert store.write("2", 1, "one")
    assert store.read("2") == (1, "one")
    assert store.read("1") == (6, "six")
    if dialect != "sqlite":
        # ...and those were the statements a Postgres store sends, word for word
        statements = {sql.format(p="%s") for sql in (TABLE, CLAIM, WRITE, READ)}
        assert set(postgres.sent) == statements
