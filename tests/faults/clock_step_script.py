"""Stand-alone check: wall-clock steps of an hour delay or skip no renewal.

The wall clock of this process (``time.time``, ``time.time_ns``,
``datetime.datetime.now``/``utcnow``/``today``, ``datetime.date.today``) is
replaced, before the manager, redis-py or pykka is imported, by one that can
jump. While a manager keeps 1,000 real locks of 1,000 ms alive, it jumps an
hour forward, then an hour back, then another hour back. The manager times
its ticks with ``time.monotonic_ns``, so it must not notice: every lock is
alive at the end, and no job waited as long as its lock lasts between two
renewals.

Run it with a server of your own or let it start a private one::

    .venv/bin/python tests/faults/clock_step_script.py [--url redis://127.0.0.1:6379/0]

It prints one JSON line and exits 0 on success, 1 on failure.
"""

from __future__ import annotations

import datetime as _datetime
import time as _time


class SteppedWallClock:
    """The real wall clock plus an offset, in seconds, that a test can step."""

    def __init__(self) -> None:
        self.offset = 0.0
        self._real_time = _time.time
        self._real_time_ns = _time.time_ns

    def time(self) -> float:
        return self._real_time() + self.offset

    def time_ns(self) -> int:
        return self._real_time_ns() + int(self.offset * 1_000_000_000)

    def step(self, seconds: float) -> None:
        self.offset += seconds


WALL = SteppedWallClock()


class _SteppedDateTime(_datetime.datetime):
    # No __dict__: C extensions check that the type keeps datetime's size.
    __slots__ = ()

    @classmethod
    def now(cls, tz: _datetime.tzinfo | None = None) -> _SteppedDateTime:
        return cls.fromtimestamp(WALL.time(), tz)

    @classmethod
    def utcnow(cls) -> _SteppedDateTime:
        naive = cls.fromtimestamp(WALL.time(), _datetime.timezone.utc).replace(tzinfo=None)
        return cls.combine(naive.date(), naive.time())

    @classmethod
    def today(cls) -> _SteppedDateTime:
        return cls.fromtimestamp(WALL.time())


class _SteppedDate(_datetime.date):
    __slots__ = ()

    @classmethod
    def today(cls) -> _SteppedDate:
        return cls.fromtimestamp(WALL.time())


# Patched before anything else is imported, so no module keeps the real ones.
_time.time = WALL.time
_time.time_ns = WALL.time_ns
_datetime.datetime = _SteppedDateTime  # type: ignore[misc]
_datetime.date = _SteppedDate  # type: ignore[misc]

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import TYPE_CHECKING  # noqa: E402

import redis  # noqa: E402

# Run as a script, only this folder is on the path: add the project's root
# for ``tests.support``.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from actors import QueueKeys, Timing, get_stats, lease, start_link, stop, track_job  # noqa: E402
from actors.embedded import EmbeddedServer  # noqa: E402
from tests.support import alive, job_ids, take_locks  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import Sequence

KEYS = QueueKeys("clockstep")
HOUR = 3600.0


class RenewalGaps:
    """The longest time any job waited between two renewals (or tracking and its first)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.last: dict[str, float] = {}
        self.worst_ms = 0.0

    def start(self, job_ids: Sequence[str]) -> None:
        now = _time.monotonic()
        with self._lock:
            self.last.update(dict.fromkeys(job_ids, now))

    def on_renewed(self, job_ids: list[str]) -> None:
        now = _time.monotonic()
        with self._lock:
            for job_id in job_ids:
                self.worst_ms = max(self.worst_ms, (now - self.last[job_id]) * 1000)
                self.last[job_id] = now

    def pending_ms(self) -> float:
        """The longest wait so far, counting jobs not renewed since their last renewal."""
        now = _time.monotonic()
        with self._lock:
            oldest = min(self.last.values())
            return max(self.worst_ms, (now - oldest) * 1000)


def run(url: str, jobs: int, lock_ms: int, seconds: float) -> dict[str, object]:
    """Track ``jobs`` real locks for ``seconds`` while the wall clock steps; return figures."""
    direct = redis.Redis.from_url(url, socket_timeout=10)
    tokens = take_locks(direct, KEYS, job_ids(jobs), lock_ms)

    gaps = RenewalGaps()
    failed: list[str] = []
    manager = start_link(
        connection=url,
        keys=KEYS,
        lock_duration=lock_ms,
        on_locks_renewed=gaps.on_renewed,
        on_lock_renewal_failed=failed.extend,
    )
    gaps.start(list(tokens))
    watched, *plain = tokens
    for job_id in plain:
        track_job(manager, job_id, tokens[job_id])
    # One job held through a lease: its deadline is on the monotonic clock too.
    held_lease = lease(manager, watched, tokens[watched]).__enter__()

    steps = [(seconds / 4, HOUR), (seconds / 2, -HOUR), (3 * seconds / 4, -HOUR)]
    started = _time.monotonic()
    wall_seen: list[float] = []
    for at, step in steps:
        _time.sleep(max(0.0, started + at - _time.monotonic()))
        before = _time.time()
        WALL.step(step)
        wall_seen.append(round(_time.time() - before))
    _time.sleep(max(0.0, started + seconds - _time.monotonic()))

    held = len(alive(direct, KEYS, tokens))
    stats = get_stats(manager, timeout=10)
    worst = gaps.pending_ms()
    lease_lost = held_lease.reason
    held_lease.__exit__(None, None, None)
    stop(manager)
    direct.close()
    return {
        "jobs": jobs,
        "alive": held,
        "lost": stats.lost + len(failed),
        "lease_lost": lease_lost,
        "errors": stats.errors,
        "ticks": stats.ticks,
        "worst_gap_ms": round(worst),
        "lock_duration_ms": lock_ms,
        "renew_time_ms": Timing(lock_ms).renew_time,
        "wall_steps_s": wall_seen,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the check; print the figures as one JSON line; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--url", help="a Redis URL; a private server when omitted")
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--lock-duration", type=int, default=1000, help="milliseconds")
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args(argv)

    server = None
    url = args.url
    if url is None:
        server = EmbeddedServer().start()
        url = server.url
    try:
        figures = run(url, args.jobs, args.lock_duration, args.seconds)
    finally:
        if server is not None:
            server.stop()
    ok = (
        figures["alive"] == args.jobs
        and figures["lost"] == 0
        and figures["lease_lost"] is None
        and float(figures["worst_gap_ms"]) < args.lock_duration  # type: ignore[arg-type]
        and figures["wall_steps_s"] == [HOUR, -HOUR, -HOUR]
    )
    figures["ok"] = ok
    print(json.dumps(figures))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
