"""Targets that never block are told by a few reused threads, with no warning.

A report with thousands of distinct, instant targets (pykka refs, inboxes)
keeps the tellers' pool small: a teller freed within ``HELD_UP_S`` is reused
before another is started.
"""

from __future__ import annotations

import logging
import threading

from actors import ExtendLocks, track_job
from actors.report import WARN_TELLERS
from tests.support import Inbox
from tests.support.user_code import DUE_MS, Manual, handler

TARGETS = 6000


def test_instant_targets_start_few_tellers_and_no_held_up_warning(manual: Manual) -> None:
    warnings: list[str] = []
    manager = manual.start("r2-many-targets")
    targets = [Inbox() for _ in range(TARGETS)]
    for i, target in enumerate(targets):
        track_job(manager, f"j{i}", "t", notify=target)  # none held: each lost at the tick
    with handler(lambda record: warnings.append(record.getMessage()), logging.WARNING):
        manual.clock.advance(DUE_MS)
        manager.ask(ExtendLocks(), timeout=30)
        assert manager._manager.flush(10)
    assert sum(len(target.got) for target in targets) == TARGETS
    tellers = [t for t in threading.enumerate() if t.name.startswith("LockManager-tell-r2-")]
    held_up = [w for w in warnings if "held up in a target's tell()" in w]
    assert (len(tellers), held_up) == (len(tellers), []), f"{len(tellers)} teller threads"
    assert len(tellers) <= WARN_TELLERS
