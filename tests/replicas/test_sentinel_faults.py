"""Sentinel URLs and Sentinel-managed clients against real processes."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

import pytest
import redis
import redis.sentinel

import actors
from actors import QueueKeys
from actors.connection import client_for_url, command_timeout
from actors.timing import Timing
from tests.support import take_locks, wait_for
from tests.support.sentinel import SentinelSet

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
KEYS = QueueKeys("q", prefix="bull")
SECRET = "s3cr"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def hung_sentinels() -> Iterator[list[int]]:
    """Three listening sockets nobody accepts on: a connect succeeds, no reply ever comes."""
    socks = []
    for _ in range(3):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        socks.append(sock)
    yield [int(sock.getsockname()[1]) for sock in socks]
    for sock in socks:
        sock.close()


def test_the_cli_never_prints_a_sentinel_urls_password() -> None:
    # The URL works (parse_sentinel_url reads the password 's3cr#t'), but redacted_url,
    # through urlsplit, cuts it at '#' and prints the whole URL back on stderr.
    url = f"redis+sentinel://:{SECRET}#t@127.0.0.1:{_closed_port()}/mymaster"
    done = subprocess.run(
        [sys.executable, "-m", "actors", "locks", "--url", url, "--queue", "q"],
        capture_output=True,
        check=False,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode != 0
    assert "cannot read the locks" in done.stderr
    assert SECRET not in done.stderr + done.stdout


def test_the_cli_reports_a_sentinel_port_out_of_range_without_a_traceback() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "actors",
            "locks",
            "--url",
            "redis+sentinel://127.0.0.1:99999/mymaster",
            "--queue",
            "q",
        ],
        capture_output=True,
        check=False,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert "Traceback" not in done.stderr, done.stderr[-600:]
    assert done.returncode == 2  # an argparse error, as for redis://127.0.0.1:99999


def test_process_mode_refuses_a_sentinel_port_out_of_range_at_start() -> None:
    # redis://127.0.0.1:99999 raises ValueError at start_link; the Sentinel URL is taken,
    # then every child dies at its first PING (ValueError, not a RedisError) and after
    # six deaths the manager stops renewing.
    manager = None
    try:
        with pytest.raises(ValueError):
            manager = actors.start_link(
                connection="redis+sentinel://127.0.0.1:99999/mymaster",
                keys=KEYS,
                isolation="process",
                lock_duration=2000,
            )
    finally:
        if manager is not None:
            manager.stop()


def test_a_connect_through_hung_sentinels_keeps_the_per_attempt_bound(
    hung_sentinels: list[int],
) -> None:
    # command_timeout: "two attempts share what is left". Through Sentinel, each attempt
    # asks every sentinel for up to the whole timeout, and the retry asks them all again.
    timeout = command_timeout(Timing(4000))
    url = "redis+sentinel://" + ",".join(f"127.0.0.1:{p}" for p in hung_sentinels) + "/m"
    client = client_for_url(url, timeout=timeout)
    started = time.monotonic()
    with pytest.raises(redis.ConnectionError):
        client.ping()
    took = time.monotonic() - started
    client.close()
    assert took < 2 * timeout + 0.5, f"{took:.2f} s for a {timeout:g} s per-attempt bound"


@pytest.fixture
def sentinels() -> Iterator[SentinelSet]:
    with SentinelSet() as started:
        yield started


def _renewed(client: redis.Redis, key: str, token: str, above_ms: int) -> bool:
    return client.get(key) == token.encode() and int(client.pttl(key)) > above_ms


def test_process_mode_from_a_url_with_percent_encoded_acl_credentials(
    sentinels: SentinelSet,
) -> None:
    password = "p@:,/#?%x"
    primary = sentinels.primary()
    sentinels.command(primary, "ACL", "SETUSER", "bob@x", "on", f">{password}", "~*", "&*", "+@all")
    hosts = ",".join(f"{host}:{port}" for host, port in sentinels.sentinels)
    user, secret = quote("bob@x", safe=""), quote(password, safe="")
    url = f"redis+sentinel://{user}:{secret}@{hosts}/{sentinels.master_name}"
    check = client_for_url(url, timeout=1.0)
    token = take_locks(check, KEYS, ["j1"], 4000)["j1"]
    manager = actors.start_link(connection=url, keys=KEYS, isolation="process", lock_duration=4000)
    try:
        actors.track_job(manager, "j1", token, wait=True)
        first = int(check.pttl(KEYS.lock("j1")))
        # The TTL goes up only if the child, logged in from the URL, renews the lock.
        wait_for(lambda: int(check.pttl(KEYS.lock("j1"))) > first, 8.0, "a renewal")
        assert check.get(KEYS.lock("j1")) == token.encode()
    finally:
        manager.stop()
        check.close()


def test_process_mode_copies_the_sentinels_own_password(sentinels: SentinelSet) -> None:
    primary = sentinels.primary()
    plain = sentinels.admin(primary)
    for address in sentinels.sentinels:
        sentinels.command(address, "ACL", "SETUSER", "default", "on", ">sentinel-pw")
    with pytest.raises(redis.AuthenticationError):  # the sentinels now want the password
        redis.Redis(*sentinels.sentinels[0], socket_timeout=1.0).ping()
    manager_of = redis.sentinel.Sentinel(
        sentinels.sentinels,
        sentinel_kwargs={"password": "sentinel-pw", "socket_timeout": 1.0},
    )
    client = manager_of.master_for(sentinels.master_name, socket_timeout=1.0)
    token = take_locks(client, KEYS, ["j1"], 4000)["j1"]
    manager = actors.start_link(
        connection=client, keys=KEYS, isolation="process", lock_duration=4000
    )
    try:
        actors.track_job(manager, "j1", token, wait=True)
        first = int(plain.pttl(KEYS.lock("j1")))
        # The TTL goes up only if the child, logged in to the sentinels, renews the lock.
        wait_for(lambda: int(plain.pttl(KEYS.lock("j1"))) > first, 8.0, "a renewal")
        assert plain.get(KEYS.lock("j1")) == token
    finally:
        manager.stop()
        client.close()


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_an_unknown_service_is_reported_and_retried(
    sentinels: SentinelSet, isolation: str, caplog: pytest.LogCaptureFixture
) -> None:
    hosts = ",".join(f"{host}:{port}" for host, port in sentinels.sentinels)
    url = f"redis+sentinel://{hosts}/no-such-service"
    errors: list[Exception] = []
    caplog.set_level(logging.WARNING)
    started = time.monotonic()
    manager = actors.start_link(
        connection=url, keys=KEYS, isolation=isolation, lock_duration=2000, on_error=errors.append
    )
    took = time.monotonic() - started
    try:
        actors.track_job(manager, "j1", "tok")
        wait_for(lambda: len(errors) >= 3, 15, "three failed ticks")
        assert took < 2.0
        text = caplog.text
        assert "no-such-service" in text
        assert all(isinstance(e, redis.ConnectionError) for e in errors), errors
    finally:
        manager.stop()
