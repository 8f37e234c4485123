"""Where a bullmq ``Worker`` takes, gives up and moves its jobs, wrapped to keep them tracked.

Also the client its locks are renewed with, and what its close waits for and stops.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import contextvars
import functools
import inspect
import logging
import pickle
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import msgpack
import pykka
import redis
import redis.asyncio
import redis.asyncio.sentinel

from actors.aio import call_in_loop, set_exception, set_result
from actors.connection import client_for_url, client_like, client_settings, command_timeout
from actors.process.take import Source
from actors.scripts import find_taken, untrusted_take
from actors.timing import Timing, monotonic_ms

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable

    from actors.bullmq.runs import Run
    from actors.keys import QueueKeys
    from actors.messages import NotReplicatedError
    from actors.process.take import Taken
    from actors.ref import ManagerRef
    from actors.scripts import Replicas

__all__ = [
    "Fetcher",
    "InFlight",
    "Lane",
    "RunTokens",
    "attempt",
    "hook_worker",
    "move_reader",
    "must_wait",
    "next_job",
    "off_the_loop",
    "processing",
    "renewal_client",
    "sending",
    "stopper",
]

logger = logging.getLogger("actors.bullmq")


class Owner(Protocol):
    """What the wrappers tell the worker's lock manager."""

    lock_duration: int
    closing: bool
    fetcher: Fetcher | None
    #: The replicas each take and renewal waits for, if any.
    replicas: Replicas | None
    #: The client the locks are renewed with (``None`` with renewal off).
    connection: redis.Redis | redis.RedisCluster | None

    @property
    def keys(self) -> QueueKeys:
        """The queue's keys."""
        ...

    def taker(self) -> Callable[..., concurrent.futures.Future[Taken]] | None:
        """What runs the fetch where the locks are renewed (process mode), if anything."""

    def taken(
        self, job_id: str, token: str, sent_ms: int, sent_wall_ms: int, *, late: bool = False
    ) -> None:
        """A fetch took the job's lock (on the thread that read its answer, or found it late)."""

    async def taken_by_child(
        self, job_id: str, token: str, sent_ms: int, sent_wall_ms: int
    ) -> None:
        """The manager's child took the job's lock (on the loop, before the run)."""

    def abandoned(self, job_id: str, token: str) -> None:
        """Nobody awaits the fetch that took the job any more."""

    def moving(self, job_id: str, token: str) -> bool:
        """A move of the job is sent; whether the run holding ``token`` was marked."""

    def moved(self, job_id: str, token: str, *, stayed: bool) -> None:
        """The move ended: the job left, or ``stayed`` active."""

    def release_unstarted(self, job_id: str, token: str) -> None:
        """The job was fetched but not handed to its processor."""

    async def lock_held(self, job_id: str, token: str) -> bool:
        """Whether the job's lock still holds ``token`` (``True`` when unreadable)."""


#: ``stays_when`` of a move that never leaves the job active when it answers.
_NEVER = object()

#: The backend calls that move an active job away from active (deleting its
#: lock), and the answer that means the job stayed. Every way bullmq 3.4 ends
#: a run goes through one of them.
_MOVES: tuple[tuple[str, object], ...] = (
    ("moveToCompleted", _NEVER),
    ("moveToFailed", _NEVER),
    ("retryJob", _NEVER),
    ("moveToDelayed", _NEVER),
    ("moveToWaitingChildren", False),
)

#: The current ``getNextJob`` call, seen by the fetches it makes.
_CALL: contextvars.ContextVar[_Call | None] = contextvars.ContextVar(
    "actors_bullmq_call", default=None
)


class _Call:
    """One ``getNextJob`` call: what its fetches took, and whether one was sent."""

    __slots__ = ("_ended", "in_flight", "loop", "took", "unique")

    def __init__(self, in_flight: InFlight, *, unique: bool = False) -> None:
        #: (job id, token) of each job its fetches took.
        self.took: list[tuple[str, str]] = []
        #: Whether its token is the run loop's, which no other fetch or run holds.
        self.unique = unique
        #: The calls of the worker whose fetch was sent; this one joins once its own is.
        self.in_flight = in_flight
        #: The loop the call runs on.
        self.loop = asyncio.get_running_loop()
        #: Set when the call returns; made only for a close that waits for it.
        self._ended: asyncio.Future[None] | None = None

    def ended(self) -> asyncio.Future[None]:
        """A future set when the call returns."""
        if self._ended is None:
            self._ended = self.loop.create_future()
        return self._ended

    def sent(self) -> None:
        """A fetch of this call was sent: it may take a job."""
        self.in_flight.calls.add(self)

    def end(self) -> None:
        self.in_flight.calls.discard(self)
        if self._ended is not None:
            self._ended.set_result(None)


def sending() -> _Call | None:
    """Mark the current ``getNextJob`` call (if any) as sending a fetch; return it."""
    call = _CALL.get()
    if call is not None:
        call.sent()
    return call


class InFlight:
    """The worker's ``getNextJob`` calls whose fetch was sent, until each returns.

    bullmq's run loop stops at the first of its tasks to end without a job
    once the worker closes: a job that a fetch still in flight then takes is
    never processed, and stays active with a lock nobody renews. A run that
    ends while the worker closes gracefully waits for these calls first (at
    most ``bound_s``), so the loop sees their jobs before it sees the run end.
    The stock worker sends its fetches at once and reads their answers on its
    loop, ahead of a run's later move; this package's answers reach the loop
    from a thread of its own (a lane's, or the manager's child's), and a
    loaded machine can hand them over later.
    """

    def __init__(self, bound_s: float) -> None:
        self.calls: set[_Call] = set()
        self._bound_s = bound_s

    async def answered(self) -> None:
        """Wait until the calls in flight now have returned, ``bound_s`` at most."""
        loop = asyncio.get_running_loop()
        ending = {call.ended() for call in self.calls if call.loop is loop}
        if ending:
            await asyncio.wait(ending, timeout=self._bound_s)


#: The script that takes a job and its lock.
_FETCH = "moveToActive"

#: The answer of a fetch that took nothing (``moveToActive`` with no job).
_NO_JOB: list[Any] = []

#: Longest wait for the fetch threads to end once their connections are cut, in seconds.
_JOIN_S = 5.0


class Fetcher:
    """bullmq's ``moveToActive`` script, answered off the loop and tracked as it is read.

    The same script and arguments, through synchronous copies of the worker's
    connection: never retried (a second run would take a second job), awaited
    as long as it takes, and decoded as the worker's client would. In thread
    mode the loop sends each fetch on a :class:`Lane` of its own, whose thread
    reads the answer and tracks the job it took, whatever the loop does
    meanwhile; fetches run side by side, as the stock worker's do. In process
    mode the manager's child runs it (with a copy of that client of its own)
    and tracks the job before it answers: the lock is renewed from the moment
    the server answers, whatever holds the worker's GIL.
    """

    def __init__(self, owner: Owner, script: Any, conn: redis.asyncio.Redis) -> None:
        self._owner = owner
        timeout = owner.lock_duration / 1000
        self._client = client_like(conn, timeout=timeout, bounded=False, retries=0)
        self._script = self._client.register_script(script.script)
        self._decode = conn.get_encoder().decode  # type: ignore[no-untyped-call]
        self._prefix = owner.keys.key_prefix
        self._source = Source(script.script, _portable_settings(self._client))
        #: The takes the child runs for this fetcher, until answered.
        self._taking: set[concurrent.futures.Future[Taken]] = set()
        self._closed = False
        #: Every lane made, and the ones no fetch is using (thread mode).
        self._lanes: list[Lane] = []
        self._idle: list[Lane] = []
        #: The connections of the fetches the loop sends.
        self._pool: Any = _fetch_pool(conn.connection_pool)
        #: The connections made for them, and those no fetch is using.
        self._made: set[Any] = set()
        self._idle_connections: list[Any] = []
        #: The fetches the loop sent and has not read yet (with renewal on).
        renewals = owner.connection
        self._flights = None if renewals is None else Flights(owner, renewals)

    async def run(self, keys: Any = None, args: Any = None, client: Any = None) -> Any:
        """Run the script as the worker's own client would, from the worker's loop."""
        if self._owner.closing or self._closed:
            # A closing worker takes no more jobs.
            return _NO_JOB
        call = sending()
        keys, args = list(keys or ()), list(args or ())
        token = self._token(args)
        taker = None if token is None else self._owner.taker()
        if taker is not None and token is not None:
            answer, taken = await self._take(taker, keys, args, token)
        elif (
            token is not None
            and call is not None
            and call.unique
            and self._flights is not None
            and self.replicas is None
        ):
            # A token of the run loop's: the job whose lock holds it is this fetch's.
            answer, taken = await self._fetch_here(keys, args, token)
        else:
            fetch = self._lane().send(keys, args, token)
            try:
                answer, taken = await asyncio.wrap_future(fetch)
            except asyncio.CancelledError:
                # Nobody will process what it takes: let its lock expire.
                fetch.add_done_callback(self._abandon)
                raise
        if taken is not None and call is not None:
            call.took.append(taken)
        return answer

    async def _fetch_here(
        self, keys: list[Any], args: list[Any], token: str
    ) -> tuple[Any, tuple[str, str] | None]:
        """Send the fetch from the loop on a connection of the worker's client, and read it there.

        The fetch is in :class:`Flights` from just before it is written until
        its answer is read: if the loop is held meanwhile, a thread finds the
        job by its token and has it renewed. An answer read long after the
        send (the loop was held before the write, or after it) has its lock's
        age read back: the lock is trusted from when it was taken, not from
        a send that may have waited. As the lanes, it is never retried: a
        second run would take a second job.
        """
        flights = self._flights
        assert flights is not None
        connection = await self._connection()
        flight: Flight | None = None
        try:
            flight = flights.start(token)
            answer = await self._send_here(connection, keys, args)
            found = flights.end(flight)
            job_id = _job_id(answer)
            sent = flight.sent
            if job_id is not None and found is None and flights.late(flight):
                sent = await self._taken_at(connection, job_id, sent)
        except BaseException:
            # The answer may be unread: the connection is of no further use.
            self._made.discard(connection)
            with contextlib.suppress(Exception):
                await asyncio.shield(connection.disconnect())
            found = None if flight is None else flights.end(flight)
            if found is not None:
                # Nobody will process what it took: the lock expires.
                self._owner.abandoned(found, token)
            raise
        if self._closed:
            self._made.discard(connection)
            await connection.disconnect()
        else:
            self._idle_connections.append(connection)
        if found is not None and found != job_id:
            self._owner.abandoned(found, token)
        if job_id is None:
            return answer, None
        if found != job_id:
            self._owner.taken(job_id, token, *sent)
        return answer, (job_id, token)

    async def _taken_at(
        self, connection: Any, job_id: str, sent: tuple[int, int]
    ) -> tuple[int, int]:
        """When the job's lock was taken, at the latest: from its TTL, or the fetch's send."""
        asked = _now()
        try:
            await connection.send_command("PTTL", self._owner.keys.lock(job_id), check_health=False)
            pttl = int(await connection.read_response())
        except Exception:
            return sent  # the send, which the taking followed
        return taken_at(sent, asked, pttl, self._owner.lock_duration)

    async def _connection(self) -> Any:
        """An idle connection of the loop's fetches, or a new one, connected.

        Kept here, one per fetch in flight at most: a pool's bookkeeping would
        cost a small job a fiftieth of its time.
        """
        idle = self._idle_connections
        while idle:
            connection = idle.pop()
            # Closed by the server meanwhile (its idle timeout, a kill, a proxy): never sent on.
            with contextlib.suppress(redis.exceptions.ConnectionError, OSError):
                if connection.is_connected and not await _can_read(connection):
                    return connection
            self._made.discard(connection)
            with contextlib.suppress(Exception):
                await connection.disconnect()
        connection = self._pool.make_connection()
        self._made.add(connection)
        try:
            await connection.connect()
        except BaseException:
            self._made.discard(connection)
            raise
        return connection

    async def _send_here(self, connection: Any, keys: list[Any], args: list[Any]) -> Any:
        script = self._script
        packed = connection.pack_command("EVALSHA", script.sha, len(keys), *keys, *args)
        await connection.send_packed_command(packed, check_health=False)
        try:
            return await connection.read_response()
        except redis.exceptions.NoScriptError:
            # Not run: run the script itself (the server then keeps it).
            packed = connection.pack_command("EVAL", script.script, len(keys), *keys, *args)
            await connection.send_packed_command(packed, check_health=False)
            return await connection.read_response()

    def _lane(self) -> Lane:
        """An idle lane, or a new one (each fetch in flight has its own)."""
        while self._idle:
            lane = self._idle.pop()
            if lane.usable():
                return lane
        lane = Lane(self, f"bullmq-fetch-{self._owner.keys.name}-{len(self._lanes)}")
        self._lanes = [*(each for each in self._lanes if each.usable()), lane]
        return lane

    def idle(self, lane: Lane) -> None:
        """``lane``'s fetch was answered: the next fetch may use it (on the lane's thread)."""
        if not self._closed and lane.usable():
            self._idle.append(lane)

    @property
    def replicas(self) -> Replicas | None:
        """The replicas a take waits for, if any."""
        return self._owner.replicas

    def answered(
        self,
        reply: Any,
        token: str | None,
        sent: tuple[int, int],
        shortfall: NotReplicatedError | None = None,
    ) -> tuple[Any, Any]:
        """Decode a fetch's reply and track the job it took; on the thread that read it.

        A take the replicas did not confirm is trusted for nothing: a failover
        may undo it, so the run is told ``"unconfirmed"`` at once.
        """
        answer = _decoded(reply, self._decode)
        job_id = None if token is None else _job_id(answer)
        if job_id is None or token is None:
            return answer, None
        if shortfall is not None:
            sent = untrusted_take(job_id, sent, shortfall, self._owner.lock_duration)
        self._owner.taken(job_id, token, *sent)
        return answer, (job_id, token)

    async def _take(
        self,
        taker: Callable[..., concurrent.futures.Future[Taken]],
        keys: list[Any],
        args: list[Any],
        token: str,
    ) -> tuple[Any, tuple[str, str] | None]:
        """Have the manager's child run the fetch; it renews what it took before it answers.

        The child tracked the job before its answer could reach the worker:
        the worker reads it on its loop, whenever the loop runs, and hands the
        job on once its manager has the track.
        """
        take = taker(self._source, keys, args, token)
        self._taking.add(take)
        take.add_done_callback(self._taking.discard)
        if self._closed:
            take.cancel()
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[Taken] = loop.create_future()
        # Handed over, never chained: a cancelled wait leaves the take to end, and let go.
        take.add_done_callback(functools.partial(_hand_over, loop, answered))
        try:
            done = await answered
        except asyncio.CancelledError:
            # Nobody will process what it takes: the child stops renewing it.
            take.add_done_callback(_let_go)
            raise
        if isinstance(done.answer, BaseException):
            raise done.answer
        try:
            answer = _decoded(done.answer, self._decode)
            if done.job_id is None:
                if isinstance(answer, list) and len(answer) > 1 and answer[1]:
                    # Taken, but not renewed (an id the child could not read): handed on.
                    raise redis.ConnectionError("the fetch took a job its manager cannot renew")
                return answer, None
            await self._owner.taken_by_child(done.job_id, token, done.sent_ms, done.sent_wall_ms)
        except BaseException:
            # What the child took is of no use here: it stops renewing, the lock expires.
            done.let_go()
            raise
        return answer, (done.job_id, token)

    def _token(self, args: list[Any]) -> str | None:
        """The token a fetch with ``args`` takes a lock with, if they are this queue's.

        ``ARGV[1]`` is the queue's key prefix, ``ARGV[3]`` the packed options
        holding the token: the script's argument layout, shared by every
        BullMQ runtime. The answer's second entry is then the job's id.
        """
        if len(args) < 3 or str(args[0]) != self._prefix:
            return None
        try:
            token = msgpack.unpackb(args[2]).get("token")
        except Exception:
            return None
        if not isinstance(token, str) or not token:
            return None
        return token

    def _abandon(self, fetch: concurrent.futures.Future[tuple[Any, Any]]) -> None:
        if not fetch.cancelled() and fetch.exception() is None:
            _, taken = fetch.result()
            if taken is not None:
                self._owner.abandoned(*taken)

    @property
    def script(self) -> Any:
        """The registered script: its ``sha`` and its ``script``."""
        return self._script

    @property
    def client(self) -> redis.Redis:
        """The synchronous copy of the worker's client whose pool makes the lanes' connections."""
        return self._client

    async def disconnect(self) -> None:
        """Close the connections of the loop's fetches (on the loop, once closed)."""
        self._idle_connections.clear()
        made, self._made = self._made, set()
        for connection in made:
            with contextlib.suppress(Exception):
                await connection.disconnect()

    def close(self) -> None:
        """End the fetch threads: a fetch still waiting on the server is cut off."""
        self._closed = True
        self._idle.clear()
        if self._flights is not None:
            self._flights.close()
        for take in list(self._taking):
            take.cancel()
        lanes = list(self._lanes)
        for lane in lanes:
            # Closing its socket ends a read that waits on a paused or hung server.
            lane.cut()
        deadline = time.monotonic() + _JOIN_S
        for lane in lanes:
            lane.join(max(0.0, deadline - time.monotonic()))
        self._client.close()


#: How often the fetches in flight are looked at, at most, in milliseconds.
FLIGHT_CHECK_MS = 1000


@dataclass(slots=True, eq=False)
class Flight:
    """A fetch the loop sent: its token, when, and the job a search found it took."""

    token: str
    #: (monotonic ms, wall ms) before the send: the lock was taken after both.
    sent: tuple[int, int]
    #: The job whose lock holds the token, once :class:`Flights` found it.
    found: str | None = None
    #: When to look for it next (monotonic ms; 0: one look period after the send), and
    #: how many looks found nothing.
    look_at: int = 0
    misses: int = 0


class Flights:
    """The fetches the worker's loop sent itself, until it reads their answers.

    The loop reads a fetch's answer as the stock worker does: tracking costs
    it two dictionary writes. A processor that blocks the loop would leave the
    job a fetch took unrenewed, its answer unread: so a thread looks at the
    fetches in flight every eighth of the lock's duration (a second at most),
    and finds the jobs of those sent at least that long ago by their tokens
    (``findTaken-1.lua``). Each job found is tracked from its fetch's send,
    as the loop would have, before its first renewal is due.
    """

    def __init__(self, owner: Owner, conn: redis.Redis | redis.RedisCluster) -> None:
        self._owner = owner
        self._conn = conn
        self._every_ms = max(1, min(FLIGHT_CHECK_MS, owner.lock_duration // 8))
        #: Held to add, end or mark a flight: a found job is tracked under it.
        self._lock = threading.Lock()
        self._flying: set[Flight] = set()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        #: Whether the last look failed (its warning was logged).
        self._failing = False

    def start(self, token: str) -> Flight:
        """A fetch with ``token`` is about to be sent (on the loop)."""
        flight = Flight(token, _now())
        with self._lock:
            self._flying.add(flight)
            if self._thread is None and not self._closed.is_set():
                name = f"bullmq-flights-{self._owner.keys.name}"
                self._thread = threading.Thread(target=self._watch, name=name, daemon=True)
                self._thread.start()
        return flight

    def late(self, flight: Flight) -> bool:
        """Whether ``flight`` was sent long enough ago for its job to be looked for."""
        return monotonic_ms() - flight.sent[0] >= self._every_ms

    def end(self, flight: Flight) -> str | None:
        """The loop read ``flight``'s answer (or gave it up): the job found for it, if any."""
        with self._lock:
            self._flying.discard(flight)
            return flight.found

    def _watch(self) -> None:
        every, every_s = self._every_ms, self._every_ms / 1000
        while not self._closed.wait(every_s):
            now = monotonic_ms()
            with self._lock:
                late = [
                    f
                    for f in self._flying
                    if f.found is None and now >= (f.look_at or f.sent[0] + every)
                ]
            if late:
                self._find(late)

    def _find(self, late: list[Flight]) -> None:
        keys = self._owner.keys
        asked = _now()
        try:
            found = find_taken(self._conn, keys, [flight.token for flight in late])
        except Exception:
            # Said once a failing spell: the loop may stay held while the server is away.
            log = logger.debug if self._failing else logger.warning
            self._failing = True
            log(
                "queue %r: could not look for the jobs of %d fetches whose answers wait for "
                "the event loop; looking again in %d ms",
                keys.name,
                len(late),
                self._every_ms,
                exc_info=True,
                extra={"queue": keys.name},
            )
            return
        self._failing = False
        # A fetch that took nothing is looked for less and less often: each
        # look walks the active list. One the server ran late is still found
        # within a quarter of the lock's duration of its taking.
        longest = max(self._every_ms, self._owner.lock_duration // 4)
        for flight, held in zip(late, found, strict=True):
            if held is None:
                flight.misses += 1
                pause = min(longest, self._every_ms << min(flight.misses, 16))
                flight.look_at = asked[0] + pause
        lock_duration = self._owner.lock_duration
        for flight, held in zip(late, found, strict=True):
            if held is None:
                continue
            job_id, pttl = held
            sent = taken_at(flight.sent, asked, pttl, lock_duration)
            with self._lock:
                if flight not in self._flying:
                    continue  # read by the loop meanwhile, which tracked it
                flight.found = job_id
                # Under the lock: an end that sees the job found comes after its track.
                self._owner.taken(job_id, flight.token, *sent, late=True)

    def close(self) -> None:
        """Stop looking (the thread ends within one look)."""
        self._closed.set()


class Lane:
    """A connection of its own for one fetch at a time, and the thread that reads its answers.

    The loop sends the fetch itself (a few hundred bytes, into the socket's
    buffer) and the lane's thread, already waiting on the socket, reads the
    answer the moment it comes: it tracks the job it took before the loop
    hears of it. A thread switch on each side would cost a small job a fifth
    of its time; the loop's send costs nothing it would not do anyway.

    The first fetch of a lane is sent by its thread once connected: the loop
    never connects. A lane whose connection fails is dropped (its fetch
    raises ``ConnectionError`` and is never sent again).
    """

    def __init__(self, fetcher: Fetcher, name: str) -> None:
        self._fetcher = fetcher
        self._conn: Any = fetcher.client.connection_pool.make_connection()
        #: Held to send, and to give the connection up: a send never meets a closed socket.
        self._lock = threading.Lock()
        #: The fetch sent, or to send once connected (one at a time).
        self._waiting: collections.deque[_Sent] = collections.deque()
        self._connected = False
        self._dead = False
        self._thread = threading.Thread(target=self._read, name=name, daemon=True)

    def usable(self) -> bool:
        """Whether the lane can take a fetch."""
        return not self._dead

    def send(
        self, keys: list[Any], args: list[Any], token: str | None
    ) -> concurrent.futures.Future[tuple[Any, Any]]:
        """Send a fetch (on the loop); the future is set on the lane's thread."""
        future: concurrent.futures.Future[tuple[Any, Any]] = concurrent.futures.Future()
        # Running: a cancel then leaves the answer to be read, and a job it took let go.
        future.set_running_or_notify_cancel()
        sent = _Sent(future, keys, args, token, _now())
        with self._lock:
            if self._dead:
                future.set_exception(redis.ConnectionError("the fetch's connection was closed"))
                return future
            self._waiting.append(sent)
            if not self._connected:
                if not self._thread.is_alive():
                    self._thread.start()
                return future
            try:
                self._send(sent)
            except BaseException as error:
                self._die(error)
        return future

    def _send(self, sent: _Sent, command: str = "EVALSHA") -> None:
        script = self._fetcher.script
        body = script.sha if command == "EVALSHA" else script.script
        keys, args = sent.keys, sent.args
        confirm = self._fetcher.replicas
        if confirm is None:
            packed = self._conn.pack_command(command, body, len(keys), *keys, *args)
        else:
            # The take's own wait, on its connection and in its round trip.
            call = (command, body, len(keys), *keys, *args)
            packed = self._conn.pack_commands([call, confirm.command()])
        self._conn.send_packed_command(packed, check_health=False)

    def _read(self) -> None:
        try:
            self._conn.connect()
            with self._lock:
                if self._dead:
                    # Cut while it connected: the connection is given up, unused.
                    self._conn.disconnect()
                    return
                self._connected = True
                if self._waiting:
                    # Sent here: the loop never waits for a connect. The lock is
                    # taken after this send, not the loop's: the connect may be slow.
                    first = self._waiting[0]
                    first.sent = _now()
                    self._send(first)
            confirm = self._fetcher.replicas
            while True:
                reply = self._reply()
                if not self._waiting:
                    raise redis.ConnectionError("an answer came for no fetch")
                sent = self._waiting[0]
                confirmed = self._reply() if confirm is not None else None
                if isinstance(reply, redis.exceptions.NoScriptError):
                    # Not run: run the script itself (the server then keeps it),
                    # unless the lane was cut meanwhile (a send would reconnect).
                    with self._lock:
                        if not self.usable():
                            return
                        self._send(sent, "EVAL")
                    reply = self._reply()
                    confirmed = self._reply() if confirm is not None else None
                self._waiting.popleft()
                try:
                    if isinstance(reply, BaseException):
                        raise reply
                    shortfall = None if confirm is None else confirm.shortfall(confirmed)
                    answer = self._fetcher.answered(reply, sent.token, sent.sent, shortfall)
                except BaseException as error:
                    sent.future.set_exception(error)
                else:
                    sent.future.set_result(answer)
                self._fetcher.idle(self)
        except BaseException as error:
            with self._lock:
                self._die(error)

    def _reply(self) -> Any:
        try:
            return self._conn.read_response(disconnect_on_error=False)
        except redis.ResponseError as error:
            return error  # the server's answer: the connection is fine

    def _die(self, error: BaseException) -> None:
        """Give the connection up and fail what waits on it; with the lock held."""
        self._dead = True
        with contextlib.suppress(Exception):
            self._conn.disconnect()
        failure = error
        if not isinstance(error, redis.RedisError):
            failure = redis.ConnectionError(f"the fetch's connection failed: {error!r}")
        while self._waiting:
            sent = self._waiting.popleft()
            if not sent.future.done():
                sent.future.set_exception(failure)

    def cut(self) -> None:
        """End the lane: a read waiting on the server ends, and its fetch fails."""
        with self._lock:
            self._die(redis.ConnectionError("the worker closed during the fetch"))

    def join(self, timeout: float) -> None:
        """Wait for the lane's thread to end, ``timeout`` seconds at most."""
        if self._thread.is_alive():
            self._thread.join(timeout)


def taken_at(
    sent: tuple[int, int], asked: tuple[int, int], pttl: int, lock_ms: int
) -> tuple[int, int]:
    """When a lock was taken, at the latest: ``sent`` (the fetch's send), or later by its TTL.

    ``pttl`` is the lock's TTL read by a command sent at ``asked``: the lock
    then expires no sooner than ``asked + pttl``, so it was taken (or last
    renewed) no sooner than that, less ``lock_ms``. Both as (monotonic ms,
    wall ms).
    """
    if pttl <= 0:
        return sent
    shift = asked[0] + pttl - lock_ms - sent[0]
    if shift <= 0:
        return sent
    return sent[0] + shift, sent[1] + shift


def _now() -> tuple[int, int]:
    """(monotonic ms, wall ms) now."""
    return monotonic_ms(), time.time_ns() // 1_000_000


@dataclass(slots=True)
class _Sent:
    """A fetch on a lane: what it sent, when, and who waits for its answer."""

    future: concurrent.futures.Future[tuple[Any, Any]]
    keys: list[Any]
    args: list[Any]
    token: str | None
    #: (monotonic ms, wall ms) of the send: the lock was taken after both.
    sent: tuple[int, int]


def _hand_over(
    loop: asyncio.AbstractEventLoop,
    answered: asyncio.Future[Taken],
    take: concurrent.futures.Future[Taken],
) -> None:
    """Copy a take's outcome to ``answered``, on its loop (from the thread that answered it)."""
    if take.cancelled():
        failure: BaseException | None = redis.ConnectionError("the worker closed during the fetch")
    else:
        failure = take.exception()
    if failure is None:
        call_in_loop(loop, set_result, answered, take.result())
    else:
        call_in_loop(loop, set_exception, answered, failure)


def _let_go(take: concurrent.futures.Future[Taken]) -> None:
    """Let go of what a take nobody waits for any more took: its lock expires."""
    if not take.cancelled() and take.exception() is None:
        take.result().let_go()


async def _can_read(connection: Any) -> bool:
    """Whether an idle connection has something to read (the server closed it, say)."""
    # can_read is redis-py 8's name; can_read_destructive the earlier one.
    check = getattr(connection, "can_read", None) or connection.can_read_destructive
    return bool(await check())


def _fetch_pool(pool: Any) -> Any:
    """What makes connections like the worker's for its fetches: same server and settings, no name.

    bullmq names its own connections (``getWorkers`` lists them); a fetch's
    is not a worker. A Sentinel pool, which finds the primary, makes them as it is.
    """
    if isinstance(pool, redis.asyncio.sentinel.SentinelConnectionPool):
        return pool
    settings = {**pool.connection_kwargs}
    settings.pop("client_name", None)
    return redis.asyncio.ConnectionPool(connection_class=pool.connection_class, **settings)


def _portable_settings(client: redis.Redis) -> dict[str, Any] | None:
    """The client's settings, if another process can build a client from them."""
    try:
        settings = client_settings(client)
        pickle.dumps(settings)
    except Exception:
        return None  # the child then takes through the renewal's server
    return settings


def _job_id(answer: Any) -> str | None:
    """The id of the job a fetch's answer hands on, if any (its second entry)."""
    if isinstance(answer, list) and len(answer) > 1 and answer[1]:
        return str(answer[1])
    return None


def _decoded(reply: Any, decode: Callable[[Any], Any]) -> Any:
    if isinstance(reply, list):
        return [_decoded(item, decode) for item in reply]
    return decode(reply)


def moving(
    owner: Owner, move: Callable[..., Awaitable[Any]], *, stays_when: object = _NEVER
) -> Callable[..., Awaitable[Any]]:
    """Wrap a backend call that moves an active job away, deleting its lock.

    The job stays tracked, its loss unreported, while the move is under way;
    an answer other than ``stays_when`` untracks it. If the move raises, the
    job stays tracked if its lock, read back, holds the run's token or
    cannot be read.
    """
    read = move_reader(inspect.signature(move))

    @functools.wraps(move)
    async def moved(*args: Any, **kwargs: Any) -> Any:
        job, job_id, token = read(args, kwargs)
        job_id = str(job_id if job is None else job.id)
        token = str("0" if token is None else token)
        if not owner.moving(job_id, token):
            return await move(*args, **kwargs)
        stayed = False
        try:
            answer = await move(*args, **kwargs)
            stayed = answer is stays_when
            return answer
        except BaseException:
            # No proof either way: a call cancelled after it was sent may have run.
            stayed = await owner.lock_held(job_id, token)
            raise
        finally:
            owner.moved(job_id, token, stayed=stayed)

    return moved


def move_reader(
    signature: inspect.Signature,
) -> Callable[[tuple[Any, ...], dict[str, Any]], tuple[Any, Any, Any]]:
    """What reads a move's ``job``, ``job_id`` and ``token`` from its arguments (each or ``None``).

    By position or keyword, as the call binds them; a call that does not
    bind (a missing argument) goes through ``signature.bind``, which raises.
    Read on every move: ``bind`` costs a small job a hundredth of its time.
    """
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    positional = [p.name for p in signature.parameters.values() if p.kind in kinds]
    names = ("job", "job_id", "token")
    at = {name: positional.index(name) for name in names if name in positional}
    required = {
        p.name
        for p in signature.parameters.values()
        if p.kind in kinds and p.default is inspect.Parameter.empty
    }

    job_at, id_at, token_at = (at.get(name, len(positional)) for name in names)
    # The common call: every argument by position, up to the token at least.
    reach = max((i for i in (job_at, id_at, token_at) if i < len(positional)), default=-1)

    def read(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, Any]:
        if not kwargs and reach < len(args) <= len(positional):
            last = len(positional)
            return (
                args[job_at] if job_at < last else None,
                args[id_at] if id_at < last else None,
                args[token_at] if token_at < last else None,
            )
        if len(args) > len(positional) or (len(args) + len(kwargs) < len(required)):
            given = signature.bind(*args, **kwargs).arguments
            return given.get("job"), given.get("job_id"), given.get("token")
        values = []
        for name in names:
            index = at.get(name)
            if name in kwargs:
                values.append(kwargs[name])
            elif index is not None and index < len(args):
                values.append(args[index])
            else:
                values.append(None)
        return values[0], values[1], values[2]

    return read


#: How many of the run loop's latest tokens :class:`RunTokens` remembers.
_TOKENS_KEPT = 256


class RunTokens:
    """The tokens of bullmq's run loop, each handed to one fetch only.

    bullmq-py 3.4 gives every fetch of one pass of its run loop the same token
    (its fetches read the loop's ``token`` variable when they run). A fetch of
    that pass still waiting for a job then takes a job that another run of the
    pass gave back (a retry) with that run's very token: two runs of one job,
    one lock value, and the first run's end would end the second's renewal.
    A token of the run loop's own shape (``{worker.id}:{n}``) that a fetch of
    this worker used already gets a suffix (``{worker.id}:{n}:{k}``): the
    lock, the job's ``token`` and the run loop's ``processJob(job, job.token)``
    then all hold it. Tokens of other shapes (a ``getNextJob`` called by hand)
    are left as they are.
    """

    def __init__(self, worker_id: object) -> None:
        self._prefix = f"{worker_id}:"
        #: How many fetches took each recent run-loop token (the oldest forgotten first).
        self._used: dict[str, int] = {}

    def owns(self, token: object) -> bool:
        """Whether ``token`` has the run loop's shape: no other fetch of the worker has it."""
        return isinstance(token, str) and token.startswith(self._prefix)

    def own(self, token: str) -> str:
        """Return the token a fetch asked to take a job with ``token`` takes it with."""
        if not isinstance(token, str) or not token.startswith(self._prefix):
            return token
        used = self._used
        count = used.pop(token, 0) + 1
        used[token] = count
        if len(used) > _TOKENS_KEPT:
            del used[next(iter(used))]
        return token if count == 1 else f"{token}:{count}"


def next_job(
    owner: Owner,
    get_next_job: Callable[[str], Awaitable[Any]],
    tokens: RunTokens,
    in_flight: InFlight,
) -> Callable[[str], Awaitable[Any]]:
    """Wrap ``Worker.getNextJob``: a job its fetch took but that is not handed on is let go.

    Each fetch of the run loop takes its job with a token of its own (see
    :class:`RunTokens`); what it took is told through a context variable, and
    the call is in ``in_flight`` from its fetch's send until it returns.
    """

    @functools.wraps(get_next_job)
    async def fetched(token: str) -> Any:
        token = tokens.own(token)
        call = _Call(in_flight, unique=tokens.owns(token))
        reset = _CALL.set(call)
        job = None
        try:
            job = await get_next_job(token)
            return job
        finally:
            _CALL.reset(reset)
            handed_on = None if job is None else str(job.id)
            for job_id, taken_with in call.took:
                if job_id != handed_on:
                    owner.release_unstarted(job_id, taken_with)
            call.end()

    return fetched


def processing(
    worker: Any, process_job: Callable[..., Awaitable[Any]], in_flight: InFlight
) -> Callable[..., Awaitable[Any]]:
    """Wrap ``Worker.processJob``: once the worker closes, a run ends after the fetches in flight.

    Not on a forced close, nor when the run is cancelled: see :class:`InFlight`.
    """

    @functools.wraps(process_job)
    async def processed(*args: Any, **kwargs: Any) -> Any:
        result = await process_job(*args, **kwargs)
        if worker.closing and not worker.forceClosing:
            await in_flight.answered()
        return result

    return processed


def hook_worker(worker: Any, owner: Owner) -> None:
    """Wrap the worker's fetch, ``getNextJob``, ``processJob`` and moves, on this worker only."""
    backend: Any = worker.backend
    scripts: Any = getattr(backend, "scripts", None)
    commands: Any = getattr(scripts, "commands", None)
    conn = getattr(backend, "conn", None)
    fetcher = None
    if isinstance(commands, dict) and _FETCH in commands and isinstance(conn, redis.asyncio.Redis):
        with contextlib.suppress(TypeError, AttributeError):
            fetcher = Fetcher(owner, commands[_FETCH], conn)
    if fetcher is None:
        logger.warning(
            "queue %r: bullmq's fetch cannot run off the loop here; a job fetched beside a "
            "processor that blocks the loop is tracked only when its processor starts",
            worker.name,
            extra={"queue": worker.name},
        )
    else:
        owner.fetcher = fetcher
        # A copy: the dict belongs to the connection, which other queues may share.
        scripts.commands = {**commands, _FETCH: fetcher.run}
    in_flight = InFlight(owner.lock_duration / 1000)
    worker.getNextJob = next_job(owner, worker.getNextJob, RunTokens(worker.id), in_flight)
    worker.processJob = processing(worker, worker.processJob, in_flight)
    for name, stays_when in _MOVES:
        move = getattr(backend, name, None)
        parameters = set(inspect.signature(move).parameters) if callable(move) else set()
        if move is None or "token" not in parameters or not parameters & {"job", "job_id"}:
            logger.warning(
                "bullmq's %s takes no job and token: a job it moves may be reported lost once "
                "(tested bullmq: 3.4)",
                name,
            )
            continue
        setattr(backend, name, moving(owner, move, stays_when=stays_when))


#: Longest wait for the manager to stop when the worker closes, in seconds.
_STOP_S = 10.0


def renewal_client(
    worker: Any,
    connection: redis.Redis | redis.RedisCluster | str | None,
    lock_duration: int,
    lock_renew_time: int,
) -> tuple[redis.Redis | redis.RedisCluster, bool]:
    """Return the client to renew the worker's locks with, and whether it was built here.

    A client built here has timeouts that keep a failed tick under one
    interval; the caller closes it.

    Raises:
        TypeError: A duration is not an ``int``, or the connection cannot be used.
        ValueError: The durations cannot make a schedule.
    """
    try:
        timing = Timing(lock_duration, lock_renew_time)
    except (TypeError, ValueError) as error:
        raise type(error)(
            f"worker options lockDuration={lock_duration!r}, "
            f"lockRenewTime={lock_renew_time!r}: {error}"
        ) from error
    if connection is None:
        options = worker.opts.get("connection", {})
        if isinstance(options, (redis.asyncio.RedisCluster, redis.RedisCluster)):
            raise TypeError(
                "the worker talks to a Redis Cluster: pass the renewal client yourself, "
                "use_actor_lock_manager(worker, connection=actors.connection."
                f"cluster_client(url, interval_ms={timing.interval}))"
            )
        return client_like(options, timeout=command_timeout(timing)), True
    if isinstance(connection, str):
        return client_for_url(connection, timeout=command_timeout(timing)), True
    if not isinstance(connection, (redis.Redis, redis.RedisCluster)):
        raise TypeError(
            "connection must be a redis.Redis, a redis.RedisCluster or a URL, "
            f"got {type(connection).__name__}"
        )
    return connection, False


def must_wait(worker: Any, runs: Iterable[Run]) -> bool:
    """Whether a graceful close must go on renewing: a run is still to be moved."""
    if getattr(worker, "forceClosing", False):
        return False
    running = bool(getattr(worker, "running", False))
    # The worker's own tasks: a run tracked by other code is not the worker's to finish.
    processing = getattr(worker, "processing", ())
    for run in runs:
        if run.task is not None and not run.task.done() and run.task in processing:
            return True
        # Fetched, not yet processed: run() processes it while it runs.
        if run.task is None and running:
            return True
    return False


def stopper(
    name: str,
    manager: ManagerRef | None,
    fetcher: Fetcher | None,
    reader: concurrent.futures.ThreadPoolExecutor | None,
    conn: redis.Redis | redis.RedisCluster | None,
) -> Callable[[], None]:
    """Return what stops the given threads and closes ``conn``, to run off the loop."""

    def release() -> None:
        if fetcher is not None:
            fetcher.close()
        if reader is not None:
            reader.shutdown(wait=True)
        if manager is not None:
            try:
                manager.stop(timeout=_STOP_S)
            except pykka.Timeout:
                # The close must end: say so, and leave the daemon threads to the process.
                raise TimeoutError(
                    f"the lock manager of queue {name!r} did not stop within {_STOP_S:.0f} s"
                ) from None
        if conn is not None:
            conn.close()

    return release


async def off_the_loop(name: str, action: Callable[[], None]) -> BaseException | None:
    """Run ``action`` on a thread of its own, ended when this returns; return what it raised."""
    closer = concurrent.futures.ThreadPoolExecutor(1, f"bullmq-close-{name}")
    try:
        return await asyncio.wrap_future(closer.submit(attempt, action))
    finally:
        closer.shutdown(wait=True)


def attempt(action: Callable[[], None]) -> BaseException | None:
    """Run ``action``; return the error it raised, if any."""
    try:
        action()
    except Exception as error:
        return error
    return None
