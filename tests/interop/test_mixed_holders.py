"""Jobs held by a Node.js BullMQ worker and by our manager, side by side on one queue.

The Node.js worker processes its jobs for good (its processor never returns),
renews them with BullMQ's own lock manager and runs BullMQ's own stalled
checker; bullmq-py takes the other jobs by hand and our manager renews them.
Neither side may take the other's jobs, and when a holder dies, the other
runtime's checker gets its jobs back to wait.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from actors import get_stats, stop, track_job
from tests.interop.peers import (
    HOLD_S,
    RECOVER_S,
    Held,
    check_for,
    check_until_stalled,
    stall_count,
)
from tests.support import wait_for

if TYPE_CHECKING:
    import redis

    from actors import ManagerRef, QueueKeys
    from tests.interop.peers import NodePeer, PythonPeer

pytestmark = [pytest.mark.both_engines, pytest.mark.node]

#: Jobs per holder.
EACH = 3


def test_holders_of_both_runtimes_keep_their_jobs_and_recover_each_others(
    python_peer: PythonPeer,
    node_peer: NodePeer,
    manager: ManagerRef,
    engine_client: redis.Redis,
    keys: QueueKeys,
) -> None:
    # Given jobs on one queue: bullmq-py takes some by hand and our manager renews them,
    ids = python_peer.add(2 * EACH)
    ours = python_peer.fetch(EACH)
    for job in ours:
        track_job(manager, job.id, job.token)
    # and a running Node.js BullMQ worker takes the rest and holds them.
    node_peer.hold(concurrency=EACH)
    wait_for(
        lambda: len(node_peer.events("active")) == EACH,
        RECOVER_S,
        f"the Node.js worker took {EACH} jobs",
    )
    theirs = [Held(str(event["id"]), str(event["token"])) for event in node_peer.events("active")]
    assert sorted(job.id for job in ours + theirs) == sorted(ids)

    # When bullmq-py's stalled check and the Node.js worker's own checker run
    # over three lock durations.
    checks = check_for(python_peer, engine_client, keys, HOLD_S)

    # Then nobody's job was stolen: every job is active under its holder's
    # token, and neither checker reported a stall.
    assert checks.stalled == []
    assert node_peer.events("stalled") == []
    assert node_peer.events("error") == []
    assert python_peer.states(ids) == dict.fromkeys(ids, "active")
    for job in ours + theirs:
        assert engine_client.get(keys.lock(job.id)) == job.token.encode(), job
        assert stall_count(engine_client, keys, job.id) == 0, job
    assert get_stats(manager).lost == 0

    # When our manager stops, as if its worker died.
    stop(manager)

    # Then the Node.js worker's checker recovers our jobs, and only ours.
    our_ids = sorted(job.id for job in ours)
    wait_for(
        lambda: sorted(str(event["id"]) for event in node_peer.events("stalled")) == our_ids,
        RECOVER_S,
        f"the Node.js checker reported {our_ids} stalled",
    )
    assert python_peer.states(ids) == {
        **{job.id: "waiting" for job in ours},
        **{job.id: "active" for job in theirs},
    }

    # When the Node.js worker is killed.
    node_peer.kill()
    recovery = check_until_stalled(python_peer, engine_client, keys, [job.id for job in theirs])

    # Then bullmq-py's check recovers its jobs, each once, and every job waits.
    assert sorted(recovery.stalled) == sorted(job.id for job in theirs)
    assert python_peer.states(ids) == dict.fromkeys(ids, "waiting")
