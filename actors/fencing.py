"""Fencing: a stale holder's writes are refused, whatever the timing.

A lease tells a job its lock may be gone before another worker can take it,
but a job paused right after its last check (a GIL hold, SIGSTOP) writes once
it resumes. Two cures, for two kinds of store:

- :func:`fence` hands the holder a number that strictly increases across the
  successive holders of one job id, a job removed and added again included; a
  store that refuses a number smaller than one it has seen refuses every
  stale holder.
- :func:`guarded` applies writes to the same Redis only while the lock holds
  the caller's token, atomically: no number needed.

:func:`release` is the compare-and-delete of a job's lock. Each takes a
``redis.Redis`` or ``redis.RedisCluster`` client, or a ``redis.asyncio`` one
(then :func:`release` and :func:`fence` return a coroutine, and
:func:`guarded` is entered with ``async with``).
"""

from __future__ import annotations

import contextlib
import weakref
from typing import TYPE_CHECKING, Any, Literal, NoReturn, overload

import redis
import redis.asyncio
from redis.commands.core import DataAccessCommands
from redis.exceptions import ResponseError, WatchError

from actors.connection import encoding
from actors.keys import QueueKeys, hash_slot
from actors.messages import EXPIRED, STOLEN, LockLost
from actors.scripts import (
    RAW,
    require_replicas,
    require_wait,
    require_wait_async,
    script_source,
)
from actors.timing import require_text

if TYPE_CHECKING:
    from collections.abc import Coroutine, Iterator

    from actors.messages import Reason
    from actors.scripts import Replicas

__all__ = ["FENCE_FIELD", "FENCE_SCRIPT", "Guarded", "Writes", "fence", "guarded", "release"]

#: File name of the script that hands out fencing numbers.
FENCE_SCRIPT = "fence-2.lua"
#: The field of the job's hash that keeps its last fencing number.
FENCE_FIELD = "emq:fence"

#: A watched transaction is tried again when something touched the lock but left
#: it to its holder (a renewal); this many times, then the WatchError is raised.
WATCH_ATTEMPTS = 16

SyncClient = redis.Redis | redis.RedisCluster
AsyncClient = redis.asyncio.Redis | redis.asyncio.RedisCluster
#: What redis-py raises for a transaction across slots (its cluster
#: transactions came with it, in redis-py 6.1).
_CROSS_SLOT: type[Exception] = getattr(redis.exceptions, "CrossSlotTransactionError", ValueError)
_PIPELINES = (redis.client.Pipeline, redis.cluster.ClusterPipeline, redis.asyncio.client.Pipeline)


def _checked(client: object, keys: object, job_id: object, token: object) -> tuple[str, str, str]:
    """Check a helper's arguments in one place; return the lock key, the id and the token."""
    if isinstance(client, _PIPELINES) or not isinstance(
        client, (redis.Redis, redis.RedisCluster, redis.asyncio.Redis, redis.asyncio.RedisCluster)
    ):
        raise TypeError(
            "client must be a redis.Redis, redis.RedisCluster or redis.asyncio client "
            f"(not a pipeline), got {type(client).__name__}"
        )
    if not isinstance(keys, QueueKeys):
        raise TypeError(f"keys must be a QueueKeys, got {type(keys).__name__}")
    name = encoding(client)
    if name.replace("_", "-").lower() not in {"utf-8", "utf8"}:
        raise ValueError(f"client encodes with {name!r}; lock keys and tokens are UTF-8")
    job_id, token = require_text(job_id, "job_id"), require_text(token, "token")
    return keys.lock(job_id), job_id, token


def _is_async(client: object) -> bool:
    return isinstance(client, (redis.asyncio.Redis, redis.asyncio.RedisCluster))


async def _then(reply: Any, done: Any) -> Any:
    return done(await reply)


@overload
def release(
    client: SyncClient,
    keys: QueueKeys,
    job_id: str,
    token: str,
    *,
    replicas: int | Replicas | None = None,
) -> bool: ...
@overload
def release(
    client: AsyncClient,
    keys: QueueKeys,
    job_id: str,
    token: str,
    *,
    replicas: int | Replicas | None = None,
) -> Coroutine[Any, Any, bool]: ...
def release(
    client: Any,
    keys: QueueKeys,
    job_id: str,
    token: str,
    *,
    replicas: int | Replicas | None = None,
) -> Any:
    """Delete ``job_id``'s lock if it still holds ``token``; return whether this call did.

    A lock another worker holds now is left alone: call it when a job is given
    up without BullMQ's own move, so the job is handed on at the next stalled
    check instead of when the TTL runs out. The delete is a guarded write (the
    lock watched, read and deleted in MULTI/EXEC), so a client that retries
    dropped connections never sends it twice.

    ``False`` means the lock did not hold ``token`` when this call read it: it
    had expired, another worker holds it, or it was released already (by an
    earlier call, perhaps one whose answer was lost to a dropped connection).

    With ``replicas`` (a count or an :class:`~actors.Replicas`), the delete is
    followed by ``WAIT`` on its connection.

    Example:
        >>> actors.release(client, keys, "42", token)
        True

    Raises:
        NotReplicatedError: The delete ran, but fewer replicas confirmed it
            than ``replicas`` asks for: a failover may bring the lock back
            until its TTL runs out.
        TypeError: ``client`` or ``keys`` is of the wrong kind, or ``job_id``
            or ``token`` is not a ``str``.
        ValueError: ``job_id`` or ``token`` is empty, too long or not UTF-8.
        redis.exceptions.ConnectionError: The connection dropped while the
            delete was on its way: whether it ran is unknown (a later call
            answers ``False`` if it did).
        redis.exceptions.RedisError: The server or the connection failed.
    """
    lock, job_id, token = _checked(client, keys, job_id, token)
    block = Guarded(client, lock, job_id, token, require_replicas(replicas, conn=client))
    block._writes.delete(lock)
    if _is_async(client):
        return _release_async(block)
    try:
        block._run()
    except LockLost:
        return False
    return True


async def _release_async(block: Guarded) -> bool:
    try:
        await block._run_async()
    except LockLost:
        return False
    return True


@overload
def fence(
    client: SyncClient,
    keys: QueueKeys,
    job_id: str,
    token: str,
    *,
    replicas: int | Replicas | None = None,
) -> int: ...
@overload
def fence(
    client: AsyncClient,
    keys: QueueKeys,
    job_id: str,
    token: str,
    *,
    replicas: int | Replicas | None = None,
) -> Coroutine[Any, Any, int]: ...
def fence(
    client: Any,
    keys: QueueKeys,
    job_id: str,
    token: str,
    *,
    replicas: int | Replicas | None = None,
) -> Any:
    """Return the next fencing number of ``job_id``, while its lock holds ``token``.

    Every number handed out is larger than any handed to an earlier holder of
    the job's id (and than this holder's earlier ones), the holders of a job
    removed and added again with the same id included: a number is the larger
    of the job's last one plus one and the server's clock in microseconds, so a
    job added again starts above every number its id was given before (see
    ``fence-2.lua`` for what a server clock stepped back does). It is kept in
    the job's hash (field :data:`FENCE_FIELD`), so it goes away with the job;
    BullMQ ignores the field.

    With ``replicas`` (a count or an :class:`~actors.Replicas`), the number is
    handed out only once that many replicas confirmed it (``WAIT`` on the
    script's connection, in its round trip): a failover cannot hand the same
    number to the next holder.

    Example:
        >>> number = actors.fence(client, keys, "42", token)
        >>> store.write(result, fence=number)   # the store refuses a number below one it saw

    Raises:
        LockLost: The lock is gone (``"expired"``) or holds something else
            (``"stolen"``); nothing was written.
        LookupError: The lock holds ``token`` but there is no job's hash behind
            it: the key is gone, or holds another type (the message names the
            job, the key and its type).
        TypeError: ``client`` or ``keys`` is of the wrong kind, or ``job_id``
            or ``token`` is not a ``str``.
        ValueError: ``job_id`` or ``token`` is empty, too long or not UTF-8; or
            ``client`` is a cluster client and the lock and the job's hash
            cannot share a hash slot (name the queue with a hash tag, as
            ``QueueKeys("{myqueue}")``).
        NotReplicatedError: Fewer replicas confirmed the number than
            ``replicas`` asks for: it must not be used.
        redis.exceptions.RedisError: The server or the connection failed, or
            the job's :data:`FENCE_FIELD` holds something that is no fencing
            number.
    """
    lock, job_id, token = _checked(client, keys, job_id, token)
    confirm = require_replicas(replicas, conn=client)
    job = keys.key_prefix + job_id
    if isinstance(client, (redis.RedisCluster, redis.asyncio.RedisCluster)) and (
        hash_slot(lock) != hash_slot(job)
    ):
        raise ValueError(
            f"on a cluster, the lock {lock!r} and the job's hash {job!r} must share a hash "
            f"slot; name the queue with a hash tag, as QueueKeys('{{{keys.name}}}')"
        )

    def fenced(number: object) -> int:
        if isinstance(number, list):
            kind = number[-1].decode() if isinstance(number[-1], bytes) else str(number[-1])
            raise LookupError(
                f"job {job_id!r} has no hash at {job!r}: that key holds a {kind}, "
                "and a fence is kept in the job's hash"
            )
        if not isinstance(number, int) or number <= 0:
            if number == -2:
                raise LookupError(
                    f"job {job_id!r} has no hash at {job!r}: a fence is kept in the job's "
                    "hash, so that it goes away with the job"
                )
            raise LockLost(job_id, token, EXPIRED if number == 0 else STOLEN, "seen by fence()")
        return number

    if confirm is not None:
        return _fence_confirmed(client, lock, job, token, confirm, fenced)
    script = client.register_script(script_source(FENCE_SCRIPT))
    reply = script(keys=[lock, job], args=[token, FENCE_FIELD])

    return _then(reply, fenced) if _is_async(client) else fenced(reply)


#: The pools whose server took the replicas' wait once: asked once per pool,
#: and per kind of wait, before a helper's first write.
_WAITS_TAKEN: weakref.WeakKeyDictionary[Any, set[bool]] = weakref.WeakKeyDictionary()


def _wait_taken(client: Any, confirm: Replicas) -> None:
    """Refuse a wait the server refuses before the helper writes (once per pool)."""
    taken = _WAITS_TAKEN.setdefault(client.connection_pool, set())
    if confirm.aof not in taken:
        require_wait(client, confirm)
        taken.add(confirm.aof)


async def _wait_taken_async(client: Any, confirm: Replicas) -> None:
    taken = _WAITS_TAKEN.setdefault(client.connection_pool, set())
    if confirm.aof not in taken:
        await require_wait_async(client, confirm)
        taken.add(confirm.aof)


def _fence_confirmed(
    client: Any, lock: str, job: str, token: str, confirm: Replicas, fenced: Any
) -> Any:
    """Run the fence script and the replicas' wait in one pipeline: one connection, one trip."""

    def read(replies: list[Any]) -> int:
        number, reply = replies
        if isinstance(number, Exception):
            raise number
        checked: int = fenced(number)
        shortfall = confirm.shortfall(reply)
        if shortfall is not None:
            raise shortfall
        return checked

    def pipeline() -> Any:
        pipe = client.pipeline(transaction=False)
        pipe.execute_command("EVAL", script_source(FENCE_SCRIPT), 2, lock, job, token, FENCE_FIELD)
        pipe.execute_command(*confirm.command())
        return pipe

    if _is_async(client):

        async def fence_async() -> int:
            await _wait_taken_async(client, confirm)
            return read(await pipeline().execute(raise_on_error=False))

        return fence_async()
    _wait_taken(client, confirm)
    return read(pipeline().execute(raise_on_error=False))


class _Pinned:
    """A pool that lends one connection, and takes none back: ``WAIT`` after EXEC goes on it.

    A pipeline gets and gives back its connection through its pool's public
    ``get_connection`` and ``release``; everything else is the real pool's.
    """

    def __init__(self, pool: Any, connection: Any) -> None:
        self._pool = pool
        self._connection = connection

    def get_connection(self, *_: Any, **__: Any) -> Any:
        return self._connection

    def release(self, connection: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)


class _PinnedAsync(_Pinned):
    async def get_connection(self, *_: Any, **__: Any) -> Any:
        return self._connection

    async def release(self, connection: Any) -> None:  # type: ignore[override]
        pass


class Writes(DataAccessCommands):
    """The commands of a :func:`guarded` block, kept until it ends.

    Every data command of redis-py (``set``, ``hset``, ``incr``, ``xadd``...),
    and ``execute_command`` for a data command by name; none runs before the
    block ends. A block holds keyed data commands and nothing else: a name that
    is not one (MULTI, EXEC, DISCARD, WATCH, RESET, SELECT, CLIENT, a script, a
    name with stray whitespace...), in any spelling, str or bytes, is refused
    at the call. The block has no way to end its transaction: there is no
    ``multi``, ``execute``, ``reset`` or connection here.

    Once the block applied them, :attr:`results` holds their replies.
    """

    #: What redis-py's command protocols declare: a buffer dispatches no events,
    #: and its commands are typed as a synchronous client's.
    _event_dispatcher: Any = None
    _is_async_client: Literal[False] = False

    def __init__(self) -> None:
        self._commands: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self._results: list[Any] | None = None
        self._refused: TypeError | None = None

    @property
    def results(self) -> list[Any] | None:
        """The replies of the block's commands, in order, once applied; ``None`` before."""
        return self._results

    def execute_command(self, *args: Any, **options: Any) -> Writes:
        """Keep one command for the transaction; return the buffer, for chained calls.

        Raises:
            TypeError: ``args[0]`` names no keyed data command, as the server
                would read it: MULTI, EXEC, DISCARD, WATCH, RESET, SELECT,
                CLIENT, EVAL, an unknown name, or a name with stray whitespace.
                The block then writes nothing, even if this error is caught.
        """
        try:
            name = _data_command(args)
        except TypeError as exc:
            self._refused = exc
            raise
        self._commands.append(((name, *args[1:]), options))
        return self

    def watch(self, *names: Any) -> NoReturn:
        """Refused: the block watches its lock itself.

        Raises:
            TypeError: Always; the block then writes nothing.
        """
        self._refused = TypeError("WATCH has no place in a guarded block: it watches its lock")
        raise self._refused

    def unwatch(self) -> NoReturn:
        """Refused: it would undo the guard.

        Raises:
            TypeError: Always; the block then writes nothing.
        """
        self._refused = TypeError(
            "UNWATCH has no place in a guarded block: it would undo the guard"
        )
        raise self._refused


def _data_command(args: tuple[Any, ...]) -> str | bytes:
    """Return the command name ``args[0]``, fixed, if the server would read a data command in it.

    redis-py sends a ``str`` name split on whitespace (``"XINFO STREAM"`` is two
    words) and a bytes one as it is (split too when it holds a space): the
    name is checked in the one form where all of these agree, a single space
    between words and none around them.
    """
    name = args[0] if args else None
    # Plain copies: what is sent must be what was checked, whatever a subclass
    # answers later or a buffer holds by then.
    if isinstance(name, str):
        name = str.__str__(name)
        raw = name.encode("utf-8", "replace")
    elif isinstance(name, (bytes, bytearray, memoryview)):
        name = raw = bytes(name)
    else:
        raise TypeError(f"a command name is a str or bytes, got {type(name).__name__}")
    words = raw.split()
    if not words or b" ".join(words) != raw or words[0].upper() not in _DATA_COMMANDS:
        raise TypeError(
            f"{name!r} has no place in a guarded block: it takes keyed data commands only, "
            "spelled without stray whitespace, nothing that could end its transaction"
        )
    return name


#: The commands a guarded block takes: those that read or write keys (the
#: server's COMMAND table: Valkey 8.1, Redis 6.2) and those redis-py's data
#: methods send. Not in it: transactions, connection state, scripts, pub/sub,
#: administration, and commands that name no key.
_DATA_COMMANDS = frozenset(
    (
        b"APPEND ARCOUNT ARDEL ARDELRANGE ARGET ARGETRANGE ARGREP ARINFO ARINSERT ARLASTITEMS "
        b"ARLEN ARMGET ARMSET ARNEXT AROP ARRING ARSCAN ARSEEK ARSET BITCOUNT BITFIELD "
        b"BITFIELD_RO BITOP BITPOS BITRANGEINTARRAY BLMOVE BLMOVEM BLMPOP BLPOP BRPOP "
        b"BRPOPLPUSH BZMOVE BZMPOP BZPOPMAX BZPOPMIN COPY DECR DECRBY DEL DELEX DIGEST DUMP "
        b"EXISTS EXPIRE EXPIREAT EXPIRETIME GEOADD GEODIST GEOHASH GEOPOS GEORADIUS "
        b"GEORADIUSBYMEMBER GEORADIUSBYMEMBER_RO GEORADIUS_RO GEOSEARCH GEOSEARCHSTORE GET "
        b"GETBIT GETDEL GETEX GETRANGE GETSET HDEL HEXISTS HEXPIRE HEXPIREAT HEXPIRETIME HGET "
        b"HGETALL HGETDEL HGETEX HINCRBY HINCRBYFLOAT HKEYS HLEN HMGET HMSET HPERSIST HPEXPIRE "
        b"HPEXPIREAT HPEXPIRETIME HPTTL HRANDFIELD HSCAN HSET HSETEX HSETNX HSTRLEN HTTL HVALS "
        b"INCR INCRBY INCRBYFLOAT INCREX LCS LINDEX LINSERT LLEN LMOVE LMOVEM LMPOP LPOP LPOS "
        b"LPUSH LPUSHX LRANGE LREM LSET LTRIM MGET MOVE MSET MSETEX MSETNX PERSIST PEXPIRE "
        b"PEXPIREAT PEXPIRETIME PFADD PFCOUNT PFMERGE PSETEX PTTL RENAME RENAMENX RESTORE RPOP "
        b"RPOPLPUSH RPUSH RPUSHX SADD SADDEX SCARD SDIFF SDIFFCARD SDIFFSTORE SET SETBIT SETEX "
        b"SETNX SETRANGE SEXPIRE SEXPIREAT SEXPIRETIME SINTER SINTERCARD SINTERSTORE SISMEMBER "
        b"SMEMBERS SMISMEMBER SMOVE SORT SORT_RO SPERSIST SPEXPIRE SPEXPIREAT SPEXPIRETIME SPOP "
        b"SPTTL SRANDMEMBER SREM SSCAN STRALGO STRLEN STTL SUBSTR SUNION SUNIONCARD SUNIONSTORE "
        b"TOUCH TTL TYPE UNLINK XACK XACKDEL XADD XAUTOCLAIM XCFGSET XCLAIM XDEL XDELEX XGROUP "
        b"XINFO XLEN XNACK XPENDING XRANGE XREAD XREADGROUP XREVRANGE XSETID XTRIM ZADD ZCARD "
        b"ZCOUNT ZDIFF ZDIFFSTORE ZINCRBY ZINTER ZINTERCARD ZINTERSTORE ZLEXCOUNT ZMOVE "
        b"ZMOVEMEMBER ZMPOP ZMSCORE ZPOPMAX ZPOPMIN ZRANDMEMBER ZRANGE ZRANGEBYLEX "
        b"ZRANGEBYSCORE ZRANGESTORE ZRANK ZREM ZREMRANGEBYLEX ZREMRANGEBYRANK ZREMRANGEBYSCORE "
        b"ZREVRANGE ZREVRANGEBYLEX ZREVRANGEBYSCORE ZREVRANK ZSCAN ZSCORE ZUNION ZUNIONSTORE"
    ).split()
)


def guarded(
    client: SyncClient | AsyncClient,
    keys: QueueKeys,
    job_id: str,
    token: str,
    *,
    replicas: int | Replicas | None = None,
) -> Guarded:
    """Return a block whose writes apply atomically, only while the lock holds ``token``.

    On exit the lock is WATCHed, read and compared, and the block's commands run
    in MULTI/EXEC: if the lock changed hands in between, EXEC runs nothing.
    The ``as`` target is a :class:`Writes`: its :attr:`Writes.results` (as the
    block's :attr:`Guarded.results`) holds the replies once applied.

    With ``replicas`` (a count or an :class:`~actors.Replicas`), EXEC is
    followed by ``WAIT`` on the transaction's own connection: fewer
    confirmations than asked raise ``NotReplicatedError`` on exit (the writes
    applied on the primary; a failover may undo them). Not on a cluster client.

    Example:
        >>> with actors.guarded(client, keys, "42", token) as pipe:
        ...     pipe.hset("results", "42", result)
        >>> pipe.results
        [1]
        >>> async with actors.guarded(async_client, keys, "42", token) as pipe:
        ...     pipe.incr("done")

    Raises:
        LockLost: On exit, when the lock no longer holds ``token``; nothing was written.
        NotReplicatedError: On exit, with ``replicas``: the writes applied,
            but fewer replicas confirmed them than asked.
        TypeError, ValueError: As :func:`fence`, at the call. ``TypeError`` on
            exit too, with nothing written, when the block was refused a
            command (see :meth:`Writes.execute_command`) and went on.
    """
    lock, job_id, token = _checked(client, keys, job_id, token)
    return Guarded(client, lock, job_id, token, require_replicas(replicas, conn=client))


class Guarded:
    """A :func:`guarded` block; after it, :attr:`results` holds the replies of its commands."""

    def __init__(
        self, client: Any, lock: str, job_id: str, token: str, confirm: Replicas | None = None
    ) -> None:
        self._client = client
        self._confirm = confirm
        self._lock = lock
        self._job_id = job_id
        self._token = token
        self._writes = Writes()
        self._entered = False

    @property
    def results(self) -> list[Any] | None:
        """The replies of the block's commands, in order, once applied; ``None`` before."""
        return self._writes.results

    def __enter__(self) -> Writes:
        if _is_async(self._client):
            raise TypeError("a redis.asyncio client's guarded block is entered with 'async with'")
        return self._enter()

    def _enter(self) -> Writes:
        if self._entered:
            raise RuntimeError("a guarded block is entered once: call actors.guarded() again")
        self._entered = True
        return self._writes

    def __exit__(self, kind: object, *_: object) -> None:
        if kind is None:  # a block that raised writes nothing
            self._run()

    def _refuse_if_refused(self) -> None:
        # A caught refusal still ends the block with nothing written: whoever
        # sent DISCARD meant none of it to apply.
        refused = self._writes._refused
        if refused is not None:
            raise TypeError(f"nothing was written: the block was refused a command ({refused})")

    def _run(self) -> None:
        self._refuse_if_refused()
        confirm = self._confirm
        if confirm is None:
            with self._client.pipeline(transaction=True) as pipe:
                self._apply(pipe)
            return
        _wait_taken(self._client, confirm)
        pool = self._client.connection_pool
        connection = pool.get_connection()
        try:
            with self._client.pipeline(transaction=True) as pipe:
                pipe.connection_pool = _Pinned(pool, connection)
                self._apply(pipe)
            try:
                connection.send_command(*confirm.command())
                reply = self._client.parse_response(connection, "WAIT")
            except redis.RedisError as exc:
                reply = exc
        finally:
            pool.release(connection)
        _raise_unconfirmed(confirm, reply)

    def _apply(self, pipe: Any) -> None:
        """Watch, read and compare the lock, then run the block in MULTI/EXEC (again if touched)."""
        with self._in_slot():
            for _attempt in range(WATCH_ATTEMPTS):
                pipe.watch(self._lock)
                try:
                    held = pipe.execute_command("GET", self._lock, **RAW)
                except ResponseError as exc:
                    held = _not_a_token(exc)
                self._queue(pipe, held)
                try:
                    self._writes._results = pipe.execute()
                    return
                except WatchError as exc:
                    _again(exc)
        raise WatchError(f"the lock {self._lock!r} kept changing; nothing was written")

    async def __aenter__(self) -> Writes:
        if not _is_async(self._client):
            raise TypeError("a redis.Redis client's guarded block is entered with 'with'")
        return self._enter()

    async def __aexit__(self, kind: object, *_: object) -> None:
        if kind is None:
            await self._run_async()

    async def _run_async(self) -> None:
        self._refuse_if_refused()
        confirm = self._confirm
        if confirm is None:
            async with self._client.pipeline(transaction=True) as pipe:
                await self._apply_async(pipe)
            return
        await _wait_taken_async(self._client, confirm)
        pool = self._client.connection_pool
        connection = await pool.get_connection()
        try:
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.connection_pool = _PinnedAsync(pool, connection)
                await self._apply_async(pipe)
            try:
                await connection.send_command(*confirm.command())
                reply = await self._client.parse_response(connection, "WAIT")
            except redis.RedisError as exc:
                reply = exc
        finally:
            await pool.release(connection)
        _raise_unconfirmed(confirm, reply)

    async def _apply_async(self, pipe: Any) -> None:
        with self._in_slot():
            for _attempt in range(WATCH_ATTEMPTS):
                await pipe.watch(self._lock)
                try:
                    held = await pipe.execute_command("GET", self._lock, **RAW)
                except ResponseError as exc:
                    held = _not_a_token(exc)
                self._queue(pipe, held)
                try:
                    self._writes._results = await pipe.execute()
                    return
                except WatchError as exc:
                    _again(exc)
        raise WatchError(f"the lock {self._lock!r} kept changing; nothing was written")

    def _queue(self, pipe: Any, held: object) -> None:
        """Raise if ``held``, the lock's value, is not the token; else queue the block in MULTI."""
        if held != self._token.encode("utf-8"):
            reason: Reason = EXPIRED if held is None else STOLEN
            raise LockLost(self._job_id, self._token, reason, "seen by a guarded write")
        pipe.multi()
        for args, options in self._writes._commands:
            pipe.execute_command(*args, **options)

    @contextlib.contextmanager
    def _in_slot(self) -> Iterator[None]:
        try:
            yield
        except _CROSS_SLOT as exc:  # raised before anything is sent
            raise ValueError(
                "on a cluster, a guarded block writes only keys in its lock's hash slot "
                f"({hash_slot(self._lock)}; a hash tag in the key names puts them there): {exc}"
            ) from exc


def _raise_unconfirmed(confirm: Replicas, reply: object) -> None:
    """After EXEC: raise :class:`NotReplicatedError` unless the replicas confirmed the writes.

    The writes applied, so a wait that failed (the connection dropped while
    it waited, say) is said as such, the failure chained, not as a plain
    connection error that would leave a caller believing nothing ran.
    """
    shortfall = confirm.shortfall(reply)
    if shortfall is None:
        return
    if isinstance(reply, BaseException):
        raise shortfall from reply
    raise shortfall


def _not_a_token(exc: ResponseError) -> bytes:
    # A lock key of another type holds no token: another holder's.
    if str(exc).startswith("WRONGTYPE"):
        return b""
    raise exc


def _again(exc: WatchError) -> None:
    # Only a touched lock is tried again: redis-py's own transaction() also
    # retries a dropped connection, which could apply an EXEC twice. redis-py
    # raises that WatchError while handling the connection's error.
    dropped = exc.__cause__ or exc.__context__
    if dropped is not None:
        raise dropped from exc
