"""User code around a manager, hostile or broken, never stops its renewals.

A ``notify`` target's own ``is_alive`` that raises (even a ``BaseException``)
or blocks once stopped or froze every renewal of the manager: its locks
expired while it still listed them as tracked, and nobody was told. An
OpenTelemetry span processor that raises once failed the tick it ended.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
from opentelemetry.sdk.trace import SpanProcessor

from actors import (
    BatchOutcome,
    ExtendLocks,
    QueueKeys,
    get_active_job_count,
    get_stats,
    start_link,
    stop,
    track_job,
)
from tests.support import Inbox, Recorder, take_locks, wait_for
from tests.support.tracing import sdk_tracer_provider

if TYPE_CHECKING:
    import redis
    from opentelemetry.sdk.trace import ReadableSpan

    from tests.support import Server

KEYS = QueueKeys("user-code")
LOCK_MS = 1000
#: Three TTLs: a lock nobody renews is gone well before.
OUTLIVE_S = 3 * LOCK_MS / 1000


class Hostile(Inbox):
    """A ``notify`` target whose ``is_alive`` (or ``__class__``) raises ``SystemExit`` or blocks."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.release = threading.Event()

    def is_alive(self) -> bool:
        return self._hostile()

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        # isinstance() reads it: a target posing as a pykka ref
        if self.how == "poses":
            self._hostile()
        return Hostile

    def _hostile(self) -> bool:
        if self.how in ("raises", "poses"):
            raise SystemExit("a target's own code")
        self.release.wait(2 * OUTLIVE_S)
        return True


@pytest.mark.parametrize("isolation", ["thread", "process"])
@pytest.mark.parametrize("how", ["raises", "blocks", "poses"])
def test_a_targets_own_is_alive_is_never_called(
    server: Server, redis_client: redis.Redis, isolation: str, how: str
) -> None:
    # Given a plain lock and one watched by a target whose is_alive is hostile
    recorder = Recorder()
    manager = start_link(
        connection=server.url,
        keys=KEYS,
        lock_duration=LOCK_MS,
        isolation=isolation,
        **recorder.callbacks(),
    )
    tokens = take_locks(redis_client, KEYS, ["plain", "watched"], LOCK_MS)
    target = Hostile(how)
    track_job(manager, "plain", tokens["plain"])
    track_job(manager, "watched", tokens["watched"], notify=target)
    try:
        # When the manager ticks for three TTLs
        started = time.monotonic()
        while time.monotonic() - started < OUTLIVE_S:
            # Then it answers at once all along
            asked = time.monotonic()
            assert get_active_job_count(manager, timeout=LOCK_MS / 1000) == 2
            assert time.monotonic() - asked < LOCK_MS / 1000
            time.sleep(LOCK_MS / 4000)
        # and both locks are still held by their tokens, nobody told a thing
        assert redis_client.mget([KEYS.lock(j) for j in tokens]) == [
            t.encode() for t in tokens.values()
        ]
        assert target.got == []
        assert recorder.lost() == []
        assert recorder.errors() == []
    finally:
        target.release.set()
        stop(manager)


class RaisesOnce(SpanProcessor):
    """A span processor with a bug: the end of one span raises."""

    def __init__(self) -> None:
        self.ended = 0

    def on_end(self, span: ReadableSpan) -> None:
        self.ended += 1
        if self.ended == 2:
            raise RuntimeError("an exporter's bug")


@pytest.fixture
def raising_processor() -> Any:
    processor = RaisesOnce()
    sdk_tracer_provider().add_span_processor(processor)
    yield processor
    # The provider keeps its processors: this one raises no more.
    processor.ended = 3


def test_a_span_processor_that_raises_fails_no_tick_and_renewals_go_on(
    server: Server, redis_client: redis.Redis, raising_processor: RaisesOnce
) -> None:
    # Given a plain lock renewed with a span processor that raises once
    recorder = Recorder()
    manager = start_link(
        connection=server.url, keys=KEYS, lock_duration=LOCK_MS, **recorder.callbacks()
    )
    tokens = take_locks(redis_client, KEYS, ["plain"], LOCK_MS)
    track_job(manager, "plain", tokens["plain"])
    # When the processor has raised
    wait_for(lambda: raising_processor.ended >= 2, OUTLIVE_S, "the processor's bug")
    # Then that span is dropped and counted, no tick failed, and renewals go on past three TTLs
    wait_for(lambda: get_stats(manager).records_dropped == 1, OUTLIVE_S, "the dropped span")
    since = time.monotonic()
    wait_for(
        lambda: time.monotonic() - since > OUTLIVE_S and recorder.renewed(since=since),
        2 * OUTLIVE_S,
        "renewals after the bug",
    )
    assert redis_client.get(KEYS.lock("plain")) == tokens["plain"].encode()
    assert recorder.lost() == []
    assert recorder.errors() == []
    assert get_stats(manager).errors == 0
    stop(manager)


class OddRenewer:
    """A ``renewer=`` whose own code misbehaves: its probe, its release, or its answer."""

    def __init__(self, how: str) -> None:
        self.how = how

    def __getattr__(self, name: str) -> Any:
        if self.how == "getattr" and name in ("probe", "release"):
            raise KeyError(name)
        raise AttributeError(name)

    def probe(self) -> None:
        if self.how == "probe":
            raise KeyboardInterrupt

    def __call__(self, job_ids: Any, tokens: Any) -> BatchOutcome:
        if self.how == "malformed":
            return BatchOutcome(failed="not-a-list", errors=[])  # type: ignore[arg-type]
        return BatchOutcome([], [])


@pytest.mark.parametrize("how", ["probe", "getattr", "malformed"])
def test_a_renewers_odd_code_fails_a_tick_at_most_and_ticks_go_on(how: str) -> None:
    # A probe raising a BaseException or an attribute lookup raising once
    # killed the renewal thread; a malformed answer was dropped with the
    # tick's report and its asked renewal left unanswered.
    recorder = Recorder()
    manager = start_link(
        renewer=OddRenewer(how), keys=KEYS, lock_duration=LOCK_MS, **recorder.callbacks()
    )
    track_job(manager, "plain", "t")
    # Then an asked renewal is answered, and the timer's ticks keep coming
    manager.ask(ExtendLocks(), timeout=OUTLIVE_S)
    ticks = get_stats(manager).ticks
    wait_for(lambda: get_stats(manager).ticks >= ticks + 3, OUTLIVE_S, "more ticks")
    if how == "malformed":
        # each tick a failed one the caller hears of, the job kept for the next
        wait_for(lambda: len(recorder.errors()) >= 3, OUTLIVE_S, "errors")
        assert all(isinstance(error, TypeError) for error in recorder.errors())
    else:
        wait_for(recorder.renewed, OUTLIVE_S, "renewals")
        assert recorder.errors() == []
    assert get_active_job_count(manager) == 1
    stop(manager)
