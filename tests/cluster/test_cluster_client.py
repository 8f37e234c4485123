"""The cluster client the manager should be given: bounded, and checked at start."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pytest
import redis

from actors import QueueKeys, Timing, start_link, stop
from actors.connection import RETRIES, cluster_client, command_timeout

if TYPE_CHECKING:
    from tests.cluster.conftest import LocalCluster

pytestmark = pytest.mark.cluster


@pytest.mark.parametrize(
    ("lock_duration", "cluster", "seconds"),
    [
        (400, True, 0.0625),
        (4000, True, 0.625),
        (30_000, True, 4.6875),
        (240_000, True, 5.0),
        (100, False, 0.05),
        (2000, False, 0.625),
        (4000, False, 1.25),
        (30_000, False, 5.0),
    ],
)
def test_one_timeout_rule_from_the_trust_window_a_quarter_on_a_cluster_half_on_one_server(
    lock_duration: int, cluster: bool, seconds: float
) -> None:
    # A renewal answered later than a watched lock's trust window minus one
    # interval is of no use: two attempts share it (four on a cluster, which
    # may also refresh its topology), never under 50 ms nor over 5 s.
    assert command_timeout(Timing(lock_duration), cluster=cluster) == pytest.approx(seconds)


def test_cluster_client_sets_timeouts_and_one_retry(cluster: LocalCluster) -> None:
    # given the client built for a manager ticking every second (4 s locks)
    conn = cluster_client(cluster.startup_url(), interval_ms=1000)
    try:
        # then every node connection has the cluster's timeout, a quarter of
        # what the trust window leaves after one interval, and a failure is retried once
        seconds = (4000 - 500 - 1000) / 4 / 1000
        node_options = conn.nodes_manager.connection_kwargs
        assert node_options["socket_timeout"] == pytest.approx(seconds)
        assert node_options["socket_connect_timeout"] == pytest.approx(seconds)
        assert conn.retry.get_retries() == RETRIES == 1
        assert len(conn.nodes_manager.get_nodes_by_server_type("primary")) == 3
    finally:
        conn.close()


def test_an_unbounded_cluster_client_is_warned_about(
    cluster: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    # given a cluster client left at redis-py's defaults (no socket timeout)
    conn = redis.RedisCluster.from_url(cluster.startup_url())
    try:
        # when a manager starts on it
        with caplog.at_level(logging.WARNING, logger="actors"):
            stop(start_link(connection=conn, keys=QueueKeys("{q}"), lock_duration=2000))
        # then the log says a hung node could hold a tick, and how to bound it
        assert "the client has no socket_timeout" in caplog.text
        assert "actors.connection.cluster_client(url, interval_ms=500)" in caplog.text
    finally:
        conn.close()


def test_a_bounded_cluster_client_starts_quietly(
    cluster: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    conn = cluster_client(cluster.startup_url(), interval_ms=500)
    try:
        with caplog.at_level(logging.WARNING, logger="actors"):
            stop(start_link(connection=conn, keys=QueueKeys("{q}"), lock_duration=2000))
        assert "socket_timeout" not in caplog.text
    finally:
        conn.close()
