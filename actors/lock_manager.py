"""The lock manager: one actor, one timer, one batched renewal per tick.

A port of EchoMQ's ``LockManager`` GenServer to a pykka ``ThreadingActor``.
Job actors tell it which jobs they hold (``track_job``) and release
(``untrack_job``); every ``interval`` milliseconds the timer tells it
:class:`~actors.messages.ExtendLocks`, and it renews every due lock with one
round trip. Lost locks are untracked and reported; a Redis fault untracks
nothing and the next tick retries.

All state lives on the actor's thread: other threads reach it only through
messages.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

import pykka
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from actors import _telemetry
from actors.keys import QueueKeys, require_text
from actors.messages import (
    ExtendLocks,
    GetActiveJobCount,
    GetStats,
    GetTrackedJobIds,
    IsTracked,
    TrackJob,
    UntrackJob,
)
from actors.schedule import DEFAULT_LOCK_DURATION, Timing, next_deadline, select_due
from actors.scripts import (
    DEFAULT_MAX_BATCH,
    BatchOutcome,
    check_max_batch,
    is_cluster,
    renew_batch,
)
from actors.stats import Stats

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = [
    "LockManager",
    "Renewer",
    "get_active_job_count",
    "get_stats",
    "get_tracked_job_ids",
    "is_tracked",
    "start_link",
    "stop",
    "track_job",
    "untrack_job",
]

logger = logging.getLogger(__name__)


class Renewer(Protocol):
    """Renews a batch of locks: :func:`actors.scripts.renew_batch` bound to a client."""

    def __call__(self, job_ids: Sequence[str], tokens: Sequence[str]) -> BatchOutcome:
        """Renew ``job_ids`` holding ``tokens``; raise if nothing is known to have run."""
        ...


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def _require_callback(value: object, argument: str) -> None:
    if value is not None and not callable(value):
        raise TypeError(f"{argument} must be callable or None, got {type(value).__name__}")


def client_for_url(url: str, interval_ms: int) -> redis.Redis:
    """Build a client whose failed command returns well inside one tick interval.

    redis-py retries a failed command several times with backoff by default,
    which can hold a tick for seconds. This client waits at most a quarter of
    the interval (between 50 ms and 5 s) per attempt and retries once, at once,
    so a stale pooled connection after a server restart costs no tick.

    Raises:
        ValueError: ``url`` is not a Redis URL.
    """
    timeout = min(max(interval_ms / 4000, 0.05), 5.0)
    return redis.Redis.from_url(
        url,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 1),
    )


def _socket_timeout(conn: Any) -> float | None:
    pool = getattr(conn, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if kwargs is None:
        manager = getattr(conn, "nodes_manager", None)
        kwargs = getattr(manager, "connection_kwargs", None) or {}
    timeout = kwargs.get("socket_timeout")
    return float(timeout) if timeout is not None else None


def check_cluster_keys(keys: QueueKeys) -> None:
    """Check that all of a queue's keys share one Redis Cluster hash slot.

    The renewal script touches lock keys it does not declare in KEYS, which a
    cluster only allows when they hash to the slot of its one declared key.

    Raises:
        ValueError: The queue name and prefix carry no hash tag.
    """
    if keys.hash_tag is None:
        raise ValueError(
            f"queue keys {keys.base!r} do not share one hash slot, so the renewal script "
            f"cannot run on a Redis Cluster: put a hash tag in the queue name or the prefix, "
            f"as in QueueKeys('{{{keys.name}}}', prefix={keys.prefix!r}), which gives "
            f"'{keys.prefix}:{{{keys.name}}}:<job_id>:lock' (the same rule as BullMQ's "
            f"'{{queue}}' names)"
        )


class _JobTable:
    """The tracked jobs: each one's lock token and when it was last renewed.

    Two flat dicts (id to token, id to monotonic ms) rather than a record per
    job: CPython's garbage collector does not track dicts that hold only
    strings and ints, so 100,000 tracked jobs add nothing to each collection,
    and stamping a tick's renewals stores one shared int, allocating nothing
    per job. Only the actor's thread touches it.
    """

    __slots__ = ("stamps", "tokens")

    def __init__(self) -> None:
        self.tokens: dict[str, str] = {}
        #: Monotonic time of tracking or of the last renewal, in milliseconds.
        self.stamps: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.tokens)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self.tokens

    def track(self, job_id: str, token: str, now: int) -> None:
        self.tokens[job_id] = token
        self.stamps[job_id] = now

    def untrack(self, job_id: str) -> None:
        if self.tokens.pop(job_id, None) is not None:
            del self.stamps[job_id]

    def ids(self) -> list[str]:
        return list(self.tokens)

    def due(self, now: int, threshold: int) -> tuple[list[str], list[str]]:
        """Return the due ids and their tokens, in tracking order."""
        due = select_due(self.stamps, now, threshold)
        tokens = self.tokens
        return due, [tokens[job_id] for job_id in due]

    def stamp(self, job_ids: list[str], now: int) -> None:
        stamps = self.stamps
        for job_id in job_ids:
            stamps[job_id] = now


class _Timer:
    """The manager's one timer: a thread that tells ``ExtendLocks`` once per arm.

    Holding one thread for the actor's life keeps the thread count constant,
    however many jobs are tracked and however often it fires.
    """

    def __init__(self, actor_ref: pykka.ActorRef[Any], name: str) -> None:
        self._actor_ref = actor_ref
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def arm(self, deadline_ms: int) -> None:
        """Fire once at ``deadline_ms`` on the monotonic clock; replaces any earlier arm."""
        with self._cond:
            self._deadline = deadline_ms / 1000
            self._cond.notify()

    def pending(self) -> bool:
        """Whether a fire is armed and not yet sent."""
        with self._cond:
            return self._deadline is not None

    def close(self) -> None:
        """Disarm and end the thread; nothing is told after this returns."""
        with self._cond:
            self._closed = True
            self._deadline = None
            self._cond.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                if self._deadline is None:
                    self._cond.wait()
                    continue
                remaining = self._deadline - time.monotonic()
                if remaining > 0:
                    self._cond.wait(remaining)
                    continue
                self._deadline = None
                try:
                    self._actor_ref.tell(ExtendLocks())
                except pykka.ActorDeadError:
                    return


# Threads of running managers, so `stop` called from a manager's own thread
# (from one of its callbacks) does not wait for itself.
_actor_threads: dict[str, int] = {}


class LockManager(pykka.ThreadingActor):
    """Renews the locks of the jobs a worker holds on one queue.

    Start it with :func:`start_link` (or ``LockManager.start(...)`` with the
    same keywords). Talk to it with the module's helpers, with
    ``ref.proxy()``, or with the messages of :mod:`actors.messages`.

    Args:
        connection: A ``redis.Redis`` or ``redis.RedisCluster`` client, or a
            Redis URL (the manager then builds a client with timeouts that keep
            a failed tick short, and closes it when it stops).
        keys: The queue's keys.
        lock_duration: The lock TTL set at each renewal, in milliseconds.
        lock_renew_time: Longest time between two renewals of a lock, in
            milliseconds; ``lock_duration // 2`` when ``None``.
        on_lock_renewal_failed: Called with the ids whose lock was lost; they
            are untracked first.
        on_locks_renewed: Called with the ids renewed by a tick.
        on_error: Called with the exception of a tick whose Redis call failed.
        max_batch: Most ids per script call; a tick's calls share one round trip.

    Callbacks run on the manager's thread, between ticks: keep them short, and
    tell other actors rather than wait for them. An exception they raise is
    logged and changes nothing.

    Raises:
        TypeError: An argument has the wrong type.
        ValueError: A duration is out of range, or the queue's keys cannot
            live in one hash slot of the cluster client given.
    """

    use_daemon_thread = True

    def __init__(
        self,
        *,
        connection: redis.Redis | redis.RedisCluster | str,
        keys: QueueKeys,
        lock_duration: int = DEFAULT_LOCK_DURATION,
        lock_renew_time: int | None = None,
        on_lock_renewal_failed: Callable[[list[str]], object] | None = None,
        on_locks_renewed: Callable[[list[str]], object] | None = None,
        on_error: Callable[[Exception], object] | None = None,
        max_batch: int = DEFAULT_MAX_BATCH,
        _clock: Callable[[], int] | None = None,
        _renewer: Renewer | None = None,
        _autostart_timer: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(keys, QueueKeys):
            raise TypeError(f"keys must be a QueueKeys, got {type(keys).__name__}")
        self._timing = Timing(lock_duration, lock_renew_time)
        check_max_batch(max_batch)
        _require_callback(on_lock_renewal_failed, "on_lock_renewal_failed")
        _require_callback(on_locks_renewed, "on_locks_renewed")
        _require_callback(on_error, "on_error")
        self._keys = keys
        self._max_batch = max_batch
        self._owns_connection = False
        if isinstance(connection, str):
            connection = client_for_url(connection, self._timing.interval)
            self._owns_connection = True
        elif _renewer is None and not isinstance(connection, (redis.Redis, redis.RedisCluster)):
            raise TypeError(
                "connection must be a redis.Redis, a redis.RedisCluster or a URL, "
                f"got {type(connection).__name__}"
            )
        elif _socket_timeout(connection) is None and _renewer is None:
            if is_cluster(connection):
                advice = (
                    "build it with actors.cluster.cluster_client(url, "
                    f"interval_ms={self._timing.interval})"
                )
            else:
                advice = f"pass socket_timeout={self._timing.interval / 4000:.2f} or less, or a URL"
            logger.warning(
                "LockManager for queue %r: the client has no socket_timeout, so a hung server "
                "can hold a tick (and every query to the manager) indefinitely; %s",
                keys.name,
                advice,
            )
        if is_cluster(connection):
            check_cluster_keys(keys)
        self._conn: Any = connection
        self._on_failed = on_lock_renewal_failed
        self._on_renewed = on_locks_renewed
        self._on_error = on_error
        self._clock: Callable[[], int] = _clock or _monotonic_ms
        self._renewer: Renewer = _renewer or self._renew
        self._autostart_timer = _autostart_timer
        self._jobs = _JobTable()
        self._timer: _Timer | None = None
        self._next_tick = 0
        # Counters for get_stats: plain ints, a few per tick.
        self._ticks = 0
        self._renewed = 0
        self._lost = 0
        self._errors = 0
        self._script_calls = 0
        self._last_batch = 0
        self._last_tick_ms = 0.0
        self._max_tick_ms = 0.0
        self._last_renewal: int | None = None
        self._failed_streak = 0

    # -- lifecycle -------------------------------------------------------

    def on_start(self) -> None:
        """Arm the timer for the first tick."""
        _actor_threads[self.actor_urn] = threading.get_ident()
        logger.debug(
            "LockManager for queue %r started: lock_duration=%d ms, interval=%d ms",
            self._keys.name,
            self._timing.lock_duration,
            self._timing.interval,
        )
        if self._autostart_timer:
            self._timer = _Timer(self.actor_ref, f"LockManager-timer-{self._keys.name}")
            self._next_tick = self._clock() + self._timing.interval
            self._timer.arm(self._next_tick)

    def on_stop(self) -> None:
        """Disarm the timer and release what the manager owns."""
        self._shutdown()
        logger.debug("LockManager for queue %r stopped", self._keys.name)

    def on_failure(self, *_exc_info: object) -> None:
        """Release the timer and the connection if the actor dies."""
        self._shutdown()

    def _shutdown(self) -> None:
        _actor_threads.pop(self.actor_urn, None)
        if self._timer is not None:
            self._timer.close()
            self._timer = None
        if self._owns_connection:
            self._conn.close()
            self._owns_connection = False

    # -- messages --------------------------------------------------------

    def on_receive(self, message: Any) -> Any:
        """Dispatch one message; a malformed one is logged and dropped."""
        try:
            return self._dispatch(message)
        except Exception:
            logger.warning(
                "LockManager for queue %r dropped message %r",
                self._keys.name,
                message,
                exc_info=True,
            )
            return None

    def _dispatch(self, message: Any) -> Any:
        # One dict lookup per message: track and untrack arrive by the
        # hundred thousand and must cost little more than pykka's own tell.
        handler = _HANDLERS.get(type(message))
        if handler is None:
            logger.warning(
                "LockManager for queue %r ignored unknown message %r", self._keys.name, message
            )
            return None
        return handler(self, message)

    def _on_track(self, message: TrackJob) -> None:
        job_id, token = message.job_id, message.token
        if not (isinstance(job_id, str) and job_id and isinstance(token, str) and token):
            self.track_job(job_id, token)  # raises, naming the bad argument
        self._jobs.track(job_id, token, self._clock())

    def _on_untrack(self, message: UntrackJob) -> None:
        job_id = message.job_id
        if not (isinstance(job_id, str) and job_id):
            require_text(job_id, "job_id")
        self._jobs.untrack(job_id)

    # -- operations (also proxy methods) -------------------------------

    def track_job(self, job_id: str, token: str) -> None:
        """Renew ``job_id``'s lock, held with ``token``, from now on.

        Tracking a tracked job replaces its token and restarts its clock.

        Raises:
            TypeError: ``job_id`` or ``token`` is not a ``str``.
            ValueError: ``job_id`` or ``token`` is empty.
        """
        require_text(job_id, "job_id")
        require_text(token, "token")
        self._jobs.track(job_id, token, self._clock())

    def untrack_job(self, job_id: str) -> None:
        """Stop renewing ``job_id``'s lock; an unknown id is ignored.

        Raises:
            TypeError: ``job_id`` is not a ``str``.
            ValueError: ``job_id`` is empty.
        """
        self._jobs.untrack(require_text(job_id, "job_id"))

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
        last = self._last_renewal
        return Stats(
            queue=self._keys.name,
            ticks=self._ticks,
            renewed=self._renewed,
            lost=self._lost,
            errors=self._errors,
            script_calls=self._script_calls,
            tracked=len(self._jobs),
            last_batch=self._last_batch,
            last_tick_ms=self._last_tick_ms,
            max_tick_ms=self._max_tick_ms,
            last_renewal_age_ms=None if last is None else float(self._clock() - last),
        )

    def extend_locks(self) -> None:
        """Renew every due lock now, then arm the timer for the next tick."""
        self._ticks += 1
        now = self._clock()
        due, tokens = self._jobs.due(now, self._timing.threshold)
        if due:
            self._renew_due(due, tokens, now)
        self._arm_next()

    # -- the tick --------------------------------------------------------

    def _renew(self, job_ids: Sequence[str], tokens: Sequence[str]) -> BatchOutcome:
        return renew_batch(
            self._conn,
            self._keys,
            job_ids,
            tokens,
            self._timing.lock_duration,
            max_batch=self._max_batch,
            # track_job checked every id and token: skip a pass over the batch.
            check_items=False,
        )

    def _renew_due(self, due: list[str], tokens: list[str], now: int) -> None:
        started = time.perf_counter()
        calls = -(-len(due) // self._max_batch)
        outcome: BatchOutcome | None = None
        failure: Exception | None = None
        renewed: list[str] = []
        with _telemetry.tick_span(self._keys.name, len(due)) as span:
            try:
                outcome = self._renewer(due, tokens)
            except Exception as exc:
                # Nothing is known to have run: keep every job and its ts, so
                # the very next tick tries them all again.
                failure = exc
                span.error(exc)
            else:
                renewed = self._apply(due, now, outcome)
                span.finish(outcome.failed, calls)
                if outcome.errors:
                    failure = outcome.errors[0].error
                    span.error(failure)
        self._record_tick(len(due), calls, started)
        # Callbacks run after the span: their time is theirs, not the tick's.
        if renewed:
            self._last_renewal = now
            self._renewed += len(renewed)
            self._call(self._on_renewed, renewed, "on_locks_renewed")
        if outcome is not None and outcome.failed:
            self._lost += len(outcome.failed)
            logger.warning(
                "LockManager for queue %r: lost the lock of %d job(s): %s",
                self._keys.name,
                len(outcome.failed),
                ", ".join(outcome.failed[:20]) + (" ..." if len(outcome.failed) > 20 else ""),
            )
            self._call(self._on_failed, outcome.failed, "on_lock_renewal_failed")
        if failure is not None:
            self._errors += 1
            unknown = (
                len(due)
                if outcome is None
                else sum(error.stop - error.start for error in outcome.errors)
            )
            self._report_error(failure, unknown)
        elif self._failed_streak:
            logger.warning(
                "LockManager for queue %r: renewals resumed after %d failed tick(s)",
                self._keys.name,
                self._failed_streak,
            )
            self._failed_streak = 0

    def _apply(self, due: list[str], now: int, outcome: BatchOutcome) -> list[str]:
        """Untrack the lost jobs, stamp the renewed ones; return the renewed ids."""
        jobs = self._jobs
        failed = set(outcome.failed)
        for job_id in failed:
            jobs.untrack(job_id)
        if outcome.errors:
            unsent = set()
            for error in outcome.errors:
                unsent.update(due[error.start : error.stop])
            failed |= unsent
        renewed = [job_id for job_id in due if job_id not in failed] if failed else due
        jobs.stamp(renewed, now)
        return renewed

    def _record_tick(self, batch: int, calls: int, started: float) -> None:
        elapsed = (time.perf_counter() - started) * 1000
        self._script_calls += calls
        self._last_batch = batch
        self._last_tick_ms = elapsed
        self._max_tick_ms = max(self._max_tick_ms, elapsed)

    def _report_error(self, exc: Exception, jobs: int) -> None:
        # The first failure of a streak carries its traceback; during a long
        # outage the later ones are one line each.
        self._failed_streak += 1
        logger.error(
            "LockManager for queue %r: renewal of %d job(s) failed, retrying next tick: %s: %s",
            self._keys.name,
            jobs,
            type(exc).__name__,
            exc,
            exc_info=exc if self._failed_streak == 1 else None,
        )
        self._call(self._on_error, exc, "on_error")

    def _call(self, callback: Callable[[Any], object] | None, arg: Any, name: str) -> None:
        if callback is None:
            return
        try:
            callback(arg)
        except Exception:
            logger.exception("LockManager for queue %r: %s raised", self._keys.name, name)

    def _arm_next(self) -> None:
        if self._timer is None:
            return
        self._next_tick = next_deadline(self._next_tick, self._timing.interval, self._clock())
        self._timer.arm(self._next_tick)


_HANDLERS: dict[type, Callable[[LockManager, Any], Any]] = {
    ExtendLocks: lambda actor, _: actor.extend_locks(),
    TrackJob: LockManager._on_track,
    UntrackJob: LockManager._on_untrack,
    GetActiveJobCount: lambda actor, _: actor.get_active_job_count(),
    GetTrackedJobIds: lambda actor, _: actor.get_tracked_job_ids(),
    IsTracked: lambda actor, message: actor.is_tracked(message.job_id),
    GetStats: lambda actor, _: actor.get_stats(),
}


# -- module API ----------------------------------------------------------


def start_link(
    *,
    connection: redis.Redis | redis.RedisCluster | str,
    keys: QueueKeys,
    lock_duration: int = DEFAULT_LOCK_DURATION,
    lock_renew_time: int | None = None,
    on_lock_renewal_failed: Callable[[list[str]], object] | None = None,
    on_locks_renewed: Callable[[list[str]], object] | None = None,
    on_error: Callable[[Exception], object] | None = None,
    max_batch: int = DEFAULT_MAX_BATCH,
) -> pykka.ActorRef[LockManager]:
    """Start a :class:`LockManager` and return its reference.

    Example:
        >>> manager = start_link(connection=redis.Redis(socket_timeout=1),
        ...                      keys=QueueKeys("myqueue"))
        >>> track_job(manager, "42", token)

    Args: as for :class:`LockManager`.

    Raises:
        TypeError: An argument has the wrong type.
        ValueError: A duration is out of range, or a cluster client was given
            for keys that cannot share one hash slot.
    """
    return LockManager.start(
        connection=connection,
        keys=keys,
        lock_duration=lock_duration,
        lock_renew_time=lock_renew_time,
        on_lock_renewal_failed=on_lock_renewal_failed,
        on_locks_renewed=on_locks_renewed,
        on_error=on_error,
        max_batch=max_batch,
    )


def track_job(manager: pykka.ActorRef[LockManager], job_id: str, token: str) -> None:
    """Tell ``manager`` to renew ``job_id``'s lock, held with ``token``.

    Returns at once. A stopped manager ignores it.

    Raises:
        TypeError: ``job_id`` or ``token`` is not a ``str``.
        ValueError: ``job_id`` or ``token`` is empty.
    """
    if not (isinstance(job_id, str) and job_id and isinstance(token, str) and token):
        require_text(job_id, "job_id")
        require_text(token, "token")
    _tell(manager, TrackJob(job_id, token))


def untrack_job(
    manager: pykka.ActorRef[LockManager],
    job_id: str,
    *,
    wait: bool = False,
    timeout: float | None = None,
) -> None:
    """Tell ``manager`` to stop renewing ``job_id``'s lock.

    Returns at once by default. Before deleting the lock itself, a worker
    should pass ``wait=True``: the call then returns once the manager has
    untracked the job, so no tick already queued can find the lock gone and
    report it lost.

    Args:
        manager: The manager.
        job_id: The job's id.
        wait: Wait until the manager has untracked the job.
        timeout: With ``wait``, the most seconds to wait.

    Raises:
        TypeError: ``job_id`` is not a ``str``.
        ValueError: ``job_id`` is empty.
        pykka.Timeout: With ``wait``, no answer within ``timeout`` seconds.
    """
    message = UntrackJob(require_text(job_id, "job_id"))
    if not wait:
        _tell(manager, message)
        return
    try:
        manager.ask(message, block=True, timeout=timeout)
    except pykka.ActorDeadError:
        logger.debug("%r sent to a stopped LockManager; ignored", message)


def _tell(manager: pykka.ActorRef[LockManager], message: object) -> None:
    try:
        manager.tell(message)
    except pykka.ActorDeadError:
        logger.debug("%r sent to a stopped LockManager; ignored", message)


def get_active_job_count(
    manager: pykka.ActorRef[LockManager], *, timeout: float | None = None
) -> int:
    """Ask ``manager`` how many jobs it tracks.

    Raises:
        pykka.ActorDeadError: The manager is stopped.
        pykka.Timeout: No answer within ``timeout`` seconds.
    """
    count: int = manager.ask(GetActiveJobCount(), block=True, timeout=timeout)
    return count


def get_tracked_job_ids(
    manager: pykka.ActorRef[LockManager], *, timeout: float | None = None
) -> list[str]:
    """Ask ``manager`` for the ids it tracks.

    Raises:
        pykka.ActorDeadError: The manager is stopped.
        pykka.Timeout: No answer within ``timeout`` seconds.
    """
    ids: list[str] = manager.ask(GetTrackedJobIds(), block=True, timeout=timeout)
    return ids


def is_tracked(
    manager: pykka.ActorRef[LockManager], job_id: str, *, timeout: float | None = None
) -> bool:
    """Ask ``manager`` whether it tracks ``job_id``.

    Raises:
        TypeError: ``job_id`` is not a ``str``.
        ValueError: ``job_id`` is empty.
        pykka.ActorDeadError: The manager is stopped.
        pykka.Timeout: No answer within ``timeout`` seconds.
    """
    tracked: bool = manager.ask(
        IsTracked(require_text(job_id, "job_id")), block=True, timeout=timeout
    )
    return tracked


def get_stats(manager: pykka.ActorRef[LockManager], *, timeout: float | None = None) -> Stats:
    """Ask ``manager`` for its counters.

    Raises:
        pykka.ActorDeadError: The manager is stopped.
        pykka.Timeout: No answer within ``timeout`` seconds.
    """
    stats: Stats = manager.ask(GetStats(), block=True, timeout=timeout)
    return stats


def stop(manager: pykka.ActorRef[LockManager], *, timeout: float | None = None) -> None:
    """Stop ``manager``: no tick, no Redis command and no thread is left after.

    Idempotent: a stopped or dead manager is fine. Called from the manager's
    own thread (from a callback), it stops the manager after the current
    message instead of waiting for itself.
    """
    if _actor_threads.get(manager.actor_urn) == threading.get_ident():
        manager.stop(block=False)
        return
    manager.stop(block=True, timeout=timeout)
