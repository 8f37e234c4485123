"""Where an asked tick's time goes, stage by stage, against the server's own time.

A diagnosis beside ``make bench``, not a target: it wraps the manager's
internal steps to stamp the moment each is reached, so its figures carry
that small cost too. Run it on a quiet machine::

    .venv/bin/python -m tests.bench.timeline --jobs 10000 --rounds 21
    .venv/bin/python -m tests.bench.timeline --jobs 10000 --isolation process
    .venv/bin/python -m tests.bench.timeline --jobs 10000 --pin

Each round renews every lock once through the manager (an ``ExtendLocks``
ask, every job due) and once through the floor (the same calls packed
beforehand, one write); both in a random order, each after every lock is set
again. A stage's time is counted from the ask, its median over the rounds is
printed, and the ratios are per round, as in ``make bench``. In process mode
the child's own stages are not seen: its tick runs between the word sent and
the word read back.

``--pin`` puts the server on the first CPU and this process (and the child)
on the second, so the kernel never runs the server and the renewing thread
on one CPU while the other idles: what the scheduler's placement costs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import time
from typing import TYPE_CHECKING, Any

import redis

import actors.lock_manager as manager_module
import actors.process.parent as parent_module
from actors.embedded import EmbeddedServer
from actors.scripts import script_source
from tests.bench import test_bench as bench
from tests.bench.conftest import ASK_TIMEOUT, SEED

if TYPE_CHECKING:
    from collections.abc import Iterator


class Stamps:
    """The moment each stage was first reached in the current round."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}

    def first(self, stage: str) -> None:
        self.at.setdefault(stage, time.perf_counter())

    def last(self, stage: str) -> None:
        self.at[stage] = time.perf_counter()


@contextlib.contextmanager
def stamped(stamps: Stamps) -> Iterator[None]:
    """Wrap the steps of a tick so that each stamps its stage; undone on exit."""
    patches: list[tuple[Any, str, Any]] = []

    def wrap(
        owner: Any, name: str, before: str | None, after: str | None = None, *, once: bool = False
    ) -> None:
        original = owner.__dict__[name]  # wrapped again: the first wrapper

        def stamping(*args: Any, **kwargs: Any) -> Any:
            if before is not None:
                stamps.first(before)
            result = original(*args, **kwargs)
            if after is not None:
                (stamps.first if once else stamps.last)(after)
            return result

        patches.append((owner, name, original))
        setattr(owner, name, stamping)
        handlers = getattr(owner, "_handlers", {})
        for kind, handler in list(handlers.items()):
            if handler is original:
                patches.append((handlers, kind, original))
                handlers[kind] = stamping

    lm, pp, connection = manager_module.LockManager, parent_module, bench.CountingConnection
    wrap(lm, "_on_extend", "1 the manager takes the message")
    wrap(manager_module.Renewals, "send", "2 the batch is handed to the renewal thread")
    wrap(manager_module.Renewals, "_renew", "3 the renewal thread runs")
    wrap(connection, "send_packed_command", None, "4 the first call is sent", once=True)
    wrap(connection, "send_packed_command", None, "4 the last call is sent")
    wrap(connection, "read_response", None, "5 a reply is read (the last)")
    wrap(lm, "_on_landed", "6 the answer is back in the manager")
    wrap(pp.ProcessLockManager, "_on_extend", "1 the manager takes the message")
    wrap(pp.ProcessLockManager, "_said", None, "4 the child's word is read")
    wrap(pp.ProcessLockManager, "_apply", "5 the manager applies it")
    # Bound when a contender starts its manager: wrapped before.
    for contender in (bench.TickContender, bench.ProcessTickContender):
        wrap(contender, "_on_renewed", "7 on_locks_renewed is called")
    try:
        yield
    finally:
        for owner, name, original in reversed(patches):
            if isinstance(owner, dict):
                owner[name] = original
            else:
                setattr(owner, name, original)


def pin(server_pid: int, child: int | None) -> None:
    """Put the server on the first CPU, this process's threads and ``child`` on the second."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--pin needs two CPUs")
    os.sched_setaffinity(server_pid, {cpus[0]})
    for task in os.listdir(f"/proc/{os.getpid()}/task"):
        os.sched_setaffinity(int(task), {cpus[1]})
    if child is not None:
        os.sched_setaffinity(child, {cpus[1]})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--isolation", choices=("thread", "process"), default="thread")
    parser.add_argument("--pin", action="store_true")
    args = parser.parse_args(argv)
    stamps = Stamps()
    server = EmbeddedServer("valkey").start()
    admin = redis.Redis.from_url(server.url, socket_timeout=ASK_TIMEOUT)
    try:
        admin.script_load(script_source())
        workload = bench.Workload(args.jobs)
        workload.reset(admin)
        with stamped(stamps):
            tick: Any = (
                bench.ProcessTickContender(server.url, workload)
                if args.isolation == "process"
                else bench.TickContender(server.url, workload)
            )
            floor = bench.FloorContender(server.url, workload)
            if args.pin:
                pin(int(admin.info("server")["process_id"]), getattr(tick, "child", None))
            try:
                table = _rounds(args.rounds, tick, floor, workload, admin, stamps)
            finally:
                tick.close()
                floor.close()
    finally:
        admin.close()
        server.stop()
    print(table)


def _rounds(
    rounds: int,
    tick: Any,
    floor: bench.FloorContender,
    workload: bench.Workload,
    admin: redis.Redis,
    stamps: Stamps,
) -> str:
    runs: list[dict[str, float]] = []

    def stamped_tick() -> float:
        stamps.at.clear()
        started = time.perf_counter()
        seconds: float = tick.run()
        stamps.at["8 the asker has its answer"] = started + seconds
        runs.append({stage: (at - started) * 1000 for stage, at in stamps.at.items()})
        return seconds

    results = bench.run_rounds(
        {"tick": stamped_tick, "floor": floor.run},
        lambda: workload.reset(admin),
        admin,
        rounds,
        random.Random(SEED),
        {"tick": tick.make_due} if hasattr(tick, "make_due") else None,
    )
    del runs[0]  # the warm-up's
    stages = {stage: [run[stage] for run in runs] for stage in runs[0]}
    stages["0 server: scripts"] = [sample.server.script_ms for sample in results.samples["tick"]]
    stages["floor: its whole run"] = [seconds * 1000 for seconds in results.seconds("floor")]
    lines = [
        f"{workload.size:,} due jobs, {rounds} rounds: tick / server "
        f"{results.script_ratio('tick'):.3f}x, floor / server "
        f"{results.script_ratio('floor'):.3f}x",
        "",
        "| stage | ms since the ask (median) |",
        "|---|---:|",
    ]
    lines += [f"| {stage} | {statistics.median(stages[stage]):.3f} |" for stage in sorted(stages)]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
