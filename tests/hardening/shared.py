"""What the hardening tests share: short locks, a manager on them, a bystander, a check.

Locks are short (``TTL`` ms, so the renew window is ``TTL // 2`` and the
interval ``TTL // 4``) so that a renewal that stops shows within a second;
every wait is a multiple of those durations or a polling deadline.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pykka

from actors import start_link
from tests.support import wait_ticks, watch_locks

if TYPE_CHECKING:
    import redis

    from actors import ManagerRef, QueueKeys

TTL = 400  # ms: renew window 200 ms, interval and threshold 100 ms
INTERVAL_S = TTL / 4 / 1000
#: Long enough for a lock nobody renews to expire, with a margin.
WATCH_S = 3 * TTL / 1000


def start_manager(client: redis.Redis, keys: QueueKeys, **options: Any) -> ManagerRef:
    """A manager of ``keys`` on ``client``, its locks ``TTL`` ms unless told otherwise."""
    options.setdefault("lock_duration", TTL)
    return start_link(connection=client, keys=keys, **options)


def assert_still_renewing(
    manager: ManagerRef, client: redis.Redis, keys: QueueKeys, tokens: dict[str, str]
) -> None:
    """Assert the manager keeps ``tokens``' locks alive for a few TTLs and keeps ticking."""
    seen = watch_locks(client, keys, tokens, seconds=WATCH_S, every=0.02)
    assert seen.missing == set(), f"locks expired while tracked: {sorted(seen.missing)}"
    wait_ticks(manager, 2, timeout=20 * INTERVAL_S)


class Bystander(pykka.ThreadingActor):
    """Another actor of the process, which nothing the manager meets may stop."""
