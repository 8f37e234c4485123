"""The worker's half of a process-mode manager: the same books and doors, renewals in a child.

A :class:`ProcessLockManager` keeps every claim, decides and tells as a
thread-mode manager does, but a child process (:mod:`actors.process.child`)
renews, with no GIL of the worker's in the way. The manager tells the child
each lock's state as it changes, applies what each of its ticks did, and keeps
the watched locks' deadlines with a timer of its own, reading the confirmations
the child writes into shared cells. A child that dies or hangs is replaced on
the reader thread and given every lock with its last confirmed renewal.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Final

import msgpack
import pykka
import redis
import redis.asyncio
from pykka._envelope import Envelope

import actors.messages as m
from actors.books import Report
from actors.connection import client_like, client_settings, command_timeout, encoding, is_cluster
from actors.lock_manager import Fired, LockManager, TicksFirst
from actors.process.shared import Cells, SharedValidity, Tick, Writer
from actors.process.take import Takes
from actors.scripts import DEFAULT_MAX_BATCH, Replicas, require_replicas, require_wait
from actors.telemetry import Log
from actors.timer import ThreadTimer
from actors.timing import DEFAULT_LOCK_DURATION, check_lock_duration, yield_interpreter

if TYPE_CHECKING:
    import concurrent.futures
    from collections.abc import Callable

    from actors.connection import Client
    from actors.keys import QueueKeys
    from actors.messages import LostLock, Renewer
    from actors.process.take import Source, Taken
    from actors.timer import TimerFactory

__all__ = [
    "MAX_RESTARTS",
    "RESTART_WINDOW_S",
    "START_TIMEOUT_S",
    "STOP_TIMEOUT_S",
    "ProcessLockManager",
    "connection_spec",
]

logger = Log("actors.lock_manager")

#: Most seconds a child may take to start and answer that it is ready.
START_TIMEOUT_S: Final = 30.0
#: Most seconds a stopping child is waited for before it is killed.
STOP_TIMEOUT_S: Final = 5.0
#: Restarts within :data:`RESTART_WINDOW_S` after which the manager gives up and stops.
MAX_RESTARTS: Final = 5
#: The window of :data:`MAX_RESTARTS`, in seconds.
RESTART_WINDOW_S: Final = 60.0
#: Words sent in one write at most.
_BATCH: Final = 512

#: The folder holding the package, put first on the child's path so that it
#: imports this very ``actors``, wherever it was imported from.
_ROOT: Final = str(Path(__file__).resolve().parents[2])
_BOOT: Final = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from actors.process.child import main; sys.exit(main(sys.argv[2:]))"
)


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
    try:
        settings = client_settings(connection)
    except TypeError:
        raise TypeError(
            "with isolation='process' the child process builds its own client, and this one "
            "does not name its server (a Sentinel-managed client?): pass the server's URL, "
            "redis+sentinel://host:26379[,host:port...]/service for a Sentinel-managed primary"
        ) from None
    try:
        pickle.dumps(settings)
    except Exception as exc:
        raise TypeError(
            "the client's settings cannot be sent to the child process "
            f"({type(exc).__name__}: {exc}): pass the server's URL instead"
        ) from None
    return settings


# -- the child's life ---------------------------------------------------------------


class Child:
    """One child process, the socket to it, and the thread that writes to it."""

    def __init__(
        self, generation: int, process: subprocess.Popen[bytes], conn: Connection, writer: Writer
    ) -> None:
        self.generation = generation
        self.process = process
        self.conn = conn
        self.writer = writer
        # The socket is shut and closed once each, whichever threads ask.
        self._socket_lock = threading.Lock()
        self._shut = self._closed = False

    def shut(self) -> None:
        """Kill the process if it still runs, reap it, and shut the socket both ways.

        Whoever still reads or writes the socket fails at once; its descriptor
        stays taken until :meth:`close`, so no thread that still holds its
        number can reach the next socket given that number.
        """
        end(self.process)
        with self._socket_lock:
            if self._shut or self._closed:
                return
            self._shut = True
            # shutdown(2) on a duplicate: it acts on the socket, the descriptor stays ours.
            with (
                contextlib.suppress(OSError, ValueError),
                socket.fromfd(self.conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as sock,
            ):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Shut the child, end its writer, and close the socket once the writer has ended."""
        self.shut()
        self.writer.close(0)
        self.writer.then(self._close_socket)

    def _close_socket(self) -> None:
        with self._socket_lock:
            if not self._closed:
                self._closed = True
                self.conn.close()


class ChildDied(RuntimeError):
    """The child process ended before it said it was ready; ``returncode`` is its exit code."""

    def __init__(self, returncode: int | None) -> None:
        super().__init__(
            f"the child process exited with code {returncode} before it was ready "
            "(see its output above)"
        )
        self.returncode = returncode


def spawn(config: dict[str, Any], memfd: int, generation: int) -> Child:
    """Start a child with ``config`` and the shared cells; wait until it is ready (or raise).

    A plain subprocess, not ``multiprocessing``: it imports no ``__main__`` again,
    starts no resource tracker, and passes exactly the socket and the cells.
    """
    ours, theirs = socket.socketpair()
    try:
        process = subprocess.Popen(
            [sys.executable, "-c", _BOOT, _ROOT, str(theirs.fileno()), str(memfd)],
            pass_fds=(theirs.fileno(), memfd),
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
        conn.send([("start", config)])
        kind, detail = _first_answer(conn, time.monotonic() + START_TIMEOUT_S)
    except BaseException as exc:
        conn.close()
        end(process)
        if isinstance(exc, (EOFError, OSError)):  # its end closed, or reset with words unread
            raise ChildDied(process.returncode) from None
        raise
    if kind != "ready":
        conn.close()
        end(process)
        if isinstance(detail, Exception):
            raise detail
        raise RuntimeError(f"the child process could not start: {detail}")
    return Child(generation, process, conn, Writer(conn, f"LockManager-child-writer-{generation}"))


def _first_answer(conn: Connection, deadline: float) -> tuple[str, Any]:
    """The child's ``ready`` or ``failed`` word; the lines it logged while it started are logged."""
    while True:
        if not conn.poll(max(0.0, deadline - time.monotonic())):
            raise RuntimeError(f"the child did not start within {START_TIMEOUT_S:g} s")
        for word in conn.recv():
            if word[0] == "log":
                relay(word)
            else:
                return word[0], word[1]


def relay(word: tuple[Any, ...]) -> None:
    """Log a line the child logged (its ``log`` word) as the worker's own."""
    _, level, name, text = word
    Log(name).log(level, "%s", text)


def end(process: subprocess.Popen[bytes]) -> None:
    """Kill ``process`` if it still runs, and reap it: no zombie is left."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(STOP_TIMEOUT_S)


@dataclass(frozen=True, slots=True)
class ChildSaid:
    """A word of the child's for the manager's thread (internal: never sent by users)."""

    #: ``"tick"`` (a :class:`Tick`), ``"up"`` (a new :class:`Child`), ``"hung"`` or ``"failed"``.
    kind: str
    payload: Any


# -- the manager ---------------------------------------------------------------------


class ProcessLockManager(LockManager, isolation="process"):
    """A :class:`~actors.LockManager` whose timer and renewals run in a child process.

    Start it with ``start_link(..., isolation="process")``. The same doors,
    messages, callbacks, leases and stats; ``connection`` must be a URL or a
    ``redis.Redis``, and ``renewer``, ``clock`` and ``timer`` are refused
    (they would be the worker's code in the child). Raises as ``start_link``
    does, and ``RuntimeError`` if the child process did not start.
    """

    #: The child hears of every job a take took: the worker's messages on it all go there.
    _skips_passing: ClassVar[bool] = False

    @staticmethod
    def _create_actor_inbox() -> TicksFirst:
        return TicksFirst(urgent=(Fired, ChildSaid))

    def __init__(
        self,
        *,
        connection: Client | str | None = None,
        keys: QueueKeys,
        lock_duration: int = DEFAULT_LOCK_DURATION,
        lock_renew_time: int | None = None,
        on_lock_renewal_failed: Callable[[list[LostLock]], object] | None = None,
        on_locks_renewed: Callable[[list[str]], object] | None = None,
        on_error: Callable[[Exception], object] | None = None,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_hold: int | None = None,
        renewer: Renewer | None = None,
        clock: Callable[[], int] | None = None,
        timer: TimerFactory | None = None,
        safety_margin: int | None = None,
        isolation: str = "process",
        replicas: int | Replicas | None = None,
    ) -> None:
        for name, given in (("renewer", renewer), ("clock", clock), ("timer", timer)):
            if given is not None:
                raise TypeError(
                    f"isolation='process' takes no {name}: the child process renews with its "
                    "own client, clock and timer"
                )
        self._cells = Cells(getattr(keys, "name", "?"))
        try:
            self._setup(
                keys=keys,
                lock_duration=lock_duration,
                lock_renew_time=lock_renew_time,
                on_lock_renewal_failed=on_lock_renewal_failed,
                on_locks_renewed=on_locks_renewed,
                on_error=on_error,
                max_batch=max_batch,
                max_hold=max_hold,
                clock=None,
                timer=None,
                safety_margin=safety_margin,
                validity=self._cells.validity,
            )
            check_lock_duration(self._timing.lock_duration)
            confirm = self._replicas(connection, replicas)
            self._confirm = confirm
            waits = None if confirm is None else (confirm.count, confirm.timeout, confirm.aof)
            self._config: dict[str, Any] = {
                "connection": connection_spec(connection),
                "queue": keys.name,
                "prefix": keys.prefix,
                "lock_duration": self._timing.lock_duration,
                "lock_renew_time": self._timing.lock_renew_time,
                "safety_margin": self.safety_margin,
                "max_batch": self._max_batch,
                "replicas": waits,
                "log_level": logging.getLogger("actors").getEffectiveLevel(),
                "parent": os.getpid(),
                "slots": self._cells.slots,
            }
            self._child: Child | None = spawn(self._config, self._cells.fd, 1)
        except BaseException:
            self._cells.close()
            raise
        self._books.jobs.touched = {}
        self._takes = Takes(self._cells, keys.name)
        self._takes.attach(self._child.writer)
        self._fence_lock = threading.Lock()
        #: The worker's client, given or built for fences (closed with the manager).
        self._given = connection if isinstance(connection, redis.Redis) else None
        self._built: redis.Redis | None = None
        self._outbox: list[tuple[Any, ...]] = []
        #: The table's changes count in the last ``mark`` word the child was sent.
        self._marked: int | None = None
        self._requests = itertools.count(1)
        #: Asked "renew now"s, answered once the child's tick says it ran them.
        self._extends: dict[int, pykka.Future[Any]] = {}
        self._closing = False
        self._reader: threading.Thread | None = None
        #: The last child the reader started: one the manager never took is ended at its stop.
        self._spawned: Child | None = None
        self._start_threads()
        _RUNNING.add(self)

    def _replicas(self, connection: object, replicas: object) -> Replicas | None:
        """Check ``replicas=`` against the child's wait per attempt (and ``WAITAOF``, once)."""
        timeout = command_timeout(self._timing, self.safety_margin)
        confirm = require_replicas(replicas, limit_ms=timeout * 1000)
        if confirm is not None:
            client = client_like(connection_spec(connection), timeout=timeout)
            try:
                require_wait(client, confirm)
            finally:
                client.close()
        return confirm

    @property
    def replicas(self) -> Replicas | None:
        """The replicas each renewal (in the child) and each lease's fence wait for, or ``None``."""
        return self._confirm

    def fencing(self) -> tuple[Client, QueueKeys]:
        """Return the worker's client for fences: the one given, or one built once from the URL."""
        if self._given is not None:
            return self._given, self.keys
        with self._fence_lock:
            if self._built is None:
                timeout = command_timeout(self._timing, self.safety_margin)
                self._built = client_like(self._config["connection"], timeout=timeout)
            return self._built, self.keys

    def taker(
        self,
    ) -> Callable[[Source, list[Any], list[Any], str], concurrent.futures.Future[Taken]]:
        """Return what runs a script that takes a job's lock in the child (see :mod:`.take`)."""
        return self._takes.take

    @property
    def pid(self) -> int | None:
        """The running child's process id, or ``None``."""
        child = self._child
        return None if child is None else child.process.pid

    # -- life -------------------------------------------------------------------------

    def _start_threads(self) -> None:
        child = self._child
        assert child is not None
        self._reporter.start()
        self._reader = threading.Thread(
            target=self._read,
            args=(child,),
            name=f"LockManager-child-{self.queue_name}",
            daemon=True,
        )
        self._reporter.records.attach(self._reader)
        self._reader.start()
        # The worker's own timer fires only for watched locks' deadlines: the grid is the child's.
        name = f"LockManager-timer-{self.queue_name}"
        timer = ThreadTimer(self._fire, name, self.clock, records=self._reporter.records)
        self._alarm.start(timer, grid=False)

    def _close_parts(self) -> None:
        self._closing = True
        self._takes.detach(f"the lock manager of queue {self.queue_name!r} stopped")
        child, self._child = self._child, None
        if child is not None:
            child.writer.put(*self._outbox, ("stop",))
            child.writer.close(STOP_TIMEOUT_S)
            self._outbox = []
            try:
                child.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                logger.warning(
                    "LockManager for queue %r: the child process did not stop; killed",
                    self.queue_name,
                    extra={"queue": self.queue_name},
                )
            child.shut()
        reader = self._reader
        if reader is not None and reader is not threading.current_thread():
            reader.join(STOP_TIMEOUT_S)
        if child is not None:
            child.close()  # once the reader is done with it
        late = self._spawned
        if late is not None and late is not child:
            late.close()  # started as the manager stopped, never handed to it: it holds nothing
        extends, self._extends = self._extends, {}
        for reply in extends.values():
            reply.set(None)
        timer = self._alarm.close()
        if timer is not None:
            timer.close()
        self._cells.close()
        if self._built is not None:
            self._built.close()

    # -- the child's words, on the reader thread ------------------------------------------

    def _read(self, child: Child) -> None:
        """Read the child's words; start another child when one dies or hangs (the reader thread).

        The child says something at every tick of its grid: silent for a whole
        trust window, it is hung (stopped, or stuck in a call), and is killed
        so that another renews the locks that still hold.
        """
        restarts: list[float] = []
        # A healthy child is silent an interval and a tick at most (a tick fits in the
        # trust window less an interval); three intervals leave a starved child room.
        silence_s = max(self.trusted_for(), 3 * self._timing.interval) / 1000
        hung = False
        while True:
            try:
                if not child.conn.poll(silence_s) and not self._closing:
                    why = (
                        f"LockManager for queue {self.queue_name!r}: its child process said "
                        f"nothing for {silence_s:g} s (hung?); killed, to start another"
                    )
                    logger.warning("%s", why, extra={"queue": self.queue_name})
                    end(child.process)
                    self._said(ChildSaid("hung", why))
                    hung = True
                    continue
                words = child.conn.recv()
            except (EOFError, OSError):
                self._takes.detach(
                    f"the child process of queue {self.queue_name!r} ended during the take"
                )
                if self._closing:
                    return
                # A hung child killed is no crash: only deaths count toward giving up.
                started = self._restart(child, [] if hung else restarts)
                hung = False
                if started is None:
                    return
                child = started
                continue
            except Exception:
                logger.warning(
                    "LockManager: an unreadable word from the child",
                    exc_info=True,
                    extra={"queue": self.queue_name},
                )
                continue
            for word in words:
                if word[0] == "log":
                    relay(word)
                elif word[0] == "tick":
                    self._said(ChildSaid("tick", word[1]))
                elif word[0] == "took":
                    self._takes.answered(*word[1:])

    def _restart(self, child: Child, restarts: list[float]) -> Child | None:
        """Start the next child off the manager's thread; ``None`` when the manager must stop.

        A child killed by a signal before it was ready (an OOM kill, say) is
        one more restart: the next is started, within the same budget.
        """
        child.close()
        logger.warning(
            "LockManager for queue %r: its child process ended (exit code %s); starting another",
            self.queue_name,
            child.process.returncode,
            extra={"queue": self.queue_name},
        )
        generation = child.generation
        while True:
            now = time.monotonic()
            restarts[:] = [t for t in restarts if now - t < RESTART_WINDOW_S]
            restarts.append(now)
            if len(restarts) > MAX_RESTARTS:
                why = (
                    f"LockManager for queue {self.queue_name!r}: its child process ended "
                    f"{len(restarts)} times within {RESTART_WINDOW_S:g} s; the manager stops "
                    "and renews nothing more"
                )
                logger.error("%s", why, extra={"queue": self.queue_name})
                self._said(ChildSaid("failed", why))
                return None
            generation += 1
            try:
                started = spawn(self._config, self._cells.fd, generation)
                break
            except ChildDied as died:
                if self._closing:
                    return None
                if died.returncode is not None and died.returncode < 0:
                    logger.warning(
                        "LockManager for queue %r: its next child process was killed "
                        "(exit code %s) before it was ready; starting another",
                        self.queue_name,
                        died.returncode,
                        extra={"queue": self.queue_name},
                    )
                    continue
                self._gave_up()
                return None
            except Exception:
                if self._closing:
                    return None
                self._gave_up()
                return None
        self._spawned = started
        if self._closing or not self._said(ChildSaid("up", started)):
            started.close()  # the manager stopped meanwhile: nobody else would
            return None
        self._takes.attach(started.writer)
        return started

    def _gave_up(self) -> None:
        """Log and say that no child could be started again (with the error being handled)."""
        why = (
            f"LockManager for queue {self.queue_name!r}: its child process could not be "
            "started again; the manager stops and renews nothing more"
        )
        logger.exception("%s", why, extra={"queue": self.queue_name})
        self._said(ChildSaid("failed", why))

    def _said(self, said: ChildSaid) -> bool:
        """Hand ``said`` to the manager's thread; ``False`` once it stops taking messages."""
        with contextlib.suppress(pykka.ActorDeadError):
            self._mailbox.put(Envelope(said, reply_to=None))
            return True
        return False

    # -- messages ------------------------------------------------------------------------

    def on_receive(self, message: Any) -> Any:
        """Handle one message, answer it, then tell the child what changed."""
        later: tuple[pykka.Future[Any], Any] | None = None
        try:
            answer = super().on_receive(message)
            envelope = self._mailbox.current
            if envelope.reply_to is not None and envelope.message is message:
                if type(message) is m.TrackJob:
                    # Answered once the lock is in the child's socket: the asker may
                    # then hold the GIL, and the child renews the lock meanwhile.
                    later = (envelope.reply_to, answer)
                else:
                    # Answered before the write to the child: the asker waits for the books.
                    envelope.reply_to.set(answer)
                envelope.reply_to = None
        finally:
            self._sync(sent=later)
        return answer

    def _sync(self, sent: tuple[pykka.Future[Any], Any] | None = None) -> None:
        """Tell the child the state of each lock that changed; send when the mailbox is empty.

        With ``sent``, a reply and its answer: send now, and set the reply once written.
        """
        jobs = self._books.jobs
        touched = jobs.touched
        assert touched is not None
        outbox = self._outbox
        if touched:
            for job_id in touched:
                token = jobs.tokens.get(job_id)
                if token is None:
                    outbox.append(("drop", job_id))
                    continue
                validity = jobs.valid.get(job_id)
                slot = validity.slot if isinstance(validity, SharedValidity) else None
                outbox.append(
                    ("set", job_id, token, jobs.stamps[job_id], jobs.watched(job_id), slot)
                )
            touched.clear()
        retired = self._cells.to_retire()
        if retired:
            outbox.append(("retire", retired))
        # A burst of tracks costs one write; a lone untrack goes at once.
        if outbox and (sent is not None or len(outbox) >= _BATCH or self._mailbox.empty()):
            self._flush()
        if sent is not None:
            reply, answer = sent
            child = self._child
            if child is None:
                # Restarting: the next child is given every lock as it comes up.
                reply.set(answer)
            else:
                child.writer.then(lambda: reply.set(answer))

    def _flush(self) -> None:
        outbox, self._outbox = self._outbox, []
        child = self._child
        if child is not None:
            # The words end with the table's changes count: a tick of the child that
            # read them, applied while the count is still the same, renewed only jobs
            # still tracked (each let-go since the first of them is in the words).
            changes = self._books.jobs.changes
            if changes != self._marked:
                outbox.append(("mark", changes))
                self._marked = changes
            # A child gone meanwhile: the reader starts another, which is given every lock.
            child.writer.put(*outbox)

    def _on_extend(self, message: m.ExtendLocks) -> None:
        """A "renew now": the child runs it; an ask is answered once its report is delivered."""
        request = next(self._requests)
        reply = self._reply_later()
        if reply is not None:
            self._extends[request] = reply
        self._outbox.append(("extend", request))

    def _on_fired(self, message: Fired) -> None:
        """The worker's own timer, at a watched lock's deadline: tell who is past it."""
        taken = self._alarm.take(message.at)
        now, late = (self._alarm.now(message.at), 0) if taken is None else (taken[1], taken[3])
        report = Report()
        self._books.unconfirmed(now, report, why=self._why(late))
        self._arm()
        self._reporter.send(report)

    def _on_child(self, said: ChildSaid) -> None:
        if said.kind == "tick":
            self._apply(said.payload)
        elif said.kind == "up":
            self._child = said.payload
            self._restore()
        elif said.kind == "hung":
            self._reporter.send(Report(error=RuntimeError(said.payload)))
        elif said.kind == "failed":
            # A stop nobody asked for: on_error hears it before the watchers do.
            self._reporter.send(Report(error=RuntimeError(said.payload)))
            self.stop()

    def _apply(self, tick: Tick) -> None:
        """What a tick of the child did, applied to the books as a thread-mode tick's would be."""
        books, jobs = self._books, self._books.jobs
        counters = self._reporter.counters
        report = Report()
        now = self._alarm.now(tick.answered)
        counters.ticks += 1
        if tick.kind == "grid":
            self._reporter.late(tick.late_ms)
        if jobs.watches:
            books.expire_holds(now, report)
            orphans = self._bury(report)
            if orphans:
                self._outbox.append(("release", orphans))
        # Nothing let go since the words the child had read: all it renewed is
        # still tracked (the lost ones below are none of them).
        unchanged = tick.mark == jobs.changes
        held = jobs.tokens
        for job_id, token, reason, detail in tick.lost:
            if held.get(job_id) != token:
                continue
            if reason == m.EXPIRED and jobs.releasing(job_id):
                books.released(job_id)
            else:
                books.forget(job_id, reason, report, token=token, detail=detail)  # type: ignore[arg-type]
        at = tick.at
        ids: list[str] = msgpack.unpackb(tick.renewed)
        renewed = ids if unchanged else list(filter(held.__contains__, ids))
        # By id, never lowered: a newer lock of the job may have been taken after this renewal ran.
        later = not jobs.valid
        if not later:
            jobs.stamp(renewed, at, raise_only=True)
            renewed = books.settle(renewed, now, report, why=self._why(0))
        if self._reporter.wants_renewed:
            # A copy: the callback may change its list while the stamps are set.
            report.renewed = list(renewed) if later else renewed
        report.error, report.unknown = tick.error, tick.unknown
        if tick.jobs:
            self._reporter.batch(tick.jobs, tick.calls, tick.elapsed_ms)
        margin = (
            None
            if tick.oldest is None
            else self._timing.lock_duration - (tick.answered - tick.oldest)
        )
        self._reporter.renewal(report, tick.answered, margin, renewed=len(renewed))
        self._cells.freed(tick.freed)
        replies = [self._extends.pop(r) for r in tick.requests if r in self._extends]
        self._arm()
        self._reporter.send(report, replies)
        if later:
            # Nothing watched reads them: stamped after the report, yielding to its delivery.
            jobs.stamp(renewed, at, pause=yield_interpreter, raise_only=True)

    def _restore(self) -> None:
        """Give a new child every lock, with the time of its last confirmed renewal."""
        jobs = self._books.jobs
        self._cells.restart()
        assert jobs.touched is not None
        jobs.touched.clear()
        self._outbox = []
        self._marked = None
        for job_id, token in jobs.tokens.items():
            validity = jobs.valid.get(job_id)
            stamp = jobs.stamps[job_id]
            slot = None
            if validity is not None:
                # The deadline the dead child confirmed last stands.
                stamp = max(stamp, validity.confirmed)
                slot = validity.slot if isinstance(validity, SharedValidity) else None
            self._outbox.append(("set", job_id, token, stamp, jobs.watched(job_id), slot))
        self._outbox.extend(("extend", request) for request in sorted(self._extends))
        # Renew what is due at once: the locks aged while no child ran.
        self._outbox.append(("extend", next(self._requests)))
        self._flush()

    _handlers: ClassVar[dict[type, Callable[[Any, Any], Any]]] = {
        **LockManager._handlers,
        m.ExtendLocks: _on_extend,
        Fired: _on_fired,
        ChildSaid: _on_child,
    }


#: The process-mode managers of this process, stopped at its normal exit.
_RUNNING: weakref.WeakSet[ProcessLockManager] = weakref.WeakSet()
# A fork has copies of the managers but none of their threads: nothing to stop there.
os.register_at_fork(after_in_child=_RUNNING.clear)


@atexit.register
def _stop_at_exit() -> None:
    # A worker exiting without stopping its managers stops them: each child leaves
    # its locks to the worker's own release, as after stop(), not as after a kill.
    for manager in list(_RUNNING):
        ref = manager.actor_ref
        if ref.is_alive():
            with contextlib.suppress(Exception):  # at exit: nobody is left to tell
                ref.stop(timeout=STOP_TIMEOUT_S + 1)
