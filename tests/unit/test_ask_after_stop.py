"""Review 2: an asked tick whose own target blocks is never answered, even once stopped.

``Reporter.send`` answers an asked ``ExtendLocks`` through ``_Done``, once
the report was delivered *and* ``Tellers.when_told`` saw each of its tells
done. A target whose ``tell`` blocks (the rule says it must not, and the guides
say such a target "holds up only itself") never finishes, so the ask's future
is never set. A stop does not help: ``_shutdown`` answers the asks still in
the mailbox and the flight's replies, but a reply already handed to ``_Done``
waits on, and ``Tellers.end`` gives up on the blocked teller after a second
without settling its waiters. ``manager.ask(ExtendLocks())`` without a
timeout hangs for good, against "a message sent while the manager stops is
answered or refused, never left unanswered".
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
