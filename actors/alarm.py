"""A manager's one timer: armed for the next grid tick, or for a watched lock's deadline before it.

The grid keeps ticks on ``first + k * interval`` whatever their lateness
(see :func:`actors.schedule.next_deadline`). A watched lock (a lease's, a
``notify`` target's) whose deadline comes before the next grid tick has the
timer fire at that deadline instead, so its watchers are told
``"unconfirmed"`` at once, not at the next tick. Used on the manager's
thread only.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from actors.schedule import next_deadline

if TYPE_CHECKING:
    from collections.abc import Callable

    from actors.timer import Timer
    from actors.validity import Deadlines

__all__ = ["Alarm"]

logger = logging.getLogger("actors.lock_manager")


class Alarm:
    """The timer, the grid time of the next tick, and the deadlines the timer fires for."""

    __slots__ = ("armed", "clock", "deadlines", "interval", "name", "next_tick", "timer")

    def __init__(self, name: str, clock: Callable[[], int], interval: int) -> None:
        #: The queue's name, for the log.
        self.name = name
        #: The manager's monotonic clock, in milliseconds.
        self.clock = clock
        #: The grid's step, in milliseconds.
        self.interval = interval
        #: The timer, once the manager has started (``None`` once it stops).
        self.timer: Timer | None = None
        #: The grid time of the next tick, in monotonic ms.
        self.next_tick: int | None = None
        #: What the timer is armed for: the next grid tick or an earlier deadline.
        self.armed: int | None = None
        #: The deadlines the timer was armed for, not yet handled.
        self.deadlines: set[int] = set()

    def start(self, timer: Timer) -> None:
        """Take the timer, and arm it for the first grid tick, one interval from now."""
        self.timer = timer
        self.next_tick = self.armed = first = self.clock() + self.interval
        timer.arm(first)

    def now(self, fallback: int) -> int:
        """Read the clock; ``fallback`` (an earlier reading) if it raises."""
        try:
            return self.clock()
        except BaseException:
            logger.warning("LockManager for queue %r: the clock raised", self.name, exc_info=True)
            return fallback

    def times(self, scheduled: int | None) -> tuple[int, int, bool] | None:
        """Return a tick's time, the time it selects and stamps at, and whether it is on the grid.

        Only the timer's own fire, once its time has come, is a grid tick:
        one sent early (or forged) is a plain "renew now" and moves nothing.
        A grid tick selects and stamps at its grid time, not when it got to
        run: lateness then never makes a job due a tick early, and the grid
        time is never after the renewal, so no lock looks younger.

        Args:
            scheduled: The grid time the timer fired for, or ``None``.

        Returns:
            ``None`` when the clock raised (logged) and the tick is not the
            timer's own fire, whose grid time stands in otherwise.
        """
        try:
            now = self.clock()
        except BaseException:
            # The clock is the user's code: its failure must not end the
            # ticks. The timer's own fire comes once its time has come, so its
            # grid time stands in for a reading (never later than the truth).
            logger.warning(
                "LockManager for queue %r: the clock raised; ticking on", self.name, exc_info=True
            )
            if scheduled is None or scheduled != self.next_tick:
                return None
            now = scheduled
        if scheduled is not None and scheduled == self.next_tick and scheduled <= now:
            return now, scheduled, True
        return now, now, False

    def at_deadline(self, scheduled: int) -> bool:
        """Whether the timer fired at ``scheduled`` for a deadline (taken off the list if so)."""
        if scheduled in self.deadlines and scheduled != self.next_tick:
            self.deadlines.discard(scheduled)
            return True
        return False

    def advance(self, at: int, now: int, deadlines: Deadlines) -> None:
        """After the grid tick of ``at``: arm for the next grid time (or an earlier deadline).

        Args:
            at: The grid time of the tick that ran.
            now: A reading of the clock before, should it raise now.
            deadlines: The watched locks' deadlines.
        """
        if self.timer is None:
            return
        self.next_tick = next_deadline(at, self.interval, self.now(now))
        self.rearm(deadlines)

    def rearm(self, deadlines: Deadlines) -> None:
        """Arm again after a fire, for the next grid tick or the earliest deadline before it."""
        self.armed = None
        self.arm(deadlines)

    def sooner(self, deadlines: Deadlines) -> None:
        """Arm for the earliest deadline if the timer is armed for later (a new watched lock)."""
        earliest = deadlines.earliest
        if earliest is not None and (self.armed is None or earliest < self.armed):
            self.arm(deadlines)

    def arm(self, deadlines: Deadlines) -> None:
        """Arm for the next grid tick, or for the earliest watched deadline if it comes first."""
        if self.timer is None or self.next_tick is None:
            return
        at = self.next_tick
        earliest = deadlines.earliest if deadlines.valid else None
        if earliest is not None and earliest < at:
            at = earliest
            if len(self.deadlines) > 64:
                # Deadlines replaced before they fired: never handled, never needed.
                self.deadlines = {d for d in self.deadlines if d >= at}
            self.deadlines.add(at)
        if at != self.armed:
            self.armed = at
            self.timer.arm(at)

    def close(self) -> Timer | None:
        """Stop using the timer; return it, for the manager to close."""
        timer, self.timer = self.timer, None
        return timer
