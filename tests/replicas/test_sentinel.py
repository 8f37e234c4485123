"""Lock renewal through a real Sentinel failover: a primary, a replica, three sentinels.

The manager renews through a ``redis.sentinel.Sentinel(...).master_for(...)``
client; the test asks the sentinels for a failover (``SENTINEL FAILOVER``),
as an operator would, and watches the lock on the server that becomes the
primary from a thread of its own (:class:`LockSampler`).

A Sentinel failover has a switch window: from the replica's promotion until
the sentinels make the old primary a replica of the new one (about 3 s with the
periods of :mod:`tests.support.sentinel`, 9 s with Sentinel's defaults), the
old primary still takes writes, and a client keeps its connection to it. The
renewals of that window land on the old primary and are then thrown away with
its data. So a lock is kept through a failover only if its TTL outlasts one
renewal period before the promotion, the window, and one period after it
(:data:`LOCK_MS`); with ``replicas=1`` the window's renewals are refused as
:class:`~actors.NotReplicatedError`, and a watched lock whose TTL does not
outlast the window is told ``"unconfirmed"`` before its copy on the new primary
can expire (:func:`test_short_lease_is_told_before_its_lock_expires_on_the_new_primary`).

Each test starts its own set of processes (about half a second) and stops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest
import redis
from bullmq import Queue, Worker

import actors
from actors import NotReplicatedError, QueueKeys, Replicas
from actors.bullmq import use_actor_lock_manager
from actors.cli import main
from actors.connection import command_timeout
from actors.timing import Timing, default_safety_margin
from tests.bullmq.harness import close_worker
from tests.support import Recorder, take_locks, wait_for
from tests.support.sentinel import FAILOVER_WAIT, SentinelSet

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.conftest import StartManager
    from tests.support.sentinel import Address

pytestmark = pytest.mark.timeout(180)

#: BullMQ's key layout: ``bull:q:<id>:lock``.
KEYS = QueueKeys("q", prefix="bull")
JOB = "job-1"

#: The lock TTL of the tests that keep their lock (ms): one renewal period
#: before the promotion, the switch window (about 3 s) and one period after
#: it, with a few seconds to spare for a loaded machine.
LOCK_MS = 8000
#: Most ms between two renewals of one lock (the timer ticks twice as often).
RENEW_MS = 1000
#: A lock TTL shorter than the switch window (ms): a failover always leaves
#: its copy on the new primary unrenewed until it expires.
SHORT_LOCK_MS = 2000
#: The replicas each renewal waits for, with ``replicas=``.
REPLICAS = Replicas(1, timeout=200)
#: The wait of a take: a take left unconfirmed is its run's end (told at once),
#: so a loaded machine's slow acknowledgement gets what a 1 s client allows.
TAKE_REPLICAS = Replicas(1, timeout=500)

#: Seconds between two samples of a lock.
SAMPLE_S = 0.02


def socket_timeout(lock_ms: int, renew_ms: int | None = None) -> float:
    """The manager's wait per attempt for these windows: no warning, and a WAIT fits."""
    return command_timeout(Timing(lock_ms, renew_ms))


def trusted_ms(lock_ms: int, renew_ms: int | None = None) -> int:
    """How long a watched lock is trusted after a confirmed renewal's send, in ms."""
    windows = Timing(lock_ms, renew_ms)
    return windows.lock_duration - default_safety_margin(windows)


def renewals_s(lock_ms: int) -> float:
    """The longest wait for renewals: past one lock duration the lock is lost anyway."""
    return lock_ms / 1000


@dataclass(frozen=True)
class Sample:
    """One reading of a lock on one server."""

    #: ``time.monotonic()`` once the reply came.
    at: float
    #: The lock's value (``None``: the key is gone).
    value: str | None
    #: Its time to live in ms (``-2``: gone).
    pttl: int


class LockSampler:
    """Reads one lock on one server every :data:`SAMPLE_S` seconds, on a thread of its own.

    The server may change role meanwhile (Sentinel kills its clients when it
    does): a reading that fails is counted and the next one tried.

    Args:
        address: The server to read.
        key: The lock's key.
        token: The value the lock should hold.
    """

    def __init__(self, address: Address, key: str, token: str) -> None:
        self.address = address
        self.key = key
        self.token = token
        self.failures = 0
        self._client = redis.Redis(
            *address, socket_timeout=1, socket_connect_timeout=1, decode_responses=True
        )
        self._samples: list[Sample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lock-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                pipe: Any = self._client.pipeline(transaction=False)
                pipe.get(self.key)
                pipe.pttl(self.key)
                value, pttl = pipe.execute()
            except (redis.RedisError, OSError):
                self.failures += 1
            else:
                with self._lock:
                    self._samples.append(Sample(time.monotonic(), value, int(pttl)))
            self._stop.wait(SAMPLE_S)

    def __enter__(self) -> LockSampler:
        self._thread.start()
        # One reading first: the samples cover the whole block.
        wait_for(self.samples, 5.0, f"a first reading of {self.address}")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._client.close()

    def samples(self, since: float | None = None, until: float | None = None) -> list[Sample]:
        """Return the readings taken in ``(since, until]`` (monotonic seconds)."""
        with self._lock:
            return [
                sample
                for sample in self._samples
                if (since is None or sample.at > since) and (until is None or sample.at <= until)
            ]

    def gone(self, since: float | None = None, until: float | None = None) -> list[Sample]:
        """Return the readings that found the lock gone or holding another token."""
        return [s for s in self.samples(since, until) if s.value != self.token]

    def refreshes(self, since: float | None = None, until: float | None = None) -> int:
        """Return how many times the lock's TTL went up between two readings: renewals seen."""
        samples = self.samples(since, until)
        return sum(1 for a, b in itertools.pairwise(samples) if b.pttl > a.pttl)

    def longest_unrenewed(self) -> tuple[float, float]:
        """Return the longest stretch between two readings that saw a renewal (monotonic s).

        From the first reading, or a reading whose TTL went up, to the next
        reading whose TTL went up (or the last reading).
        """
        samples = self.samples()
        if not samples:
            return (0.0, 0.0)
        longest = (samples[0].at, samples[0].at)
        start = samples[0].at
        for a, b in itertools.pairwise(samples):
            if b.pttl > a.pttl or b is samples[-1]:
                if b.at - start > longest[1] - longest[0]:
                    longest = (start, b.at)
                start = b.at
        return longest


class Renewals:
    """The confirmed renewals of :data:`JOB`, with their times, on top of a :class:`Recorder`."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self._times: list[float] = []
        self._lock = threading.Lock()

    def on_locks_renewed(self, job_ids: list[str]) -> None:
        if JOB in job_ids:
            with self._lock:
                self._times.append(time.monotonic())
        self.recorder.on_locks_renewed(job_ids)

    def callbacks(self) -> dict[str, Any]:
        callbacks: dict[str, Any] = dict(self.recorder.callbacks())
        callbacks["on_locks_renewed"] = self.on_locks_renewed
        return callbacks

    def longest_gap_s(self) -> float:
        """The longest time between two confirmed renewals of the job, in seconds."""
        with self._lock:
            times = list(self._times)
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)

    def wait(self, count: int, timeout: float, what: str, *, since: float | None = None) -> None:
        """Wait until the job was renewed ``count`` times after ``since``."""
        self.recorder.wait(lambda: self.recorder.renewed(since)[JOB] >= count, timeout, what)


@pytest.fixture
def sentinels() -> Iterator[SentinelSet]:
    with SentinelSet() as started:
        yield started


def _fail_over(sentinels: SentinelSet) -> tuple[float, float]:
    """Fail over and wait until the old primary replicates the new one.

    Returns:
        When the failover was asked for and when the old primary was a replica
        in sync (monotonic seconds): from then on no write can land on it.
    """
    asked = time.monotonic()
    sentinels.failover(FAILOVER_WAIT)
    sentinels.wait_replicating(FAILOVER_WAIT)
    return asked, time.monotonic()


def test_renewals_resume_on_the_new_primary(
    sentinels: SentinelSet, start_manager: StartManager
) -> None:
    """Thread mode, no replicas=: the lock on the promoted replica is renewed on, never lost."""
    client = sentinels.client(socket_timeout=socket_timeout(LOCK_MS, RENEW_MS))
    token = take_locks(client, KEYS, [JOB], LOCK_MS, replicas=1)[JOB]
    renewals = Renewals(Recorder())
    manager = start_manager(
        connection=client,
        keys=KEYS,
        lock_duration=LOCK_MS,
        lock_renew_time=RENEW_MS,
        **renewals.callbacks(),
    )
    actors.track_job(manager, JOB, token, wait=True)
    renewals.wait(2, renewals_s(LOCK_MS), "two renewals before the failover")
    old, new = sentinels.primary(), sentinels.replica()

    with (
        LockSampler(new, KEYS.lock(JOB), token) as on_new,
        LockSampler(old, KEYS.lock(JOB), token) as on_old,
    ):
        asked, demoted = _fail_over(sentinels)
        assert sentinels.primary() == new
        assert sentinels.role(old)[0] == "slave"
        # From here a write on the old primary is refused: these ran on the new one.
        renewals.wait(2, renewals_s(LOCK_MS), "two renewals after the switch", since=demoted)
        wait_for(lambda: on_new.refreshes(demoted) >= 1, renewals_s(LOCK_MS), "a refreshed TTL")

    recorder = renewals.recorder
    assert recorder.lost() == [], f"reported lost: {recorder.lost()}"
    assert on_new.gone() == [], f"the lock was gone on {new}: {on_new.gone()[:3]}"
    primary = sentinels.admin(new)
    assert primary.get(KEYS.lock(JOB)) == token
    assert int(primary.pttl(KEYS.lock(JOB))) > LOCK_MS - 2 * RENEW_MS
    stats = actors.get_stats(manager)
    assert stats.lost == 0
    # Measured, not asserted: the switch window's renewals went to the old primary.
    start, end = on_new.longest_unrenewed()
    print(
        f"\nno replicas=: lock on the new primary unrenewed for {end - start:.2f} s at most, "
        f"{start - asked:+.2f} s to {end - asked:+.2f} s from the failover's start, while "
        f"{on_old.refreshes(start + SAMPLE_S, end - SAMPLE_S)} renewal(s) landed on the old "
        f"primary; renewals {stats.renewed}, failed ticks {stats.errors} "
        f"({[type(e).__name__ for e in recorder.errors()]})"
    )


def test_replicated_renewals_resume_after_the_failover(
    sentinels: SentinelSet, start_manager: StartManager
) -> None:
    """replicas=1: the switch window's renewals are refused, then confirmed again; a lease holds."""
    client = sentinels.client(socket_timeout=socket_timeout(LOCK_MS, RENEW_MS))
    token = take_locks(client, KEYS, [JOB], LOCK_MS, replicas=1)[JOB]
    renewals = Renewals(Recorder())
    manager = start_manager(
        connection=client,
        keys=KEYS,
        lock_duration=LOCK_MS,
        lock_renew_time=RENEW_MS,
        replicas=REPLICAS,
        **renewals.callbacks(),
    )
    recorder = renewals.recorder
    trusted_s = trusted_ms(LOCK_MS, RENEW_MS) / 1000
    new = sentinels.replica()

    with actors.lease(manager, JOB, token) as held:
        renewals.wait(2, renewals_s(LOCK_MS), "two confirmed renewals before the failover")
        assert recorder.errors() == [], "a renewal went unconfirmed with the replica in sync"
        with LockSampler(new, KEYS.lock(JOB), token) as on_new:
            asked, demoted = _fail_over(sentinels)
            renewals.wait(2, renewals_s(LOCK_MS), "two confirmed renewals after", since=demoted)
            confirmed_at = time.monotonic()
            held.check()
        deadline = held.deadline
        assert deadline is not None
        # The deadline moved on a renewal the new primary's replica confirmed.
        assert deadline > demoted * 1000 + trusted_s * 1000 - RENEW_MS
        assert not held.lost

    refused = [e for e in recorder.errors(asked) if isinstance(e, NotReplicatedError)]
    assert refused, (
        "no renewal of the switch window was refused: they landed on the old primary "
        f"unconfirmed (errors: {recorder.errors(asked)})"
    )
    assert all(e.wanted == 1 and e.acked == 0 for e in refused)
    assert recorder.lost() == []
    assert on_new.gone(until=confirmed_at) == []
    gap = renewals.longest_gap_s()
    assert gap < trusted_s
    print(
        f"\nreplicas=1: {len(refused)} renewal(s) refused (NotReplicatedError); longest time "
        f"between confirmed renewals {gap:.2f} s of {trusted_s:.2f} s trusted; switch "
        f"(failover asked to old primary in sync) {demoted - asked:.2f} s"
    )


def test_async_lease_through_a_failover(
    sentinels: SentinelSet, start_manager: StartManager
) -> None:
    """An ``async with`` lease holds through the failover; an asyncio Sentinel client reads."""
    client = sentinels.client(socket_timeout=socket_timeout(LOCK_MS, RENEW_MS))
    token = take_locks(client, KEYS, [JOB], LOCK_MS, replicas=1)[JOB]
    renewals = Renewals(Recorder())
    manager = start_manager(
        connection=client,
        keys=KEYS,
        lock_duration=LOCK_MS,
        lock_renew_time=RENEW_MS,
        **renewals.callbacks(),
    )
    new = sentinels.replica()

    async def hold() -> tuple[int, int, int]:
        reader = sentinels.async_client(socket_timeout=1.0, decode_responses=True)
        reads = failed_reads = 0
        try:
            async with actors.lease(manager, JOB, token) as held:
                switching = asyncio.ensure_future(asyncio.to_thread(_fail_over, sentinels))
                while not switching.done():
                    held.check()  # the work's steps
                    try:
                        value = await reader.get(KEYS.lock(JOB))
                    except redis.ConnectionError:
                        failed_reads += 1  # its connection killed at a role change
                    else:
                        reads += 1
                        assert value == token, f"read {value!r} through Sentinel"
                    await asyncio.sleep(SAMPLE_S)
                _asked, demoted = switching.result()
                await asyncio.to_thread(
                    renewals.wait, 2, renewals_s(LOCK_MS), "two renewals after", since=demoted
                )
                held.check()
                # Through Sentinel again: the new primary, found after its old connection died.
                ttl = int(await reader.pttl(KEYS.lock(JOB)))
                assert not held.lost
        finally:
            await reader.aclose()
            await sentinels.aclose_async_clients()
        return reads, failed_reads, ttl

    reads, failed_reads, ttl = asyncio.run(hold())
    assert sentinels.primary() == new
    assert ttl > LOCK_MS - 2 * RENEW_MS, f"the lock's TTL on the new primary is {ttl} ms"
    assert reads > 0
    assert renewals.recorder.lost() == []
    print(f"\nasync lease: {reads} reads through Sentinel, {failed_reads} failed at a role change")


@pytest.mark.parametrize(
    ("given", "isolation"),
    [("client", "thread"), ("url", "thread"), ("url", "process")],
    ids=["master_for-thread", "url-thread", "url-process"],
)
def test_short_lease_is_told_before_its_lock_expires_on_the_new_primary(
    sentinels: SentinelSet, start_manager: StartManager, given: str, isolation: str
) -> None:
    """A 2 s lock, replicas=1: the switch window outlasts it; the lease learns it in time.

    No renewal reaches the promoted replica during the switch window, so its
    copy of the lock expires. The lease must be told (``"unconfirmed"``) while
    that copy still holds the token: a job told later could run beside the
    worker that takes the job next.
    """
    client = sentinels.client(socket_timeout=socket_timeout(SHORT_LOCK_MS))
    token = take_locks(client, KEYS, [JOB], SHORT_LOCK_MS, replicas=1)[JOB]
    renewals = Renewals(Recorder())
    manager = start_manager(
        connection=client if given == "client" else sentinels.url,
        keys=KEYS,
        lock_duration=SHORT_LOCK_MS,
        replicas=REPLICAS,
        isolation=isolation,
        **renewals.callbacks(),
    )
    new = sentinels.replica()
    told: list[float] = []
    deadlines: list[int | None] = []

    with actors.lease(manager, JOB, token) as held:
        renewals.wait(2, renewals_s(SHORT_LOCK_MS), "two confirmed renewals before the failover")
        assert not held.lost

        def watchdog() -> None:
            if held.wait(timeout=FAILOVER_WAIT + SHORT_LOCK_MS / 1000):
                told.append(time.monotonic())
                deadlines.append(held.deadline)

        watching = threading.Thread(target=watchdog, name="lease-watchdog", daemon=True)
        with LockSampler(new, KEYS.lock(JOB), token) as on_new:
            watching.start()
            asked = time.monotonic()
            sentinels.failover(FAILOVER_WAIT)
            watching.join(FAILOVER_WAIT + SHORT_LOCK_MS / 1000)
            assert told, "the lease was never told its lock was lost"
            # Nobody renews the lock now: its copy on the new primary runs out.
            wait_for(on_new.gone, renewals_s(SHORT_LOCK_MS) * 2, "the lock to expire")
        reason = held.reason

    assert reason == "unconfirmed", f"told {reason!r}"
    assert told[0] > asked
    expired_at = on_new.gone()[0].at
    # The lease's last deadline (manager ms, the same monotonic clock) came first...
    deadline = deadlines[0]
    assert deadline is not None
    assert deadline / 1000 < expired_at, "the lease trusted its lock past its expiry"
    # ...and the job learnt it while the lock still held its token.
    early = on_new.gone(until=told[0])
    assert early == [], f"the lock was gone on the new primary before the lease knew: {early[:3]}"
    print(
        f"\n2 s lock, replicas=1: lease told {told[0] - asked:.2f} s after the failover was "
        f"asked, {expired_at - told[0]:.2f} s before its lock expired on the new primary "
        f"(deadline {expired_at - deadline / 1000:.2f} s before)"
    )


def test_the_cli_reads_the_locks_through_the_sentinels(
    sentinels: SentinelSet, capsys: pytest.CaptureFixture[str]
) -> None:
    client = sentinels.client()
    token = take_locks(client, KEYS, [JOB], LOCK_MS)[JOB]
    argv = ["locks", "--url", sentinels.url, "--queue", "q", "--prefix", "bull", "--json"]
    assert main(argv, prog="echomq-locks") == 0
    [listed] = json.loads(capsys.readouterr().out)["locks"]
    assert (listed["job_id"], listed["token"]) == (JOB, token)


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_bullmq_worker_on_sentinel_renews_through_the_failover(
    sentinels: SentinelSet, isolation: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker on an asyncio Sentinel client, its manager on the Sentinel URL, ``replicas=1``.

    The integration's fetch copies the worker's Sentinel client (so a job is
    tracked from its fetch), and the job runs once, renewed on the new primary.
    """
    runs: list[str] = []
    aborted: list[bool] = []
    switched = asyncio.Event()
    new = sentinels.replica()

    async def process(job: Any, token: str, signal: Any) -> str:
        runs.append(str(job.id))
        await switched.wait()
        aborted.append(signal.aborted)
        return "done"

    async def scenario() -> str:
        options = {"prefix": "bull", "autorun": False, "lockDuration": LOCK_MS, "drainDelay": 1}
        connection = sentinels.async_client(decode_responses=True)
        worker = Worker("q", process, {**options, "connection": connection})
        use_actor_lock_manager(
            worker, connection=sentinels.url, replicas=TAKE_REPLICAS, isolation=isolation
        )
        running = asyncio.ensure_future(worker.run())
        queue = Queue(
            "q", {"connection": sentinels.async_client(decode_responses=True), "prefix": "bull"}
        )
        try:
            job = await queue.add("work", {})
            deadline = time.monotonic() + renewals_s(LOCK_MS)
            while not runs:
                assert time.monotonic() < deadline, "the worker never took the job"
                await asyncio.sleep(SAMPLE_S)
            with LockSampler(new, KEYS.lock(str(job.id)), "") as on_new:
                _asked, demoted = await asyncio.to_thread(_fail_over, sentinels)
                # The job's lock renewed on the new primary once the old one was demoted
                # (before its copy there could run out: a loaded machine may take long).
                await asyncio.to_thread(
                    wait_for,
                    lambda: on_new.refreshes(since=demoted),
                    2 * renewals_s(LOCK_MS),
                    "a renewal on the new primary",
                )
            assert not [sample for sample in on_new.samples() if sample.pttl < 0], (
                "the job's lock went missing on the new primary"
            )
            switched.set()
            deadline = time.monotonic() + renewals_s(LOCK_MS)
            state = ""
            while state != "completed" and time.monotonic() < deadline:
                await asyncio.sleep(SAMPLE_S)
                # Its connection may still be the demoted primary's, killed at the switch.
                with contextlib.suppress(redis.ConnectionError):
                    state = str(await queue.getJobState(str(job.id)))
            return state
        finally:
            await queue.close()
            # Bounded, and by force if bullmq's own close hangs (see close_worker).
            hung = await close_worker(worker, running)
            await sentinels.aclose_async_clients()
            assert not hung, "\n".join(hung)

    state = asyncio.run(scenario())
    assert runs == ["1"]
    assert aborted == [False]
    assert state == "completed"
    assert "cannot run off the loop" not in caplog.text
