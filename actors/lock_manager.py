"""The lock manager: one actor, one timer, one batched renewal per tick.

A port of EchoMQ's ``LockManager`` GenServer to a pykka ``ThreadingActor``.
Job actors tell it which jobs they hold and release; every interval its timer
tells it :class:`~actors.messages.ExtendLocks`, and it renews every due lock
in one round trip. Lost locks are untracked and reported; a Redis fault
untracks nothing and the next tick retries.

All state lives on the actor's thread: other threads reach it only through
messages, which its :class:`~actors.ref.ManagerRef` checks in their thread.
What the manager has to say (counters, logs, callbacks) goes through its
:class:`~actors.report.Reporter`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import TYPE_CHECKING, Any

import pykka
from pykka.messages import _ActorStop

from actors import _telemetry
from actors.isolation import (
    ChildLink,
    InChild,
    check_process_options,
    require_isolation,
)
from actors.jobs import Claim, JobTable, LostLocks
from actors.keys import QueueKeys
from actors.lost import (
    EXPIRED,
    MANAGER_STOPPED,
    MAX_HOLD,
    STOLEN,
    UNCONFIRMED,
    LockLost,
    LostLock,
    Reason,
)
from actors.messages import (
    ExtendLocks,
    GetActiveJobCount,
    GetStats,
    GetTrackedJobIds,
    IsTracked,
    TrackJob,
    UntrackJob,
)
from actors.operations import OPERATIONS
from actors.ref import ManagerRef, ManagerStopped
from actors.renewer import RedisRenewer
from actors.report import Reporter
from actors.schedule import (
    DEFAULT_LOCK_DURATION,
    Timing,
    check_safety_margin,
    default_safety_margin,
    monotonic_ms,
    next_deadline,
)
from actors.scripts import DEFAULT_MAX_BATCH, BatchOutcome
from actors.timer import ThreadTimer, resolution_ms
from actors.validation import MAX_DURATION_MS, is_valid_text, require_callback, require_int

if TYPE_CHECKING:
    from collections.abc import Callable

    from actors.connection import Client
    from actors.jobs import Ended, Gone, Validity
    from actors.messages import Notify
    from actors.renewer import Renewer
    from actors.stats import Stats
    from actors.timer import Timer, TimerFactory

__all__ = ["LockManager"]

logger = logging.getLogger(__name__)


class _TicksFirst(queue.Queue[Any]):
    """A manager's mailbox: first in, first out, except its own timer's tick, which goes first.

    A backlog (a burst of tells from many threads) would otherwise hold each
    tick behind all of it, and every lock would wait for the backlog to drain.
    Nothing is lost by the jump: tracks carry their caller's time, and a
    caller who must not race a tick untracks with ``wait=True``. Only the
    message the timer's thread is sending right now jumps: an
    ``ExtendLocks`` anyone else sends waits its turn.
    """

    def __init__(self) -> None:
        super().__init__()
        #: The tick the timer's thread is putting in, if any.
        self.tick: object = None
        #: How many messages at the front were put there by :meth:`put_first`.
        self.first = 0
        #: The envelope taken last: a process-mode manager answers some asks later.
        self.current: Any = None
        #: Set, under the queue's lock, as the manager begins to stop: a
        #: message is then either in already (answered, or failed by pykka's
        #: last pass over the mailbox) or refused here, never left unread.
        self.closed = False

    def _put(self, item: Any) -> None:
        # queue.Queue's documented override point, called under its lock.
        if self.closed:
            raise pykka.ActorDeadError("the manager is stopping")
        if item.message is self.tick:
            self.tick = None
            self.queue.insert(self.first, item)
        else:
            self.queue.append(item)

    def _get(self) -> Any:
        if self.first:
            self.first -= 1
        self.current = item = self.queue.popleft()
        return item

    def put_first(self, item: Any) -> None:
        """Put ``item`` before every message but those put so before it, ticks included.

        Raises:
            pykka.ActorDeadError: The manager is stopping.
        """
        with self.not_empty:
            if self.closed:
                raise pykka.ActorDeadError("the manager is stopping")
            self.queue.insert(self.first, item)
            self.first += 1
            self.unfinished_tasks += 1
            self.not_empty.notify()

    def close(self) -> None:
        """Refuse every message from now on."""
        with self.mutex:
            self.closed = True


class LockManager(pykka.ThreadingActor):
    """Renews the locks of the jobs a worker holds on one queue.

    Start it with :func:`actors.start_link` (or ``LockManager.start(...)``
    with the same keywords). Talk to it with the module's helpers, with
    ``ref.proxy()``, or with the messages of :mod:`actors.messages`.

    Args:
        connection: A ``redis.Redis`` or ``redis.RedisCluster`` client, or a
            Redis URL (the manager then builds a client whose failed command
            ends within a quarter of the interval, and closes it when it stops).
        keys: The queue's keys.
        lock_duration: The lock TTL set at each renewal, in milliseconds.
        lock_renew_time: Longest time between two renewals of a lock, in
            milliseconds; ``lock_duration // 2`` when ``None``.
        on_lock_renewal_failed: Called with the lost jobs, untracked first:
            a list of :class:`~actors.LostLock`, each a ``str`` (the id) that
            also carries the lost ``token`` and the ``reason``.
        on_locks_renewed: Called with the ids renewed by a tick.
        on_error: Called with the exception of a tick whose Redis call failed.
        max_batch: Most ids per script call; a tick's calls share one round trip.
        max_hold: Most milliseconds any job's lock is renewed (``None``: no
            cap); past it the job is untracked and reported ``"max_hold"``.
        renewer: What renews the locks, instead of the shared script on
            ``connection`` (another backend, or a test's lock table).
        clock: The monotonic clock, in milliseconds, for stamps and ticks.
        timer: Builds the manager's one timer (see :mod:`actors.timer`).
        safety_margin: How long before the server could expire a watched
            lock (a lease's, a ``notify`` target's) its watchers are told
            ``"unconfirmed"``, in milliseconds: the lock is trusted until
            ``lock_duration - safety_margin`` after the last renewal the
            server confirmed was sent. Half the timer interval when ``None``
            (see ``actors.schedule.default_safety_margin``); it must be
            below ``lock_duration`` minus the interval.
        isolation: ``"thread"`` (the default): the timer and the renewals run
            on this manager's threads. ``"process"``: they run in a child
            process the manager starts and ends (see :mod:`actors.isolation`),
            so no GIL hold in the worker delays a renewal, and the locks are
            deleted (compare-and-delete on the token) when the worker dies.
            The same API, messages, callbacks and leases; ``connection`` must
            then be a URL or a ``redis.Redis`` (no cluster yet), and
            ``renewer``, ``clock`` and ``timer`` are refused.

    Callbacks run on the manager's thread, between ticks: keep them short,
    and tell other actors rather than wait for them. Whatever they raise
    (``SystemExit`` included) is logged and changes nothing.

    Raises:
        TypeError: An argument has the wrong type.
        ValueError: A duration is out of range, the client's encoding is not
            UTF-8, or the queue's keys cannot live in one hash slot of the
            cluster client given.
    """

    use_daemon_thread = True

    @staticmethod
    def _create_actor_inbox() -> queue.Queue[Any]:
        # pykka's hook for an actor type's mailbox (see _TicksFirst).
        return _TicksFirst()

    def __init__(
        self,
        *,
        connection: Client | str | None = None,
        keys: QueueKeys,
        lock_duration: int = DEFAULT_LOCK_DURATION,
        lock_renew_time: int | None = None,
        on_lock_renewal_failed: Callable[[list[LostLock]], object] | None = None,
        on_locks_renewed: Callable[[list[str]], object] | None = None,
        on_error: Callable[[Exception], object] | None = None,
        max_batch: int = DEFAULT_MAX_BATCH,
        max_hold: int | None = None,
        renewer: Renewer | None = None,
        clock: Callable[[], int] | None = None,
        timer: TimerFactory | None = None,
        safety_margin: int | None = None,
        isolation: str = "thread",
    ) -> None:
        super().__init__()
        mailbox = self.actor_inbox
        assert isinstance(mailbox, _TicksFirst)
        self._mailbox = mailbox
        if not isinstance(keys, QueueKeys):
            raise TypeError(f"keys must be a QueueKeys, got {type(keys).__name__}")
        self._timing = Timing(lock_duration, lock_renew_time)
        #: The default safety margin of a watched lock, in milliseconds.
        self.safety_margin = (
            default_safety_margin(self._timing)
            if safety_margin is None
            else check_safety_margin(safety_margin, self._timing)
        )
        require_callback(on_lock_renewal_failed, "on_lock_renewal_failed")
        require_callback(on_locks_renewed, "on_locks_renewed")
        require_callback(on_error, "on_error")
        require_callback(clock, "clock")
        if clock is not None and (isinstance(probe := clock(), bool) or not isinstance(probe, int)):
            raise TypeError(
                f"clock must return int milliseconds (as time.monotonic_ns() // 1_000_000), "
                f"got {type(probe).__name__}"
            )
        require_callback(timer, "timer")
        if max_hold is not None:
            max_hold = require_int(max_hold, "max_hold", maximum=MAX_DURATION_MS)
        max_batch = require_int(max_batch, "max_batch")
        if require_isolation(isolation) == "process":
            check_process_options(self._timing.lock_duration, renewer, clock, timer)
            renewer = InChild()
        elif renewer is None:
            if connection is None:
                raise TypeError("connection is required (a redis.Redis, a RedisCluster or a URL)")
            renewer = RedisRenewer(
                connection, keys, self._timing.lock_duration, self._timing.interval, max_batch
            )
        elif connection is not None:
            raise TypeError("pass connection or renewer, not both")
        elif not callable(renewer):
            raise TypeError(f"renewer must be callable, got {type(renewer).__name__}")
        self._keys = keys
        self._max_batch = max_batch
        self._max_hold = max_hold
        self._renewer = renewer
        self._reporter = Reporter(
            keys, self._timing, on_lock_renewal_failed, on_locks_renewed, on_error
        )
        self.queue_name = keys.name
        self.clock: Callable[[], int] = clock or monotonic_ms
        self._make_timer: TimerFactory = timer or self._thread_timer
        self.thread: threading.Thread | None = None
        self._jobs = JobTable(self._timing.lock_duration, self.safety_margin)
        #: The recently lost locks: each holder is told of a loss once, however
        #: often it tracks the same lock again, and the lock is not renewed again.
        self._lost = LostLocks()
        #: Who to tell of a lost lock, told once the tick is done.
        self._notes: list[tuple[Notify, LockLost]] = []
        self._telling = False
        self._timer: Timer | None = None
        self._next_tick: int | None = None
        #: What the timer is armed for: the next grid tick or, when earlier,
        #: a watched lock's deadline.
        self._armed: int | None = None
        #: The deadlines the timer was armed for, not yet handled.
        self._deadline_arms: set[int] = set()
        #: The child process that renews, with ``isolation="process"``; the job
        #: table then mirrors its claims.
        self._link: ChildLink | None = None
        if isolation == "process":
            self._link = ChildLink(
                connection=connection,
                keys=keys,
                timing=self._timing,
                safety_margin=self.safety_margin,
                max_batch=max_batch,
                max_hold=max_hold,
                mirror=self._jobs,
                reporter=self._reporter,
                mailbox=mailbox.put,
                idle=mailbox.empty,
                tell=self._tell_now,
                stop=lambda: self._actor_ref.stop(block=False),
            )
        # The reference every caller gets: it checks each door in the
        # caller's thread (see actors.ref); pykka offers no other hook.
        self._actor_ref = ManagerRef(self, self)

    def _thread_timer(self, fire: Callable[[int], None], name: str) -> Timer:
        return ThreadTimer(fire, name, self.clock)

    def trusted_for(self, safety_margin: int | None = None) -> int:
        """Return how long a watched lock is trusted after a confirmed renewal's send, in ms.

        Thread-safe: it reads only what never changes.

        Args:
            safety_margin: A lease's own margin in milliseconds, or ``None``
                for the manager's.

        Raises:
            TypeError: ``safety_margin`` is not an ``int``.
            ValueError: It is negative, or leaves less than one interval.
        """
        if safety_margin is None:
            return self._timing.lock_duration - self.safety_margin
        return self._timing.lock_duration - check_safety_margin(safety_margin, self._timing)

    # -- lifecycle -------------------------------------------------------

    def on_start(self) -> None:
        """Arm the timer for the first tick."""
        self.thread = threading.current_thread()
        if self._link is not None:
            self._link.start()
            return
        try:
            self._timer = self._make_timer(self._fire, f"LockManager-timer-{self.queue_name}")
            self._next_tick = self.clock() + self._timing.interval
            self._armed = self._next_tick
            self._timer.arm(self._next_tick)
        except BaseException:
            self._shutdown()
            raise
        logger.debug(
            "LockManager for queue %r started: lock_duration=%d ms, interval=%d ms",
            self.queue_name,
            self._timing.lock_duration,
            self._timing.interval,
        )

    def on_stop(self) -> None:
        """Tell every job that asked to be told, and release the timer and the client."""
        self._shutdown()
        logger.debug("LockManager for queue %r stopped", self.queue_name)

    def on_failure(self, *_exc_info: object) -> None:
        """Likewise if the actor dies: nobody renews those locks now."""
        self._shutdown()

    def _shutdown(self) -> None:
        # From here on every sender is refused.
        self._mailbox.close()
        for job_id in list(self._jobs.watches):
            self._forget(job_id, MANAGER_STOPPED, remember=False, detail="the manager stopped")
        asks = self._refuse_the_rest()
        self._deliver()
        self._answer_stopped(asks)
        timer, self._timer = self._timer, None
        for what, close in (
            ("timer", getattr(timer, "close", None)),
            ("renewer", getattr(self._renewer, "close", None)),
            ("child process", getattr(self._link, "close", None)),
        ):
            if close is None:
                continue
            try:
                close()
            except BaseException:
                # Left to pykka, a BaseException here would stop every actor.
                logger.warning(
                    "LockManager for queue %r: closing its %s failed",
                    self.queue_name,
                    what,
                    exc_info=True,
                )

    def _refuse_the_rest(self) -> list[tuple[Any, pykka.Future[Any]]]:
        """Take what is left in the mailbox; return the asks among it, to answer as stopped.

        pykka's own last pass would fail each ask with a bare
        ``ActorDeadError``, and drop a ``TrackJob`` whose target then never
        hears that nobody renews its lock: each such target is told here.
        """
        told = {(id(target), message.job_id) for target, message in self._notes}
        asks: list[tuple[Any, pykka.Future[Any]]] = []
        while True:
            try:
                envelope = self._mailbox.get_nowait()
            except queue.Empty:
                return asks
            message = envelope.message
            if type(message) is TrackJob and message.notify is not None:
                target, job_id, token = message.notify, message.job_id, message.token
                if (id(target), job_id) not in told and not self._was_told(job_id, token, target):
                    told.add((id(target), job_id))
                    self._notes.append((target, LockLost(job_id, token, MANAGER_STOPPED)))
            if envelope.reply_to is not None:
                asks.append((message, envelope.reply_to))

    def _answer_stopped(self, asks: list[tuple[Any, pykka.Future[Any]]]) -> None:
        for message, reply in asks:
            if isinstance(message, _ActorStop):
                reply.set(None)  # as pykka answers a second stop
            else:
                error = ManagerStopped(f"LockManager for queue {self.queue_name!r} is stopped")
                reply.set_exception((ManagerStopped, error, None))

    def _was_told(self, job_id: str, token: str, target: Notify) -> bool:
        gone = self._lost.get(job_id, token) if self._lost else None
        return gone is not None and any(known is target for known in gone.told)

    def _fire(self, scheduled: int) -> None:
        tick = ExtendLocks(scheduled)
        # One timer thread, and the next fire is armed only by this tick's
        # handling: at most one tick is ever marked to go first.
        self._mailbox.tick = tick
        self.actor_ref.tell(tick)

    # -- messages --------------------------------------------------------

    def on_receive(self, message: Any) -> Any:
        """Handle one message; a malformed or unknown one is logged and dropped."""
        try:
            if self._link is not None:
                return self._link.receive(message, self._mailbox.current)
            # One dict lookup per message: track and untrack arrive by the
            # hundred thousand and must cost little more than pykka's own tell.
            handler = _HANDLERS.get(type(message))
            if handler is not None:
                return handler(self, message)
            return self.handle(message)
        except BaseException:
            # A BaseException too: left to pykka, it would stop every actor
            # of the process. Only the type is named: a repr is the sender's
            # code, and may raise.
            logger.warning(
                "LockManager for queue %r dropped a %s message",
                self.queue_name,
                type(message).__name__,
                exc_info=True,
            )
            return None

    def handle(self, message: Any) -> Any:
        """Handle ``message`` on the calling thread, which must be the manager's."""
        if self._link is not None:
            return self._link.handle(message)
        handler = _HANDLERS.get(type(message))
        if handler is None:
            logger.warning(
                "LockManager for queue %r ignored an unknown %s message",
                self.queue_name,
                type(message).__name__,
            )
            return None
        return handler(self, message)

    # A message checked itself when it was built, but a frozen dataclass can
    # still be written to afterwards. The handlers look at the types of what
    # they keep or compare (a few exact-type tests, no rebuild): a caller's
    # subclass never runs its code here, and a forged message is dropped.

    def _on_track(self, message: TrackJob) -> Validity | None:
        job_id, token, ts, max_hold = message.job_id, message.token, message.ts, message.max_hold
        notify, keep, margin = message.notify, message.keep, message.safety_margin
        if not (is_valid_text(job_id) and is_valid_text(token)):
            TrackJob(job_id, token)  # raises, naming the bad argument: logged and dropped
        if not (_plain_int(ts) and _plain_int(max_hold)) or type(keep) is not bool:
            raise TypeError("a TrackJob's ts, max_hold or keep was changed after it was built")
        if keep and notify is None:
            raise ValueError("a TrackJob's keep was changed after it was built")
        if margin is not None:
            margin = self._margin(margin, notify)
        if self._lost:
            gone = self._lost.get(job_id, token)
            if gone is not None and self._tracked_again(job_id, token, notify, gone):
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
        max_hold = max_hold if max_hold is not None else self._max_hold
        replaced = self._jobs.track(job_id, token, ts, notify, max_hold, keep, margin)
        if replaced is not None:
            # The job was taken again with a new token: everybody who waited
            # on the old lock must learn it belongs to another run now.
            old_token, targets = replaced
            detail = f"this worker took the job again with the token {token!r}"
            self._notes.extend(
                (target, LockLost(job_id, old_token, STOLEN, detail)) for target in targets
            )
            self._lost.add(job_id, old_token, STOLEN, [Claim(target, None) for target in targets])
            self._deliver()
        if notify is None:
            return None
        validity = self._jobs.valid.get(job_id)
        earliest = self._jobs.earliest
        if (
            validity is not None
            and earliest is not None
            and (self._armed is None or earliest < self._armed)
        ):
            self._arm()
        # The lock's validity, for a lease to read its deadline itself.
        return validity

    def _margin(self, margin: int, notify: Notify | None) -> int:
        if notify is None:
            raise ValueError("a TrackJob's safety_margin was changed after it was built")
        # Checked against this manager's windows: logged and dropped if it does not fit.
        return check_safety_margin(margin, self._timing)

    def _tracked_again(self, job_id: str, token: str, notify: Notify | None, gone: Gone) -> bool:
        """Handle a track of a lock lost recently; return whether that is all there is to do."""
        if gone.reason is None:
            # The lock is renewed for other claims: only this claim ended
            # (its max_hold), and it does not begin again.
            return any(known is notify for known in gone.told)
        # The lock is lost: it is not renewed again, nor reported again. A
        # target that did not hear of it yet hears now, once.
        if notify is not None and not any(known is notify for known in gone.told):
            self._lost.told(job_id, token, notify)
            self._notes.append((notify, LockLost(job_id, token, gone.reason)))
            self._deliver()
        return True

    def _on_untrack(self, message: UntrackJob) -> None:
        job_id, token = message.job_id, message.token
        if type(job_id) is not str or not (token is None or type(token) is str):
            raise TypeError("an UntrackJob was changed after it was built")
        # The target is only compared by identity: none of its code runs here.
        self._jobs.untrack(job_id, token, message.notify)

    def _on_extend(self, message: ExtendLocks) -> None:
        scheduled = message.scheduled
        if scheduled is not None:
            # Checked again, as when it was built: a plain int in range, or
            # it raises (logged and dropped).
            scheduled = ExtendLocks(scheduled).scheduled
            if scheduled in self._deadline_arms and scheduled != self._next_tick:
                self._deadline_arms.discard(scheduled)
                self._at_deadline(scheduled)
                return
        self._tick(scheduled)

    def _on_count(self, _: GetActiveJobCount) -> int:
        return len(self._jobs)

    def _on_ids(self, _: GetTrackedJobIds) -> list[str]:
        return self._jobs.ids()

    def _on_stats(self, _: GetStats) -> Stats:
        return self._stats()

    def _on_is_tracked(self, message: IsTracked) -> bool:
        job_id = message.job_id
        if type(job_id) is not str:
            raise TypeError("an IsTracked was changed after it was built")
        return job_id in self._jobs

    def _stats(self) -> Stats:
        return self._reporter.counters.snapshot(self.queue_name, len(self._jobs), self.clock())

    # -- operations, for manager.proxy() ----------------------------------
    # The reference turns each proxy call into its message before it leaves
    # the caller's thread; these run only for a plain pykka path around it.

    def track_job(
        self,
        job_id: str,
        token: str,
        ts: int | None = None,
        notify: Notify | None = None,
        max_hold: int | None = None,
        keep: bool = False,
    ) -> None:
        """Renew ``job_id``'s lock, held with ``token`` (see :class:`~actors.TrackJob`)."""
        self._guarded(TrackJob, job_id, token, ts, notify, max_hold, keep)

    def untrack_job(
        self, job_id: str, token: str | None = None, notify: Notify | None = None
    ) -> None:
        """End claims on ``job_id``'s lock (see :class:`~actors.UntrackJob`)."""
        self._guarded(UntrackJob, job_id, token, notify)

    def get_active_job_count(self) -> int:
        """Return how many jobs are tracked."""
        return len(self._jobs)

    def get_tracked_job_ids(self) -> list[str]:
        """Return the ids of the tracked jobs."""
        return self._jobs.ids()

    def is_tracked(self, job_id: str) -> bool:
        """Return whether ``job_id`` is tracked."""
        return job_id in self._jobs

    def get_stats(self) -> Stats:
        """Return a snapshot of the manager's counters."""
        return self._stats()

    def extend_locks(self) -> None:
        """Renew every due lock now; the timer's grid is left alone."""
        self._tick(None)

    def _guarded(self, kind: type, *args: Any) -> Any:
        try:
            message = kind(*args)
        except (TypeError, ValueError) as error:
            logger.warning(
                "LockManager for queue %r dropped a %s: %s", self.queue_name, kind.__name__, error
            )
            return None
        return self.handle(message)

    # -- the tick --------------------------------------------------------

    def _tick(self, scheduled: int | None) -> None:
        self._reporter.counters.ticks += 1
        try:
            now = self.clock()
        except BaseException:
            # The clock is the user's code: its failure must not end the
            # ticks. The timer's own fire comes once its time has come, so its
            # grid time stands in for a reading (never later than the truth).
            logger.warning(
                "LockManager for queue %r: the clock raised; ticking on",
                self.queue_name,
                exc_info=True,
            )
            if scheduled is None or scheduled != self._next_tick:
                return
            now = scheduled
        # Only the timer's own fire, once its time has come, is a grid tick:
        # one sent early (or forged) is a plain "renew now" and moves nothing.
        on_grid = scheduled is not None and scheduled == self._next_tick and scheduled <= now
        # Select and stamp a grid tick at its grid time, not when it got to
        # run: lateness then never makes a job due a tick early, and the grid
        # time is never after the renewal, so no lock looks younger.
        at = scheduled if on_grid and scheduled is not None else now
        try:
            if on_grid:
                self._reporter.late(now - at)
            if self._jobs.watches:
                overdue = self._jobs.overdue(now)
                if overdue:
                    self._expire(overdue, now)
                if self._jobs.valid:
                    self._check_deadlines(now, now - at if on_grid else 0)
            due, tokens = self._jobs.due(at, self._timing.threshold)
            if due:
                self._renew(due, tokens, at, now)
        finally:
            # Whatever happened above, the timer ticks again.
            if on_grid and self._timer is not None:
                self._next_tick = next_deadline(at, self._timing.interval, self._now(now))
                self._armed = None
                self._arm()
            elif self._jobs.valid:
                self._arm()
            self._deliver()

    def _at_deadline(self, scheduled: int) -> None:
        """The timer's fire at a watched lock's deadline: tell who is past it, nothing else."""
        now = self._now(scheduled)
        try:
            if self._jobs.valid:
                self._check_deadlines(now, max(0, now - scheduled))
        finally:
            self._armed = None
            self._arm()
            self._deliver()

    def _arm(self) -> None:
        """Arm the timer for the next grid tick, or for the earliest watched deadline before it."""
        if self._timer is None or self._next_tick is None:
            return
        at = self._next_tick
        earliest = self._jobs.earliest if self._jobs.valid else None
        if earliest is not None and earliest < at:
            at = earliest
            if len(self._deadline_arms) > 64:
                # Deadlines replaced before they fired: never handled, never needed.
                self._deadline_arms = {d for d in self._deadline_arms if d >= at}
            self._deadline_arms.add(at)
        if at != self._armed:
            self._armed = at
            self._timer.arm(at)

    def _check_deadlines(self, now: int, late: int, confirmed: bool = False) -> None:
        """Let go of the watched locks past their deadline at ``now``, telling their watchers."""
        overdue = self._jobs.confirm(now)
        if not overdue:
            return
        lost = [self._unconfirmed(job_id, now, late, confirmed) for job_id in overdue]
        self._reporter.lost(lost)

    def _unconfirmed(self, job_id: str, now: int, late: int, confirmed: bool) -> LostLock:
        validity = self._jobs.valid[job_id]
        counters = self._reporter.counters
        facts = [
            f"no renewal confirmed for {now - validity.confirmed} ms (trusted for "
            f"{validity.span} ms after a confirmed send, lock_duration "
            f"{self._timing.lock_duration} ms)"
        ]
        if confirmed:
            facts.append("a renewal's answer came only after the deadline")
        if counters.failed_streak:
            facts.append(
                f"{counters.failed_streak} tick(s) failed since, the last with "
                f"{counters.last_error}"
            )
        if late > resolution_ms():
            facts.append(f"the manager did not run for {late} ms past its timer (a pause)")
        return self._forget(job_id, UNCONFIRMED, detail="; ".join(facts))

    def _now(self, fallback: int) -> int:
        """Read the clock; ``fallback`` (an earlier reading) if it raises."""
        try:
            return self.clock()
        except BaseException:
            logger.warning(
                "LockManager for queue %r: the clock raised", self.queue_name, exc_info=True
            )
            return fallback

    def _expire(self, overdue: list[str], now: int) -> None:
        """End the claims past their deadline; a lock with none left is let go, and reported."""
        lost: list[LostLock] = []
        for job_id in overdue:
            deadline = self._jobs.watches[job_id].deadline
            detail = f"held past its hold deadline by {now - (deadline or now)} ms"
            ended = self._jobs.expire(job_id, now)
            self._tell(job_id, ended, MAX_HOLD, detail)
            held, claims, gone = ended
            if gone:
                self._lost.add(job_id, held, MAX_HOLD, claims)
                lost.append(LostLock(job_id, held, MAX_HOLD, detail))
            else:
                self._lost.add(job_id, held, None, claims)
        if lost:
            self._reporter.lost(lost)

    def _renew(self, due: list[str], tokens: list[str], at: int, now: int) -> None:
        started = time.perf_counter()
        reporter = self._reporter
        oldest = self._jobs.oldest(due)
        calls = -(-len(due) // self._max_batch)
        outcome: BatchOutcome | None = None
        failure: Exception | None = None
        renewed: list[str] = []
        lost: list[LostLock] = []
        margin = self._timing.lock_duration - (now - oldest)
        with _telemetry.tick_span(self.queue_name, len(due)) as span:
            try:
                outcome = self._renewer(due, tokens)
                if not isinstance(outcome, BatchOutcome):
                    raise TypeError(
                        f"the renewer returned {type(outcome).__name__}, not a BatchOutcome"
                    )
            except BaseException as exc:
                # Nothing is known to have run: keep every job and its stamp,
                # so the very next tick tries them all again. A BaseException
                # too: left to pykka, it would stop every actor of the process.
                outcome = None
                failure = exc if isinstance(exc, Exception) else RuntimeError(repr(exc))
                span.error(failure)
            else:
                # Read when the answer is back: the renewal ran before this,
                # so the margin is never overstated (a slow round trip or a
                # GIL-bound process shows in it).
                answered = self._now(now)
                margin = self._timing.lock_duration - (answered - oldest)
                renewed, lost = self._apply(due, tokens, at, outcome)
                if self._jobs.valid:
                    # The renewals just confirmed move the watched deadlines
                    # on, unless they came too late for one.
                    overdue = self._jobs.confirm(answered)
                    if overdue:
                        lost_now = [self._unconfirmed(j, answered, 0, True) for j in overdue]
                        gone = set(overdue)
                        renewed = [job_id for job_id in renewed if job_id not in gone]
                        lost.extend(lost_now)
                span.finish(lost, calls)
                if outcome.errors:
                    failure = outcome.errors[0].error
                    span.error(failure)
            span.lateness(reporter.counters.lateness_ms, margin)
        reporter.counters.tick(len(due), calls, (time.perf_counter() - started) * 1000)
        # Callbacks run after the span and the bookkeeping: their time is
        # theirs, and whatever they do to the manager finds it consistent.
        if renewed:
            reporter.renewed(renewed, now, margin)
        if lost:
            reporter.lost(lost)
        if failure is None:
            reporter.succeeded()
        else:
            unknown = len(due) if outcome is None else sum(e.stop - e.start for e in outcome.errors)
            reporter.failed(failure, unknown)
            if self._jobs.valid:
                # The failed call took time: a deadline may have passed meanwhile.
                self._check_deadlines(self._now(now), 0)

    def _apply(
        self, due: list[str], tokens: list[str], at: int, outcome: BatchOutcome
    ) -> tuple[list[str], list[LostLock]]:
        """Untrack the lost jobs, stamp the renewed ones; return both."""
        if not outcome.failed and not outcome.errors:
            self._jobs.stamp(due, at)
            return due, []
        token_of = dict(zip(due, tokens, strict=True))
        # Only ids of this batch count: a renewer's report of any other is dropped.
        failed = {job_id for job_id in outcome.failed if job_id in token_of}
        lost = [
            self._forget(
                job_id,
                reason := outcome.reasons.get(job_id, EXPIRED),
                token_of[job_id],
                detail=self._found(job_id, reason, at),
            )
            for job_id in dict.fromkeys(outcome.failed)
            if job_id in token_of
        ]
        for error in outcome.errors:
            failed.update(due[error.start : error.stop])
        renewed = [job_id for job_id in due if job_id not in failed]
        self._jobs.stamp(renewed, at)
        return renewed, lost

    def _found(self, job_id: str, reason: Reason, at: int) -> str:
        """Say what a renewal that found the lock lost tells, from what is known already."""
        stamp = self._jobs.stamps.get(job_id)
        age = "" if stamp is None else f"{at - stamp} ms after its last renewal or taking"
        if reason == STOLEN:
            return f"the lock holds another worker's token (found {age})"
        duration = self._timing.lock_duration
        if stamp is not None and at - stamp < duration:
            return (
                f"the lock key was gone {age}, before its {duration} ms could run out: "
                f"deleted, or lost by the server (a restart, a failover)"
            )
        return f"the lock key was gone {age}: it expired ({duration} ms without a renewal)"

    def _forget(
        self,
        job_id: str,
        reason: Reason,
        token: str | None = None,
        *,
        remember: bool = True,
        detail: str = "",
    ) -> LostLock:
        """Untrack a job whose lock is lost; queue a word for each who asked to be told."""
        ended = self._jobs.untrack(job_id, everyone=True)
        if ended is None:
            return LostLock(job_id, token or "", reason, detail)
        self._tell(job_id, ended, reason, detail)
        held, claims, _ = ended
        if remember:
            self._lost.add(job_id, held, reason, claims)
        return LostLock(job_id, token or held, reason, detail)

    def _tell(self, job_id: str, ended: Ended, reason: Reason, detail: str = "") -> None:
        # One LockLost each: a target that raises its message must not leave
        # its traceback on another's.
        held, claims, _ = ended
        self._notes.extend(
            (claim.target, LockLost(job_id, held, reason, detail))
            for claim in claims
            if claim.target is not None
        )

    def _tell_now(self, notes: list[tuple[Notify, LockLost]]) -> None:
        self._notes.extend(notes)
        self._deliver()

    def _deliver(self) -> None:
        # Told only once the tick's bookkeeping is done: a target that calls
        # back in (untrack, track, queries) finds the manager consistent.
        notes, self._notes = self._notes, []
        # Restored, not cleared: a target's tell may call back in and deliver again.
        telling, self._telling = self._telling, True
        try:
            for target, message in notes:
                try:
                    target.tell(message)
                except BaseException:
                    logger.warning(
                        "LockManager for queue %r: could not tell a %s that job %r lost its lock",
                        self.queue_name,
                        type(target).__name__,
                        message.job_id,
                        exc_info=True,
                    )
        finally:
            self._telling = telling

    @property
    def calling_back(self) -> bool:
        """Whether the manager's thread runs user code now (a callback, a target's ``tell``)."""
        return self._reporter.calling or self._telling

    def put_first(self, envelope: Any) -> None:
        """Put ``envelope`` in the mailbox ahead of every later tick (see ManagerRef.ask)."""
        self._mailbox.put_first(envelope)


#: Each message's handler, found through the one table of operations.
_HANDLERS: dict[type, Callable[[LockManager, Any], Any]] = {
    operation.message: getattr(LockManager, operation.handler) for operation in OPERATIONS
}


def _plain_int(value: object) -> bool:
    return value is None or type(value) is int
