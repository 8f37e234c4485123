"""The shared renewal script: read once, sent by EVALSHA in chunks, loaded on NOSCRIPT.

``lua/extendLocks-1.lua`` is frozen: Node.js, Go, Elixir and Python workers
renew the same keys with it. A healthy tick costs one round trip: every chunk
of a batch goes in one pipeline, and the script is loaded only when the
server answers NOSCRIPT (after a restart, a failover or a SCRIPT FLUSH).
"""

from __future__ import annotations

import hashlib
import logging
from functools import lru_cache
from importlib import resources
from typing import TYPE_CHECKING, Any

import msgpack
from redis.exceptions import NoScriptError, ResponseError

from actors.connection import is_cluster
from actors.outcome import BatchOutcome, ChunkError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from actors.keys import QueueKeys

__all__ = ["DEFAULT_MAX_BATCH", "SCRIPT_NAME", "run_chunks", "script_sha", "script_source"]

logger = logging.getLogger("actors.scripts")

#: File name of the renewal script; the ``-1`` is its number of KEYS.
SCRIPT_NAME = "extendLocks-1.lua"

#: Job ids per script call. At 250 one call holds the server for 1-2 ms
#: (a few ms at worst) even with 100,000 locks on it, so every other client
#: stays responsive, and a whole tick is no slower than with larger calls: all
#: of a tick's calls still share one round trip (``make bench`` measures it).
DEFAULT_MAX_BATCH = 250


@lru_cache(maxsize=1)
def script_source() -> str:
    """Return the text of ``extendLocks-1.lua``, which lives beside this module.

    The top-level ``lua/extendLocks-1.lua`` that other runtimes read is a link
    to the same file.
    """
    return (resources.files("actors") / "lua" / SCRIPT_NAME).read_text(encoding="utf-8")


@lru_cache(maxsize=1)
def script_sha() -> str:
    """Return the SHA1 by which the server knows the script."""
    return hashlib.sha1(script_source().encode("utf-8")).hexdigest()


def _as_ids(reply: Any) -> list[str]:
    if not isinstance(reply, list):
        raise ResponseError(f"{SCRIPT_NAME} returned {type(reply).__name__}, expected a list")
    return [item.decode("utf-8") if isinstance(item, bytes) else str(item) for item in reply]


def _as_list(items: Sequence[str]) -> list[str]:
    # A chunk is already a fresh list (a slice): copying it again would cost a
    # pass and an allocation per id.
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
    # EVAL runs the script, and caches it, on whichever cluster node serves
    # the slot right now: a promoted replica, a node importing the slot, a new
    # node with no slot of its own yet. SCRIPT LOAD reaches only the masters
    # the client knows of, and all of them must answer.
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
) -> list[Any]:
    # EVALSHA by hand, not redis-py's Script: its pipeline sends SCRIPT EXISTS
    # before every batch, a second round trip on each tick.
    pipe = conn.pipeline(transaction=False)
    options: dict[str, Any] = {}
    if is_cluster(conn):
        # Routed by hand: a cluster pipeline otherwise asks its default node
        # for each EVALSHA's keys (COMMAND GETKEYS), and fails for as long as
        # that node is down. Redirections are still followed.
        options["target_nodes"] = conn.get_node_from_key(keys.stalled)
    for start, stop in bounds:
        args = _evalsha_args(keys, job_ids[start:stop], tokens[start:stop], duration)
        pipe.execute_command(*(_with_source(args) if with_source else args), **options)
    replies: list[Any] = pipe.execute(raise_on_error=False)
    return replies


def run_chunks(
    conn: Any,
    keys: QueueKeys,
    job_ids: Sequence[str],
    tokens: Sequence[str],
    duration: int,
    max_batch: int,
) -> BatchOutcome:
    """Run the script over ``job_ids`` in chunks of ``max_batch``, all in one round trip.

    Nothing is checked here (see :func:`actors.scripts.renew_batch`). A chunk
    that the server refuses is returned in ``errors``; a chunk answered
    NOSCRIPT is sent again once the script is loaded (on a cluster, as EVAL
    on the node serving the slot).

    Returns:
        The ids each chunk that ran reported, and the chunks that did not run.

    Raises:
        redis.exceptions.RedisError: The connection failed: no chunk is known
            to have run.
    """
    total = len(job_ids)
    bounds = [(start, min(start + max_batch, total)) for start in range(0, total, max_batch)]
    replies = _send_chunks(conn, keys, job_ids, tokens, duration, bounds)
    missing = [i for i, reply in enumerate(replies) if _is_noscript(reply)]
    if missing:
        # The server lost its script cache (restart, SCRIPT FLUSH, failover):
        # load the script and send the same calls again.
        logger.debug("%s not cached by the server; loading it", SCRIPT_NAME)
        cluster = is_cluster(conn)
        if not cluster:
            conn.script_load(script_source())
        resent = _send_chunks(
            conn, keys, job_ids, tokens, duration, [bounds[i] for i in missing], with_source=cluster
        )
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
    return BatchOutcome(failed, errors)
