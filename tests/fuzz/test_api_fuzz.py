"""Every public door of a running manager, fuzzed against a real server.

A hypothesis rule-based machine keeps a few real jobs (real locks, tracked
through a random door) beside a stream of malformed calls: every helper, raw
``tell``/``ask`` of each message and of garbage, proxy calls with ``get`` and
``defer``, manual ticks, and bursts from several threads at once, with
arguments drawn from empty, non-``str``, huge, non-ASCII and unencodable
strings and huge and negative numbers.

After every step: the manager is alive and answers within a bound; every real
job's lock is still held with its token; no real job was reported lost.

CI runs a short profile (150 examples, under half a minute); ``make fuzz`` a longer one
(``FUZZ_EXAMPLES=1000``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import pykka
import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from pykka.messages import ProxyCall, ProxyGetAttr

from actors import (
    ExtendLocks,
    GetActiveJobCount,
    GetStats,
    GetTrackedJobIds,
    IsTracked,
    QueueKeys,
    TrackJob,
    UntrackJob,
    get_active_job_count,
    get_stats,
    get_tracked_job_ids,
    is_tracked,
    start_link,
    stop,
    track_job,
    untrack_job,
)
from tests.support import Recorder, new_token

KEYS = QueueKeys("fuzz")
TTL = 600  # ms
ANSWER_WITHIN = 2.0  # seconds: a live manager answers a query well inside this
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "150"))
REFUSED = (TypeError, ValueError, AttributeError, RuntimeError)

odd_text = st.one_of(
    st.just(""),
    st.text(max_size=8),
    st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=4),
    st.sampled_from(["bad-\udcff", "\ud800", "é", "工作", "\x00", "a:lock", "x" * 70_000]),
)
odd_value = st.one_of(
    odd_text,
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True),
    st.binary(max_size=4),
    st.lists(st.integers(), max_size=2),
)
doors = st.sampled_from(["helper", "tell", "ask", "proxy", "defer"])


def _odd_call(manager: Any, door: str, operation: str, args: list[Any]) -> None:
    """One call of ``operation`` through ``door``; refusal at the caller is fine."""
    messages = {
        "track_job": TrackJob,
        "untrack_job": UntrackJob,
        "is_tracked": IsTracked,
        "get_stats": GetStats,
        "extend_locks": ExtendLocks,
    }
    helpers: dict[str, Callable[..., object]] = {
        "track_job": track_job,
        "untrack_job": untrack_job,
        "is_tracked": is_tracked,
        "get_stats": get_stats,
        "extend_locks": lambda m, *a: m.tell(ExtendLocks(*a)),
    }
    try:
        if door == "helper":
            helpers[operation](manager, *args)
        elif door in ("tell", "ask"):
            message = messages[operation](*args)
            if door == "tell":
                manager.tell(message)
            else:
                manager.ask(message, timeout=ANSWER_WITHIN)
        elif door == "proxy":
            getattr(manager.proxy(), operation)(*args).get(timeout=ANSWER_WITHIN)
        else:
            getattr(manager.proxy(), operation).defer(*args)
    except REFUSED:
        pass


class ApiFuzz(RuleBasedStateMachine):
    client: redis.Redis

    def __init__(self) -> None:
        super().__init__()
        self.recorder = Recorder()
        self.manager = start_link(
            connection=self.client, keys=KEYS, lock_duration=TTL, **self.recorder.callbacks()
        )
        self.real: dict[str, str] = {}
        self.serial = 0

    def teardown(self) -> None:
        stop(self.manager, timeout=10)
        self.client.flushall()

    # -- real jobs -------------------------------------------------------

    @rule(door=doors)
    def track_a_real_job(self, door: str) -> None:
        self.serial += 1
        job_id, token = f"real-{self.serial}", new_token()
        assert self.client.set(KEYS.lock(job_id), token, nx=True, px=TTL)
        if door == "helper":
            track_job(self.manager, job_id, token)
        elif door == "tell":
            self.manager.tell(TrackJob(job_id, token))
        elif door == "ask":
            self.manager.ask(TrackJob(job_id, token))
        elif door == "proxy":
            self.manager.proxy().track_job(job_id, token).get()
        else:
            self.manager.proxy().track_job.defer(job_id, token)
        self.real[job_id] = token

    @rule(data=st.data(), door=st.sampled_from(["helper", "ask", "proxy"]))
    def release_a_real_job(self, data: st.DataObject, door: str) -> None:
        if not self.real:
            return
        job_id = data.draw(st.sampled_from(sorted(self.real)))
        if door == "helper":
            untrack_job(self.manager, job_id, wait=True)
        elif door == "ask":
            self.manager.ask(UntrackJob(job_id))
        else:
            self.manager.proxy().untrack_job(job_id).get()
        del self.real[job_id]
        self.client.delete(KEYS.lock(job_id))

    # -- malformed calls -------------------------------------------------

    @rule(
        door=doors,
        operation=st.sampled_from(["track_job", "untrack_job", "is_tracked"]),
        args=st.lists(odd_value, min_size=1, max_size=3),
    )
    def call_with_odd_arguments(self, door: str, operation: str, args: list[Any]) -> None:
        if operation == "untrack_job" and any(
            isinstance(arg, str) and arg.startswith("real-") for arg in args
        ):
            return  # untracking a real job by its id is no malformed call, just a release
        if operation == "track_job" and args and isinstance(args[0], str):
            args[0] = "junk-" + args[0]  # never a real job's id
        _odd_call(self.manager, door, operation, args)

    @rule(door=doors, args=st.lists(odd_value, max_size=1))
    def renew_now(self, door: str, args: list[Any]) -> None:
        _odd_call(self.manager, door, "extend_locks", args)

    @rule(garbage=odd_value, ask=st.booleans())
    def send_garbage(self, garbage: Any, ask: bool) -> None:
        # Not a message: refused at the caller, whichever way it is sent.
        with pytest.raises(TypeError):
            if ask:
                self.manager.ask(garbage, timeout=ANSWER_WITHIN)
            else:
                self.manager.tell(garbage)

    @rule(
        path=st.sampled_from([("on_start",), ("_jobs",), ("nope",), ("stop", "x"), ()]),
        args=st.lists(odd_value, max_size=2),
    )
    def send_raw_proxy_messages(self, path: tuple[str, ...], args: list[Any]) -> None:
        with pytest.raises(REFUSED):
            self.manager.tell(ProxyCall(attr_path=path, args=tuple(args), kwargs={}))
        self.manager.ask(ProxyGetAttr(attr_path=("use_daemon_thread",)), timeout=ANSWER_WITHIN)
        with pytest.raises(AttributeError):
            self.manager.proxy().use_daemon_thread = False

    @rule(args=st.lists(st.lists(odd_value, min_size=2, max_size=2), min_size=4, max_size=4))
    def a_burst_from_four_threads(self, args: list[list[Any]]) -> None:
        def burst(pair: list[Any]) -> None:
            for door in ("helper", "tell", "defer", "proxy"):
                _odd_call(self.manager, door, "track_job", ["junk-burst", *pair[1:]])
                _odd_call(self.manager, door, "is_tracked", pair[:1])
                get_active_job_count(self.manager, timeout=ANSWER_WITHIN)

        threads = [threading.Thread(target=burst, args=(pair,)) for pair in args]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(ANSWER_WITHIN * 8)
            assert not thread.is_alive()

    # -- invariants ------------------------------------------------------

    @invariant()
    def the_manager_is_alive_and_answers(self) -> None:
        assert self.manager.is_alive()
        tracked = set(get_tracked_job_ids(self.manager, timeout=ANSWER_WITHIN))
        assert set(self.real) <= tracked
        self.manager.ask(GetActiveJobCount(), timeout=ANSWER_WITHIN)
        self.manager.ask(GetTrackedJobIds(), timeout=ANSWER_WITHIN)

    @invariant()
    def every_real_lock_is_held(self) -> None:
        if not self.real:
            return
        pipe = self.client.pipeline(transaction=False)
        for job_id in self.real:
            pipe.get(KEYS.lock(job_id))
        values = pipe.execute()
        for (job_id, token), value in zip(self.real.items(), values, strict=True):
            assert value == token.encode(), job_id

    @invariant()
    def no_real_job_was_reported_lost(self) -> None:
        reported = {str(item) for item in self.recorder.lost()}
        assert not {job_id for job_id in reported if job_id.startswith("real-")}


@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")
def test_no_call_through_any_door_hurts_the_manager(redis_client: redis.Redis) -> None:
    ApiFuzz.client = redis_client
    run_state_machine_as_test(
        ApiFuzz,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
    assert not pykka.ActorRegistry.get_all()
