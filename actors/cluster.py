"""Lock renewal on Redis Cluster and Valkey cluster.

The renewal script declares one key (the stalled set) and builds each lock key
from ARGV, so it is only correct when every key of the queue lives in the slot
of that one declared key: the queue name or the prefix must carry a hash tag
(``QueueKeys("{myqueue}")``), which :class:`~actors.LockManager` checks at
start.

Two things a cluster adds that one server does not:

- A client whose failed command comes back within one tick interval
  (:func:`cluster_client`): redis-py's cluster client has no socket timeout
  by default and retries a failed command up to ten times, refreshing the
  topology each time and sleeping a quarter of a second on every CLUSTERDOWN.
- While a slot migrates, a script that reaches the importing node by an ASK
  redirection sees only the keys already moved there, and reports the locks
  still on the old node as gone. :func:`confirm_failed` looks the reported
  locks up one by one (each GET follows its own redirection) and turns a lock
  that is in fact still held into an error for that job, so the next tick
  tries it again instead of giving the job up.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import redis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from actors.keys import hash_slot
from actors.scripts import BatchOutcome, ChunkError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from actors.keys import QueueKeys

__all__ = [
    "CLUSTER_RETRIES",
    "UnconfirmedLossError",
    "cluster_client",
    "cluster_timeout",
    "confirm_failed",
]

logger = logging.getLogger(__name__)

#: Retries after a failed attempt. One absorbs a pooled connection to a node
#: that restarted or was replaced; more would stretch a failed tick.
CLUSTER_RETRIES = 1


class UnconfirmedLossError(RedisError):
    """The script found no lock, yet the lock is still held with the job's token.

    It happens while the queue's slot migrates between nodes: the script ran
    where only part of the slot's keys were. The job stays tracked and the
    next tick renews it.
    """


def cluster_timeout(interval_ms: int) -> float:
    """Return the socket timeout, in seconds, that keeps a failed tick inside ``interval_ms``.

    A failed command costs at most two attempts, each of which may wait for
    the command, for one topology refresh and for redis-py's fixed 0.25 s pause
    on CLUSTERDOWN. A tenth of the interval (between 50 ms and 2 s) keeps the
    sum under one interval from an interval of about one second up.
    """
    return min(max(interval_ms / 10_000, 0.05), 2.0)


def cluster_client(url: str, *, interval_ms: int, **options: Any) -> redis.RedisCluster:
    """Build a cluster client whose failed command returns within one tick interval.

    Example:
        >>> conn = cluster_client("redis://10.0.0.5:7000", interval_ms=7500)
        >>> manager = start_link(connection=conn, keys=QueueKeys("{myqueue}"))

    Args:
        url: ``redis://host:port`` of any node; the client finds the others.
        interval_ms: The manager's tick interval (``lock_renew_time // 2``), in
            milliseconds.
        **options: More ``redis.RedisCluster`` options; they override the
            timeouts and retries chosen here.

    Returns:
        A client with socket and connect timeouts of
        :func:`cluster_timeout` and one immediate retry.
    """
    timeout = cluster_timeout(interval_ms)
    options.setdefault("socket_timeout", timeout)
    options.setdefault("socket_connect_timeout", timeout)
    options.setdefault("retry", Retry(NoBackoff(), CLUSTER_RETRIES))
    return redis.RedisCluster.from_url(url, **options)


def confirm_failed(
    conn: Any,
    keys: QueueKeys,
    job_ids: Sequence[str],
    tokens: Sequence[str],
    outcome: BatchOutcome,
) -> BatchOutcome:
    """Keep as failed only the reported ids whose lock is really gone.

    Each reported lock is read with its own GET, which the cluster client
    routes and redirects by that key alone, so it finds the lock on whichever
    node holds it. A lock still holding the job's token becomes a one-job
    :class:`~actors.scripts.ChunkError` carrying :class:`UnconfirmedLossError`:
    not renewed, not lost, retried by the next tick.

    Args:
        conn: The ``redis.RedisCluster`` client the script ran on.
        keys: The queue's keys.
        job_ids: The batch's ids, as given to the script.
        tokens: Each job's token, in the same order.
        outcome: What the script reported.

    Returns:
        ``outcome`` with the still-held ids moved from ``failed`` to ``errors``.

    When the lookups themselves fail, every reported id becomes an error
    instead: its lock is in an unknown state, and the next tick tries again.
    """
    if not outcome.failed:
        return outcome
    position = {job_id: i for i, job_id in enumerate(job_ids)}
    pipe = conn.pipeline(transaction=False)
    for job_id in outcome.failed:
        pipe.get(keys.lock(job_id))
    try:
        values = pipe.execute(raise_on_error=True)
    except RedisError as exc:
        logger.warning(
            "queue %r: could not confirm %d lost lock(s), retrying them next tick: %s",
            keys.name,
            len(outcome.failed),
            exc,
        )
        unknown = [
            ChunkError(position[job_id], position[job_id] + 1, exc) for job_id in outcome.failed
        ]
        return BatchOutcome([], [*outcome.errors, *unknown])
    lost: list[str] = []
    held: list[ChunkError] = []
    for job_id, value in zip(outcome.failed, values, strict=True):
        i = position[job_id]
        current = value.decode("utf-8") if isinstance(value, bytes) else value
        if current is not None and current == tokens[i]:
            held.append(ChunkError(i, i + 1, _unconfirmed(keys, job_id)))
        else:
            lost.append(job_id)
    if held:
        logger.info(
            "queue %r: %d lock(s) reported gone are still held (slot %d is moving); "
            "retrying them next tick",
            keys.name,
            len(held),
            hash_slot(keys.stalled),
        )
    return BatchOutcome(lost, [*outcome.errors, *held])


def _unconfirmed(keys: QueueKeys, job_id: str) -> UnconfirmedLossError:
    return UnconfirmedLossError(
        f"the lock of job {job_id!r} is still held but the renewal script could not see it "
        f"(slot {hash_slot(keys.stalled)} is being migrated); it is retried next tick"
    )
