"""What the lease tests share: their durations, a lease that counts, and a noting renewer.

:class:`Noting` plugs into ``start_link(renewer=...)``: it wraps the real
:class:`~actors.RedisRenewer` and notes when each renewal call started, so a
test can tell which tick found a lost lock. The in-memory renewer is
:class:`tests.support.LockTable`, named here too for the tests that import it
from this module.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from actors import Lease, LockLost, ManagerRef, Timing
from tests.support import Inbox, LockTable

if TYPE_CHECKING:
    from collections.abc import Sequence

    from actors import RedisRenewer
    from actors.messages import BatchOutcome

__all__ = ["LOCK_MS", "MARGIN_MS", "TIMING", "CountingLease", "LockTable", "Noting"]

#: The lock TTL the tier runs with, in ms: renew window 400 ms, tick 200 ms.
LOCK_MS = 800
TIMING = Timing(LOCK_MS)
#: Slack for a tick that runs late or a thread that wakes late on a busy
#: two-core machine, in ms: one more tick interval.
MARGIN_MS = TIMING.interval


class CountingLease(Lease):
    """A lease that also keeps every message the manager told it, repeats included."""

    def __init__(
        self, manager: ManagerRef, job_id: str, token: str, max_hold: int | None = None
    ) -> None:
        super().__init__(manager, job_id, token, max_hold)
        self._inbox = Inbox()

    def tell(self, message: Any) -> None:
        self._inbox.tell(message)
        super().tell(message)

    @property
    def told(self) -> list[Any]:
        """Every message told so far, in order."""
        return self._inbox.got

    def losses(self) -> list[LockLost]:
        """Every :class:`~actors.LockLost` told so far, in order."""
        return [m for m in self.told if isinstance(m, LockLost)]


class Noting:
    """A renewer that notes each call's start (monotonic seconds) and ids, then renews."""

    def __init__(self, inner: RedisRenewer) -> None:
        self.inner = inner
        self._lock = threading.Lock()
        self.calls: list[tuple[float, list[str]]] = []

    def __call__(self, job_ids: Sequence[str], tokens: Sequence[str]) -> BatchOutcome:
        with self._lock:
            self.calls.append((time.monotonic(), list(job_ids)))
        return self.inner(job_ids, tokens)

    def close(self) -> None:
        self.inner.close()

    def first_call_with(self, job_id: str, after: float) -> float | None:
        """When the first call after ``after`` that carried ``job_id`` started."""
        with self._lock:
            return next((at for at, ids in self.calls if at > after and job_id in ids), None)
