"""A manager's one timer, the seam a test or a host drives it through, and what it is armed for.

A manager holds exactly one :class:`Timer`. The :class:`Alarm` arms it for
the next grid tick, a retry after a failed tick, or a watched lock's deadline.
The timer then tells the manager ``ExtendLocks(scheduled)``, which handles it
and arms the timer again; a "renew now" sent by a user leaves the grid alone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, Literal, Protocol

import pykka

from actors.telemetry import Log
from actors.timing import monotonic_ms, next_tick

if TYPE_CHECKING:
    from actors.telemetry import RecordThread

__all__ = ["Alarm", "Fire", "ManualTimer", "ThreadTimer", "Timer", "TimerFactory"]

logger = Log(__name__)


class Timer(Protocol):
    """One pending fire at a time, on the manager's clock."""

    def arm(self, deadline_ms: int) -> None:
        """Fire once at ``deadline_ms``; replaces the pending fire, if any."""
        ...

    def close(self) -> None:
        """Disarm for good; nothing fires after this returns."""
        ...


#: Builds a manager's timer from the function to call when it fires (with the
#: time it was armed for) and a name for its thread.
TimerFactory = Callable[[Callable[[int], None], str], Timer]

#: Seconds the timer waits before reading a clock that raised again.
CLOCK_RETRY_S: Final = 0.01


class ThreadTimer:
    """A timer on one thread of its own, kept for the manager's whole life, however many jobs.

    Args:
        fire: Called with the time armed for, on the timer's thread, when it comes.
        name: The thread's name.
        clock: The clock times are on, in milliseconds; it must advance with
            real time (the default is the monotonic clock).
        records: Where the timer thread's log lines are written (a
            manager's record thread); by default, on the timer thread.
    """

    def __init__(
        self,
        fire: Callable[[int], None],
        name: str,
        clock: Callable[[], int] = monotonic_ms,
        *,
        records: RecordThread | None = None,
    ) -> None:
        self._fire = fire
        self._clock = clock
        self._cond = threading.Condition()
        self._deadline: int | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        if records is not None:
            records.attach(self._thread)
        self._thread.start()

    def arm(self, deadline_ms: int) -> None:
        """Fire once at ``deadline_ms``; replaces the pending fire, if any."""
        with self._cond:
            self._deadline = deadline_ms
            self._cond.notify()

    def close(self) -> None:
        """Disarm and end the thread; nothing fires after this returns."""
        with self._cond:
            self._closed = True
            self._deadline = None
            self._cond.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                deadline = self._deadline
                if deadline is None:
                    self._cond.wait()
                    continue
                try:
                    remaining = deadline - self._clock()
                except Exception:
                    # A user clock is a user callback: ask it again shortly.
                    logger.exception("%s: the clock raised", self._thread.name)
                    self._cond.wait(CLOCK_RETRY_S)
                    continue
                if remaining > 0:
                    self._cond.wait(remaining / 1000)
                    continue
                self._deadline = None
                try:
                    self._fire(deadline)
                except pykka.ActorDeadError:
                    return  # the manager is gone: nothing left to tick
                except Exception:
                    # A fault of one fire: the manager is alive, keep the timer.
                    logger.exception("%s: a timer fire failed", self._thread.name)


class ManualTimer:
    """A timer that never fires by itself: the caller decides when ticks happen.

    For tests and for hosts with a scheduler of their own. Read
    :attr:`deadline` and send ``ExtendLocks(scheduled=timer.deadline)`` (with
    ``ask``, to wait for the tick) when that time has come on the clock the
    manager was given. ``fire`` and ``name`` are ignored (they fit :data:`TimerFactory`).
    """

    def __init__(self, fire: Callable[[int], None] | None = None, name: str = "") -> None:
        #: The pending time to fire at, or ``None``.
        self.deadline: int | None = None
        #: How many times the manager armed it.
        self.armed = 0
        #: Whether the manager closed it.
        self.closed = False

    def arm(self, deadline_ms: int) -> None:
        """Record ``deadline_ms`` as the pending time."""
        self.deadline = deadline_ms
        self.armed += 1

    def close(self) -> None:
        """Forget the pending time."""
        self.deadline = None
        self.closed = True


#: What a fire of the timer is for: the grid's tick, a retry after a failed
#: tick, a watched lock's deadline; ``"now"`` for a "renew now" anyone sent.
Fire = Literal["grid", "retry", "deadline", "now"]


class Alarm:
    """The timer, the next grid tick, the retry, and which fires are the timer's own.

    Used on the manager's thread only; times are monotonic milliseconds.
    """

    __slots__ = ("armed", "clock", "grid", "interval", "name", "pending", "retry", "timer")

    def __init__(self, name: str, clock: Callable[[], int], interval: int) -> None:
        self.name = name
        self.clock = clock
        self.interval = interval
        #: The timer, once the manager has started (``None`` once it stops).
        self.timer: Timer | None = None
        #: The time of the next grid tick, in monotonic ms (``None``: no grid).
        self.grid: int | None = None
        #: When to try again after a failed tick, or ``None``.
        self.retry: int | None = None
        #: What the timer is armed for now.
        self.armed: int | None = None
        #: The times the timer was armed for and whose fire is not handled yet,
        #: each with the time it was armed at (a fire is late from the later of the two).
        self.pending: dict[int, int] = {}

    def start(self, timer: Timer, *, grid: bool = True) -> None:
        """Take the timer; with ``grid``, arm it for the first tick, one interval from now."""
        self.timer = timer
        if grid:
            self.grid = self.clock() + self.interval
            self.arm(None)

    def now(self, fallback: int) -> int:
        """Read the clock; ``fallback`` (an earlier reading) if it raises."""
        try:
            return self.clock()
        except BaseException:
            logger.warning(
                "LockManager for queue %r: the clock raised",
                self.name,
                exc_info=True,
                extra={"queue": self.name},
            )
            return fallback

    def take(self, scheduled: int | None) -> tuple[Fire, int, int, int] | None:
        """Say what a tick is for, the time now, the time it stamps at, and how late it runs.

        Only the timer's own fire (armed and not handled yet) is a grid tick, a
        retry or a deadline; any other is a plain "renew now" and moves nothing.
        A grid tick selects and stamps at its grid time, so lateness never makes
        a job due early and no lock looks younger than it is.

        Returns:
            ``None`` when the clock raised (logged) and the tick is not the
            timer's own fire, whose time stands in otherwise. The lateness (ms)
            counts from its time, or from its arming if later; 0 for anyone else's.
        """
        own = scheduled is not None and scheduled in self.pending
        try:
            now = self.clock()
        except BaseException:
            # The clock is the user's code: its failure must not end the ticks.
            # The timer's own fire comes once due, so its time stands in.
            logger.warning(
                "LockManager for queue %r: the clock raised; ticking on",
                self.name,
                exc_info=True,
                extra={"queue": self.name},
            )
            if not own:
                return None
            assert scheduled is not None
            now = scheduled
        if not own or scheduled is None or scheduled > now:
            return "now", now, now, 0
        late = max(0, now - max(scheduled, self.pending.pop(scheduled)))
        if scheduled == self.grid:
            if scheduled == self.retry:
                self.retry = None  # the grid's tick does the retry's work
            return "grid", now, scheduled, late
        if scheduled == self.retry:
            self.retry = None
            return "retry", now, now, late
        return "deadline", now, now, late

    def advance(self, at: int, now: int) -> None:
        """After the grid tick of ``at``: the next grid time (a missed one fires at once)."""
        if self.grid is not None:
            self.grid = next_tick(at, self.interval, self.now(now))

    def retry_at(self, when: int | None) -> None:
        """Try again at ``when`` (after a failed tick), or not at all."""
        self.retry = when

    def arm(self, earliest: int | None) -> None:
        """Arm for the first of the grid tick, the retry and ``earliest`` (a watched deadline)."""
        if self.timer is None:
            return
        times = [t for t in (self.grid, self.retry, earliest) if t is not None]
        if not times:
            return
        at = min(times)
        if at != self.armed or at not in self.pending:
            if len(self.pending) > 64:
                # Times replaced before they fired: never handled, never needed.
                self.pending = {t: when for t, when in self.pending.items() if t >= at}
            self.pending[at] = self.now(at)
            self.armed = at
            self.timer.arm(at)

    def sooner(self, earliest: int | None) -> None:
        """Arm for ``earliest`` if the timer is armed for later (a new watched lock)."""
        if earliest is not None and (self.armed is None or earliest < self.armed):
            self.arm(earliest)

    def close(self) -> Timer | None:
        """Stop using the timer; return it, for the manager to close."""
        timer, self.timer = self.timer, None
        return timer
