"""bullmq-py workers on event loops of their own threads, and what the tests observe of them.

Each worker gets its own loop on its own thread and its own connections, as
separate processes would have; the test's thread drives them, watches the
lock key with a client of its own, and reads the job's hash as BullMQ wrote it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import redis
from bullmq import Queue, Worker

from actors.bullmq import ActorLockManager, use_actor_lock_manager

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

T = TypeVar("T")

#: BullMQ's default key prefix, which every worker here uses.
PREFIX = "bull"

#: Longest wait for one request to a worker's loop, in seconds.
REQUEST_S = 30.0


class LoopThread:
    """An asyncio event loop running on a thread of its own."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, make: Callable[[], Awaitable[T]], timeout: float = REQUEST_S) -> T:
        """Run ``make()`` on the loop and return its result."""

        async def run() -> T:
            return await make()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout)

    def close(self) -> None:
        """Stop the loop, end its thread and close it."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(REQUEST_S)
        self.loop.close()


@dataclass(frozen=True)
class Event:
    """One event a worker emitted, with the monotonic time it was seen."""

    at: float
    name: str
    args: tuple[Any, ...]


class WorkerEvents:
    """Records a worker's events as they are emitted, for any thread to wait on."""

    def __init__(self) -> None:
        self._events: list[Event] = []
        self._changed = threading.Condition()

    def listen(self, worker: Any, *names: str) -> None:
        """Record each of ``names`` that ``worker`` emits."""
        for name in names:
            worker.on(name, functools.partial(self._add, name))

    def _add(self, name: str, *args: Any) -> None:
        with self._changed:
            self._events.append(Event(time.monotonic(), name, args))
            self._changed.notify_all()

    def of(self, name: str) -> list[Event]:
        """The events named ``name`` so far."""
        with self._changed:
            return [event for event in self._events if event.name == name]

    def wait(self, name: str, predicate: Callable[[Event], bool], timeout: float) -> Event:
        """Wait for an event named ``name`` that satisfies ``predicate``; fail after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for event in self._events:
                    if event.name == name and predicate(event):
                        return event
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {name!r} event within {timeout:.1f}s")
                self._changed.wait(left)


#: The events a worker's lock manager emits, and the job outcomes.
EVENTS = ("lockRenewalFailed", "locksRenewed", "error", "stalled", "completed", "failed")


@dataclass
class RunningWorker:
    """A bullmq ``Worker`` running on its own loop thread."""

    worker: Any
    loop: LoopThread
    task: asyncio.Future[Any]
    events: WorkerEvents
    lock_manager: ActorLockManager | None

    def busy(self) -> bool:
        """Whether the worker is still inside ``processJob`` for some job."""

        async def busy() -> bool:
            return bool(self.worker.jobs)

        return self.loop.call(busy)

    def close(self) -> None:
        """Close the worker, wait for its run loop to end, then stop its loop thread.

        A close that hangs fails the test with the stack of every task on the
        worker's loop, after the worker is closed by force and every task is
        cancelled: nothing of it (a client, a task) outlives the test to fail
        the next one.
        """
        hung: list[str] = []

        async def close() -> None:
            hung.extend(await close_worker(self.worker, self.task))

        try:
            if not self.loop.loop.is_closed():
                self.loop.call(close, timeout=3 * CLOSE_S)
        finally:
            self.loop.close()
        if hung:
            raise AssertionError(
                f"worker.close() did not return within {CLOSE_S:.0f}s; its loop's tasks:\n"
                + "\n".join(hung)
            )


#: Longest wait for a worker's graceful close, in seconds.
CLOSE_S = 20.0


#: The coroutines of a bullmq worker that is closing while idle: its close, its
#: run loop (waiting for its jobs' ends), its stalled-check timer, a stock
#: worker's own lock renewal loop, and its fetch waiting in BZPOPMIN.
_BULLMQ_IDLE_WAIT = frozenset(
    {
        "Worker.close",
        "Worker.close.<locals>.teardown",
        "Worker.run",
        "Worker.getCompleted",
        "LockManager._renewal_loop",
        "Timer._job",
        "Worker.retryIfFailed",
        "Worker.getNextJob",
        "Worker.waitForJob",
    }
)


def _stuck_coroutines() -> set[str]:
    """The qualified names of the coroutines of every other task on the running loop."""
    return {
        getattr(other.get_coro(), "__qualname__", "?")
        for other in asyncio.all_tasks()
        if other is not asyncio.current_task()
    }


def _task_stacks() -> list[str]:
    """The stack of every other task on the running loop, for a hang's report."""
    stacks = []
    for other in asyncio.all_tasks():
        if other is not asyncio.current_task():
            stacks.append(f"{other!r}\n" + "".join(_awaiting(other.get_coro())))
    return stacks


def _awaiting(coro: Any) -> list[str]:
    """Every frame a suspended coroutine waits in, outermost first: where it hangs."""
    lines = []
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            lines.append(
                f"  {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}\n"
            )
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return lines


async def close_worker(worker: Any, task: asyncio.Future[Any]) -> list[str]:
    """Close ``worker``, wait for its ``run()`` task; return the stacks of a close that hung.

    A close stuck only where bullmq-py 3.4's idle close waits on its own
    blocking BZPOPMIN, whose cancellation does not finish (upstream:
    taskforcesh/bullmq#4597, #4670), is bullmq's: the worker is closed by
    force, recorded, and nothing is returned. Any other hang returns the stacks.
    """
    hung: list[str] = []
    try:
        await asyncio.wait_for(asyncio.shield(worker.close()), CLOSE_S)
    except asyncio.TimeoutError:
        stacks = _task_stacks()
        stuck = _stuck_coroutines()
        await _force_close(worker)
        if not stuck <= _BULLMQ_IDLE_WAIT:
            hung.extend(stacks)
        else:
            OUTCOMES.add("bullmq idle close forced", waited_s=CLOSE_S, tasks=sorted(stuck))
    # Leave no run() behind on a loop about to close, whatever happened.
    try:
        await asyncio.wait_for(asyncio.shield(task), CLOSE_S)
    except BaseException:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise
    return hung


async def _force_close(worker: Any) -> None:
    """Close ``worker`` by force, cancel every other task and close its connections."""
    with contextlib.suppress(BaseException):
        await asyncio.wait_for(worker.close(force=True), CLOSE_S)
    others = [other for other in asyncio.all_tasks() if other is not asyncio.current_task()]
    for other in others:
        other.cancel()
    await asyncio.gather(*others, return_exceptions=True)
    with contextlib.suppress(BaseException):
        await worker.backend.close(force=True)


#: The script of a worker in a process of its own.
PEER = Path(__file__).with_name("peer.py")
#: Its exit code when its worker's close hung elsewhere than in bullmq's own idle wait.
HUNG = 3


class PeerWorker:
    """A bullmq ``Worker`` in a process of its own, traced through Redis (see ``peer.py``)."""

    def __init__(self, bench: Bench, name: str, opts: dict[str, Any]) -> None:
        self._bench = bench
        self.name = name
        self.process = subprocess.Popen(
            [sys.executable, str(PEER), bench.url, bench.queue, name, json.dumps(opts)]
        )
        wait_until(
            lambda: bench.client.exists(bench.key("peer-ready", name)) or self.process.poll(),
            REQUEST_S,
            f"worker {name}'s process to start",
        )
        assert self.process.poll() is None, f"worker {name}'s process ended"

    def runs(self) -> list[tuple[str, str, float]]:
        """Every run of a job in this process: its name, the token and the monotonic start."""
        runs = []
        for entry in self._bench.client.lrange(self._bench.key("peer-runs"), 0, -1):
            name, token, started = str(entry).rsplit("|", 2)
            if name == self.name:
                runs.append((name, token, float(started)))
        return runs

    def reads(self) -> list[tuple[str, bool, str]]:
        """What each ``stop_at_start`` run's first look at its signal read.

        Each as its token, whether the signal read aborted, and its reason.
        """
        reads = []
        for entry in self._bench.client.lrange(self._bench.key("peer-reads"), 0, -1):
            name, token, aborted, reason = str(entry).split("|", 3)
            if name == self.name:
                reads.append((token, aborted == "True", reason))
        return reads

    def stopped(self) -> bool:
        """Whether the process has stopped (SIGSTOP) since the last look; it is not reaped.

        Raises:
            AssertionError: The process ended.
        """
        pid, status = os.waitpid(self.process.pid, os.WNOHANG | os.WUNTRACED)
        assert pid == 0 or os.WIFSTOPPED(status), f"worker {self.name}'s process ended"
        return pid != 0

    def stalled_ids(self) -> list[str]:
        """The ids its ``stalled`` events named."""
        return [str(i) for i in self._bench.client.lrange(self._bench.key("peer-stalled"), 0, -1)]

    def close(self) -> None:
        """Tell the process to close its worker, and wait for it to end."""
        self._bench.client.set(self._bench.key("peer-stop", self.name), "1")
        try:
            # Its close may wait twice for bullmq (the close, then its run: see close_worker).
            self.process.wait(2 * CLOSE_S + REQUEST_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise
        assert self.process.returncode != HUNG, f"worker {self.name}'s close hung (stacks above)"


@dataclass
class Bench:
    """One queue on one server, and the workers and loops a test starts on it."""

    url: str
    engine: str
    queue: str = field(default_factory=lambda: f"q{uuid.uuid4().hex[:8]}")
    client: redis.Redis = field(init=False)
    _workers: list[RunningWorker | PeerWorker] = field(default_factory=list)
    _control: LoopThread | None = None

    def __post_init__(self) -> None:
        self.client = redis.Redis.from_url(self.url, socket_timeout=10, decode_responses=True)

    def key(self, *parts: str) -> str:
        """``bull:{queue}:{parts...}``."""
        return ":".join((PREFIX, self.queue, *parts))

    def start_worker(
        self,
        name: str,
        processor: Callable[..., Awaitable[Any]] | None,
        opts: dict[str, Any],
        *,
        actor: bool,
        connection: Any = None,
        connection_for_renewal: Any = None,
        isolation: str = "thread",
        replicas: int | None = None,
    ) -> RunningWorker:
        """Create a worker on a new loop thread, install our manager if ``actor``, and run it.

        ``connection`` is the worker's own; ``connection_for_renewal`` the
        manager's, when it is not to be built from the worker's; ``isolation``
        and ``replicas`` the manager's.
        """
        loop = LoopThread(f"bullmq-{name}")
        events = WorkerEvents()

        async def start() -> tuple[Any, asyncio.Future[Any], ActorLockManager | None]:
            options = {"connection": self.url, "prefix": PREFIX, **opts, "autorun": False}
            if connection is not None:
                options["connection"] = connection
            worker = Worker(self.queue, processor, options)
            installed = (
                use_actor_lock_manager(
                    worker,
                    connection=connection_for_renewal,
                    isolation=isolation,
                    replicas=replicas,
                )
                if actor
                else None
            )
            events.listen(worker, *EVENTS)
            task = asyncio.ensure_future(worker.run())
            return worker, task, installed

        try:
            worker, task, installed = loop.call(start)
        except BaseException:
            loop.close()
            raise
        running = RunningWorker(worker, loop, task, events, installed)
        self._workers.append(running)
        return running

    def start_peer(self, name: str, opts: dict[str, Any]) -> PeerWorker:
        """Run a stock bullmq worker (no processor of the test's) in a process of its own."""
        peer = PeerWorker(self, name, opts)
        self._workers.append(peer)
        return peer

    def peers(self) -> list[PeerWorker]:
        """The workers this bench runs in processes of their own."""
        return [worker for worker in self._workers if isinstance(worker, PeerWorker)]

    def control(self) -> LoopThread:
        """The loop thread that adds jobs and asks the queue."""
        if self._control is None:
            self._control = LoopThread("bullmq-control")
        return self._control

    def add_job(
        self, data: dict[str, Any] | None = None, opts: dict[str, Any] | None = None
    ) -> str:
        """Add one job with bullmq's ``Queue.add`` (and its job options); return its id."""

        async def add() -> str:
            queue = Queue(self.queue, {"connection": self.url, "prefix": PREFIX})
            try:
                job = await queue.add("work", data or {}, opts or {})
                return str(job.id)
            finally:
                await queue.close()

        return self.control().call(add)

    def job(self, job_id: str) -> dict[str, str]:
        """The job's hash, as BullMQ wrote it."""
        return {str(k): str(v) for k, v in self.client.hgetall(self.key(job_id)).items()}

    def close(self) -> None:
        """Close every worker and loop this bench started, and the client."""
        errors: list[BaseException] = []
        for running in reversed(self._workers):
            try:
                running.close()
            except BaseException as error:
                errors.append(error)
        if self._control is not None:
            self._control.close()
        self.client.close()
        if errors:
            raise errors[0]


@dataclass(frozen=True)
class Sample:
    """The lock key as the test's own client saw it."""

    at: float
    pttl: int
    value: str | None
    check: str | None


def sample_lock(
    client: redis.Redis,
    lock_key: str,
    check_key: str,
    until: threading.Event,
    timeout: float,
    every: float = 0.005,
) -> list[Sample]:
    """Read the lock's PTTL and value (and the stalled check's stamp) until ``until`` is set.

    Raises:
        AssertionError: ``until`` was not set within ``timeout`` seconds.
    """
    samples = []
    deadline = time.monotonic() + timeout
    while not until.is_set():
        if time.monotonic() > deadline:
            raise AssertionError(f"the processor did not finish within {timeout:.1f}s")
        pipe = client.pipeline(transaction=False)
        pipe.pttl(lock_key)
        pipe.get(lock_key)
        pipe.get(check_key)
        pttl, value, check = pipe.execute()
        samples.append(Sample(time.monotonic(), int(pttl), value, check))
        time.sleep(every)
    return samples


def longest_gap_ms(samples: list[Sample], token: str) -> float:
    """The longest stretch, in ms, over which the lock did not hold ``token``."""
    longest = 0.0
    since: float | None = None
    for sample in samples:
        held = sample.value == token and sample.pttl > 0
        if not held and since is None:
            since = sample.at
        elif held and since is not None:
            longest = max(longest, (sample.at - since) * 1000)
            since = None
    if since is not None:
        longest = max(longest, (samples[-1].at - since) * 1000)
    return longest


def wait_until(predicate: Callable[[], object], timeout: float, what: str) -> None:
    """Poll ``predicate`` until it is truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.1f}s waiting for {what}")
        time.sleep(0.01)


def spin(seconds: float) -> None:
    """Burn CPU in pure Python for ``seconds``: the GIL is released every switch interval."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


#: The ways a processor blocks its loop, by name.
BLOCKERS: dict[str, Callable[[float], None]] = {"sleep": time.sleep, "cpu": spin}


class Outcomes:
    """Rows of the summary tables the tier prints at the end of the run."""

    def __init__(self) -> None:
        self.tables: dict[str, list[dict[str, object]]] = {}

    def add(self, table: str, **row: object) -> None:
        """Add a row to ``table``."""
        self.tables.setdefault(table, []).append(row)


#: Filled by the tests, printed by ``conftest.pytest_terminal_summary``.
OUTCOMES = Outcomes()
