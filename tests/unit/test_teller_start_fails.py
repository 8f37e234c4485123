"""A teller thread the system refuses to start costs no later target its warning.

A burst of losses whose targets block is when starting a thread may fail
(``RuntimeError: can't start new thread``): the tellers try again, or wait for
a teller to be free, and every later target is told.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from actors import ExtendLocks, track_job
from actors.report import _Teller
from tests.support import Inbox, wait_for
from tests.support.user_code import DUE_MS, Manual


def test_a_teller_that_cannot_start_costs_later_watchers_nothing(
    manual: Manual,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    refused = threading.Event()
    start = _Teller.start

    def start_once_refused(self: Any) -> None:
        if not refused.is_set():
            refused.set()
            raise RuntimeError("can't start new thread")
        start(self)

    monkeypatch.setattr(_Teller, "start", start_once_refused)
    manager = manual.start("r2-no-thread")
    # Given a loss whose teller the OS refuses to start
    track_job(manager, "first", "t", notify=Inbox())
    manual.clock.advance(DUE_MS)
    manager.tell(ExtendLocks())
    wait_for(refused.is_set, 5, "the refused thread start")
    # When a watcher's lock is lost later
    watcher = Inbox()
    track_job(manager, "later", "t", notify=watcher)
    manual.clock.advance(DUE_MS)
    manager.tell(ExtendLocks())
    # Then that watcher is told all the same
    wait_for(lambda: watcher.got, 5, "the later watcher told")
