"""A take answered with a job id that is not UTF-8 fails the fetch; the child lives on.

The child cannot renew a job it cannot name: it answers as taking nothing,
the worker's fetch fails, and the lock expires for the stalled check.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from actors import QueueKeys, start_link, stop
from actors.process.take import Source
from tests.isolation.conftest import children

if TYPE_CHECKING:
    from tests.support import Server

KEYS = QueueKeys("r2-undecodable")
TTL = 1000
#: Answers as moveToActive does, with a job id of one byte that is not UTF-8.
TAKE = "redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]); return {0, '\\255'}"


def test_a_take_answered_with_a_non_utf8_id_leaves_the_child_running(server: Server) -> None:
    manager = start_link(connection=server.url, keys=KEYS, lock_duration=TTL, isolation="process")
    try:
        [child] = children()
        taker = manager.taker()
        assert taker is not None
        take = taker(Source(TAKE), [KEYS.lock("x")], ["tx", TTL, "x"], "tx")
        outcome: object
        try:
            outcome = take.result(5)
        except Exception as exc:
            outcome = exc
        time.sleep(0.2)
        # The take is answered (whatever it says), and the same child still renews
        assert not isinstance(outcome, Exception), f"the take failed: {outcome!r}"
        assert children() == [child], "the child process died"
    finally:
        stop(manager)
