"""Check a LockManager's health: one ask with a timeout, and four signs read from its stats.

The manager is unhealthy when it is stopped (:class:`actors.ManagerStopped`),
when it does not answer in time (a tick is stuck), when ticks failed since the
last check, or when it tracks jobs but renewed none for longer than
``lock_renew_time`` plus one tick. A lost lock is not one of them: that is the
job's loss, and the manager reported it as it should.

Run it with ``python examples/health_check.py``; it uses ``REDIS_URL`` or
starts a private server.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pykka
import redis

import actors
from actors.embedded import server_url

if TYPE_CHECKING:
    from collections.abc import Callable

#: Lock TTL, in milliseconds: short, so the example ends in seconds.
LOCK_MS = 1500
TIMING = actors.Timing(LOCK_MS)


@dataclass(frozen=True, slots=True)
class Health:
    """A check's verdict, and the counters it read (``None`` when there were none)."""

    healthy: bool
    reason: str
    stats: actors.Stats | None


def check(manager: actors.ManagerRef, previous: Health | None = None) -> Health:
    """Ask ``manager`` for its counters and judge them.

    Args:
        manager: The manager to check.
        previous: The last check, to count the ticks that failed since.

    Returns:
        The verdict.
    """
    # One tick at most may run when we ask; a slower answer means a tick is stuck.
    timeout = TIMING.interval / 1000 + 1.0
    try:
        stats = actors.get_stats(manager, timeout=timeout)
    except actors.ManagerStopped:
        return Health(False, "stopped: no lock is renewed", None)
    except pykka.Timeout:
        return Health(False, f"no answer within {timeout:.1f} s: a tick is stuck", None)
    failed = stats.errors - (previous.stats.errors if previous and previous.stats else 0)
    if failed:
        return Health(False, f"{failed} tick(s) failed since the last check", stats)
    age = stats.last_renewal_age_ms
    # A due lock waits at most lock_renew_time; allow one late tick more.
    if stats.tracked and age is not None and age > TIMING.renew_time + TIMING.interval:
        return Health(False, f"no renewal for {age:.0f} ms", stats)
    return Health(True, "ok", stats)


def _wait(condition: Callable[[], bool], what: str) -> None:
    # Anything a tick does happens within two intervals; allow a full TTL.
    deadline = time.monotonic() + 2 * LOCK_MS / 1000
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen in time")
        time.sleep(0.02)


def main() -> int:
    """Check a manager while it renews, after a lost lock, and once stopped."""
    keys = actors.QueueKeys("checked")
    with server_url() as url:
        client = redis.Redis.from_url(url, socket_timeout=5)
        manager = actors.start_link(connection=url, keys=keys, lock_duration=LOCK_MS)
        try:
            # Step 1: take three jobs' locks and track them; once renewed, all is well.
            for n in range(1, 4):
                token = str(uuid.uuid4())
                client.set(keys.lock(f"job-{n}"), token, nx=True, px=LOCK_MS)
                actors.track_job(manager, f"job-{n}", token)
            _wait(lambda: actors.get_stats(manager).renewed >= 3, "the first renewals")
            renewing = check(manager)

            # Step 2: a job's lock disappears. The manager reports it lost, untracks
            # it, and stays healthy.
            client.delete(keys.lock("job-1"))
            _wait(lambda: actors.get_stats(manager).lost == 1, "the lost lock's report")
            after_loss = check(manager, renewing)
        finally:
            # Step 3: the manager stops: nothing renews the locks now.
            actors.stop(manager)
            client.delete(*(keys.lock(f"job-{n}") for n in range(1, 4)))
            client.close()
        stopped = check(manager, after_loss)
    for label, health in [
        ("renewing", renewing),
        ("after a loss", after_loss),
        ("stopped", stopped),
    ]:
        tracked = health.stats.tracked if health.stats else "-"
        print(f"{label:13} healthy={health.healthy} tracked={tracked} reason={health.reason}")
    return 0 if renewing.healthy and after_loss.healthy and not stopped.healthy else 1


if __name__ == "__main__":
    raise SystemExit(main())
