"""The two ways of stamping renewals, and the instruments that watch them.

A manager's timer ticks on a fixed grid. A tick selects the jobs due at a time
``t`` (``ts + threshold < t``) and stamps those it renews with ``t``:

- now: ``t`` is the grid time the timer fired for (``ExtendLocks(scheduled)``),
  and ``track_job`` carries the caller's clock, so neither a late tick nor a
  ``track_job`` held up behind a long tick moves a job's next renewal;
- the baseline, the way before: ``t`` is the manager's clock read when the tick
  runs, and a tracked job is stamped when the manager handles the message.

The baseline is built here from public seams only. :class:`BaselineTimer` tells
a plain ``ExtendLocks()``, which selects and stamps with the clock read when it
runs, on the same grid, armed again once the tick is done (as the old timer
was); and ``track_job(..., ts=AT_HANDLING)`` passes a time later than any clock
reading, which the manager clamps to the moment it handles the message.

:class:`TickLog` records, for either way, each timer tick's grid time, what it
renewed and when it was done, so a run can be cut exactly between ticks.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Literal, TypeVar

import pykka

from actors import ExtendLocks, ThreadTimer
from actors.timing import monotonic_ms
from tests.support import PackedCommands

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    import redis

    from actors import ManagerRef, QueueKeys, Renewer
    from actors.messages import BatchOutcome

T = TypeVar("T")

#: The two ways compared.
Way = Literal["new", "baseline"]
NEW: Way = "new"
BASELINE: Way = "baseline"

#: A ``track_job`` time later than any monotonic clock reading: the manager
#: clamps it to the moment it handles the message (the baseline's stamp).
AT_HANDLING = 2**61


def skip_missed(previous: int, interval: int, now: int) -> int:
    """The old timer's next grid time: the first after ``now``, skipping any it missed.

    (The manager now fires the latest grid time already past at once instead;
    the baseline keeps the old rule, so it is the old way as a whole.)
    """
    deadline = previous + interval
    if deadline <= now:
        deadline += ((now - deadline) // interval + 1) * interval
    return deadline


def now_ms() -> float:
    """The monotonic clock in milliseconds, with a fraction: the caller's clock."""
    return time.monotonic() * 1000


class TickLog:
    """Each timer tick of one manager: its grid time, what it renewed, whether it is done.

    ``fired`` runs on the timer's thread before the tick is sent, ``add`` on
    the manager's thread during the tick, ``finished`` once the tick is done;
    the next tick is fired only after that, so ``add`` always counts for the
    last tick fired.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        #: Grid time of each timer tick, in monotonic ms.
        self.scheduled: list[int] = []
        #: Locks each timer tick renewed.
        self.renewed: list[int] = []
        #: Timer ticks done.
        self.done = 0

    def fired(self, scheduled: int) -> None:
        """Note a timer tick for grid time ``scheduled``, about to be sent."""
        with self._cond:
            self.scheduled.append(scheduled)
            self.renewed.append(0)

    def add(self, renewed: int) -> None:
        """Count ``renewed`` renewals for the tick running (from ``on_locks_renewed``)."""
        with self._cond:
            self.renewed[-1] += renewed

    def finished(self) -> None:
        """Note that the tick running is done."""
        with self._cond:
            self.done += 1
            self._cond.notify_all()

    def last_scheduled(self) -> int:
        """The grid time of the latest timer tick."""
        with self._cond:
            return self.scheduled[-1]

    def wait_done(self, ticks: int, timeout: float) -> None:
        """Wait until ``ticks`` timer ticks are done.

        Raises:
            TimeoutError: Not within ``timeout`` seconds.
        """
        with self._cond:
            if not self._cond.wait_for(lambda: self.done >= ticks, timeout):
                raise TimeoutError(f"{self.done} of {ticks} timer ticks done in {timeout:g} s")

    def between_ticks(self, read: Callable[[], T], timeout: float) -> tuple[int, T]:
        """Run ``read`` while no tick runs; return how many ticks were done, and its result.

        Raises:
            TimeoutError: The tick in flight did not end within ``timeout`` seconds.
        """
        while True:
            with self._cond:
                if not self._cond.wait_for(lambda: self.done == len(self.scheduled), timeout):
                    raise TimeoutError(f"a tick did not end within {timeout:g} s")
                done = self.done
            value = read()
            with self._cond:
                # A tick that fired meanwhile may have run scripts: read again.
                if len(self.scheduled) == done:
                    return done, value


class LoggedTimer:
    """The manager's own timer (a :class:`actors.ThreadTimer`), logging every tick.

    Pass :meth:`attach` as ``start_link(timer=...)``. The timer does not run
    until :meth:`release`: a benchmark can track its jobs first, so that they
    are all due at the same tick.
    """

    def __init__(self, log: TickLog) -> None:
        self._log = log
        self._lock = threading.Lock()
        self._timer: ThreadTimer | None = None
        self._pending: int | None = None
        self._released = False
        self._arms = 0

    def attach(self, fire: Callable[[int], None], name: str) -> LoggedTimer:
        """The timer factory: build the thread timer that fires the manager's ticks."""

        def fire_logged(scheduled: int) -> None:
            self._log.fired(scheduled)
            fire(scheduled)

        self._timer = ThreadTimer(fire_logged, name)
        return self

    def arm(self, deadline_ms: int) -> None:
        """Arm the thread timer; every arm after the first ends a tick."""
        with self._lock:
            if self._arms:
                self._log.finished()
            self._arms += 1
            if not self._released:
                self._pending = deadline_ms
                return
        assert self._timer is not None
        self._timer.arm(deadline_ms)

    def release(self, manager: ManagerRef) -> None:
        """Let the timer run (a first deadline already past fires at once, late)."""
        with self._lock:
            self._released = True
            pending, self._pending = self._pending, None
        if pending is not None:
            assert self._timer is not None
            self._timer.arm(pending)

    def close(self) -> None:
        """Stop the thread timer."""
        if self._timer is not None:
            self._timer.close()


class BaselineTimer:
    """The old timer: a plain ``ExtendLocks()`` on the grid, re-armed after each tick.

    The manager arms it once, when it starts (later ticks are not on its grid,
    so it never arms it again). From :meth:`release` on, it tells the manager a
    plain ``ExtendLocks()`` at each grid time and waits for the tick, then takes
    the next grid time after the clock (:func:`skip_missed`), as the old
    manager did at the end of each tick.

    Args:
        log: Where the ticks are logged.
        interval_ms: The manager's timer interval.
    """

    def __init__(self, log: TickLog, interval_ms: int) -> None:
        self._log = log
        self._interval = interval_ms
        self._cond = threading.Condition()
        self._deadline: int | None = None
        self._manager: ManagerRef | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="bench-baseline-timer", daemon=True)
        self._thread.start()

    def attach(self, fire: Callable[[int], None], name: str) -> BaselineTimer:
        """The timer factory; ``fire`` (a grid-stamped tick) is not used."""
        return self

    def arm(self, deadline_ms: int) -> None:
        """Take ``deadline_ms`` as the first grid time."""
        with self._cond:
            self._deadline = deadline_ms
            self._cond.notify()

    def release(self, manager: ManagerRef) -> None:
        """Start ticking ``manager`` (a first deadline already past fires at once)."""
        with self._cond:
            self._manager = manager
            self._cond.notify()

    def close(self) -> None:
        """Stop ticking."""
        # No join: the manager closes its timer on its own thread, and this
        # thread may be waiting for that very thread to answer a tick.
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _next(self) -> tuple[int, ManagerRef] | None:
        with self._cond:
            while not self._closed:
                deadline, manager = self._deadline, self._manager
                if deadline is None or manager is None:
                    self._cond.wait()
                    continue
                remaining = deadline - monotonic_ms()
                if remaining > 0:
                    self._cond.wait(remaining / 1000)
                    continue
                return deadline, manager
            return None

    def _run(self) -> None:
        while (due := self._next()) is not None:
            deadline, manager = due
            self._log.fired(deadline)
            try:
                manager.ask(ExtendLocks())
            except pykka.ActorDeadError:  # the manager stopped: nothing left to tick
                return
            self._log.finished()
            with self._cond:
                self._deadline = skip_missed(deadline, self._interval, monotonic_ms())


def make_timer(way: Way, log: TickLog, interval_ms: int) -> LoggedTimer | BaselineTimer:
    """The timer of ``way``, logging to ``log``; start it with :meth:`release`."""
    return LoggedTimer(log) if way == NEW else BaselineTimer(log, interval_ms)


def track_ts(way: Way) -> int | None:
    """The ``ts`` a worker passes to ``track_job`` in ``way``."""
    return None if way == NEW else AT_HANDLING


class WatchedRenewer:
    """A renewer that notes when a tick hands it a batch, then renews as the manager would.

    It picks out one big batch to measure against: the first one after
    ``warmup`` others whose tick started within ``on_time_ms`` of its grid
    time, so that the measured tick is an ordinary one on the grid, not a
    tick catching up.

    Args:
        inner: The renewer that renews (an :class:`actors.RedisRenewer`).
        log: The manager's tick log (for the grid time of the current tick).
        big: Batches of at least this many jobs count as big.
        watched: The id whose first batch is noted.
        warmup: Big batches never picked.
        on_time_ms: Most time from the grid time to the batch of the one picked.
    """

    def __init__(
        self,
        inner: Renewer,
        log: TickLog,
        *,
        big: int,
        watched: str,
        warmup: int,
        on_time_ms: float,
    ) -> None:
        self._inner = inner
        self._log = log
        self._big = big
        self._watched = watched
        self._warmup = warmup
        self._on_time_ms = on_time_ms
        #: Big batches handed over so far.
        self.big_batches = 0
        #: Set when the big batch picked is handed over.
        self.picked = threading.Event()
        #: When the picked batch was handed over (caller's ms), and its tick's grid time.
        self.picked_at = (0.0, 0)
        #: When the watched job's first batch was handed over (caller's ms),
        #: that tick's grid time, and the batch's size.
        self.watched_batch: tuple[float, int, int] | None = None

    def __call__(self, job_ids: Sequence[str], tokens: Sequence[str]) -> BatchOutcome:
        at = now_ms()
        scheduled = self._log.last_scheduled()
        if self.watched_batch is None and self._watched in job_ids:
            self.watched_batch = (at, scheduled, len(job_ids))
        if len(job_ids) >= self._big:
            self.big_batches += 1
            if (
                not self.picked.is_set()
                and self.big_batches > self._warmup
                and at - scheduled <= self._on_time_ms
            ):
                self.picked_at = (at, scheduled)
                self.picked.set()
        return self._inner(job_ids, tokens)

    def close(self) -> None:
        """Close the inner renewer."""
        self._inner.close()


class Locks:
    """Locks on the server for a fixed set of jobs, set again in one round trip.

    Args:
        keys: The queue's keys.
        ids: The jobs.
        tokens: Their tokens.
        ttl_ms: The TTL each reset gives.
    """

    def __init__(self, keys: QueueKeys, ids: Sequence[str], tokens: Sequence[str], ttl_ms: int):
        self._packed = PackedCommands(
            [
                ("SET", keys.lock(job_id), token, "PX", ttl_ms)
                for job_id, token in zip(ids, tokens, strict=True)
            ]
        )

    def reset(self, admin: redis.Redis) -> None:
        """Set every lock again, in one round trip."""
        self._packed.send(admin)


def script_usec(admin: redis.Redis) -> int:
    """Microseconds the server has spent in script calls (EVALSHA and EVAL) so far."""
    stats = admin.info("commandstats")
    return sum(
        int(stats.get(name, {}).get("usec", 0)) for name in ("cmdstat_evalsha", "cmdstat_eval")
    )


@contextmanager
def cpu_bound_threads(count: int) -> Iterator[list[int]]:
    """Run ``count`` threads of pure-Python arithmetic (they hold the GIL) for the block.

    Yields:
        Each thread's count of finished thousand-step loops, updated as they run.
    """
    stop = threading.Event()
    loops = [0] * count

    def spin(slot: int) -> None:
        total = 0
        while not stop.is_set():
            for step in range(1000):
                total += step
            loops[slot] += 1

    threads = [
        threading.Thread(target=spin, args=(slot,), name=f"bench-busy-{slot}", daemon=True)
        for slot in range(count)
    ]
    for thread in threads:
        thread.start()
    try:
        yield loops
    finally:
        stop.set()
        for thread in threads:
            thread.join()
