"""An asked tick whose own target blocks is answered once the manager stops.

Its reply waits for its report's targets; a target whose ``tell`` blocks
(against the rule) holds it up until the stop, which lets every waiter go:
a message sent to a stopping manager is answered or refused, never left unanswered.
"""

from __future__ import annotations

import pykka
import pytest

from actors import ExtendLocks, ManagerStopped, stop, track_job
from tests.support.user_code import DUE_MS, Blocks, Manual


def test_an_asked_tick_is_answered_once_the_manager_stopped(manual: Manual) -> None:
    blocked = Blocks(manual.release())
    manager = manual.start("r2-ask-stop")
    track_job(manager, "a", "t", notify=blocked)  # not held: lost at the tick, its target blocks
    manual.clock.advance(DUE_MS)
    answer = manager.ask(ExtendLocks(), block=False)
    assert blocked.entered.wait(5)
    # When the manager is stopped
    stop(manager, timeout=10)
    # Then the ask is answered (or refused) all the same
    try:
        answer.get(timeout=5)
    except pykka.Timeout:
        pytest.fail("the asked tick was never answered, though the manager stopped")
    except ManagerStopped:
        pass  # refused: fine
