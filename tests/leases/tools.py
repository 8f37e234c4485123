"""What the lease tests share: their durations, a lease that counts, and two renewers.

The renewers plug into ``start_link(renewer=...)``: :class:`Noting` wraps the
real :class:`~actors.RedisRenewer` and notes when each renewal call started,
so a test can tell which tick found a lost lock; :class:`LockTable` is an
in-memory lock store whose calls can be held at a gate, to keep a tick busy
for exactly as long as a test needs.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from actors import Lease, LockLost, ManagerRef, Timing
from actors.scripts import EXPIRED, STOLEN, BatchOutcome

if TYPE_CHECKING:
    from collections.abc import Sequence

    from actors import RedisRenewer

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
        self._told_lock = threading.Lock()
        self.told: list[Any] = []

    def tell(self, message: Any) -> None:
        with self._told_lock:
            self.told.append(message)
        super().tell(message)

    def losses(self) -> list[LockLost]:
        with self._told_lock:
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


class LockTable:
    """Lock keys in memory: each id's token; a call may be held at :attr:`gate`.

    Args:
        gated: Whether calls wait for :attr:`gate` before renewing.
    """

    def __init__(self, *, gated: bool = False) -> None:
        self.held: dict[str, str] = {}
        self.gate = threading.Event()
        if not gated:
            self.gate.set()
        #: Set when a call has started (and is waiting at the gate, if closed).
        self.entered = threading.Event()

    def __call__(self, job_ids: Sequence[str], tokens: Sequence[str]) -> BatchOutcome:
        self.entered.set()
        self.gate.wait()
        failed = [j for j, t in zip(job_ids, tokens, strict=True) if self.held.get(j) != t]
        return BatchOutcome(failed, [], {j: STOLEN if j in self.held else EXPIRED for j in failed})

    def close(self) -> None:
        self.gate.set()
