"""One chaos worker, a process of its own: ``python -m tests.chaos.worker SETTINGS_JSON``.

Three kinds share the queue (a fourth, BullMQ for Node.js, is ``node_worker.mjs``):

- ``"thread"`` and ``"process"``: an ``actors`` manager in that isolation mode
  renews the locks; a bullmq-py ``Worker`` without autorun takes jobs by hand
  (``getNextJob``) and runs BullMQ's stalled check; each job is a pykka actor
  tracked with a ``notify`` target that forwards to its mailbox, working one step
  per message, told ``LockLost``, or (a job planned ``lease``) a thread holding a
  :func:`actors.lease`, checking it between steps;
- ``"bullmq"``: a running bullmq-py ``Worker`` at ``concurrency`` > 1 with
  ``use_actor_lock_manager``; its processor reads ``signal.aborted`` between steps.

Each run takes a fence once started, and writes its result to both stores of
:mod:`tests.chaos.store` before its move. Each run's ``started`` (with
``taken``: the job's ``processedOn``, when its fetch was sent) / ``lost`` /
``finished`` and each write goes to the worker's history file.

In a replicated run (a Sentinel URL and ``replica_wait_ms``), the replica
confirms each renewal, fence and guarded write (``replicas=``), and each take:
the ``bullmq`` worker's through the integration, the others' by a fence taken
before the run starts (replication keeps the order of writes, so a confirmed
fence vouches for the take before it). A run whose take, fence or guarded
write is unconfirmed gives the job up, as if told its lock was lost.

SIGUSR1 holds the GIL in C code (a backtracking ``re`` match) for the
seconds written in ``CONTROL/BASE.gil``, and records that fault; the worker
stops once ``CONTROL/BASE.stop`` exists and its jobs are done.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import faulthandler
import json
import logging
import os
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pykka
import redis
import redis.asyncio
import redis.asyncio.sentinel
from bullmq import Worker
from redis.backoff import NoBackoff
from redis.retry import Retry

import actors
from actors import (
    LockLost,
    NotReplicatedError,
    QueueKeys,
    Replicas,
    lease,
    start_link,
    stop,
    track_job,
    untrack_job,
)
from actors.bullmq import use_actor_lock_manager
from actors.bullmq.runs import monotonic_from_wall
from actors.connection import client_for_url, parse_sentinel_url
from tests.bullmq.burn import backtrack, size_for
from tests.chaos.history import History, now
from tests.chaos.jobs import MAX_STEP_MS, busy
from tests.chaos.store import write_fenced, write_guarded, write_guarded_async

if TYPE_CHECKING:
    from types import FrameType

    from actors import ManagerRef

PREFIX = "bull"
#: How long the event loop may run one run's code before :func:`watch_loop` records a hold, in s.
HELD_S = 0.25


def created(job: Any) -> int:
    """The job's ``timestamp``: with its id, it names one job across a server's restart."""
    return int(job.timestamp)


def gone(error: LockLost | LookupError) -> str:
    """Why a run learned its lock or its job is gone: a loss's reason, or a job no more."""
    return error.reason if isinstance(error, LockLost) else "job gone"


class Designed(Exception):
    """An attempt that fails on purpose; its message is the run's token."""


class Abandoned(Exception):
    """A run that was told its lock is lost and stopped; its message is the run's token."""


class Context:
    """What every run of one worker shares."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = settings
        self.worker = str(settings["worker"])
        self.base = str(settings["base"])
        self.history = History(Path(settings["history"]))
        self.control = Path(settings["control"])
        self.lock_ms = int(settings["lock_ms"])
        self.inflight: set[str] = set()
        #: Each run's attempt number, and the runs already ended, by (job, token).
        self.attempts: dict[tuple[str, str], int] = {}
        self.ended: set[tuple[str, str]] = set()
        #: When each bullmq run handed its job back (its processor returned), in ns.
        self.sent: dict[tuple[str, str], int] = {}
        self.guard = threading.Lock()
        self.loop: asyncio.AbstractEventLoop | None = None
        #: When the event loop last ran its heartbeat (monotonic s): see :func:`watch_loop`.
        self.beat = time.monotonic()
        self.keys = QueueKeys(str(settings["queue"]), prefix=PREFIX)
        self.store = Path(settings["store"])
        wait_ms = int(settings.get("replica_wait_ms", 0))
        #: What confirms each renewal, take and write of a replicated run; ``None`` otherwise.
        self.replicas = Replicas(1, timeout=wait_ms) if wait_ms else None
        self.sentinel = parse_sentinel_url(str(settings["url"]))
        self.client: redis.Redis
        if self.sentinel is not None:
            # Bounded as the proxied one is; it asks the sentinels at each connect.
            self.client = client_for_url(str(settings["url"]), timeout=1)
        else:
            #: Through the worker's proxy, bounded: a partition fails a call, never hangs it.
            self.client = redis.Redis.from_url(
                settings["url"],
                socket_timeout=1,
                socket_connect_timeout=1,
                retry=Retry(NoBackoff(), 0),
            )

    def fields(self, job: Any, token: str) -> dict[str, Any]:
        """What every record of the run ``token`` of ``job`` names."""
        with self.guard:
            attempt = self.attempts.get((str(job.id), token), 0)
        return {
            "attempt": attempt,
            "worker": self.worker,
            "base": self.base,
            "created": created(job),
        }

    def write(self, job: Any, token: str, fence: int | None) -> str | None:
        """Write the run's result to both stores; why not, if one refused it (lock lost).

        Without a fence (the server could not be reached) only the guarded
        write is tried; a fault that fails a write skips it. A guarded write
        the replica did not confirm refuses the result: a failover may undo it.
        """
        run, job_id = self.fields(job, token), str(job.id)
        try:
            if not write_guarded(
                self.client, self.keys, self.history, run, job_id, token, replicas=self.replicas
            ):
                return "write refused"
        except NotReplicatedError:
            return "write unconfirmed"
        except redis.RedisError:
            pass
        row = f"{job_id}:{created(job)}"
        if fence is None or write_fenced(
            self.store, self.history, run, job_id, token, fence, row=row
        ):
            return None
        return "write refused"

    def record(
        self, event: str, job: Any, token: str, *, t: int | None = None, **more: Any
    ) -> None:
        """Append one event of the run ``token`` of ``job``.

        A run ends once, at its first end; a completion is recorded even after
        a loss (a move sent before the news can still land). ``t`` defaults to now.
        """
        run = (str(job.id), token)
        with self.guard:
            if event == "started":
                self.attempts[run] = int(job.attemptsMade) + 1
                processed = getattr(job, "processedOn", None)
                if processed:
                    more["taken"] = int(processed) * 1_000_000
            elif run in self.ended and more.get("outcome") != "completed":
                return
            else:
                self.ended.add(run)
            attempt = self.attempts.get(run, 0)
        self.history.write(
            kind="run",
            event=event,
            job=str(job.id),
            attempt=attempt,
            token=token,
            worker=self.worker,
            base=self.base,
            created=created(job),
            t=now() if t is None else t,
            **more,
        )

    def ready(self) -> None:
        """Tell the nemesis this worker is up: its manager started, its signals handled."""
        (self.control / f"{self.worker}.ready").touch()

    @property
    def stopping(self) -> bool:
        return (self.control / f"{self.base}.stop").exists()

    def connection(self, **options: Any) -> Any:
        """What bullmq connects with: the URL, or a client of the primary the sentinels name."""
        if self.sentinel is None:
            return self.settings["url"]
        sentinels = redis.asyncio.sentinel.Sentinel(
            self.sentinel.sentinels,
            sentinel_kwargs={"socket_timeout": 0.5, "socket_connect_timeout": 0.5},
        )
        return sentinels.master_for(self.sentinel.service, socket_connect_timeout=1, **options)

    def options(self, **more: Any) -> dict[str, Any]:
        return {
            # Replies wait for at most a blocking fetch (bullmq's 5 s drain delay).
            "connection": self.connection(decode_responses=True, socket_timeout=15),
            "prefix": PREFIX,
            "autorun": False,
            "lockDuration": self.lock_ms,
            "stalledInterval": int(self.settings["stalled_ms"]),
            # A job lost to a fault goes back to wait however often: none fails for stalling.
            "maxStalledCount": 1_000_000,
            **more,
        }

    def hold_gil(self, _signum: int, _frame: FrameType | None) -> None:
        """Hold the GIL in C code for the seconds the nemesis wrote; record the fault."""
        seconds = float((self.control / f"{self.base}.gil").read_text())
        start = now()
        backtrack(size_for(seconds))
        self.history.write(kind="fault", fault="gil", target=self.base, start=start, end=now())


class Told:
    """A job actor's ``notify`` target: the run ends when it is told, then its actor hears it.

    A run is in hand until it is told of a loss; the actor reads the news
    between its steps (a step may be a call to a server that does not answer).
    Once the run's move is sent, the move's answer ends the run instead: the
    move deletes the lock itself (a renewal may see it gone before the run is
    untracked), and is refused if the lock is not the run's.
    """

    def __init__(self, ctx: Context, job: Any, token: str, ref: pykka.ActorRef[Any]) -> None:
        self.ctx, self.job, self.token, self.ref = ctx, job, token, ref
        #: Set by the actor before it sends the move.
        self.moving = False

    def tell(self, message: Any) -> None:
        if isinstance(message, LockLost) and not self.moving:
            self.ctx.record("lost", self.job, self.token, reason=message.reason)
        with contextlib.suppress(pykka.ActorDeadError):
            self.ref.tell(message)

    def is_alive(self) -> bool:
        return self.ref.is_alive()


@dataclass(frozen=True)
class Moved:
    """bullmq answered the move a run sent at ``sent`` (ns); ``error`` if it refused it."""

    sent: int
    failing: bool
    error: BaseException | None


class JobRun(pykka.ThreadingActor):
    """One run of one job: a step per message until done, or told its lock is lost.

    Its last act is sending bullmq's move: the run is in hand until then, and
    the history stamps the move's outcome with that moment (a retried job may
    be taken by another worker before the answer comes back).
    """

    def __init__(
        self,
        ctx: Context,
        manager: ManagerRef,
        job: Any,
        token: str,
        taken_ms: int,
        fence: int | None = None,
    ) -> None:
        super().__init__()
        self.ctx, self.manager, self.job, self.token = ctx, manager, job, token
        self.taken_ms = taken_ms
        self.left = int(job.data["steps"])
        self.over = self.moving = False
        self.fence = fence
        self.told = Told(ctx, job, token, self.actor_ref)

    def on_start(self) -> None:
        # Stamped with the time the fetch was sent: the lock is no older than that.
        track_job(self.manager, str(self.job.id), self.token, ts=self.taken_ms, notify=self.told)
        self.ctx.record("started", self.job, self.token)
        self.actor_ref.tell("step")

    def take_fence(self) -> bool:
        """Take the run's fence if it has none yet; ``False`` if the lock is not the run's."""
        if self.fence is None:
            try:
                self.fence = actors.fence(
                    self.ctx.client,
                    self.ctx.keys,
                    str(self.job.id),
                    self.token,
                    replicas=self.ctx.replicas,
                )
            except (LockLost, LookupError) as lost:
                self.ctx.record("lost", self.job, self.token, reason=f"fence: {gone(lost)}")
                self.end()
                return False
            except redis.RedisError:  # unconfirmed too: that number is not used
                pass  # a fault in the way: the next step tries again
        return True

    def on_receive(self, message: Any) -> None:
        if self.over:
            return
        if isinstance(message, LockLost):
            if not self.moving:  # else the move's answer ends the run (see Told)
                self.ctx.record("lost", self.job, self.token, reason=message.reason)
                self.end()
        elif isinstance(message, Moved):
            if message.error is not None:
                reason = f"move refused: {type(message.error).__name__}"
                self.ctx.record(
                    "lost", self.job, self.token, t=message.sent, seen=now(), reason=reason
                )
            else:
                outcome = "failed" if message.failing else "completed"
                self.ctx.record(
                    "finished", self.job, self.token, t=message.sent, seen=now(), outcome=outcome
                )
            self.end()
        elif self.moving or not self.take_fence():
            return
        elif self.left > 0:
            seconds = int(self.job.data["step_ms"]) / 1000
            busy(seconds) if self.job.data["busy"] else time.sleep(seconds)
            self.left -= 1
            self.actor_ref.tell("step")
        else:
            self.finish()

    def finish(self) -> None:
        job, token, ctx = self.job, self.token, self.ctx
        failing = int(job.attemptsMade) < int(job.data["fail_first"])
        refused = None if failing else ctx.write(job, token, self.fence)
        if refused is not None:
            ctx.record("lost", job, token, reason=refused)
            self.end()
            return
        move = (
            job.moveToFailed(Designed(token), token, False)
            if failing
            else job.moveToCompleted(token, token, False)
        )
        assert ctx.loop is not None
        self.moving = self.told.moving = True
        sent = now()
        future = asyncio.run_coroutine_threadsafe(move, ctx.loop)
        ref = self.actor_ref

        def answered(done: concurrent.futures.Future[Any]) -> None:
            with contextlib.suppress(pykka.ActorDeadError):
                ref.tell(Moved(sent, failing, done.exception()))

        future.add_done_callback(answered)

    def end(self) -> None:
        self.over = True
        untrack_job(self.manager, str(self.job.id), notify=self.told)
        with self.ctx.guard:
            self.ctx.inflight.discard(self.token)
        self.stop()

    def on_failure(self, *_: object) -> None:
        # pykka stopped the actor (logged with its traceback): the run ends, its slot is free.
        self.ctx.record("lost", self.job, self.token, reason="job actor crashed")
        with contextlib.suppress(Exception):
            untrack_job(self.manager, str(self.job.id), notify=self.told)
        with self.ctx.guard:
            self.ctx.inflight.discard(self.token)


def run_leased(
    ctx: Context,
    manager: ManagerRef,
    job: Any,
    token: str,
    taken_ms: int,
    fence: int | None = None,
) -> None:
    """One run of one job on a thread of its own, holding a lease and checking it between steps.

    Its last act is sending bullmq's move, as :class:`JobRun`'s.
    """
    job_id, steps = str(job.id), int(job.data["steps"])
    seconds = int(job.data["step_ms"]) / 1000
    try:
        with lease(manager, job_id, token, ts=taken_ms) as held:
            ctx.record("started", job, token)
            for _ in range(steps):
                held.check()
                if fence is None:
                    with contextlib.suppress(redis.RedisError):  # a fault: try at the next step
                        fence = held.fence
                busy(seconds) if job.data["busy"] else time.sleep(seconds)
            held.check()
            failing = int(job.attemptsMade) < int(job.data["fail_first"])
            refused = None if failing else ctx.write(job, token, fence)
            if refused is not None:
                ctx.record("lost", job, token, reason=refused)
                return
            move = (
                job.moveToFailed(Designed(token), token, False)
                if failing
                else job.moveToCompleted(token, token, False)
            )
            assert ctx.loop is not None
            sent = now()
            try:
                asyncio.run_coroutine_threadsafe(move, ctx.loop).result()
            except Exception as error:
                reason = f"move refused: {type(error).__name__}"
                ctx.record("lost", job, token, t=sent, seen=now(), reason=reason)
            else:
                outcome = "failed" if failing else "completed"
                ctx.record("finished", job, token, t=sent, seen=now(), outcome=outcome)
    except (LockLost, LookupError) as lost:
        ctx.record("lost", job, token, reason=gone(lost))
    finally:
        with ctx.guard:
            ctx.inflight.discard(token)


async def run_actor_worker(ctx: Context, isolation: str) -> None:
    """Take jobs by hand and run each as a :class:`JobRun` on a manager of ``isolation``."""
    settings = ctx.settings
    manager = start_link(
        connection=settings["url"],
        keys=QueueKeys(settings["queue"], prefix=PREFIX),
        lock_duration=ctx.lock_ms,
        safety_margin=int(settings["safety_margin_ms"]),
        isolation=isolation,
        replicas=ctx.replicas,
    )
    worker = Worker(settings["queue"], None, ctx.options())
    concurrency = int(settings["concurrency"])

    async def check_stalled() -> None:
        while True:
            await asyncio.sleep(int(settings["stalled_ms"]) / 1000)
            with contextlib.suppress(Exception):
                await worker.runStalledJobsCheck()

    checker = asyncio.ensure_future(check_stalled())
    ctx.ready()
    serial = 0
    while not ctx.stopping:
        with ctx.guard:
            busy_slots = len(ctx.inflight)
        if busy_slots >= concurrency:
            await asyncio.sleep(0.02)
            continue
        serial += 1
        token = f"{ctx.worker}:{serial}:{uuid.uuid4().hex[:8]}"
        sent_ms = time.monotonic_ns() // 1_000_000
        try:
            job = await asyncio.wait_for(worker.getNextJob(token), 2 * ctx.lock_ms / 1000)
        except Exception:  # a fault in the way: try again
            await asyncio.sleep(0.1)
            continue
        if job is None:
            continue
        # The lock was taken once a job came (the fetch may wait for one first):
        # its ``processedOn`` is the take's send, on the wall clock.
        taken_ms = monotonic_from_wall(int(job.processedOn)) if job.processedOn else sent_ms
        ctx.history.write(kind="note", what="fetched", job=str(job.id), token=token, t=now())
        fence: int | None = None
        if ctx.replicas is not None:
            confirmed = await asyncio.to_thread(confirm_take, ctx, job, token)
            if isinstance(confirmed, str):
                told_before_it_started(ctx, job, token, confirmed)
                continue  # the lock is left to expire
            fence = confirmed
        with ctx.guard:
            ctx.inflight.add(token)
        if job.data.get("lease"):
            args = (ctx, manager, job, token, taken_ms, fence)
            threading.Thread(target=run_leased, args=args, name=f"lease-{job.id}").start()
        else:
            JobRun.start(ctx, manager, job, token, taken_ms, fence)
    await drain(ctx)
    checker.cancel()
    stop(manager)


def told_before_it_started(ctx: Context, job: Any, token: str, reason: str) -> None:
    """Record a run told of its loss before it ran anything: it held the job for no time.

    An unconfirmed take, or a take whose lock had gone by the time the run
    could start, as the integration's runs are told (``signal.aborted`` at
    the first look).
    """
    at = now()
    ctx.record("started", job, token, t=at)
    ctx.record("lost", job, token, t=at, reason=reason)


def confirm_take(ctx: Context, job: Any, token: str) -> int | str:
    """Confirm a take by hand: the run's fence, once the replica confirmed it; else why not.

    A take the replica did not confirm may be undone by a failover, which
    would hand the job to another worker at once. The fence is written after
    the take on the same primary, so its confirmation covers the take. A fault
    that fails the call is tried again for a quarter of the lock's TTL.
    """
    deadline = time.monotonic() + ctx.lock_ms / 4000
    while True:
        try:
            return actors.fence(ctx.client, ctx.keys, str(job.id), token, replicas=ctx.replicas)
        except NotReplicatedError as error:
            return f"take unconfirmed: {error}"[:160]
        except (LockLost, LookupError) as lost:
            return f"take: {gone(lost)}"
        except redis.RedisError as error:
            if time.monotonic() > deadline:
                return f"take unconfirmed: {type(error).__name__}"
            time.sleep(0.05)


async def run_bullmq_worker(ctx: Context) -> None:
    """A running bullmq-py worker whose locks ``use_actor_lock_manager`` renews."""
    settings = ctx.settings

    aclient = (
        ctx.connection(socket_timeout=1)
        if ctx.sentinel is not None
        else redis.asyncio.Redis.from_url(
            settings["url"], socket_timeout=1, socket_connect_timeout=1
        )
    )
    #: A fence waits for a step and, in a replicated run, the replica's confirmation.
    fence_s = (MAX_STEP_MS + (ctx.replicas.wait_ms if ctx.replicas else 0)) / 1000

    def read_signal(job: Any, token: str, abort: Any) -> None:
        """Give the run up if its signal reads aborted (the lock is, or may be, lost)."""
        if abort.aborted:
            ctx.record("lost", job, token, reason=str(abort.reason))
            raise Abandoned(token)

    async def write(job: Any, token: str, run: dict[str, Any], fence: int | None) -> str | None:
        """:meth:`Context.write` through the asyncio client."""
        job_id = str(job.id)
        try:
            if not await write_guarded_async(
                aclient, ctx.keys, ctx.history, run, job_id, token, replicas=ctx.replicas
            ):
                return "write refused"
        except NotReplicatedError:
            return "write unconfirmed"
        except redis.RedisError:
            pass  # a fault in the way: the write is skipped
        row = f"{job_id}:{created(job)}"
        if fence is not None and not write_fenced(
            ctx.store, ctx.history, run, job_id, token, fence, row=row
        ):
            return "write refused"
        return None

    async def process(job: Any, token: str, abort: Any) -> str:
        if abort.aborted:
            told_before_it_started(ctx, job, token, str(abort.reason))
            raise Abandoned(token)
        ctx.record("started", job, token)
        with ctx.guard:
            ctx.inflight.add(token)
        job_id, run, fence = str(job.id), ctx.fields(job, token), None
        try:
            for _ in range(int(job.data["steps"])):
                read_signal(job, token, abort)
                if fence is None:
                    try:
                        # Bounded as a step is: a fault can hold the call for seconds,
                        # and the job reads its signal between steps.
                        fence = await asyncio.wait_for(
                            actors.fence(aclient, ctx.keys, job_id, token, replicas=ctx.replicas),
                            fence_s,
                        )
                    except (LockLost, LookupError) as lost:
                        ctx.record("lost", job, token, reason=f"fence: {gone(lost)}")
                        raise Abandoned(token) from None
                    except (redis.RedisError, asyncio.TimeoutError):
                        pass  # a fault in the way, or unconfirmed: the next step tries again
                seconds = int(job.data["step_ms"]) / 1000
                if job.data["busy"]:
                    busy(seconds)  # blocks the event loop
                else:
                    await asyncio.sleep(seconds)
            read_signal(job, token, abort)
            failing = int(job.attemptsMade) < int(job.data["fail_first"])
            refused = None if failing else await write(job, token, run, fence)
            if refused is not None:
                ctx.record("lost", job, token, reason=refused)
                raise Abandoned(token)
            with ctx.guard:
                ctx.sent[(job_id, token)] = now()
            if failing:
                raise Designed(token)
            return token
        finally:
            with ctx.guard:
                ctx.inflight.discard(token)

    worker = Worker(
        settings["queue"], process, ctx.options(concurrency=int(settings["concurrency"]))
    )
    if ctx.sentinel is not None:
        # The worker's client is Sentinel-managed: the manager renews through the URL.
        use_actor_lock_manager(worker, connection=settings["url"], replicas=ctx.replicas)
    else:
        use_actor_lock_manager(worker)

    def sent(job: Any, token: str) -> int | None:
        # The processor's last act: bullmq sends the move right after it returns.
        with ctx.guard:
            return ctx.sent.get((str(job.id), token))

    def completed(job: Any, result: Any, *_: Any) -> None:
        token = str(result)
        ctx.record("finished", job, token, t=sent(job, token), seen=now(), outcome="completed")

    def failed(job: Any, error: Any, *_: Any) -> None:
        if isinstance(error, Designed):
            token = str(error)
            ctx.record("finished", job, token, t=sent(job, token), seen=now(), outcome="failed")

    def errored(error: Any, job: Any = None, *_: Any) -> None:
        # bullmq could not move a job it ran: the lock was not its own any more.
        if job is not None and getattr(job, "token", None):
            token = str(job.token)
            reason = f"move refused: {error}"[:120]
            ctx.record("lost", job, token, t=sent(job, token), seen=now(), reason=reason)

    worker.on("completed", completed)
    worker.on("failed", failed)
    worker.on("error", errored)
    running = asyncio.ensure_future(worker.run())
    ctx.ready()
    while not ctx.stopping:
        await asyncio.sleep(0.05)
    await drain(ctx)
    running.cancel()


async def drain(ctx: Context) -> None:
    """Wait for the runs in hand to end (the runner stops workers once every job is done)."""
    deadline = time.monotonic() + 4 * ctx.lock_ms / 1000
    while time.monotonic() < deadline:
        with ctx.guard:
            if not ctx.inflight:
                return
        await asyncio.sleep(0.05)


def watch(ctx: Context) -> None:
    """Dump every thread's stack to the log once if a run is held for over 12 s (jobs take 3)."""
    seen: dict[str, float] = {}
    while True:
        time.sleep(1)
        with ctx.guard:
            held = set(ctx.inflight)
        seen = {token: seen.get(token, time.monotonic()) for token in held}
        if any(time.monotonic() - since > 12 for since in seen.values()):
            faulthandler.dump_traceback(all_threads=True)
            return


def watch_loop(ctx: Context, loop_thread: int) -> None:
    """Record each time one run held the event loop a while (a ``"hold"`` record).

    A busy step blocks the loop, and a busy job takes its steps one after the
    other without yielding: meanwhile no other run of the worker can read its
    signal. The record names the run that held the loop (``holder``).
    """
    since: float | None = None
    holder: str | None = None
    while True:
        time.sleep(0.02)
        at = time.monotonic()
        if at - ctx.beat < HELD_S:
            if since is not None and holder is not None:
                end = now() - int((at - ctx.beat) * 1e9)
                start = end - int((ctx.beat - since) * 1e9)
                ctx.history.write(
                    kind="hold", target=ctx.base, holder=holder, start=start, end=end, t=end
                )
            since = holder = None
        elif since is None:
            since, holder = ctx.beat, running(loop_thread)


def running(thread: int) -> str | None:
    """The token of the run whose processor the thread is in, if any."""
    frame = sys._current_frames().get(thread)
    while frame is not None:
        # The bullmq worker's processor, ``process`` in :func:`run_bullmq_worker`.
        if frame.f_code.co_name == "process" and frame.f_globals is globals():
            token = frame.f_locals.get("token")
            return str(token) if token is not None else None
        frame = frame.f_back
    return None


async def beat(ctx: Context) -> None:
    """Show :func:`watch_loop` the loop is running."""
    while True:
        ctx.beat = time.monotonic()
        await asyncio.sleep(0.05)


def main(settings: dict[str, Any]) -> None:
    """Run one worker until told to stop, then leave at once."""
    # The manager's warnings and errors, and any crash, go to the worker's log.
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(threadName)s %(name)s %(message)s"
    )
    ctx = Context(settings)
    signal.signal(signal.SIGUSR1, ctx.hold_gil)
    threading.Thread(target=watch, args=(ctx,), name="watchdog", daemon=True).start()

    async def run() -> None:
        ctx.loop = asyncio.get_running_loop()
        beating = asyncio.ensure_future(beat(ctx))
        if settings["kind"] == "bullmq":  # the one kind whose runs share the loop
            args = (ctx, threading.get_ident())
            threading.Thread(target=watch_loop, args=args, name="loop-watch", daemon=True).start()
        try:
            if settings["kind"] == "bullmq":
                await run_bullmq_worker(ctx)
            else:
                await run_actor_worker(ctx, str(settings["kind"]))
        finally:
            beating.cancel()

    with contextlib.suppress(asyncio.CancelledError):
        asyncio.run(run())
    ctx.history.close()
    sys.stdout.flush()
    # Connections and threads may hang on a closed server: the history is written, leave.
    os._exit(0)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
