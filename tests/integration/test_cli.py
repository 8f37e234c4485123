"""The ``echomq-locks`` command line (``python -m actors``), against a real server.

The commands an operator types run as subprocesses, exit status and streams
included; the finer cases call ``actors.cli.main`` in-process, which runs the
same code without paying for an interpreter start each time.
"""

from __future__ import annotations

import queue
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import redis

from actors import QueueKeys
from actors.cli import LockInfo, Watch, glob_escape, lock_pattern, main
from actors.embedded import EmbeddedServer, free_port

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
    rows = [re.split(r"\s{2,}", line.strip()) for line in lines[start + 1 :] if line.strip()]
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
    assert rows["job-1"][0] == slow[:8] + "..."
    assert rows["job-2"][0] == fast[:8] + "..."
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
    assert lock_pattern(tricky) == "emq:\\{q\\[1\\]\\}\\*\\?\\\\:*:lock"
    assert glob_escape("plain-name_1") == "plain\\-name_1"


def test_an_empty_queue_says_so(server: Server, redis_client: redis.Redis) -> None:
    # Given a queue without locks
    # When its locks are listed
    result = run("locks", "--url", server.url, "--queue", "idle")

    # Then the command says there are none and succeeds
    assert result.returncode == 0, result.stderr
    assert (
        result.stdout == "emq:idle: 0 lock(s), 0 of them in the stalled set (stalled set size 0)\n"
    )


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
        (["locks", "--url", "redis://localhost", "--queue", ""], "argument --queue"),
        (["locks", "--url", "redis://localhost"], "required: --queue"),
        (["locks", "--url", "redis://x", "--queue", "q", "--watch", "0"], "argument --watch"),
        (["explain", "--lock-duration", "30000", "--lock-renew-time", "30000"], "lock_renew_time"),
        (["explain", "--lock-duration", "ten"], "argument --lock-duration"),
        (["explain", "--lock-duration", "-5"], "lock_duration must be positive"),
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

    def __init__(self, url: str, queue_name: str) -> None:
        self.process = subprocess.Popen(
            [*CLI, "locks", "--url", url, "--queue", queue_name, "--watch", "0.2"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self.reader = threading.Thread(target=self._read)
        self.reader.start()

    def _read(self) -> None:
        for line in self.process.stdout or []:
            self.lines.put(line)

    def wait_for_line(self, pattern: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.1)
            except queue.Empty:
                continue
            self.seen.append(line)
            if re.search(pattern, line):
                return
        raise AssertionError(f"no line matching {pattern!r} in:\n{''.join(self.seen)}")

    def interrupt(self) -> tuple[int, str]:
        """Press Ctrl-C; return the exit status and what went to stderr."""
        self.process.send_signal(signal.SIGINT)
        returncode = self.process.wait(timeout=30)
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
        watching.wait_for_line(r"^job-1\s.*\s-$")

        # ...and then its holder renews it and a second job starts
        redis_client.set(KEYS.lock("job-1"), token, px=60000)
        hold(redis_client, KEYS, "job-2", ttl_ms=10000)

        # Then later refreshes show the new job, and the renewal as the TTL going up
        watching.wait_for_line(r"^job-2\s")
        watching.wait_for_line(r"^job-1\s.*\s\d+\.\d s ago$")
    finally:
        # When the operator presses Ctrl-C
        returncode, err = watching.interrupt()

    # Then the watch ends with status 0 and no traceback
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


def test_watch_sees_a_renewal_only_when_the_ttl_goes_up_under_the_same_token() -> None:
    # Given a watch that has seen a lock once
    watch = Watch()
    first = LockInfo("j1", "token-a", 9000, stalled=False)
    assert watch.update([first], now=100.0) == {"j1": "-"}

    # When its TTL only went down, then went up, then time passed
    assert watch.update([LockInfo("j1", "token-a", 8000, False)], now=101.0) == {"j1": "-"}
    assert watch.update([LockInfo("j1", "token-a", 30000, False)], now=102.0) == {"j1": "0.0 s ago"}
    assert watch.update([LockInfo("j1", "token-a", 28500, False)], now=103.5) == {"j1": "1.5 s ago"}

    # Then a new holder (another token) is a new lock, not a renewal
    assert watch.update([LockInfo("j1", "token-b", 30000, False)], now=104.0) == {"j1": "-"}
    # ...and a lock that disappeared is forgotten
    assert watch.update([], now=105.0) == {}
    assert watch.update([LockInfo("j1", "token-b", 40000, False)], now=106.0) == {"j1": "-"}


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

    # Then every window is there, with a comfortable margin and no warning
    assert result.returncode == 0
    assert result.stderr == ""
    assert explained(result.stdout) == {
        "lock_duration": "30000 ms",
        "lock_renew_time": "15000 ms",
        "tick interval": "7500 ms",
        "due threshold": "7500 ms",
        "worst-case gap": "15000 ms",
        "safety margin": "15000 ms",
        "socket_timeout": "1.875 s",
    }
    assert "2.0 tick(s)" in result.stdout


def test_explain_warns_when_the_margin_is_under_one_tick(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Given a renew time close to the lock duration
    # When it is explained
    status = main(["explain", "--lock-duration", "30000", "--lock-renew-time", "25000"])

    # Then the margin is shown, and a warning says by how much to lower the renew time
    captured = capsys.readouterr()
    assert status == 0
    assert explained(captured.out)["safety margin"] == "5000 ms"
    assert explained(captured.out)["tick interval"] == "12500 ms"
    (warning,) = captured.err.splitlines()
    assert warning.startswith("warning: the safety margin (5000 ms) is shorter than one tick")
    assert "at most 20001 ms" in warning


def test_explain_stays_quiet_at_exactly_one_tick_of_margin(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Given the largest renew time the warning advises
    # When it is explained
    status = main(["explain", "--lock-duration", "30000", "--lock-renew-time", "20001"])

    # Then the margin equals one tick and there is nothing to warn about
    captured = capsys.readouterr()
    assert status == 0
    assert explained(captured.out)["safety margin"] == "10000 ms"
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
    for words in ["token", "stalled set", "--watch", "--prefix", "SCAN"]:
        assert words in out
