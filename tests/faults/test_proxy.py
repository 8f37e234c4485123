"""The fault proxy itself, against a real server: each mode does what the scenarios rely on."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.faults.proxy import FaultProxy

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.conftest import Server


@pytest.fixture
def shared_proxy(server: Server) -> Iterator[FaultProxy]:
    with FaultProxy.to(server.url) as fault_proxy:
        yield fault_proxy


def client_of(proxy: FaultProxy, timeout: float = 0.3) -> redis.Redis:
    # No retry: each call below must show what one attempt meets.
    return redis.Redis.from_url(
        proxy.url,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
    )


def test_pass_forwards_commands_both_ways(shared_proxy: FaultProxy) -> None:
    client = client_of(shared_proxy)

    client.set("proxied", "yes")

    assert client.get("proxied") == b"yes"
    assert shared_proxy.accepted == 1


def test_blackhole_stalls_open_and_new_connections_until_passed_again(
    shared_proxy: FaultProxy,
) -> None:
    # Given a connection that works
    open_client = client_of(shared_proxy)
    assert open_client.ping()

    # When the proxy black-holes, then the open connection and a new one both time out
    shared_proxy.blackhole()
    with pytest.raises(redis.TimeoutError):
        open_client.ping()
    with pytest.raises(redis.TimeoutError):
        client_of(shared_proxy).ping()

    # And once it passes again a fresh client is answered
    shared_proxy.passthrough()
    assert client_of(shared_proxy).ping()


def test_reset_fails_fast_with_a_connection_error(shared_proxy: FaultProxy) -> None:
    open_client = client_of(shared_proxy, timeout=5)
    assert open_client.ping()

    with shared_proxy.fault("reset"):
        started = time.monotonic()
        with pytest.raises(redis.ConnectionError):
            open_client.ping()
        with pytest.raises(redis.ConnectionError):
            client_of(shared_proxy, timeout=5).ping()
        # A reset is an answer, not silence: far below the 5 s timeout.
        assert time.monotonic() - started < 2.5

    assert client_of(shared_proxy).ping()


def test_latency_delays_each_round_trip(shared_proxy: FaultProxy) -> None:
    client = client_of(shared_proxy, timeout=5)
    client.ping()
    shared_proxy.latency = 0.2

    started = time.monotonic()
    for _ in range(3):
        client.ping()
    elapsed = time.monotonic() - started

    assert elapsed >= 0.6


def test_a_dropped_reply_reaches_the_client_as_a_dropped_connection(
    shared_proxy: FaultProxy, redis_client: redis.Redis
) -> None:
    client = client_of(shared_proxy)
    assert client.ping()
    shared_proxy.drop_reply_to("INCRBY")  # what redis-py sends for incr()

    # The server ran the command, and the client saw its connection drop
    with pytest.raises(redis.ConnectionError):
        client.incr("counted")
    assert redis_client.get("counted") == b"1"
    assert shared_proxy.cuts == 1

    # And the cut was one-shot: the next connection is answered
    assert client.incr("counted") == 2


def test_unknown_mode_is_refused(shared_proxy: FaultProxy) -> None:
    with pytest.raises(ValueError, match="mode"):
        shared_proxy.mode = "drop"  # type: ignore[assignment]
