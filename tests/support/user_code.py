"""A manager renewing through an in-memory lock table, ticked by hand: for tests of user code.

Callbacks, targets and log handlers that block, raise or ask back; no Redis.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from actors import ExtendLocks, QueueKeys, start_link
from tests.support.fakes import LockTable
from tests.support.manual import ManualClock, manual_timer

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from actors import ManagerRef

__all__ = ["ASK_S", "DUE_MS", "LOCK", "Blocks", "Manual", "handler"]

LOCK = 1000
#: 251 ms on makes every lock due (the threshold is 250 ms).
DUE_MS = 251
#: How long an ask may wait before it counts as held up.
ASK_S = 3.0


@dataclass
class Manual:
    """Managers renewing through an in-memory lock table, ticked by hand."""

    table: LockTable
    clock: ManualClock
    managers: list[ManagerRef] = field(default_factory=list)
    #: Set when the test ends: whatever user code blocks on them goes on.
    releases: list[threading.Event] = field(default_factory=list)

    def start(self, name: str = "user-code", **options: Any) -> ManagerRef:
        manager = start_link(
            renewer=self.table,
            keys=QueueKeys(name),
            lock_duration=LOCK,
            clock=self.clock,
            timer=manual_timer(),
            **options,
        )
        self.managers.append(manager)
        return manager

    def tick(self, manager: ManagerRef, timeout: float = ASK_S) -> None:
        """Make every lock due and ask for a tick: returns once its report is delivered."""
        self.clock.advance(DUE_MS)
        manager.ask(ExtendLocks(), timeout=timeout)

    def release(self) -> threading.Event:
        event = threading.Event()
        self.releases.append(event)
        return event


@contextlib.contextmanager
def handler(emit: Callable[[logging.LogRecord], object], level: int) -> Iterator[None]:
    """``emit`` as a logging handler of the ``actors`` loggers for the block."""

    class Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            emit(record)

    installed = Handler(level)
    logger = logging.getLogger("actors")
    old = logger.level
    logger.setLevel(min(level, old or logging.WARNING))
    logger.addHandler(installed)
    try:
        yield
    finally:
        logger.removeHandler(installed)
        logger.setLevel(old)


class Blocks:
    """A target whose ``tell`` blocks until the test ends (against the rule)."""

    def __init__(self, release: threading.Event) -> None:
        self.release = release
        self.entered = threading.Event()

    def tell(self, _message: Any) -> None:
        self.entered.set()
        self.release.wait(30)
