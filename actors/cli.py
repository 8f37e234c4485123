"""The ``echomq-locks`` command, also run as ``python -m actors``.

``locks`` lists the job locks of one queue (``--watch`` refreshes the list);
``explain`` prints what a ``lock_duration`` / ``lock_renew_time`` pair means.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TextIO

import redis
from redis.connection import parse_url

from actors.connection import client_for_url, command_timeout, parse_sentinel_url, redacted_url
from actors.keys import DEFAULT_PREFIX, QueueKeys
from actors.timing import (
    MIN_REDIS_LOCK_DURATION,
    Timing,
    default_safety_margin,
    monotonic_ms,
    next_tick,
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

__all__ = [
    "EXIT_ERROR",
    "EXIT_OK",
    "EXIT_USAGE",
    "LockInfo",
    "QueueWorker",
    "Watch",
    "build_parser",
    "explain",
    "main",
    "other_prefix_hint",
    "read_locks",
    "read_workers",
    "render_locks",
]

#: Exit status: success.
EXIT_OK = 0
#: Exit status: the command could not do its work (server unreachable, command refused).
EXIT_ERROR = 1
#: Exit status: the command line is wrong (argparse's own status).
EXIT_USAGE = 2
#: Seconds between two refreshes of ``locks --watch`` without a value.
DEFAULT_WATCH_SECONDS = 2.0
#: Seconds the command waits for the server to connect or answer.
CONNECT_TIMEOUT_SECONDS = 5.0
#: Keys asked per SCAN call, and locks read per round trip.
SCAN_COUNT = 1000
#: Most lockless active jobs the table names (``--json`` lists them all).
_SHOWN_LOCKLESS = 50
#: The server ``--url`` names when neither it nor ``REDIS_URL`` is given.
DEFAULT_URL = "redis://localhost:6379/0"
#: Prefixes looked under when a queue has no lock under the one given.
COMMON_PREFIXES = (DEFAULT_PREFIX, "bull")

_CLEAR = "\x1b[H\x1b[2J"
_EPILOG = """\
examples:
  %(prog)s locks --url redis://localhost:6379/0 --queue emails
      every lock of queue "emails" (keys emq:emails:<job id>:lock)
  %(prog)s locks --queue emails --prefix bull --watch 1
      a BullMQ queue (keys bull:emails:<job id>:lock) on $REDIS_URL or
      localhost, refreshed every second until Ctrl-C (or SIGTERM)
  %(prog)s explain --lock-duration 30000 --lock-renew-time 25000
      the windows of a configuration with less than one tick of headroom (warns)

exit status:
  0 success, 1 runtime error (server unreachable, command refused),
  2 usage error (bad option, bad URL, bad durations)
"""
_LOCKS_DESCRIPTION = """\
List the job locks of one queue: job id, the holder's token (its first and
last characters), the time left, and whether the job is in the stalled set,
from which a stalled check moves every job whose lock expired back to wait.
Keys are found with SCAN, never KEYS.

--watch refreshes the list and adds two columns. RENEWED: how long ago a
refresh first saw the lock renewed (its expiry moved later, same token).
LOWEST TTL: the least time the lock can have had left since the watch began;
a renewal between two refreshes counts as if it came just before the second,
so refresh faster than the locks are renewed for a close figure.

It also lists the active jobs that hold no lock: the queue's active list
names them but their lock is gone (expired, or deleted), so the next stalled
checks take them (one that is in the stalled set already is moved at the next
check; another is put in the set by the next check and moved by the one after).
A lock listing alone cannot show them: an expired lock is simply gone.

Last, the BullMQ workers connected to the queue, by the names their
connections carry (CLIENT LIST, as BullMQ's getWorkers reads it): the possible
holders, since a lock's token names none of them.

--json prints one JSON document instead of the table (one per line with
--watch): {"queue", "prefix", "locks": [{"job_id", "token", "ttl_ms",
"stalled", "wrong_type"}], "stalled_set_size", "lockless": [{"job_id",
"in_stalled_set"}], "workers": [{"name", "addr", "age_s", "idle_s"}], "at"}.
A ttl_ms of -1 is a lock with no TTL; wrong_type names the Redis type of a
lock key no worker wrote; workers is null where the server refuses CLIENT
LIST. A refresh that failed prints {"error", "at"}.
"""
_EXPLAIN_DESCRIPTION = """\
Print the renewal windows of a lock configuration as a lock manager computes
them, the headroom a lock keeps at its latest renewal attempt, a watched
lock's safety margin, and the longest socket timeout per attempt for a client
you pass. Warns when the headroom is
shorter than one tick.
"""


@dataclass(frozen=True, slots=True)
class LockInfo:
    """One job lock as the server holds it."""

    #: The job's id.
    job_id: str
    #: The value of the lock: the token of the worker holding it.
    token: str
    #: Time the lock has left, in milliseconds; ``-1`` when it never expires.
    ttl_ms: int
    #: Whether the job id sits in the queue's stalled set.
    stalled: bool
    #: Monotonic seconds when the round trip that read the lock started and ended.
    read_at: tuple[float, float]
    #: The key's Redis type when it is not a string (no worker wrote it), else ``None``.
    wrong_type: str | None = None

    @property
    def expires(self) -> tuple[float, float] | None:
        """Monotonic seconds between which the lock expires unless renewed (``None``: never).

        PTTL ran somewhere within :attr:`read_at`, and counts whole milliseconds.
        """
        if self.ttl_ms < 0:
            return None
        return self.read_at[0] + self.ttl_ms / 1000 - 0.001, self.read_at[1] + self.ttl_ms / 1000


def read_locks(conn: redis.Redis, keys: QueueKeys) -> tuple[list[LockInfo], int]:
    """Read every lock of a queue, most urgent first.

    One SCAN walk and one round trip per page; a lock expired meanwhile is left out.

    Returns:
        The locks by time left (those without a TTL first), and the stalled set's size.

    Raises:
        redis.exceptions.RedisError: The server or the connection failed.
    """
    locks: list[LockInfo] = []
    page: list[tuple[bytes | str, str]] = []
    for key in conn.scan_iter(match=keys.lock_pattern, count=SCAN_COUNT):
        job_id = keys.job_id(key)
        if job_id is not None:
            page.append((key, job_id))
        if len(page) >= SCAN_COUNT:
            locks += _read_page(conn, keys, page)
            page = []
    locks += _read_page(conn, keys, page)
    locks.sort(key=lambda lock: (lock.ttl_ms >= 0, lock.ttl_ms, lock.job_id))
    return locks, int(conn.scard(keys.stalled))


def _read_page(
    conn: redis.Redis, keys: QueueKeys, page: list[tuple[bytes | str, str]]
) -> list[LockInfo]:
    if not page:
        return []
    pipe: Any = conn.pipeline(transaction=False)
    for key, job_id in page:
        pipe.get(key).pttl(key).sismember(keys.stalled, job_id)
    started = time.monotonic()
    # Errors as replies: one key of another type must not hide the others.
    replies: list[Any] = pipe.execute(raise_on_error=False)
    read_at = (started, time.monotonic())
    locks = []
    for i, (key, job_id) in enumerate(page):
        token, ttl, stalled = replies[3 * i : 3 * i + 3]
        for reply in (ttl, stalled):
            if isinstance(reply, Exception):
                raise reply
        wrong_type = None
        if isinstance(token, redis.ResponseError) and str(token).startswith("WRONGTYPE"):
            wrong_type, token = _text(conn.type(key)), ""
        elif isinstance(token, Exception):
            raise token
        if token is not None and ttl != -2 and wrong_type != "none":
            locks.append(
                LockInfo(job_id, _text(token), int(ttl), bool(stalled), read_at, wrong_type)
            )
    return locks


@dataclass(frozen=True, slots=True)
class Lockless:
    """An active job whose lock is gone: what the next stalled checks take."""

    #: The job's id.
    job_id: str
    #: Whether it is in the stalled set already (then the next check moves it).
    in_stalled_set: bool


def read_lockless(conn: redis.Redis, keys: QueueKeys) -> list[Lockless]:
    """Read the queue's active list and return its jobs that hold no lock, in list order.

    The list is read in pages of :data:`SCAN_COUNT`, each with one pipelined
    round trip of ``EXISTS`` and ``SISMEMBER``: no reply grows with the queue.

    Raises:
        redis.exceptions.RedisError: The server or the connection failed.
    """
    active = keys.key_prefix + "active"
    found: list[Lockless] = []
    start = 0
    while True:
        ids = [_text(job_id) for job_id in conn.lrange(active, start, start + SCAN_COUNT - 1)]
        if not ids:
            return found
        pipe: Any = conn.pipeline(transaction=False)
        for job_id in ids:
            pipe.exists(keys.lock(job_id)).sismember(keys.stalled, job_id)
        replies = pipe.execute()
        for i, job_id in enumerate(ids):
            if not replies[2 * i]:
                found.append(Lockless(job_id, bool(replies[2 * i + 1])))
        start += len(ids)


@dataclass(frozen=True, slots=True)
class QueueWorker:
    """A connection a BullMQ worker of the queue named, as ``Queue.getWorkers`` finds it."""

    #: The worker's ``name`` option ("" for a worker without one).
    name: str
    #: The connection's address, as the server sees it.
    addr: str
    #: Seconds the connection has been open.
    age_s: int
    #: Seconds since its last command.
    idle_s: int


def _worker_client_names(keys: QueueKeys) -> tuple[str, str]:
    """The client names BullMQ workers of a queue give their connections.

    Node BullMQ spells the queue's name in base64, bullmq-py as it is; a named
    worker adds ``:w:<name>``.
    """
    encoded = base64.b64encode(keys.name.encode("utf-8", "surrogatepass")).decode("ascii")
    return f"{keys.prefix}:{encoded}", f"{keys.prefix}:{keys.name}"


def read_workers(conn: redis.Redis, keys: QueueKeys) -> list[QueueWorker] | None:
    """The BullMQ workers connected to the queue, by name, from ``CLIENT LIST``.

    A lock's token does not say which worker holds it (BullMQ's is the
    worker's id and a counter; the id is in no client name), so this is the
    list of its possible holders. Each worker names one connection or more;
    each is listed.

    Returns:
        The workers by name and age, or None where the server refuses
        ``CLIENT LIST`` (an ACL, a managed service).

    Raises:
        redis.exceptions.RedisError: The connection failed.
    """
    try:
        clients = conn.client_list()
    except redis.ResponseError:
        return None
    found: list[QueueWorker] = []
    for client in clients:
        name = str(client.get("name", ""))
        for base in _worker_client_names(keys):
            if name == base or name.startswith(f"{base}:w:"):
                found.append(
                    QueueWorker(
                        name=name[len(base) + 3 :],
                        addr=str(client.get("addr", "")),
                        age_s=int(client.get("age", 0)),
                        idle_s=int(client.get("idle", 0)),
                    )
                )
                break
    found.sort(key=lambda worker: (worker.name, -worker.age_s, worker.addr))
    return found


def render_workers(workers: Sequence[QueueWorker] | None, *, held: bool) -> str:
    """Return the line the table adds for the workers connected to the queue (``""``: none).

    ``held``: the queue has locks or active jobs, whose holders the line is about.
    """
    if workers is None:
        return "\nworkers: unknown (the server refuses CLIENT LIST)\n" if held else ""
    if not workers:
        return ""
    names = sorted({worker.name or "(unnamed)" for worker in workers})
    shown = ", ".join(names[:_SHOWN_LOCKLESS])
    more = f" and {len(names) - _SHOWN_LOCKLESS} more" if len(names) > _SHOWN_LOCKLESS else ""
    return f"\n{len(workers)} worker connection(s) on the queue, named: {shown}{more}\n"


def as_json(
    keys: QueueKeys,
    locks: Sequence[LockInfo],
    stalled_total: int,
    lockless: Sequence[Lockless],
    workers: Sequence[QueueWorker] | None = (),
) -> str:
    """Return the document ``locks --json`` prints, on one line."""
    return json.dumps(
        {
            "queue": keys.name,
            "prefix": keys.prefix,
            "locks": [
                {
                    "job_id": lock.job_id,
                    "token": lock.token,
                    "ttl_ms": lock.ttl_ms,
                    "stalled": lock.stalled,
                    "wrong_type": lock.wrong_type,
                }
                for lock in locks
            ],
            "stalled_set_size": stalled_total,
            "lockless": [
                {"job_id": job.job_id, "in_stalled_set": job.in_stalled_set} for job in lockless
            ],
            "workers": None
            if workers is None
            else [
                {"name": w.name, "addr": w.addr, "age_s": w.age_s, "idle_s": w.idle_s}
                for w in workers
            ],
            "at": _now(),
        }
    )


def render_lockless(lockless: Sequence[Lockless]) -> str:
    """Return the lines the table adds for active jobs that hold no lock (``""``: none)."""
    if not lockless:
        return ""
    shown = ", ".join(
        f"{job.job_id} (in the stalled set: moved at the next check)"
        if job.in_stalled_set
        else job.job_id
        for job in lockless[:_SHOWN_LOCKLESS]
    )
    more = f" and {len(lockless) - _SHOWN_LOCKLESS} more" if len(lockless) > _SHOWN_LOCKLESS else ""
    return (
        f"\n{len(lockless)} active job(s) hold no lock; the next stalled checks take them: "
        f"{shown}{more}\n"
    )


def _text(reply: bytes | str) -> str:
    return reply.decode("utf-8", "replace") if isinstance(reply, bytes) else reply


def other_prefix_hint(conn: redis.Redis, keys: QueueKeys) -> str | None:
    """Return a one-line hint when the queue has locks under another common prefix.

    Looks under ``emq`` and ``bull`` (one SCAN walk each); ``None`` if neither has one.
    """
    for prefix in COMMON_PREFIXES:
        if prefix == keys.prefix:
            continue
        other = QueueKeys(keys.name, prefix=prefix)
        found = sum(1 for _ in conn.scan_iter(match=other.lock_pattern, count=SCAN_COUNT))
        if found:
            return (
                f"hint: {found} lock(s) of queue {keys.name!r} under prefix {prefix!r} "
                f"({other.key_prefix}<job id>:lock): add --prefix {prefix}"
            )
    return None


@dataclass(frozen=True, slots=True)
class _Seen:
    token: str
    expires: tuple[float, float] | None
    renewed_at: float | None  # monotonic seconds of the read that first saw the last renewal
    lowest_ms: int | None


class Watch:
    """Follows each lock from one refresh to the next: when renewed, how low its TTL got.

    Expiry instants (read time plus TTL) are compared, not TTLs: a holder
    that renews as often as the watch refreshes shows the same TTL each time.
    """

    def __init__(self) -> None:
        self._seen: dict[str, _Seen] = {}

    def update(self, locks: Sequence[LockInfo]) -> dict[str, tuple[str, str]]:
        """Record one refresh, given every lock it read.

        Returns:
            Per job id, the RENEWED and LOWEST TTL cells (``"-"``: not yet, or no TTL).
        """
        seen: dict[str, _Seen] = {}
        cells: dict[str, tuple[str, str]] = {}
        for lock in locks:
            expires, renewed_at = lock.expires, None
            lowest = None if expires is None else lock.ttl_ms
            before = self._seen.get(lock.job_id)
            if before is not None and before.token == lock.token:
                renewed_at = before.renewed_at
                if expires and before.expires and expires[0] > before.expires[1]:
                    renewed_at = lock.read_at[1]
                    # Renewed between the reads: at worst just before this one.
                    lowest = max(0, int((before.expires[0] - lock.read_at[1]) * 1000))
                if lowest is None or (before.lowest_ms is not None and before.lowest_ms < lowest):
                    lowest = before.lowest_ms
            seen[lock.job_id] = _Seen(lock.token, expires, renewed_at, lowest)
            ago = "-" if renewed_at is None else f"{lock.read_at[1] - renewed_at:.1f} s ago"
            cells[lock.job_id] = (ago, "-" if lowest is None else _ttl(lowest))
        self._seen = seen
        return cells


def _short_token(token: str) -> str:
    # Both ends: UUIDs differ at the start, BullMQ's "<worker id>:<n>" at the end.
    return token if len(token) <= 19 else f"{token[:8]}...{token[-8:]}"


def _ttl(ttl_ms: int) -> str:
    return "no TTL" if ttl_ms < 0 else f"{ttl_ms / 1000:.1f} s"


def render_locks(
    keys: QueueKeys,
    locks: Sequence[LockInfo],
    stalled_total: int,
    *,
    watched: Mapping[str, tuple[str, str]] | None = None,
) -> str:
    """Return the table ``locks`` prints, the locks in the order given.

    ``watched``, the cells of :meth:`Watch.update`, adds the RENEWED and
    LOWEST TTL columns (``--watch``).
    """
    stalled = sum(lock.stalled for lock in locks)
    header = f"{keys.base}: {len(locks)} lock(s), {stalled} of them in the stalled set "
    header += f"(stalled set size {stalled_total})\n"
    if not locks:
        return header
    rows = [["JOB", "TOKEN", "TTL", "STALLED"] + (["RENEWED", "LOWEST TTL"] if watched else [])]
    for lock in locks:
        token = _short_token(lock.token) if lock.wrong_type is None else f"({lock.wrong_type} key)"
        row = [lock.job_id, token, _ttl(lock.ttl_ms)]
        row.append("yes" if lock.stalled else "no")
        rows.append(row + list(watched.get(lock.job_id, ("-", "-")) if watched else []))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows)
    return header + "\n" + "".join(line.rstrip() + "\n" for line in lines)


def explain(timing: Timing) -> tuple[str, list[str]]:
    """Describe a lock configuration: return the text to print, and its warnings."""
    interval, headroom = timing.interval, timing.headroom
    safety = default_safety_margin(timing)
    single, cluster = command_timeout(timing), command_timeout(timing, cluster=True)
    spare = headroom / interval
    rows = [
        (
            "lock_duration",
            f"{timing.lock_duration} ms",
            "the lock's TTL, set again at each renewal",
        ),
        ("lock_renew_time", f"{timing.renew_time} ms", "longest time between two renewals"),
        ("tick interval", f"{interval} ms", "the manager's one timer fires this often"),
        (
            "due threshold",
            f"{timing.threshold} ms",
            "a tick renews the jobs last renewed longer ago",
        ),
        ("worst-case gap", f"{timing.worst_gap} ms", "longest time between two renewal attempts"),
        ("headroom", f"{headroom} ms", f"TTL left at the latest attempt: {spare:.1f} tick(s)"),
        (
            "safety_margin",
            f"{safety} ms",
            f"a watched lock is trusted {timing.lock_duration - safety} ms after a confirmed send",
        ),
        ("socket_timeout", f"{single:g} s", "at most this on a redis.Redis you pass, per attempt"),
        ("cluster socket_timeout", f"{cluster:g} s", "the same on a redis.RedisCluster"),
    ]
    width = [max(len(row[i]) for row in rows) for i in (0, 1)]
    text = "".join(f"{a.ljust(width[0])}  {b.rjust(width[1])}  {c}\n" for a, b, c in rows)
    warnings = []
    if timing.lock_duration < 1000:
        duration = timing.lock_duration
        refused = f" (refused under {MIN_REDIS_LOCK_DURATION} ms on Redis)"
        warnings.append(
            f"lock_duration is in milliseconds: locks of {duration} ms"
            f"{refused if duration < MIN_REDIS_LOCK_DURATION else ''}; "
            f"for {duration} seconds pass {duration * 1000}"
        )
    if headroom < interval:
        safe = _largest_safe_renew_time(timing.lock_duration)
        advice = "" if safe is None else f"; a lock_renew_time of at most {safe} ms keeps one tick"
        warnings.append(
            f"the headroom ({headroom} ms) is shorter than one tick ({interval} ms): a single "
            f"late or failed tick lets a lock expire and its job stall{advice}"
        )
    return text, warnings


def _largest_safe_renew_time(lock_duration: int) -> int | None:
    # It holds up to about two thirds of the duration; start just above, for rounding.
    for renew in range(min(lock_duration - 1, lock_duration * 2 // 3 + 2), 1, -1):
        timing = Timing(lock_duration, renew)
        if timing.headroom >= timing.interval:
            return renew
    return None


def _redis_url(value: str) -> str:
    try:
        if parse_sentinel_url(value) is None:
            parse_url(value)  # type: ignore[no-untyped-call]
    except ValueError as exc:
        # Not echoed back: a mistyped URL may still carry a password.
        raise argparse.ArgumentTypeError(f"not a Redis URL: {exc}") from None
    return value


def _name(value: str) -> str:
    if not value:
        raise argparse.ArgumentTypeError("must not be empty")
    return value


def _queue_name(value: str) -> str:
    if ":" in _name(value):
        head, _, tail = value.rpartition(":")
        raise argparse.ArgumentTypeError(
            f"a queue name never holds ':', got {value!r}; for the keys "
            f"'{value}:<job id>:lock' use --prefix {head} --queue {tail}"
        )
    return value


def _prefix(value: str) -> str:
    if _name(value).endswith(":"):
        fixed = value.rstrip(":")
        raise argparse.ArgumentTypeError(
            f"must not end with ':', got {value!r} (the ':' before the queue name is added)"
            + (f"; use --prefix {fixed}" if fixed else "")
        )
    return value


def _seconds(value: str) -> float:
    with contextlib.suppress(ValueError):
        if 0 < float(value) < math.inf:
            return float(value)
    raise argparse.ArgumentTypeError(f"not a number of seconds above 0: {value!r}")


def _milliseconds(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of milliseconds: {value!r}") from None


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """Return the command line's parser (``prog`` defaults to the script's name)."""
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog=prog, formatter_class=formatter)
    parser.description = "Look at the job locks of an EchoMQ or BullMQ queue, "
    parser.description += "and at what a lock configuration means."
    # Spelled out: within a subcommand %(prog)s would name the subcommand twice.
    parser.epilog = epilog = _EPILOG.replace("%(prog)s", parser.prog)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    locks = commands.add_parser(
        "locks",
        help="list a queue's job locks: token, TTL left, stalled or not",
        description=_LOCKS_DESCRIPTION,
        epilog=epilog,
        formatter_class=formatter,
    )
    locks.set_defaults(command_parser=locks)
    add = locks.add_argument
    add(
        "--url",
        default=os.environ.get("REDIS_URL") or DEFAULT_URL,
        type=_redis_url,
        help=(
            "the server: redis://[:password@]host/db, or a Sentinel-managed primary: "
            "redis+sentinel://[:password@]host:26379[,host:port...]/service/db "
            f"(default: $REDIS_URL, else {DEFAULT_URL})"
        ),
    )
    add("--queue", required=True, type=_queue_name, metavar="NAME", help="queue name, no prefix")
    add("--prefix", default=DEFAULT_PREFIX, type=_prefix, help="key prefix: emq (default), bull")
    every = f"refresh every SECONDS (default {DEFAULT_WATCH_SECONDS:g}) until Ctrl-C or SIGTERM"
    add(
        "--watch",
        nargs="?",
        const=DEFAULT_WATCH_SECONDS,
        type=_seconds,
        metavar="SECONDS",
        help=every,
    )
    add("--json", action="store_true", help="print JSON (one document per line with --watch)")
    explain_parser = commands.add_parser(
        "explain",
        help="print the renewal windows of a lock configuration",
        description=_EXPLAIN_DESCRIPTION,
        epilog=epilog,
        formatter_class=formatter,
    )
    explain_parser.set_defaults(command_parser=explain_parser)
    add = explain_parser.add_argument
    add("--lock-duration", required=True, type=_milliseconds, metavar="MS", help="the lock TTL")
    add("--lock-renew-time", type=_milliseconds, metavar="MS", help="default: lock duration / 2")
    return parser


def _ends_the_watch(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


class _Refresh:
    """One run's reads: each refresh's frame, and the prefix hint looked for once."""

    def __init__(self, args: argparse.Namespace, keys: QueueKeys, conn: redis.Redis) -> None:
        self._args, self._keys, self._conn = args, keys, conn
        self._watch = Watch() if args.watch is not None else None
        self._hint: str | None = None

    def frame(self) -> tuple[str, str | None]:
        """Read once; return what to print and, if the read failed, the problem."""
        keys, conn, as_json_lines = self._keys, self._conn, self._args.json
        try:
            locks, stalled_total = read_locks(conn, keys)
            lockless = read_lockless(conn, keys)
            workers = read_workers(conn, keys)
            if not locks and not lockless and self._hint is None and not as_json_lines:
                # One look per run: a wrong prefix does not fix itself.
                self._hint = other_prefix_hint(conn, keys) or ""
        except (redis.RedisError, OSError) as exc:
            problem = f"cannot read the locks of {keys.base!r} on {redacted_url(self._args.url)}: "
            problem += " ".join(f"{type(exc).__name__}: {exc}".split())
            if as_json_lines:
                return json.dumps({"error": problem, "at": _now()}) + "\n", problem
            return f"{problem} (retrying)\n", problem
        if as_json_lines:
            return as_json(keys, locks, stalled_total, lockless, workers) + "\n", None
        watched = None if self._watch is None else self._watch.update(locks)
        frame = render_locks(keys, locks, stalled_total, watched=watched)
        frame += render_lockless(lockless)
        frame += render_workers(workers, held=bool(locks or lockless))
        if not locks and not lockless and self._hint:
            frame += f"{self._hint}\n"
        return frame, None


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _run_locks(args: argparse.Namespace, prog: str, out: TextIO, err: TextIO) -> int:
    try:
        keys = QueueKeys(args.queue, prefix=args.prefix)
    except ValueError as exc:
        args.command_parser.error(str(exc))
    every = args.watch
    if every is not None and threading.current_thread() is threading.main_thread():
        # Ctrl-C or SIGTERM ends a watch, even where SIGINT is ignored (nohup, CI).
        signal.signal(signal.SIGINT, _ends_the_watch)
        signal.signal(signal.SIGTERM, _ends_the_watch)
    clear = _CLEAR if out.isatty() else "\n"
    conn = client_for_url(args.url, timeout=CONNECT_TIMEOUT_SECONDS)
    refresh = _Refresh(args, keys, conn)
    deadline, frames = monotonic_ms(), 0
    try:
        while True:
            frame, problem = refresh.frame()
            if problem is not None and frames == 0:  # A typo in the URL fails at once.
                err.write(f"{prog}: error: {problem}\n")
                return EXIT_ERROR
            if every is None:
                out.write(frame)
                return EXIT_OK
            if not args.json:
                stamp = datetime.now().strftime("%H:%M:%S")
                frame = f"{clear}{stamp}  every {every:g} s, Ctrl-C to stop\n{frame}"
            out.write(frame)
            out.flush()
            # A fixed grid, as the manager's: a slow read does not stretch the period.
            frames += 1
            deadline = next_tick(deadline, max(1, round(every * 1000)), monotonic_ms())
            time.sleep(max(0, deadline - monotonic_ms()) / 1000)
    except KeyboardInterrupt:
        if every is None:
            raise
        return EXIT_OK  # Ctrl-C (or SIGTERM) is how a watch ends: a normal exit, not an error.
    finally:
        conn.close()


def _run_explain(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        timing = Timing(args.lock_duration, args.lock_renew_time)
    except (TypeError, ValueError) as exc:
        args.command_parser.error(str(exc))
    text, warnings = explain(timing)
    out.write(text)
    err.write("".join(f"warning: {warning}\n" for warning in warnings))
    return EXIT_OK


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Run the command line.

    ``argv`` defaults to ``sys.argv[1:]``, ``prog`` to the script's name. Returns
    the exit status: :data:`EXIT_OK`, :data:`EXIT_ERROR` or :data:`EXIT_USAGE`.
    """
    parser = build_parser(prog)
    out, err = sys.stdout, sys.stderr
    try:
        args = parser.parse_args(argv)
        if args.command == "explain":
            return _run_explain(args, out, err)
        return _run_locks(args, parser.prog, out, err)
    except SystemExit as exc:
        # argparse exits for --help (0) and usage errors (2): report, don't raise.
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    except BrokenPipeError:
        # The reader (`| head`) went away: stop quietly, as other tools do.
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, out.fileno())
        return EXIT_OK
