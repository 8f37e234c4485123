"""What each operation does on the manager: the handlers its dispatch finds in the table.

The manager's one dispatch path looks each message's type up in
:data:`actors.operations.OPERATIONS` and calls the handler named there;
:class:`~actors.LockManager` inherits these (the tick's own,
``_on_extend``, is the manager's). Each runs on the manager's thread and
first looks again at the message (see :mod:`actors.rechecks`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from actors import rechecks, tracking

if TYPE_CHECKING:
    from collections.abc import Callable

    from actors import messages as m
    from actors.alarm import Alarm
    from actors.jobs import JobTable, LostLocks, Validity
    from actors.report import Reporter
    from actors.schedule import Timing
    from actors.stats import Stats
    from actors.tally import Tally

__all__ = ["Handlers"]

logger = logging.getLogger("actors.lock_manager")


class _Manager(Protocol):
    """What the handlers use of the manager."""

    queue_name: str
    clock: Callable[[], int]
    _timing: Timing
    _max_hold: int | None
    _jobs: JobTable
    _lost: LostLocks
    _alarm: Alarm
    _reporter: Reporter

    def _take(self, tally: Tally) -> Tally: ...

    def _deliver(self) -> None: ...


class Handlers:
    """The handlers of the operations that do not tick."""

    def _on_track(self: _Manager, message: m.TrackJob) -> Validity | None:
        margin = rechecks.recheck_track(message, self._timing)
        job_id, token, ts, notify = message.job_id, message.token, message.ts, message.notify
        gone = self._lost.get(job_id, token) if self._lost else None
        again = None if gone is None else tracking.tracked_again(gone, job_id, token, notify)
        if again is not None:
            if self._take(again).notes:
                self._deliver()
            return None
        try:
            now = self.clock()
        except BaseException:
            if ts is None:
                raise
            # The caller's stamp, read on the same clock, stands in: a track
            # is never dropped for the clock's fault.
            logger.warning("LockManager for queue %r: the clock raised", self.queue_name)
            now = ts
        # A stamp is never later than now: a lock never looks younger than it is.
        ts = now if ts is None or ts > now else ts
        hold = self._max_hold if message.max_hold is None else message.max_hold
        tally = tracking.track(self._jobs, job_id, token, ts, notify, hold, message.keep, margin)
        if self._take(tally).notes:
            # Told at once: the old lock's targets learn it is another run's now.
            self._deliver()
        if notify is None:
            return None
        validity = self._jobs.valid.get(job_id)
        if validity is not None:
            self._alarm.sooner(self._jobs.deadlines)
        # The lock's validity, for a lease to read its deadline itself.
        return validity

    def _on_untrack(self: _Manager, message: m.UntrackJob) -> None:
        rechecks.recheck_untrack(message)
        # The target is only compared by identity: none of its code runs here.
        self._jobs.untrack(message.job_id, message.token, message.notify)

    def _on_count(self: _Manager, _: m.GetActiveJobCount) -> int:
        return len(self._jobs)

    def _on_ids(self: _Manager, _: m.GetTrackedJobIds) -> list[str]:
        return self._jobs.ids()

    def _on_stats(self: _Manager, _: m.GetStats) -> Stats:
        return self._reporter.counters.snapshot(self.queue_name, len(self._jobs), self.clock())

    def _on_is_tracked(self: _Manager, message: m.IsTracked) -> bool:
        rechecks.recheck_is_tracked(message)
        return message.job_id in self._jobs
