"""The nemesis: seeded faults, alone and overlapping, each recorded with its start and end.

Kinds: ``kill`` (SIGKILL a worker, restart it), ``stop`` (SIGSTOP/SIGCONT a
worker), ``redis-stop`` (SIGSTOP/SIGCONT the server), ``redis-restart`` (kill
the server and start it again empty: every key is gone), ``partition`` (a
worker's proxy black-holes its traffic), ``gil`` (the worker holds the GIL in
C code; the worker records that fault itself, as measured), ``child-kill``
(SIGKILL the child of the process-mode manager; it ends once a new child
runs) and ``child-stop`` (SIGSTOP/SIGCONT that child).

A replicated run (:data:`REPLICATED_KINDS`) keeps the workers' faults, drops
those of the one server and the partitions (its workers reach the sentinels,
not a proxy), and adds the replicated ones, all on target ``"redis"``:
``failover`` (``SENTINEL FAILOVER``, until the old primary replicates the new
one through the proxy again), ``lagging-failover`` (the same, the replica's
link cut for a while first: the replica promoted lacks those writes),
``replica-cut`` (the replica's link black-holed a while) and
``replica-restart`` (the replica killed, its files removed, started empty: it
resyncs). Each records ``synced``: the replica held every earlier write.
One fault at a time per target; up to :data:`MAX_ACTIVE` at once.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tests.chaos.history import History, now
from tests.isolation.conftest import children

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.faults.proxy import FaultProxy

__all__ = ["KINDS", "MAX_ACTIVE", "REPLICATED_KINDS", "TAKES", "Nemesis", "Targets"]

#: Each kind of fault, and how often it is picked against the others.
KINDS = {
    "kill": 2,
    "stop": 2,
    "redis-stop": 1,
    "redis-restart": 1,
    "partition": 2,
    "gil": 2,
    "child-kill": 1,
    "child-stop": 1,
}
#: The kinds of a replicated run, and how often each is picked.
REPLICATED_KINDS = {
    "kill": 2,
    "stop": 2,
    "gil": 2,
    "child-kill": 1,
    "child-stop": 1,
    "failover": 2,
    "lagging-failover": 1,
    "replica-cut": 2,
    "replica-restart": 1,
}
#: Kinds whose target is the server (or the replicated set), not a worker.
SERVER_KINDS = (
    "redis-stop",
    "redis-restart",
    "failover",
    "lagging-failover",
    "replica-cut",
    "replica-restart",
)
#: The faults each kind of worker takes: a GIL hold needs Python, a child the process mode.
TAKES = {
    "thread": ("kill", "stop", "partition", "gil"),
    "process": ("kill", "stop", "partition", "gil", "child-kill", "child-stop"),
    "bullmq": ("kill", "stop", "partition", "gil"),
    "node": ("kill", "stop", "partition"),
}
#: Most faults in progress at once.
MAX_ACTIVE = 2


class Targets(Protocol):
    """What the nemesis acts on: the runner."""

    #: Each worker's proxy, by base name.
    proxies: dict[str, FaultProxy]

    def pid(self, base: str) -> int | None:
        """The pid of the worker's current process, if it is up and ready for signals."""
        ...

    def kill_and_restart(self, base: str, delay_s: float) -> tuple[str, int, int] | None:
        """SIGKILL the worker, restart it ``delay_s`` later: (incarnation, killed, restarted)."""
        ...

    def server_pid(self) -> int:
        """The server's pid."""
        ...

    def restart_server(self, down_s: float) -> tuple[int, int]:
        """Kill the server, start it again empty ``down_s`` later: (killed, answering)."""
        ...

    def control(self) -> Path:
        """The folder of the workers' control files."""
        ...

    def fail_over(self, lag_s: float = 0.0) -> dict[str, Any]:
        """Fail the primary over to the replica, its link cut ``lag_s`` first: the record's more."""
        ...

    def cut_link(self, seconds: float) -> dict[str, Any]:
        """Cut the replica's link for ``seconds`` (replicated runs): what the record adds."""
        ...

    def restart_replica(self, down_s: float) -> dict[str, Any]:
        """Restart the replica empty (replicated runs): what the record adds."""
        ...


class Nemesis:
    """Picks and applies faults from ``random.Random(seed)`` until :meth:`stop`.

    Args:
        seed: The seed of every choice (kind, target, length, gaps).
        targets: What the faults act on.
        history: Where each fault is recorded.
        lock_ms: The locks' TTL: fault lengths are 0.2-1.6 of it.
        bases: The workers' base names, each with its kind (see :data:`TAKES`).
        kinds: The kinds to pick from, with their weights.
    """

    def __init__(
        self,
        seed: int,
        targets: Targets,
        history: History,
        lock_ms: int,
        bases: dict[str, str],
        kinds: dict[str, int] | None = None,
    ) -> None:
        self.rng = random.Random(seed)
        self.targets, self.history, self.lock_s = targets, history, lock_ms / 1000
        self.bases = bases
        self.kinds = dict(KINDS if kinds is None else kinds)
        self._busy: set[str] = set()
        self._guard = threading.Lock()
        self._done = threading.Event()
        self._threads: list[threading.Thread] = []
        self._loop = threading.Thread(target=self._run, name="nemesis", daemon=True)

    def start(self) -> None:
        """Start picking faults."""
        self._loop.start()

    def stop(self) -> None:
        """Pick no more faults; wait until every fault in progress is healed."""
        self._done.set()
        self._loop.join()
        for thread in self._threads:
            thread.join()

    def _run(self) -> None:
        while not self._done.wait(self.rng.uniform(0.1, 0.5) * self.lock_s):
            kind = self.rng.choices(list(self.kinds), weights=list(self.kinds.values()))[0]
            length = self.rng.uniform(0.2, 1.6) * self.lock_s
            with self._guard:
                if len(self._busy) >= MAX_ACTIVE:
                    continue
                free = [base for base in self.bases if base not in self._busy]
                if kind in SERVER_KINDS:
                    choices = ["redis"] if "redis" not in self._busy else []
                else:
                    choices = [base for base in free if kind in TAKES[self.bases[base]]]
                if not choices:
                    continue
                target = self.rng.choice(choices)
                self._busy.add(target)
            apply = getattr(self, "_" + kind.replace("-", "_"))
            thread = threading.Thread(
                target=self._apply, args=(apply, target, length), name=f"fault-{kind}"
            )
            self._threads.append(thread)
            thread.start()

    def _apply(self, apply: Callable[[str, float], None], target: str, length: float) -> None:
        try:
            apply(target, length)
        finally:
            with self._guard:
                self._busy.discard(target)

    def _record(self, kind: str, target: str, start: int, **more: object) -> None:
        self.history.write(kind="fault", fault=kind, target=target, start=start, end=now(), **more)

    def _kill(self, base: str, length: float) -> None:
        done = self.targets.kill_and_restart(base, min(length, 2.0))
        if done is not None:
            incarnation, killed, restarted = done
            self.history.write(
                kind="fault",
                fault="kill",
                target=base,
                start=killed,
                end=restarted,
                incarnation=incarnation,
            )

    def _stop(self, base: str, length: float) -> None:
        self._pause("stop", base, self.targets.pid(base), length)

    def _redis_stop(self, target: str, length: float) -> None:
        self._pause("redis-stop", target, self.targets.server_pid(), length)

    def _pause(self, kind: str, target: str, pid: int | None, length: float) -> None:
        """SIGSTOP ``pid`` for ``length`` seconds, then SIGCONT it; record the fault."""
        if pid is None:
            return
        start = now()
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            return  # it ended meanwhile
        time.sleep(length)
        # A stopped child may have been killed as hung, and replaced, meanwhile.
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        self._record(kind, target, start)

    def _redis_restart(self, target: str, length: float) -> None:
        killed, _ = self.targets.restart_server(min(length, 2.0))
        # From the kill to the first answer of the empty server.
        self._record("redis-restart", target, killed)

    def _child_stop(self, base: str, length: float) -> None:
        pid = self.targets.pid(base)
        found = children(pid) if pid is not None else []
        if found:
            self._pause("child-stop", base, found[0], length)

    def _partition(self, base: str, length: float) -> None:
        proxy = self.targets.proxies[base]
        start = now()
        proxy.blackhole()
        time.sleep(length)
        proxy.passthrough()
        self._record("partition", base, start)

    def _gil(self, base: str, length: float) -> None:
        pid = self.targets.pid(base)
        if pid is None:
            return
        (self.targets.control() / f"{base}.gil").write_text(f"{length:.3f}")
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            return  # killed meanwhile
        # The hold is measured and recorded by the worker; keep others off it meanwhile.
        time.sleep(2 * length + 0.5)

    def _child_kill(self, base: str, length: float) -> None:
        pid = self.targets.pid(base)
        found = children(pid) if pid is not None else []
        if not found:
            return
        start = now()
        try:
            os.kill(found[0], signal.SIGKILL)
        except ProcessLookupError:
            return  # replaced meanwhile
        deadline = time.monotonic() + 10 * self.lock_s
        while time.monotonic() < deadline and self.targets.pid(base) == pid:
            if [child for child in children(pid or 0) if child != found[0]]:
                break
            time.sleep(0.02)
        self._record("child-kill", base, start, killed=found[0])
        time.sleep(length)

    def _failover(self, target: str, length: float) -> None:
        self._replicated("failover", target, self.targets.fail_over)

    def _lagging_failover(self, target: str, length: float) -> None:
        lag_s = min(length, 3.0)
        self._replicated(
            "lagging-failover", target, lambda: {**self.targets.fail_over(lag_s), "lag_s": lag_s}
        )

    def _replica_cut(self, target: str, length: float) -> None:
        self._replicated("replica-cut", target, lambda: self.targets.cut_link(length))

    def _replica_restart(self, target: str, length: float) -> None:
        down_s = min(length, 2.0)
        self._replicated("replica-restart", target, lambda: self.targets.restart_replica(down_s))

    def _replicated(self, kind: str, target: str, apply: Callable[[], dict[str, Any]]) -> None:
        """Apply a fault of the replicated set and record it; a fault that failed says why."""
        start = now()
        try:
            more = apply()
        except Exception as error:  # the run goes on; its record says the fault failed
            print(f"{kind} failed: {error}", file=sys.stderr)
            more = {"error": str(error)[:500]}
        self._record(kind, target, start, **more)
