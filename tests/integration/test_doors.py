"""What a caller can send through each door (helper, message, proxy, deferred proxy call).

Bad input fails at the caller, in the caller's thread, and every other job's
renewal goes on; what a door lets in is a plain message, which the manager
trusts once built.
Locks are short (``TTL`` ms) so a renewal that stops shows within a second.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pykka
import pytest
import redis
from pykka.messages import ProxyCall, ProxyGetAttr

from actors import (
    ExtendLocks,
    GetStats,
    ManagerRef,
    ManualTimer,
    QueueKeys,
    ThreadTimer,
    TrackJob,
    UntrackJob,
    get_active_job_count,
    get_stats,
    get_tracked_job_ids,
    is_tracked,
    start_link,
    track_job,
    untrack_job,
)
from actors.timing import Timing
from tests.support import (
    INTERVAL_S,
    TTL,
    WATCH_S,
    Bystander,
    HoldingClock,
    Inbox,
    Recorder,
    assert_still_renewing,
    manual_timer,
    settle,
    start_short,
    take_locks,
    tick,
    wait_for,
    watch_locks,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

    from actors import LostLock

KEYS = QueueKeys("doors")


#: Which trapped methods ran, on any thread, since the ``trapped`` fixture cleared it.
_RAN: list[str] = []


def _trap(what: str) -> None:
    """Note ``what`` ran; end the calling thread, unless it is the test's own.

    pytest formats failures on the test's thread, so a trap there only notes.
    """
    _RAN.append(what)
    if threading.current_thread() is not threading.main_thread():
        raise SystemExit(what)


class _Raises:
    """Whatever the manager might call on it ends the thread that calls it."""

    def __repr__(self) -> str:
        _trap("repr")
        return "<_Raises>"

    def __hash__(self) -> int:
        _trap("hash")
        return 0

    def __eq__(self, other: object) -> bool:
        _trap("eq")
        return self is other


@pytest.fixture
def logged(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    # Records are formatted (so every %r runs), as with logging.basicConfig().
    caplog.set_level(logging.DEBUG)
    yield


#: A manager, and the tokens of the locks it renews.
Renewing = tuple[ManagerRef, dict[str, str]]


@pytest.fixture
def renewing(redis_client: redis.Redis) -> Renewing:
    """A manager renewing job ``"a"``'s short lock: what each test checks goes on.

    Taken for ten TTLs, so that a loaded machine's slow start costs no lock;
    the first renewal, waited for, sets it to one TTL.
    """
    tokens = take_locks(redis_client, KEYS, ["a"], 10 * TTL)
    manager = start_short(redis_client, KEYS)
    track_job(manager, "a", tokens["a"])
    wait_for(lambda: get_stats(manager).renewed >= 1, 10 * TTL / 1000, "the first renewal")
    return manager, tokens


@pytest.fixture
def trapped() -> list[str]:
    """The trapped methods that ran during the test, in order."""
    _RAN.clear()
    return _RAN


def _warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r for r in caplog.records if r.name.startswith("actors") and r.levelno == logging.WARNING
    ]


@pytest.fixture
def bystander() -> Iterator[pykka.ActorRef[Any]]:
    ref = Bystander.start()
    yield ref
    ref.stop()


class _TrappedInt(int):
    """An int whose comparisons and conversions end the thread that calls them."""

    def __lt__(self, other: object) -> bool:
        _trap("lt")
        return int(self) < other  # type: ignore[operator]

    def __gt__(self, other: object) -> bool:
        _trap("gt")
        return int(self) > other  # type: ignore[operator]

    def __add__(self, other: object) -> int:
        _trap("add")
        return int(self) + other  # type: ignore[operator]

    def __index__(self) -> int:
        _trap("index")
        return int(self)


class _TrappedStr(str):
    """A str whose hash, equality and repr end the thread that calls them."""

    def __hash__(self) -> int:
        _trap("hash")
        return str.__hash__(self)

    def __eq__(self, other: object) -> bool:
        _trap("eq")
        return str.__eq__(self, other)

    def __repr__(self) -> str:
        _trap("repr")
        return str.__repr__(self)


class _Falsy(tuple):  # type: ignore[type-arg]
    """A tuple that says it is empty when asked, whatever it holds."""

    def __bool__(self) -> bool:
        return False


class _LooksLikeStop(tuple):  # type: ignore[type-arg]
    """A path equal to ``("stop",)`` to whoever compares, holding another."""

    def __eq__(self, other: object) -> bool:
        return other == ("stop",) or tuple.__eq__(self, other)

    def __hash__(self) -> int:
        return hash(("stop",))


class _Quiet:
    """A notify target that is told nothing here."""

    def tell(self, message: object) -> None:
        """Accept the message."""


@pytest.mark.parametrize(
    "bad",
    [("", "t"), ("j", ""), (7, "t"), ("j", None), ("bad-\udcff", "t"), ("j", "x" * 70_000)],
)
def test_every_door_refuses_bad_input_at_the_caller_and_the_manager_lives(
    redis_client: redis.Redis, bad: tuple[object, object]
) -> None:
    # A deferred proxy call is checked as the others are, and a lone
    # surrogate, which no lock key can hold, is refused.
    manager = start_short(redis_client, KEYS)
    tokens = take_locks(redis_client, KEYS, ["good"], TTL)
    track_job(manager, "good", tokens["good"])
    proxy = manager.proxy()
    doors: list[Callable[[], object]] = [
        lambda: track_job(manager, *bad),  # type: ignore[arg-type]
        lambda: manager.tell(TrackJob(*bad)),  # type: ignore[arg-type]
        lambda: proxy.track_job(*bad),
        lambda: proxy.track_job.defer(*bad),
    ]
    for door in doors:
        with pytest.raises((TypeError, ValueError)):
            door()
    seen = watch_locks(redis_client, KEYS, tokens, seconds=3 * TTL / 1000)
    assert manager.is_alive()
    assert seen.missing == set()
    assert get_tracked_job_ids(manager) == ["good"]


def test_a_callback_that_queries_its_own_manager_gets_answers_at_once(
    redis_client: redis.Redis,
) -> None:
    # Callbacks run off the manager's thread: every query, a renew now included, is answered.
    answers: list[object] = []
    done = threading.Event()
    holder: list[ManagerRef] = []

    def on_renewed(ids: list[str]) -> None:
        manager = holder[0]
        if done.is_set():
            return
        answers.extend(
            [
                get_active_job_count(manager),
                sorted(get_tracked_job_ids(manager)),
                is_tracked(manager, "a"),
                get_stats(manager).tracked,
                manager.proxy().is_tracked("b").get(),
            ]
        )
        untrack_job(manager, "b", wait=True)
        answers.append(is_tracked(manager, "b"))
        manager.ask(ExtendLocks(), timeout=TTL / 1000)
        done.set()

    manager = start_short(redis_client, KEYS, on_locks_renewed=on_renewed)
    holder.append(manager)
    tokens = take_locks(redis_client, KEYS, ["a", "b"], TTL)
    track_job(manager, "a", tokens["a"])
    track_job(manager, "b", tokens["b"])
    wait_for(done.is_set, 4 * TTL / 1000, "the callback's queries")
    assert answers == [2, ["a", "b"], True, 2, True, False]
    assert manager.is_alive()


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"lock_duration": 37_000_000_000_000}, ValueError),
        ({"lock_duration": 2**31, "lock_renew_time": 1000}, ValueError),
        ({"lock_duration": 1000, "max_batch": "10"}, TypeError),
        ({"lock_duration": 1000, "max_hold": 0}, ValueError),
    ],
)
def test_out_of_range_options_fail_at_start(
    redis_client: redis.Redis, options: dict[str, object], error: type[Exception]
) -> None:
    with pytest.raises(error):
        start_link(connection=redis_client, keys=KEYS, **options)  # type: ignore[arg-type]


def test_a_told_proxy_get_attr_of_a_bad_path_is_refused_at_the_caller(
    redis_client: redis.Redis,
) -> None:
    """``tell(ProxyGetAttr(("nope",)))`` is refused at the caller; the manager lives on.

    pykka handles ProxyGetAttr before ``on_receive``: an AttributeError there,
    with no one to answer, would stop the manager without ``on_stop``.
    """
    tokens = take_locks(redis_client, KEYS, ["a"], TTL)
    inbox = Inbox()
    manager = start_short(redis_client, KEYS)
    track_job(manager, "a", tokens["a"], notify=inbox)
    settle(manager)

    with pytest.raises(AttributeError, match="no_such_attribute"):
        manager.tell(ProxyGetAttr(attr_path=("no_such_attribute",)))

    assert_still_renewing(manager, redis_client, KEYS, tokens)
    assert manager.is_alive()


def test_an_early_grid_tick_from_a_caller_leaves_the_timer_on_its_grid(
    redis_client: redis.Redis,
) -> None:
    """``ExtendLocks(scheduled=<pending grid time>)`` sent early does not re-arm the timer later.

    A caller-sent ExtendLocks whose ``scheduled`` equals the pending grid time
    is a "renew now" until that time comes: no job is stamped in the future and
    the timer stays armed where it was, so a burst of them leaves every lock
    renewed.
    """
    armed: list[int] = []

    class Recording:
        """The manager's own timer, telling the test each deadline it is armed with."""

        def __init__(self, fire: Callable[[int], None], name: str) -> None:
            self._timer = ThreadTimer(fire, name)

        def arm(self, deadline_ms: int) -> None:
            armed.append(deadline_ms)
            self._timer.arm(deadline_ms)

        def close(self) -> None:
            self._timer.close()

    tokens = take_locks(redis_client, KEYS, ["a"], TTL)
    manager = start_short(redis_client, KEYS, timer=Recording)
    track_job(manager, "a", tokens["a"])
    settle(manager)

    for _ in range(50):  # 50 intervals: far past the TTL
        manager.ask(ExtendLocks(armed[-1]))

    seen = watch_locks(redis_client, KEYS, tokens, seconds=WATCH_S, every=0.02)
    assert seen.missing == set(), "the lock expired after forged grid ticks"


def test_a_proxy_call_from_a_callback_returns_at_once(redis_client: redis.Redis) -> None:
    """``manager.proxy().stop().get()`` from a callback returns at once.

    A callback runs on the manager's delivery thread: a stop asked from there
    must not wait on that same thread, which is busy running the callback.
    """
    tokens = take_locks(redis_client, KEYS, ["a"], TTL)
    budget = 10 * INTERVAL_S
    outcome: dict[str, object] = {}
    manager: ManagerRef | None = None

    def on_renewed(ids: list[str]) -> None:
        if outcome:
            return
        assert manager is not None
        started = time.monotonic()
        try:
            outcome["value"] = manager.proxy().stop().get(timeout=budget)
        except Exception as exc:  # anything but a wait will do
            outcome["value"] = exc
        outcome["elapsed"] = time.monotonic() - started

    manager = start_short(redis_client, KEYS, on_locks_renewed=on_renewed)
    track_job(manager, "a", tokens["a"])
    wait_for(lambda: "elapsed" in outcome, budget + WATCH_S, "the callback")
    assert not isinstance(outcome["value"], pykka.Timeout), "the call waited for itself"
    assert isinstance(outcome["elapsed"], float) and outcome["elapsed"] < budget / 2


def test_a_clock_in_float_milliseconds_is_refused_at_start(
    redis_client: redis.Redis,
) -> None:
    """``clock=`` returning float milliseconds is refused at start, naming ``clock``.

    A float clock would fail every tick on the timer's thread, far from the
    caller; it is refused where the mistake is made.
    """
    with pytest.raises(TypeError, match="clock must return int milliseconds"):
        start_short(redis_client, KEYS, clock=lambda: time.monotonic() * 1000)


@pytest.mark.usefixtures("logged")
def test_an_object_that_is_no_message_is_refused_at_the_caller(
    redis_client: redis.Redis,
    renewing: Renewing,
    bystander: pykka.ActorRef[Any],
    trapped: list[str],
) -> None:
    """An object that is no message is refused at the caller; its ``__repr__`` never runs."""
    manager, tokens = renewing

    for door in (manager.tell, manager.ask):
        with pytest.raises(TypeError, match="got _Raises"):
            door(_Raises())

    assert_still_renewing(manager, redis_client, KEYS, tokens)
    assert manager.is_alive() and bystander.is_alive()
    assert "repr" not in trapped


@pytest.mark.usefixtures("logged")
def test_a_notify_target_whose_tell_fails_is_named_by_its_type(
    redis_client: redis.Redis,
    renewing: Renewing,
    bystander: pykka.ActorRef[Any],
    trapped: list[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A target whose ``tell`` fails is logged by its type, never by its ``repr``."""

    class Target(_Raises):
        def tell(self, message: object) -> None:
            raise RuntimeError("mailbox full")

    manager, tokens = renewing
    track_job(manager, "gone", "token-of-a-lock-that-never-was", notify=Target())
    wait_for(lambda: not is_tracked(manager, "gone"), 20 * INTERVAL_S, "the loss of 'gone'")

    assert_still_renewing(manager, redis_client, KEYS, tokens)
    assert manager.is_alive() and bystander.is_alive()
    (failed,) = [r for r in _warnings(caplog) if r.exc_info and "Target" in r.getMessage()]
    assert "'gone'" in failed.getMessage()
    assert failed.exc_info is not None and str(failed.exc_info[1]) == "mailbox full"
    assert "repr" not in trapped


def test_an_int_subclass_is_kept_as_a_plain_int(redis_client: redis.Redis) -> None:
    """A ``ts`` or ``max_hold`` of an int subclass is kept as a plain int: every tick goes on."""
    tokens = take_locks(redis_client, KEYS, ["a", "b"], TTL)
    manager = start_short(redis_client, KEYS)
    ts = manager.clock()
    message = TrackJob("a", tokens["a"], ts=_TrappedInt(ts), max_hold=_TrappedInt(60_000))
    assert type(message.ts) is int and message.ts == ts
    assert type(message.max_hold) is int and message.max_hold == 60_000
    manager.tell(message)
    track_job(manager, "b", tokens["b"], max_hold=_TrappedInt(60_000))

    assert_still_renewing(manager, redis_client, KEYS, tokens)


def test_an_int_enum_is_a_fine_duration() -> None:
    class Ms(enum.IntEnum):
        LOCK = 800
        RENEW = 400

    timing = Timing(Ms.LOCK, Ms.RENEW)
    assert type(timing.lock_duration) is int and type(timing.lock_renew_time) is int
    assert (timing.lock_duration, timing.renew_time) == (800, 400)


def test_a_str_subclass_is_kept_as_a_plain_str(redis_client: redis.Redis) -> None:
    """A str subclass is accepted, for what it holds, and kept as a plain str."""
    tokens = take_locks(redis_client, KEYS, ["a"], TTL)
    manager = start_short(redis_client, KEYS)
    message = TrackJob(_TrappedStr("a"), _TrappedStr(tokens["a"]))
    assert type(message.job_id) is str and type(message.token) is str
    manager.tell(message)
    with pytest.raises(ValueError, match="must not be empty"):
        UntrackJob(_TrappedStr(""))

    assert_still_renewing(manager, redis_client, KEYS, tokens)


@pytest.mark.parametrize(
    "forged",
    [
        ProxyCall(attr_path=("stop",), args=_Falsy(("x",)), kwargs={}),
        ProxyCall(attr_path=_LooksLikeStop(("_timer", "close")), args=(), kwargs={}),
        ProxyGetAttr(attr_path=_LooksLikeStop(("_jobs",))),
    ],
    ids=["falsy-args", "path-equal-to-stop", "get-attr-path"],
)
def test_a_forged_proxy_message_is_refused_and_what_goes_on_is_rebuilt(
    redis_client: redis.Redis, renewing: Renewing, forged: Any
) -> None:
    """A proxy message is checked and rebuilt: a forged ``stop`` closes nothing."""
    manager, tokens = renewing

    with pytest.raises(TypeError):
        manager.tell(forged)

    assert_still_renewing(manager, redis_client, KEYS, tokens)
    assert manager.is_alive()


class _Told:
    """The callbacks of a manager, as one log: each report's renewals, then its losses."""

    def __init__(self) -> None:
        #: ``("renewed", how many)`` and ``("lost", how many)``, in the order they were told.
        self.said: list[tuple[str, int]] = []

    def on_locks_renewed(self, job_ids: list[str]) -> None:
        self.said.append(("renewed", len(job_ids)))

    def on_lock_renewal_failed(self, lost: list[LostLock]) -> None:
        self.said.append(("lost", len(lost)))


def test_the_timers_tick_goes_ahead_of_a_backlog(redis_client: redis.Redis) -> None:
    """The timer's tick goes ahead of every message queued before it: a backlog holds no lock.

    A burst of tells from a few threads can outrun the manager. The backlog is
    built here while the manager's thread is held in a reading of its clock,
    so what the tick runs ahead of is exact.
    """
    clock, timers, told = HoldingClock(), manual_timer(), _Told()
    fires: list[Callable[[int], None]] = []

    def timer(fire: Callable[[int], None], name: str) -> ManualTimer:
        # The manager's own fire, called here as its timer thread would.
        fires.append(fire)
        return timers(fire, name)

    manager = start_short(
        redis_client,
        KEYS,
        clock=clock,
        timer=timer,
        on_locks_renewed=told.on_locks_renewed,
        on_lock_renewal_failed=told.on_lock_renewal_failed,
    )
    interval = Timing(TTL).interval
    tokens = take_locks(redis_client, KEYS, ["a"], 60_000)
    # "a" is watched (a lease would be): it is renewed at every tick.
    track_job(manager, "a", tokens["a"], ts=clock.now - 2 * interval, notify=_Quiet())
    settle(manager)
    # The manager's thread is held reading its clock for a query,
    clock.hold(manager._manager.thread)
    stats = manager.ask(GetStats(), block=False)
    clock.wait_held(WATCH_S)
    # while a backlog of 5,000 tracks builds up behind it, due at once and held
    # by no lock (a tick that renews one says so), then the first grid tick.
    for i in range(5_000):
        track_job(manager, f"backlog-{i}", "t", ts=clock.now - 2 * interval)
    first = timers.deadline
    fires[0](first)
    # Anybody else's ExtendLocks waits its turn, behind the backlog; it runs a
    # millisecond after the grid time, when "a" is due again (watched).
    manager.tell(ExtendLocks())
    clock.now = first + 1
    clock.release()
    stats.get(timeout=WATCH_S)
    wait_for(lambda: len(told.said) >= 3, 20 * WATCH_S, "both ticks' reports")

    # The timer's tick ran before the backlog: it renewed "a" alone and lost
    # nothing; the other "renew now" ran after the backlog, and met all of it.
    assert told.said == [("renewed", 1), ("renewed", 1), ("lost", 5_000)]
    assert get_active_job_count(manager) == 1


def test_an_extend_locks_anybody_sends_waits_its_turn(redis_client: redis.Redis) -> None:
    """An ``ExtendLocks(scheduled=...)`` a caller sends waits its turn behind what came first."""
    recorder, clock, timers = Recorder(), HoldingClock(), manual_timer()
    manager = recorder.start(redis_client, KEYS, lock_duration=TTL, clock=clock, timer=timers)
    tokens = take_locks(redis_client, KEYS, ["a", "b"], 60_000)
    track_job(manager, "a", tokens["a"], ts=clock.now - 1_000)
    settle(manager)
    # Queued while the manager's thread is held: a track, then a forged grid tick.
    clock.hold(manager._manager.thread)
    stats = manager.ask(GetStats(), block=False)
    clock.wait_held(WATCH_S)
    track_job(manager, "b", tokens["b"], ts=clock.now - 1_000)
    manager.tell(ExtendLocks(timers.deadline))
    clock.release()
    stats.get(timeout=WATCH_S)
    tick(manager)  # answered once the reports before its own were delivered

    # The forged tick came after the track: its one renewal renewed "b" too.
    assert recorder.renewed() == {"a": 1, "b": 1}


def test_a_proxy_reads_values_not_the_managers_machinery(redis_client: redis.Redis) -> None:
    """A proxy reads values: never the mailbox, the thread or bound methods."""
    manager = start_short(redis_client, KEYS)
    proxy = manager.proxy()
    assert proxy.queue_name.get(timeout=5) == KEYS.name
    for name in ("actor_inbox", "actor_stopped", "thread"):
        with pytest.raises(AttributeError, match="can read only"):
            getattr(proxy, name).get(timeout=5)
    for method in ("on_receive", "on_stop", "on_failure"):
        with pytest.raises(AttributeError, match="no operation"):
            getattr(proxy, method)(ExtendLocks())
    assert manager.is_alive()
