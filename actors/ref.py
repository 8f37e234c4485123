"""The manager's reference: every door checked in the caller's thread, every message answered.

Every door (the helpers, raw messages, ``manager.proxy()`` calls) passes through
:class:`ManagerRef`'s ``tell`` and ``ask``: :func:`admit` turns a proxy call
into its operation's message and stamps a ``TrackJob``'s time, in the caller's
thread; a stopped manager says so (:class:`ManagerStopped`) and no message is
left unanswered; of several stops only the one taken returns ``True``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import queue
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar, cast

import pykka
from pykka._envelope import Envelope
from pykka.messages import ProxyCall, ProxyGetAttr, ProxySetAttr, _ActorStop

from actors.messages import BY_NAME, MESSAGES, TrackJob, UntrackJob
from actors.report import on_a_delivery_thread

if TYPE_CHECKING:
    from collections.abc import Callable

    from actors.keys import QueueKeys
    from actors.scripts import Replicas

__all__ = [
    "UNREAD",
    "Answer",
    "Batch",
    "ManagerRef",
    "ManagerStopped",
    "Outbox",
    "Posted",
    "Reply",
    "admit",
    "require_manager",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")


class ManagerStopped(pykka.ActorDeadError):
    """The manager is stopped: it tracks nothing and answers nothing."""


class Answer(pykka.ThreadingFuture[T]):
    """A manager's answer to an ask: a pykka future that also calls back once set.

    pykka's futures can only be waited on; a callback lets asyncio code (see
    :mod:`actors.aio`) hear of the answer without a thread blocked on it.
    """

    def __init__(self, *, undelivered: bool = False) -> None:
        super().__init__()
        #: Set as soon as the manager is done, before its reports are delivered:
        #: asked from the delivery thread, which cannot wait for itself.
        self.undelivered = undelivered
        self._callbacks_lock = threading.Lock()
        self._callbacks: list[Callable[[Answer[T]], object]] | None = []
        self._wakes: list[Callable[[Answer[T]], object]] = []

    def set(self, value: Any | None = None) -> None:
        """Set the answer, then run the callbacks (on the setting thread)."""
        super().set(value)
        self._settled()

    def set_exception(self, exc_info: Any = None) -> None:
        """Set the failure (``sys.exc_info()`` when ``None``), then run the callbacks."""
        super().set_exception(sys.exc_info() if exc_info is None else exc_info)
        self._settled()

    def add_done_callback(self, callback: Callable[[Answer[T]], object]) -> None:
        """Call ``callback(self)`` once the answer is set.

        It runs on the process's one thread for answers' callbacks, never a
        manager's: a slow one delays the callbacks after it, nothing else.
        What it raises is logged.
        """
        with self._callbacks_lock:
            if self._callbacks is not None:
                self._callbacks.append(callback)
                return
        _CALLBACKS.put(callback, self)

    def _on_set(self, wake: Callable[[Answer[T]], object]) -> None:
        """Call ``wake(self)`` once the answer is set, on the setting thread (a manager's).

        For this package's asyncio waiters, whose ``wake`` only schedules on a
        loop and never blocks; any other code uses :meth:`add_done_callback`.
        """
        with self._callbacks_lock:
            if self._callbacks is not None:
                self._wakes.append(wake)
                return
        wake(self)

    def _settled(self) -> None:
        with self._callbacks_lock:
            callbacks, self._callbacks = self._callbacks or [], None
            wakes, self._wakes = self._wakes, []
        for wake in wakes:
            with contextlib.suppress(Exception):  # a closed loop: nobody waits any more
                wake(self)
        for callback in callbacks:
            _CALLBACKS.put(callback, self)


class _Callbacks:
    """The thread answers' callbacks run on, started at the first one (a daemon)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[Callable[[Any], object], Any]]
        self._lock: threading.Lock
        self._thread: threading.Thread | None
        self.reset()

    def reset(self) -> None:
        """Start anew, with no thread (in a fork's child: the parent's thread is not there)."""
        self._queue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread = None

    def put(self, callback: Callable[[Any], object], answer: Any) -> None:
        """Run ``callback(answer)`` on the thread."""
        self._queue.put((callback, answer))
        if self._thread is None or not self._thread.is_alive():
            with self._lock:
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(
                        target=self._run, name="LockManager-answers", daemon=True
                    )
                    self._thread.start()

    def _run(self) -> None:
        while True:
            callback, answer = self._queue.get()
            try:
                callback(answer)
            except BaseException:
                logger.warning("a callback of a LockManager's answer raised", exc_info=True)


_CALLBACKS = _Callbacks()
# A fork has none of the thread: it starts anew, at the first callback there.
os.register_at_fork(after_in_child=_CALLBACKS.reset)


class Reply:
    """The manager's answer to one message of an :class:`Outbox`, once it has read it."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        #: What the manager answered (a watched track's :class:`~actors.jobs.Validity`),
        #: :data:`UNREAD` until it has read the message.
        self.value: Any = UNREAD


#: A :class:`Reply`'s value until the manager has read its message.
UNREAD: Final = object()


class Batch:
    """The messages of one :class:`Posted`, in the order put (internal)."""

    __slots__ = ("items", "number")

    def __init__(self) -> None:
        self.items: list[tuple[TrackJob | UntrackJob, Reply]] = []
        #: The mailbox's number of its :class:`Posted`, once put.
        self.number = -1


@dataclasses.dataclass(frozen=True, slots=True)
class Posted:
    """An outbox has messages for the manager (internal: its door is the outbox)."""

    outbox: Outbox
    batch: Batch

    def take(self) -> list[tuple[TrackJob | UntrackJob, Reply]]:
        """Take the batch's messages (on the manager's thread)."""
        return self.outbox.take(self.batch)


#: How many messages in an outbox wake the manager to read them, at most.
OUTBOX_WAKE: Final = 512


class Outbox:
    """Tracks and untracks for one manager, read by it in one go: one message, no wake.

    For a worker that tracks and untracks thousands of short jobs a second.
    Each :meth:`put` appends to a list; only the first since the manager last
    read it puts a message in the mailbox, which does not wake a thread-mode
    manager (see :class:`~actors.lock_manager.TicksFirst`): the manager
    reads the list with its next message, its timer's next tick at the
    latest, or once :data:`OUTBOX_WAKE` more wait. The messages keep their
    order, among themselves and with what their sender tells and asks the
    manager (a put after a tell starts a new list, read after the tell); a
    track keeps its caller's time, so no renewal comes later for the wait. A
    job tracked and untracked by one claim within one read costs a
    thread-mode manager nothing.
    """

    def __init__(self, mailbox: _Mailbox, clock: Callable[[], int]) -> None:
        self._mailbox = mailbox
        self._clock = clock
        self._lock = threading.Lock()
        #: The batch whose Posted waits in the mailbox, unread.
        self._batch: Batch | None = None

    def put(self, message: TrackJob | UntrackJob, *, wake: bool = False) -> Reply:
        """Add a track or an untrack; return where the manager's answer will be.

        With ``wake`` the manager reads it now, not at its next tick: a track
        that comes late, whose first renewal may be due.

        Raises:
            TypeError: ``message`` is neither a ``TrackJob`` nor an ``UntrackJob``.
            ManagerStopped: The manager is stopped.
        """
        if type(message) not in (TrackJob, UntrackJob):
            raise TypeError(
                f"an outbox takes TrackJob and UntrackJob, got {type(message).__name__}"
            )
        message = admit(message, self._clock)
        reply = Reply()
        mailbox = self._mailbox
        with self._lock:
            batch = self._batch
            if batch is not None and mailbox.last == batch.number:
                # Nothing was put in the mailbox since: the message keeps its place.
                items = batch.items
                items.append((message, reply))
                if wake or len(items) % OUTBOX_WAKE == 0:
                    # Read in parts: one long read would hold the interpreter from the worker.
                    mailbox.wake()
                return reply
            batch = Batch()
            batch.items.append((message, reply))
            try:
                # Under the lock: no other put joins a batch whose Posted may yet be refused.
                posted = Envelope(Posted(self, batch), reply_to=None)
                batch.number = mailbox.post(posted, wake=wake)
            except pykka.ActorDeadError:
                raise ManagerStopped("the LockManager is stopped") from None
            self._batch = batch
        return reply

    def take(self, batch: Batch) -> list[tuple[TrackJob | UntrackJob, Reply]]:
        """Take ``batch``'s messages (on the manager's thread): later ones go in a new one."""
        with self._lock:
            if self._batch is batch:
                self._batch = None
        return batch.items


# -- what a manager lets in ------------------------------------------------------

#: The attributes a proxy may read: values, none of the manager's machinery
#: (its mailbox, its locks, its methods run from another thread).
_READABLE = frozenset({"queue_name", "actor_urn", "use_daemon_thread"})
#: Messages that need nothing done on their way in: they checked themselves.
_PASS = frozenset(MESSAGES) - {TrackJob}
#: What a proxy's ``stop()`` is forwarded as: built here, not the caller's.
_STOP = ProxyCall(attr_path=("stop",), args=(), kwargs={})


def admit(message: Any, clock: Callable[[], int]) -> Any:
    """Return what goes on to the manager for ``message``, or raise.

    Args:
        message: What a caller sent: a message, or pykka's proxy or stop message.
        clock: The manager's monotonic clock in milliseconds, to stamp a
            ``TrackJob`` sent without a time.

    Raises:
        TypeError: Not a message the manager takes, or a proxy call with bad
            arguments.
        ValueError: A proxy call with values out of range.
        AttributeError: A proxy call of something that is not an operation, a
            read of something that is not a plain value, or any write.
    """
    kind = type(message)
    if kind is TrackJob:
        if message.ts is None:
            return dataclasses.replace(message, ts=clock())
        return message
    if kind in _PASS or kind is _ActorStop:
        return message
    if kind is ProxyCall:
        path = _path(message.attr_path)
        args, kwargs = message.args, message.kwargs
        if type(args) is not tuple or type(kwargs) is not dict:
            raise TypeError(
                "a proxy call's args must be a tuple and its kwargs a dict, got "
                f"{type(args).__name__} and {type(kwargs).__name__}"
            )
        operation = BY_NAME.get(path[0]) if len(path) == 1 else None
        if operation is not None:
            return admit(operation(*args, **kwargs), clock)
        if path == ("stop",):
            if args or kwargs:
                raise TypeError("stop() takes no arguments through a proxy")
            return _STOP
        raise AttributeError(
            f"LockManager has no operation {'.'.join(path)!r} for a proxy to call; "
            f"the operations are {', '.join(BY_NAME)}"
        )
    if kind is ProxySetAttr:
        raise AttributeError("a LockManager's attributes cannot be set through a proxy")
    if kind is ProxyGetAttr:
        path = _path(message.attr_path)
        if len(path) != 1 or path[0] not in _READABLE:
            raise AttributeError(
                f"a proxy can read only {', '.join(sorted(_READABLE))} of a LockManager, "
                f"not {'.'.join(path)!r}"
            )
        return ProxyGetAttr(attr_path=path)
    raise TypeError(
        f"a LockManager takes its messages ({', '.join(m.__name__ for m in MESSAGES)}) "
        f"or proxy calls, got {kind.__name__}"
    )


def _path(path: object) -> tuple[str, ...]:
    """Return a proxy message's attribute path, as plain strings, or raise."""
    if type(path) is not tuple or not path or not all(type(name) is str for name in path):
        raise TypeError(f"a proxy message's path must be a tuple of str, got {type(path).__name__}")
    return path


# -- the reference ---------------------------------------------------------------


class _Mailbox(Protocol):
    """A manager's mailbox, which can take a message without waking the manager."""

    #: The number of the message put last (any kind).
    last: int

    def post(self, item: Any, /, *, wake: bool = True) -> int:
        """Add an envelope; return its number."""

    def wake(self) -> None:
        """Wake the manager to read what waits."""


class _Manager(Protocol):
    """What the reference reads of its manager (none of it changes once started)."""

    queue_name: str
    clock: Callable[[], int]
    #: The manager's thread, once it has started.
    thread: threading.Thread | None

    @property
    def delivery(self) -> threading.Thread:
        """The thread its callbacks run on."""
        ...

    def runs_user_code(self, thread: threading.Thread) -> bool:
        """Whether ``thread`` runs user code for it (callbacks, targets, log handlers)."""
        ...

    def flush(self, timeout: float) -> bool:
        """Wait until every target told so far was told and every record written."""
        ...

    def trusted_for(self, safety_margin: int | None = None) -> int:
        """How long a watched lock is trusted after a confirmed renewal's send, in ms."""
        ...

    def fencing(self) -> tuple[Any, QueueKeys]:
        """The client and keys a lease takes its fence with."""
        ...

    @property
    def replicas(self) -> Replicas | None:
        """The replicas each of its writes waits for (``None``: the primary's word)."""
        ...

    def taker(self) -> Callable[..., Any] | None:
        """What runs a lock-taking script where the locks are renewed, if not here."""
        ...

    def outbox(self) -> Outbox:
        """A new outbox of the manager."""
        ...

    def failures(self) -> str:
        """The ticks failed since the last that worked, and the last one's error; ``""`` if none."""
        ...


class ManagerRef(pykka.ActorRef[Any]):
    """A :class:`~actors.LockManager`'s ``ActorRef``; use it as any pykka reference."""

    def __init__(self, actor: Any, manager: _Manager) -> None:
        super().__init__(actor)
        self._manager = manager
        #: The process the manager runs in: a fork inherits the reference, not the threads.
        self._pid = os.getpid()
        self._warned = False
        #: Held while a stop is put in the mailbox, so the first one put is known.
        self._stop_lock = threading.Lock()
        self._stop_sent = False

    @property
    def clock(self) -> Callable[[], int]:
        """The manager's monotonic clock, in milliseconds: what ``ts`` is measured on."""
        return self._manager.clock

    @property
    def queue_name(self) -> str:
        """The name of the queue the manager renews for."""
        return self._manager.queue_name

    @property
    def replicas(self) -> Replicas | None:
        """The replicas each renewal and each lease's fence wait for, or ``None``."""
        return self._manager.replicas

    def trusted_for(self, safety_margin: int | None = None) -> int:
        """Return how long a watched lock is trusted after a confirmed renewal's send, in ms.

        Raises:
            TypeError: ``safety_margin`` is not an ``int``.
            ValueError: It does not fit the manager's ``lock_duration``.
        """
        return self._manager.trusted_for(safety_margin)

    def fencing(self) -> tuple[Any, QueueKeys]:
        """Return the client and keys the manager's leases take their fences with.

        Raises:
            RuntimeError: The manager renews through a renewer with no client.
        """
        return self._manager.fencing()

    def taker(self) -> Callable[..., Any] | None:
        """Return what runs a script that takes a job's lock where the locks are renewed.

        ``None`` in thread mode: the worker's own threads renew, so the worker
        runs such a script itself. In process mode the child runs it and tracks
        the job it took before it answers (see :mod:`actors.process.take`).
        """
        return self._manager.taker()

    def outbox(self) -> Outbox:
        """Return an outbox: tracks and untracks the manager reads in one go, without a wake.

        See :class:`~actors.lock_manager.Outbox`: for a worker whose jobs
        mostly end before their first renewal.
        """
        self._here()
        return self._manager.outbox()

    def failures(self) -> str:
        """Say how many ticks failed since the last that worked, and with what; ``""`` if none.

        What a lease adds to a loss it finds itself, past its deadline: why no
        renewal was confirmed (the server unreachable, replicas that did not
        confirm).
        """
        return self._manager.failures()

    def is_alive(self) -> bool:
        """Whether the manager runs, in this process (never in a fork of the one it started in)."""
        return os.getpid() == self._pid and super().is_alive()

    def tell(self, message: Any, *, wake: bool = True) -> None:
        """Send ``message``; checks it in this thread first.

        With ``wake=False`` a thread-mode manager is not woken for it: it
        takes the message with the next one it gets, at its timer's next
        tick at the latest (one interval; a manager whose timer fires only
        when told, a ``ManualTimer``, at the next message it is sent), and
        before any message sent after it. A worker that tracks and untracks
        many short jobs saves a thread switch per message; a track keeps its
        caller's time, so no renewal comes later for it.

        Raises:
            TypeError: A proxy call or message with bad arguments.
            ValueError: Likewise, for values out of range.
            AttributeError: A proxy call of something that is not an operation.
            ManagerStopped: The manager is stopped.
            RuntimeError: Sent from a fork of the process the manager runs in.
        """
        self._here()
        message = admit(message, self._manager.clock)
        try:
            # The manager's mailbox refuses a message once it begins to stop.
            self._put(message, None, wake=wake)
        except pykka.ActorDeadError:
            raise self._stopped() from None

    def ask(
        self,
        message: Any,
        *,
        block: bool = True,
        timeout: float | None = None,
        wake: bool = True,
    ) -> Any:
        """Send ``message`` and return the answer (or its future with ``block=False``).

        ``wake`` as for :meth:`tell`: with ``False`` the answer may come one
        interval later.

        Raises:
            TypeError: A proxy call or message with bad arguments.
            ValueError: Likewise, for values out of range.
            AttributeError: A proxy call of something that is not an operation.
            RuntimeError: Asked from the manager's own thread, which would
                wait for itself (a ``clock`` or ``timer`` seam that asks), or
                from a fork of the process the manager runs in.
            ManagerStopped: The manager is stopped (raised by ``get`` when
                ``block=False``).
            pykka.Timeout: No answer within ``timeout`` seconds.
        """
        self._here()
        message = admit(message, self._manager.clock)
        if threading.current_thread() is self._manager.thread:
            raise RuntimeError(
                f"a LockManager cannot wait for its own answer to a {type(message).__name__} "
                "on its own thread; tell it instead"
            )
        own = self._manager.runs_user_code(threading.current_thread())
        future: Answer[Any] = Answer(undelivered=own)
        try:
            # Answered, failed by the manager's last pass over its mailbox, or
            # refused by the mailbox of a manager that is stopping.
            self._put(message, future, wake=wake)
        except pykka.ActorDeadError:
            future.set_exception((ManagerStopped, self._stopped(), None))
        if not block:
            return future
        try:
            return future.get(timeout=timeout)
        except ManagerStopped:
            raise
        except pykka.ActorDeadError:
            raise self._stopped() from None

    def stop(self, block: bool = True, timeout: float | None = None) -> Any:
        """Stop the manager; with ``block``, return once it is fully stopped.

        Safe from any thread, several at once. From user code of any manager
        (a callback of this manager or of another) it waits for the manager's
        own thread only, not for its delivery thread, so managers whose
        callbacks stop one another never wait for each other.

        Returns:
            ``True`` for exactly one call, the one whose stop the manager
            took; ``False`` for every other (the manager was stopped or
            stopping already, or another call's stop came first). With
            ``block=False``, a future of that, set once the stop is handled.

        In a fork of the process the manager runs in there is nothing to
        stop: ``False`` at once (the manager in the parent runs on).

        Raises:
            pykka.Timeout: Not stopped within ``timeout`` seconds.
        """
        if os.getpid() != self._pid:
            return _done(False) if not block else False
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
        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        threads = [self._manager.thread]
        if not on_a_delivery_thread():
            threads.append(self._manager.delivery)
        try:
            # Answered (the stop, or the last pass over the mailbox) or
            # refused (another stop came first): never left waiting.
            _after(reply, left(), first)
            for thread in threads:
                if thread is not None and thread.ident is not None:
                    thread.join(left())
                    if thread.is_alive():
                        raise pykka.Timeout(f"{timeout} seconds")
        except pykka.Timeout:
            raise pykka.Timeout(
                f"LockManager for queue {self.queue_name!r} did not stop within {timeout} s"
            ) from None
        return first

    def _here(self) -> None:
        """Refuse a message sent from a fork: no thread of the manager runs there."""
        if os.getpid() != self._pid:
            raise RuntimeError(
                f"LockManager for queue {self.queue_name!r} runs in process {self._pid}, not in "
                f"this fork of it ({os.getpid()}): start a manager in this process"
            )

    def _stopped(self) -> ManagerStopped:
        return ManagerStopped(f"LockManager for queue {self.queue_name!r} is stopped")

    def _ignored(self, what: str) -> None:
        """Say, once per manager, that ``what`` was sent to it after it stopped."""
        if self._warned:
            return
        self._warned = True
        logger.warning(
            "LockManager for queue %r is stopped: %s ignored (and any more sent to it); "
            "start a new manager",
            self.queue_name,
            what,
            extra={"queue": self.queue_name},
        )

    def _put(self, message: Any, reply: pykka.Future[Any] | None, *, wake: bool = True) -> None:
        """Put ``message`` in the mailbox, as pykka's ``tell`` and ``ask`` do.

        Raises:
            pykka.ActorDeadError: The manager is stopped or stopping.
        """
        if type(message) is _ActorStop:
            self._send_stop(reply)
            return
        if not self.is_alive():
            raise pykka.ActorDeadError(f"{self} not found")
        mailbox = cast("_Mailbox", self.actor_inbox)  # every manager has a TicksFirst
        mailbox.post(Envelope(message, reply_to=reply), wake=wake)

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


def _done(value: bool) -> pykka.ThreadingFuture[bool]:
    future: pykka.ThreadingFuture[bool] = pykka.ThreadingFuture()
    future.set(value)
    return future


def _after(reply: pykka.Future[Any], timeout: float | None, first: bool) -> bool:
    """Wait until the stop in ``reply`` is handled (or refused); return ``first``."""
    with contextlib.suppress(pykka.ActorDeadError):
        reply.get(timeout=timeout)
    return first
