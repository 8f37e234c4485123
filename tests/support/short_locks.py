"""Short locks, a manager on them, a check that it keeps renewing, and a bystander.

Locks are short (``TTL`` ms, so the renew window is ``TTL // 2`` and the
interval ``TTL // 4``) so that a renewal that stops shows within a second;
every wait is a multiple of those durations or a polling deadline.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pykka

from actors import start_link
from tests.support.locks import watch_locks
from tests.support.polling import wait_ticks

if TYPE_CHECKING:
    import redis

    from actors import ManagerRef, QueueKeys

__all__ = ["INTERVAL_S", "TTL", "WATCH_S", "Bystander", "assert_still_renewing", "start_short"]

TTL = 400  # ms: renew window 200 ms, interval and threshold 100 ms
INTERVAL_S = TTL / 4 / 1000
#: Long enough for a lock nobody renews to expire, with a margin.
WATCH_S = 3 * TTL / 1000


def start_short(
    client: redis.Redis, keys: QueueKeys, *, own_client: bool = False, **options: Any
) -> ManagerRef:
    """A manager of ``keys`` on ``client``'s server, its locks ``TTL`` ms unless told otherwise.

    Args:
        client: The test's client.
        keys: The queue's keys.
        own_client: Give the manager a client of its own, built from the
            server's URL, whose timeouts fit its interval (closed at its stop).
        **options: More keywords for :func:`actors.start_link`.
    """
    options.setdefault("lock_duration", TTL)
    if not own_client:
        return start_link(connection=client, keys=keys, **options)
    kwargs = client.connection_pool.connection_kwargs
    url = f"redis://{kwargs['host']}:{kwargs['port']}/{kwargs.get('db', 0)}"
    return start_link(connection=url, keys=keys, **options)


def assert_still_renewing(
    manager: ManagerRef, client: redis.Redis, keys: QueueKeys, tokens: dict[str, str]
) -> None:
    """Assert the manager keeps ``tokens``' locks alive for a few TTLs and keeps ticking."""
    seen = watch_locks(client, keys, tokens, seconds=WATCH_S, every=0.02)
    assert seen.missing == set(), f"locks expired while tracked: {sorted(seen.missing)}"
    wait_ticks(manager, 2, timeout=20 * INTERVAL_S)


class Bystander(pykka.ThreadingActor):
    """Another actor of the process, which nothing the manager meets may stop."""
