"""BullMQ's own runtimes as test peers, behind one small synchronous interface.

:class:`PythonPeer` drives the PyPI ``bullmq`` package (asyncio) on an event
loop of its own thread; :class:`NodePeer` drives the npm ``bullmq`` package
through ``node/peer.mjs``, one JSON line per request and per reply. Both take
jobs by hand with a token (a worker without autorun, as BullMQ's "manually
fetching jobs" pattern does) and run BullMQ's own stalled-jobs check, so a
scenario reads the same whichever peer it runs against.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from bullmq import Queue, Worker, __version__

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Iterable

    import redis

    from actors import QueueKeys

#: Where the Node.js peer, its package.json and its lock file live.
NODE_DIR = Path(__file__).resolve().parent / "node"

#: Every peer in these tests uses BullMQ's default key prefix.
PREFIX = "bull"

#: The lock TTL of every holder (BullMQ's ``lockDuration``), in milliseconds.
LOCK_MS = 1000

#: Longest time between two renewals, in milliseconds: a third of the TTL, so
#: a renewal may come up to two thirds of a second late on a starved CI runner
#: before a lock expires.
RENEW_MS = LOCK_MS // 3

#: BullMQ's ``stalledInterval``, in milliseconds: the check takes a throttle
#: key with this TTL, so a second check within it does nothing.
STALLED_INTERVAL_MS = 250

#: How long the holding phases run the stalled check: over three lock TTLs.
HOLD_S = 3.5 * LOCK_MS / 1000

#: Upper bound for a lost lock to be found by a running checker: its TTL plus
#: two checks (one marks the job, the next moves it), with a wide margin.
RECOVER_S = 3 * LOCK_MS / 1000 + 10

#: Upper bound for one request to a peer.
REQUEST_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Held:
    """A job a peer took by hand: its id and the token its lock holds."""

    id: str
    token: str


class Peer(Protocol):
    """What a scenario needs from one BullMQ runtime."""

    #: ``"bullmq-py 3.4.4"``, ``"bullmq (Node.js) 6.7.0"``.
    label: str

    def add(self, count: int, *, job_id: str | None = None) -> list[str]:
        """Add ``count`` jobs with ``Queue.add`` (id ``job_id``, if given); return their ids."""
        ...

    def fetch(self, count: int) -> list[Held]:
        """Take up to ``count`` waiting jobs with ``getNextJob(token)``."""
        ...

    def check(self) -> list[str]:
        """Run BullMQ's stalled-jobs check once; return the ids it reported stalled."""
        ...

    def states(self, ids: Iterable[str]) -> dict[str, str]:
        """Return BullMQ's ``getJobState`` of each id."""
        ...

    def close(self) -> None:
        """Release the peer's connections (and process)."""
        ...


class PythonPeer:
    """The PyPI ``bullmq`` package: a ``Queue`` and a ``Worker`` without autorun.

    bullmq-py is asyncio while the lock manager is threads, so the peer runs
    its own event loop on a thread and each method waits for one coroutine.
    """

    def __init__(self, url: str, queue_name: str) -> None:
        self.label = f"bullmq-py {__version__}"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="bullmq-py-loop", daemon=True
        )
        self._thread.start()
        self._stalled: list[str] | None = None
        self._errors: list[Exception] = []
        self._postfix = 0
        self._queue: Any = None
        self._worker: Any = None
        try:
            self._run(self._open(url, queue_name))
        except BaseException:
            self.close()
            raise

    def _run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(REQUEST_TIMEOUT_S)

    async def _open(self, url: str, queue_name: str) -> None:
        self._queue = Queue(queue_name, {"connection": url, "prefix": PREFIX})
        # No processor and no autorun: bullmq's own lock manager and stalled
        # checker never start, so only our manager can keep these jobs alive.
        self._worker = Worker(
            queue_name,
            None,
            {
                "connection": url,
                "prefix": PREFIX,
                "autorun": False,
                "lockDuration": LOCK_MS,
                "stalledInterval": STALLED_INTERVAL_MS,
                "maxStalledCount": 1,
            },
        )
        self._worker.on("stalled", self._on_stalled)
        self._worker.on("error", self._errors.append)

    def _on_stalled(self, job_id: str, *_: object) -> None:
        if self._stalled is not None:
            self._stalled.append(str(job_id))

    def add(self, count: int, *, job_id: str | None = None) -> list[str]:
        options = {} if job_id is None else {"jobId": job_id}

        async def add() -> list[str]:
            added = [await self._queue.add("interop", {"n": n}, options) for n in range(count)]
            return [str(job.id) for job in added]

        ids: list[str] = self._run(add())
        return ids

    def fetch(self, count: int) -> list[Held]:
        async def fetch() -> list[Held]:
            held = []
            for _ in range(count):
                # bullmq-py's run loop spells its tokens `{worker.id}:{n}`.
                self._postfix += 1
                token = f"{self._worker.id}:{self._postfix}"
                job = await self._worker.getNextJob(token)
                if job is None:
                    break
                held.append(Held(str(job.id), token))
            return held

        jobs: list[Held] = self._run(fetch())
        return jobs

    def check(self) -> list[str]:
        async def check() -> list[str]:
            self._stalled = []
            try:
                await self._worker.runStalledJobsCheck()
                return self._stalled
            finally:
                self._stalled = None

        stalled: list[str] = self._run(check())
        if self._errors:
            # runStalledJobsCheck only emits its failures: make them fail the test.
            raise self._errors[0]
        return stalled

    def states(self, ids: Iterable[str]) -> dict[str, str]:
        async def states() -> dict[str, str]:
            return {job_id: str(await self._queue.getJobState(job_id)) for job_id in ids}

        found: dict[str, str] = self._run(states())
        return found

    def close(self) -> None:
        async def close() -> None:
            if self._worker is not None:
                await self._worker.close()
            if self._queue is not None:
                await self._queue.close()

        if self._loop.is_running():
            with contextlib.suppress(Exception):
                self._run(close())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(REQUEST_TIMEOUT_S)
        if not self._loop.is_running() and not self._loop.is_closed():
            self._loop.close()


@dataclass
class _NodeOutput:
    """What the Node.js process wrote, sorted by the reader thread."""

    replies: queue.Queue[dict[str, Any]] = field(default_factory=queue.Queue)
    events: list[dict[str, Any]] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)


class NodePeer:
    """The npm ``bullmq`` package, driven through ``node/peer.mjs``.

    Args:
        node: The ``node`` executable.
        url: The server's URL.
        queue_name: The queue's name.
        stderr_path: Where the process's stderr goes, for failure messages.
    """

    def __init__(self, node: str, url: str, queue_name: str, stderr_path: Path) -> None:
        self._stderr_path = stderr_path
        self._stderr = stderr_path.open("wb")
        self._process = subprocess.Popen(
            [
                node,
                str(NODE_DIR / "peer.mjs"),
                url,
                queue_name,
                str(LOCK_MS),
                str(STALLED_INTERVAL_MS),
                str(RENEW_MS),
            ],
            cwd=NODE_DIR,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
        )
        self._output = _NodeOutput()
        self._seq = 0
        self._reader = threading.Thread(target=self._read, name="bullmq-node-reader", daemon=True)
        self._reader.start()
        try:
            ready = self.wait_event(lambda event: event.get("event") == "ready", REQUEST_TIMEOUT_S)
        except BaseException:
            self.kill()
            self.close()
            raise
        self.version = str(ready["version"])
        self.label = f"bullmq (Node.js) {self.version}"

    def _read(self) -> None:
        stdout = self._process.stdout
        assert stdout is not None
        for raw in stdout:
            try:
                message = json.loads(raw)
            except ValueError:
                message = None
            if not isinstance(message, dict):
                # Something else wrote to stdout (a console.log): keep it for failure messages.
                message = {"event": "garbage", "line": raw.decode(errors="replace")}
            if "seq" in message:
                self._output.replies.put(message)
            else:
                with self._output.changed:
                    self._output.events.append(message)
                    self._output.changed.notify_all()
        with self._output.changed:
            self._output.events.append({"event": "eof"})
            self._output.changed.notify_all()

    def stderr_tail(self) -> str:
        """The end of the process's stderr."""
        return self._stderr_path.read_text(errors="replace")[-3000:]

    def request(self, op: str, **args: object) -> dict[str, Any]:
        """Send one request and wait for its reply.

        Raises:
            AssertionError: The peer answered with an error, died or did not
                answer in time.
        """
        self._seq += 1
        stdin = self._process.stdin
        assert stdin is not None
        stdin.write((json.dumps({"seq": self._seq, "op": op, **args}) + "\n").encode())
        stdin.flush()
        deadline = time.monotonic() + REQUEST_TIMEOUT_S
        while True:
            try:
                reply = self._output.replies.get(timeout=max(deadline - time.monotonic(), 0))
            except queue.Empty:
                raise AssertionError(
                    f"Node.js peer did not answer {op!r} within {REQUEST_TIMEOUT_S}s; "
                    f"stderr:\n{self.stderr_tail()}"
                ) from None
            if reply["seq"] == self._seq:
                break
        if not reply.get("ok"):
            raise AssertionError(f"Node.js peer failed {op!r}: {reply.get('error')}")
        return reply

    def events(self, kind: str) -> list[dict[str, Any]]:
        """The events of one kind so far (``"active"``, ``"stalled"``, ``"error"``)."""
        with self._output.changed:
            return [event for event in self._output.events if event.get("event") == kind]

    def wait_event(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float
    ) -> dict[str, Any]:
        """Wait for the first event (seen or to come) that satisfies ``predicate``."""
        deadline = time.monotonic() + timeout
        with self._output.changed:
            while True:
                for event in self._output.events:
                    if predicate(event):
                        return event
                    if event.get("event") == "eof":
                        raise AssertionError(
                            f"Node.js peer exited (code {self._process.poll()}); "
                            f"stderr:\n{self.stderr_tail()}"
                        )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(
                        f"Node.js peer: no awaited event within {timeout}s; "
                        f"events: {self._output.events[-10:]}; stderr:\n{self.stderr_tail()}"
                    )
                self._output.changed.wait(remaining)

    def add(self, count: int, *, job_id: str | None = None) -> list[str]:
        ids = self.request("add", count=count, jobId=job_id)["ids"]
        return [str(added) for added in ids]

    def fetch(self, count: int) -> list[Held]:
        jobs = self.request("fetch", count=count)["jobs"]
        return [Held(str(job["id"]), str(job["token"])) for job in jobs]

    def check(self) -> list[str]:
        return [str(job_id) for job_id in self.request("check")["stalled"]]

    def states(self, ids: Iterable[str]) -> dict[str, str]:
        states: dict[str, str] = self.request("states", ids=list(ids))["states"]
        return states

    def hold(self, concurrency: int) -> str:
        """Start a running BullMQ worker that holds up to ``concurrency`` jobs.

        It renews their locks with its own lock manager and runs its own
        stalled checker; each job it takes is reported as an ``"active"``
        event. Returns the worker's id.
        """
        return str(self.request("hold", concurrency=concurrency)["workerId"])

    def kill(self) -> None:
        """Kill the process at once (SIGKILL): nothing is released or renewed again."""
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGKILL)
        self._process.wait(REQUEST_TIMEOUT_S)

    def close(self) -> None:
        if self._process.poll() is None:
            stdin = self._process.stdin
            with contextlib.suppress(OSError):
                if stdin is not None:
                    stdin.close()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        self._reader.join(REQUEST_TIMEOUT_S)
        self._stderr.close()


# -- the stalled check, run the way BullMQ's timer runs it -----------------


def stalled_check_key(keys: QueueKeys) -> str:
    """BullMQ's throttle key: while it lives, a stalled check does nothing."""
    return keys.base + ":stalled-check"


def stall_count(client: redis.Redis, keys: QueueKeys, job_id: str) -> int:
    """How many times BullMQ's checks moved the job back to wait (its hash's ``stc``)."""
    count = client.hget(f"{keys.key_prefix}{job_id}", "stc")
    return int(count) if count is not None else 0


@dataclass
class Checks:
    """The stalled checks a scenario ran and what they reported."""

    #: Monotonic time of each check that found the throttle key free.
    ran_at: list[float] = field(default_factory=list)
    #: Every id reported stalled, in order; a job reported twice shows twice.
    stalled: list[str] = field(default_factory=list)

    def ran_after(self, moment: float) -> int:
        """How many effective checks started after ``moment`` (monotonic seconds)."""
        return sum(1 for at in self.ran_at if at > moment)


def check_once(checker: Peer, client: redis.Redis, keys: QueueKeys, checks: Checks) -> None:
    """Run one stalled check as soon as BullMQ's throttle lets it do its work.

    The throttle key lives ``STALLED_INTERVAL_MS``; waiting for it to go makes
    each call a full check (mark the active jobs, move the unlocked marked
    ones) instead of a no-op. Another runtime's checker may take the window
    first: the call then still runs, counted only if the key was free.
    """
    key = stalled_check_key(keys)
    deadline = time.monotonic() + 4 * STALLED_INTERVAL_MS / 1000
    free = False
    while time.monotonic() < deadline:
        if not client.exists(key):
            free = True
            break
        time.sleep(0.01)
    started = time.monotonic()
    checks.stalled.extend(checker.check())
    if free:
        checks.ran_at.append(started)


def check_for(
    checker: Peer,
    client: redis.Redis,
    keys: QueueKeys,
    seconds: float,
    *,
    until_stalled: Iterable[str] = (),
) -> Checks:
    """Run the stalled check back to back for ``seconds``.

    With ``until_stalled``, go on past ``seconds`` until each of those ids was
    reported stalled, for at most :data:`RECOVER_S` more.

    Raises:
        AssertionError: Some of ``until_stalled`` were not reported in time.
    """
    wanted = set(until_stalled)
    checks = Checks()
    started = time.monotonic()
    while time.monotonic() - started < seconds or not wanted <= set(checks.stalled):
        if time.monotonic() - started > seconds + RECOVER_S:
            raise AssertionError(
                f"{checker.label}: {sorted(wanted - set(checks.stalled))} not reported stalled "
                f"within {seconds + RECOVER_S:.1f}s ({len(checks.ran_at)} checks ran, "
                f"reported {checks.stalled})"
            )
        check_once(checker, client, keys, checks)
    return checks


def check_until_stalled(
    checker: Peer, client: redis.Redis, keys: QueueKeys, ids: Iterable[str]
) -> Checks:
    """Run the stalled check until each id in ``ids`` was reported stalled.

    Raises:
        AssertionError: Some were not reported within :data:`RECOVER_S` seconds.
    """
    return check_for(checker, client, keys, 0, until_stalled=ids)
