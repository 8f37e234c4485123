"""A supervisor that checks its LockManager's health with ``ask``.

The supervisor owns the manager and answers :class:`CheckHealth` by asking it
three questions, each with a timeout: how many jobs it tracks, which ones, and
its counters. The manager is unhealthy when it is stopped, when it does not
answer in time (a tick is stuck), when its ticks fail, or when it tracks jobs
but has renewed nothing for longer than ``lock_renew_time`` plus one tick.

A lost lock is not a sign of an unhealthy manager: it is the job that lost
its lock, and the manager reported it as it should.

Run it with ``python examples/health_check.py``; it uses ``REDIS_URL`` or
starts a private server.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pykka
import redis

import actors
from actors import LockManager, QueueKeys, Stats, Timing
from actors.embedded import server_url

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["CheckHealth", "GetManager", "Health", "HealthSupervisor", "Result", "main", "run"]


@dataclass(frozen=True, slots=True)
class Health:
    """The answer to :class:`CheckHealth`."""

    healthy: bool
    #: Why, for people.
    reason: str
    #: Jobs tracked (``-1`` when the manager did not answer).
    active: int
    #: Ids tracked.
    tracked: list[str]
    #: The manager's counters, or ``None`` when it did not answer.
    stats: Stats | None


@dataclass(frozen=True, slots=True)
class CheckHealth:
    """Ask the supervisor for a :class:`Health`."""


@dataclass(frozen=True, slots=True)
class GetManager:
    """Ask the supervisor for its manager's ``ActorRef``."""


class HealthSupervisor(pykka.ThreadingActor):
    """Starts a manager and checks its health on request.

    Args:
        url: The server's URL.
        keys: The queue's keys.
        lock_duration: Lock TTL, in milliseconds.
    """

    use_daemon_thread = True

    def __init__(self, *, url: str, keys: QueueKeys, lock_duration: int) -> None:
        super().__init__()
        self._timing = Timing(lock_duration)
        self._manager = actors.start_link(connection=url, keys=keys, lock_duration=lock_duration)
        self._errors_seen = 0

    def on_stop(self) -> None:
        """Stop the manager with the supervisor."""
        actors.stop(self._manager)

    def on_receive(self, message: Any) -> Any:
        """Answer the supervisor's questions."""
        if isinstance(message, CheckHealth):
            return self._check()
        if isinstance(message, GetManager):
            return self._manager
        return None

    def _check(self) -> Health:
        # One tick at most may be in progress when we ask; an answer slower
        # than that means a tick is stuck. Asking from an actor is safe here
        # because the manager never asks anyone back.
        timeout = self._timing.interval / 1000 + 1.0
        try:
            active = actors.get_active_job_count(self._manager, timeout=timeout)
            tracked = actors.get_tracked_job_ids(self._manager, timeout=timeout)
            stats = actors.get_stats(self._manager, timeout=timeout)
        except pykka.ActorDeadError:
            return Health(False, "manager stopped: no lock is renewed", -1, [], None)
        except pykka.Timeout:
            return Health(False, f"no answer within {timeout:.1f} s: a tick is stuck", -1, [], None)

        failed_ticks = stats.errors - self._errors_seen
        self._errors_seen = stats.errors
        if failed_ticks:
            return Health(
                False, f"{failed_ticks} tick(s) failed since the last check", active, tracked, stats
            )
        age = stats.last_renewal_age_ms
        # A due lock waits at most lock_renew_time; allow one late tick more.
        limit = self._timing.renew_time + self._timing.interval
        if active and age is not None and age > limit:
            return Health(False, f"no renewal for {age:.0f} ms", active, tracked, stats)
        return Health(True, "ok", active, tracked, stats)


@dataclass(frozen=True)
class Result:
    """The three checks of a run: all well, after a lost lock, manager stopped."""

    healthy: Health
    after_lost_lock: Health
    after_stop: Health


def _wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout_s:.1f} s")
        time.sleep(0.05)


def run(url: str, *, lock_duration: int = 2000, jobs: int = 3) -> Result:
    """Check a manager's health in three situations.

    Args:
        url: The server's URL.
        lock_duration: Lock TTL, in milliseconds.
        jobs: Jobs to track.

    Returns:
        The three checks.

    Raises:
        TimeoutError: A renewal or a lost-lock report did not come in time.
    """
    keys = QueueKeys("checked")
    client = redis.Redis.from_url(url, socket_timeout=10)
    # Step 1: the supervisor starts the manager.
    supervisor = HealthSupervisor.start(url=url, keys=keys, lock_duration=lock_duration)
    try:
        manager: pykka.ActorRef[LockManager] = supervisor.ask(GetManager(), block=True)

        # Step 2: take some jobs and track them.
        for n in range(1, jobs + 1):
            token = str(uuid.uuid4())
            client.set(keys.lock(f"job-{n}"), token, nx=True, px=lock_duration)
            actors.track_job(manager, f"job-{n}", token)

        # Step 3: once every job was renewed, the manager is healthy.
        _wait_for(
            lambda: actors.get_stats(manager).renewed >= jobs, 3 * lock_duration / 1000, "renewal"
        )
        healthy: Health = supervisor.ask(CheckHealth(), block=True)

        # Step 4: a job's lock disappears. The manager reports it lost and
        # untracks it, and stays healthy.
        client.delete(keys.lock("job-1"))
        _wait_for(
            lambda: actors.get_stats(manager).lost == 1, 3 * lock_duration / 1000, "lost lock"
        )
        after_lost: Health = supervisor.ask(CheckHealth(), block=True)

        # Step 5: the manager stops (as a crash would): no lock is renewed now.
        actors.stop(manager)
        after_stop: Health = supervisor.ask(CheckHealth(), block=True)
    finally:
        supervisor.stop()
        client.close()
    return Result(healthy, after_lost, after_stop)


def main() -> int:
    """Run on ``REDIS_URL`` or a private server and print the three checks."""
    with server_url() as url:
        result = run(url)
    for label, health in vars(result).items():
        print(f"{label:16} healthy={health.healthy} active={health.active} reason={health.reason}")
    ok = result.healthy.healthy and result.after_lost_lock.healthy and not result.after_stop.healthy
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
