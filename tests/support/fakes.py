"""Fakes that plug into a manager through its public seams: no Redis involved.

- :class:`LockTable`: the server's lock keys in memory, as ``start_link(renewer=...)``;
- :class:`Inbox`: a ``notify`` target (a job actor, say) that keeps what it is told;
- :class:`FlakyClock`: a :class:`~tests.support.manual.ManualClock` whose next reading may raise.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from redis.exceptions import ConnectionError as RedisConnectionError

from actors.messages import EXPIRED, STOLEN
from actors.renewer import BatchOutcome, ChunkError
from tests.support.manual import ManualClock

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["FlakyClock", "Inbox", "LockTable"]


class LockTable:
    """Lock keys in memory, renewed as ``extendLocks-1.lua`` renews them.

    A job's renewal fails when :attr:`held` does not hold its token: ``"expired"``
    when the id is absent, ``"stolen"`` when it holds another token.

    Args:
        gated: Whether calls wait for :attr:`gate` before renewing.
        clock: Read at each call, to note when it came (see :attr:`sent`).
    """

    def __init__(self, *, gated: bool = False, clock: ManualClock | None = None) -> None:
        #: Each id's token, as the lock keys hold them.
        self.held: dict[str, str] = {}
        #: Calls wait here while it is clear; :meth:`close` sets it.
        self.gate = threading.Event()
        if not gated:
            self.gate.set()
        #: Set when a call has started (and is waiting at the gate, if closed).
        self.entered = threading.Event()
        #: Set to make the next call raise, as a dropped connection does.
        self.raise_next = False
        #: Set to make the server refuse the second half of the next call (BUSY).
        self.refuse_half_next = False
        #: Every call: the clock's time (``0`` with no clock) and the ids sent.
        self.sent: list[tuple[int, list[str]]] = []
        self._clock = clock

    def __call__(self, job_ids: Sequence[str], tokens: Sequence[str]) -> BatchOutcome:
        self.sent.append((self._clock() if self._clock else 0, list(job_ids)))
        self.entered.set()
        self.gate.wait()
        if self.raise_next:
            self.raise_next = False
            raise RedisConnectionError("connection refused")
        stop, errors = len(job_ids), []
        if self.refuse_half_next:
            # The server refused the second half: those jobs' state is unknown.
            self.refuse_half_next = False
            stop = len(job_ids) // 2
            errors = [ChunkError(stop, len(job_ids), RuntimeError("BUSY"))]
        failed = [
            j for j, t in zip(job_ids[:stop], tokens[:stop], strict=True) if self.held.get(j) != t
        ]
        return BatchOutcome(
            failed, errors, {j: STOLEN if j in self.held else EXPIRED for j in failed}
        )

    def close(self) -> None:
        """Let every waiting call go on."""
        self.gate.set()


class Inbox:
    """A notify target (a job actor, say) that keeps what it is told, from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._got: list[Any] = []

    def tell(self, message: Any) -> None:
        """Keep ``message``."""
        with self._lock:
            self._got.append(message)

    @property
    def got(self) -> list[Any]:
        """Every message told so far, in order."""
        with self._lock:
            return list(self._got)


class FlakyClock(ManualClock):
    """A manual clock whose next reading raises when :attr:`fail_next` is set."""

    #: Set to make the next reading raise ``RuntimeError``.
    fail_next = False

    def __call__(self) -> int:
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("the clock failed")
        return self.now
