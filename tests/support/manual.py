"""Driving a manager by hand: its clock, its timer and its ticks, all the test's.

A manager started with ``clock=ManualClock()`` and ``timer=manual_timer()``
does nothing on its own: time moves when the test moves it, and a tick runs
when the test asks for one, so every tick has finished when the test looks.

Example:
    >>> clock, timers = ManualClock(), manual_timer()
    >>> manager = start_link(connection=url, keys=KEYS, clock=clock, timer=timers)
    >>> track_job(manager, "j1", token)
    >>> clock.advance(Timing().threshold + 1)
    >>> tick(manager)                                    # "renew now", at the clock's time
    >>> clock.now = timers.deadline
    >>> tick(manager, scheduled=timers.deadline)         # the timer's tick, on its grid
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, TypeVar

from actors import ExtendLocks, ManualTimer, get_active_job_count

if TYPE_CHECKING:
    from collections.abc import Callable

    from actors import ManagerRef

__all__ = [
    "ManualClock",
    "ManualTimers",
    "delivered",
    "manual_timer",
    "settle",
    "tick",
    "unchecked",
]

M = TypeVar("M")

#: Seconds a tick or a query may take before the test fails: far above any
#: healthy tick, so only a hang trips it.
ASK_TIMEOUT = 30.0


class ManualClock:
    """A monotonic clock in milliseconds that moves only when the test moves it.

    Pass it as ``start_link(clock=...)``. It starts far from zero, as the
    monotonic clock does, so no stamp is ever negative.

    Args:
        now: The starting time, in milliseconds.
    """

    def __init__(self, now: int = 1_000_000) -> None:
        #: The time, in milliseconds; set it or :meth:`advance` it.
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> int:
        """Move the clock ``ms`` milliseconds on; return the new time."""
        self.now += ms
        return self.now


class ManualTimers:
    """A timer factory for ``start_link(timer=...)`` that builds timers which never fire.

    Each manager started with it gets an :class:`actors.ManualTimer`, kept
    here in order, so the test can read the deadline a manager armed.
    """

    def __init__(self) -> None:
        #: Every timer built, in order (one per manager started with this factory).
        self.built: list[ManualTimer] = []

    def __call__(self, fire: Callable[[int], None], name: str) -> ManualTimer:
        timer = ManualTimer(fire, name)
        self.built.append(timer)
        return timer

    @property
    def timer(self) -> ManualTimer:
        """The last timer built.

        Raises:
            AssertionError: No manager was started with this factory yet.
        """
        assert self.built, "no manager was started with this timer factory"
        return self.built[-1]

    @property
    def deadline(self) -> int:
        """The pending deadline of the last timer built, in the manager's milliseconds.

        Raises:
            AssertionError: No timer was built, or it has no pending deadline.
        """
        deadline = self.timer.deadline
        assert deadline is not None, "the timer is not armed"
        return deadline


def manual_timer() -> ManualTimers:
    """Return a fresh :class:`ManualTimers` for ``start_link(timer=...)``."""
    return ManualTimers()


def tick(
    manager: ManagerRef, *, scheduled: int | None = None, timeout: float = ASK_TIMEOUT
) -> None:
    """Run one tick of ``manager`` and return once it has finished.

    Finished: its renewal has landed and its report was delivered (the
    callbacks ran, the targets were told), and so was every report before it,
    and every record the manager logged so far was written.

    Args:
        manager: The manager.
        scheduled: The grid time of a timer tick (``timers.deadline``); ``None``
            for a "renew now", which selects with the manager's clock.
        timeout: The most seconds to wait for the tick.
    """
    manager.ask(ExtendLocks(scheduled), timeout=timeout)
    assert manager._manager.flush(timeout), "a target or a log handler is held up"


def settle(manager: ManagerRef, *, timeout: float = ASK_TIMEOUT) -> None:
    """Return once ``manager`` has handled every message sent to it so far.

    ``track_job`` returns before the manager has tracked the job; a query
    waits behind it in the same mailbox. What those messages decided may
    still be on its way to the callbacks and targets: see :func:`delivered`.
    """
    get_active_job_count(manager, timeout=timeout)


def delivered(manager: ManagerRef, *, timeout: float = ASK_TIMEOUT) -> None:
    """Return once every report ``manager`` decided so far was delivered.

    Callbacks and ``notify`` targets run on the manager's delivery and teller
    threads, after the step that decided them: :func:`settle` returns before
    they may have run. An asked tick is answered only once its own report was
    delivered, and so every report before it: this is :func:`tick`, a "renew
    now" (which renews what is due, if anything), used for what it waits for.
    """
    tick(manager, timeout=timeout)


def unchecked(kind: type[M], **fields: Any) -> M:
    """Build a message without the checks its constructor runs.

    For tests of what a manager does with a malformed message that reaches
    it anyway (sent through plain pykka, or built by code that bypassed the
    constructor): every real door refuses to build one.

    Args:
        kind: A message class of :mod:`actors.messages` (a dataclass).
        **fields: Every field's value, checked or not.
    """
    message = object.__new__(kind)
    for field in dataclasses.fields(kind):  # type: ignore[arg-type]
        object.__setattr__(message, field.name, fields.get(field.name, field.default))
    return message
