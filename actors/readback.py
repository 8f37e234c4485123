"""Reading locks back: whether one holds a token, and why each reported lock was lost.

The script's reply is BullMQ's, a list of ids, so the reason a lock was lost
is read afterwards, and only when something was lost.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from redis.client import NEVER_DECODE
from redis.exceptions import ResponseError

from actors.keys import hash_slot, lock_key
from actors.lost import EXPIRED, STOLEN, Reason
from actors.outcome import BatchOutcome, ChunkError, UnconfirmedLossError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from actors.keys import QueueKeys

__all__ = ["classify_failed", "lock_holds"]

logger = logging.getLogger("actors.scripts")

#: Options of a command whose reply is kept as the server's bytes. redis-py
#: honours them on ``redis.Redis`` and ``redis.RedisCluster``, in pipelines too.
_RAW: dict[str, Any] = {NEVER_DECODE: True}


def lock_holds(conn: Any, keys: QueueKeys, job_id: str, token: str) -> bool:
    """Whether ``job_id``'s lock holds exactly ``token`` (one GET, read as raw bytes).

    Read raw whatever the client's ``decode_responses``: a value that is not
    UTF-8 is another holder's, not an unreadable reply.

    Raises:
        redis.exceptions.RedisError: The read failed.
    """
    return bool(conn.execute_command("GET", keys.lock(job_id), **_RAW) == token.encode("utf-8"))


def classify_failed(
    conn: Any,
    keys: QueueKeys,
    job_ids: Sequence[str],
    tokens: Sequence[str],
    outcome: BatchOutcome,
) -> BatchOutcome:
    """Read the reported locks back: say why each was lost, keep the still-held ones.

    The script's reply is BullMQ's, a list of ids, so the reason is read
    afterwards: one pipelined GET per reported lock, a round trip paid only
    when something was lost. Each GET is routed by its own key, so on a
    cluster it finds the lock on whichever node holds it now.

    - no key: :data:`EXPIRED`;
    - any value but the exact UTF-8 bytes of the job's token, or a key of
      another type: :data:`STOLEN`;
    - the job's own token: the script could not see it (a cluster slot was
      migrating): a one-job :class:`ChunkError` carrying
      :class:`UnconfirmedLossError`, retried by the next tick.

    An id may come more than once in a batch, each time with its own token,
    as BullMQ's script allows: the script then reports the entries whose
    token the lock does not hold, and each report is matched to such an
    entry of that id, not to the id's last entry.

    Values are read and compared as raw bytes, whatever the client's
    ``decode_responses``: a value that is not UTF-8 is another holder's, not
    a reply that cannot be read.

    When the read-back itself fails, whatever the exception, every reported
    id becomes such an error: its lock is in an unknown state, and the next
    tick tries again.

    Args:
        conn: The client the script ran on.
        keys: The queue's keys.
        job_ids: The batch's ids, as given to the script.
        tokens: Each job's token, in the same order.
        outcome: What the script reported.
    """
    reported = list(dict.fromkeys(outcome.failed))
    try:
        pipe = conn.pipeline(transaction=False)
        for job_id in reported:
            # Built as the script builds it: the ids come back from the server
            # as sent. Read undecoded: a client with decode_responses would
            # raise on a value that is not UTF-8, and decoding with
            # replacement would make foreign bytes equal a token holding U+FFFD.
            pipe.execute_command("GET", lock_key(keys.key_prefix, job_id), **_RAW)
        values = pipe.execute(raise_on_error=False)
    except Exception as exc:
        # Not only RedisError: whatever went wrong, these locks may still be
        # held, so the jobs stay tracked and on_error hears of it every tick.
        logger.warning(
            "queue %r: could not read back %d lost lock(s), retrying them next tick: %s: %s",
            keys.name,
            len(reported),
            type(exc).__name__,
            exc,
        )
        values = [exc] * len(reported)
    value_of = dict(zip(reported, values, strict=True))
    entries = _reported_entries(job_ids, tokens, outcome, value_of)
    lost: list[str] = []
    reasons: dict[str, Reason] = {}
    held: list[ChunkError] = []
    for job_id in outcome.failed:
        value = value_of[job_id]
        i, holds = entries[job_id].pop(0) if entries[job_id] else (None, False)
        if isinstance(value, ResponseError) and str(value).startswith("WRONGTYPE"):
            # The key holds something that is not a token: another holder's.
            reasons[job_id] = STOLEN
        elif value is not None and not isinstance(value, bytes):
            # An error, or a reply GET never gives: the lock's state is unknown.
            if i is not None:
                cause = value if isinstance(value, Exception) else _unexpected(value)
                held.append(ChunkError(i, i + 1, _unconfirmed(keys, job_id, cause)))
                continue
            reasons[job_id] = STOLEN
        elif holds and i is not None:
            held.append(ChunkError(i, i + 1, _unconfirmed(keys, job_id, None)))
            continue
        else:
            reasons[job_id] = EXPIRED if value is None else STOLEN
        lost.append(job_id)
    if held:
        logger.info(
            "queue %r: %d lock(s) reported lost could not be confirmed lost; "
            "retrying them next tick",
            keys.name,
            len(held),
        )
    return BatchOutcome(lost, [*outcome.errors, *held], reasons)


def _reported_entries(
    job_ids: Sequence[str],
    tokens: Sequence[str],
    outcome: BatchOutcome,
    value_of: dict[str, object],
) -> dict[str, list[tuple[int, bool]]]:
    """Each reported id's entries that ran, those whose token the lock holds last.

    An entry is ``(index in the batch, whether the lock read back holds its
    token)``. The script reports an entry exactly when the lock did not hold
    its token, so the reports of an id go to its entries that the read-back
    finds lost first; an entry holding its token is reported only when the
    script could not see the lock.
    """
    skipped = {i for error in outcome.errors for i in range(error.start, error.stop)}
    found: dict[str, list[tuple[int, bool]]] = {job_id: [] for job_id in value_of}
    for i, job_id in enumerate(job_ids):
        slot = found.get(job_id)
        if slot is not None and i not in skipped:
            value = value_of[job_id]
            slot.append((i, isinstance(value, bytes) and value == tokens[i].encode("utf-8")))
    for slot in found.values():
        slot.sort(key=lambda entry: entry[1])  # stable: input order within each kind
    return found


def _unexpected(value: object) -> ResponseError:
    return ResponseError(f"GET returned {type(value).__name__}, expected bytes or nothing")


def _unconfirmed(keys: QueueKeys, job_id: str, cause: Exception | None) -> UnconfirmedLossError:
    if cause is not None:
        error = UnconfirmedLossError(
            f"the lock of job {job_id!r} was reported lost but could not be read back "
            f"({type(cause).__name__}: {cause}); it is retried next tick"
        )
        # Kept for on_error and the logged traceback: the cause may be no RedisError.
        error.__cause__ = cause
        return error
    return UnconfirmedLossError(
        f"the lock of job {job_id!r} is still held but the renewal script could not see it "
        f"(slot {hash_slot(keys.stalled)} is being migrated); it is retried next tick"
    )
