"""The child process of a process-mode manager: its timer, its renewals, its cleanup.

Started by :class:`actors._link.ChildLink` as ``python -c ... FD MEMFD``
with one end of a socket pair and the shared deadline memory. It runs an
ordinary thread-mode manager with its own Redis client, built from the
worker's URL or client settings, and does what the worker's manager asks.
Notify targets are known here by number: each has a stand-in whose ``tell``
sends the :class:`~actors.LockLost` back. Everything the child says goes
through one writer thread (see :mod:`actors._child_io`), so no renewal ever
waits for the worker (a worker whose GIL is held reads nothing for a while).

When the worker is gone (the socket closes, or, where Linux offers it, the
worker's process handle says it ended), the child deletes each lock it was
renewing with ``releaseLock-1.lua`` (only a lock that still holds its token)
and exits. Told to stop, it stops its manager and leaves the locks alone:
the worker releases its own.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import signal
import threading
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Any, Final

from actors._child_io import (
    RELEASE_SCRIPT,
    LogForward,
    Writer,
    parent_handle,
    portable,
    release_locks,
)
from actors._spawn import Failed
from actors.api import get_tracked_job_ids, start_link, stop
from actors.connection import client_like
from actors.jobs import Validity
from actors.keys import QueueKeys
from actors.lost import LockLost
from actors.messages import (
    ExtendLocks,
    GetStats,
    TrackJob,
    UntrackJob,
)
from actors.schedule import Timing

if TYPE_CHECKING:
    from collections.abc import Callable

    from actors.lost import LostLock

__all__ = ["RELEASE_SCRIPT", "main"]

logger = logging.getLogger(__name__)

#: Most seconds the child waits on its own manager (an answer, its stop).
WAIT_S: Final = 30.0

#: The queries the worker asks its child (the others its own job table answers).
_QUERIES: Final[dict[str, Callable[[Any], Any]]] = {"stats": lambda _: GetStats()}


def main(argv: list[str]) -> int:
    """Run the child: ``argv`` holds the socket's and the shared memory's descriptors.

    Returns:
        The exit code: 0 once stopped or once the worker is gone, 1 if the
        manager could not start.
    """
    # A Ctrl-C reaches the terminal's whole group: the child ends after its worker.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn = Connection(int(argv[0]))
    try:
        config = conn.recv()[0][1]
        child = _Child(conn, int(argv[1]), config)
    except BaseException as exc:
        with contextlib.suppress(Exception):
            conn.send([("failed", portable(exc))])
        return 1
    conn.send([("ready", os.getpid())])
    return child.run()


class _StandIn:
    """A worker's notify target, in the child: what it is told goes back to the worker."""

    __slots__ = ("_child", "tid")

    def __init__(self, child: _Child, tid: int) -> None:
        self._child = child
        self.tid = tid

    def tell(self, message: Any) -> None:
        """Send a :class:`~actors.LockLost` back to the worker's target."""
        if isinstance(message, LockLost):
            self._child.told(self.tid, message)


class _Child:
    """The child's state: its manager, the stand-ins, the slots, the writer."""

    def __init__(self, conn: Connection, memfd: int, config: dict[str, Any]) -> None:
        self._conn = conn
        self._out = Writer(conn)
        self._map = mmap.mmap(memfd, config["slots"] * 16)
        os.close(memfd)
        self._cells = memoryview(self._map).cast("q")
        self._parent: int = config["parent"]
        self._pidfd = parent_handle(self._parent)
        package = logging.getLogger("actors")
        package.propagate = False
        package.setLevel(config["log_level"])
        package.addHandler(LogForward(self._out.put, config["log_level"]))
        self._keys = QueueKeys(config["queue"], config["prefix"])
        timing = Timing(config["lock_duration"], config["lock_renew_time"])
        self._client = client_like(config["connection"], interval_ms=timing.interval)
        self._standins: dict[int, _StandIn] = {}
        #: The last token each job was tracked with: what its lock holds for this worker.
        self._tokens: dict[str, str] = {}
        self._prune_at = 4096
        #: Slots of the watched claims whose deadline is shared: (target, job) to
        #: (slot, serial) and the lock's validity. Guarded by ``_lock``.
        self._slots: dict[tuple[int, str], tuple[tuple[int, int], Validity]] = {}
        self._by_job: dict[str, set[int]] = {}
        self._lock = threading.Lock()
        self._manager = start_link(
            connection=self._client,
            keys=self._keys,
            lock_duration=timing.lock_duration,
            lock_renew_time=timing.lock_renew_time,
            on_lock_renewal_failed=self._lost,
            on_locks_renewed=self._renewed if config["renewed"] else self._write_renewed,
            on_error=self._error if config["errors"] else None,
            max_batch=config["max_batch"],
            max_hold=config["max_hold"],
            safety_margin=config["safety_margin"],
        )

    # -- the loop ------------------------------------------------------------

    def run(self) -> int:
        """Serve the worker until it stops the child or is gone; return the exit code."""
        self._out.start()
        watched: list[Any] = [self._conn]
        if self._pidfd is not None:
            watched.append(self._pidfd)
        if os.getppid() != self._parent:
            return self._end(release=True)
        while True:
            ready = wait(watched)
            if self._pidfd is not None and self._pidfd in ready:
                return self._end(release=True)
            try:
                words = self._conn.recv()
            except (EOFError, OSError):
                return self._end(release=True)
            for word in words:
                if word[0] == "stop":
                    return self._end(release=False)
                try:
                    self._handle(word)
                except Exception:
                    logger.warning("the child dropped a %r word", word[0], exc_info=True)

    def _handle(self, word: tuple[Any, ...]) -> None:
        kind = word[0]
        manager = self._manager
        if kind == "track":
            _, job_id, token, ts, tid, max_hold, keep, margin, slot = word
            self._tokens[job_id] = token
            notify = None if tid is None else self._standin(tid)
            message = TrackJob(job_id, token, ts, notify, max_hold, keep, margin)
            if slot is None:
                manager.tell(message)
            else:
                assert tid is not None
                self._register(tid, job_id, slot, manager.ask(message, timeout=WAIT_S))
            if len(self._tokens) > self._prune_at:
                self._prune_tokens()
        elif kind == "untrack":
            _, job_id, token, tid, request = word
            target = None if tid is None else self._standins.get(tid)
            if tid is not None:
                self._free(tid, job_id)
                if target is None:
                    self._answer(request, None)
                    return
            self._send(UntrackJob(job_id, token, target), request)
        elif kind == "ask":
            _, query, argument, request = word
            self._send(_QUERIES[query](argument), request)
        elif kind == "extend":
            self._send(ExtendLocks(), word[1])
        elif kind == "drop":
            for tid in word[1]:
                self._standins.pop(tid, None)
                with self._lock:
                    jobs = [job for (known, job) in self._slots if known == tid]
                for job_id in jobs:
                    self._free(tid, job_id)

    def _send(self, message: Any, request: int | None) -> None:
        if request is None:
            self._manager.tell(message)
            return
        answer = self._manager.ask(message, block=False)
        if hasattr(answer, "add_done_callback"):
            answer.add_done_callback(lambda done: self._reply(request, done))
        else:
            self._reply(request, answer)

    def _reply(self, request: int, answer: Any) -> None:
        try:
            value = answer.get(timeout=0)
        except BaseException as exc:
            value = Failed(portable(exc))
        self._out.put(("reply", request, value))

    def _answer(self, request: int | None, value: Any) -> None:
        if request is not None:
            self._out.put(("reply", request, value))

    def _standin(self, tid: int) -> _StandIn:
        standin = self._standins.get(tid)
        if standin is None:
            standin = self._standins[tid] = _StandIn(self, tid)
        return standin

    def _prune_tokens(self) -> None:
        tracked = set(get_tracked_job_ids(self._manager, timeout=WAIT_S))
        self._tokens = {job: token for job, token in self._tokens.items() if job in tracked}
        self._prune_at = max(4096, 2 * len(self._tokens))

    # -- shared deadlines ------------------------------------------------------

    def _register(self, tid: int, job_id: str, slot: tuple[int, int], validity: Any) -> None:
        """Share a watched claim's validity through its slot (or give the slot back)."""
        if not isinstance(validity, Validity):
            self._out.put(("freed", [(tid, job_id, slot)]))
            return
        with self._lock:
            self._slots[(tid, job_id)] = (slot, validity)
            self._by_job.setdefault(job_id, set()).add(tid)
            self._publish(job_id)

    def _publish(self, job_id: str) -> None:
        """Write the validity of ``job_id``'s lock in each of its slots (under the lock)."""
        cells = self._cells
        for tid in self._by_job.get(job_id, ()):
            (index, _), validity = self._slots[(tid, job_id)]
            # The deadline last: a reader that sees it sees its own send time's.
            cells[2 * index] = validity.confirmed
            cells[2 * index + 1] = validity.deadline

    def _free(self, tid: int, job_id: str) -> None:
        with self._lock:
            entry = self._slots.pop((tid, job_id), None)
            if entry is None:
                return
            tids = self._by_job[job_id]
            tids.discard(tid)
            if not tids:
                del self._by_job[job_id]
        self._out.put(("freed", [(tid, job_id, entry[0])]))

    # -- the manager's callbacks, on its thread ----------------------------------

    def _write_renewed(self, job_ids: list[str]) -> None:
        if self._by_job:
            with self._lock:
                for job_id in job_ids:
                    if job_id in self._by_job:
                        self._publish(job_id)

    def _renewed(self, job_ids: list[str]) -> None:
        self._write_renewed(job_ids)
        self._out.put(("renewed", job_ids))

    def _lost(self, lost: list[LostLock]) -> None:
        self._out.put(("lost", lost))

    def _error(self, error: Exception) -> None:
        self._out.put(("error", portable(error)))

    def told(self, tid: int, message: LockLost) -> None:
        """A stand-in was told of a loss: its slot is free, and its target is told."""
        self._free(tid, message.job_id)
        self._out.put(("told", tid, message))

    # -- the end ------------------------------------------------------------

    def _end(self, *, release: bool) -> int:
        """Stop the manager; when the worker is gone, release its locks first. Return 0."""
        ids: list[str] = []
        if release:
            try:
                ids = get_tracked_job_ids(self._manager, timeout=WAIT_S)
            except Exception:
                ids = list(self._tokens)
        with contextlib.suppress(Exception):
            stop(self._manager, timeout=WAIT_S)
        if release and ids:
            release_locks(self._client, self._keys, self._tokens, ids)
        self._out.close(WAIT_S)
        self._client.close()
        return 0
