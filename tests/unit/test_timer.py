"""The manager's thread timer fires on time whatever its clock does."""

from __future__ import annotations

import itertools
import logging
import threading
import time

import pytest

from actors import ThreadTimer

#: Longest wait for a fire that is already due, in seconds.
SETTLE_S = 5.0


def test_a_clock_that_raises_once_still_lets_the_timer_fire(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reads = itertools.count()

    def clock() -> int:
        if next(reads) == 0:
            raise RuntimeError("the clock broke once")
        return time.monotonic_ns() // 1_000_000

    fired = threading.Event()
    timer = ThreadTimer(lambda deadline: fired.set(), "timer-under-test", clock=clock)
    try:
        with caplog.at_level(logging.ERROR, logger="actors.timer"):
            timer.arm(0)
            assert fired.wait(SETTLE_S), "the timer never fired after its clock raised"
        assert "the clock raised" in caplog.text
    finally:
        timer.close()
