"""The demo: a supervisor tree renewing job locks, with a live view.

Starts a private server (or uses ``REDIS_URL``), runs the supervisor tree of
``examples/supervisor_tree.py`` with a handful of jobs whose work outlasts the
lock's TTL several times, and shows each job's state, the remaining TTL of its
lock as the server reports it (PTTL), its renewals and the manager's ticks.
Mid-way it hands one job's lock to another worker and crashes another job's
actor: the view shows the lost lock being reported and the work abandoned,
and the crashed actor untracked and restarted.

It ends with a summary, writes ``summary.json`` and a timeline picture
(``timeline.png``, with matplotlib) to ``--out``, and exits 0 unless a lock
was lost that the demo did not provoke.

Run it with ``make demo`` or ``python examples/demo.py [--no-live] [--quiet]
[--out DIR]``.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pykka
import redis

# `python examples/demo.py` puts examples/ on the path, not the project root.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import actors
from actors import LockManager, Timing
from actors.embedded import server_url
from examples import supervisor_tree, timeline

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rich.console import RenderableType

__all__ = ["Config", "Summary", "Tick", "TickLog", "main", "observed_manager", "run_demo"]

#: How often the view is redrawn, in seconds.
REFRESH_S = 0.1


@dataclass(frozen=True, slots=True)
class Tick:
    """One timer tick of the manager."""

    #: When it ran, in seconds on the monotonic clock.
    at: float
    #: Due jobs it renewed or found lost (0 for a tick with nothing due).
    batch: int
    #: Script calls it sent.
    script_calls: int


class TickLog:
    """The ticks of a manager, appended on its thread and read on any."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ticks: list[Tick] = []

    def add(self, tick: Tick) -> None:
        """Record one tick."""
        with self._lock:
            self._ticks.append(tick)

    def ticks(self) -> list[Tick]:
        """Return the ticks so far."""
        with self._lock:
            return list(self._ticks)


def observed_manager(log: TickLog) -> type[LockManager]:
    """Return a LockManager class that records each of its ticks in ``log``."""

    class ObservedLockManager(LockManager):
        def extend_locks(self) -> None:
            before = self.get_stats().script_calls
            at = time.monotonic()
            super().extend_locks()
            after = self.get_stats()
            calls = after.script_calls - before
            log.add(Tick(at, after.last_batch if calls else 0, calls))

    return ObservedLockManager


@dataclass(frozen=True)
class Config:
    """The demo's settings."""

    jobs: int = 6
    #: Lock TTL in milliseconds; renew time and tick follow from it.
    lock_duration: int = 2000
    #: Work per job in milliseconds; four TTLs when ``None``.
    work_ms: int | None = None
    step_ms: int = 200
    #: When to steal a lock and crash an actor, in ms; 1.25 TTLs when ``None``.
    provoke_after_ms: int | None = None
    live: bool = True
    quiet: bool = False
    out: Path = Path("out")

    @property
    def steal(self) -> str:
        """The job whose lock the demo hands to another worker."""
        return f"job-{(self.jobs + 1) // 2}"

    @property
    def crash(self) -> str:
        """The job whose actor the demo crashes."""
        return f"job-{self.jobs}"


@dataclass(frozen=True)
class Summary:
    """What the demo saw, as written to ``summary.json``."""

    jobs: int
    finished: list[str]
    abandoned: list[str]
    lost: list[str]
    provoked_lost: list[str]
    unprovoked_lost: list[str]
    crashed: list[str]
    restarted: list[str]
    untracked_after_crash: list[str]
    renewals: int
    ticks: int
    renewing_ticks: int
    manager_script_calls: int
    server_evalsha_calls: int
    script_calls_per_renewing_tick: float
    mean_batch: float
    seconds: float
    timeline: str | None
    ok: bool


# -- what the run shows --------------------------------------------------------


class _LogLines(logging.Handler):
    """Keeps warnings and errors as one line each, for the view."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: collections.deque[str] = collections.deque(maxlen=200)

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage().splitlines()[0]
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            text += f" {type(exc).__name__}: {exc}"
        self.lines.append(f"{record.levelname} {record.name}: {text}")


_STYLE = {
    "working": "green",
    "waiting": "yellow",
    "starting": "dim",
    "finished": "bold green",
    "abandoned": "bold red",
    "gave up": "bold red",
    "lost": "red",
    "stolen": "red",
    "crashed": "bold magenta",
    "crash": "magenta",
    "restarted": "cyan",
    "untracked": "cyan",
    "abandon": "red",
}


class _View:
    """Turns snapshots into the live table, or into printed lines."""

    def __init__(self, config: Config, url: str, started: float, ticks: TickLog) -> None:
        self._config = config
        self._timing = Timing(config.lock_duration)
        self._keys = actors.QueueKeys("demo")
        self._client = redis.Redis.from_url(url, socket_timeout=5, decode_responses=True)
        self._started = started
        self._ticks = ticks
        self._printed = 0
        self._logs_printed = 0
        self.log = _LogLines()

    def close(self) -> None:
        self._client.close()

    def _locks(self, job_ids: Sequence[str]) -> dict[str, tuple[str | None, int]]:
        pipe = self._client.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.get(self._keys.lock(job_id))
            pipe.pttl(self._keys.lock(job_id))
        replies = pipe.execute()
        return {
            job_id: (replies[2 * n], int(replies[2 * n + 1])) for n, job_id in enumerate(job_ids)
        }

    def lines(self, snapshot: supervisor_tree.Snapshot) -> list[str]:
        """Return the events not printed yet, one line each; renewals grouped per tick."""
        out: list[tuple[float, str]] = []
        events = snapshot.events[self._printed :]
        self._printed = len(snapshot.events)
        # One line per tick for renewals: the callback's time is the tick's.
        renewed: dict[float, list[str]] = {}
        for event in events:
            if event.kind == "renewed":
                renewed.setdefault(event.at, []).append(event.job_id)
                continue
            out.append(
                (event.at, self._event_line(event.at, event.job_id, event.kind, event.detail))
            )
        for at, ids in renewed.items():
            out.append((at, self._event_line(at, ",".join(ids), "renewed", "")))
        out.sort()
        new_logs = list(self.log.lines)[self._logs_printed :]
        self._logs_printed += len(new_logs)
        return [line for _, line in out] + [f"        {line}" for line in new_logs]

    def _event_line(self, at: float, job: str, kind: str, detail: str) -> str:
        return f"{at - self._started:6.2f}s  {kind:10} {job:8} {detail}"

    def render(
        self, snapshot: supervisor_tree.Snapshot, manager: pykka.ActorRef[LockManager]
    ) -> RenderableType:
        """Build the live view: the jobs table, the manager's line, recent events."""
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        locks = self._locks([view.job_id for view in snapshot.jobs])
        ttl = self._timing.lock_duration
        table = Table(expand=False, title_justify="left")
        table.title = Text(
            f"lock_duration {ttl} ms · renew within {self._timing.renew_time} ms · "
            f"tick every {self._timing.interval} ms",
            style="bold",
        )
        for column in ("job", "actor", "state", "lock TTL (PTTL)", "held by", "renewals", "work"):
            table.add_column(column)
        for view in snapshot.jobs:
            value, pttl = locks[view.job_id]
            table.add_row(
                view.job_id,
                view.worker,
                Text(view.state, style=_STYLE.get(view.state, "")),
                _ttl_bar(pttl, ttl, self._timing.renew_time),
                _holder(value, view.token),
                str(view.renewals),
                _progress(view, self._config),
            )
        ticks = self._ticks.ticks()
        try:
            stats = actors.get_stats(manager, timeout=1)
            line = (
                f"manager: {len(ticks)} ticks, {stats.tracked} jobs tracked, "
                f"{stats.renewed} renewals, {stats.script_calls} script calls, "
                f"{stats.lost} lost"
            )
        except (pykka.ActorDeadError, pykka.Timeout):
            line = "manager: stopped"
        elapsed = time.monotonic() - self._started
        header = Text(f"t = {elapsed:5.1f} s   {line}", style="cyan")
        recent = [event for event in snapshot.events if event.kind != "renewed"][-9:]
        log = Text()
        for event in recent:
            style = _STYLE.get(event.kind, "")
            log.append(
                self._event_line(event.at, event.job_id, event.kind, event.detail) + "\n", style
            )
        for entry in list(self.log.lines)[-3:]:
            log.append(f"        {entry}\n", "dim")
        return Group(table, header, log)


def _ttl_bar(pttl: int, ttl: int, renew: int) -> RenderableType:
    from rich.text import Text

    if pttl < 0:
        return Text("no lock", style="dim")
    width = 20
    filled = max(0, min(width, round(width * pttl / ttl)))
    style = "green" if pttl >= ttl - renew else "yellow"
    return Text("█" * filled + "·" * (width - filled) + f" {pttl:5d} ms", style=style)


def _holder(value: str | None, token: str) -> RenderableType:
    from rich.text import Text

    if value is None:
        return Text("-", style="dim")
    if token and value == token:
        return Text("this worker", style="green")
    return Text("another worker", style="bold red")


def _progress(view: supervisor_tree.JobView, config: Config) -> str:
    work = config.work_ms or 4 * config.lock_duration
    done = work if view.state == supervisor_tree.FINISHED else min(view.done_ms, work)
    return f"{done / 1000:4.1f}/{work / 1000:.1f} s"


# -- the run -----------------------------------------------------------------


def run_demo(url: str, config: Config) -> Summary:
    """Run the tree on ``url``, show it as ``config`` says, and summarise it."""
    ticks = TickLog()
    started = time.monotonic()
    view = _View(config, url, started, ticks)
    root = logging.getLogger()
    root.addHandler(view.log)
    work = config.work_ms or 4 * config.lock_duration
    provoke = config.provoke_after_ms or config.lock_duration * 5 // 4
    kwargs: dict[str, Any] = {
        "jobs": config.jobs,
        "queue": "demo",
        "lock_duration": config.lock_duration,
        "work_ms": work,
        "step_ms": config.step_ms,
        "steal": config.steal,
        "crash": config.crash,
        "provoke_after_ms": provoke,
        "manager_class": observed_manager(ticks),
    }
    if not config.quiet:
        print(
            f"{config.jobs} jobs of {work / 1000:.1f} s each, lock_duration "
            f"{config.lock_duration} ms; at {provoke / 1000:.1f} s another worker takes "
            f"{config.steal}'s lock and {config.crash}'s actor crashes",
            flush=True,
        )
    try:
        if config.quiet:
            result = supervisor_tree.run(url, **kwargs)
        elif config.live:
            from rich.live import Live

            with Live(refresh_per_second=1 / REFRESH_S, transient=False) as live:

                def update(
                    snapshot: supervisor_tree.Snapshot, manager: pykka.ActorRef[LockManager]
                ) -> None:
                    live.update(view.render(snapshot, manager))

                result = supervisor_tree.run(url, on_poll=update, poll_s=REFRESH_S, **kwargs)
        else:

            def show(snapshot: supervisor_tree.Snapshot, _: pykka.ActorRef[LockManager]) -> None:
                for line in view.lines(snapshot):
                    print(line, flush=True)

            result = supervisor_tree.run(url, on_poll=show, poll_s=REFRESH_S, **kwargs)
    finally:
        root.removeHandler(view.log)
        view.close()
    return _summarise(result, ticks, config, started)


def _summarise(
    result: supervisor_tree.Result, log: TickLog, config: Config, started: float
) -> Summary:
    ticks = log.ticks()
    renewing = [tick for tick in ticks if tick.script_calls]
    provoked = [job_id for job_id in result.lost if job_id in result.stolen]
    unprovoked = [job_id for job_id in result.lost if job_id not in result.stolen]
    restarted = [job_id for job_id, count in result.restarts.items() if count]
    picture = _draw(result, ticks, config, started)
    ok = (
        not unprovoked
        and sorted(provoked) == sorted(result.stolen)
        and config.crash in result.finished
        and config.crash in result.untracked_after_crash
        and not result.unfinished
    )
    return Summary(
        jobs=config.jobs,
        finished=result.finished,
        abandoned=result.abandoned,
        lost=result.lost,
        provoked_lost=provoked,
        unprovoked_lost=unprovoked,
        crashed=result.crashed,
        restarted=restarted,
        untracked_after_crash=result.untracked_after_crash,
        renewals=result.stats.renewed,
        ticks=len(ticks),
        renewing_ticks=len(renewing),
        manager_script_calls=result.stats.script_calls,
        server_evalsha_calls=result.server_script_calls,
        script_calls_per_renewing_tick=(
            round(result.server_script_calls / len(renewing), 3) if renewing else 0.0
        ),
        mean_batch=round(sum(t.batch for t in renewing) / len(renewing), 2) if renewing else 0.0,
        seconds=round(time.monotonic() - started, 1),
        timeline=str(picture) if picture else None,
        ok=ok,
    )


def _draw(
    result: supervisor_tree.Result, ticks: list[Tick], config: Config, started: float
) -> Path | None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print(f"no timeline picture: matplotlib is missing ({timeline.INSTALL_HINT})")
        return None
    events = [(event.at - started, event.job_id, event.kind) for event in result.events]
    lock_s = config.lock_duration / 1000
    shown = ["job-1", config.steal, config.crash]
    traces = [timeline.job_trace(job_id, events, lock_s) for job_id in shown]
    config.out.mkdir(parents=True, exist_ok=True)
    return timeline.draw_timeline(
        config.out / "timeline.png",
        traces=traces,
        ticks=[tick.at - started for tick in ticks],
        timing=Timing(config.lock_duration),
        run_end=time.monotonic() - started,
    )


def _print_summary(summary: Summary, config: Config) -> None:
    lost = ", ".join(
        [f"{job} (provoked)" for job in summary.provoked_lost]
        + [f"{job} (NOT provoked)" for job in summary.unprovoked_lost]
    )
    lines = [
        "",
        "Summary",
        f"  jobs finished:        {len(summary.finished)} of {summary.jobs} "
        f"({', '.join(summary.finished)})",
        f"  locks lost:           {len(summary.lost)}: {lost or 'none'}; "
        f"unprovoked: {len(summary.unprovoked_lost)}",
        f"  work abandoned:       {', '.join(summary.abandoned) or 'none'}",
        f"  crashed, restarted:   {', '.join(summary.restarted) or 'none'} "
        f"(untracked after the crash: {', '.join(summary.untracked_after_crash) or 'none'})",
        f"  renewals:             {summary.renewals} in {summary.ticks} ticks "
        f"({summary.renewing_ticks} with due jobs, {summary.mean_batch} jobs each on average)",
        f"  script calls per tick with due jobs: {summary.script_calls_per_renewing_tick:.2f} "
        f"(server counted {summary.server_evalsha_calls} EVALSHA for "
        f"{summary.renewing_ticks} such ticks)",
        f"  timeline:             {summary.timeline or 'not drawn'}",
        f"  summary:              {config.out / 'summary.json'}",
        f"  result:               {'OK' if summary.ok else 'FAILED'} in {summary.seconds} s",
    ]
    print("\n".join(lines), flush=True)


def _parse(argv: Sequence[str] | None) -> Config:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=6, help="jobs, one actor each (at least 3)")
    parser.add_argument("--lock-duration", type=int, default=2000, help="lock TTL in ms")
    parser.add_argument("--work-ms", type=int, default=None, help="work per job in ms")
    parser.add_argument("--step-ms", type=int, default=200, help="one step of work in ms")
    parser.add_argument("--no-live", action="store_true", help="print events, no live table")
    parser.add_argument("--quiet", action="store_true", help="print the summary only")
    parser.add_argument("--out", type=Path, default=Path("out"), help="folder for the outputs")
    args = parser.parse_args(argv)
    if args.jobs < 3:
        parser.error("--jobs must be at least 3")
    return Config(
        jobs=args.jobs,
        lock_duration=args.lock_duration,
        work_ms=args.work_ms,
        step_ms=args.step_ms,
        live=not args.no_live and sys.stdout.isatty(),
        quiet=args.quiet,
        out=args.out,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; return 0 unless a lock was lost that the demo did not provoke."""
    config = _parse(argv)
    with server_url() as url:
        summary = run_demo(url, config)
    config.out.mkdir(parents=True, exist_ok=True)
    (config.out / "summary.json").write_text(json.dumps(vars(summary), indent=2) + "\n")
    _print_summary(summary, config)
    return 0 if summary.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
