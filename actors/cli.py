"""The ``echomq-locks`` command, also run as ``python -m actors``.

Two subcommands answer an operator's first questions about a stalled job:

- ``locks`` lists the job locks of one queue: who holds each (the token), for
  how much longer (the TTL), and whether the job sits in the stalled set. With
  ``--watch`` it refreshes in place and shows when each lock was last seen
  renewed.
- ``explain`` prints what a ``lock_duration`` / ``lock_renew_time`` pair means:
  the tick interval, the longest gap between two renewals and the margin left.

Reads use SCAN, never KEYS, so a large server is never blocked. Exit status:
0 on success, 1 on a runtime error (unreachable server, refused command), 2 on
a usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, TextIO
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.connection import parse_url
from redis.retry import Retry

from actors.keys import DEFAULT_PREFIX, QueueKeys
from actors.schedule import Timing

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "EXIT_ERROR",
    "EXIT_OK",
    "EXIT_USAGE",
    "LockInfo",
    "Watch",
    "build_parser",
    "explain",
    "glob_escape",
    "lock_pattern",
    "main",
    "read_locks",
    "render_locks",
]

#: Exit status: success.
EXIT_OK = 0
#: Exit status: the command could not do its work (server unreachable, ...).
EXIT_ERROR = 1
#: Exit status: the command line is wrong (argparse's own status).
EXIT_USAGE = 2

#: Seconds between two refreshes of ``locks --watch`` without a value.
DEFAULT_WATCH_SECONDS = 2.0
#: Seconds the command waits for the server to connect or answer.
CONNECT_TIMEOUT_SECONDS = 5.0
#: Keys asked per SCAN call, and locks read per round trip.
SCAN_COUNT = 1000

_GLOB_SPECIAL = frozenset("\\*?[]{}^-")
_LOCK_SUFFIX = ":lock"
_CLEAR = "\x1b[H\x1b[2J"

_EPILOG = """\
examples:
  %(prog)s locks --url redis://localhost:6379/0 --queue emails
      every lock of queue "emails" (keys emq:emails:<job id>:lock)
  %(prog)s locks --url redis://localhost:6379/0 --queue emails --prefix bull --watch 1
      a BullMQ queue, refreshed every second until Ctrl-C
  %(prog)s explain --lock-duration 30000
      the renewal windows of the default configuration
  %(prog)s explain --lock-duration 30000 --lock-renew-time 25000
      a configuration that leaves less than one tick of margin (warns)

exit status:
  0 success, 1 runtime error (server unreachable, command refused),
  2 usage error (bad option, bad URL, bad durations)
"""

_LOCKS_DESCRIPTION = """\
List the job locks of one queue: the job id, the token of the worker holding
the lock (shortened), the time the lock has left, and whether the job sits in
the queue's stalled set. A job in the stalled set whose lock expires before
anyone renews it is moved back to wait by the next stalled check. With
--watch, the list refreshes in place and a RENEWED column shows how long ago
each lock's TTL was last seen going up, that is, how long ago someone last
renewed it. Keys are found with SCAN, never KEYS.
"""

_EXPLAIN_DESCRIPTION = """\
Print the renewal windows of a lock configuration, as a lock manager computes
them: the lock TTL, the renew time, the tick interval and due threshold, the
longest gap between two renewal attempts of one job and the margin the lock
still has at that point. Warns when the margin is shorter than one tick, where
a single late or failed tick lets a lock expire.
"""


# -- reading the locks ---------------------------------------------------


def glob_escape(text: str) -> str:
    r"""Return ``text`` with every character SCAN's MATCH treats specially escaped.

    Example:
        >>> print(glob_escape("{orders}[eu]*"))
        \{orders\}\[eu\]\*
    """
    return "".join("\\" + char if char in _GLOB_SPECIAL else char for char in text)


def lock_pattern(keys: QueueKeys) -> str:
    """Return the SCAN pattern of a queue's lock keys: ``{key_prefix}*:lock``, escaped."""
    return glob_escape(keys.key_prefix) + "*" + _LOCK_SUFFIX


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


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def read_locks(conn: redis.Redis, keys: QueueKeys) -> tuple[list[LockInfo], int]:
    """Read every lock of a queue, most urgent first.

    One SCAN walk; for each page of keys one pipelined round trip of GET, PTTL
    and SISMEMBER (which every server version has). A lock that expires
    between the SCAN and the read is left out.

    Args:
        conn: A client of the server.
        keys: The queue's keys.

    Returns:
        The locks, sorted by time left (locks without a TTL first), and the
        size of the stalled set.

    Raises:
        redis.exceptions.RedisError: The server or the connection failed.
    """
    prefix = keys.key_prefix.encode("utf-8")
    page: list[bytes] = []
    locks: list[LockInfo] = []
    for key in conn.scan_iter(match=lock_pattern(keys), count=SCAN_COUNT):
        page.append(key if isinstance(key, bytes) else key.encode("utf-8"))
        if len(page) >= SCAN_COUNT:
            locks.extend(_read_page(conn, keys, prefix, page))
            page = []
    if page:
        locks.extend(_read_page(conn, keys, prefix, page))
    stalled_total = int(conn.scard(keys.stalled))
    locks.sort(key=lambda lock: (lock.ttl_ms >= 0, lock.ttl_ms, lock.job_id))
    return locks, stalled_total


def _read_page(
    conn: redis.Redis, keys: QueueKeys, prefix: bytes, page: list[bytes]
) -> list[LockInfo]:
    ids = [key[len(prefix) : -len(_LOCK_SUFFIX)] for key in page]
    # Any: redis-py types SISMEMBER's member as str, and a raw id may not decode.
    pipe: Any = conn.pipeline(transaction=False)
    for key, job_id in zip(page, ids, strict=True):
        pipe.get(key)
        pipe.pttl(key)
        pipe.sismember(keys.stalled, job_id)
    replies: list[Any] = pipe.execute()
    locks = []
    for i, job_id in enumerate(ids):
        token, ttl, stalled = replies[3 * i : 3 * i + 3]
        if token is None or ttl == -2:
            continue
        locks.append(LockInfo(_text(job_id), _text(token), int(ttl), bool(stalled)))
    return locks


# -- rendering -----------------------------------------------------------


def _short_token(token: str) -> str:
    return token if len(token) <= 12 else token[:8] + "..."


def _ttl(ttl_ms: int) -> str:
    return "no TTL" if ttl_ms < 0 else f"{ttl_ms / 1000:.1f} s"


class Watch:
    """Remembers, between refreshes, when each lock's TTL was last seen going up.

    A lock's TTL only goes up when someone sets it again, so a TTL above the
    one of the previous refresh means the holder renewed it in between.
    """

    def __init__(self) -> None:
        #: job id -> (token, TTL in ms, monotonic seconds when seen renewed or None).
        self._seen: dict[str, tuple[str, int, float | None]] = {}

    def update(self, locks: Sequence[LockInfo], now: float) -> dict[str, str]:
        """Record one refresh; return, per job, how long ago it was seen renewed."""
        seen: dict[str, tuple[str, int, float | None]] = {}
        labels: dict[str, str] = {}
        for lock in locks:
            token, ttl, renewed_at = self._seen.get(lock.job_id, (lock.token, lock.ttl_ms, None))
            if token != lock.token:
                renewed_at = None
            elif lock.ttl_ms > ttl:
                renewed_at = now
            seen[lock.job_id] = (lock.token, lock.ttl_ms, renewed_at)
            labels[lock.job_id] = "-" if renewed_at is None else f"{now - renewed_at:.1f} s ago"
        self._seen = seen
        return labels


def render_locks(
    keys: QueueKeys,
    locks: Sequence[LockInfo],
    stalled_total: int,
    *,
    renewed: dict[str, str] | None = None,
) -> str:
    """Return the table ``locks`` prints.

    Args:
        keys: The queue's keys.
        locks: The locks, in the order to print.
        stalled_total: Size of the queue's stalled set.
        renewed: Per job, how long ago its lock was seen renewed; adds the
            RENEWED column (``--watch``).
    """
    in_stalled = sum(lock.stalled for lock in locks)
    header = (
        f"{keys.base}: {len(locks)} lock(s), {in_stalled} of them in the stalled set "
        f"(stalled set size {stalled_total})"
    )
    if not locks:
        return header + "\n"
    columns = ["JOB", "TOKEN", "TTL", "STALLED"]
    if renewed is not None:
        columns.append("RENEWED")
    rows = []
    for lock in locks:
        row = [lock.job_id, _short_token(lock.token), _ttl(lock.ttl_ms)]
        row.append("yes" if lock.stalled else "no")
        if renewed is not None:
            row.append(renewed.get(lock.job_id, "-"))
        rows.append(row)
    widths = [max(len(row[i]) for row in [columns, *rows]) for i in range(len(columns))]
    lines = [header, ""]
    for row in [columns, *rows]:
        lines.append(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )
    return "\n".join(lines) + "\n"


def explain(timing: Timing) -> tuple[str, list[str]]:
    """Describe a lock configuration.

    Args:
        timing: The configuration, validated.

    Returns:
        The text to print, and the warnings about it (possibly none).
    """
    interval = timing.interval
    margin = timing.margin
    rows = [
        (
            "lock_duration",
            f"{timing.lock_duration} ms",
            "the lock's TTL, set again at each renewal",
        ),
        (
            "lock_renew_time",
            f"{timing.renew_time} ms",
            "longest time between two renewals of one lock",
        ),
        ("tick interval", f"{interval} ms", "the manager's one timer fires this often"),
        (
            "due threshold",
            f"{timing.threshold} ms",
            "a tick renews the jobs last renewed longer ago than this",
        ),
        (
            "worst-case gap",
            f"{timing.worst_gap} ms",
            "longest time between two renewal attempts of one job (interval + threshold)",
        ),
        (
            "safety margin",
            f"{margin} ms",
            f"TTL a lock still has at its latest renewal attempt: {margin / interval:.1f} "
            "tick(s) for late or failed ticks",
        ),
        (
            "socket_timeout",
            f"{interval / 4000:.3f} s",
            "at most, on a client you pass yourself, so a hung server cannot hold a tick",
        ),
    ]
    name_width = max(len(row[0]) for row in rows)
    value_width = max(len(row[1]) for row in rows)
    text = "".join(
        f"{name.ljust(name_width)}  {value.rjust(value_width)}  {meaning}\n"
        for name, value, meaning in rows
    )
    warnings = []
    if margin < interval:
        advice = ""
        safe = _largest_safe_renew_time(timing.lock_duration)
        if safe is not None:
            advice = f"; a lock_renew_time of at most {safe} ms keeps one tick of margin"
        warnings.append(
            f"the safety margin ({margin} ms) is shorter than one tick ({interval} ms): a single "
            f"late or failed tick lets a lock expire and its job stall{advice}"
        )
    return text, warnings


def _largest_safe_renew_time(lock_duration: int) -> int | None:
    # margin >= interval holds up to about two thirds of the duration; walk
    # down from just above it to absorb the integer divisions.
    renew = min(lock_duration - 1, lock_duration * 2 // 3 + 2)
    while renew >= 2:
        timing = Timing(lock_duration, renew)
        if timing.margin >= timing.interval:
            return renew
        renew -= 1
    return None


# -- the command line ----------------------------------------------------


def _redis_url(value: str) -> str:
    try:
        parse_url(value)  # type: ignore[no-untyped-call]
    except ValueError as exc:
        # Not echoed back: a mistyped URL may still carry a password.
        raise argparse.ArgumentTypeError(f"not a Redis URL: {exc}") from None
    return value


def _name(value: str) -> str:
    if not value:
        raise argparse.ArgumentTypeError("must not be empty")
    return value


def _positive_seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {value!r}") from None
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {value}")
    return seconds


def _milliseconds(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of milliseconds: {value!r}") from None


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """Return the command line's parser (``prog`` defaults to the script's name)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Look at the job locks of an EchoMQ or BullMQ queue, "
        "and at what a lock configuration means.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    locks = commands.add_parser(
        "locks",
        help="list a queue's job locks: token, TTL left, stalled or not",
        description=_LOCKS_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    locks.add_argument(
        "--url",
        required=True,
        type=_redis_url,
        help="the server, as redis://[:password@]host:port/db",
    )
    locks.add_argument("--queue", required=True, type=_name, metavar="NAME", help="queue name")
    locks.add_argument(
        "--prefix",
        default=DEFAULT_PREFIX,
        type=_name,
        help=f"key prefix of the deployment (default: {DEFAULT_PREFIX}; BullMQ uses bull)",
    )
    locks.add_argument(
        "--watch",
        nargs="?",
        const=DEFAULT_WATCH_SECONDS,
        type=_positive_seconds,
        metavar="SECONDS",
        help=f"refresh every SECONDS (default {DEFAULT_WATCH_SECONDS:g}) until Ctrl-C",
    )

    explain_parser = commands.add_parser(
        "explain",
        help="print the renewal windows of a lock configuration",
        description=_EXPLAIN_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    explain_parser.set_defaults(command_parser=explain_parser)
    explain_parser.add_argument(
        "--lock-duration",
        required=True,
        type=_milliseconds,
        metavar="MS",
        help="the lock TTL, in milliseconds (EchoMQ and BullMQ default: 30000)",
    )
    explain_parser.add_argument(
        "--lock-renew-time",
        type=_milliseconds,
        metavar="MS",
        help="longest time between two renewals, in milliseconds (default: lock duration / 2)",
    )
    return parser


def _redacted(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def _client(url: str) -> redis.Redis:
    # Fail within seconds and once: an operator wants to know the server is
    # unreachable, not to watch redis-py retry with backoff.
    return redis.Redis.from_url(
        url,
        socket_timeout=CONNECT_TIMEOUT_SECONDS,
        socket_connect_timeout=CONNECT_TIMEOUT_SECONDS,
        retry=Retry(NoBackoff(), 0),
    )


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def _run_locks(args: argparse.Namespace, prog: str, out: TextIO, err: TextIO) -> int:
    keys = QueueKeys(args.queue, prefix=args.prefix)
    where = f"{keys.base!r} on {_redacted(args.url)}"
    conn = _client(args.url)
    try:
        if args.watch is None:
            try:
                locks, stalled_total = read_locks(conn, keys)
            except (redis.RedisError, OSError) as exc:
                err.write(f"{prog}: error: cannot read the locks of {where}: {_one_line(exc)}\n")
                return EXIT_ERROR
            out.write(render_locks(keys, locks, stalled_total))
            return EXIT_OK
        return _watch(conn, keys, args.watch, where, prog, out, err)
    finally:
        conn.close()


def _watch(
    conn: redis.Redis,
    keys: QueueKeys,
    every: float,
    where: str,
    prog: str,
    out: TextIO,
    err: TextIO,
) -> int:
    watch = Watch()
    clear = _CLEAR if out.isatty() else "\n"
    first = True
    try:
        while True:
            stamp = datetime.now().strftime("%H:%M:%S")
            try:
                locks, stalled_total = read_locks(conn, keys)
            except (redis.RedisError, OSError) as exc:
                if first:
                    # A typo in the URL should fail at once, not loop.
                    err.write(
                        f"{prog}: error: cannot read the locks of {where}: {_one_line(exc)}\n"
                    )
                    return EXIT_ERROR
                frame = f"cannot read the locks of {where}: {_one_line(exc)} (retrying)\n"
            else:
                renewed = watch.update(locks, time.monotonic())
                frame = render_locks(keys, locks, stalled_total, renewed=renewed)
            out.write(f"{clear}{stamp}  every {every:g} s, Ctrl-C to stop\n{frame}")
            out.flush()
            first = False
            time.sleep(every)
    except KeyboardInterrupt:
        # Ctrl-C is how a watch ends: a normal exit, not an error.
        return EXIT_OK


def _run_explain(
    args: argparse.Namespace, parser: argparse.ArgumentParser, out: TextIO, err: TextIO
) -> int:
    try:
        timing = Timing(args.lock_duration, args.lock_renew_time)
    except (TypeError, ValueError) as exc:
        parser.error(str(exc))
    text, warnings = explain(timing)
    out.write(text)
    for warning in warnings:
        err.write(f"warning: {warning}\n")
    return EXIT_OK


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Run the command line.

    Args:
        argv: The arguments, without the program name; ``sys.argv[1:]`` when
            ``None``.
        prog: The program name shown in help and errors; the script's name
            when ``None``.

    Returns:
        The exit status: :data:`EXIT_OK`, :data:`EXIT_ERROR` or
        :data:`EXIT_USAGE`.
    """
    parser = build_parser(prog)
    out, err = sys.stdout, sys.stderr
    try:
        args = parser.parse_args(argv)
        if args.command == "explain":
            return _run_explain(args, args.command_parser, out, err)
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
