"""What a manager tells the world about its ticks: counters, log lines, callbacks, targets.

The manager decides (what is due, what is lost); the :class:`Reporter` says
so, in three ways at once: it counts (for ``get_stats``), it logs (with the
queue's name in every line, a traceback only on the first failure of a
streak), and it calls the user's callbacks and tells each lost lock's
targets, guarded so that nothing they raise reaches the actor.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from actors.lost import EXPIRED
from actors.stats import Counters
from actors.timer import resolution_ms

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from actors.keys import QueueKeys
    from actors.lost import LostLock
    from actors.schedule import Timing
    from actors.tally import Note, Tally

__all__ = ["Reporter"]

logger = logging.getLogger("actors.lock_manager")

#: Most ids one loss warning lists; the count is always exact.
_SHOWN = 20


class Reporter:
    """Counts, logs and calls back for one manager; used on the manager's thread only.

    Args:
        keys: The queue's keys (its name goes in every line).
        timing: The manager's windows.
        on_failed: Called with the lost jobs, or ``None``.
        on_renewed: Called with the renewed ids, or ``None``.
        on_error: Called with the error of a failed tick, or ``None``.
    """

    def __init__(
        self,
        keys: QueueKeys,
        timing: Timing,
        on_failed: Callable[[list[LostLock]], object] | None,
        on_renewed: Callable[[list[str]], object] | None,
        on_error: Callable[[Exception], object] | None,
    ) -> None:
        self.counters = Counters()
        self._keys = keys
        self._timing = timing
        self._on_failed = on_failed
        self._on_renewed = on_renewed
        self._on_error = on_error
        self._late_streak = 0
        self._hinted = False
        #: Whether a callback or a target's ``tell`` runs now (read by other
        #: threads: see ManagerRef.ask).
        self.calling = False

    def late(self, late_ms: int) -> None:
        """Record how late a timer tick ran; warn when over a quarter of the renew window."""
        self.counters.late(float(late_ms))
        if late_ms <= self._timing.renew_time / 4:
            self._late_streak = 0
            return
        self._late_streak += 1
        if self._late_streak > 1:
            return
        resolution = resolution_ms()
        if late_ms <= resolution:
            # Within what any thread's wake-up costs: the windows are too short.
            logger.warning(
                "LockManager for queue %r: a tick ran %d ms late, more than a quarter of the "
                "%d ms renew window although within a thread timer's resolution (%d ms): "
                "durations are in milliseconds, and windows this short cannot be kept",
                self._keys.name,
                late_ms,
                self._timing.renew_time,
                resolution,
            )
            return
        logger.warning(
            "LockManager for queue %r: a tick ran %d ms late (more than a quarter of the "
            "%d ms renew window): something holds this process's GIL or CPU; a job that "
            "blocks in C code needs a separate process",
            self._keys.name,
            late_ms,
            self._timing.renew_time,
        )

    def renewal(self, tally: Tally, now: int, margin_ms: int) -> None:
        """Say what a renewal did: its renewed ids, its lost locks, its error or its success."""
        if tally.renewed:
            self.renewed(tally.renewed, now, margin_ms)
        self.lost(tally.lost)
        if tally.failure is None:
            self.succeeded()
        else:
            self.tick_failed(tally.failure, tally.unknown)

    def renewed(self, job_ids: list[str], now: int, margin_ms: int) -> None:
        """Count a tick's renewals and pass them to ``on_locks_renewed``."""
        counters = self.counters
        counters.last_renewal = now
        counters.renewed += len(job_ids)
        counters.margin(float(margin_ms))
        self._call(self._on_renewed, job_ids, "on_locks_renewed")

    def lost(self, lost: Sequence[LostLock]) -> None:
        """Count, log and pass on lost locks (already untracked); none, nothing to say."""
        if not lost:
            return
        self.counters.lost += len(lost)
        name = self._keys.name
        logger.warning(
            "LockManager for queue %r: lost the lock of %d job(s): %s%s",
            name,
            len(lost),
            ", ".join(
                f"{item} ({item.reason}: {item.detail})"
                if item.detail
                else f"{item} ({item.reason})"
                for item in lost[:_SHOWN]
            ),
            " ..." if len(lost) > _SHOWN else "",
        )
        expired = next((item for item in lost if item.reason == EXPIRED), None)
        if expired is not None and not self._hinted:
            self._hinted = True
            logger.warning(
                "LockManager for queue %r: the lock %r was gone when it was renewed. If the "
                "worker takes its locks for less than this manager's lock_duration (%d ms), "
                "start the manager with the worker's lock duration; if no such key ever "
                "existed, check the prefix (%r; BullMQ uses 'bull') and the queue name",
                name,
                self._keys.key_prefix + expired.job_id + ":lock",
                self._timing.lock_duration,
                self._keys.prefix,
            )
        self._call(self._on_failed, list(lost), "on_lock_renewal_failed")

    def tick_failed(self, exc: Exception, jobs: int) -> None:
        """Count and log a tick whose Redis call failed; pass it to ``on_error``."""
        counters = self.counters
        counters.errors += 1
        counters.failed_streak += 1
        counters.last_error = f"{type(exc).__name__}: {exc}"
        # The first failure of a streak carries its traceback; during a long
        # outage the later ones are one line each.
        logger.error(
            "LockManager for queue %r: renewal of %d job(s) failed, retrying next tick: %s: %s",
            self._keys.name,
            jobs,
            type(exc).__name__,
            exc,
            exc_info=exc if counters.failed_streak == 1 else None,
        )
        self._call(self._on_error, exc, "on_error")

    def succeeded(self) -> None:
        """Note a tick whose Redis call worked: ends a failure streak."""
        counters = self.counters
        if counters.failed_streak:
            logger.warning(
                "LockManager for queue %r: renewals resumed after %d failed tick(s)",
                self._keys.name,
                counters.failed_streak,
            )
            counters.failed_streak = 0
            counters.last_error = ""

    def tell(self, notes: Sequence[Note]) -> None:
        """Tell each target of a lost lock its :class:`~actors.LockLost`; a failure is logged."""
        calling, self.calling = self.calling, True
        try:
            for target, message in notes:
                try:
                    target.tell(message)
                except BaseException:
                    logger.warning(
                        "LockManager for queue %r: could not tell a %s that job %r lost its lock",
                        self._keys.name,
                        type(target).__name__,
                        message.job_id,
                        exc_info=True,
                    )
        finally:
            # Restored, not cleared: a target's tell may call back in and tell again.
            self.calling = calling

    def wants(self, name: str) -> bool:
        """Whether the user gave the callback ``name`` (``"on_locks_renewed"``, ...)."""
        return self._callbacks()[name] is not None

    def call(self, name: str, arg: Any) -> None:
        """Call the user's callback ``name`` with ``arg``, guarded, counting and logging nothing.

        For a manager whose ticks run in a child process: the child counts
        and logs, and the worker's manager passes on what it reports.
        """
        self._call(self._callbacks()[name], arg, name)

    def _callbacks(self) -> dict[str, Callable[[Any], object] | None]:
        return {
            "on_locks_renewed": self._on_renewed,
            "on_lock_renewal_failed": self._on_failed,
            "on_error": self._on_error,
        }

    def _call(self, callback: Callable[[Any], object] | None, arg: Any, name: str) -> None:
        if callback is None:
            return
        calling, self.calling = self.calling, True
        try:
            callback(arg)
        except BaseException:
            # SystemExit or KeyboardInterrupt too: left to pykka, they would
            # stop every actor of the process, not only this manager.
            logger.exception("LockManager for queue %r: %s raised", self._keys.name, name)
        finally:
            self.calling = calling
