"""Renewing locks with the shared script: the two calls a caller makes.

:func:`renew_batch` is what a manager's tick runs: the chunked EVALSHA of
:mod:`actors.evalsha`, then, when locks were reported lost, the read-back of
:mod:`actors.readback`. :func:`extend_locks` is the plain call, BullMQ's
``extendLocks`` in Python. The names the layer below defines stay importable
from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from actors.evalsha import DEFAULT_MAX_BATCH, SCRIPT_NAME, run_chunks, script_sha, script_source
from actors.lost import EXPIRED, STOLEN
from actors.outcome import BatchOutcome, ChunkError, UnconfirmedLossError
from actors.readback import classify_failed, lock_holds
from actors.validation import require_batch, require_int

if TYPE_CHECKING:
    from collections.abc import Sequence

    from actors.keys import QueueKeys

__all__ = [
    "DEFAULT_MAX_BATCH",
    "EXPIRED",
    "SCRIPT_NAME",
    "STOLEN",
    "BatchOutcome",
    "ChunkError",
    "UnconfirmedLossError",
    "classify_failed",
    "extend_locks",
    "lock_holds",
    "renew_batch",
    "script_sha",
    "script_source",
]


def renew_batch(
    conn: Any,
    keys: QueueKeys,
    job_ids: Sequence[str],
    tokens: Sequence[str],
    duration: int,
    *,
    max_batch: int = DEFAULT_MAX_BATCH,
    check_items: bool = True,
) -> BatchOutcome:
    """Renew many locks in one round trip, ``max_batch`` ids per script call.

    Up to ``max_batch`` ids make exactly one EVALSHA. More are split into
    chunks, all sent in one pipeline (no MULTI), so no single script holds the
    server for long. A chunk that the server refuses (BUSY, OOM, a reply that
    is not a list) is returned in ``errors`` while the other chunks' results
    stand. NOSCRIPT loads the script and resends the affected chunks.

    On a ``redis.RedisCluster`` the chunks go to the node serving the queue's
    slot (redirections followed), NOSCRIPT is answered with EVAL there, and
    each id the script reports failed is read back by
    :func:`classify_failed` (on any server): a lock still held with its token
    (a cluster slot was migrating) comes back in ``errors``, not in
    ``failed``, and every lost one gets its reason.

    Args:
        conn: A ``redis.Redis`` or ``redis.RedisCluster`` client.
        keys: The queue's keys.
        job_ids: Ids of the jobs to renew.
        tokens: Each job's lock token, in the same order.
        duration: The new lock TTL, in milliseconds.
        max_batch: Most ids per script call.
        check_items: Check that every id and token is a non-empty ``str``.
            A caller that checked them already (the lock manager does when a
            job is tracked) passes ``False`` to save a pass over the batch.

    Returns:
        The failed ids of the chunks that ran, and the chunks that did not.

    Raises:
        ValueError: Mismatched lengths, an empty id or token, a bad duration
            or ``max_batch``; nothing is sent.
        redis.exceptions.RedisError: The connection failed: no chunk is known
            to have run.
    """
    require_batch(job_ids, tokens, duration, each=check_items)
    max_batch = require_int(max_batch, "max_batch")
    if not job_ids:
        return BatchOutcome([], [])
    outcome = run_chunks(conn, keys, job_ids, tokens, duration, max_batch)
    if outcome.failed:
        outcome = classify_failed(conn, keys, job_ids, tokens, outcome)
    return outcome


def extend_locks(
    conn: Any,
    keys: QueueKeys,
    job_ids: Sequence[str],
    tokens: Sequence[str],
    duration: int,
    *,
    max_batch: int | None = None,
) -> list[str]:
    """Renew the locks of ``job_ids`` with ``extendLocks-1.lua``.

    Example:
        >>> extend_locks(redis.Redis(), QueueKeys("q"), ["j1"], [token], 30000)
        []

    Args:
        conn: A ``redis.Redis`` or ``redis.RedisCluster`` client.
        keys: The queue's keys.
        job_ids: Ids of the jobs to renew.
        tokens: Each job's lock token, in the same order.
        duration: The new lock TTL, in milliseconds.
        max_batch: Most ids per script call; ``None`` sends all of them in one.

    Returns:
        The ids whose lock was gone or held by another token, as ``str``; an
        empty list when every lock was renewed. An empty batch returns ``[]``
        without a round trip.

    Raises:
        ValueError: Mismatched lengths, an empty id or token, or a bad
            duration; nothing is sent.
        redis.exceptions.RedisError: The server or the connection failed.
    """
    outcome = renew_batch(
        conn, keys, job_ids, tokens, duration, max_batch=max_batch or max(len(job_ids), 1)
    )
    if outcome.errors:
        raise outcome.errors[0].error
    return outcome.failed
