"""Takes: a script that takes a job's lock, run by the child that renews the lock.

In process mode every thread of the worker may wait for its GIL (a C call that
holds it). A lock taken by a script the worker sends, and whose answer the
worker reads, would go unrenewed until such a hold ends. The child runs the
script instead, on a thread and a client of its own (never the renewal's),
tracks the job it took before it answers, and writes the lock's confirmations
into a cell reserved before the script was sent: the worker's deadline for
the lock is right however late the worker reads the answer.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from actors.timing import monotonic_ms

if TYPE_CHECKING:
    from collections.abc import Callable

    from actors.process.shared import Cells, Writer

__all__ = ["Source", "TakeLost", "Taken", "Takes"]

logger = logging.getLogger("actors.lock_manager")

_KEYS = itertools.count(1)


@dataclass(frozen=True, slots=True)
class Source:
    """What a take runs: a script, and the server it is sent to."""

    #: The script's text.
    script: str
    #: ``redis.Redis`` keywords of the client to send it with (the child
    #: builds its own, replies undecoded); ``None``: the renewal's server.
    client: dict[str, Any] | None = None
    #: Names the source to the child, which is sent it once.
    key: int = 0

    def __post_init__(self) -> None:
        if not self.key:
            object.__setattr__(self, "key", next(_KEYS))


@dataclass(frozen=True, slots=True)
class Taken:
    """What a take did: the server's answer, and the job whose lock the child now renews."""

    #: The reply as the server sent it (bytes undecoded), or the error the call raised.
    answer: Any
    #: The job whose lock it took, if any: tracked by the child before it answered.
    job_id: str | None
    #: When the script was sent, in monotonic ms (the lock is younger), and wall-clock ms.
    sent_ms: int
    sent_wall_ms: int
    #: Call when the worker cannot use what was taken: the child stops renewing the lock,
    #: which expires, and a stalled check hands the job on.
    let_go: Callable[[], None] = lambda: None


class TakeLost(redis.exceptions.ConnectionError):
    """The take's answer will never come: its child ended, or the manager stopped.

    A lock it may have taken is renewed by nobody: it expires, and a stalled
    check hands its job on.
    """


@dataclass(frozen=True, slots=True)
class _Pending:
    future: concurrent.futures.Future[Taken]
    slot: int | None
    token: str


class Takes:
    """The worker's side of the takes: sent to the current child, answered on the reader thread.

    Any thread may :meth:`take`; :meth:`attach` and :meth:`detach` follow
    the child's life, :meth:`answered` its words.
    """

    def __init__(self, cells: Cells, queue: str) -> None:
        self._cells = cells
        self._queue = queue
        self._lock = threading.Lock()
        self._requests = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        #: The running child's writer; ``None`` while none runs.
        self._writer: Writer | None = None
        #: The sources the running child was sent.
        self._sent: set[int] = set()

    def attach(self, writer: Writer) -> None:
        """A child runs, written to with ``writer``: takes go to it from now on."""
        with self._lock:
            self._writer = writer
            self._sent = set()

    def detach(self, why: str) -> None:
        """The child ended: each take it did not answer fails with :class:`TakeLost`."""
        with self._lock:
            self._writer = None
            pending, self._pending = self._pending, {}
        for request in pending.values():
            # Never written by the child, which is gone.
            if request.slot is not None:
                self._cells.give_back(request.slot)
            _settle(request.future, error=TakeLost(why))

    def take(
        self, source: Source, keys: list[Any], args: list[Any], token: str
    ) -> concurrent.futures.Future[Taken]:
        """Have the child run ``source`` with ``keys`` and ``args``, once; any thread.

        ``token`` is the lock's value were it taken: the child tracks the job
        with it. The future fails with :class:`TakeLost` if no child runs or
        it ends before it answers; the child never runs a take twice.
        """
        future: concurrent.futures.Future[Taken] = concurrent.futures.Future()
        _check_words(keys, "keys")
        _check_words(args, "args")
        if type(token) is not str or not token:
            raise TypeError(f"token must be a non-empty str, got {type(token).__name__}")
        with self._lock:
            writer = self._writer
            if writer is None:
                _settle(future, error=TakeLost(f"queue {self._queue!r}: no child process runs"))
                return future
            request = next(self._requests)
            slot = self._cells.reserve(monotonic_ms())
            self._pending[request] = _Pending(future, slot, token)
            words: list[tuple[Any, ...]] = []
            if source.key not in self._sent:
                self._sent.add(source.key)
                words.append(("source", source.key, source.script, source.client))
            words.append(("take", request, source.key, keys, args, token, slot))
            writer.put(*words)
        return future

    def answered(
        self, request: int, answer: Any, job_id: str | None, sent_ms: int, sent_wall_ms: int
    ) -> None:
        """The child's answer to ``request`` (the reader thread)."""
        with self._lock:
            pending = self._pending.pop(request, None)
        if pending is None:
            return
        slot = pending.slot
        if slot is not None:
            if job_id is None:
                self._cells.give_back(slot)
            else:
                # The child writes it for the job from now on: the lock's deadline reads it.
                self._cells.bind(job_id, slot)
        if job_id is None:
            _settle(pending.future, result=Taken(answer, None, sent_ms, sent_wall_ms))
            return
        token = pending.token

        def let_go() -> None:
            with self._lock:
                writer = self._writer
            if writer is not None:
                writer.put(("untake", job_id, token))
            if slot is not None:
                self._cells.unbind(job_id, slot)

        _settle(pending.future, result=Taken(answer, job_id, sent_ms, sent_wall_ms, let_go))


#: What a script's keys and arguments may be: what redis-py sends as they are.
_WORDS = (str, bytes, int, float)


def _check_words(words: object, name: str) -> None:
    if type(words) is not list or not all(type(word) in _WORDS for word in words):
        raise TypeError(f"{name} must be a list of str, bytes, int or float")


def _settle(
    future: concurrent.futures.Future[Taken],
    *,
    result: Taken | None = None,
    error: BaseException | None = None,
) -> None:
    """Answer ``future`` unless its waiter gave up on it (cancelled it)."""
    if not future.set_running_or_notify_cancel():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)  # type: ignore[arg-type]
