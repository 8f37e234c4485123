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
  So is a run's time while another run of its worker held the event loop
  they share (a ``hold`` record: the ``bullmq`` worker's busy job runs its
  steps without yielding), and ``grace_ms`` after: the run could not run.
  An overlap whose older run (the one whose lock was taken first: by
  ``taken``, the job's ``processedOn``, where known) is not ``watched`` (a
  BullMQ for Node.js run: nothing tells it of a lost lock) is the peer's,
  listed apart and not counted.
- **Unexplained losses.** A ``lost`` whose time (``seen``, for a refused
  move: when the refusal came) is in no fault window on its worker (or on
  Redis) stretched by ``lock_ms`` after the fault's end. A fault of the
  replica alone (its link cut, its restart) explains only a loss for want of
  its confirmation (``unconfirmed`` in the reason): the primary kept the locks.
- **Unfinished jobs.** An added job with no ``finished``/``completed`` run, or
  whose final state is not ``completed``, or with a run never ended; except a
  job a ``redis-restart`` wiped (its final state ``"wiped"``, a restart after
  it was added), counted apart. A job is its id and its ``created`` time,
  where records give it: a server restarted empty hands out ids again.
- **Stale writes accepted.** A run writes its result through a fenced
  store and a guarded write (:mod:`tests.chaos.store`). Counted: a fenced
  write accepted after the store took a higher fence, or the same fence from
  another run; a guarded write applied after another run of the job surely
  took its lock (that run's fetch was sent after the writer's run started,
  and answered before the write was sent); a run that surely took the lock
  after another but got a fence no higher.

**What a failover may undo.** A ``failover`` fault (or a ``lagging-failover``,
whose replica's link was cut a while before) records ``synced``: the
replica held every write made before it. A write the primary took after
that, up to the fault's ``end`` (the old primary a replica again), may be
undone: the replicas confirmed none of them. Two are not failures, and are
counted apart: a job whose adding was undone (its final state ``"wiped"``,
its add sent before the fault's end and answered after ``synced``), and a
completion undone (sent before the end, answered after ``synced``), after
which the job runs again once its first run ended. The writes the ``actors``
workers have confirmed (renewals, takes, fences, guarded writes) are never
undone: overlaps, losses, unfinished jobs and stale writes count as ever.
A job run again after a completion no failover explains is listed apart, as
are the primary changes the sentinels saw (a ``switches`` note) beyond the
``failover`` faults: a failover nobody asked for undoes writes unexplained.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Finding", "Run", "Verdict", "build_runs", "check", "pauses"]

#: Fault kinds during which the target's process runs none of its code.
PAUSING = ("stop", "gil")
#: Fault kinds that promote a replica, which may lack the primary's last writes.
FAILOVERS = ("failover", "lagging-failover")
#: Fault kinds of the replica alone: the primary keeps every lock, and only the
#: replica's confirmations are missing, so they explain no loss but an unconfirmed one.
REPLICA_FAULTS = ("replica-cut", "replica-restart")
#: What every loss for want of a replica's confirmation says.
UNCONFIRMED = "unconfirmed"


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
    #: When its fetch was sent (the job's ``processedOn``), ns; ``None`` if unknown.
    taken: int | None = None
    #: Whether anything tells the run that its lock is lost (not so for BullMQ for Node.js).
    watched: bool = True

    @property
    def took(self) -> int:
        """When the run's lock was taken, at the latest: ``taken`` if known, else ``start``."""
        return self.start if self.taken is None else min(self.taken, self.start)


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
    stale_writes: list[Finding] = field(default_factory=list)
    #: Overlaps left by a run nothing tells of a loss (not counted).
    peer_overlaps: list[Finding] = field(default_factory=list)
    losses: int = 0
    unexpected_exits: int = 0
    #: Writes made: fenced, guarded.
    writes: int = 0
    #: Jobs a restart of the server wiped before any run completed them.
    wiped: int = 0
    #: Jobs whose adding a failover undid.
    undone_adds: int = 0
    #: Completions a failover undid, after which the job ran again.
    undone_completions: int = 0
    #: Runs of a job after a completion of it that no failover explains (not counted).
    reruns: list[Finding] = field(default_factory=list)
    #: Primary changes the sentinels saw beyond the ``failover`` faults (a ``switches`` note).
    unasked_failovers: int = 0

    @property
    def counts(self) -> dict[str, int]:
        """The four counts, each of which must be 0."""
        return {
            "overlaps": len(self.overlaps),
            "unexplained losses": len(self.unexplained_losses),
            "unfinished jobs": len(self.unfinished),
            "stale writes accepted": len(self.stale_writes),
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
                taken=None if start.get("taken") is None else int(start["taken"]),
                watched=bool(start.get("watched", True)),
            )
        )
    return sorted(runs, key=lambda run: (run.start, run.token))


def pauses(
    records: list[dict[str, Any]], base: str, grace_ns: int, tokens: tuple[str, ...] = ()
) -> list[tuple[int, int]]:
    """The windows in which ``base``'s process ran nothing, each stretched by ``grace_ns``.

    With ``tokens`` (two runs of one job), also those in which a third run held
    the event loop of ``base``'s runs: neither of the two ran meanwhile.
    """
    return sorted(
        (int(r["start"]), int(r["end"]) + grace_ns)
        for r in records
        if r.get("target") == base
        and (
            (r.get("kind") == "fault" and r.get("fault") in PAUSING)
            or (r.get("kind") == "hold" and tokens and r.get("holder") not in tokens)
        )
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


def _overlaps(
    records: list[dict[str, Any]], runs: list[Run], grace_ns: int
) -> tuple[list[Finding], list[Finding]]:
    """The overlaps counted, and those whose older run is a peer's that nothing tells."""
    found: list[Finding] = []
    peers: list[Finding] = []
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
                tokens = (older.token, newer.token)
                cover = sorted(
                    pauses(records, older.base, grace_ns, tokens)
                    + pauses(records, newer.base, grace_ns, tokens)
                )
                both = _uncovered(newer.start, min(older.end, newer.end), cover)
                if both > 0:
                    shown = _run_records(records, older, newer)
                    shown += _faults_between(records, older.start, older.end)
                    stale = older if older.took <= newer.took else newer
                    (found if stale.watched else peers).append(
                        Finding(
                            f"job {older.job}: run {older.token} ({older.worker}, ended by "
                            f"{older.ended_by}) and run {newer.token} ({newer.worker}) both in "
                            f"hand for {both / 1e6:.1f} ms",
                            _window(shown),
                        )
                    )
    return found, peers


def _surely_after(first: Run, then: Run) -> bool:
    """Whether ``then`` surely took the job's lock after ``first`` did.

    ``then``'s fetch was sent after ``first``'s run had started, so after
    ``first``'s lock was taken.
    """
    return then.token != first.token and then.taken is not None and first.start < then.taken


def _stale_fenced(writes: list[dict[str, Any]]) -> list[Finding]:
    """Fenced writes accepted after a higher fence, or the same fence of another run."""
    found: list[Finding] = []
    highest: dict[str, tuple[int, str]] = {}
    for write in sorted((w for w in writes if w["store"] == "fenced"), key=lambda w: w["seq"]):
        job, fence, token = str(write["job"]), int(write["fence"]), str(write["token"])
        best = highest.get(job)
        if not write["accepted"]:
            continue
        if best is not None and (fence < best[0] or (fence == best[0] and token != best[1])):
            found.append(
                Finding(
                    f"job {job}: fenced store accepted fence {fence} of run {token} after "
                    f"fence {best[0]} of run {best[1]}",
                    _window([w for w in writes if w["job"] == job and w["store"] == "fenced"]),
                )
            )
        if best is None or fence > best[0]:
            highest[job] = (fence, token)
    return found


def _stale_guarded(
    records: list[dict[str, Any]], writes: list[dict[str, Any]], by_job: dict[str, list[Run]]
) -> list[Finding]:
    """Guarded writes applied after another run surely took the lock, before the write."""
    found: list[Finding] = []
    for write in writes:
        job, token = str(write["job"]), str(write["token"])
        if write["store"] != "guarded" or not write["accepted"]:
            continue
        for writer in (run for run in by_job[job] if run.token == token):
            later = [
                other
                for other in by_job[job]
                if _surely_after(writer, other) and other.start < int(write["t0"])
            ]
            if later:
                found.append(
                    Finding(
                        f"job {job}: guarded write of run {token} applied after run "
                        f"{later[0].token} had taken the lock",
                        _window([*_run_records(records, writer, later[0]), write]),
                    )
                )
    return found


def _unrisen_fences(
    records: list[dict[str, Any]], writes: list[dict[str, Any]], by_job: dict[str, list[Run]]
) -> list[Finding]:
    """Runs that surely took a lock after another run but got a fence no higher."""
    fences = {
        (str(w["job"]), str(w["token"])): int(w["fence"]) for w in writes if w["store"] == "fenced"
    }
    found = []
    for job, job_runs in by_job.items():
        for first in job_runs:
            for then in job_runs:
                low, high = fences.get((job, first.token)), fences.get((job, then.token))
                if low is None or high is None or not _surely_after(first, then):
                    continue
                if high <= low:
                    found.append(
                        Finding(
                            f"job {job}: run {then.token} took the lock after run "
                            f"{first.token} but got fence {high}, not above {low}",
                            _window(_run_records(records, first, then)),
                        )
                    )
    return found


def _stale_writes(records: list[dict[str, Any]], runs: list[Run]) -> list[Finding]:
    """The stale writes accepted, and the fences that did not rise with their holders."""
    writes = [r for r in records if r.get("kind") == "write"]
    by_job: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        by_job[run.job].append(run)
    return [
        *_stale_fenced(writes),
        *_stale_guarded(records, writes, by_job),
        *_unrisen_fences(records, writes, by_job),
    ]


def _unexplained(records: list[dict[str, Any]], lock_ms: int) -> tuple[int, list[Finding]]:
    lock_ns = lock_ms * 1_000_000
    faults = [r for r in records if r.get("kind") == "fault"]
    losses, found = 0, []
    for record in records:
        if record.get("kind") != "run" or record["event"] != "lost":
            continue
        losses += 1
        # A refused move ends its run when it was sent (``t``) and is known when
        # refused (``seen``): a pause between the two explains it as well.
        at = int(record.get("seen", record["t"]))
        if any(
            f.get("target") in (record["base"], "redis")
            and int(f["start"]) <= at <= int(f["end"]) + lock_ns
            and (f.get("fault") not in REPLICA_FAULTS or UNCONFIRMED in str(record.get("reason")))
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


def _named(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records with each job named by its id and ``created`` time, where known."""
    return [
        {**r, "job": f"{r['job']}@{r['created']}"} if "job" in r and "created" in r else r
        for r in records
    ]


def _wiped(records: list[dict[str, Any]], added: list[str]) -> set[str]:
    """The jobs a server restart wiped, completed or not: added before one, left ``"wiped"``."""
    restarts = [
        int(r["start"])
        for r in records
        if r.get("kind") == "fault" and r.get("fault") == "redis-restart"
    ]
    when = {
        str(r["job"]): _t(r) for r in records if r.get("kind") == "job" and r["event"] == "added"
    }
    final = {
        str(r["job"]): str(r["state"])
        for r in records
        if r.get("kind") == "job" and r["event"] == "final"
    }
    return {
        job
        for job in added
        if final.get(job) == "wiped" and any(at > when.get(job, at) for at in restarts)
    }


def _failovers(records: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """The windows in which a failover may undo a write: from ``synced`` to the fault's end."""
    return sorted(
        (int(r.get("synced", r["start"])), int(r["end"]))
        for r in records
        if r.get("kind") == "fault" and r.get("fault") in FAILOVERS
    )


def _undoable(sent: int, answered: int, windows: list[tuple[int, int]]) -> bool:
    """Whether a write sent at ``sent`` and answered at ``answered`` may have been undone."""
    return any(sent <= end and answered >= synced for synced, end in windows)


def _undone_adds(records: list[dict[str, Any]], added: list[str]) -> set[str]:
    """The jobs left ``"wiped"`` whose adding a failover may have undone."""
    windows = _failovers(records)
    final = {
        str(r["job"]): str(r["state"])
        for r in records
        if r.get("kind") == "job" and r["event"] == "final"
    }
    adds = {
        str(r["job"]): (int(r.get("sent", _t(r))), _t(r))
        for r in records
        if r.get("kind") == "job" and r["event"] == "added"
    }
    return {
        job
        for job in added
        if final.get(job) == "wiped" and job in adds and _undoable(*adds[job], windows)
    }


def _runs_again(records: list[dict[str, Any]], runs: list[Run]) -> tuple[int, list[Finding]]:
    """Completions a failover undid before the job ran again; and the reruns none explains."""
    windows = _failovers(records)
    starts: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        starts[run.job].append(run)
    undone, found = 0, []
    for record in records:
        if not (
            record.get("kind") == "run"
            and record["event"] == "finished"
            and record.get("outcome") == "completed"
        ):
            continue
        job, sent = str(record["job"]), _t(record)
        # Taken after it: a fetch sent before (answered late) took the lock before.
        later = [run for run in starts[job] if run.took > sent]
        if not later:
            continue
        if _undoable(sent, int(record.get("seen", sent)), windows):
            undone += 1
            continue
        found.append(
            Finding(
                f"job {job}: run {later[0].token} ({later[0].worker}) started after run "
                f"{record['token']} completed it, with no failover between",
                _window([record, *_run_records(records, later[0])]),
            )
        )
    return undone, found


def _unasked(records: list[dict[str, Any]]) -> int:
    """Primary changes the sentinels saw, less the ``failover`` faults that asked for them."""
    seen = sum(
        int(r["count"]) for r in records if r.get("kind") == "note" and r.get("what") == "switches"
    )
    asked = sum(
        1
        for r in records
        if r.get("kind") == "fault" and r.get("fault") in FAILOVERS and "error" not in r
    )
    return max(0, seen - asked)


def _completed(records: list[dict[str, Any]]) -> set[str]:
    return {
        str(r["job"])
        for r in records
        if r.get("kind") == "run" and r["event"] == "finished" and r.get("outcome") == "completed"
    }


def _unfinished(
    records: list[dict[str, Any]], runs: list[Run], added: list[str], wiped: set[str]
) -> list[Finding]:
    completed = _completed(records)
    final = {
        str(r["job"]): str(r["state"])
        for r in records
        if r.get("kind") == "job" and r["event"] == "final"
    }
    open_runs = {run.job: run for run in runs if run.ended_by == "open"}
    found = []
    for job in added:
        problems = []
        if job not in completed and job not in wiped:
            problems.append("no run finished it")
        if final.get(job, "unknown") != "completed" and job not in wiped:
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
    records = _named(records)
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
    overlaps, peer_overlaps = _overlaps(records, runs, grace_ns)
    wiped = _wiped(records, added)
    undone_adds = _undone_adds(records, added) - wiped
    undone_completions, reruns = _runs_again(records, runs)
    return Verdict(
        seed=config.get("seed"),
        jobs=len(added),
        runs=len(runs),
        faults=dict(sorted(by_kind.items())),
        overlaps=overlaps,
        unexplained_losses=unexplained,
        unfinished=_unfinished(records, runs, added, wiped | undone_adds),
        stale_writes=_stale_writes(records, runs),
        peer_overlaps=peer_overlaps,
        losses=losses,
        unexpected_exits=sum(1 for r in records if r.get("kind") == "exit"),
        writes=sum(1 for r in records if r.get("kind") == "write"),
        wiped=len(wiped - _completed(records)),
        undone_adds=len(undone_adds),
        undone_completions=undone_completions,
        reruns=reruns,
        unasked_failovers=_unasked(records),
    )
