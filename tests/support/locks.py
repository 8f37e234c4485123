"""Locks on the real server: taking them as a worker does, and reading them back.

Every function takes the client to use, so the same helpers serve a flushed
per-test client, a private server behind a fault proxy and one cluster node.
Replies may be bytes or text (a client built with ``decode_responses``).
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import TypeAlias

    import redis

    from actors import QueueKeys
    from actors.connection import Client

    #: Each job's id and the token its lock holds (or should hold).
    Tokens: TypeAlias = Mapping[str, str]

__all__ = [
    "LockWatch",
    "alive",
    "job_ids",
    "lost_locks",
    "lowest_pttl",
    "new_token",
    "set_locks",
    "steal",
    "take_locks",
    "watch",
    "watch_locks",
]

#: Commands per pipeline: 100,000 locks go in a few round trips, none huge.
CHUNK = 10_000


def job_ids(count: int, prefix: str = "job") -> list[str]:
    """Return ``count`` job ids: ``["job-0", "job-1", ...]``."""
    return [f"{prefix}-{i}" for i in range(count)]


def new_token() -> str:
    """Return a fresh lock token (a UUID4, as BullMQ and EchoMQ workers use)."""
    return str(uuid.uuid4())


def _text(value: Any) -> str | None:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _chunks(items: list[str]) -> Iterable[list[str]]:
    for start in range(0, len(items), CHUNK):
        yield items[start : start + CHUNK]


def set_locks(
    client: Client,
    keys: QueueKeys,
    tokens: Tokens,
    ttl_ms: int,
    *,
    replicas: int = 0,
) -> None:
    """SET NX PX each job's token on its lock key, as a worker's move-to-active does.

    Args:
        client: A client of the server (or of the cluster node) that holds the locks.
        keys: The queue's keys.
        tokens: Each job's id and the token its lock is to hold.
        ttl_ms: The locks' TTL, in milliseconds.
        replicas: Return only once this many replicas have the writes (``WAIT``).

    Raises:
        AssertionError: A lock was already held, or the replicas did not
            acknowledge within 10 s.
    """
    chunks = list(_chunks(list(tokens)))
    for n, chunk in enumerate(chunks):
        pipe: Any = client.pipeline(transaction=False)
        for job_id in chunk:
            pipe.set(keys.lock(job_id), tokens[job_id], nx=True, px=ttl_ms)
        waits = bool(replicas) and n == len(chunks) - 1
        if waits:
            # On the connection that wrote: the replication stream is ordered,
            # so once the last write is acknowledged, every earlier one is too.
            pipe.execute_command("WAIT", replicas, 10_000)
        replies = pipe.execute()
        taken = replies[: len(chunk)]
        assert all(taken), f"{taken.count(None)} lock(s) of {keys!r} were already held"
        if waits:
            assert replies[-1] >= replicas, f"only {replies[-1]} of {replicas} replica(s) acked"


def take_locks(
    client: Client, keys: QueueKeys, job_ids: Iterable[str], ttl_ms: int, *, replicas: int = 0
) -> dict[str, str]:
    """Take a lock with a fresh token for each job; return each id's token.

    Example:
        >>> tokens = take_locks(redis_client, KEYS, ["j1", "j2"], 800)
        >>> track_job(manager, "j1", tokens["j1"])

    Args: as for :func:`set_locks`, with ``job_ids`` instead of the tokens.

    Raises:
        AssertionError: As :func:`set_locks` does.
    """
    tokens = {job_id: new_token() for job_id in job_ids}
    set_locks(client, keys, tokens, ttl_ms, replicas=replicas)
    return tokens


def steal(
    client: Client,
    keys: QueueKeys,
    job_id: str,
    ttl_ms: int,
    value: str | bytes = "another-worker",
) -> None:
    """Take ``job_id``'s lock as another worker does once ours is gone: its value, its TTL.

    Args:
        client: A client of the server that holds the lock.
        keys: The queue's keys.
        job_id: The job whose lock is taken.
        ttl_ms: The other worker's TTL, in milliseconds.
        value: What the other worker's lock holds (its token, any bytes).
    """
    client.set(keys.lock(job_id), value, px=ttl_ms)


def _read(client: Client, keys: QueueKeys, job_ids: list[str], command: str) -> list[Any]:
    replies: list[Any] = []
    for chunk in _chunks(job_ids):
        pipe: Any = client.pipeline(transaction=False)
        for job_id in chunk:
            pipe.execute_command(command, keys.lock(job_id))
        replies.extend(pipe.execute())
    return replies


def alive(client: Client, keys: QueueKeys, tokens: Tokens) -> set[str]:
    """Return the ids whose lock still holds their token.

    Args:
        client: A client of the server that holds the locks.
        keys: The queue's keys.
        tokens: Each job's id and the token its lock should hold.
    """
    ids = list(tokens)
    values = _read(client, keys, ids, "GET")
    return {
        job_id for job_id, value in zip(ids, values, strict=True) if _text(value) == tokens[job_id]
    }


def lost_locks(client: Client, keys: QueueKeys, tokens: Tokens) -> set[str]:
    """Return the ids whose lock is gone or holds another token (see :func:`alive`)."""
    return set(tokens) - alive(client, keys, tokens)


def lowest_pttl(client: Client, keys: QueueKeys, job_ids: Iterable[str]) -> int:
    """Return the smallest time to live among the jobs' locks, in ms (``-2``: one is gone).

    Raises:
        ValueError: ``job_ids`` is empty.
    """
    ttls: list[int] = _read(client, keys, list(job_ids), "PTTL")
    return min(ttls)


class LockWatch:
    """Samples a set of locks over time: who holds them, and how close they came to expiring.

    Example:
        >>> seen = watch_locks(redis_client, KEYS, tokens, seconds=3 * TTL / 1000)
        >>> assert seen.missing == set() and seen.lowest_pttl > 0

    Args:
        client: A client of the server that holds the locks.
        keys: The queue's keys.
        tokens: Each job's id and the token its lock should hold.
    """

    def __init__(self, client: Client, keys: QueueKeys, tokens: Tokens) -> None:
        self._client = client
        self._keys = keys
        self._tokens = dict(tokens)
        #: How many samples were taken.
        self.samples = 0
        #: The smallest time to live any sample saw, in ms (``-2``: a lock was
        #: gone); ``None`` before the first sample.
        self.lowest_pttl: int | None = None
        #: Ids some sample found gone or held by another token.
        self.missing: set[str] = set()

    def sample(self) -> None:
        """Read every lock's holder and time to live once."""
        ids = list(self._tokens)
        for chunk in _chunks(ids):
            pipe: Any = self._client.pipeline(transaction=False)
            for job_id in chunk:
                pipe.get(self._keys.lock(job_id))
                pipe.pttl(self._keys.lock(job_id))
            replies = pipe.execute()
            for job_id, value, ttl in zip(chunk, replies[::2], replies[1::2], strict=True):
                if _text(value) != self._tokens[job_id]:
                    self.missing.add(job_id)
                if self.lowest_pttl is None or ttl < self.lowest_pttl:
                    self.lowest_pttl = int(ttl)
        self.samples += 1


def watch(seconds: float, *watches: LockWatch, every: float = 0.05) -> None:
    """Sample each of ``watches`` every ``every`` seconds for ``seconds``; at least once."""
    deadline = time.monotonic() + seconds
    while True:
        for lock_watch in watches:
            lock_watch.sample()
        if time.monotonic() >= deadline:
            return
        time.sleep(min(every, max(deadline - time.monotonic(), 0.0)))


def watch_locks(
    client: Client, keys: QueueKeys, tokens: Tokens, seconds: float, *, every: float = 0.05
) -> LockWatch:
    """Watch one set of locks for ``seconds`` (see :class:`LockWatch`) and return what was seen.

    Args:
        client: A client of the server that holds the locks.
        keys: The queue's keys.
        tokens: Each job's id and the token its lock should hold.
        seconds: How long to watch.
        every: Seconds between two samples.
    """
    lock_watch = LockWatch(client, keys, tokens)
    watch(seconds, lock_watch, every=every)
    return lock_watch


class PackedCommands:
    """Commands packed once, then sent as one pipeline as often as needed.

    For the benchmark's resets: packing 100,000 commands anew each time would
    cost seconds of client time.

    Args:
        commands: The commands, each a tuple of its words.
    """

    def __init__(self, commands: list[tuple[object, ...]]) -> None:
        self._commands = commands
        self._packed: Any = None

    def send(self, client: redis.Redis) -> None:
        """Send every command in one round trip and read every reply."""
        connection = client.connection_pool.get_connection()
        try:
            if self._packed is None:
                self._packed = connection.pack_commands(self._commands)  # type: ignore[no-untyped-call]
            connection.send_packed_command(self._packed)  # type: ignore[no-untyped-call]
            for _ in self._commands:
                connection.read_response()
        finally:
            client.connection_pool.release(connection)
