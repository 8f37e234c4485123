"""The cluster client the manager should be given: bounded, and checked at start."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pytest
import redis

from actors import QueueKeys, start_link, stop
from actors.cluster import CLUSTER_RETRIES, cluster_client, cluster_timeout

if TYPE_CHECKING:
    from tests.cluster.conftest import LocalCluster

pytestmark = pytest.mark.cluster


@pytest.mark.parametrize(
    ("interval_ms", "seconds"),
    [(10, 0.05), (500, 0.05), (1000, 0.1), (7500, 0.75), (60_000, 2.0)],
)
def test_timeout_is_a_tenth_of_the_interval_within_bounds(interval_ms: int, seconds: float) -> None:
    assert cluster_timeout(interval_ms) == pytest.approx(seconds)


def test_cluster_client_sets_timeouts_and_one_retry(cluster: LocalCluster) -> None:
    # given the client built for a manager ticking every second
    conn = cluster_client(cluster.startup_url(), interval_ms=1000)
    try:
        # then every node connection has the short timeouts, and a failure is retried once
        node_options = conn.nodes_manager.connection_kwargs
        assert node_options["socket_timeout"] == pytest.approx(0.1)
        assert node_options["socket_connect_timeout"] == pytest.approx(0.1)
        assert conn.retry.get_retries() == CLUSTER_RETRIES == 1
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
        with caplog.at_level(logging.WARNING, logger="actors.lock_manager"):
            stop(start_link(connection=conn, keys=QueueKeys("{q}"), lock_duration=2000))
        # then the log says a hung node could hold a tick, and how to bound it
        assert "no socket_timeout" in caplog.text
    finally:
        conn.close()


def test_a_bounded_cluster_client_starts_quietly(
    cluster: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    conn = cluster_client(cluster.startup_url(), interval_ms=500)
    try:
        with caplog.at_level(logging.WARNING, logger="actors.lock_manager"):
            stop(start_link(connection=conn, keys=QueueKeys("{q}"), lock_duration=2000))
        assert "socket_timeout" not in caplog.text
    finally:
        conn.close()
