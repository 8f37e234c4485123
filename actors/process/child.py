"""The child of a process-mode manager: its timer, its renewals, its cleanup when the worker dies.

It holds no claim and tells no target: the worker's manager tells it each
lock's state (``set``, ``drop``). The child renews on its own grid with its own
client, writes each watched lock's confirmation into its cell, and says what
each tick did (a :class:`~actors.process.shared.Tick`) through a writer
thread, so no renewal waits for a worker that reads nothing (a GIL hold).

When the worker is gone (the socket closes, or its pidfd says it ended), the
child deletes each lock that still holds its token and exits. Told to stop,
it leaves the locks alone: the worker releases its own.

A take (:mod:`actors.process.take`) runs on a thread and a client of its own,
so the renewals never wait behind one; the job it took is tracked, watched,
before the worker hears of it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import queue
import signal
import threading
import time
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Any, Final

import msgpack
from redis.exceptions import NoScriptError

from actors.books import Books, Report
from actors.connection import client_for_url, client_like, client_settings, command_timeout
from actors.keys import QueueKeys
from actors.messages import BatchOutcome, NotReplicatedError
from actors.process.shared import Tick, Writer, map_cells
from actors.scripts import RedisRenewer, Replicas, untrusted_take
from actors.timing import Timing, monotonic_ms, next_tick, yield_interpreter

if TYPE_CHECKING:
    from collections.abc import Callable

    import redis

__all__ = ["main", "portable"]

logger = logging.getLogger("actors.process.child")

#: Most seconds the child waits for its last words to go out as it ends.
WAIT_S: Final = 5.0
#: First pause before a failed tick is tried again, in ms (as the worker's manager).
RETRY_MS: Final = 10


class _Watched:
    """The one target of every watched lock in the child: the lock is renewed at every tick."""

    def tell(self, message: object) -> None:
        """Nobody to tell here: the worker's manager tells the real targets."""


_WATCHED: Final = _Watched()


def portable(error: BaseException) -> Exception:
    """Return ``error`` if it crosses a pickle unchanged in type, else a ``RuntimeError`` of it."""
    try:
        if isinstance(error, Exception) and type(pickle.loads(pickle.dumps(error))) is type(error):
            return error
    except Exception:  # any failure to pickle means: describe it instead
        pass
    return RuntimeError(f"{type(error).__name__}: {error}")


def main(argv: list[str]) -> int:
    """Run the child: ``argv`` holds the socket's and the shared memory's descriptors.

    Returns:
        The exit code: 0 once stopped or once the worker is gone, 1 if it could not start.
    """
    # A Ctrl-C reaches the terminal's whole group: the child ends after its worker.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn = Connection(int(argv[0]))
    out = Writer(conn, "child-writer")  # the one thread that writes the socket
    try:
        config = conn.recv()[0][1]
        child = Child(conn, out, int(argv[1]), config)
    except BaseException as exc:
        out.put(("failed", portable(exc)))
        out.close(WAIT_S)
        return 1
    child.ready()
    return child.run()


class _LogForward(logging.Handler):
    """Sends the child's log lines to the worker, which logs them as its own."""

    def __init__(self, post: Callable[..., None], level: int) -> None:
        super().__init__(level)
        self._post = post
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        """Send one record, formatted (with its traceback, if any)."""
        try:
            self._post(("log", record.levelno, record.name, self.format(record)))
        except Exception:
            self.handleError(record)


class Child:
    """The child's state: its locks, its grid, its client, the cells and the writer."""

    def __init__(self, conn: Connection, out: Writer, memfd: int, config: dict[str, Any]) -> None:
        self._conn = conn
        self._out = out
        self._map, self._cells = map_cells(memfd, config["slots"])
        os.close(memfd)
        self._parent: int = config["parent"]
        self._pidfd = _parent_handle(self._parent)
        package = logging.getLogger("actors")
        package.propagate = False
        package.setLevel(config["log_level"])
        package.addHandler(_LogForward(self._out.put, config["log_level"]))
        self._keys = QueueKeys.as_bullmq_names(config["queue"], config["prefix"])
        self._timing = timing = Timing(config["lock_duration"], config["lock_renew_time"])
        margin = config["safety_margin"]
        self._client = client_like(config["connection"], timeout=command_timeout(timing, margin))
        self._renewer = RedisRenewer(self._client, self._keys, timing, margin, config["max_batch"])
        confirm = None if config["replicas"] is None else Replicas(*config["replicas"])
        # Checked by the worker (the wait included): no round trip here, where a
        # server that does not answer would hold up the child's start.
        self._renewer.replicas = confirm
        self._max_batch: int = config["max_batch"]
        # Margin 0: the child lets a watched lock go only once the server may
        # have expired it; the worker's manager, with the margin, decides first.
        self._books = Books(timing.lock_duration, 0)
        #: The cell of each watched lock that has one.
        self._slots: dict[str, int] = {}
        self._freed: list[int] = []
        self._requests: list[int] = []
        #: The worker's changes count in the last ``mark`` word read.
        self._mark: int | None = None
        self._grid = monotonic_ms() + timing.interval
        self._retry: int | None = None
        self._failed = 0
        self._taker = _Taker(config["connection"], timing.lock_duration, confirm)
        #: The token of each job a take took that the worker has not yet told of.
        self._fetched: dict[str, str] = {}

    def ready(self) -> None:
        """Tell the worker the child is ready, after any line logged so far; return once sent.

        Sent by the writer, the one thread that writes the socket, and in a batch
        of its own: the worker reads no further than this word before it runs.
        """
        sent = threading.Event()
        self._out.put(("ready", os.getpid()))
        self._out.then(sent.set)
        sent.wait()

    def run(self) -> int:
        """Serve the worker until it stops the child or is gone; return the exit code."""
        self._renewer.probe()
        watched: list[Any] = [self._conn, self._taker.wake]
        if self._pidfd is not None:
            watched.append(self._pidfd)
        while True:
            now = monotonic_ms()
            due_at = self._grid if self._retry is None else min(self._grid, self._retry)
            ready = wait(watched, max(0, due_at - now) / 1000)
            # Every word first, even once the worker is gone: its last tracks count.
            while self._conn in ready or self._conn.poll(0):
                ready = []
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
            if self._pidfd is not None and wait([self._pidfd], 0):
                return self._end(release=True)
            self._took()
            now = monotonic_ms()
            if now >= self._grid:
                self._tick("grid", now, self._grid)
                self._grid = next_tick(self._grid, self._timing.interval, monotonic_ms())
            elif self._retry is not None and now >= self._retry:
                self._retry = None
                self._tick("retry", now, now)
            elif self._requests:
                self._tick("now", now, now)

    def _handle(self, word: tuple[Any, ...]) -> None:
        kind = word[0]
        if kind == "set":
            job_id, token = word[1], word[2]
            taken = self._fetched.get(job_id)
            if taken is not None:
                if taken != token:
                    return  # an older lock of the job: the take's is the newest
                del self._fetched[job_id]
            self._set(*word[1:])
        elif kind == "drop":
            if word[1] not in self._fetched:
                self._drop(word[1])
        elif kind == "release":
            _, locks = word
            for job_id, token in locks:
                if self._fetched.get(job_id, token) == token:
                    self._drop(job_id)
            with contextlib.suppress(Exception):  # logged by the renewer; the TTL does the rest
                self._renewer.release(locks)
        elif kind == "retire":
            self._freed.extend(word[1])
        elif kind == "extend":
            self._requests.append(word[1])
        elif kind == "mark":
            self._mark = word[1]
        elif kind in ("source", "take", "untake"):
            self._take_word(word)

    def _take_word(self, word: tuple[Any, ...]) -> None:
        if word[0] != "untake":
            self._taker.put(word)
            return
        # The worker could not use what a take took: the lock is left to expire.
        _, job_id, token = word
        if self._fetched.get(job_id) == token:
            del self._fetched[job_id]
            self._drop(job_id)

    def _set(self, job_id: str, token: str, ts: int, watched: bool, slot: int | None) -> None:
        """Hold ``job_id``'s lock with ``token`` (taken at ``ts``), watched or not, in ``slot``."""
        jobs = self._books.jobs
        if jobs.tokens.get(job_id) != token:
            self._drop(job_id)
            jobs.track(job_id, token, ts)
        if watched and not jobs.watched(job_id):
            jobs.track(job_id, token, ts, _WATCHED, margin=0)
        elif not watched and jobs.watched(job_id):
            jobs.untrack(job_id, token, _WATCHED)
        self._slots.pop(job_id, None)
        if slot is not None:
            self._slots[job_id] = slot
            # What the worker knows of the lock may be older than this child's last renewal.
            self._cells[slot] = max(int(self._cells[slot]), jobs.stamps[job_id])

    def _took(self) -> None:
        """Track each job a take took, watched, then answer the take.

        A lock whose take was answered a renew window or more after its send
        is renewed first: the worker reads the lock's deadline from its cell.
        """
        answers = self._taker.answers()
        if not answers:
            return
        late = False
        tracked: list[str | None] = []
        for _, answer, token, slot, sent_ms, _, confirmed in answers:
            job_id = _taken_id(answer)
            if job_id is not None:
                try:
                    self._set(job_id, token, sent_ms, True, slot)
                    if not confirmed and slot is not None:
                        # Trusted for nothing: not the worker's send time of the take either.
                        self._cells[slot] = sent_ms
                except Exception:
                    # Answered as taking nothing here: its lock is left to expire.
                    logger.warning("the child could not track job %r", job_id, exc_info=True)
                    job_id = None
                else:
                    self._fetched[job_id] = token
                    late = late or sent_ms + self._timing.threshold < monotonic_ms()
            tracked.append(job_id)
        if late:
            now = monotonic_ms()
            self._tick("now", now, now)
        for (request, answer, _, _, sent, wall, _), job_id in zip(answers, tracked, strict=True):
            self._out.put(("took", request, answer, job_id, sent, wall))

    def _drop(self, job_id: str) -> None:
        self._books.jobs.untrack(job_id, everyone=True)
        self._slots.pop(job_id, None)

    def _tick(self, kind: str, now: int, at: int) -> None:
        books, jobs = self._books, self._books.jobs
        due, tokens, oldest = jobs.due(at, self._timing.threshold)
        outcome: BatchOutcome | BaseException = BatchOutcome([], [])
        if due:
            try:
                outcome = self._renewer(due, tokens)
            except BaseException as exc:
                outcome = exc
        answered = monotonic_ms()
        report = Report()
        # All renewed, nothing watched: stamped once the word is on its way.
        whole = bool(due) and books.renewed_whole(due, outcome, jobs.changes)
        if whole:
            report.renewed = due
        else:
            books.apply(due, tokens, outcome, at, answered, report)
        cells, slots = self._cells, self._slots
        if slots:
            for job_id in report.renewed:
                slot = slots.get(job_id)
                if slot is not None:
                    cells[slot] = at
        for lost in report.lost:
            slots.pop(lost.job_id, None)
        self._retry = None
        if report.error is not None:
            self._failed += 1
            pause = min(self._timing.interval // 4, RETRY_MS << min(self._failed - 1, 16))
            self._retry = answered + max(1, pause)
        else:
            self._failed = 0
        tick = Tick(
            kind=kind,
            at=at,
            late_ms=now - at if kind == "grid" else 0,
            jobs=len(due),
            calls=-(-len(due) // self._max_batch),
            elapsed_ms=float(answered - now),
            answered=answered,
            renewed=msgpack.packb(report.renewed),
            lost=[(lost.job_id, lost.token, lost.reason, lost.detail) for lost in report.lost],
            error=None if report.error is None else portable(report.error),
            unknown=report.unknown,
            oldest=oldest,
            # A job taken here that the worker does not hold yet: it checks the ids.
            mark=None if self._fetched else self._mark,
            requests=self._requests,
            freed=self._freed,
        )
        self._requests, self._freed = [], []
        self._out.put(("tick", tick))
        if whole:
            # In slices, yielding to the writer thread that sends the word.
            jobs.stamp(due, at, pause=yield_interpreter)

    def _end(self, *, release: bool) -> int:
        """When the worker is gone, delete the locks still holding its tokens; then exit (0)."""
        if release:
            jobs = self._books.jobs
            with contextlib.suppress(Exception):  # logged by the renewer; the TTL does the rest
                self._renewer.release(list(jobs.tokens.items()))
        self._taker.close()
        self._out.close(WAIT_S)
        self._client.close()
        return 0


class _Taker:
    """The child's takes, one at a time, on a thread and a client of their own.

    Never retried (a second run would take a second job) and waited for as
    long as the server takes to answer, as the worker's own client would.
    Each answer wakes the child's loop through :attr:`wake`.
    """

    def __init__(
        self, renewal: str | dict[str, Any], lock_duration: int, confirm: Replicas | None = None
    ) -> None:
        self._renewal = renewal
        self._connect_s = lock_duration / 1000
        self._lock_duration = lock_duration
        #: The replicas each take waits for, if any.
        self._confirm = confirm
        self._inbox: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._answers: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        #: Readable once an answer waits: the child's loop waits on it too.
        self.wake, self._ring = os.pipe()
        os.set_blocking(self.wake, False)
        self._thread: threading.Thread | None = None
        self._scripts: dict[int, Any] = {}

    def put(self, word: tuple[Any, ...]) -> None:
        """Queue a ``source`` or ``take`` word of the worker's."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="child-taker", daemon=True)
            self._thread.start()
        self._inbox.put(word)

    def answers(self) -> list[tuple[Any, ...]]:
        """The answers come since last asked.

        Each as ``(request, answer, token, slot, sent_ms, sent_wall_ms, confirmed)``:
        ``confirmed`` is false for a take the replicas did not confirm, whose
        ``sent_ms`` is then moved back by a lock's duration.
        """
        with contextlib.suppress(BlockingIOError):
            os.read(self.wake, 4096)
        found = []
        with contextlib.suppress(queue.Empty):
            while True:
                found.append(self._answers.get_nowait())
        return found

    def close(self) -> None:
        """End the thread once the take under way (if any) returns."""
        self._inbox.put(None)

    def _run(self) -> None:
        held: list[tuple[Any, ...] | None] = []
        while (word := held.pop() if held else self._inbox.get()) is not None:
            if word[0] == "source":
                _, key, script, client = word
                try:
                    self._scripts[key] = self._client(client).register_script(script)
                except Exception as exc:  # every take of it answers with the error
                    self._scripts[key] = portable(exc)
                continue
            takes = [word]
            if self._confirm is not None:
                # The takes waiting now share one wait, which vouches for every write
                # before it on its connection: a slow replica holds them up once, not
                # once each.
                with contextlib.suppress(queue.Empty):
                    while True:
                        more = self._inbox.get_nowait()
                        if more is None or more[0] != "take" or more[2] != word[2]:
                            held.append(more)
                            break
                        takes.append(more)
            for answered in self._take(takes):
                self._answers.put(answered)
            with contextlib.suppress(OSError):
                os.write(self._ring, b"!")

    def _take(self, takes: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        """Run the takes of one script; return their answers, in order.

        Each as ``(request, answer, token, slot, sent_ms, sent_wall_ms, confirmed)``.
        """
        script = self._scripts.get(takes[0][2])
        confirm = self._confirm
        outcomes: list[tuple[Any, NotReplicatedError | None]]
        try:
            if isinstance(script, Exception):
                raise script
            # Connected first: the lock's age counts from the script's send, not the connect's.
            pool = script.registered_client.connection_pool  # type: ignore[union-attr]
            pool.release(pool.get_connection())
            sent_ms, sent_wall_ms = monotonic_ms(), time.time_ns() // 1_000_000
            calls = [(keys, args) for _, _, _, keys, args, _, _ in takes]
            if confirm is None:
                [(keys, args)] = calls
                outcomes = [(script(keys=keys, args=args), None)]  # type: ignore[misc]
            else:
                outcomes = self._confirmed(script, calls, confirm)
        except Exception as exc:
            sent_ms, sent_wall_ms = monotonic_ms(), time.time_ns() // 1_000_000
            outcomes = [(exc, None)] * len(takes)
        answers = []
        for (_, request, _, _, _, token, slot), (reply, shortfall) in zip(
            takes, outcomes, strict=True
        ):
            sent, wall, confirmed = sent_ms, sent_wall_ms, True
            failed = isinstance(reply, Exception)
            answer = portable(reply) if failed else reply
            job_id = None if failed else _taken_id(answer)
            if shortfall is not None and job_id is not None:
                sent, wall = untrusted_take(job_id, (sent, wall), shortfall, self._lock_duration)
                confirmed = False
            answers.append((request, answer, token, slot, sent, wall, confirmed))
        return answers

    @staticmethod
    def _confirmed(
        script: Any, calls: list[tuple[list[Any], list[Any]]], confirm: Replicas
    ) -> list[tuple[Any, NotReplicatedError | None]]:
        """Run the takes, then the replicas' wait, in one round trip on one connection.

        A take answered NOSCRIPT is sent again as EVAL, with a wait of its own.
        Returns each take's answer (or error) and what its wait said.
        """
        outcomes: list[tuple[Any, NotReplicatedError | None]] = [(None, None)] * len(calls)
        todo = list(range(len(calls)))
        for command, body in (("EVALSHA", script.sha), ("EVAL", script.script)):
            pipe = script.registered_client.pipeline(transaction=False)
            for i in todo:
                keys, args = calls[i]
                pipe.execute_command(command, body, len(keys), *keys, *args)
            pipe.execute_command(*confirm.command())
            *replies, confirmed = pipe.execute(raise_on_error=False)
            shortfall = confirm.shortfall(confirmed)
            for i, reply in zip(todo, replies, strict=True):
                outcomes[i] = (reply, shortfall)
            todo = [
                i
                for i, reply in zip(todo, replies, strict=True)
                if isinstance(reply, NoScriptError)
            ]
            if not todo:
                break
        return outcomes

    def _client(self, given: dict[str, Any] | None) -> redis.Redis:
        if given is None:
            spec = self._renewal
            given = (
                client_settings(client_for_url(spec, timeout=self._connect_s))
                if isinstance(spec, str)
                else spec
            )
        # Undecoded: the worker decodes the answer as its own client would.
        settings = {**given, "decode_responses": False}
        return client_like(settings, timeout=self._connect_s, bounded=False, retries=0)


def _taken_id(answer: object) -> str | None:
    """The id of the job whose lock a ``moveToActive`` answer took (its second entry), if any."""
    if not isinstance(answer, list) or len(answer) < 2 or not answer[1]:
        return None
    job_id = answer[1]
    if not isinstance(job_id, bytes):
        return str(job_id)
    try:
        return job_id.decode()
    except UnicodeDecodeError:
        return None  # no job id of a worker's: not renewed, its lock expires


def _parent_handle(parent: int) -> int | None:
    """Return a descriptor readable once process ``parent`` ended (Linux' pidfd), or ``None``."""
    if hasattr(os, "pidfd_open"):
        with contextlib.suppress(OSError):
            return os.pidfd_open(parent)
    return None
