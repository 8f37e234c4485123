"""Process isolation: the manager's timer and renewals in a child process.

With ``isolation="process"`` a manager starts ``python -c ... actors._child``
(see :mod:`actors._child`), an ordinary thread-mode manager with its own
Redis client built from the same settings. The manager in the worker stays
the one door: it keeps a mirror of every claim (a :class:`~actors.jobs.JobTable`),
forwards tracks, untracks and queries to the child over a socket pair, and
turns what the child reports (renewals, lost locks, failed ticks, a watcher's
:class:`~actors.LockLost`) into the user's callbacks and the targets'
``tell``, on its own thread, as in thread mode. A child that dies is started
again and given the mirror.

A plain subprocess rather than ``multiprocessing``'s spawn: it does not
import the worker's ``__main__`` again (no second copy of a worker's heavy
imports, no guard needed in the user's script), starts no resource tracker,
and passes exactly two descriptors: the socket and the shared memory.

A lease's deadline lives in that shared memory (an anonymous ``memfd``: no
file, nothing to clean up), two 64-bit cells per watched claim written by
the child whenever a renewal of the lock is confirmed, so ``Lease.check()``
stays one local read. Both processes read ``CLOCK_MONOTONIC``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import mmap
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import pykka
import redis
import redis.asyncio
from pykka._envelope import Envelope

from actors.connection import client_settings, encoding, is_cluster
from actors.jobs import Validity
from actors.lost import LockLost, LostLock
from actors.messages import (
    ExtendLocks,
    GetActiveJobCount,
    GetStats,
    GetTrackedJobIds,
    IsTracked,
    TrackJob,
    UntrackJob,
)
from actors.ref import ManagerStopped
from actors.schedule import check_lock_duration, check_safety_margin, monotonic_ms

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from actors.jobs import JobTable
    from actors.keys import QueueKeys
    from actors.messages import Notify
    from actors.outcome import BatchOutcome
    from actors.report import Reporter
    from actors.schedule import Timing

__all__ = [
    "ISOLATIONS",
    "MAX_RESTARTS",
    "SLOTS",
    "START_TIMEOUT_S",
    "ChildEvent",
    "ChildLink",
    "Failed",
    "InChild",
    "SharedValidity",
    "check_process_options",
    "require_isolation",
]

logger = logging.getLogger("actors.lock_manager")

#: The isolation modes a manager accepts.
ISOLATIONS: Final = ("thread", "process")
#: Watched claims (leases) whose deadline can be shared at once.
SLOTS: Final = 65536
#: Most seconds a child may take to start and answer that it is ready.
START_TIMEOUT_S: Final = 30.0
#: Most seconds a stopping child is waited for before it is killed.
STOP_TIMEOUT_S: Final = 5.0
#: Restarts within :data:`RESTART_WINDOW_S` after which the manager gives up.
MAX_RESTARTS: Final = 5
#: The window of :data:`MAX_RESTARTS`, in seconds.
RESTART_WINDOW_S: Final = 60.0
#: Most seconds a query from the manager's own thread waits for the child.
OWN_THREAD_TIMEOUT_S: Final = 10.0
#: Messages forwarded in one write at most.
_BATCH: Final = 512

#: The folder holding the package, put first on the child's path so that it
#: imports this very ``actors``, wherever it was imported from.
_ROOT: Final = str(Path(__file__).resolve().parents[1])
_BOOT: Final = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from actors._child import main; sys.exit(main(sys.argv[2:]))"
)

_QUERIES: Final[dict[type, str]] = {
    GetActiveJobCount: "count",
    GetTrackedJobIds: "ids",
    IsTracked: "is_tracked",
    GetStats: "stats",
}


def check_process_options(
    lock_duration: int, renewer: object, clock: object, timer: object
) -> None:
    """Refuse what a process-mode manager cannot take: the seams that run the worker's code.

    Raises:
        TypeError: ``renewer``, ``clock`` or ``timer`` is given.
        ValueError: ``lock_duration`` is too short for a Redis lock.
    """
    check_lock_duration(lock_duration)
    for name, given in (("renewer", renewer), ("clock", clock), ("timer", timer)):
        if given is not None:
            raise TypeError(
                f"isolation='process' takes no {name}: the child process renews with its "
                "own client, clock and timer"
            )


class InChild:
    """The renewer of a process-mode manager: never called, its child renews."""

    def __call__(self, job_ids: Sequence[str], tokens: Sequence[str]) -> BatchOutcome:
        """Refuse: the worker's manager sends no renewal of its own.

        Raises:
            RuntimeError: Always.
        """
        raise RuntimeError("a process-mode manager renews in its child process")

    def close(self) -> None:
        """Nothing to release: the link closes the child."""


def require_isolation(isolation: object) -> str:
    """Return ``isolation`` if it is one of :data:`ISOLATIONS`.

    Raises:
        TypeError: It is not a ``str``.
        ValueError: It is another string.
    """
    if not isinstance(isolation, str):
        raise TypeError(f"isolation must be a str, got {type(isolation).__name__}")
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation must be 'thread' or 'process', got {isolation!r}")
    return str.__str__(isolation)


def connection_spec(connection: object) -> str | dict[str, Any]:
    """Return what the child builds its client from: the URL, or a client's settings.

    Raises:
        TypeError: ``connection`` is missing, a cluster or asyncio client, or
            a client whose settings cannot be sent to another process.
        ValueError: The client's encoding is not UTF-8.
    """
    if isinstance(connection, str):
        return connection
    if connection is None:
        raise TypeError("connection is required (a redis.Redis or a URL)")
    if is_cluster(connection) or isinstance(connection, redis.asyncio.RedisCluster):
        raise TypeError(
            "isolation='process' does not take a Redis Cluster client yet: use "
            "isolation='thread' with actors.connection.cluster_client(...)"
        )
    if not isinstance(connection, redis.Redis):
        raise TypeError(
            "with isolation='process', connection must be a redis.Redis or a URL, "
            f"got {type(connection).__name__}"
        )
    name = encoding(connection)
    if name.replace("_", "-").lower() not in ("utf-8", "utf8"):
        raise ValueError(
            f"connection encodes with {name!r}; lock keys and tokens are UTF-8: build the "
            "client with encoding='utf-8'"
        )
    settings = client_settings(connection)
    try:
        pickle.dumps(settings)
    except Exception as exc:
        raise TypeError(
            "the client's settings cannot be sent to the child process "
            f"({type(exc).__name__}: {exc}): pass the server's URL instead"
        ) from None
    return settings


class SharedValidity(Validity):
    """A watched lock's validity read from the memory the child writes: one read, no lock.

    The child writes the last confirmed renewal's send time and the deadline
    into two aligned 64-bit cells each time the server confirms one; a write
    and a read of one cell are single machine words.
    """

    __slots__ = ("_at", "_cells")

    def __init__(self, cells: memoryview, slot: int) -> None:
        self._cells = cells
        self._at = 2 * slot

    @property
    def confirmed(self) -> int:
        """Monotonic ms at which the last confirmed renewal was sent (or the lock taken)."""
        return int(self._cells[self._at])

    @confirmed.setter
    def confirmed(self, value: int) -> None:
        self._cells[self._at] = value

    @property
    def deadline(self) -> int:
        """Monotonic ms past which the lock may be gone at the server."""
        return int(self._cells[self._at + 1])

    @deadline.setter
    def deadline(self, value: int) -> None:
        self._cells[self._at + 1] = value

    @property
    def span(self) -> int:
        """How long after :attr:`confirmed` the lock is trusted, in ms."""
        return self.deadline - self.confirmed

    @span.setter
    def span(self, value: int) -> None:
        self.deadline = self.confirmed + value


@dataclass(frozen=True, slots=True)
class ChildEvent:
    """A word from the child for the manager's thread (internal: never sent by users)."""

    #: ``renewed``, ``lost``, ``error``, ``told``, ``freed`` or ``down``.
    kind: str
    #: What goes with it.
    payload: Any


@dataclass
class _Child:
    """One child process and the socket to it."""

    generation: int
    process: subprocess.Popen[bytes]
    conn: Connection
    reader: threading.Thread | None = None


@dataclass(frozen=True, slots=True)
class Failed:
    """A request the child answered with an exception (sent as the answer)."""

    error: BaseException


class ChildLink:
    """The worker's side of a process-mode manager: forwards, mirrors, restarts.

    Used only on the manager's thread, but for the reader thread that puts
    the child's words into the manager's mailbox and sets the answers of
    forwarded asks.

    Args:
        connection: A ``redis.Redis`` client or a URL (see :func:`connection_spec`).
        keys: The queue's keys.
        timing: The manager's windows.
        safety_margin: The manager's default margin, in ms.
        max_batch: Most ids per script call.
        max_hold: The manager's ``max_hold``, or ``None``.
        mirror: The manager's job table, kept here as a mirror of the child's claims.
        reporter: The manager's reporter: its callbacks run here.
        mailbox: Puts a message in the manager's mailbox.
        idle: Whether the manager's mailbox is empty.
        tell: Tells targets their :class:`~actors.LockLost`, on the manager's thread.
        stop: Stops the manager (when the child cannot be started again).

    Raises:
        TypeError: ``connection`` cannot be used from a child process.
        ValueError: The client's encoding is not UTF-8.
        RuntimeError: The child did not start.
    """

    def __init__(
        self,
        *,
        connection: object,
        keys: QueueKeys,
        timing: Timing,
        safety_margin: int,
        max_batch: int,
        max_hold: int | None,
        mirror: JobTable,
        reporter: Reporter,
        mailbox: Callable[[Any], None],
        idle: Callable[[], bool],
        tell: Callable[[list[tuple[Notify, LockLost]]], None],
        stop: Callable[[], object],
    ) -> None:
        self._keys = keys
        self._timing = timing
        self._max_hold = max_hold
        self._mirror = mirror
        #: The targets of each lock the child reported lost, until it tells each of them.
        self._ended: dict[tuple[str, str], tuple[list[Notify], LockLost]] = {}
        self._reporter = reporter
        self._post = mailbox
        self._idle = idle
        self._tell = tell
        self._stop_manager = stop
        self._config: dict[str, Any] = {
            "connection": connection_spec(connection),
            "queue": keys.name,
            "prefix": keys.prefix,
            "lock_duration": timing.lock_duration,
            "lock_renew_time": timing.lock_renew_time,
            "safety_margin": safety_margin,
            "max_batch": max_batch,
            "max_hold": max_hold,
            "renewed": reporter.wants("on_locks_renewed"),
            "errors": reporter.wants("on_error"),
            "log_level": logging.getLogger("actors").getEffectiveLevel(),
            "parent": os.getpid(),
            "slots": SLOTS,
        }
        self._memfd = _shared_memory(SLOTS * 16)
        self._map = mmap.mmap(self._memfd, SLOTS * 16)
        self._cells = memoryview(self._map).cast("q")
        self._free = list(range(SLOTS - 1, -1, -1))
        #: Slot of each (target id, job) whose deadline is shared, and its serial.
        self._slots: dict[tuple[int, str], tuple[int, int]] = {}
        self._serials = itertools.count(1)
        self._warned_full = False
        #: Targets by the id the child knows them by, and back (by identity).
        self._targets: dict[int, Notify] = {}
        self._tids: dict[int, int] = {}
        self._next_tid = itertools.count(1)
        self._prune_at = 256
        #: Forwarded asks not answered yet: request id to (word, answer).
        self._pending: dict[int, tuple[tuple[Any, ...], pykka.Future[Any]]] = {}
        self._requests = itertools.count(1)
        self._outbox: list[tuple[Any, ...]] = []
        self._restarts: list[float] = []
        self._generations = itertools.count(1)
        self._closing = False
        self._child: _Child | None = None
        try:
            self._child = self._spawn()
        except BaseException:
            self._release()
            raise

    # -- the child's life -------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The running child's process id, or ``None``."""
        return None if self._child is None else self._child.process.pid

    def _spawn(self) -> _Child:
        """Start a child and wait until it says it is ready.

        Raises:
            RuntimeError: It did not start, or said why it could not.
        """
        ours, theirs = socket.socketpair()
        try:
            process = subprocess.Popen(
                [sys.executable, "-c", _BOOT, _ROOT, str(theirs.fileno()), str(self._memfd)],
                pass_fds=(theirs.fileno(), self._memfd),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        conn = Connection(ours.detach())
        try:
            conn.send([("start", self._config)])
            if not conn.poll(START_TIMEOUT_S):
                raise RuntimeError(f"the child did not start within {START_TIMEOUT_S:g} s")
            words = conn.recv()
        except BaseException as exc:
            conn.close()
            _end(process)
            if isinstance(exc, EOFError):
                raise RuntimeError(
                    f"the child process exited with code {process.returncode} before it "
                    "was ready (see its output above)"
                ) from None
            raise
        kind, detail = words[0]
        if kind != "ready":
            conn.close()
            _end(process)
            if isinstance(detail, Exception):
                raise detail
            raise RuntimeError(f"the child process could not start: {detail}")
        return _Child(next(self._generations), process, conn)

    def start(self) -> None:
        """Start reading the child's words (from the manager's ``on_start``)."""
        child = self._child
        if child is not None and child.reader is None:
            child.reader = threading.Thread(
                target=self._read,
                args=(child,),
                name=f"LockManager-child-{self._keys.name}",
                daemon=True,
            )
            child.reader.start()

    def close(self) -> None:
        """Stop the child (its locks are left to the worker's own release) and free all."""
        self._closing = True
        child, self._child = self._child, None
        if child is not None:
            with contextlib.suppress(OSError, ValueError):
                child.conn.send([*self._outbox, ("stop",)])
            self._outbox = []
            try:
                child.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                logger.warning(
                    "LockManager for queue %r: the child process did not stop; killed",
                    self._keys.name,
                )
            _end(child.process)
            child.conn.close()
            if child.reader is not None and child.reader is not threading.current_thread():
                child.reader.join(STOP_TIMEOUT_S)
        self._fail_pending()
        self._release()

    def _release(self) -> None:
        # The map stays while a lease holds a view of it; the descriptor goes.
        with contextlib.suppress(OSError):
            os.close(self._memfd)

    def _fail_pending(self) -> None:
        pending, self._pending = self._pending, {}
        for _, answer in pending.values():
            error = ManagerStopped(f"LockManager for queue {self._keys.name!r} is stopped")
            answer.set_exception((ManagerStopped, error, None))

    def _read(self, child: _Child) -> None:
        """Read the child's words until it is gone (the reader thread)."""
        while True:
            try:
                words = child.conn.recv()
            except (EOFError, OSError):
                break
            except Exception:
                logger.warning("LockManager: an unreadable word from the child", exc_info=True)
                continue
            for word in words:
                self._take(word)
        if not self._closing:
            self._put(ChildEvent("down", (child.generation,)))

    def _take(self, word: tuple[Any, ...]) -> None:
        kind = word[0]
        if kind == "reply":
            _, request, value = word
            entry = self._pending.pop(request, None)
            if entry is None:
                return
            answer = entry[1]
            if isinstance(value, Failed):
                error = value.error
                answer.set_exception((type(error), error, None))
            else:
                answer.set(value)
        elif kind == "log":
            _, level, name, text = word
            logging.getLogger(name).log(level, "%s", text)
        else:
            self._put(ChildEvent(kind, word[1:]))

    def _put(self, event: ChildEvent) -> None:
        with contextlib.suppress(pykka.ActorDeadError):
            self._post(Envelope(event, reply_to=None))

    # -- forwarding (the manager's thread) --------------------------------

    def receive(self, message: Any, envelope: Any) -> Any:
        """Handle a message the manager took from its mailbox.

        An ask forwarded to the child takes the envelope's answer, to set it
        when the child replies: pykka then sets nothing.
        """
        try:
            return self._receive(message, envelope)
        finally:
            # Sent once the mailbox is empty (or the batch full): a burst of
            # tracks costs one write, a lone untrack goes at once.
            if self._outbox and (len(self._outbox) >= _BATCH or self._idle()):
                self._flush()

    def _receive(self, message: Any, envelope: Any) -> Any:
        kind = type(message)
        if kind is ChildEvent:
            self._on_event(message)
            return None
        reply = getattr(envelope, "reply_to", None) if envelope is not None else None
        if kind is TrackJob:
            return self._track(message, reply is not None)
        if kind is UntrackJob:
            # Answered here, once the mirror has let go: whatever the child
            # still reports of the claim is dropped (see _on_event), so no
            # loss can reach anyone after the answer, as in thread mode.
            word = self._untrack(message)
            if word is not None:
                self._outbox.append((*word, None))
            return None
        if kind is ExtendLocks:
            if reply is None:
                self._outbox.append(("extend", None))
            else:
                self._ask(("extend",), reply, envelope)
            return None
        query = _QUERIES.get(kind)
        if query is not None:
            if reply is not None:
                argument = message.job_id if kind is IsTracked else None
                self._ask(("ask", query, argument), reply, envelope)
            return None
        logger.warning(
            "LockManager for queue %r ignored an unknown %s message", self._keys.name, kind.__name__
        )
        return None

    def handle(self, message: Any) -> Any:
        """Handle ``message`` asked from the manager's own thread (a callback): now.

        Raises:
            pykka.Timeout: The child did not answer a query in time.
        """
        if type(message) is TrackJob:
            return self._track(message, True)
        if type(message) is UntrackJob:
            word = self._untrack(message)
            if word is not None:
                self._outbox.append((*word, None))
            self._flush()
            return None
        answer: pykka.ThreadingFuture[Any] = pykka.ThreadingFuture()
        if type(message) is ExtendLocks:
            self._ask(("extend",), answer, None)
        elif type(message) in _QUERIES:
            argument = message.job_id if type(message) is IsTracked else None
            self._ask(("ask", _QUERIES[type(message)], argument), answer, None)
        else:
            return None
        self._flush()
        return answer.get(timeout=OWN_THREAD_TIMEOUT_S)

    def _ask(self, word: tuple[Any, ...], reply: pykka.Future[Any], envelope: Any) -> None:
        request = next(self._requests)
        full = (*word, request)
        self._pending[request] = (full, reply)
        if envelope is not None:
            envelope.reply_to = None  # answered when the child replies
        self._outbox.append(full)

    def _track(self, message: TrackJob, asked: bool) -> Validity | None:
        # Built again: a message changed after it was built raises here (dropped).
        message = TrackJob(
            message.job_id,
            message.token,
            message.ts,
            message.notify,
            message.max_hold,
            message.keep,
            message.safety_margin,
        )
        job_id, token, notify = message.job_id, message.token, message.notify
        margin = message.safety_margin
        if margin is not None:
            margin = check_safety_margin(margin, self._timing)
        now = monotonic_ms()
        ts = now if message.ts is None or message.ts > now else message.ts
        max_hold = message.max_hold if message.max_hold is not None else self._max_hold
        self._mirror.track(job_id, token, ts, notify, max_hold, message.keep, margin)
        tid = None if notify is None else self._target_id(notify)
        slot: tuple[int, int] | None = None
        if asked and tid is not None:
            validity = self._mirror.valid.get(job_id)
            span = (
                validity.span
                if validity is not None
                else self._timing.lock_duration - (margin or 0)
            )
            slot = self._slot(tid, job_id, ts, span)
        self._outbox.append(("track", job_id, token, ts, tid, max_hold, message.keep, margin, slot))
        if slot is None:
            return None
        return SharedValidity(self._cells, slot[0])

    def _untrack(self, message: UntrackJob) -> tuple[Any, ...] | None:
        message = UntrackJob(message.job_id, message.token, message.notify)
        notify = message.notify
        self._mirror.untrack(message.job_id, message.token, notify)
        tid = None
        if notify is not None:
            tid = self._tids.get(id(notify))
            if tid is None:
                return None  # a target the child never heard of holds nothing there
        return ("untrack", message.job_id, message.token, tid)

    def _claims(self, message: LockLost, target: Notify) -> bool:
        """Whether ``target`` claims the lock ``message`` speaks of, or did until its loss."""
        key = (message.job_id, message.token)
        ended = self._ended.get(key)
        if ended is not None and any(t is target for t in ended[0]):
            ended[0][:] = [t for t in ended[0] if t is not target]
            if not ended[0]:
                del self._ended[key]
            return True
        if self._mirror.tokens.get(message.job_id) != message.token:
            return False
        watch = self._mirror.watches.get(message.job_id)
        return watch is not None and any(claim.target is target for claim in watch.claims)

    def _target_id(self, target: Notify) -> int:
        tid = self._tids.get(id(target))
        if tid is None:
            if len(self._targets) >= self._prune_at:
                self._prune()
            tid = next(self._next_tid)
            self._tids[id(target)] = tid
            self._targets[tid] = target
        return tid

    def _prune(self) -> None:
        """Forget the targets that claim nothing any more, here and in the child."""
        live = {
            id(claim.target)
            for watch in self._mirror.watches.values()
            for claim in watch.claims
            if claim.target is not None
        }
        dropped = [tid for tid, target in self._targets.items() if id(target) not in live]
        for tid in dropped:
            del self._tids[id(self._targets.pop(tid))]
        self._prune_at = max(256, 2 * len(self._targets))
        if dropped:
            self._outbox.append(("drop", dropped))

    def _slot(self, tid: int, job_id: str, ts: int, span: int) -> tuple[int, int] | None:
        held = self._slots.get((tid, job_id))
        if held is not None:
            return held
        if not self._free:
            if not self._warned_full:
                self._warned_full = True
                logger.warning(
                    "LockManager for queue %r: more than %d watched locks at once; the "
                    "newest leases read their deadline from the manager's word only",
                    self._keys.name,
                    SLOTS,
                )
            return None
        slot = (self._free.pop(), next(self._serials))
        at = 2 * slot[0]
        # Until the child confirms the claim, the deadline the lock earned by being taken.
        self._cells[at] = ts
        self._cells[at + 1] = ts + span
        self._slots[(tid, job_id)] = slot
        return slot

    def _flush(self) -> None:
        outbox, self._outbox = self._outbox, []
        child = self._child
        if child is None or not outbox:
            return
        try:
            child.conn.send(outbox)
        except (OSError, ValueError):
            # The child is gone: its reader says so, and the restart sends
            # the mirror and every ask still waiting.
            logger.debug("LockManager for queue %r: the child is gone", self._keys.name)

    # -- the child's words, on the manager's thread ------------------------

    def _on_event(self, event: ChildEvent) -> None:
        kind, payload = event.kind, event.payload
        if kind == "renewed":
            self._reporter.call("on_locks_renewed", payload[0])
        elif kind == "lost":
            self._on_lost(payload[0])
        elif kind == "error":
            self._reporter.call("on_error", payload[0])
        elif kind == "told":
            self._on_told(*payload)
        elif kind == "freed":
            for tid, job_id, slot in payload[0]:
                if self._slots.get((tid, job_id)) == slot:
                    del self._slots[(tid, job_id)]
                    self._free.append(slot[0])
        elif kind == "down":
            self._tell_the_ended()
            self._on_down(payload[0])

    def _on_lost(self, reported: list[LostLock]) -> None:
        # Only what the mirror still tracks: a loss the child found after the
        # worker untracked the job here is no loss of the worker's.
        tokens = self._mirror.tokens
        lost = [item for item in reported if tokens.get(item.job_id) == item.token]
        for item in lost:
            ended = self._mirror.untrack(item.job_id, item.token, everyone=True)
            targets = [] if ended is None else [c.target for c in ended[1] if c.target]
            if targets:
                # Each target's word follows from the child ("told"): still theirs to hear.
                word = LockLost(item.job_id, item.token, item.reason, item.detail)
                self._ended[(item.job_id, item.token)] = (targets, word)
        if lost:
            self._reporter.call("on_lock_renewal_failed", lost)

    def _on_told(self, tid: int, message: object) -> None:
        target = self._targets.get(tid)
        if target is not None and isinstance(message, LockLost) and self._claims(message, target):
            self._mirror.untrack(message.job_id, message.token, target)
            self._tell([(target, message)])

    def _tell_the_ended(self) -> None:
        """Tell the targets of a lost lock whose word died with the child."""
        ended, self._ended = self._ended, {}
        self._tell([(target, word) for targets, word in ended.values() for target in targets])

    def _on_down(self, generation: int) -> None:
        child = self._child
        if self._closing or child is None or child.generation != generation:
            return
        _end(child.process)
        child.conn.close()
        logger.warning(
            "LockManager for queue %r: its child process ended (exit code %s); starting another",
            self._keys.name,
            child.process.returncode,
        )
        now = time.monotonic()
        self._restarts = [t for t in self._restarts if now - t < RESTART_WINDOW_S]
        self._restarts.append(now)
        self._child = None
        if len(self._restarts) > MAX_RESTARTS:
            logger.error(
                "LockManager for queue %r: its child process ended %d times within %g s; "
                "the manager stops",
                self._keys.name,
                len(self._restarts),
                RESTART_WINDOW_S,
            )
            self._stop_manager()
            return
        try:
            self._child = self._spawn()
        except Exception:
            logger.exception(
                "LockManager for queue %r: its child process could not be started again; "
                "the manager stops",
                self._keys.name,
            )
            self._stop_manager()
            return
        self.start()
        self._restore()

    def _restore(self) -> None:
        """Give a new child every claim of the mirror, then every ask still waiting."""
        mirror, cells = self._mirror, self._cells
        live: set[tuple[int, str]] = set()
        self._outbox = []
        for job_id in mirror.ids():
            token = mirror.tokens[job_id]
            ts = mirror.stamps[job_id]
            for claim in mirror.claims(job_id):
                tid = None if claim.target is None else self._tids.get(id(claim.target))
                slot = None if tid is None else self._slots.get((tid, job_id))
                if slot is not None:
                    assert tid is not None
                    live.add((tid, job_id))
                    # The deadline the dead child confirmed last stands.
                    ts = max(ts, int(cells[2 * slot[0]]))
            for claim in mirror.claims(job_id):
                tid = None if claim.target is None else self._target_id(claim.target)
                slot = None if tid is None else self._slots.get((tid, job_id))
                max_hold = None if claim.deadline is None else max(1, claim.deadline - ts)
                self._outbox.append(
                    ("track", job_id, token, ts, tid, max_hold, claim.keep, claim.margin, slot)
                )
        for key in [key for key in self._slots if key not in live]:
            self._free.append(self._slots.pop(key)[0])
        for request in sorted(self._pending):
            self._outbox.append(self._pending[request][0])
        # Renew what is due at once: the locks aged while no child ran.
        self._outbox.append(("extend", None))
        self._flush()


def _shared_memory(size: int) -> int:
    """Return a descriptor of ``size`` bytes of shared memory that no file names."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("actors-deadlines", os.MFD_CLOEXEC)
    else:  # pragma: no cover (macOS: an unlinked temporary file)
        with tempfile.TemporaryFile() as file:
            fd = os.dup(file.fileno())
    os.ftruncate(fd, size)
    return fd


def _end(process: subprocess.Popen[bytes]) -> None:
    """Kill ``process`` if it still runs, and reap it: no zombie is left."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(STOP_TIMEOUT_S)


def link_for(manager: Any, connection: object, keys: QueueKeys, settings: Any) -> ChildLink:
    """Build the child link of a process-mode ``manager`` (a ``LockManager`` being built).

    Its job table becomes the mirror of the child's claims; the child's words
    reach it through its mailbox, and its reporter passes them on.
    """
    mailbox = manager._mailbox
    return ChildLink(
        connection=connection,
        keys=keys,
        timing=settings.timing,
        safety_margin=settings.safety_margin,
        max_batch=settings.max_batch,
        max_hold=settings.max_hold,
        mirror=manager._jobs,
        reporter=manager._reporter,
        mailbox=mailbox.put,
        idle=mailbox.empty,
        tell=manager._tell_now,
        stop=lambda: manager._actor_ref.stop(block=False),
    )
