"""Queue keys on a cluster: one slot per queue, or a clear refusal at start."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import redis

from actors import LockManager, QueueKeys, start_link, stop, track_job
from actors.keys import hash_slot
from actors.scripts import script_sha
from tests.support import Recorder, take_locks

if TYPE_CHECKING:
    from tests.cluster.conftest import LocalCluster

pytestmark = pytest.mark.cluster


def test_queue_without_hash_tag_is_refused_with_the_fix_in_the_message(
    cluster_client: redis.RedisCluster,
) -> None:
    # given a queue whose keys spread over many slots
    keys = QueueKeys("orders")

    # when a manager is started for it on a cluster client
    with pytest.raises(ValueError, match="hash tag") as refused:
        start_link(connection=cluster_client, keys=keys, lock_duration=2000)

    # then the caller learns how to name the queue, and nothing was started
    assert "QueueKeys('{orders}'" in str(refused.value)
    assert "emq:{orders}:<job_id>:lock" in str(refused.value)
    assert not cluster_client.script_exists(script_sha())[0]


def test_start_raises_in_the_caller_too(cluster_client: redis.RedisCluster) -> None:
    # given the actor class itself rather than start_link
    with pytest.raises(ValueError, match="hash tag"):
        LockManager.start(connection=cluster_client, keys=QueueKeys("orders", prefix="bull"))


@pytest.mark.parametrize(
    "keys",
    [QueueKeys("{orders}"), QueueKeys("orders", prefix="{emq}"), QueueKeys("{o}rders", "bull")],
    ids=["tag-in-name", "tag-in-prefix", "tag-in-part-of-name"],
)
def test_hash_tagged_queue_renews_on_the_cluster(
    cluster_client: redis.RedisCluster, keys: QueueKeys
) -> None:
    # given a held lock of a queue whose keys share one slot
    token = take_locks(cluster_client, keys, ["1"], 2000)["1"]
    log = Recorder()

    # when a manager renews it
    manager = start_link(
        connection=cluster_client,
        keys=keys,
        lock_duration=2000,
        lock_renew_time=200,
        **log.callbacks(),
    )
    track_job(manager, "1", token)
    log.wait_renewed(["1"], 10)
    stop(manager)

    # then the lock was renewed where it lives
    assert (log.lost(), log.errors()) == ([], [])
    assert cluster_client.get(keys.lock("1")) == token.encode()
    assert cluster_client.pttl(keys.lock("1")) > 1500


def test_slots_computed_locally_match_the_server(cluster: LocalCluster) -> None:
    # given keys with and without tags, including the tricky forms
    samples = [
        "emq:{orders}:42:lock",
        "emq:{orders}:stalled",
        "bull:{}:x",
        "a{b}c{d}",
        "{}{x}",
        "no-tag-at-all",
        "emq:{unclosed:1:lock",
        "ünïcode:{ключ}:1",
    ]
    # then the slot the manager reasons with is the one the server uses
    for key in samples:
        assert hash_slot(key) == int(
            cluster.command(cluster.masters()[0], "CLUSTER", "KEYSLOT", key)
        ), key
