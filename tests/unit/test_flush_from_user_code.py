"""A manager's ``flush`` from its own user code is refused at once: it would wait for itself."""

from __future__ import annotations

import time
from typing import Any

from actors import ExtendLocks, track_job
from tests.support import wait_for
from tests.support.user_code import DUE_MS, Manual


def test_a_target_that_flushes_from_its_tell_is_refused_at_once(manual: Manual) -> None:
    manager = manual.start("flush-from-a-target")
    outcomes: list[tuple[str, float]] = []

    class Flushes:
        def tell(self, _message: Any) -> None:
            started = time.monotonic()
            try:
                manager._manager.flush(2.0)
                outcomes.append(("flushed", time.monotonic() - started))
            except RuntimeError:
                outcomes.append(("refused", time.monotonic() - started))

    track_job(manager, "a", "t", notify=Flushes())  # not held: lost at the next tick
    manual.clock.advance(DUE_MS)
    manager.tell(ExtendLocks())
    wait_for(lambda: outcomes, 5, "the target's flush")
    [(outcome, took)] = outcomes
    # It would wait for its own tell: refused, well before the 2 s it allowed
    assert outcome == "refused"
    assert took < 1.0
