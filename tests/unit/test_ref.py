"""The manager's reference: every door checks what it is given in the caller's thread.

A raw message, a module helper and a proxy call of the same operation are
the same message once admitted, and fail the same way; anything else is
refused before it reaches the manager. Nothing here reaches Redis.
"""

from __future__ import annotations

import inspect
import os
from typing import TYPE_CHECKING

import pytest
from pykka.messages import ProxyCall, ProxyGetAttr, ProxySetAttr

from actors import ManagerRef, ManagerStopped, QueueKeys, aio, api, messages, stop
from actors.messages import BY_NAME
from actors.ref import admit

if TYPE_CHECKING:
    from tests.conftest import StartManager

# Nothing listens here: these tests must fail before any command is sent.
UNUSED_URL = "redis://127.0.0.1:1/0"


def clock() -> int:
    """A caller's clock that stands still."""
    return 1234


@pytest.fixture
def manager(start_manager: StartManager) -> ManagerRef:
    return start_manager(connection=UNUSED_URL, keys=QueueKeys("q"))


# -- admission, without a manager ---------------------------------------------------


def test_a_track_without_a_time_is_stamped_on_its_way_in() -> None:
    admitted = admit(messages.TrackJob("42", "token"), clock)
    assert admitted == messages.TrackJob("42", "token", ts=1234)
    assert admit(messages.TrackJob("42", "token", ts=7), clock).ts == 7


def test_a_proxy_call_is_admitted_as_the_raw_message() -> None:
    call = ProxyCall(attr_path=("is_tracked",), args=("42",), kwargs={})
    track = ProxyCall(attr_path=("track_job",), args=("42", "t"), kwargs={"max_hold": 5})

    assert admit(call, clock) == messages.IsTracked("42")
    assert admit(track, clock) == messages.TrackJob("42", "t", ts=1234, max_hold=5)


@pytest.mark.parametrize("bad", ["", 42])
def test_a_proxy_call_fails_as_the_raw_message_does(bad: object) -> None:
    raw = _error_of(messages.IsTracked, bad)
    with pytest.raises(type(raw)) as caught:
        admit(ProxyCall(attr_path=("is_tracked",), args=(bad,), kwargs={}), clock)
    assert str(caught.value) == str(raw)


@pytest.mark.parametrize("name", ["_on_track", "on_receive", "_books", "tell"])
def test_a_proxy_calls_only_operations(name: str) -> None:
    with pytest.raises(AttributeError, match=f"no operation '{name}'"):
        admit(ProxyCall(attr_path=(name,), args=(), kwargs={}), clock)


def test_a_proxy_reads_plain_values_only_and_writes_nothing() -> None:
    assert admit(ProxyGetAttr(attr_path=("queue_name",)), clock) == ProxyGetAttr(
        attr_path=("queue_name",)
    )
    with pytest.raises(AttributeError, match="can read only"):
        admit(ProxyGetAttr(attr_path=("_books",)), clock)
    with pytest.raises(AttributeError, match="cannot be set"):
        admit(ProxySetAttr(attr_path=("queue_name",), value="other"), clock)


def test_a_proxys_stop_takes_no_arguments() -> None:
    with pytest.raises(TypeError, match="stop"):
        admit(ProxyCall(attr_path=("stop",), args=(True,), kwargs={}), clock)


def test_every_module_helper_of_a_manager_is_the_operation_of_the_same_name() -> None:
    for module in (api, aio):
        helpers = {
            name
            for name in module.__all__
            if next(iter(inspect.signature(getattr(module, name)).parameters), None) == "manager"
        } - {"stop", "ask", "answer"}
        assert helpers, module.__name__
        assert helpers <= set(BY_NAME), module.__name__
    assert {"track_job", "untrack_job", "is_tracked", "get_stats"} <= set(api.__all__)


def _error_of(kind: type, *args: object) -> Exception:
    try:
        kind(*args)
    except (TypeError, ValueError) as error:
        return error
    raise AssertionError(f"{kind.__name__}{args!r} was built")  # pragma: no cover


# -- a manager's reference -----------------------------------------------------------


def test_what_is_no_message_is_refused_at_the_caller(manager: ManagerRef) -> None:
    for garbage in ("garbage", None, 42, object()):
        with pytest.raises(TypeError, match="takes its messages"):
            manager.tell(garbage)
        with pytest.raises(TypeError, match="takes its messages"):
            manager.ask(garbage, timeout=5)

    assert manager.is_alive()


def test_a_proxy_checks_its_calls_in_the_callers_thread(manager: ManagerRef) -> None:
    proxy = manager.proxy()

    with pytest.raises(ValueError, match="token"):
        proxy.track_job("j", "")
    with pytest.raises(ValueError, match="token"):
        proxy.track_job.defer("j", "")
    with pytest.raises(AttributeError, match="no operation 'on_receive'"):
        proxy.on_receive("x")
    with pytest.raises(AttributeError, match="cannot be set"):
        proxy.queue_name = "other"

    assert manager.is_alive()
    assert proxy.queue_name.get(timeout=5) == "q"


def test_of_several_stops_only_the_one_the_manager_took_says_so(manager: ManagerRef) -> None:
    assert manager.stop() is True
    assert manager.stop() is False
    assert stop(manager) is False


def test_a_stopped_manager_refuses_what_is_asked_and_ignores_what_is_told(
    manager: ManagerRef,
) -> None:
    stop(manager)
    api.track_job(manager, "j", "t")
    api.untrack_job(manager, "j")
    api.untrack_job(manager, "j", wait=True)

    assert not manager.is_alive()
    with pytest.raises(ManagerStopped, match="LockManager for queue 'q' is stopped"):
        api.is_tracked(manager, "j")
    with pytest.raises(ManagerStopped):
        manager.ask(messages.GetStats(), timeout=5)


def test_a_message_refused_is_refused_before_the_stopped_check(manager: ManagerRef) -> None:
    # A bad call is the caller's bug, whether or not the manager still runs.
    stop(manager)
    with pytest.raises(ValueError, match="token"):
        api.track_job(manager, "j", "")


# -- a fork of the process ---------------------------------------------------------


def _in_a_fork(manager: ManagerRef) -> list[str]:
    """What each door does in a fork of this process, as lines read back through a pipe."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the fork: try every door, say what happened, leave at once
        said = []
        for door in (
            lambda: api.track_job(manager, "forked", "t"),
            lambda: manager.tell(messages.UntrackJob("forked")),
            lambda: api.get_active_job_count(manager, timeout=1),
        ):
            try:
                door()
                said.append("accepted")
            except RuntimeError as exc:
                said.append("refused: fork" if "fork" in str(exc) else f"refused: {exc}")
            except BaseException as exc:
                said.append(f"{type(exc).__name__}: {exc}")
        said.append(f"is_alive {manager.is_alive()}, stop {stop(manager, timeout=1)}")
        os.write(write, "\n".join(said).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as answer:
        return answer.read().splitlines()


def test_a_fork_is_refused_at_every_door_and_the_manager_runs_on(manager: ManagerRef) -> None:
    # A fork inherits the reference but none of the manager's threads: a
    # track there was once accepted and its lock never renewed, unreported.
    assert _in_a_fork(manager) == [
        "refused: fork",
        "refused: fork",
        "refused: fork",
        "is_alive False, stop False",
    ]
    assert manager.is_alive()
    assert api.get_active_job_count(manager) == 0
