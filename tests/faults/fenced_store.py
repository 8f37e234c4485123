"""A downstream store that checks fences, and the three writes a holder makes to it.

The store is an SQLite file, so that holders in other processes share it:
``fenced`` keeps a row per job and refuses a fence smaller than the one it
holds (``WHERE excluded.fence >= fenced.fence``, the SQL of the Fencing
guide); ``plain`` takes every write. The third write goes to Redis through
:func:`actors.guarded`.

Run as a script (``python tests/faults/fenced_store.py URL DB TOKEN``), it is
the second worker: it waits for the job's lock to be free, takes it, takes a
fence and writes, then prints its fence.
"""

from __future__ import annotations

import sqlite3
import sys
import time
from pathlib import Path

import redis

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import actors
from actors import QueueKeys

KEYS = QueueKeys("faults")
JOB = "job"
RESULT = "result:job"


def create(path: Path) -> None:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE fenced (job TEXT PRIMARY KEY, fence INTEGER, writer TEXT)")
        db.execute("CREATE TABLE plain (job TEXT PRIMARY KEY, writer TEXT)")


def write_all(
    client: redis.Redis, path: Path, token: str, fence: int, writer: str
) -> dict[str, int]:
    """Make the three writes as ``writer``; return what each did (1 applied, 0 refused)."""
    with sqlite3.connect(path, timeout=30) as db:
        fenced = db.execute(
            "INSERT INTO fenced VALUES (?, ?, ?) ON CONFLICT(job) DO UPDATE SET "
            "fence = excluded.fence, writer = excluded.writer WHERE excluded.fence >= fenced.fence",
            (JOB, fence, writer),
        ).rowcount
        plain = db.execute(
            "INSERT INTO plain VALUES (?, ?) "
            "ON CONFLICT(job) DO UPDATE SET writer = excluded.writer",
            (JOB, writer),
        ).rowcount
    try:
        with actors.guarded(client, KEYS, JOB, token) as pipe:
            pipe.set(RESULT, writer)
        guarded = 1
    except actors.LockLost:
        guarded = 0
    return {"fenced": fenced, "plain": plain, "guarded": guarded}


def writers(client: redis.Redis, path: Path) -> dict[str, str | None]:
    """Who each store holds the last write of."""
    with sqlite3.connect(path) as db:
        fenced = db.execute("SELECT writer FROM fenced").fetchone()
        plain = db.execute("SELECT writer FROM plain").fetchone()
    result = client.get(RESULT)
    assert result is None or isinstance(result, bytes)
    return {
        "fenced": fenced and fenced[0],
        "plain": plain and plain[0],
        "guarded": result.decode() if result else None,
    }


def second_worker(url: str, path: Path, token: str) -> None:
    client = redis.Redis.from_url(url, socket_timeout=1)
    print("ready", flush=True)
    while not client.set(KEYS.lock(JOB), token, nx=True, px=60_000):
        time.sleep(0.002)
    fence = actors.fence(client, KEYS, JOB, token)
    write_all(client, path, token, fence, "second")
    print(fence, flush=True)


if __name__ == "__main__":
    second_worker(sys.argv[1], Path(sys.argv[2]), sys.argv[3])
