"""What every test tier shares: servers, polling, locks, callbacks, clocks and timers.

Import from here, as in ``from tests.support import Recorder, take_locks, wait_for``.
Each name is documented where it is defined:

- polling (:mod:`tests.support.polling`): :func:`wait_for`, :func:`wait_ticks`;
- locks (:mod:`tests.support.locks`): :func:`job_ids`, :func:`new_token`, :func:`take_locks`,
  :func:`set_locks`, :func:`steal`, :func:`alive`, :func:`lost_locks`, :func:`lowest_pttl`,
  :class:`LockWatch`, :func:`watch`, :func:`watch_locks`;
- callbacks (:mod:`tests.support.recorder`): :class:`Recorder`;
- the server (:mod:`tests.support.server`): :class:`Server`,
  :func:`command_calls`, :func:`evalsha_calls`;
- driving a manager by hand (:mod:`tests.support.manual`): :class:`ManualClock`,
  :func:`manual_timer`, :func:`tick`, :func:`settle`, :func:`delivered`, :func:`unchecked`;
- fakes for the manager's seams (:mod:`tests.support.fakes`): :class:`LockTable`,
  :class:`Inbox`, :class:`Silent`, :class:`JobActor` (:func:`told`), :class:`FlakyClock`,
  :class:`HoldingClock`;
- short locks (:mod:`tests.support.short_locks`): :data:`TTL`, :func:`start_short`,
  :func:`assert_still_renewing`, :class:`Bystander`.

Nothing here mocks Redis: the lock helpers talk to the real server the
fixtures of ``tests/conftest.py`` start.
"""

from __future__ import annotations

from tests.support.fakes import FlakyClock, HoldingClock, Inbox, JobActor, LockTable, Silent, told
from tests.support.locks import (
    LockWatch,
    PackedCommands,
    alive,
    job_ids,
    lost_locks,
    lowest_pttl,
    new_token,
    set_locks,
    steal,
    take_locks,
    watch,
    watch_locks,
)
from tests.support.manual import (
    ManualClock,
    ManualTimers,
    delivered,
    manual_timer,
    settle,
    tick,
    unchecked,
)
from tests.support.polling import wait_for, wait_ticks
from tests.support.recorder import Recorder
from tests.support.server import Server, command_calls, default_engine, engines, evalsha_calls
from tests.support.short_locks import (
    INTERVAL_S,
    TTL,
    WATCH_S,
    Bystander,
    assert_still_renewing,
    start_short,
)

__all__ = [
    "INTERVAL_S",
    "TTL",
    "WATCH_S",
    "Bystander",
    "FlakyClock",
    "HoldingClock",
    "Inbox",
    "JobActor",
    "LockTable",
    "LockWatch",
    "ManualClock",
    "ManualTimers",
    "PackedCommands",
    "Recorder",
    "Server",
    "Silent",
    "alive",
    "assert_still_renewing",
    "command_calls",
    "default_engine",
    "delivered",
    "engines",
    "evalsha_calls",
    "job_ids",
    "lost_locks",
    "lowest_pttl",
    "manual_timer",
    "new_token",
    "set_locks",
    "settle",
    "start_short",
    "steal",
    "take_locks",
    "tick",
    "told",
    "unchecked",
    "wait_for",
    "wait_ticks",
    "watch",
    "watch_locks",
]
