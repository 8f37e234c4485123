"""The shared renewal script on Redis: read once, sent by EVALSHA in chunks, loaded on NOSCRIPT.

``lua/extendLocks-1.lua`` is frozen: Node.js, Go, Elixir and Python workers
renew the same keys with it. A healthy tick costs one round trip: every chunk
of a batch is sent before any reply is read, each as soon as it is packed, and
the script is loaded only on NOSCRIPT.

:func:`extend_locks` is the plain call, BullMQ's ``extendLocks`` in Python;
:class:`RedisRenewer` is what a manager renews through unless told otherwise.
"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import TYPE_CHECKING, Any

import msgpack
import redis
from redis.client import NEVER_DECODE
from redis.exceptions import NoScriptError, ResponseError

from actors.connection import (
    check_client,
    client_for_url,
    command_timeout,
    is_cluster,
    socket_timeout,
    unreachable_message,
)
from actors.keys import hash_slot, lock_key
from actors.messages import (
    EXPIRED,
    STOLEN,
    BatchOutcome,
    ChunkError,
    NotReplicatedError,
    UnconfirmedLossError,
)
from actors.telemetry import Log
from actors.timing import MAX_DURATION_MS, check_lock_duration, require_int

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Sequence

    from actors.connection import Client
    from actors.keys import QueueKeys
    from actors.messages import Reason
    from actors.timing import Timing

__all__ = [
    "DEFAULT_MAX_BATCH",
    "FIND_SCRIPT",
    "MAX_REPLICAS",
    "RAW",
    "RELEASE_SCRIPT",
    "REPLICA_TIMEOUT_MS",
    "SCRIPT_NAME",
    "RedisRenewer",
    "Replicas",
    "classify_failed",
    "extend_locks",
    "find_taken",
    "lock_holds",
    "release_locks",
    "renew_batch",
    "require_batch",
    "require_replicas",
    "require_wait",
    "require_wait_async",
    "run_chunks",
    "script_sha",
    "script_source",
    "untrusted_take",
]

logger = Log("actors.scripts")

#: File name of the renewal script; the ``-1`` is its number of KEYS.
SCRIPT_NAME = "extendLocks-1.lua"

#: Job ids per script call. At 250 one call holds the server for 1-2 ms even
#: with 100,000 locks on it, and all of a tick's calls still share one round
#: trip, so a tick is no slower than with larger calls (``make bench``).
DEFAULT_MAX_BATCH = 250

#: File name of the compare-and-delete of one lock.
RELEASE_SCRIPT = "releaseLock-1.lua"


#: Most replicas a write may wait for. Each replica is one of the server's
#: clients, and 10,000 is a server's default ``maxclients``.
MAX_REPLICAS = 10_000

#: How long a write waits for its replicas when no timeout is given, in
#: milliseconds (a manager waits at most half its per-attempt wait).
REPLICA_TIMEOUT_MS = 1000


@dataclass(frozen=True, slots=True)
class Replicas:
    """Writes count once ``count`` replicas confirmed them: ``replicas=`` of managers and helpers.

    The write is followed, on its connection and in its round trip, by
    ``WAIT count timeout`` (or, with ``aof``, ``WAITAOF 0 count timeout``: the
    replicas wrote it to their append-only file). Fewer confirmations than
    ``count`` make the write :class:`~actors.messages.NotReplicatedError`:
    a renewal so answered moves no watched lock's deadline, a fence or a
    guarded write raises it.

    Example:
        >>> start_link(connection=url, keys=keys, replicas=Replicas(1, timeout=200))

    Where the write goes through a client, the timeout may take half of what
    the client waits for a reply (and, for a manager, half a renewal's wait
    per attempt): see :func:`require_replicas`. Not on a Redis Cluster client.

    Raises:
        TypeError: ``count`` or ``timeout`` is not an ``int``, ``aof`` not a ``bool``.
        ValueError: ``count`` is below 0 or above :data:`MAX_REPLICAS`, or
            ``timeout`` is not positive (``WAIT``'s 0 would wait for ever).
    """

    #: How many replicas must confirm each write; 0 asks for none.
    count: int
    #: Milliseconds the server waits for them; :data:`REPLICA_TIMEOUT_MS`, or
    #: what fits a manager's windows, when ``None``.
    timeout: int | None = None
    #: Wait for the replicas' append-only files (``WAITAOF``, Redis 7.2 and Valkey 8).
    aof: bool = False

    def __post_init__(self) -> None:
        # Kept as plain ints: an IntEnum would reach the server as its name.
        count = require_int(self.count, "replicas count", minimum=0, maximum=MAX_REPLICAS)
        object.__setattr__(self, "count", count)
        if self.timeout is not None:
            timeout = require_int(self.timeout, "replicas timeout", maximum=MAX_DURATION_MS)
            object.__setattr__(self, "timeout", timeout)
        if type(self.aof) is not bool:
            raise TypeError(f"replicas aof must be a bool, got {type(self.aof).__name__}")

    @property
    def wait_ms(self) -> int:
        """The timeout the server is sent, in milliseconds."""
        return REPLICA_TIMEOUT_MS if self.timeout is None else self.timeout

    def command(self) -> tuple[Any, ...]:
        """The command that follows a write: ``WAIT`` or ``WAITAOF``."""
        if self.aof:
            return ("WAITAOF", 0, self.count, self.wait_ms)
        return ("WAIT", self.count, self.wait_ms)

    def shortfall(self, reply: object) -> NotReplicatedError | None:
        """Read the command's reply: ``None`` once enough replicas confirmed, else the error."""
        command = str(self.command()[0])
        acked = reply[1] if self.aof and isinstance(reply, list) and len(reply) == 2 else reply
        if isinstance(reply, Exception) or isinstance(acked, bool) or not isinstance(acked, int):
            refused = str(reply) if isinstance(reply, Exception) else f"it returned {reply!r}"
            return NotReplicatedError(0, self.count, self.wait_ms, command, refused or "?")
        if acked >= self.count:
            return None
        return NotReplicatedError(acked, self.count, self.wait_ms, command)


def untrusted_take(
    job_id: str, sent: tuple[int, int], shortfall: NotReplicatedError, lock_duration: int
) -> tuple[int, int]:
    """Say a take the replicas did not confirm; return its send times moved back a lock's duration.

    So moved, the lock's deadline has passed when the job is tracked: its run
    is told ``"unconfirmed"`` at once, and the lock is left to expire (a
    failover may undo the take and hand the job to another worker at once).
    """
    logger.warning(
        "job %r was taken, but %s: a failover may undo the take, so its run is told it lost "
        "the lock at once",
        job_id,
        shortfall,
        extra={"job_id": job_id},
    )
    return sent[0] - lock_duration, sent[1] - lock_duration


def require_replicas(
    replicas: object, *, limit_ms: float | None = None, conn: object = None
) -> Replicas | None:
    """Check ``replicas=`` in one place; ``None`` (or 0) asks for no confirmation.

    The server's wait may take half of what the write may take at most: the
    other half is the calls' own and the reply's.

    Args:
        replicas: ``None``, an ``int`` count, or a :class:`Replicas`.
        limit_ms: A manager's wait per attempt (see
            :func:`~actors.connection.command_timeout`): the timeout is half of
            it at most (and that, up to :data:`REPLICA_TIMEOUT_MS`, when not given).
        conn: The client the writes go through: the timeout is half its
            ``socket_timeout`` at most; a cluster client is refused.

    Raises:
        TypeError: ``replicas`` is of another kind, or ``conn`` is a cluster client.
        ValueError: The count is out of range, or the timeout does not fit
            ``limit_ms`` or the client's ``socket_timeout``.
    """
    if replicas is None:
        return None
    if not isinstance(replicas, Replicas):
        if isinstance(replicas, bool) or not isinstance(replicas, int):
            raise TypeError(
                f"replicas must be an int or an actors.Replicas, got {type(replicas).__name__}"
            )
        replicas = Replicas(replicas)
    if replicas.count == 0:
        return None
    if is_cluster(conn) or isinstance(conn, redis.asyncio.RedisCluster):
        raise TypeError(
            "replicas= is not taken with a Redis Cluster client: a cluster pipeline sends a "
            "write redirected by MOVED again to another node, after the wait on the first one "
            "was answered, so the wait would vouch for a write it never saw"
        )
    if limit_ms is not None:
        most = max(1, int(limit_ms // 2))
        if replicas.timeout is None:
            replicas = Replicas(replicas.count, min(REPLICA_TIMEOUT_MS, most), replicas.aof)
        elif replicas.timeout > most:
            raise ValueError(
                f"replicas timeout must be at most {most} ms (half a renewal's {limit_ms:g} ms "
                f"wait per attempt), got {replicas.timeout}: a renewal answered later can no "
                "longer keep a watched lock's deadline"
            )
    given = socket_timeout(conn) if conn is not None else None
    if given is not None and replicas.wait_ms > given * 1000 / 2:
        raise ValueError(
            f"replicas timeout is {replicas.wait_ms} ms but the client gives up a reply after "
            f"socket_timeout={given:g} s: wait at most half of that "
            f"(Replicas({replicas.count}, timeout={max(1, int(given * 500))})), "
            "or build the client with a longer socket_timeout"
        )
    return replicas


def require_wait(conn: Any, replicas: Replicas) -> None:
    """Raise ``ValueError`` if the server refuses the replicas' wait; nothing if unreachable.

    One round trip (``WAIT 0 1`` or ``WAITAOF 0 0 1``: they ask for nothing, so
    they return at once), at the call that asked for it: the error names the
    option rather than coming back from every tick.
    """
    try:
        conn.execute_command(*_probe(replicas))
    except (redis.ConnectionError, redis.TimeoutError):
        return  # each write says so then
    except redis.RedisError as exc:
        raise _refused(replicas, exc) from None


async def require_wait_async(conn: Any, replicas: Replicas) -> None:
    """:func:`require_wait` on a ``redis.asyncio`` client."""
    try:
        await conn.execute_command(*_probe(replicas))
    except (redis.ConnectionError, redis.TimeoutError):
        return
    except redis.RedisError as exc:
        raise _refused(replicas, exc) from None


def _probe(replicas: Replicas) -> tuple[Any, ...]:
    return ("WAITAOF", 0, 0, 1) if replicas.aof else ("WAIT", 0, 1)


def _refused(replicas: Replicas, exc: redis.RedisError) -> ValueError:
    command = "WAITAOF" if replicas.aof else "WAIT"
    hint = ""
    if replicas.aof and "unknown command" in str(exc).lower():
        hint = " (WAITAOF needs Redis 7.2 or later, or Valkey 8): use aof=False"
    return ValueError(f"replicas= needs {command}, which the server refused: {exc}{hint}")


@lru_cache(maxsize=4)
def script_source(name: str = SCRIPT_NAME) -> str:
    """Return the text of a script of the package (``extendLocks-1.lua`` by default).

    The scripts live beside this module; the top-level ``lua/extendLocks-1.lua``
    that other runtimes read is a link to the same file.
    """
    return (resources.files("actors") / "lua" / name).read_text(encoding="utf-8")


@lru_cache(maxsize=4)
def script_sha(name: str = SCRIPT_NAME) -> str:
    """Return the SHA1 by which the server knows a script of the package."""
    return hashlib.sha1(script_source(name).encode("utf-8")).hexdigest()


def _as_ids(reply: Any) -> list[str]:
    if not isinstance(reply, list):
        raise ResponseError(f"{SCRIPT_NAME} returned {type(reply).__name__}, expected a list")
    return [item.decode("utf-8") if isinstance(item, bytes) else str(item) for item in reply]


def _as_list(items: Sequence[str]) -> list[str]:
    # A chunk is already a fresh list (a slice): copying it again costs a pass.
    return items if type(items) is list else list(items)


def _evalsha_args(
    keys: QueueKeys, job_ids: Sequence[str], tokens: Sequence[str], duration: int
) -> tuple[Any, ...]:
    # KEYS[1] stalled; ARGV[1] key prefix WITH its colon, ARGV[2] packed
    # tokens, ARGV[3] packed ids, ARGV[4] TTL in ms.
    return (
        "EVALSHA",
        script_sha(),
        1,
        keys.stalled,
        keys.key_prefix,
        msgpack.packb(_as_list(tokens)),
        msgpack.packb(_as_list(job_ids)),
        duration,
    )


def _with_source(evalsha_args: tuple[Any, ...]) -> tuple[Any, ...]:
    # EVAL caches the script on whichever cluster node serves the slot now;
    # SCRIPT LOAD reaches only the masters the client knows of.
    return ("EVAL", script_source(), *evalsha_args[2:])


def _is_noscript(reply: object) -> bool:
    return isinstance(reply, NoScriptError) or (
        isinstance(reply, ResponseError) and str(reply).startswith("NOSCRIPT")
    )


def _send_chunks(
    conn: Any,
    keys: QueueKeys,
    job_ids: Sequence[str],
    tokens: Sequence[str],
    duration: int,
    bounds: list[tuple[int, int]],
    *,
    with_source: bool = False,
    replicas: Replicas | None = None,
) -> list[Any]:
    """Send the chunks' calls, then the replicas' wait if any, in one round trip; return replies.

    The wait goes on the calls' own connection: it counts the replicas that
    have every write made on that connection.
    """

    # EVALSHA by hand, not redis-py's Script: its pipeline sends SCRIPT EXISTS
    # before every batch, a second round trip on each tick.
    def calls() -> Iterator[tuple[Any, ...]]:
        for start, stop in bounds:
            args = _evalsha_args(keys, job_ids[start:stop], tokens[start:stop], duration)
            yield _with_source(args) if with_source else args
        if replicas is not None:
            yield replicas.command()

    count = len(bounds) + (replicas is not None)
    if not is_cluster(conn) and not _caches(conn):
        return _stream(conn, calls, count)
    pipe = conn.pipeline(transaction=False)
    # Routed by hand: a cluster pipeline otherwise asks its default node for
    # each EVALSHA's keys, and fails while that node is down.
    options = {"target_nodes": conn.get_node_from_key(keys.stalled)} if is_cluster(conn) else {}
    for args in calls():
        pipe.execute_command(*args, **options)
    replies: list[Any] = pipe.execute(raise_on_error=False)
    return replies


def _caches(conn: Any) -> bool:
    """Whether ``conn`` keeps a client-side cache (``cache_config``, RESP3).

    Its connections health-check every send, so a PING could go out between
    two chunks and take a chunk's reply: such a client sends the batch in one
    pipeline, after one check.
    """
    return getattr(conn.connection_pool, "cache", None) is not None


def _stream(conn: Any, calls: Callable[[], Iterator[tuple[Any, ...]]], count: int) -> list[Any]:
    """Send each call as soon as it is packed, then read every reply, each error in its place.

    One round trip, as a pipeline's, but the server runs the first call while
    the next is packed: redis-py's pipeline packs all of them before it sends
    any. The client's own retry policy applies to the whole, as to a pipeline's.
    """
    pool = conn.connection_pool
    connection = pool.get_connection()

    def attempt() -> list[Any]:
        check = True
        for args in calls():
            connection.send_packed_command(connection.pack_command(*args), check_health=check)
            check = False
        replies: list[Any] = []
        for _ in range(count):
            try:
                # EVALSHA's and WAIT's replies need no callback: read as they come.
                replies.append(conn.parse_response(connection, "EVALSHA"))
            except ResponseError as exc:
                replies.append(exc)
        return replies

    try:
        replies: list[Any] = connection.retry.call_with_retry(
            attempt, lambda _error: connection.disconnect()
        )
    except BaseException:
        # Replies may be left unread: the connection is out of step with its socket.
        connection.disconnect()
        raise
    finally:
        pool.release(connection)
    return replies


def run_chunks(
    conn: Any,
    keys: QueueKeys,
    job_ids: Sequence[str],
    tokens: Sequence[str],
    duration: int,
    max_batch: int,
    replicas: Replicas | None = None,
) -> BatchOutcome:
    """Run the script over ``job_ids`` in chunks of ``max_batch``, all in one round trip.

    Nothing is checked here (see :func:`renew_batch`). A chunk answered
    NOSCRIPT is sent again once the script is loaded (on a cluster, as EVAL).
    With ``replicas``, each round trip ends with their wait; when fewer
    replicas confirmed, every chunk that ran is also in ``errors``, with a
    :class:`~actors.messages.NotReplicatedError` (its failed ids stand).

    Returns:
        The ids each chunk that ran reported, and the chunks that did not run
        (or ran unconfirmed by the replicas).

    Raises:
        redis.exceptions.RedisError: The connection failed: no chunk is known
            to have run.
    """
    total = len(job_ids)
    bounds = [(start, min(start + max_batch, total)) for start in range(0, total, max_batch)]
    replies = _send_chunks(conn, keys, job_ids, tokens, duration, bounds, replicas=replicas)
    confirmations = [replies.pop()] if replicas is not None else []
    missing = [i for i, reply in enumerate(replies) if _is_noscript(reply)]
    if missing:
        # The server lost its script cache (restart, SCRIPT FLUSH, failover):
        # load the script for the next ticks, and send the same calls again as
        # EVAL, which another flush meanwhile cannot refuse.
        logger.debug("%s not cached by the server; loading it", SCRIPT_NAME)
        if not is_cluster(conn):
            with contextlib.suppress(ResponseError):  # SCRIPT refused (an ACL): EVAL still runs
                conn.script_load(script_source())
        again = [bounds[i] for i in missing]
        resent = _send_chunks(
            conn, keys, job_ids, tokens, duration, again, with_source=True, replicas=replicas
        )
        if replicas is not None:
            # Perhaps another connection: each wait vouches for its own writes.
            confirmations.append(resent.pop())
        for i, reply in zip(missing, resent, strict=True):
            replies[i] = reply
    failed: list[str] = []
    errors: list[ChunkError] = []
    for (start, stop), reply in zip(bounds, replies, strict=True):
        try:
            if isinstance(reply, Exception):
                raise reply
            failed.extend(_as_ids(reply))
        except ResponseError as exc:
            errors.append(ChunkError(start, stop, exc))
    shortfall = None
    if replicas is not None:
        shortfall = next(filter(None, map(replicas.shortfall, confirmations)), None)
    if shortfall is not None:
        refused = {(chunk.start, chunk.stop) for chunk in errors}
        errors.extend(
            ChunkError(start, stop, shortfall)
            for start, stop in bounds
            if (start, stop) not in refused
        )
    return BatchOutcome(failed, errors)


#: Options of a command whose reply is kept as the server's bytes. redis-py
#: honours them on ``redis.Redis`` and ``redis.RedisCluster``, in pipelines too.
RAW: dict[str, Any] = {NEVER_DECODE: True}


def lock_holds(conn: Any, keys: QueueKeys, job_id: str, token: str) -> bool:
    """Whether ``job_id``'s lock holds exactly ``token`` (one GET, read as raw bytes).

    Read raw whatever the client's ``decode_responses``: a value that is not
    UTF-8 is another holder's, not an unreadable reply.

    Raises:
        redis.exceptions.RedisError: The read failed.
    """
    return bool(conn.execute_command("GET", keys.lock(job_id), **RAW) == token.encode("utf-8"))


def classify_failed(
    conn: Any,
    keys: QueueKeys,
    job_ids: Sequence[str],
    tokens: Sequence[str],
    outcome: BatchOutcome,
) -> BatchOutcome:
    """Read the reported locks back: say why each was lost, keep the still-held ones.

    The script's reply is BullMQ's, a list of ids, so the reason is read
    afterwards: one pipelined GET per reported lock, a round trip paid only
    when something was lost.

    - no key: :data:`EXPIRED`;
    - any value but the exact UTF-8 bytes of the job's token, or a key of
      another type: :data:`STOLEN`;
    - the job's own token: the script could not see it (a cluster slot was
      migrating): a one-job :class:`ChunkError` carrying
      :class:`UnconfirmedLossError`, retried by the next tick.

    An id may come more than once in a batch, each time with its own token:
    each report is matched to an entry of that id whose token the lock does
    not hold. When the read-back itself fails, every reported id becomes such
    an error, retried by the next tick.
    """
    reported = list(dict.fromkeys(outcome.failed))
    try:
        pipe = conn.pipeline(transaction=False)
        for job_id in reported:
            # Built as the script builds it; read undecoded, as decoding could
            # raise, or make foreign bytes equal a token holding U+FFFD.
            pipe.execute_command("GET", lock_key(keys.key_prefix, job_id), **RAW)
        values = pipe.execute(raise_on_error=False)
    except Exception as exc:
        # Not only RedisError: whatever went wrong, these locks may still be
        # held, so the jobs stay tracked and on_error hears of it every tick.
        logger.warning(
            "queue %r: could not read back %d lost lock(s), retrying them next tick: %s: %s",
            keys.name,
            len(reported),
            type(exc).__name__,
            exc,
            extra={"queue": keys.name, "jobs": len(reported)},
        )
        values = [exc] * len(reported)
    value_of = dict(zip(reported, values, strict=True))
    entries = _reported_entries(job_ids, tokens, outcome, value_of)
    lost: list[str] = []
    reasons: dict[str, Reason] = {}
    held: list[ChunkError] = []
    for job_id in outcome.failed:
        value = value_of[job_id]
        i, holds = entries[job_id].pop(0) if entries[job_id] else (None, False)
        if isinstance(value, ResponseError) and str(value).startswith("WRONGTYPE"):
            # The key holds something that is not a token: another holder's.
            reasons[job_id] = STOLEN
        elif value is not None and not isinstance(value, bytes):
            # An error, or a reply GET never gives: the lock's state is unknown.
            if i is not None:
                cause = value if isinstance(value, Exception) else _unexpected(value)
                held.append(ChunkError(i, i + 1, _unconfirmed(keys, job_id, cause)))
                continue
            reasons[job_id] = STOLEN
        elif holds and i is not None:
            held.append(ChunkError(i, i + 1, _unconfirmed(keys, job_id, None)))
            continue
        else:
            reasons[job_id] = EXPIRED if value is None else STOLEN
        lost.append(job_id)
    if held:
        logger.info(
            "queue %r: %d lock(s) reported lost could not be confirmed lost; "
            "retrying them next tick",
            keys.name,
            len(held),
            extra={"queue": keys.name, "jobs": len(held)},
        )
    return BatchOutcome(lost, [*outcome.errors, *held], reasons)


def _reported_entries(
    job_ids: Sequence[str],
    tokens: Sequence[str],
    outcome: BatchOutcome,
    value_of: dict[str, object],
) -> dict[str, list[tuple[int, bool]]]:
    """Each reported id's entries ``(index, lock holds its token)`` that ran, the lost first.

    An entry holding its token is reported only when the script could not see the lock.
    """
    skipped = {
        i
        for error in outcome.errors
        if not isinstance(error.error, NotReplicatedError)  # those ran
        for i in range(error.start, error.stop)
    }
    found: dict[str, list[tuple[int, bool]]] = {job_id: [] for job_id in value_of}
    for i, job_id in enumerate(job_ids):
        slot = found.get(job_id)
        if slot is not None and i not in skipped:
            value = value_of[job_id]
            slot.append((i, isinstance(value, bytes) and value == tokens[i].encode("utf-8")))
    for slot in found.values():
        slot.sort(key=lambda entry: entry[1])  # stable: input order within each kind
    return found


def _unexpected(value: object) -> ResponseError:
    return ResponseError(f"GET returned {type(value).__name__}, expected bytes or nothing")


def _unconfirmed(keys: QueueKeys, job_id: str, cause: Exception | None) -> UnconfirmedLossError:
    if cause is not None:
        error = UnconfirmedLossError(
            f"the lock of job {job_id!r} was reported lost but could not be read back "
            f"({type(cause).__name__}: {cause}); it is retried next tick"
        )
        # Kept for on_error and the logged traceback: the cause may be no RedisError.
        error.__cause__ = cause
        return error
    return UnconfirmedLossError(
        f"the lock of job {job_id!r} is still held but the renewal script could not see it "
        f"(slot {hash_slot(keys.stalled)} is being migrated); it is retried next tick"
    )


def require_batch(
    job_ids: Sequence[str], tokens: Sequence[str], duration: int, *, each: bool = True
) -> None:
    """Check the arguments of one batched renewal before anything is sent.

    Args:
        job_ids: The ids to renew.
        tokens: Each id's token, in the same order.
        duration: The TTL to set, in milliseconds.
        each: Check every id and token too; a caller that checked them when
            they were tracked passes ``False`` to save a pass over the batch.

    Raises:
        TypeError: ``duration`` is not an ``int``.
        ValueError: The lengths differ, ``duration`` is not positive, or an
            id or token is not a non-empty ``str``.
    """
    if len(job_ids) != len(tokens):
        raise ValueError(
            f"job_ids and tokens must have the same length, got {len(job_ids)} and {len(tokens)}"
        )
    require_int(duration, "duration")
    if not each:
        return
    for argument, values in (("job_ids", job_ids), ("tokens", tokens)):
        for value in values:
            if not isinstance(value, str) or not value:
                raise ValueError(f"{argument} must be non-empty str, got {value!r}")


def renew_batch(
    conn: Any,
    keys: QueueKeys,
    job_ids: Sequence[str],
    tokens: Sequence[str],
    duration: int,
    *,
    max_batch: int = DEFAULT_MAX_BATCH,
    check_items: bool = True,
    replicas: Replicas | None = None,
) -> BatchOutcome:
    """Renew many locks in one round trip, ``max_batch`` ids per script call.

    Up to ``max_batch`` ids make exactly one EVALSHA. More are split into
    chunks, all sent in one pipeline (no MULTI), so no single script holds the
    server for long. A chunk that the server refuses (BUSY, OOM, a reply that
    is not a list) is returned in ``errors`` while the other chunks' results
    stand. Each id reported failed is read back by :func:`classify_failed`,
    which gives its reason (or, if still held, an error: a slot was migrating).

    Args:
        conn: A ``redis.Redis`` or ``redis.RedisCluster`` client.
        keys: The queue's keys.
        job_ids: Ids of the jobs to renew.
        tokens: Each job's lock token, in the same order.
        duration: The new lock TTL, in milliseconds.
        max_batch: Most ids per script call.
        check_items: Check that every id and token is a non-empty ``str``
            (the lock manager checked them already when they were tracked).
        replicas: Replicas that must confirm the renewals (see
            :class:`Replicas`; checked by :func:`require_replicas`).

    Returns:
        The failed ids of the chunks that ran, and the chunks that did not
        (or ran unconfirmed by the replicas).

    Raises:
        ValueError: Mismatched lengths, an empty id or token, a bad duration
            or ``max_batch``; nothing is sent.
        redis.exceptions.RedisError: The connection failed: no chunk is known
            to have run.
    """
    require_batch(job_ids, tokens, duration, each=check_items)
    max_batch = require_int(max_batch, "max_batch")
    if not job_ids:
        return BatchOutcome([], [])
    outcome = run_chunks(conn, keys, job_ids, tokens, duration, max_batch, replicas)
    if outcome.failed:
        outcome = classify_failed(conn, keys, job_ids, tokens, outcome)
    return outcome


def extend_locks(
    conn: Any,
    keys: QueueKeys,
    job_ids: Sequence[str],
    tokens: Sequence[str],
    duration: int,
    *,
    max_batch: int | None = None,
    replicas: int | Replicas | None = None,
) -> list[str]:
    """Renew the locks of ``job_ids`` with ``extendLocks-1.lua``.

    Example:
        >>> extend_locks(redis.Redis(), QueueKeys("q"), ["j1"], [token], 30000)
        []

    Args:
        conn: A ``redis.Redis`` or ``redis.RedisCluster`` client.
        keys: The queue's keys.
        job_ids: Ids of the jobs to renew.
        tokens: Each job's lock token, in the same order.
        duration: The new lock TTL, in milliseconds.
        max_batch: Most ids per script call; ``None`` sends all of them in one.
        replicas: Replicas that must confirm the renewals, as a count or a
            :class:`Replicas` (``None``: the primary's word is enough).

    Returns:
        The ids whose lock was gone or held by another token, as ``str``; an
        empty list when every lock was renewed. An empty batch returns ``[]``
        without a round trip.

    Raises:
        ValueError: Mismatched lengths, an empty id or token, a bad
            duration or ``replicas``; nothing is sent.
        NotReplicatedError: Fewer replicas confirmed the renewals than asked.
        redis.exceptions.RedisError: The server or the connection failed.
    """
    outcome = renew_batch(
        conn,
        keys,
        job_ids,
        tokens,
        duration,
        max_batch=max_batch or max(len(job_ids), 1),
        replicas=require_replicas(replicas, conn=conn),
    )
    if outcome.errors:
        raise outcome.errors[0].error
    return outcome.failed


class RedisRenewer:
    """Renews with ``extendLocks-1.lua`` on one server or a cluster.

    Called on the manager's renewal thread, one batch at a time. After a
    connection failure it drops the pool's idle connections, so the retry
    that follows opens a fresh one instead of a socket a partition left dead.

    Args:
        connection: A ``redis.Redis`` or ``redis.RedisCluster`` client, or a
            Redis URL (a client is then built whose attempts end within
            :func:`~actors.connection.command_timeout`, and closed with the renewer).
        timing: The manager's windows: the TTL each renewal sets, and what
            bounds an attempt.
        safety_margin: The watched locks' margin in ms.
        max_batch: Most ids per script call; a batch's calls share one round trip.
        replicas: Replicas that must confirm each renewal before a watched
            lock's deadline moves (a count or a :class:`Replicas`).

    Raises:
        TypeError: ``connection`` is not a client or a URL; ``max_batch`` is
            not an ``int``; ``replicas`` is of another kind.
        ValueError: ``max_batch`` is not positive, ``lock_duration`` is under
            :data:`~actors.timing.MIN_REDIS_LOCK_DURATION`, the client's
            encoding is not UTF-8, a cluster client was given for keys that
            cannot share one slot, or ``replicas`` is out of range or waits
            longer than a renewal may take; ``WAITAOF`` on a server without it.
    """

    def __init__(
        self,
        connection: Client | str,
        keys: QueueKeys,
        timing: Timing,
        safety_margin: int,
        max_batch: int = DEFAULT_MAX_BATCH,
        replicas: int | Replicas | None = None,
    ) -> None:
        self._max_batch = require_int(max_batch, "max_batch")
        check_lock_duration(timing.lock_duration)
        self._owns = isinstance(connection, str)
        conn: Any = (
            client_for_url(connection, timeout=command_timeout(timing, safety_margin))
            if isinstance(connection, str)
            else connection
        )
        try:
            check_client(conn, keys, timing, safety_margin)
            limit = command_timeout(timing, safety_margin, cluster=is_cluster(conn)) * 1000
            #: The replicas each renewal waits for, if any.
            self.replicas = require_replicas(replicas, limit_ms=limit, conn=conn)
            if self.replicas is not None:
                require_wait(conn, self.replicas)
        except BaseException:
            if self._owns:
                conn.close()
            raise
        self.connection: Client = conn
        self.keys = keys
        self.lock_duration = timing.lock_duration
        self._told_unreachable = False

    @property
    def max_batch(self) -> int:
        """Most ids per script call."""
        return self._max_batch

    def __call__(self, job_ids: Sequence[str], tokens: Sequence[str]) -> BatchOutcome:
        """Renew ``job_ids`` held with ``tokens`` in one round trip."""
        conn, keys, duration = self.connection, self.keys, self.lock_duration
        try:
            # Every id and token was checked when the job was tracked.
            return renew_batch(
                conn,
                keys,
                job_ids,
                tokens,
                duration,
                max_batch=self._max_batch,
                check_items=False,
                replicas=self.replicas,
            )
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self._unreachable(exc)
            raise

    def release(self, locks: Sequence[tuple[str, str]]) -> int:
        """Delete each ``(job_id, token)`` lock that still holds its token; return how many.

        Raises:
            redis.exceptions.RedisError: The server or the connection failed.
        """
        try:
            return release_locks(self.connection, self.keys, locks)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self._unreachable(exc)
            raise

    def probe(self) -> None:
        """Load the script, so the first tick is one round trip; say an unreachable server once."""
        try:
            self.connection.ping()
            with contextlib.suppress(redis.RedisError):  # a tick loads it on NOSCRIPT anyway
                self.connection.script_load(script_source())
        except Exception as exc:  # not only RedisError: whatever it is, the ticks retry
            self._told_unreachable = True
            logger.warning(
                "%s",
                unreachable_message(self.connection, self.keys.name, exc),
                extra={"queue": self.keys.name},
            )

    def _unreachable(self, exc: BaseException) -> None:
        # Idle connections may be sockets a partition left dead: the retry
        # opens new ones. Busy ones belong to other users of the client.
        pool = getattr(self.connection, "connection_pool", None)
        if pool is not None:
            pool.disconnect(inuse_connections=False)
        # Once, at the first failure: where the server was looked for and
        # what to check. The tick's own error line follows, every streak.
        if not self._told_unreachable:
            self._told_unreachable = True
            logger.error(
                "%s",
                unreachable_message(self.connection, self.keys.name, exc),
                extra={"queue": self.keys.name},
            )

    def close(self) -> None:
        """Close the client if the renewer built it from a URL."""
        if self._owns:
            self._owns = False
            self.connection.close()


def release_locks(conn: Any, keys: QueueKeys, locks: Iterable[tuple[str, str]]) -> int:
    """Delete each ``(job_id, token)`` lock that still holds its token, in one round trip.

    A lock another worker holds now is left alone (``releaseLock-1.lua``).

    Returns:
        How many locks were deleted.

    Raises:
        redis.exceptions.RedisError: The server or the connection failed.
    """
    script = conn.register_script(script_source(RELEASE_SCRIPT))
    pipe = conn.pipeline(transaction=False)
    count = 0
    for job_id, token in locks:
        script(keys=[keys.lock(job_id)], args=[token], client=pipe)
        count += 1
    if not count:
        return 0
    return sum(1 for reply in pipe.execute(raise_on_error=False) if reply == 1)


#: File name of the search for the jobs fetches took (see :func:`find_taken`).
FIND_SCRIPT = "findTaken-1.lua"


def find_taken(conn: Any, keys: QueueKeys, tokens: Sequence[str]) -> list[tuple[str, int] | None]:
    """Return, for each token, the active job whose lock holds it and the lock's PTTL, or ``None``.

    One script call (``findTaken-1.lua``) that walks the queue's active list
    from its head. Ids are read as raw bytes whatever the client's
    ``decode_responses``; one that is not UTF-8 counts as not found.

    Raises:
        redis.exceptions.RedisError: The server or the connection failed.
    """
    if not tokens:
        return []
    call = (1, keys.base + ":active", keys.key_prefix, *tokens)
    try:
        replies = conn.execute_command("EVALSHA", script_sha(FIND_SCRIPT), *call, **RAW)
    except NoScriptError:
        replies = conn.execute_command("EVAL", script_source(FIND_SCRIPT), *call, **RAW)
    if not isinstance(replies, list) or len(replies) != len(tokens):
        raise ResponseError(f"{FIND_SCRIPT} answered {replies!r:.200} for {len(tokens)} tokens")
    found: list[tuple[str, int] | None] = []
    for reply in replies:
        try:
            job_id, pttl = reply
            found.append((job_id.decode("utf-8"), int(pttl)))
        except (TypeError, ValueError, AttributeError):
            found.append(None)
    return found
