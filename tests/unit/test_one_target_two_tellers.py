"""A target shared by many jobs is told on one teller at a time, in the order of its losses.

A job supervisor's object, or the bullmq integration's manager (the target of
every job of a worker), hears each loss after the ones before it, never two at once.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from actors import ExtendLocks, track_job
from tests.support import wait_for
from tests.support.user_code import DUE_MS, Manual


def test_one_target_hears_its_losses_one_at_a_time_in_order(manual: Manual) -> None:
    heard: list[str] = []
    inside = threading.Semaphore(1)
    overlapped: list[str] = []

    class Supervisor:
        """One object watching many jobs; its tell is slow, not blocking."""

        def tell(self, message: Any) -> None:
            if not inside.acquire(blocking=False):
                overlapped.append(message.job_id)
                heard.append(message.job_id)
                return
            try:
                heard.append(message.job_id)
                time.sleep(1.0)
            finally:
                inside.release()

    manager = manual.start("r2-one-target")
    supervisor = Supervisor()
    manual.table.held["second"] = "t"
    track_job(manager, "first", "t", notify=supervisor)
    track_job(manager, "second", "t", notify=supervisor)
    manual.clock.advance(DUE_MS)
    manager.tell(ExtendLocks())  # "first" lost, "second" renewed
    wait_for(lambda: heard, 5, "the first loss told")
    del manual.table.held["second"]
    manual.clock.advance(DUE_MS)
    manager.tell(ExtendLocks())  # "second" lost, at the next report
    wait_for(lambda: len(heard) == 2, 5, "the second loss told")
    assert (heard, overlapped) == (["first", "second"], [])
