"""The ``echomq-locks`` command line (``python -m actors``), against a real server.

The commands an operator types run as subprocesses, exit status and streams
included; the finer cases call ``actors.cli.main`` in-process, which runs the
same code without paying for an interpreter start each time.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import math
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING

import bullmq
import pytest
import redis

from actors import QueueKeys, Timing, start_link, stop, track_job
from actors.cli import DEFAULT_URL, LockInfo, Watch, build_parser, main
from actors.connection import command_timeout
from actors.embedded import EmbeddedServer, free_port
from tests.support import take_locks

if TYPE_CHECKING:
    from tests.conftest import Server

KEYS = QueueKeys("orders")
CLI = [sys.executable, "-m", "actors"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def hold(client: redis.Redis, keys: QueueKeys, job_id: str, ttl_ms: int | None = 20000) -> str:
    token = str(uuid.uuid4())
    client.set(keys.lock(job_id), token, px=ttl_ms)
    return token


def table(output: str) -> dict[str, list[str]]:
    """The rows of a ``locks`` table by job id (columns split on 2+ spaces)."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("JOB"))
    body = itertools.takewhile(str.strip, lines[start + 1 :])  # up to the lines under the table
    rows = [re.split(r"\s{2,}", line.strip()) for line in body]
    return {row[0]: row[1:] for row in rows}


def seconds(cell: str) -> float:
    assert cell.endswith(" s"), cell
    return float(cell[:-2])


# -- locks ---------------------------------------------------------------


def test_locks_lists_holder_time_left_and_stalled_state(
    server: Server, redis_client: redis.Redis
) -> None:
    # Given two held jobs of a queue, one of them in the stalled set, beside
    # other keys of the queue and the locks of other queues
    slow = hold(redis_client, KEYS, "job-1", ttl_ms=30000)
    fast = hold(redis_client, KEYS, "job-2", ttl_ms=8000)
    redis_client.sadd(KEYS.stalled, "job-1", "job-gone")
    redis_client.set("emq:orders:meta", "x")
    hold(redis_client, QueueKeys("orders2"), "other-queue")
    hold(redis_client, QueueKeys("orders", prefix="bull"), "other-prefix")

    # When an operator lists the queue's locks
    result = run("locks", "--url", server.url, "--queue", "orders")

    # Then each lock shows its shortened token, time left and stalled state, most urgent first
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert result.stdout.splitlines()[0] == (
        "emq:orders: 2 lock(s), 1 of them in the stalled set (stalled set size 2)"
    )
    rows = table(result.stdout)
    assert list(rows) == ["job-2", "job-1"]
    assert rows["job-1"][0] == f"{slow[:8]}...{slow[-8:]}"
    assert rows["job-2"][0] == f"{fast[:8]}...{fast[-8:]}"
    assert 20 < seconds(rows["job-1"][1]) <= 30
    assert 0 < seconds(rows["job-2"][1]) <= 8
    assert (rows["job-1"][2], rows["job-2"][2]) == ("yes", "no")
    assert slow not in result.stdout


@pytest.mark.both_engines
def test_locks_of_a_bullmq_queue_and_a_lock_without_ttl(
    engine_client: redis.Redis, engine_server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a BullMQ queue with one lock that never expires and one that does
    keys = QueueKeys("mail", prefix="bull")
    hold(engine_client, keys, "forever", ttl_ms=None)
    hold(engine_client, keys, "timed", ttl_ms=5000)
    engine_client.sadd(keys.stalled, "timed")

    # When its locks are listed with --prefix bull
    status = main(["locks", "--url", engine_server.url, "--queue", "mail", "--prefix", "bull"])

    # Then the lock without a TTL comes first, flagged: it would never let its job stall
    out = capsys.readouterr().out
    assert status == 0
    rows = table(out)
    assert list(rows) == ["forever", "timed"]
    assert rows["forever"][1:] == ["no TTL", "no"]
    assert rows["timed"][2] == "yes"


def test_bullmq_tokens_of_one_worker_stay_distinguishable(
    server: Server, redis_client: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a BullMQ queue where one worker holds three jobs, a repeatable one
    # among them (its id holds colons), and a second worker holds one: tokens
    # "<worker id>:<n>" that differ, within a worker, only after the colon
    keys = QueueKeys("mail", prefix="bull")
    first, second = uuid.uuid4().hex, uuid.uuid4().hex
    tokens = {
        "1": f"{first}:1",
        "2": f"{first}:2",
        "repeat:5f2c:1700000000000": f"{first}:12",
        "3": f"{second}:1",
        "short": "tok-7",
    }
    for job_id, token in tokens.items():
        redis_client.set(keys.lock(job_id), token, px=20000)

    # When its locks are listed
    status = main(["locks", "--url", server.url, "--queue", "mail", "--prefix", "bull"])

    # Then every holder reads differently, by the head and the tail of its token,
    # each job under its full id, and a short token shows whole
    out = capsys.readouterr().out
    assert status == 0
    rows = table(out)
    shown = {job_id: row[0] for job_id, row in rows.items()}
    assert shown == {
        job_id: token if len(token) <= 19 else f"{token[:8]}...{token[-8:]}"
        for job_id, token in tokens.items()
    }
    assert len(set(shown.values())) == len(tokens)
    assert shown["1"].endswith(":1") and shown["2"].endswith(":2")
    assert shown["1"][:8] != shown["3"][:8]


def test_queue_names_with_glob_characters_match_only_themselves(
    redis_client: redis.Redis, server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a queue whose name is full of SCAN glob characters, and a queue
    # whose keys an unescaped pattern of that name would also match
    tricky = QueueKeys("{q[1]}*?\\")
    decoy = QueueKeys("{q1}x?\\")
    hold(redis_client, tricky, "mine")
    redis_client.sadd(tricky.stalled, "mine")
    hold(redis_client, decoy, "not-mine")

    # When the tricky queue's locks are listed
    status = main(["locks", "--url", server.url, "--queue", tricky.name])

    # Then only its own lock shows, found in its own stalled set
    out = capsys.readouterr().out
    assert status == 0
    rows = table(out)
    assert list(rows) == ["mine"]
    assert rows["mine"][2] == "yes"
    # ...where the unescaped pattern would have listed the decoy's lock too
    unescaped = {key.decode() for key in redis_client.scan_iter(match=tricky.key_prefix + "*:lock")}
    assert decoy.lock("not-mine") in unescaped


def test_an_empty_queue_says_so(server: Server, redis_client: redis.Redis) -> None:
    # Given a queue without locks
    # When its locks are listed
    result = run("locks", "--url", server.url, "--queue", "idle")

    # Then the command says there are none and succeeds
    assert result.returncode == 0, result.stderr
    assert (
        result.stdout == "emq:idle: 0 lock(s), 0 of them in the stalled set (stalled set size 0)\n"
    )


def test_a_prefix_written_into_the_queue_name_is_a_usage_error_without_traceback() -> None:
    # Given BullMQ's key layout typed as the queue name
    # When its locks are listed
    result = run("locks", "--url", "redis://127.0.0.1:1/0", "--queue", "bull:reports")

    # Then it is a usage error (status 2, as the help says) that gives the options to use
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1].endswith("use --prefix bull --queue reports")


def test_an_empty_queue_with_locks_under_another_prefix_gets_a_hint(
    server: Server, redis_client: redis.Redis
) -> None:
    # Given a BullMQ queue's locks, listed without --prefix bull
    bullmq = QueueKeys("reports", prefix="bull")
    hold(redis_client, bullmq, "1")
    hold(redis_client, bullmq, "2")

    result = run("locks", "--url", server.url, "--queue", "reports")

    # Then the empty listing says where the locks are, in one line
    assert result.returncode == 0, result.stderr
    header, hint = result.stdout.splitlines()
    assert header.startswith("emq:reports: 0 lock(s)")
    assert hint == (
        "hint: 2 lock(s) of queue 'reports' under prefix 'bull' "
        "(bull:reports:<job id>:lock): add --prefix bull"
    )


@pytest.mark.both_engines
def test_a_lock_key_of_another_type_is_listed_as_such_beside_the_others(
    engine_client: redis.Redis, engine_server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a queue with one real lock and one lock key that holds a hash
    token = hold(engine_client, KEYS, "good")
    engine_client.hset(KEYS.lock("odd"), "field", "value")

    status = main(["locks", "--url", engine_server.url, "--queue", KEYS.name])

    # Then both are listed: the odd one as a key of its type, the other as usual
    rows = table(capsys.readouterr().out)
    assert status == 0
    assert rows["odd"][:2] == ["(hash key)", "no TTL"]
    assert rows["good"][0] == f"{token[:8]}...{token[-8:]}"


def test_url_defaults_to_redis_url_then_localhost(
    server: Server, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    hold(redis_client, KEYS, "job-1")
    # Given REDIS_URL, the command reads that server without --url
    monkeypatch.setenv("REDIS_URL", server.url)
    result = run("locks", "--queue", KEYS.name)
    assert result.returncode == 0, result.stderr
    assert list(table(result.stdout)) == ["job-1"]
    # and without it, the local default server
    monkeypatch.delenv("REDIS_URL")
    assert (
        build_parser().parse_args(["locks", "--queue", "q"]).url
        == DEFAULT_URL
        == ("redis://localhost:6379/0")
    )


def test_explain_warns_that_a_short_lock_duration_is_in_milliseconds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = main(["explain", "--lock-duration", "30"])

    (warning,) = capsys.readouterr().err.splitlines()
    assert status == 0
    assert warning.startswith("warning: lock_duration is in milliseconds")
    assert "pass 30000" in warning


def test_an_unreachable_server_is_one_line_and_exit_status_1() -> None:
    # Given a URL with a password, of a port nobody listens on
    url = f"redis://:secret@127.0.0.1:{free_port()}/0"

    # When its locks are listed
    result = run("locks", "--url", url, "--queue", "orders")

    # Then one line on stderr says what failed, without a traceback or the password
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("python -m actors: error: cannot read the locks of 'emq:orders'")
    assert "ConnectionError" in lines[0]
    assert "secret" not in lines[0]
    assert ":***@127.0.0.1" in lines[0]


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        (["locks", "--url", "http://:hunter2@host", "--queue", "q"], "--url: not a Redis URL"),
        (["locks", "--url", "redis://localhost:port/0", "--queue", "q"], "argument --url"),
        (
            ["locks", "--url", "redis+sentinel://:hunter2@s1:26379", "--queue", "q"],
            "names the primary's service",
        ),
        (["locks", "--url", "redis://localhost", "--queue", ""], "argument --queue"),
        (["locks", "--url", "redis://localhost"], "required: --queue"),
        (["locks", "--url", "redis://x", "--queue", "q", "--watch", "0"], "argument --watch"),
        (["explain", "--lock-duration", "30000", "--lock-renew-time", "30000"], "lock_renew_time"),
        (["explain", "--lock-duration", "ten"], "argument --lock-duration"),
        (["explain", "--lock-duration", "-5"], "lock_duration must be positive"),
        (["locks", "--queue", "bull:reports"], "use --prefix bull --queue reports"),
        (["locks", "--queue", "reports", "--prefix", "bull:"], "use --prefix bull"),
        ([], "required: COMMAND"),
        (["status"], "invalid choice"),
    ],
)
def test_usage_errors_exit_with_status_2(
    argv: list[str], complaint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given a wrong command line
    # When it runs
    status = main(argv, prog="echomq-locks")

    # Then argparse's usage and one error line explain it, with status 2
    err = capsys.readouterr().err
    assert status == 2
    assert err.startswith("usage: echomq-locks")
    assert complaint in err.splitlines()[-1]
    assert "hunter2" not in err


class Watching:
    """A ``locks --watch`` subprocess whose output lines the test waits for."""

    HEADER = re.compile(r"^\d\d:\d\d:\d\d  every ")

    def __init__(
        self, url: str, queue_name: str, every: float = 0.2, *, sigint_ignored: bool = False
    ) -> None:
        # A shell's background job, nohup and some CI runners start programs
        # with SIGINT ignored; Python then installs no KeyboardInterrupt.
        ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None
        self.process = subprocess.Popen(
            [*CLI, "locks", "--url", url, "--queue", queue_name, "--watch", f"{every:g}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=ignore,  # noqa: PLW1509 (no threads run the child's setup)
        )
        self.lines: queue.Queue[tuple[float, str]] = queue.Queue()
        self.seen: list[str] = []
        self.reader = threading.Thread(target=self._read)
        self.reader.start()

    def _read(self) -> None:
        for line in self.process.stdout or []:
            self.lines.put((time.monotonic(), line))

    def _next(self, deadline: float) -> tuple[float, str] | None:
        while time.monotonic() < deadline:
            try:
                arrived, line = self.lines.get(timeout=0.1)
            except queue.Empty:
                continue
            self.seen.append(line)
            return arrived, line
        return None

    def wait_for_line(self, pattern: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while (got := self._next(deadline)) is not None:
            if re.search(pattern, got[1]):
                return
        raise AssertionError(f"no line matching {pattern!r} in:\n{''.join(self.seen)}")

    def frames(self, count: int, timeout: float) -> list[tuple[float, dict[str, list[str]]]]:
        """The next ``count`` whole frames: when each arrived, and its rows by job id."""
        deadline = time.monotonic() + timeout
        frames: list[tuple[float, list[str]]] = []
        while len(frames) <= count:  # a frame is whole once the next one starts
            got = self._next(deadline)
            if got is None:
                raise AssertionError(f"{len(frames)} of {count} frames in:\n{''.join(self.seen)}")
            if self.HEADER.match(got[1]):
                frames.append((got[0], []))
            elif frames:
                frames[-1][1].append(got[1])
        return [(arrived, table("".join(lines))) for arrived, lines in frames[:count]]

    def interrupt(self, signum: int = signal.SIGINT) -> tuple[int, str]:
        """Press Ctrl-C (or send ``signum``); return the exit status and what went to stderr.

        A watch that does not end within 10 s is killed, so it never outlives its test.
        """
        self.process.send_signal(signum)
        try:
            returncode = self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            returncode = -1
        self.reader.join(timeout=30)
        assert self.process.stdout is not None
        assert self.process.stderr is not None
        err = self.process.stderr.read()
        self.process.stdout.close()
        self.process.stderr.close()
        return returncode, err


def test_watch_refreshes_shows_renewals_and_stops_cleanly_on_ctrl_c(
    server: Server, redis_client: redis.Redis
) -> None:
    # Given one held job, watched every 0.2 s
    token = hold(redis_client, KEYS, "job-1", ttl_ms=10000)
    watching = Watching(server.url, "orders")
    try:
        # When the first refresh has shown it, not seen renewed yet
        watching.wait_for_line(r"^job-1\s.*\s-\s+\d+\.\d s$")

        # ...and then its holder renews it and a second job starts
        redis_client.set(KEYS.lock("job-1"), token, px=60000)
        hold(redis_client, KEYS, "job-2", ttl_ms=10000)

        # Then later refreshes show the new job, and the renewal as the expiry moving later
        watching.wait_for_line(r"^job-2\s")
        watching.wait_for_line(r"^job-1\s.*\s\d+\.\d s ago\s+\d+\.\d s$")
    finally:
        # When the operator presses Ctrl-C
        returncode, err = watching.interrupt()

    # Then the watch ends with status 0 and no traceback
    assert returncode == 0, err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("signum", "sigint_ignored"),
    [(signal.SIGINT, True), (signal.SIGTERM, False), (signal.SIGTERM, True)],
    ids=["ctrl-c-while-sigint-ignored", "sigterm", "sigterm-while-sigint-ignored"],
)
def test_watch_ends_on_ctrl_c_or_sigterm_whatever_the_signal_disposition(
    server: Server, redis_client: redis.Redis, signum: int, sigint_ignored: bool
) -> None:
    # Given a watch started as a background job (SIGINT ignored) or a service (SIGTERM)
    hold(redis_client, KEYS, "job-1", ttl_ms=10000)
    watching = Watching(server.url, "orders", sigint_ignored=sigint_ignored)
    try:
        watching.wait_for_line(r"^job-1\s")
    finally:
        # When it is sent the signal
        returncode, err = watching.interrupt(signum)

    # Then it ends at once with status 0 and no traceback (a hung watch is killed: -1)
    assert returncode == 0, err
    assert "Traceback" not in err


def test_watch_rides_out_a_server_restart() -> None:
    # Given a watch on a private server holding one lock
    with EmbeddedServer() as private:
        client = redis.Redis.from_url(private.url, socket_timeout=10)
        hold(client, KEYS, "job-1", ttl_ms=60000)
        watching = Watching(private.url, "orders")
        try:
            watching.wait_for_line(r"^job-1\s")

            # When the server goes away, then comes back (empty: it keeps no files)
            private.kill()
            watching.wait_for_line(r"cannot read the locks of 'emq:orders'.*\(retrying\)$")
            private.start()
            client.set(KEYS.lock("job-9"), "token-after-restart", px=60000)

            # Then the watch says so and carries on with what the server holds now
            watching.wait_for_line(r"^job-9\s")
        finally:
            returncode, err = watching.interrupt()
            client.close()

    assert returncode == 0, err
    assert err == ""


@pytest.mark.parametrize("every", [1.0, 0.25])
def test_watch_sees_every_renewal_of_a_running_manager_and_its_lowest_ttl(
    every: float, server: Server, redis_client: redis.Redis
) -> None:
    # Given a lock manager renewing three 2 s locks about once a second, whose
    # renewals the test clocks (the callback runs just after each script call)
    timing = Timing(2000)
    duration, renew = timing.lock_duration, timing.renew_time
    renewals: dict[str, list[float]] = {}
    taken = time.monotonic()
    tokens = take_locks(redis_client, KEYS, ["a", "b", "c"], ttl_ms=duration)

    def renewed(job_ids: list[str]) -> None:
        for job_id in job_ids:
            renewals[job_id].append(time.monotonic())

    renewals.update({job_id: [taken] for job_id in tokens})
    manager = start_link(
        connection=server.url, keys=KEYS, lock_duration=duration, on_locks_renewed=renewed
    )
    for job_id, token in tokens.items():
        track_job(manager, job_id, token)

    # When a watch refreshes for five renew periods: every 1 s, the period the
    # locks are renewed at, and every 0.25 s
    count = math.ceil(5 * renew / 1000 / every) + 1
    watching = Watching(server.url, "orders", every=every)
    try:
        frames = watching.frames(count, timeout=30 + 3 * count * every)
    finally:
        returncode, err = watching.interrupt()
        stop(manager)
    assert returncode == 0, err

    # Then every refresh after a renewal (one the test clocked between the
    # arrival of the first frame and of the one before) shows a renewal, never
    # older than one renew period plus one refresh
    slack = renew / 10 / 1000  # scheduling noise on a busy machine, in seconds
    first_arrival = frames[0][0]
    checked = 0
    for (previous_arrival, _), (_, rows) in pairwise(frames):
        assert set(rows) == set(tokens)
        for job_id, row in rows.items():
            if not any(first_arrival < c < previous_arrival - slack for c in renewals[job_id]):
                continue
            ago = re.fullmatch(r"(\d+\.\d) s ago", row[3])
            assert ago, (job_id, row, frames)
            assert float(ago.group(1)) <= renew / 1000 + every + slack, (job_id, row)
            checked += 1
    # (all but the frames before the first renewal the watch could see)
    unseen = 2 + math.ceil((renew / 1000 + slack) / every)
    assert checked >= len(tokens) * (count - unseen), (checked, renewals, frames)

    # ...and LOWEST TTL is at most the TTL each lock had just before a renewal
    # the watch saw (the whole TTL minus the time since the previous renewal),
    # and less than that by at most two refreshes
    second_to_last_arrival = frames[-2][0]
    for job_id, row in frames[-1][1].items():
        lowest_ms = seconds(row[4]) * 1000
        times = renewals[job_id]
        gaps = [later - earlier for earlier, later in pairwise(times)]
        assert gaps, renewals
        seen = [
            later - earlier
            for earlier, later in pairwise(times)
            if first_arrival < later < second_to_last_arrival
        ]
        assert seen, (renewals, first_arrival, second_to_last_arrival)
        assert lowest_ms <= duration - max(seen) * 1000 + slack * 1000, (job_id, row, seen)
        floor = duration - (max(gaps) + 2 * every + slack) * 1000
        assert lowest_ms >= max(0.0, floor), (job_id, row, gaps)


def lock(ttl_ms: int, at: float, token: str = "token-a", read_ms: float = 1.0) -> LockInfo:
    """Job "j1" as read by a round trip that started at ``at`` and took ``read_ms``."""
    return LockInfo("j1", token, ttl_ms, stalled=False, read_at=(at, at + read_ms / 1000))


def test_watch_compares_expiry_instants_not_ttls() -> None:
    # Given a watch that has seen a 1.5 s lock once
    watch = Watch()
    assert watch.update([lock(1500, at=100.0)]) == {"j1": ("-", "1.5 s")}

    # When a refresh one second later reads the same TTL (its holder renewed
    # it in between: its expiry moved one second later)
    cells = watch.update([lock(1500, at=101.0)])

    # Then the renewal shows, and the lowest TTL is what the old expiry left at
    # the latest moment the renewal can have come: the end of this read
    assert cells == {"j1": ("0.0 s ago", "0.5 s")}

    # When the TTL runs down without a renewal, lower than before
    assert watch.update([lock(100, at=102.4)]) == {"j1": ("1.4 s ago", "0.1 s")}
    # ...or a TTL goes up by less than the uncertainty of two reads
    watch = Watch()
    watch.update([lock(1500, at=200.0, read_ms=10)])
    assert watch.update([lock(1005, at=200.5, read_ms=10)]) == {"j1": ("-", "1.0 s")}

    # Then a new holder (another token) is a new lock, its lowest TTL its own
    assert watch.update([lock(30000, at=201.0, token="token-b")]) == {"j1": ("-", "30.0 s")}
    # ...a lock that disappeared is forgotten, and a lock without TTL has no lowest
    assert watch.update([]) == {}
    assert watch.update([lock(-1, at=203.0)]) == {"j1": ("-", "-")}
    assert watch.update([lock(-1, at=204.0)]) == {"j1": ("-", "-")}


# -- explain -------------------------------------------------------------


def explained(out: str) -> dict[str, str]:
    return {
        name: value
        for name, value, _ in (re.split(r"\s{2,}", line, maxsplit=2) for line in out.splitlines())
    }


def test_explain_prints_the_windows_of_the_default_configuration() -> None:
    # Given the default lock duration
    # When an operator asks what it means
    result = run("explain", "--lock-duration", "30000")

    # Then every window is there, with a comfortable headroom and no warning
    assert result.returncode == 0
    assert result.stderr == ""
    assert explained(result.stdout) == {
        "lock_duration": "30000 ms",
        "lock_renew_time": "15000 ms",
        "tick interval": "7500 ms",
        "due threshold": "7500 ms",
        "worst-case gap": "15000 ms",
        "headroom": "15000 ms",
        "safety_margin": "3750 ms",
        "socket_timeout": "5 s",
        "cluster socket_timeout": "4.6875 s",
    }
    assert "2.0 tick(s)" in result.stdout


@pytest.mark.parametrize("lock_duration", [2000, 30000, 100_000])
def test_explain_gives_the_socket_timeout_the_manager_warns_about(
    lock_duration: int,
    server: Server,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given a lock duration, explained
    status = main(["explain", "--lock-duration", str(lock_duration)])
    rows = explained(capsys.readouterr().out)
    assert status == 0

    # When a manager of that duration starts with a client that has no socket timeout
    client = redis.Redis.from_url(server.url)
    with caplog.at_level(logging.WARNING, logger="actors"):
        manager = start_link(connection=client, keys=KEYS, lock_duration=lock_duration)
        stop(manager)
    client.close()

    # Then the manager's warning asks for the very figure explain prints, and
    # the cluster figure is the same rule's, in the same format
    warned = re.search(r"answered after ([\d.]+) s per attempt", caplog.text)
    assert warned, caplog.text
    timing = Timing(lock_duration)
    assert rows["socket_timeout"] == f"{warned.group(1)} s"
    assert rows["socket_timeout"] == f"{command_timeout(timing):g} s"
    assert rows["cluster socket_timeout"] == f"{command_timeout(timing, cluster=True):g} s"


def test_explain_warns_when_the_margin_is_under_one_tick(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Given a renew time close to the lock duration
    # When it is explained
    status = main(["explain", "--lock-duration", "30000", "--lock-renew-time", "25000"])

    # Then the headroom is shown, and a warning says by how much to lower the renew time
    captured = capsys.readouterr()
    assert status == 0
    assert explained(captured.out)["headroom"] == "5000 ms"
    assert explained(captured.out)["tick interval"] == "12500 ms"
    (warning,) = captured.err.splitlines()
    assert warning.startswith("warning: the headroom (5000 ms) is shorter than one tick")
    assert "at most 20001 ms" in warning


def test_explain_stays_quiet_at_exactly_one_tick_of_margin(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Given the largest renew time the warning advises
    # When it is explained
    status = main(["explain", "--lock-duration", "30000", "--lock-renew-time", "20001"])

    # Then the headroom equals one tick and there is nothing to warn about
    captured = capsys.readouterr()
    assert status == 0
    assert explained(captured.out)["headroom"] == "10000 ms"
    assert explained(captured.out)["tick interval"] == "10000 ms"
    assert captured.err == ""


# -- help ----------------------------------------------------------------


def test_help_teaches_with_examples_from_the_installed_script() -> None:
    # Given the console script pip installed beside the interpreter
    script = Path(sys.executable).with_name("echomq-locks")

    # When an operator asks it for help
    result = subprocess.run(
        [str(script), "--help"], capture_output=True, text=True, timeout=60, check=False
    )

    # Then it names both commands and shows runnable examples under its own name
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: echomq-locks")
    assert "locks" in result.stdout
    assert "explain" in result.stdout
    assert "examples:\n  echomq-locks locks --url redis://" in result.stdout
    assert "exit status:" in result.stdout


def test_subcommand_help_explains_the_columns(capsys: pytest.CaptureFixture[str]) -> None:
    # Given an operator unsure what the locks table means
    # When they ask the subcommand for help
    status = main(["locks", "--help"], prog="echomq-locks")

    # Then it describes the columns and the options
    out = capsys.readouterr().out
    assert status == 0
    for words in ["token", "stalled set", "--watch", "--prefix", "SCAN", "RENEWED", "LOWEST TTL"]:
        assert words in out


@pytest.mark.parametrize("command", ["locks", "explain"])
def test_subcommand_help_names_each_command_once(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given an operator asking one subcommand for help
    # When it prints its usage and its examples
    status = main([command, "--help"], prog="echomq-locks")

    # Then every line names the program once and each subcommand once
    out = capsys.readouterr().out
    assert status == 0
    assert out.startswith(f"usage: echomq-locks {command} [-h]")
    assert "examples:\n  echomq-locks locks --url redis://" in out
    assert "\n  echomq-locks explain --lock-duration" in out
    for line in out.splitlines():
        assert not re.search(r"(?<![\w-])(locks|explain) (locks|explain)\b", line), line
        assert line.count("echomq-locks") <= 1, line


def test_module_help_names_the_subcommand_once() -> None:
    # Given the command run as a module, as the README shows it
    # When its subcommand is asked for help
    result = run("locks", "--help")

    # Then usage and examples both read "python -m actors locks", never "locks locks"
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python -m actors locks [-h]")
    assert "  python -m actors locks --url redis://" in result.stdout
    assert "locks locks" not in result.stdout


# -- JSON, and the active jobs that hold no lock ------------------------------


def test_json_lists_locks_and_the_active_jobs_the_next_stalled_checks_take(
    server: Server, redis_client: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = QueueKeys(f"lockless-{uuid.uuid4().hex[:6]}", prefix="bull")
    # Given three active jobs: one holding its lock, one whose lock expired, and
    # one whose lock is gone and that a stalled check already put in the set
    token = hold(redis_client, keys, "held")
    odd = "żółw-\U0001f422 " + "x" * 300
    redis_client.rpush(keys.key_prefix + "active", "held", "expired", odd)
    redis_client.sadd(keys.stalled, odd)

    status = main(
        ["locks", "--url", server.url, "--queue", keys.name, "--prefix", "bull", "--json"]
    )
    document = json.loads(capsys.readouterr().out)

    assert status == 0
    assert (document["queue"], document["prefix"]) == (keys.name, "bull")
    assert [lock["job_id"] for lock in document["locks"]] == ["held"]
    (lock,) = document["locks"]
    assert lock["token"] == token
    assert 0 < lock["ttl_ms"] <= 20000
    assert (lock["stalled"], lock["wrong_type"]) == (False, None)
    assert document["lockless"] == [
        {"job_id": "expired", "in_stalled_set": False},
        {"job_id": odd, "in_stalled_set": True},
    ]
    assert document["stalled_set_size"] == 1

    # The table says the same in words.
    main(["locks", "--url", server.url, "--queue", keys.name, "--prefix", "bull"])
    text = capsys.readouterr().out
    assert "2 active job(s) hold no lock; the next stalled checks take them: expired, " in text
    assert f"{odd} (in the stalled set: moved at the next check)" in text


def test_a_long_active_list_is_read_in_pages(
    server: Server, redis_client: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = QueueKeys(f"long-{uuid.uuid4().hex[:6]}")
    ids = [str(i) for i in range(20_000)]
    redis_client.rpush(keys.key_prefix + "active", *ids)
    held = ids[::1000]
    take_locks(redis_client, keys, held, 20000)

    main(["locks", "--url", server.url, "--queue", keys.name, "--json"])
    document = json.loads(capsys.readouterr().out)

    assert len(document["locks"]) == len(held)
    assert [job["job_id"] for job in document["lockless"]] == [i for i in ids if i not in held]
    # The table names the first 50 and counts the rest.
    main(["locks", "--url", server.url, "--queue", keys.name])
    assert f"and {len(ids) - len(held) - 50} more" in capsys.readouterr().out


def test_json_watch_prints_one_document_per_refresh(server: Server) -> None:
    keys = QueueKeys(f"watch-{uuid.uuid4().hex[:6]}")
    process = subprocess.Popen(
        [*CLI, "locks", "--url", server.url, "--queue", keys.name, "--json", "--watch", "0.1"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        documents = [json.loads(process.stdout.readline()) for _ in range(3)]
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)
    assert process.returncode == 0
    assert all(d["queue"] == keys.name and d["locks"] == [] for d in documents)


def test_a_wrong_type_active_key_is_a_clear_error(
    server: Server, redis_client: redis.Redis
) -> None:
    keys = QueueKeys(f"wrong-{uuid.uuid4().hex[:6]}")
    redis_client.set(keys.key_prefix + "active", "not a list")
    result = run("locks", "--url", server.url, "--queue", keys.name, "--json")
    assert result.returncode == 1
    assert "WRONGTYPE" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_listing_names_each_bullmq_worker_of_the_queue(
    server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = QueueKeys(f"named-{uuid.uuid4().hex[:6]}", prefix="bull")
    names = ["alpha", "eu-west.2:w:x"]

    async def listing() -> tuple[dict[str, object], str]:
        # Given two named bullmq-py workers of the queue and one of another queue
        workers = [
            bullmq.Worker(queue, None, {"connection": server.url, "name": name, "autorun": False})
            for queue, name in [(keys.name, names[0]), (keys.name, names[1]), ("else", "beta")]
        ]
        try:
            for worker in workers:
                await worker._ensure_client_names()  # what run() and each fetch do first
            args = ["locks", "--url", server.url, "--queue", keys.name, "--prefix", "bull"]
            await asyncio.to_thread(main, [*args, "--json"])
            document = json.loads(capsys.readouterr().out)
            await asyncio.to_thread(main, args)
            return document, capsys.readouterr().out
        finally:
            for worker in workers:
                await worker.close()

    document, text = asyncio.run(listing())
    listed = document["workers"]
    assert isinstance(listed, list)
    # (each worker names each of its connections)
    assert {worker["name"] for worker in listed} == set(names)
    assert f"{len(listed)} worker connection(s) on the queue, named: alpha, eu-west.2:w:x" in text


def test_a_server_that_refuses_client_list_leaves_the_workers_unknown(
    server: Server, redis_client: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    user = f"cli-{uuid.uuid4().hex[:6]}"
    redis_client.acl_setuser(
        user, enabled=True, passwords=["+secret"], keys=["*"], commands=["+@all", "-client"]
    )
    url = server.url.replace("redis://", f"redis://{user}:secret@")
    try:
        keys = QueueKeys(f"acl-{uuid.uuid4().hex[:6]}")
        hold(redis_client, keys, "1")
        status = main(["locks", "--url", url, "--queue", keys.name, "--json"])
        document = json.loads(capsys.readouterr().out)
        main(["locks", "--url", url, "--queue", keys.name])
        text = capsys.readouterr().out
    finally:
        redis_client.acl_deluser(user)
    # The locks are listed all the same.
    assert status == 0
    assert [lock["job_id"] for lock in document["locks"]] == ["1"]
    assert document["workers"] is None
    assert "workers: unknown (the server refuses CLIENT LIST)" in text
