"""Run the demo: ``python -m examples.demo [--no-live] [--quiet] [--out DIR]``."""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.live import Live

import actors
from actors.embedded import server_url
from examples.demo import timeline
from examples.demo.run import REFRESH_S, Config, Frame, Outcome, run
from examples.demo.view import View

if TYPE_CHECKING:
    from collections.abc import Sequence


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
    #: Crashed jobs whose lock ran out (nothing renewed it), so their restarted actor took it.
    untracked_after_crash: list[str]
    renewals: int
    ticks: int
    #: Ticks that had due jobs, so ran the script.
    renewing_ticks: int
    manager_script_calls: int
    server_evalsha_calls: int
    script_calls_per_renewing_tick: float
    mean_batch: float
    seconds: float
    timeline: str | None
    ok: bool


def summarise(outcome: Outcome, config: Config, picture: Path | None) -> Summary:
    """Say what ``outcome`` shows, and whether only the provoked lock was lost."""
    events, stats, renewing = outcome.events, outcome.stats, outcome.stats.renewing_ticks
    states = {job_id: child.state for job_id, child in outcome.children.items()}
    lost = [e.job_id for e in events if e.kind == "lost"]
    crashed = [e.job_id for e in events if e.kind == "crashed"]
    # The restarted actor takes the lock (SET NX) only once it ran out: once
    # nothing renewed it any more.
    crashed_at = {e.job_id: e.at for e in events if e.kind == "crashed"}
    untracked = sorted(
        {
            e.job_id
            for e in events
            if e.kind == "acquired" and e.at > crashed_at.get(e.job_id, math.inf)
        }
    )
    ok = (
        lost == [config.steal]
        and states.get(config.crash) == "finished"
        and untracked == [config.crash]
        and set(states.values()) <= {"finished", "abandoned"}
    )
    return Summary(
        jobs=config.jobs,
        finished=[job_id for job_id, state in states.items() if state == "finished"],
        abandoned=[job_id for job_id, state in states.items() if state == "abandoned"],
        lost=lost,
        provoked_lost=[job_id for job_id in lost if job_id == config.steal],
        unprovoked_lost=[job_id for job_id in lost if job_id != config.steal],
        crashed=crashed,
        restarted=[job_id for job_id, child in outcome.children.items() if child.generation],
        untracked_after_crash=untracked,
        renewals=stats.renewed,
        ticks=stats.ticks,
        renewing_ticks=renewing,
        manager_script_calls=stats.script_calls,
        server_evalsha_calls=outcome.server_calls,
        script_calls_per_renewing_tick=round(outcome.server_calls / renewing, 3) if renewing else 0,
        mean_batch=round(statistics.mean(outcome.batches.values()), 2) if outcome.batches else 0,
        seconds=round(outcome.ended - outcome.started, 1),
        timeline=str(picture) if picture else None,
        ok=ok,
    )


def draw(outcome: Outcome, config: Config) -> Path | None:
    """Draw the timeline of three jobs (a plain one, the stolen one, the crashed one)."""
    try:
        import matplotlib  # noqa: F401, PLC0415 (optional: the demo runs without it)
    except ImportError:
        print(f"no timeline picture: matplotlib is missing ({timeline.INSTALL_HINT})")
        return None
    events = [(e.at - outcome.started, e.job_id, e.kind) for e in outcome.events]
    lock_s = config.lock_duration / 1000
    shown = ["job-1", config.steal, config.crash]
    config.out.mkdir(parents=True, exist_ok=True)
    return timeline.draw_timeline(
        config.out / "timeline.png",
        traces=[timeline.job_trace(job_id, events, lock_s) for job_id in shown],
        ticks=[tick - outcome.started for tick in outcome.ticks],
        timing=actors.Timing(config.lock_duration),
        run_end=outcome.ended - outcome.started,
    )


def show_summary(summary: Summary, config: Config) -> None:
    """Print the summary."""
    lost = [f"{job} (provoked)" for job in summary.provoked_lost]
    lost += [f"{job} (NOT provoked)" for job in summary.unprovoked_lost]
    print(
        f"""
Summary
  jobs finished:        {len(summary.finished)} of {summary.jobs} ({", ".join(summary.finished)})
  locks lost:           {len(summary.lost)}: {", ".join(lost) or "none"}; \
unprovoked: {len(summary.unprovoked_lost)}
  work abandoned:       {", ".join(summary.abandoned) or "none"}
  crashed, restarted:   {", ".join(summary.restarted) or "none"} \
(untracked after the crash: {", ".join(summary.untracked_after_crash) or "none"})
  renewals:             {summary.renewals} in {summary.ticks} ticks \
({summary.renewing_ticks} with due jobs, {summary.mean_batch} jobs each on average)
  script calls per tick with due jobs: {summary.script_calls_per_renewing_tick:.2f} \
(server counted {summary.server_evalsha_calls} EVALSHA for {summary.renewing_ticks} such ticks)
  timeline:             {summary.timeline or "not drawn"}
  summary:              {config.out / "summary.json"}
  result:               {"OK" if summary.ok else "FAILED"} in {summary.seconds} s""",
        flush=True,
    )


def run_shown(url: str, config: Config) -> Outcome:
    """Run the demo, shown live, as lines, or not at all, as ``config`` says."""
    if not config.quiet:
        print(
            f"{config.jobs} jobs of {config.work / 1000:.1f} s each, lock_duration "
            f"{config.lock_duration} ms; at {config.provoke_s:.1f} s another worker takes "
            f"{config.steal}'s lock and {config.crash}'s actor crashes",
            flush=True,
        )
    view = View(config, url, time.monotonic())
    logging.getLogger().addHandler(view.log)
    try:
        if config.quiet:
            return run(url, config)
        if not config.live:

            def print_lines(frame: Frame) -> None:
                for line in view.lines(frame):
                    print(line, flush=True)

            return run(url, config, print_lines)
        with Live(refresh_per_second=1 / REFRESH_S) as live:

            def update(frame: Frame) -> None:
                live.update(view.render(frame))

            return run(url, config, update)
    finally:
        logging.getLogger().removeHandler(view.log)
        view.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; return 0 unless a lock was lost that it did not provoke."""
    parser = argparse.ArgumentParser(prog="python -m examples.demo", description=__doc__)
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
    if min(args.work_ms or 1, args.step_ms) < 1:
        parser.error("--work-ms and --step-ms must be positive")
    try:
        actors.Timing(args.lock_duration)
    except ValueError as exc:
        parser.error(f"--lock-duration: {exc}")
    config = Config(
        jobs=args.jobs,
        lock_duration=args.lock_duration,
        work_ms=args.work_ms,
        step_ms=args.step_ms,
        # rich knows a terminal (and honours FORCE_COLOR and TTY_COMPATIBLE).
        live=not args.no_live and Console().is_terminal,
        quiet=args.quiet,
        out=args.out,
    )
    with server_url() as url:
        outcome = run_shown(url, config)
    summary = summarise(outcome, config, draw(outcome, config))
    config.out.mkdir(parents=True, exist_ok=True)
    (config.out / "summary.json").write_text(json.dumps(asdict(summary), indent=2) + "\n")
    show_summary(summary, config)
    return 0 if summary.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
