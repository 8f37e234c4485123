"""The chaos run: ``python -m tests.chaos.run`` (``CHAOS_SECONDS``, default 600; ``CHAOS_SEED``).

A private server, one fault proxy per worker, four workers (``thread``,
``process``: ``actors`` managers with pykka job actors and leases; ``bullmq``:
bullmq-py with ``use_actor_lock_manager``; ``node``: BullMQ for Node.js, where
``node`` is on PATH), each its own OS process; a producer keeps the queue fed
and a :class:`~tests.chaos.nemesis.Nemesis` faults them. Then every fault is
healed, the queue drained, the workers stopped, and the history checked
(:mod:`tests.chaos.checker`). Prints a table; exits 1 on any nonzero count.

With ``CHAOS_REPLICATED=1`` the server is a Sentinel-managed primary and
replica (:mod:`tests.chaos.replicated`): the workers reach it through the
sentinels, and the ``actors`` workers (``thread``, ``process``, ``bullmq``)
have each renewal, take, fence and guarded write confirmed by the replica
(``replicas=``). The Node.js worker has no such option and is left out; so
are the per-worker partitions (a Sentinel URL names the sentinels, not a
proxy) and the faults of the one server: the nemesis kills and pauses workers,
fails the primary over, cuts the replica's link and restarts it empty. The
producer, the drain and the final reads follow the current primary.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from bullmq import Queue

from actors.embedded import EmbeddedServer
from tests.chaos import store
from tests.chaos.checker import Verdict, check
from tests.chaos.history import History, now, read_history
from tests.chaos.jobs import MAX_STEP_MS, plan
from tests.chaos.nemesis import KINDS, REPLICATED_KINDS, Nemesis
from tests.chaos.replicated import Replicated
from tests.faults.proxy import FaultProxy
from tests.interop import node_packages
from tests.interop.peers import NODE_DIR
from tests.support.server import default_engine

__all__ = ["Settings", "main", "report", "run"]

ROOT = Path(__file__).resolve().parents[2]
QUEUE = "chaos"
#: The workers: base name -> kind (an ``actors`` isolation mode, ``"bullmq"`` or ``"node"``).
WORKERS = {"thread": "thread", "process": "process", "bullmq": "bullmq", "node": "node"}
#: The Node.js worker's script.
NODE_WORKER = Path(__file__).resolve().parent / "node_worker.mjs"


def workers(*, replicated: bool = False) -> dict[str, str]:
    """The workers of this machine's run: the Node.js one only where ``node`` is on PATH.

    A replicated run has no Node.js worker: BullMQ for Node.js cannot have a
    replica confirm its renewals.
    """
    if replicated or shutil.which("node") is None:
        return {base: kind for base, kind in WORKERS.items() if kind != "node"}
    return dict(WORKERS)


@dataclass(frozen=True)
class Settings:
    """One run's settings; every wait of the run is derived from them."""

    seconds: float
    seed: int
    #: The lock TTL of every worker, in milliseconds.
    lock_ms: int = 5000
    #: BullMQ's stalled-check interval, in milliseconds.
    stalled_ms: int = 1000
    #: The ``actors`` managers' ``safety_margin``, in milliseconds.
    safety_margin_ms: int = 1500
    #: Jobs each worker holds at once.
    concurrency: int = 3
    #: The longest job's work, in milliseconds.
    longest_ms: int = 3000
    #: A Sentinel-managed primary and replica instead of one server (``CHAOS_REPLICATED``).
    replicated: bool = False
    #: In a replicated run, how long the primary waits for the replica to confirm a
    #: write (``WAIT``), in milliseconds: at most half of what a renewal may wait per
    #: attempt (781 ms with a 5 s lock) and half the workers' 1 s socket timeout.
    replica_wait_ms: int = 400

    @property
    def kinds(self) -> dict[str, int]:
        """The nemesis's kinds of fault, with their weights."""
        return REPLICATED_KINDS if self.replicated else KINDS

    @property
    def grace_ms(self) -> int:
        """After a pause, how long a run may take to read that its lock is gone.

        Two steps of the job (it reads its mailbox between steps) and one
        renewal interval (a tick may be under way at the resume).
        """
        return 2 * MAX_STEP_MS + self.lock_ms // 4

    @property
    def drain_s(self) -> float:
        """Longest wait for the queue to empty once the faults are healed.

        A job may wait out a lock TTL and two stalled checks, and run three
        attempts (two designed failures), behind a backlog of one job per slot.
        """
        one = (self.longest_ms + self.lock_ms + 2 * self.stalled_ms) / 1000
        return 3 * one * 3 + 10


@dataclass
class Worker:
    """One worker's current process."""

    base: str
    kind: str
    incarnation: str
    process: subprocess.Popen[bytes]
    killing: bool = False


@dataclass
class Runner:
    """Everything one run owns; :meth:`run` does it all."""

    settings: Settings
    folder: Path
    proxies: dict[str, FaultProxy] = field(default_factory=dict)
    workers: dict[str, Worker] = field(default_factory=dict)
    #: Each job added: its id and ``timestamp`` (a restart empty hands out ids again).
    added: list[tuple[str, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for sub in ("history", "control", "logs"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        s = self.settings
        self.kinds = workers(replicated=s.replicated)
        self.store = self.folder / "fenced.sqlite"
        store.create(self.store)
        self.history = History(self.folder / "history" / "runner.jsonl")
        self.server: EmbeddedServer | None = None
        self.replicated: Replicated | None = None
        if s.replicated:
            self.replicated = Replicated(s.seconds + s.drain_s)
        else:
            self.server = EmbeddedServer(default_engine())
        self._guard = threading.Lock()
        self._serial = 0
        self._done = threading.Event()

    # -- what the nemesis acts on ----------------------------------------

    def pid(self, base: str) -> int | None:
        with self._guard:
            worker = self.workers.get(base)
            if worker is None or worker.process.poll() is not None:
                return None
            ready = (self.folder / "control" / f"{worker.incarnation}.ready").exists()
            return worker.process.pid if ready else None

    def kill_and_restart(self, base: str, delay_s: float) -> tuple[str, int, int] | None:
        with self._guard:
            worker = self.workers[base]
            worker.killing = True
        killed = now()
        worker.process.send_signal(signal.SIGKILL)
        worker.process.wait()
        time.sleep(delay_s)
        self.spawn(base)
        return worker.incarnation, killed, now()

    def server_pid(self) -> int:
        assert self.server is not None
        pid = self.server.pid
        assert pid is not None
        return pid

    def control(self) -> Path:
        return self.folder / "control"

    # -- workers ---------------------------------------------------------

    def spawn(self, base: str) -> None:
        """Start (or restart) the worker ``base`` as a new incarnation."""
        with self._guard:
            self._serial += 1
            incarnation = f"{base}#{self._serial}"
        s = self.settings
        options = {
            "kind": self.kinds[base],
            "worker": incarnation,
            "base": base,
            "url": self.url(base),
            "replica_wait_ms": s.replica_wait_ms if s.replicated else 0,
            "queue": QUEUE,
            "history": str(self.folder / "history" / f"{incarnation}.jsonl"),
            "control": str(self.folder / "control"),
            "lock_ms": s.lock_ms,
            "stalled_ms": s.stalled_ms,
            "safety_margin_ms": s.safety_margin_ms,
            "concurrency": s.concurrency,
            "store": str(self.store),
            "node_dir": str(NODE_DIR),
        }
        if self.kinds[base] == "node":
            node = shutil.which("node") or "node"
            command = [node, str(NODE_WORKER), json.dumps(options)]
        else:
            command = [sys.executable, "-m", "tests.chaos.worker", json.dumps(options)]
        log = (self.folder / "logs" / f"{incarnation}.log").open("wb")
        process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        with self._guard:
            self.workers[base] = Worker(base, self.kinds[base], incarnation, process)

    def url(self, base: str) -> str:
        """The URL the worker ``base`` reaches the server by: its proxy, or the sentinels."""
        if self.replicated is not None:
            return self.replicated.url
        return self.proxies[base].url

    def _supervise(self) -> None:
        """Restart a worker that exited on its own, and record the exit."""
        while not self._done.wait(0.1):
            with self._guard:
                exited = [
                    w
                    for w in self.workers.values()
                    if not w.killing and w.process.poll() is not None
                ]
            for worker in exited:
                self.history.write(kind="exit", worker=worker.incarnation, t=now())
                self.spawn(worker.base)

    # -- the queue -------------------------------------------------------

    def _produce(self, direct: redis.Redis, until: float) -> None:
        rng = random.Random(self.settings.seed + 1)
        backlog = 2 * self.settings.concurrency * len(self.kinds)

        async def produce() -> None:
            sentinels = self.replicated.sentinels if self.replicated is not None else None
            if sentinels is not None:
                connection: Any = sentinels.async_client(decode_responses=True, socket_timeout=5)
            else:
                assert self.server is not None
                connection = self.server.url
            queue = Queue(QUEUE, {"connection": connection, "prefix": "bull"})

            async def waiting() -> int:
                # Through the client that adds: in a failover, another client may read
                # the old primary while the adds go to the new one (or the other way).
                if sentinels is not None:
                    return int(await connection.llen(f"bull:{QUEUE}:wait"))
                return int(direct.llen(f"bull:{QUEUE}:wait"))

            try:
                while time.monotonic() < until:
                    try:
                        if await waiting() >= backlog:
                            await asyncio.sleep(0.05)
                            continue
                        data = plan(rng, self.settings.longest_ms)
                        sent = now()
                        job = await queue.add("chaos", data, {"attempts": 1000})
                    except (redis.RedisError, OSError):
                        await asyncio.sleep(0.1)  # the server is being restarted
                        continue
                    self.added.append((str(job.id), int(job.timestamp)))
                    self.history.write(
                        kind="job",
                        event="added",
                        job=str(job.id),
                        created=int(job.timestamp),
                        sent=sent,
                        t=now(),
                    )
            finally:
                await queue.close()
                if sentinels is not None:
                    await sentinels.aclose_async_clients()

        asyncio.run(produce())

    def _state(self, direct: redis.Redis, job: str, created: int) -> str:
        base = f"bull:{QUEUE}"
        if direct.hget(f"{base}:{job}", "timestamp") != str(created):
            return "wiped"  # by a restart: the id is another job's now, or nobody's
        for state in ("completed", "failed", "delayed", "prioritized"):
            if direct.zscore(f"{base}:{state}", job) is not None:
                return state
        for state in ("active", "wait", "paused"):
            if direct.lpos(f"{base}:{state}", job) is not None:
                return state
        return "missing"

    # -- the run ---------------------------------------------------------

    def run(self) -> Verdict:
        """Run the chaos, drain, stop everything, and check the history."""
        s = self.settings
        self.history.write(
            kind="config",
            seed=s.seed,
            seconds=s.seconds,
            lock_ms=s.lock_ms,
            grace_ms=s.grace_ms,
            stalled_ms=s.stalled_ms,
            safety_margin_ms=s.safety_margin_ms,
            concurrency=s.concurrency,
            replicated=s.replicated,
            replica_wait_ms=s.replica_wait_ms if s.replicated else 0,
            t=now(),
        )
        if "node" in self.kinds.values():
            node_packages.ensure()
        direct = self._start_server()
        supervisor = threading.Thread(target=self._supervise, name="supervisor", daemon=True)
        try:
            for base in self.kinds:
                if self.server is not None:
                    self.proxies[base] = FaultProxy(self.server.host, self.server.port).start()
                self.spawn(base)
            supervisor.start()
            until = time.monotonic() + s.seconds
            producer = threading.Thread(
                target=self._produce, args=(direct, until), name="producer", daemon=True
            )
            producer.start()
            nemesis = Nemesis(s.seed, self, self.history, s.lock_ms, self.kinds, s.kinds)
            nemesis.start()
            producer.join()
            nemesis.stop()
            self._drain(direct)
            if self.replicated is not None:
                # One per failover fault, unless a sentinel failed the primary over unasked.
                self.history.write(kind="note", what="switches", count=self.replicated.switches())
            for job, created in self.added:
                self.history.write(
                    kind="job",
                    event="final",
                    job=job,
                    created=created,
                    state=self._state(direct, job, created),
                    t=now(),
                )
        finally:
            self._stop_workers(supervisor)
            for proxy in self.proxies.values():
                proxy.close()
            direct.close()
            if self.server is not None:
                self.server.stop()
            if self.replicated is not None:
                self.replicated.close()
            self.history.close()
        return check(read_history(self.folder / "history"))

    def _start_server(self) -> redis.Redis:
        """Start the server (or the replicated set); return a client of the (current) primary."""
        if self.replicated is not None:
            self.replicated.start()
            return self.replicated.client(socket_timeout=30, decode_responses=True)
        assert self.server is not None
        self.server.start()
        return redis.Redis.from_url(self.server.url, socket_timeout=30, decode_responses=True)

    def _drain(self, direct: redis.Redis) -> None:
        deadline = time.monotonic() + self.settings.drain_s
        while time.monotonic() < deadline:
            if not self._left(direct):
                return
            time.sleep(0.1)

    def _left(self, direct: redis.Redis) -> int:
        """How many jobs the server still has to run (any that a restart did not wipe)."""
        base = f"bull:{QUEUE}"
        try:
            return sum(
                int(direct.llen(f"{base}:{state}")) for state in ("wait", "active", "paused")
            ) + sum(int(direct.zcard(f"{base}:{state}")) for state in ("delayed", "prioritized"))
        except redis.RedisError:
            return 1

    def restart_server(self, down_s: float) -> tuple[int, int]:
        """Kill the server, start it again empty ``down_s`` later: (killed, answering)."""
        assert self.server is not None
        killed = now()
        self.server.kill()
        time.sleep(down_s)
        self.server.start()
        return killed, now()

    def fail_over(self, lag_s: float = 0.0) -> dict[str, Any]:
        """Fail the primary over to the replica: see :meth:`Replicated.fail_over`."""
        assert self.replicated is not None
        return self.replicated.fail_over(lag_s)

    def cut_link(self, seconds: float) -> dict[str, Any]:
        """Cut the replica's link for ``seconds``: see :meth:`Replicated.cut_link`."""
        assert self.replicated is not None
        return self.replicated.cut_link(seconds)

    def restart_replica(self, down_s: float) -> dict[str, Any]:
        """Restart the replica empty: see :meth:`Replicated.restart_replica`."""
        assert self.replicated is not None
        return self.replicated.restart_replica(down_s)

    def _stop_workers(self, supervisor: threading.Thread) -> None:
        self._done.set()
        if supervisor.is_alive():
            supervisor.join()
        for base in self.kinds:
            (self.folder / "control" / f"{base}.stop").touch()
        deadline = time.monotonic() + 4 * self.settings.lock_ms / 1000 + 10
        for worker in self.workers.values():
            try:
                worker.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()


def run(settings: Settings, folder: Path | None = None) -> Verdict:
    """Run the chaos with ``settings`` (in ``folder``, else a temporary one) and check it."""
    if folder is not None:
        return Runner(settings, folder).run()
    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
        return Runner(settings, Path(tmp)).run()


def report(
    verdict: Verdict, seconds: float, *, shown: int = 3, kinds: dict[str, int] | None = None
) -> str:
    """The run's table, then (on failure) the seed and the shortest window of each finding.

    ``kinds``: the run's kinds of fault (:data:`KINDS` by default).
    """
    rows: list[tuple[str, object]] = [
        ("seed", verdict.seed),
        ("seconds of faults", f"{seconds:g}"),
        ("jobs", verdict.jobs),
        ("runs", verdict.runs),
        ("runs told of a loss (or refused a move)", verdict.losses),
        ("writes (fenced and guarded)", verdict.writes),
        ("jobs wiped by a restart of the server (not counted)", verdict.wiped),
        *(
            [
                ("jobs whose adding a failover undid (not counted)", verdict.undone_adds),
                ("completions a failover undid (not counted)", verdict.undone_completions),
                ("runs after a completion no failover explains", len(verdict.reruns)),
                ("failovers the nemesis did not ask for", verdict.unasked_failovers),
            ]
            if kinds == REPLICATED_KINDS
            else []
        ),
        ("worker exits nobody caused", verdict.unexpected_exits),
        ("overlaps a Node.js run was left in (not counted)", len(verdict.peer_overlaps)),
    ]
    rows += [(f"faults: {kind}", verdict.faults.get(kind, 0)) for kind in (kinds or KINDS)]
    rows += list(verdict.counts.items())
    lines = ["| | |", "|---|---:|", *(f"| {name} | {value} |" for name, value in rows)]
    for finding in verdict.reruns[:shown] if kinds == REPLICATED_KINDS else []:
        lines.append(f"\nrun after a completion: {finding.what}")
        lines += [f"    {json.dumps(record)}" for record in finding.window]
    if not verdict.ok:
        lines.append(f"\nFAILED with CHAOS_SEED={verdict.seed}")
        for title, findings in (
            ("overlaps", verdict.overlaps),
            ("unexplained losses", verdict.unexplained_losses),
            ("unfinished jobs", verdict.unfinished),
            ("stale writes accepted", verdict.stale_writes),
        ):
            for finding in findings[:shown]:
                lines.append(f"\n{title}: {finding.what}")
                lines += [f"    {json.dumps(record)}" for record in finding.window]
    return "\n".join(lines)


def main() -> int:
    """Run with ``CHAOS_SECONDS``, ``CHAOS_SEED``, ``CHAOS_REPLICATED``; 1 on failure.

    ``CHAOS_DIR`` keeps the run's files (a temporary folder otherwise).
    """
    seconds = float(os.environ.get("CHAOS_SECONDS", "600"))
    seed = int(os.environ.get("CHAOS_SEED", str(random.SystemRandom().randrange(2**32))))
    folder = os.environ.get("CHAOS_DIR")
    replicated = os.environ.get("CHAOS_REPLICATED", "") not in ("", "0")
    settings = Settings(seconds, seed, replicated=replicated)
    with contextlib.suppress(KeyboardInterrupt):
        verdict = run(settings, Path(folder) if folder else None)
        print(report(verdict, seconds, kinds=settings.kinds))
        # A run after a completion no failover undid is a job done twice: a failure here.
        return 0 if verdict.ok and not (replicated and verdict.reruns) else 1
    return 130


if __name__ == "__main__":
    sys.exit(main())
