"""One run of the demo: the supervisor tree, what the manager's hooks tell, one steal, one crash."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import redis

import actors
from examples.demo import supervision

if TYPE_CHECKING:
    from collections.abc import Callable

#: The demo's queue.
KEYS = actors.QueueKeys("demo")
#: Time between two looks at the tree (and two frames of the view), in seconds.
REFRESH_S = 0.1


@dataclass(frozen=True)
class Config:
    """The demo's settings; durations in milliseconds."""

    jobs: int = 6
    lock_duration: int = 2000
    #: Work per job; four TTLs when ``None``.
    work_ms: int | None = None
    step_ms: int = 200
    live: bool = True
    quiet: bool = False
    out: Path = Path("out")

    @property
    def work(self) -> int:
        """Work per job, in milliseconds."""
        return self.work_ms or 4 * self.lock_duration

    @property
    def provoke_s(self) -> float:
        """When to steal a lock and crash an actor, in seconds after the start."""
        return 1.25 * self.lock_duration / 1000

    @property
    def steal(self) -> str:
        """The job whose lock another worker takes."""
        return f"job-{(self.jobs + 1) // 2}"

    @property
    def crash(self) -> str:
        """The job whose actor crashes."""
        return f"job-{self.jobs}"


class Event(NamedTuple):
    """Something that happened, from the tree or from the manager's hooks."""

    at: float  #: When, on ``time.monotonic()``.
    job_id: str
    kind: str
    detail: str = ""


class Hooks:
    """What the manager tells through its public hooks.

    Callbacks run on the manager's delivery thread and the timer on its own;
    the demo reads on the main thread. Appending to a list, extending it by a
    list and copying it are each atomic, so no lock is needed.
    """

    def __init__(self) -> None:
        self.manager: actors.ManagerRef | None = None
        #: The grid time of each timer tick, in seconds on ``time.monotonic()``.
        self.ticks: list[float] = []
        self.events: list[Event] = []
        #: Tick number -> due jobs it sent, for the ticks that ran the script
        #: and were seen here (see :meth:`_count_tick`).
        self.batches: dict[int, int] = {}

    def timer(self, fire: Callable[[int], None], name: str) -> actors.Timer:
        """Build the manager's usual timer, noting when each tick is due."""

        def noted(scheduled_ms: int) -> None:
            self.ticks.append(scheduled_ms / 1000)
            fire(scheduled_ms)

        return actors.ThreadTimer(noted, name)

    def renewed(self, job_ids: list[str]) -> None:
        """Note a tick's renewals."""
        at = time.monotonic()
        self.events.extend([Event(at, job_id, "renewed") for job_id in job_ids])
        self._count_tick()

    def lost(self, lost: list[actors.LostLock]) -> None:
        """Note a tick's lost locks."""
        at = time.monotonic()
        self.events.extend([Event(at, item.job_id, "lost", item.reason) for item in lost])
        self._count_tick()

    def _count_tick(self) -> None:
        # The manager answers from its state now: when its next tick ran before this
        # report was delivered, that tick is the one seen. A sample of the batches,
        # then; Stats.renewing_ticks counts every renewing tick.
        assert self.manager is not None
        stats = actors.get_stats(self.manager)
        self.batches[stats.ticks] = stats.last_batch


@dataclass(frozen=True)
class Frame:
    """The tree and the manager at one moment, for the view."""

    at: float
    children: dict[str, supervision.Child]
    #: Everything so far, in time order.
    events: list[Event]
    stats: actors.Stats


@dataclass(frozen=True)
class Outcome:
    """What a run did."""

    started: float
    ended: float
    children: dict[str, supervision.Child]
    events: list[Event]
    ticks: list[float]
    batches: dict[int, int]
    stats: actors.Stats
    #: EVALSHA calls the server ran during the run: the manager's, as the server counts them.
    server_calls: int


def _evalsha_calls(client: redis.Redis) -> int:
    stats: dict[str, Any] = client.info("commandstats").get("cmdstat_evalsha", {})
    # A NOSCRIPT answer is a failed call: the script ran only in the others.
    return int(stats.get("calls", 0)) - int(stats.get("failed_calls", 0))


def _events(reports: list[supervision.Report], hooks: Hooks) -> list[Event]:
    tree = [Event(r.at, r.job_id, r.kind, r.detail) for r in reports]
    return sorted(tree + list(hooks.events))


def run(url: str, config: Config, show: Callable[[Frame], None] | None = None) -> Outcome:
    """Run the tree until every job has an outcome; steal one lock and crash one actor mid-way.

    Args:
        url: The server's URL.
        config: The settings.
        show: Called with a :class:`Frame` every :data:`REFRESH_S` seconds.

    Returns:
        What happened.

    Raises:
        TimeoutError: A job had no outcome long after the slowest path's end.
    """
    hooks = Hooks()
    client = redis.Redis.from_url(url, socket_timeout=5, decode_responses=True)
    calls_before = _evalsha_calls(client)
    lock_ms = config.lock_duration
    # Step 1: the manager, with the hooks the demo watches it through.
    manager = hooks.manager = actors.start_link(
        connection=url,
        keys=KEYS,
        lock_duration=lock_ms,
        on_locks_renewed=hooks.renewed,
        on_lock_renewal_failed=hooks.lost,
        timer=hooks.timer,
    )
    # Step 2: the supervision tree (demo/supervision.py), one actor per job.
    setup = supervision.Setup(manager, client, KEYS, lock_ms, config.work, config.step_ms)
    job_ids = [f"job-{n}" for n in range(1, config.jobs + 1)]
    tree = supervision.Supervisor.start(job_ids, setup).proxy()
    started, provoked = time.monotonic(), False
    # The slowest path: provoked, its lock runs out, the work done again; thrice that.
    deadline = started + 3 * (config.provoke_s + (2 * lock_ms + config.work) / 1000)
    try:
        while True:
            children, reports = tree.status().get()
            if show is not None:
                events = _events(reports, hooks)
                show(Frame(time.monotonic(), children, events, actors.get_stats(manager)))
            if all(child.ref is None for child in children.values()):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"jobs still running after {deadline - started:.0f} s")
            # Step 3: mid-way, another worker takes one job's lock, and one job's actor crashes.
            if not provoked and time.monotonic() - started >= config.provoke_s:
                client.set(KEYS.lock(config.steal), "another-worker", xx=True, px=lock_ms)
                hooks.events.append(Event(time.monotonic(), config.steal, "stolen"))
                tree.crash(config.crash).get()
                provoked = True
            time.sleep(REFRESH_S)
        stats = actors.get_stats(manager)
    finally:
        tree.actor_ref.stop()
        actors.stop(manager)
    server_calls = _evalsha_calls(client) - calls_before
    client.close()
    return Outcome(
        started=started,
        ended=time.monotonic(),
        children=children,
        events=_events(reports, hooks),
        ticks=list(hooks.ticks),
        batches=dict(hooks.batches),
        stats=stats,
        server_calls=server_calls,
    )
