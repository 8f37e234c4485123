"""Fakes that plug into a manager through its public seams: no Redis involved.

- :class:`LockTable`: the server's lock keys in memory, as ``start_link(renewer=...)``;
- :class:`Inbox`: a ``notify`` target (a job actor, say) that keeps what it is told;
- :class:`Silent`: a ``notify`` target that drops what it is told;
- :class:`JobActor`: a pykka job actor that keeps each ``LockLost`` it is told;
- :class:`FlakyClock`: a :class:`~tests.support.manual.ManualClock` whose next reading may raise;
- :class:`HoldingClock`: a :class:`~tests.support.manual.ManualClock` that can hold the
  manager's own thread in a reading, while the test lays out its mailbox.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

import pykka
from redis.exceptions import ConnectionError as RedisConnectionError

from actors.messages import EXPIRED, STOLEN, BatchOutcome, ChunkError, LockLost
from tests.support.manual import ManualClock

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = ["FlakyClock", "HoldingClock", "Inbox", "JobActor", "LockTable", "Silent", "told"]

#: Most seconds a held reading waits for its release: only a broken test waits that long.
HOLD_TIMEOUT = 30.0


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
        self._got: list[tuple[float, Any]] = []

    def tell(self, message: Any) -> None:
        """Keep ``message``, with the monotonic time it came."""
        with self._lock:
            self._got.append((time.monotonic(), message))

    @property
    def got(self) -> list[Any]:
        """Every message told so far, in order."""
        with self._lock:
            return [message for _, message in self._got]

    @property
    def timed(self) -> list[tuple[float, Any]]:
        """Every message told so far with when it came (``time.monotonic()``)."""
        with self._lock:
            return list(self._got)


class JobActor(pykka.ThreadingActor):
    """A pykka job actor watching its lock: keeps each ``LockLost`` with when it came.

    Any other message is answered with what it was told so far (see :func:`told`).
    """

    use_daemon_thread = True

    def __init__(self) -> None:
        super().__init__()
        self.told: list[tuple[float, LockLost]] = []

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, LockLost):
            self.told.append((time.monotonic(), message))
            return None
        return list(self.told)


def told(job: pykka.ActorRef[JobActor], timeout: float = 10.0) -> list[tuple[float, LockLost]]:
    """What the job actor ``job`` was told so far, with when."""
    answer = job.ask("told", timeout=timeout)
    assert isinstance(answer, list)
    return answer


class FlakyClock(ManualClock):
    """A manual clock whose next reading raises when :attr:`fail_next` is set."""

    #: Set to make the next reading raise ``RuntimeError``.
    fail_next = False

    def __call__(self) -> int:
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("the clock failed")
        return self.now


class HoldingClock(ManualClock):
    """A manual clock whose next reading on one thread waits until the test releases it.

    No user code runs on a manager's thread, but its clock does (a track, a
    tick, a ``GetStats`` read it there). Held in a reading, the manager takes
    nothing from its mailbox, so the test can lay out exactly what it finds
    there next.

    Example:
        >>> clock.hold(manager._manager.thread)
        >>> stats = manager.ask(GetStats(), block=False)    # read on the manager's thread
        >>> clock.wait_held(timeout=5)
        >>> ...                                            # queue what the test needs
        >>> clock.release()

    Args:
        now: The starting time, in milliseconds.
        source: Read for the time instead of :attr:`now`, when given
            (``actors.timing.monotonic_ms``: the real clock, with a hold).
    """

    def __init__(self, now: int = 1_000_000, *, source: Callable[[], int] | None = None) -> None:
        super().__init__(now)
        self._source = source
        self._thread: threading.Thread | None = None
        self._held = threading.Event()
        self._released = threading.Event()

    def hold(self, thread: threading.Thread | None) -> None:
        """Hold ``thread`` (the manager's, once started) in its next reading."""
        assert thread is not None, "the manager's thread has not started yet (settle first)"
        self._held.clear()
        self._released.clear()
        self._thread = thread

    def wait_held(self, timeout: float) -> None:
        """Return once the thread is held in a reading.

        Raises:
            AssertionError: It did not read the clock within ``timeout`` seconds.
        """
        assert self._held.wait(timeout), "the held thread never read the clock"

    def release(self) -> None:
        """Let the held reading return (the time it returns is the time then)."""
        self._thread = None
        self._released.set()

    def __call__(self) -> int:
        if self._thread is not None and threading.current_thread() is self._thread:
            self._thread = None
            self._held.set()
            self._released.wait(HOLD_TIMEOUT)
        return self.now if self._source is None else self._source()


class Silent:
    """A ``notify`` target that drops what it is told: where only its presence matters."""

    def tell(self, message: object) -> None:
        """Drop the message."""
