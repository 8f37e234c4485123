"""Defects the third and fourth hostile reviews found at the doors, each a failing test.

A caller's object runs code when the manager looks at it: ``__repr__`` when it
is logged, comparisons when it is stored, ``__eq__`` when it is checked. None
of that may run on the manager's thread, and none of it may decide what the
manager does; and no message may be left in a mailbox that nobody reads.
Locks are short (``TTL`` ms); every wait is a multiple of the interval or a
polling deadline.
"""

from __future__ import annotations

import enum
import logging
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import pykka
import pytest
from pykka.messages import ProxyCall, ProxyGetAttr

from actors import (
    ExtendLocks,
    IsTracked,
    ManagerStopped,
    ManualTimer,
    QueueKeys,
    TrackJob,
    UntrackJob,
    get_active_job_count,
    is_tracked,
    start_link,
    stop,
    track_job,
    untrack_job,
)
from actors.schedule import Timing
from tests.hardening.shared import (
    INTERVAL_S,
    TTL,
    WATCH_S,
    Bystander,
    assert_still_renewing,
    start_manager,
)
from tests.support import (
    ManualClock,
    manual_timer,
    settle,
    take_locks,
    wait_for,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from types import FrameType

    import redis

    from actors import ManagerRef

KEYS = QueueKeys("doors")


def _hostile(what: str) -> None:
    """End the calling thread, unless it is the test's own (pytest formats failures there)."""
    if threading.current_thread() is not threading.main_thread():
        raise SystemExit(what)


class _Raises:
    """Whatever the manager might call on it ends the thread that calls it."""

    def __repr__(self) -> str:
        _hostile("repr")
        return "<_Raises>"

    def __hash__(self) -> int:
        _hostile("hash")
        return 0

    def __eq__(self, other: object) -> bool:
        _hostile("eq")
        return self is other


class _Quiet:
    """A notify target that is told nothing here."""

    def tell(self, message: object) -> None:
        """Accept the message."""


@pytest.fixture
def logged(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    # Records are formatted (so every %r runs), as with logging.basicConfig().
    caplog.set_level(logging.DEBUG)
    yield


@pytest.fixture
def bystander() -> Iterator[pykka.ActorRef[Any]]:
    ref = Bystander.start()
    yield ref
    ref.stop()


def _manager(client: redis.Redis, **options: Any) -> ManagerRef:
    return start_manager(client, KEYS, **options)


def _still_renewing(manager: ManagerRef, client: redis.Redis, tokens: dict[str, str]) -> None:
    assert_still_renewing(manager, client, KEYS, tokens)


@pytest.mark.usefixtures("logged")
def test_an_object_that_is_no_message_is_refused_at_the_caller(
    redis_client: redis.Redis, bystander: pykka.ActorRef[Any]
) -> None:
    """Defect: garbage went to the manager, whose log line ran its ``__repr__`` (SystemExit)."""
    tokens = take_locks(redis_client, KEYS, ["a"], TTL)
    manager = _manager(redis_client)
    track_job(manager, "a", tokens["a"])

    for door in (manager.tell, manager.ask):
        with pytest.raises(TypeError, match="got _Raises"):
            door(_Raises())

    _still_renewing(manager, redis_client, tokens)
    assert manager.is_alive() and bystander.is_alive()


@pytest.mark.usefixtures("logged")
def test_a_message_forged_after_it_was_built_is_dropped_without_looking_inside(
    redis_client: redis.Redis, bystander: pykka.ActorRef[Any]
) -> None:
    """Defect: a dropped message was logged with ``%r``: a forged field stopped every actor."""
    tokens = take_locks(redis_client, KEYS, ["a"], TTL)
    manager = _manager(redis_client)
    track_job(manager, "a", tokens["a"])
    for message in (TrackJob("x", "t", ts=1), UntrackJob("x"), IsTracked("x")):
        # A frozen dataclass can still be written with object.__setattr__.
        object.__setattr__(message, "job_id", _Raises())
        manager.tell(message)

    _still_renewing(manager, redis_client, tokens)
    assert manager.is_alive() and bystander.is_alive()


@pytest.mark.usefixtures("logged")
def test_a_notify_target_whose_tell_fails_is_named_by_its_type(
    redis_client: redis.Redis, bystander: pykka.ActorRef[Any]
) -> None:
    """Defect: a failed ``tell`` was logged with the target's ``%r``: SystemExit stopped all."""

    class Target(_Raises):
        def tell(self, message: object) -> None:
            raise RuntimeError("mailbox full")

    tokens = take_locks(redis_client, KEYS, ["a"], TTL)
    manager = _manager(redis_client)
    track_job(manager, "a", tokens["a"])
    track_job(manager, "gone", "token-of-a-lock-that-never-was", notify=Target())
    wait_for(lambda: not is_tracked(manager, "gone"), 20 * INTERVAL_S, "the loss of 'gone'")

    _still_renewing(manager, redis_client, tokens)
    assert manager.is_alive() and bystander.is_alive()


class _Hostile(int):
    """An int whose comparisons and conversions end the thread that calls them."""

    def __lt__(self, other: object) -> bool:
        _hostile("lt")
        return int(self) < other  # type: ignore[operator]

    def __gt__(self, other: object) -> bool:
        _hostile("gt")
        return int(self) > other  # type: ignore[operator]

    def __add__(self, other: object) -> int:
        _hostile("add")
        return int(self) + other  # type: ignore[operator]

    def __index__(self) -> int:
        _hostile("index")
        return int(self)


class _HostileStr(str):
    """A str whose hash, equality and repr end the thread that calls them."""

    def __hash__(self) -> int:
        _hostile("hash")
        return str.__hash__(self)

    def __eq__(self, other: object) -> bool:
        _hostile("eq")
        return str.__eq__(self, other)

    def __repr__(self) -> str:
        _hostile("repr")
        return str.__repr__(self)


def test_an_int_subclass_is_kept_as_a_plain_int(redis_client: redis.Redis) -> None:
    """Defect: a ``ts`` or ``max_hold`` of an int subclass was stored, and broke every tick."""
    tokens = take_locks(redis_client, KEYS, ["a", "b"], TTL)
    manager = _manager(redis_client)
    ts = manager.clock()
    message = TrackJob("a", tokens["a"], ts=_Hostile(ts), max_hold=_Hostile(60_000))
    assert type(message.ts) is int and message.ts == ts
    assert type(message.max_hold) is int and message.max_hold == 60_000
    manager.tell(message)
    track_job(manager, "b", tokens["b"], max_hold=_Hostile(60_000))

    _still_renewing(manager, redis_client, tokens)


def test_an_int_enum_is_a_fine_duration() -> None:
    class Ms(enum.IntEnum):
        LOCK = 800
        RENEW = 400

    timing = Timing(Ms.LOCK, Ms.RENEW)
    assert type(timing.lock_duration) is int and type(timing.lock_renew_time) is int
    assert (timing.lock_duration, timing.renew_time) == (800, 400)


def test_a_str_subclass_is_kept_as_a_plain_str(redis_client: redis.Redis) -> None:
    """Defect: a str subclass was refused with a false reason ("must be at most 65536 bytes")."""
    tokens = take_locks(redis_client, KEYS, ["a"], TTL)
    manager = _manager(redis_client)
    message = TrackJob(_HostileStr("a"), _HostileStr(tokens["a"]))
    assert type(message.job_id) is str and type(message.token) is str
    manager.tell(message)
    with pytest.raises(ValueError, match="must not be empty"):
        UntrackJob(_HostileStr(""))

    _still_renewing(manager, redis_client, tokens)


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
    redis_client: redis.Redis, forged: Any
) -> None:
    """Defect: the checked message was forwarded as given: a forged ``stop`` closed the timer."""
    tokens = take_locks(redis_client, KEYS, ["a"], TTL)
    manager = _manager(redis_client)
    track_job(manager, "a", tokens["a"])

    with pytest.raises(TypeError):
        manager.tell(forged)

    _still_renewing(manager, redis_client, tokens)
    assert manager.is_alive()


def _held_at_the_mailbox(holding: threading.Event, release: threading.Event) -> Any:
    """A trace function that holds a thread just before pykka puts its message in the mailbox.

    As a preemption at the worst moment would: the manager may stop meanwhile.
    It sets ``holding`` once there, and goes on when ``release`` is set.
    """
    # pykka's reference puts the message, or the manager's own in its place.
    ref_modules = (os.path.join("pykka", "_ref.py"), os.path.join("actors", "ref.py"))

    def tracer(frame: FrameType, event: str, arg: object) -> Any:
        caller = frame.f_back
        if (
            event == "call"
            and frame.f_code.co_name == "put"
            and caller is not None
            and caller.f_code.co_filename.endswith(ref_modules)
        ):
            holding.set()
            release.wait(20 * INTERVAL_S)
        return None

    return tracer


def test_an_ask_racing_stop_is_answered(redis_client: redis.Redis) -> None:
    """Defect: an ask put after pykka's last pass over the mailbox waited forever."""
    before = set(threading.enumerate())
    manager = _manager(redis_client)
    (actor_thread,) = [
        thread
        for thread in set(threading.enumerate()) - before
        if thread.name.startswith("LockManager") and "timer" not in thread.name
    ]
    holding, release = threading.Event(), threading.Event()
    outcome: list[object] = []

    def ask() -> None:
        sys.settrace(_held_at_the_mailbox(holding, release))
        try:
            untrack_job(manager, "job", wait=True)  # no timeout, as a lease's exit waits
            outcome.append("answered")
        except ManagerStopped as error:
            outcome.append(error)
        finally:
            sys.settrace(None)

    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    assert holding.wait(20 * INTERVAL_S), "the asker never reached the mailbox"
    # The asker is held on its way into the mailbox; the manager is told to
    # stop meanwhile. Had it stopped and emptied its mailbox for the last time
    # (its thread ended), the message would land where nobody reads: let the
    # asker go on once that has happened, or after a few intervals.
    stopper = threading.Thread(target=stop, args=(manager,), daemon=True)
    stopper.start()
    deadline = time.monotonic() + 5 * INTERVAL_S
    while actor_thread.is_alive() and time.monotonic() < deadline:
        actor_thread.join(INTERVAL_S / 10)
    release.set()

    asker.join(40 * INTERVAL_S)
    stopper.join(40 * INTERVAL_S)
    assert not asker.is_alive(), "the ask was never answered"
    assert not stopper.is_alive()
    assert len(outcome) == 1


class _HeldAtFirstRenewal:
    """``on_locks_renewed`` that counts the tracked jobs at each renewal and holds the first.

    While the manager is held in it, the test builds up its mailbox exactly;
    :meth:`release` lets it go on.
    """

    def __init__(self) -> None:
        self.manager: ManagerRef | None = None
        #: How many jobs were tracked at each renewing tick, in order.
        self.tracked_at_tick: list[int] = []
        self._held, self._release = threading.Event(), threading.Event()

    def __call__(self, job_ids: list[str]) -> None:
        assert self.manager is not None
        self.tracked_at_tick.append(get_active_job_count(self.manager))
        if len(self.tracked_at_tick) == 1:
            self._held.set()
            self._release.wait(20 * INTERVAL_S)

    def wait_held(self) -> None:
        """Return once the first renewing tick is held."""
        assert self._held.wait(20 * INTERVAL_S), "the first tick never renewed"

    def release(self) -> None:
        """Let the held tick finish."""
        self._release.set()


def test_the_timers_tick_goes_ahead_of_a_backlog(redis_client: redis.Redis) -> None:
    """Defect: the timer's tick queued behind every message before it; a backlog held every lock.

    A burst of tells from a few threads can outrun the manager; each tick then
    waited for the whole backlog. The backlog is built here while the manager
    is held in a callback, so what the tick runs ahead of is exact.
    """
    clock, timers = ManualClock(), manual_timer()
    renewals = _HeldAtFirstRenewal()
    fires: list[Callable[[int], None]] = []

    def timer(fire: Callable[[int], None], name: str) -> ManualTimer:
        # The manager's own fire, called here as its timer thread would.
        fires.append(fire)
        return timers(fire, name)

    manager = _manager(redis_client, clock=clock, timer=timer, on_locks_renewed=renewals)
    renewals.manager = manager
    interval = Timing(TTL).interval
    tokens = take_locks(redis_client, KEYS, ["a"], 60_000)
    # "a" is watched (a lease would be): it is renewed at every tick.
    track_job(manager, "a", tokens["a"], ts=clock.now - 2 * interval, notify=_Quiet())
    settle(manager)
    # The first grid tick renews "a" and holds the manager in its callback,
    first = clock.now = timers.deadline
    fires[0](first)
    renewals.wait_held()
    # while a backlog of 5,000 tracks builds up behind it, then the next grid tick.
    for i in range(5_000):
        track_job(manager, f"backlog-{i}", "t", ts=clock.now)
    clock.now = first + interval
    fires[0](first + interval)
    # Anybody else's ExtendLocks waits its turn, behind the backlog.
    manager.tell(ExtendLocks())
    renewals.release()
    settle(manager)

    # The timer's tick ran before the backlog: only "a" was tracked then;
    # the other "renew now" after it (and renewed nothing due, so said nothing).
    assert renewals.tracked_at_tick == [1, 1]
    assert get_active_job_count(manager) == 5_001


class _Blocks(str):
    """A str whose hash, on any thread but the test's, holds it longer than a lock lives."""

    def __hash__(self) -> int:
        if threading.current_thread() is not threading.main_thread():
            threading.Event().wait(WATCH_S)
        return str.__hash__(self)


class _Stamp:
    """A stamp that passes one comparison and fails the next, on every tick."""

    def __gt__(self, other: object) -> bool:
        return False

    def __lt__(self, other: object) -> bool:
        raise RuntimeError("the caller's code on the manager's thread")

    def __le__(self, other: object) -> bool:
        raise RuntimeError("the caller's code on the manager's thread")


class _Hold:
    """A max_hold whose sum with a stamp is a deadline that fails every tick."""

    def __radd__(self, other: object) -> _Stamp:
        return _Stamp()


class _Grid:
    """A grid time that says it is the one due, and moves the next one out of reach."""

    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return 0

    def __le__(self, other: object) -> bool:
        return True

    def __rsub__(self, other: object) -> int:
        return 0

    def __sub__(self, other: object) -> int:
        return -(10**15)

    def __add__(self, other: object) -> int:
        return 10**15


@pytest.mark.parametrize("field", ["ts", "max_hold", "scheduled", "untrack-job_id", "is_tracked"])
def test_a_field_changed_after_the_message_was_built_is_dropped(
    redis_client: redis.Redis, field: str
) -> None:
    """Defect: the manager kept a forged field as given: no more ticks, or a hung manager."""
    tokens = take_locks(redis_client, KEYS, ["a"], TTL)
    manager = _manager(redis_client)
    track_job(manager, "a", tokens["a"])
    message: Any
    if field in ("ts", "max_hold"):
        message = TrackJob("b", "t", ts=1, max_hold=1000)
        object.__setattr__(message, field, _Stamp() if field == "ts" else _Hold())
    elif field == "scheduled":
        message = ExtendLocks(1)
        object.__setattr__(message, "scheduled", _Grid())
    elif field == "untrack-job_id":
        message = UntrackJob("a")
        object.__setattr__(message, "job_id", _Blocks("a"))
    else:
        message = IsTracked("a")
        object.__setattr__(message, "job_id", _Blocks("a"))

    manager.tell(message)

    _still_renewing(manager, redis_client, tokens)
    assert is_tracked(manager, "a", timeout=20 * INTERVAL_S)
    assert not is_tracked(manager, "b", timeout=20 * INTERVAL_S)


def test_an_extend_locks_anybody_sends_waits_its_turn(redis_client: redis.Redis) -> None:
    """Defect: any ``ExtendLocks(scheduled=...)`` jumped the mailbox, starving what came first."""
    renewals = _HeldAtFirstRenewal()
    clock = ManualClock()
    manager = _manager(redis_client, clock=clock, timer=manual_timer(), on_locks_renewed=renewals)
    renewals.manager = manager
    tokens = take_locks(redis_client, KEYS, ["a", "b"], 60_000)
    track_job(manager, "a", tokens["a"], ts=clock.now - 1_000)
    settle(manager)
    manager.tell(ExtendLocks())
    renewals.wait_held()
    # Queued while the manager is held: a track, then a forged grid tick.
    track_job(manager, "b", tokens["b"], ts=clock.now - 1_000)
    manager.tell(ExtendLocks(clock.now))
    renewals.release()
    settle(manager)

    # The forged tick came after the track: it renewed "b".
    assert renewals.tracked_at_tick == [1, 2]


def test_a_proxy_reads_values_not_the_managers_machinery(redis_client: redis.Redis) -> None:
    """Defect: a proxy handed out the mailbox, its gate and bound methods to any caller."""
    manager = _manager(redis_client)
    proxy = manager.proxy()
    assert proxy.queue_name.get(timeout=5) == KEYS.name
    for name in ("actor_inbox", "actor_stopped", "thread"):
        with pytest.raises(AttributeError, match="can read only"):
            getattr(proxy, name).get(timeout=5)
    for method in ("handle", "on_receive"):
        with pytest.raises(AttributeError, match="no operation"):
            getattr(proxy, method)(ExtendLocks())
    assert manager.is_alive()


def test_a_renewer_whose_close_raises_base_exception_stops_nothing(
    redis_client: redis.Redis, bystander: pykka.ActorRef[Any]
) -> None:
    """Defect: ``close()`` raising KeyboardInterrupt at stop made pykka stop every actor."""

    class Renewer:
        def __call__(self, job_ids: list[str], tokens: list[str]) -> Any:
            raise AssertionError("nothing is tracked")

        def close(self) -> None:
            raise KeyboardInterrupt

    other = _manager(redis_client)
    manager = start_link(keys=KEYS, renewer=Renewer(), lock_duration=TTL)  # type: ignore[arg-type]

    manager.stop(timeout=5)
    assert not manager.is_alive()
    assert bystander.is_alive() and other.is_alive()
