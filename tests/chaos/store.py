"""The downstream stores of a chaos run, and a job's writes to them at the end of its work.

Two stores, two cures for a stale holder (see the Fencing guide):

- **fenced**: an SQLite file every worker process shares; a row per job keeps
  the highest fence written, and a write carrying a smaller one is refused
  (``WHERE excluded.fence >= fenced.fence``, the guide's SQL). Each attempt is
  logged in the store's own order (``seq``), in the same transaction.
- **guarded**: a key of the queue's Redis, written through :func:`actors.guarded`,
  applied only while the job's lock holds the writer's token.

Each attempt goes to the history as a ``"write"`` record (``store``, ``job``,
``token``, ``fence``, ``accepted``, ``seq`` for the fenced store, and ``t0``
/ ``t``: just before the write was sent and once it was answered). A guarded
write the replicas did not confirm (``replicas=``) is not accepted: it is
recorded with ``unconfirmed``, and its ``NotReplicatedError`` raised.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Any

import actors
from tests.chaos.history import now

if TYPE_CHECKING:
    from pathlib import Path

    import redis
    import redis.asyncio

    from actors import QueueKeys, Replicas
    from tests.chaos.history import History

__all__ = ["create", "result_key", "write_fenced", "write_guarded", "write_guarded_async"]

#: Longest wait for the SQLite write lock, in seconds (a writer may be paused holding it).
LOCK_WAIT_S = 60


def create(path: Path) -> None:
    """Create the fenced store's tables."""
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE fenced (job TEXT PRIMARY KEY, fence INTEGER, token TEXT)")
        db.execute(
            "CREATE TABLE log (seq INTEGER PRIMARY KEY AUTOINCREMENT, job TEXT, token TEXT, "
            "fence INTEGER, accepted INTEGER)"
        )


def result_key(keys: QueueKeys, job_id: str) -> str:
    """The guarded result's key: in the job's hash slot, beside its lock."""
    return f"{keys.base}:{job_id}:chaos-result"


def write_fenced(
    path: Path,
    history: History,
    run: dict[str, Any],
    job_id: str,
    token: str,
    fence: int,
    *,
    row: str,
) -> bool:
    """Write the run's result to the fenced store; record and return whether it was accepted.

    ``row`` is the store's key for the job: its id and creation time, as the
    Fencing guide keys a store (a server restarted empty hands out ids again).
    """
    t0 = now()
    db = sqlite3.connect(path, timeout=LOCK_WAIT_S, isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")
        accepted = db.execute(
            "INSERT INTO fenced VALUES (?, ?, ?) ON CONFLICT(job) DO UPDATE SET "
            "fence = excluded.fence, token = excluded.token WHERE excluded.fence >= fenced.fence",
            (row, fence, token),
        ).rowcount
        seq = db.execute(
            "INSERT INTO log (job, token, fence, accepted) VALUES (?, ?, ?, ?)",
            (row, token, fence, accepted),
        ).lastrowid
        db.execute("COMMIT")
    finally:
        db.close()
    history.write(
        kind="write",
        store="fenced",
        job=job_id,
        token=token,
        fence=fence,
        accepted=bool(accepted),
        seq=seq,
        t0=t0,
        t=now(),
        **run,
    )
    return bool(accepted)


def write_guarded(
    client: redis.Redis,
    keys: QueueKeys,
    history: History,
    run: dict[str, Any],
    job_id: str,
    token: str,
    *,
    replicas: Replicas | None = None,
) -> bool:
    """Write the run's result to Redis while its lock holds ``token``; record whether it was.

    Raises:
        NotReplicatedError: Fewer ``replicas`` confirmed the write than asked (recorded).
    """
    t0 = now()
    try:
        with actors.guarded(client, keys, job_id, token, replicas=replicas) as pipe:
            pipe.set(result_key(keys, job_id), token)
        accepted = True
    except actors.LockLost:
        accepted = False
    except actors.NotReplicatedError:
        _record_guarded(history, run, job_id, token, t0, accepted=False, unconfirmed=True)
        raise
    _record_guarded(history, run, job_id, token, t0, accepted=accepted)
    return accepted


async def write_guarded_async(
    client: redis.asyncio.Redis,
    keys: QueueKeys,
    history: History,
    run: dict[str, Any],
    job_id: str,
    token: str,
    *,
    replicas: Replicas | None = None,
) -> bool:
    """:func:`write_guarded` through an asyncio client.

    Raises:
        NotReplicatedError: Fewer ``replicas`` confirmed the write than asked (recorded).
    """
    t0 = now()
    try:
        async with actors.guarded(client, keys, job_id, token, replicas=replicas) as pipe:
            pipe.set(result_key(keys, job_id), token)
        accepted = True
    except actors.LockLost:
        accepted = False
    except actors.NotReplicatedError:
        _record_guarded(history, run, job_id, token, t0, accepted=False, unconfirmed=True)
        raise
    _record_guarded(history, run, job_id, token, t0, accepted=accepted)
    return accepted


def _record_guarded(
    history: History,
    run: dict[str, Any],
    job_id: str,
    token: str,
    t0: int,
    *,
    accepted: bool,
    **more: Any,
) -> None:
    history.write(
        kind="write",
        store="guarded",
        job=job_id,
        token=token,
        accepted=accepted,
        t0=t0,
        t=now(),
        **more,
        **run,
    )
