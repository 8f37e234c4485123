"""The renewer every manager uses unless told otherwise: the shared script on Redis.

:class:`RedisRenewer` fills the seam of :mod:`actors.outcome`: a manager's
tick calls it, and it sends the batch's EVALSHA calls in one round trip
(:func:`actors.evalsha.run_chunks`), then reads back the locks reported lost
(:func:`actors.readback.classify_failed`). :class:`~actors.outcome.Renewer`
and :class:`~actors.outcome.BatchOutcome` stay importable from here.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import redis

from actors.connection import check_client, client_for_url, unreachable_message
from actors.evalsha import DEFAULT_MAX_BATCH, run_chunks
from actors.outcome import BatchOutcome, Renewer
from actors.readback import classify_failed
from actors.schedule import check_lock_duration
from actors.validation import require_batch, require_int

if TYPE_CHECKING:
    from collections.abc import Sequence

    from actors.connection import Client
    from actors.keys import QueueKeys

__all__ = ["BatchOutcome", "RedisRenewer", "Renewer"]

logger = logging.getLogger("actors.lock_manager")


class RedisRenewer:
    """Renews with ``extendLocks-1.lua`` on one server or a cluster.

    Args:
        connection: A ``redis.Redis`` or ``redis.RedisCluster`` client, or a
            Redis URL (a client is then built whose failed command ends within
            a quarter of the interval, and closed with the renewer).
        keys: The queue's keys.
        lock_duration: The TTL each renewal sets, in milliseconds.
        interval_ms: The manager's tick interval, which bounds a failed call.
        max_batch: Most ids per script call; a batch's calls share one round trip.

    Raises:
        TypeError: ``connection`` is not a client or a URL; ``max_batch`` is
            not an ``int``.
        ValueError: ``max_batch`` is not positive, ``lock_duration`` is under
            :data:`~actors.schedule.MIN_REDIS_LOCK_DURATION`, the client's
            encoding is not UTF-8, or a cluster client was given for keys that
            cannot share one slot.
    """

    def __init__(
        self,
        connection: Client | str,
        keys: QueueKeys,
        lock_duration: int,
        interval_ms: int,
        max_batch: int = DEFAULT_MAX_BATCH,
    ) -> None:
        self._max_batch = require_int(max_batch, "max_batch")
        check_lock_duration(lock_duration)
        self._owns = isinstance(connection, str)
        conn: Any = (
            client_for_url(connection, interval_ms=interval_ms)
            if isinstance(connection, str)
            else connection
        )
        check_client(conn, keys, interval_ms)
        self.connection: Client = conn
        self.keys = keys
        self.lock_duration = lock_duration
        self._told_unreachable = False

    @property
    def max_batch(self) -> int:
        """Most ids per script call."""
        return self._max_batch

    def __call__(self, job_ids: Sequence[str], tokens: Sequence[str]) -> BatchOutcome:
        """Renew ``job_ids`` held with ``tokens`` in one round trip."""
        # Every id and token was checked when the job was tracked.
        require_batch(job_ids, tokens, self.lock_duration, each=False)
        if not job_ids:
            return BatchOutcome([], [])
        conn, keys = self.connection, self.keys
        try:
            outcome = run_chunks(conn, keys, job_ids, tokens, self.lock_duration, self._max_batch)
            if outcome.failed:
                outcome = classify_failed(conn, keys, job_ids, tokens, outcome)
            return outcome
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            # Once, at the first failure: where the server was looked for and
            # what to check. The tick's own error line follows, every streak.
            if not self._told_unreachable:
                self._told_unreachable = True
                logger.error("%s", unreachable_message(self.connection, self.keys.name, exc))
            raise

    def close(self) -> None:
        """Close the client if the renewer built it from a URL."""
        if self._owns:
            self._owns = False
            self.connection.close()
