"""The manager's reference: every door checked in the caller's thread.

pykka hands out one ``ActorRef`` per actor; a manager's is a :class:`ManagerRef`.
Everything that reaches the manager passes through its ``tell`` and ``ask`` —
the module helpers, raw messages, and ``manager.proxy()`` calls, deferred or
not — so this is where each door is made to behave the same:

- what arrives is admitted by :func:`actors.admission.admit`: a proxy call
  becomes its operation's message, checked in the caller's thread, and
  anything else is refused there;
- asked from the manager's own thread (a callback), a query is answered at
  once from the state right there instead of waiting for itself forever;
- a stopped manager says so (:class:`ManagerStopped`), and every message is
  either answered or refused: none is left in a mailbox nobody reads;
- a stop asked for from any manager's thread (a callback) is sent, not waited
  for, so managers whose callbacks stop one another cannot wait for each
  other; and of several stops only the one the manager took returns ``True``;
- an answer is an :class:`Answer`, which calls back once it is set, so
  asyncio code awaits it without a thread waiting on it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Protocol

import pykka
from pykka._envelope import Envelope
from pykka.messages import ProxyCall, ProxyGetAttr, _ActorStop

from actors.admission import admit
from actors.answer import Answer
from actors.messages import ExtendLocks, UntrackJob
from actors.operations import MESSAGES

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["Answer", "ManagerRef", "ManagerStopped", "on_a_manager_thread", "require_manager"]

logger = logging.getLogger(__name__)


class ManagerStopped(pykka.ActorDeadError):
    """The manager is stopped: it tracks nothing and answers nothing."""


#: Every manager's reference, to know a manager's thread when one calls.
_managers: weakref.WeakSet[ManagerRef] = weakref.WeakSet()
_managers_lock = threading.Lock()


def on_a_manager_thread() -> bool:
    """Whether the caller runs on any manager's own thread (in one of its callbacks)."""
    current = threading.current_thread()
    with _managers_lock:
        refs = list(_managers)
    return any(ref._core.thread is current for ref in refs)


class _Core(Protocol):
    """What the reference needs from its manager."""

    queue_name: str
    clock: Callable[[], int]
    #: The manager's thread, once it has started.
    thread: threading.Thread | None

    def handle(self, message: Any) -> Any:
        """Handle ``message`` now, on the calling thread (the manager's own)."""
        ...

    @property
    def calling_back(self) -> bool:
        """Whether the manager's thread runs user code now (a callback)."""
        ...

    def put_before_ticks(self, envelope: Any) -> None:
        """Put ``envelope`` in the mailbox, every tick (queued or to come) after it."""
        ...

    def trusted_for(self, safety_margin: int | None = None) -> int:
        """How long a watched lock is trusted after a confirmed renewal's send, in ms."""
        ...


class ManagerRef(pykka.ActorRef[Any]):
    """A :class:`~actors.LockManager`'s ``ActorRef``; use it as any pykka reference."""

    def __init__(self, actor: Any, core: _Core) -> None:
        super().__init__(actor)
        self._core = core
        self._warned = False
        #: Held while a stop is put in the mailbox, so the first one put is known.
        self._stop_lock = threading.Lock()
        self._stop_sent = False
        with _managers_lock:
            _managers.add(self)

    @property
    def clock(self) -> Callable[[], int]:
        """The manager's monotonic clock, in milliseconds: what ``ts`` is measured on."""
        return self._core.clock

    @property
    def queue_name(self) -> str:
        """The name of the queue the manager renews for."""
        return self._core.queue_name

    def trusted_for(self, safety_margin: int | None = None) -> int:
        """Return how long a watched lock is trusted after a confirmed renewal's send, in ms.

        Raises:
            TypeError: ``safety_margin`` is not an ``int``.
            ValueError: It does not fit the manager's ``lock_duration``.
        """
        return self._core.trusted_for(safety_margin)

    def on_own_thread(self) -> bool:
        """Whether the caller runs on the manager's own thread (in a callback)."""
        return threading.current_thread() is self._core.thread

    def busy_calling_back(self) -> bool:
        """Whether the manager's thread runs user code now, and the caller is another thread.

        Such a caller must not wait for the manager: the user code may be
        waiting for it.
        """
        return self._core.calling_back and not self.on_own_thread()

    def stopped_error(self) -> ManagerStopped:
        """The error a stopped manager answers with."""
        return ManagerStopped(f"LockManager for queue {self.queue_name!r} is stopped")

    def ignored(self, what: str) -> None:
        """Say, once per manager, that ``what`` was sent to it after it stopped."""
        if self._warned:
            return
        self._warned = True
        logger.warning(
            "LockManager for queue %r is stopped: %s ignored (and any more sent to it); "
            "start a new manager",
            self.queue_name,
            what,
        )

    def tell(self, message: Any) -> None:
        """Send ``message``; checks it in this thread first.

        Raises:
            TypeError: A proxy call or message with bad arguments.
            ValueError: Likewise, for values out of range.
            AttributeError: A proxy call of something that is not an operation.
            ManagerStopped: The manager is stopped.
        """
        message = admit(message, self._core.clock)
        try:
            # The manager's mailbox refuses a message once it begins to stop.
            self._put(message, None)
        except pykka.ActorDeadError:
            raise self.stopped_error() from None

    def ask(self, message: Any, *, block: bool = True, timeout: float | None = None) -> Any:
        """Send ``message`` and return the answer (or its future with ``block=False``).

        From the manager's own thread a query is answered at once; waiting for
        a tick there would wait forever, so it raises instead.

        Raises:
            TypeError: A proxy call or message with bad arguments.
            ValueError: Likewise, for values out of range.
            AttributeError: A proxy call of something that is not an operation.
            RuntimeError: A tick asked for from the manager's own thread.
            ManagerStopped: The manager is stopped (raised by ``get`` when
                ``block=False``).
            pykka.Timeout: No answer within ``timeout`` seconds.
        """
        message = admit(message, self._core.clock)
        if self.on_own_thread():
            if isinstance(message, ExtendLocks):
                raise RuntimeError(
                    "a LockManager cannot wait for its own tick from its own thread (a "
                    "callback); tell it ExtendLocks() instead"
                )
            if isinstance(message, MESSAGES):
                return _answer(self._core.handle(message), block)
            if isinstance(message, ProxyGetAttr):
                return _answer(getattr(self._core, message.attr_path[0]), block)
            if isinstance(message, ProxyCall):  # stop(): after the current message
                self.tell(message)
                return _answer(None, block)
            if block:
                raise RuntimeError(
                    f"a LockManager cannot wait for its own answer to {message!r} from its "
                    "own thread (a callback)"
                )
        if isinstance(message, UntrackJob) and self.busy_calling_back():
            # The manager's thread is in user code, which may be waiting for
            # this very caller (a callback's blocking stop of an actor whose
            # on_stop untracks): waiting here would wait forever. Put it in
            # order with every other message, but ahead of every tick, and
            # answer now: no later tick finds the lock gone before the untrack.
            with contextlib.suppress(pykka.ActorDeadError):  # stopping: it tracks nothing now
                self._core.put_before_ticks(Envelope(message, reply_to=None))
            return _answer(None, block)
        future: Answer[Any] = Answer()
        try:
            # Answered, failed by pykka's last pass over the mailbox, or
            # refused by the mailbox of a manager that is stopping.
            self._put(message, future)
        except pykka.ActorDeadError:
            return _failure(self.stopped_error(), block)
        if not block:
            return future
        try:
            return future.get(timeout=timeout)
        except ManagerStopped:
            raise
        except pykka.ActorDeadError:
            raise self.stopped_error() from None

    def stop(self, block: bool = True, timeout: float | None = None) -> Any:
        """Stop the manager; with ``block``, return once it is fully stopped.

        Safe from any thread, several at once. From any manager's own thread
        (a callback of this manager or of another) it sends the stop and
        returns at once: this manager then stops after its current message,
        and no manager waits for another that may be waiting for it.

        Returns:
            ``True`` for exactly one call, the one whose stop the manager
            took; ``False`` for every other (the manager was stopped or
            stopping already, or another call's stop came first). With
            ``block=False``, a future of that, set once the stop is handled.

        Raises:
            pykka.Timeout: Not stopped within ``timeout`` seconds.
        """
        reply: pykka.ThreadingFuture[Any] = pykka.ThreadingFuture()
        try:
            first = self._send_stop(reply)
        except pykka.ActorDeadError:
            first = False
            reply.set(None)
        if not block:
            stopped: pykka.ThreadingFuture[bool] = pykka.ThreadingFuture()
            stopped.set_get_hook(lambda wait: _after(reply, wait, first))
            return stopped
        if self.on_own_thread() or on_a_manager_thread():
            return first
        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        try:
            # Answered (the stop, or pykka's last pass over the mailbox) or
            # refused (another stop came first): never left waiting.
            _after(reply, left(), first)
            thread = self._core.thread
            if thread is not None:
                # Fully stopped: its thread, and pykka's work on it, has ended.
                thread.join(left())
                if thread.is_alive():
                    raise pykka.Timeout(f"{timeout} seconds")
        except pykka.Timeout:
            raise pykka.Timeout(
                f"LockManager for queue {self.queue_name!r} did not stop within {timeout} s"
            ) from None
        return first

    def _put(self, message: Any, reply: pykka.Future[Any] | None) -> None:
        """Put ``message`` in the mailbox, as pykka's ``tell`` and ``ask`` do.

        Raises:
            pykka.ActorDeadError: The manager is stopped or stopping.
        """
        if type(message) is _ActorStop:
            self._send_stop(reply)
            return
        if not self.is_alive():
            raise pykka.ActorDeadError(f"{self} not found")
        self.actor_inbox.put(Envelope(message, reply_to=reply))

    def _send_stop(self, reply: pykka.Future[Any] | None) -> bool:
        """Put a stop in the mailbox; return whether it is the first one put.

        The first stop put is the one the manager takes: its mailbox is first
        in, first out for everything but its timer's tick.

        Raises:
            pykka.ActorDeadError: The manager is stopped or stopping.
        """
        with self._stop_lock:
            if not self.is_alive():
                raise pykka.ActorDeadError(f"{self} not found")
            self.actor_inbox.put(Envelope(_ActorStop(), reply_to=reply))
            first, self._stop_sent = not self._stop_sent, True
        return first


def require_manager(manager: object) -> ManagerRef:
    """Return ``manager`` if it is a manager's reference.

    Raises:
        TypeError: It is anything else (another actor's ``ActorRef``, a proxy, ...).
    """
    if not isinstance(manager, ManagerRef):
        raise TypeError(
            "manager must be the reference start_link (or LockManager.start) returned, "
            f"got {type(manager).__name__}"
        )
    return manager


def _after(reply: pykka.Future[Any], timeout: float | None, first: bool) -> bool:
    """Wait until the stop in ``reply`` is handled (or refused); return ``first``."""
    with contextlib.suppress(pykka.ActorDeadError):
        reply.get(timeout=timeout)
    return first


def _answer(value: Any, block: bool) -> Any:
    if block:
        return value
    future: pykka.ThreadingFuture[Any] = pykka.ThreadingFuture()
    future.set(value)
    return future


def _failure(error: Exception, block: bool) -> Any:
    if block:
        raise error
    future: pykka.ThreadingFuture[Any] = pykka.ThreadingFuture()
    future.set_exception((type(error), error, None))
    return future
