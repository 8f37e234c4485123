"""A store that refuses a stale holder's writes: one row per job id, the largest fence wins.

A holder takes a fencing number with :func:`actors.fence` (or a lease's ``held.fence``)
and hands it to every write. Fence numbers only grow across the successive holders of a
job id, so a row keyed by the job id refuses a number smaller than the one it holds:
the write of a holder that was paused while another took the job is refused, however
late it comes. :meth:`FencedStore.claim` writes the holder's number before its result
(an empty row), so the earlier holder is refused from the moment a later one starts.

The statements are the same for SQLite (3.24 or later) and Postgres (9.5 or later); only
the driver's parameter marker differs. Run it with ``python examples/fenced_store.py``
(``REDIS_URL``, or a private server).
"""

from __future__ import annotations

import sqlite3
import tempfile
import uuid
from pathlib import Path
from typing import Any, Protocol

import redis

import actors
from actors.embedded import server_url

__all__ = ["CLAIM", "READ", "TABLE", "WRITE", "Connection", "FencedStore"]

# --8<-- [start:store]
#: One row per job id: the largest fence seen, and the last result written (NULL before).
TABLE = """CREATE TABLE IF NOT EXISTS job_results (
    job_id TEXT PRIMARY KEY,
    fence BIGINT NOT NULL,
    result TEXT
)"""
#: Record a holder's fence, keeping the row's result; refused below the row's fence.
CLAIM = """INSERT INTO job_results (job_id, fence) VALUES ({p}, {p})
ON CONFLICT (job_id) DO UPDATE SET fence = excluded.fence
WHERE excluded.fence >= job_results.fence"""
#: Write a holder's result; refused below the row's fence.
WRITE = """INSERT INTO job_results (job_id, fence, result) VALUES ({p}, {p}, {p})
ON CONFLICT (job_id) DO UPDATE SET fence = excluded.fence, result = excluded.result
WHERE excluded.fence >= job_results.fence"""
#: The row of one job id.
READ = "SELECT fence, result FROM job_results WHERE job_id = {p}"


class Connection(Protocol):
    """What the store needs of a DB-API 2 connection (sqlite3's, psycopg's)."""

    def cursor(self) -> Any:
        """Return a new cursor."""
        ...

    def commit(self) -> None:
        """Commit the transaction under way."""
        ...


class FencedStore:
    """Results by job id; a write carrying a smaller fence than the row's changes nothing.

    Each statement checks the fence and writes in one step, and is committed on its
    own, so two holders writing at once cannot both pass the check.

    Args:
        connection: ``sqlite3.connect(path)``, or ``psycopg.connect(dsn)`` for Postgres.
        placeholder: The driver's parameter marker: ``"?"`` for sqlite3, ``"%s"`` for psycopg.
    """

    def __init__(self, connection: Connection, placeholder: str = "?") -> None:
        self._db = connection
        self._claim, self._write, self._read = (
            sql.format(p=placeholder) for sql in (CLAIM, WRITE, READ)
        )
        self._execute(TABLE)

    def claim(self, job_id: str, fence: int) -> bool:
        """Record that the holder of ``fence`` works on ``job_id``; return False if stale.

        From then on every write with a smaller fence is refused, whether or not this
        holder writes a result. False: a later holder claimed or wrote the row already.
        """
        return self._execute(self._claim, job_id, fence) == 1

    def write(self, job_id: str, fence: int, result: str) -> bool:
        """Write the result of the holder of ``fence``; return False if it was refused."""
        return self._execute(self._write, job_id, fence, result) == 1

    def read(self, job_id: str) -> tuple[int, str | None] | None:
        """Return the row's fence and result, or None if no holder wrote to it."""
        cursor = self._db.cursor()
        try:
            cursor.execute(self._read, (job_id,))
            row = cursor.fetchone()
        finally:
            cursor.close()
        self._db.commit()
        return None if row is None else (int(row[0]), row[1])

    def _execute(self, sql: str, *parameters: object) -> int:
        cursor = self._db.cursor()
        try:
            cursor.execute(sql, parameters)
            changed = int(cursor.rowcount)
        finally:
            cursor.close()
        self._db.commit()
        return changed


# --8<-- [end:store]


def take(client: redis.Redis, keys: actors.QueueKeys, job_id: str) -> str:
    """Take the job's lock as a worker's fetch does; return the token."""
    token = str(uuid.uuid4())
    assert client.set(keys.lock(job_id), token, nx=True, px=30_000)
    return token


def main() -> int:
    """Two holders of one job, the first paused while the second takes over."""
    keys = actors.QueueKeys("invoices", prefix="bull")
    with (
        server_url() as url,
        redis.Redis.from_url(url, socket_timeout=5) as client,
        tempfile.TemporaryDirectory() as folder,
    ):
        store = FencedStore(sqlite3.connect(Path(folder) / "results.db"))
        # Step 1: the job (as a queue adds it), its first holder, its fence and its claim.
        client.hset(keys.key_prefix + "7", mapping={"name": "invoice", "data": "{}"})
        first = take(client, keys, "7")
        first_fence = actors.fence(client, keys, "7", first)
        print(f"holder 1: fence {first_fence}, claim accepted: {store.claim('7', first_fence)}")
        # Step 2: holder 1 pauses past its TTL (gone here at once); holder 2 takes the job.
        client.delete(keys.lock("7"))
        second = take(client, keys, "7")
        second_fence = actors.fence(client, keys, "7", second)
        print(f"holder 2: fence {second_fence}, claim accepted: {store.claim('7', second_fence)}")
        # Step 3: holder 1 wakes and writes; holder 2 finishes and writes.
        stale = store.write("7", first_fence, "invoice by holder 1")
        print(f"holder 1 writes with fence {first_fence}: accepted: {stale}")
        fresh = store.write("7", second_fence, "invoice by holder 2")
        print(f"holder 2 writes with fence {second_fence}: accepted: {fresh}")
        print(f"row: {store.read('7')}")
        client.delete(keys.lock("7"), keys.key_prefix + "7")
    return 0 if fresh and not stale else 1


if __name__ == "__main__":
    raise SystemExit(main())
