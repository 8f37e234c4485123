"""The checker: four counts from a chaos run's history, and the shortest window showing each.

A pure function of the records (:mod:`tests.chaos.history`); nothing here
reads Redis or a clock.

- **Overlaps.** A run is *in hand* from ``started`` until its first
  ``lost`` or ``finished``; a run of a killed incarnation until the kill; one
  whose process exited until the exit; one with no end at all until the end
  of the history. Two runs of one job in hand at once are an overlap, less
  the time either run's process was paused (a ``stop`` or ``gil`` fault on
  its worker) and ``grace_ms`` after each pause: a paused process does
  nothing, the job's code included, and needs a moment after it to read its
  mailbox (the "abort before steal" bound holds only while a process runs).
- **Unexplained losses.** A ``lost`` whose time is in no fault window on its
  worker (or on Redis) stretched by ``lock_ms`` after the fault's end.
- **Unfinished jobs.** An added job with no ``finished``/``completed`` run, or
  whose final state is not ``completed``, or with a run never ended.
- **Stale fenced writes accepted.** Not checked: the workers make no fenced
  writes (``tests/faults/test_fencing.py`` covers fencing); always ``None``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Finding", "Run", "Verdict", "build_runs", "check", "pauses"]

#: Fault kinds during which the target's process runs none of its code.
PAUSING = ("stop", "gil")


@dataclass(frozen=True)
class Run:
    """One run of a job: a worker held it with one token, from start to end (ns)."""

    job: str
    token: str
    worker: str
    base: str
    attempt: int
    start: int
    end: int
    #: ``"lost"``, ``"finished"``, ``"killed"``, ``"exited"`` or ``"open"``.
    ended_by: str


@dataclass(frozen=True)
class Finding:
    """One failure of a check: what it is, and the records that show it, in time order."""

    what: str
    window: list[dict[str, Any]]


@dataclass
class Verdict:
    """What the checker counted."""

    seed: int | None
    jobs: int
    runs: int
    faults: dict[str, int]
    overlaps: list[Finding] = field(default_factory=list)
    unexplained_losses: list[Finding] = field(default_factory=list)
    unfinished: list[Finding] = field(default_factory=list)
    #: ``None``: not checked.
    stale_fenced_writes: int | None = None
    losses: int = 0
    unexpected_exits: int = 0

    @property
    def counts(self) -> dict[str, int | None]:
        """The four counts, each of which must be 0 (``None``: not checked)."""
        return {
            "overlaps": len(self.overlaps),
            "unexplained losses": len(self.unexplained_losses),
            "unfinished jobs": len(self.unfinished),
            "stale fenced writes accepted": self.stale_fenced_writes,
        }

    @property
    def ok(self) -> bool:
        """Whether every checked count is 0."""
        return not any(self.counts.values())


def _t(record: dict[str, Any]) -> int:
    return int(record.get("t", record.get("start", 0)))


def build_runs(records: list[dict[str, Any]]) -> list[Run]:
    """Pair each run's ``started`` with its first end (see the module's rules)."""
    history_end = max((int(r.get("end", _t(r))) for r in records), default=0)
    killed = {
        str(r["incarnation"]): int(r["start"])
        for r in records
        if r.get("kind") == "fault" and r.get("fault") == "kill" and "incarnation" in r
    }
    exited = {str(r["worker"]): int(r["t"]) for r in records if r.get("kind") == "exit"}
    starts: dict[tuple[str, str], dict[str, Any]] = {}
    ends: dict[tuple[str, str], dict[str, Any]] = {}
    for record in sorted((r for r in records if r.get("kind") == "run"), key=_t):
        key = (str(record["job"]), str(record["token"]))
        if record["event"] == "started":
            starts.setdefault(key, record)
        elif key not in ends:
            ends[key] = record
    runs = []
    for key, start in starts.items():
        worker = str(start["worker"])
        end = ends.get(key)
        if end is not None:
            finish, ended_by = _t(end), str(end["event"])
        elif worker in killed:
            finish, ended_by = killed[worker], "killed"
        elif worker in exited:
            finish, ended_by = exited[worker], "exited"
        else:
            finish, ended_by = history_end, "open"
        runs.append(
            Run(
                job=key[0],
                token=key[1],
                worker=worker,
                base=str(start["base"]),
                attempt=int(start.get("attempt", 0)),
                start=_t(start),
                end=max(finish, _t(start)),
                ended_by=ended_by,
            )
        )
    return sorted(runs, key=lambda run: (run.start, run.token))


def pauses(records: list[dict[str, Any]], base: str, grace_ns: int) -> list[tuple[int, int]]:
    """The windows in which ``base``'s process ran nothing, each stretched by ``grace_ns``."""
    return sorted(
        (int(r["start"]), int(r["end"]) + grace_ns)
        for r in records
        if r.get("kind") == "fault" and r.get("fault") in PAUSING and r.get("target") == base
    )


def _uncovered(start: int, end: int, cover: list[tuple[int, int]]) -> int:
    """Nanoseconds of ``[start, end)`` outside every window of ``cover``."""
    left, at = 0, start
    for lo, hi in cover:
        if hi <= at or lo >= end:
            continue
        if lo > at:
            left += lo - at
        at = max(at, hi)
        if at >= end:
            return left
    return left + max(0, end - at)


def _faults_between(records: list[dict[str, Any]], start: int, end: int) -> list[dict[str, Any]]:
    return [
        r
        for r in records
        if r.get("kind") == "fault" and int(r["start"]) <= end and int(r["end"]) >= start
    ]


def _run_records(records: list[dict[str, Any]], *runs: Run) -> list[dict[str, Any]]:
    tokens = {(run.job, run.token) for run in runs}
    return [
        r for r in records if r.get("kind") == "run" and (str(r["job"]), str(r["token"])) in tokens
    ]


def _window(shown: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    for record in sorted(shown, key=_t):
        if record not in seen:
            seen.append(record)
    return seen


def _overlaps(records: list[dict[str, Any]], runs: list[Run], grace_ns: int) -> list[Finding]:
    found = []
    by_job: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        by_job[run.job].append(run)
    for job_runs in by_job.values():
        for i, older in enumerate(job_runs):
            for newer in job_runs[i + 1 :]:
                if newer.start >= older.end:
                    continue
                # Either may be the stale one: a fetch answered after a pause
                # is stamped after it, though its lock was taken before.
                cover = sorted(
                    pauses(records, older.base, grace_ns) + pauses(records, newer.base, grace_ns)
                )
                both = _uncovered(newer.start, min(older.end, newer.end), cover)
                if both > 0:
                    shown = _run_records(records, older, newer)
                    shown += _faults_between(records, older.start, older.end)
                    found.append(
                        Finding(
                            f"job {older.job}: run {older.token} ({older.worker}, ended by "
                            f"{older.ended_by}) and run {newer.token} ({newer.worker}) both in "
                            f"hand for {both / 1e6:.1f} ms",
                            _window(shown),
                        )
                    )
    return found


def _unexplained(records: list[dict[str, Any]], lock_ms: int) -> tuple[int, list[Finding]]:
    lock_ns = lock_ms * 1_000_000
    faults = [r for r in records if r.get("kind") == "fault"]
    losses, found = 0, []
    for record in records:
        if record.get("kind") != "run" or record["event"] != "lost":
            continue
        losses += 1
        at = int(record["t"])
        if any(
            f.get("target") in (record["base"], "redis")
            and int(f["start"]) <= at <= int(f["end"]) + lock_ns
            for f in faults
        ):
            continue
        run = (record["job"], record["token"])
        started = [
            r
            for r in records
            if r.get("kind") == "run" and r["event"] == "started" and (r["job"], r["token"]) == run
        ]
        since = min((_t(r) for r in started), default=at)
        shown = [*started, record, *_faults_between(records, since - lock_ns, at)]
        found.append(
            Finding(
                f"job {record['job']}: run {record['token']} ({record['worker']}) lost "
                f"({record.get('reason', '?')}) with no fault on {record['base']} or redis "
                f"within {lock_ms} ms before",
                _window(shown),
            )
        )
    return losses, found


def _unfinished(records: list[dict[str, Any]], runs: list[Run], added: list[str]) -> list[Finding]:
    completed = {
        str(r["job"])
        for r in records
        if r.get("kind") == "run" and r["event"] == "finished" and r.get("outcome") == "completed"
    }
    final = {
        str(r["job"]): str(r["state"])
        for r in records
        if r.get("kind") == "job" and r["event"] == "final"
    }
    open_runs = {run.job: run for run in runs if run.ended_by == "open"}
    found = []
    for job in added:
        problems = []
        if job not in completed:
            problems.append("no run finished it")
        if final.get(job, "unknown") != "completed":
            problems.append(f"final state {final.get(job, 'unknown')}")
        if job in open_runs:
            problems.append(f"run {open_runs[job].token} never ended")
        if problems:
            shown = [r for r in records if str(r.get("job")) == job]
            found.append(Finding(f"job {job}: " + "; ".join(problems), _window(shown)))
    return found


def check(
    records: list[dict[str, Any]], *, lock_ms: int | None = None, grace_ms: int | None = None
) -> Verdict:
    """Check a history; ``lock_ms`` and ``grace_ms`` default to its ``config`` record's.

    Raises:
        ValueError: Neither the arguments nor a ``config`` record give ``lock_ms``.
    """
    config = next((r for r in records if r.get("kind") == "config"), {})
    lock_ms = lock_ms if lock_ms is not None else config.get("lock_ms")
    if lock_ms is None:
        raise ValueError("lock_ms: give it, or a config record")
    grace_ns = int(grace_ms if grace_ms is not None else config.get("grace_ms", 0)) * 1_000_000
    runs = build_runs(records)
    by_kind: dict[str, int] = defaultdict(int)
    for record in records:
        if record.get("kind") == "fault":
            by_kind[str(record["fault"])] += 1
    added = sorted(
        {str(r["job"]) for r in records if r.get("kind") == "job" and r["event"] == "added"},
        key=lambda job: (len(job), job),
    )
    losses, unexplained = _unexplained(records, int(lock_ms))
    return Verdict(
        seed=config.get("seed"),
        jobs=len(added),
        runs=len(runs),
        faults=dict(sorted(by_kind.items())),
        overlaps=_overlaps(records, runs, grace_ns),
        unexplained_losses=unexplained,
        unfinished=_unfinished(records, runs, added),
        losses=losses,
        unexpected_exits=sum(1 for r in records if r.get("kind") == "exit"),
    )
