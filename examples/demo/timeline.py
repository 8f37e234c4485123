"""Draw the three windows of lock renewal from what a run observed.

For a few jobs, each panel shows the lock's remaining TTL over time: it
starts at ``lock_duration`` when the job takes the lock, falls, and jumps back
at every renewal (the dots). Renewals land inside the renew window: the lock
is renewed at most ``lock_renew_time`` after the previous renewal, so its
remaining TTL stays in the shaded band. The faint vertical lines are the
manager's timer ticks, ``lock_renew_time / 2`` apart. The top strip shows the
three windows side by side.

Needs matplotlib (``pip install '.[demo]'`` from the repository's root); it
draws with the Agg backend, so no display is needed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from actors import Timing

__all__ = ["INSTALL_HINT", "JobTrace", "LockSpan", "draw_timeline", "job_trace"]

#: How to get matplotlib when it is missing.
INSTALL_HINT = "pip install '.[demo]'"

#: Default lock duration the second time axis is scaled to, in milliseconds.
_DEFAULT_LOCK_DURATION = 30000

_GREEN, _BLUE, _RED, _GREY, _INK = "#2e7d32", "#1565c0", "#c62828", "#9e9e9e", "#263238"


@dataclass
class LockSpan:
    """One lock a job took, from taking it to its end; times in seconds from the run's start."""

    #: When the worker set the lock: taken first, then each renewal.
    sets: list[float]
    #: When the lock ended, or ``None`` while it is held.
    end: float | None = None
    #: How: "released", "stolen" (another token now) or "expired".
    how: str = "held"
    #: When the manager stopped renewing it while it was still set (after a crash).
    untracked_at: float | None = None


@dataclass
class JobTrace:
    """One job's locks over a run, and the moments worth a marker."""

    job_id: str
    locks: list[LockSpan] = field(default_factory=list)
    #: (time, kind) with kind among stolen, lost, abandoned, crashed, restarted.
    marks: list[tuple[float, str]] = field(default_factory=list)
    #: One line saying what happened to the job.
    caption: str = ""


def job_trace(
    job_id: str, events: Sequence[tuple[float, str, str]], lock_duration_s: float
) -> JobTrace:
    """Build a job's trace from ``(time, job_id, kind)`` events in time order.

    Kinds understood: acquired, renewed, finished, abandoned, stolen, lost,
    crashed, restarted; the others are ignored.
    """
    trace = JobTrace(job_id)
    lock: LockSpan | None = None
    for at, event_job, kind in events:
        if event_job != job_id:
            continue
        if kind == "acquired":
            lock = LockSpan([at])
            trace.locks.append(lock)
        elif kind == "renewed" and lock is not None:
            lock.sets.append(at)
        elif kind in ("stolen", "finished", "crashed") and lock is not None:
            if kind == "crashed":
                # Untracked: nobody renews it, so it runs out one TTL after the last set.
                lock.untracked_at, lock.end, lock.how = (
                    at,
                    lock.sets[-1] + lock_duration_s,
                    "expired",
                )
            else:
                lock.end, lock.how = at, "stolen" if kind == "stolen" else "released"
            lock = None
        if kind in _MARKS:
            trace.marks.append((at, kind))
    kinds = {kind for _, kind in trace.marks}
    if "crashed" in kinds:
        trace.caption = (
            "actor crashed: supervisor untracked the job, its lock ran out, "
            "the restarted actor took the job again"
        )
    elif "lost" in kinds:
        trace.caption = "another worker took the lock: next renewal failed, work abandoned"
    else:
        trace.caption = "work outlasts the TTL: each renewal resets it"
    return trace


def _sawtooth(sets: list[float], end: float, ttl: float) -> tuple[list[float], list[float]]:
    """Remaining TTL, in TTL units, from the first set to ``end``."""
    xs: list[float] = []
    ys: list[float] = []
    for start, stop in zip(sets, [*sets[1:], end], strict=True):
        xs += [start, stop]
        ys += [1.0, max(0.0, 1.0 - (stop - start) / ttl)]
    return xs, ys


def draw_timeline(
    path: Path,
    *,
    traces: Sequence[JobTrace],
    ticks: Sequence[float],
    timing: Timing,
    run_end: float,
    title: str = "One timer, three windows",
) -> Path:
    """Write the picture of ``traces`` to ``path`` as a PNG.

    Args:
        path: Where to write it; its folder must exist.
        traces: The jobs to draw, one panel each.
        ticks: The manager's tick times, in seconds from the run's start.
        timing: The run's windows.
        run_end: When the run ended, in seconds from its start.
        title: The picture's title.

    Returns:
        ``path``.

    Raises:
        ImportError: matplotlib is not installed (see :data:`INSTALL_HINT`).
    """
    import matplotlib  # noqa: PLC0415 (optional: the demo runs without it)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 (optional: the demo runs without it)

    ttl = timing.lock_duration / 1000
    renew = timing.renew_time / 1000
    interval = timing.interval / 1000
    floor = 1.0 - renew / ttl
    scale = _DEFAULT_LOCK_DURATION / timing.lock_duration

    plt.rcParams.update({"font.size": 9, "axes.titlesize": 10, "font.family": "DejaVu Sans"})
    heights = [1.3] + [1.0] * len(traces)
    fig, axes = plt.subplots(
        len(traces) + 1,
        1,
        figsize=(11, 1.7 + 1.55 * len(traces)),
        sharex=True,
        gridspec_kw={"height_ratios": heights, "hspace": 0.18},
    )
    strip, panels = axes[0], axes[1:]
    right = run_end + 0.05 * run_end

    # The three windows, drawn from the first job's first lock.
    origin = traces[0].locks[0].sets[0] if traces and traces[0].locks else 0.0
    first_tick = next((tick for tick in ticks if tick >= origin), origin)
    rows = [
        (2.0, origin, ttl, _BLUE, f"TTL = lock_duration ({timing.lock_duration} ms)"),
        (1.0, origin, renew, _GREEN, f"renew window = lock_renew_time ({timing.renew_time} ms)"),
        (0.0, first_tick, interval, _INK, f"tick = lock_renew_time / 2 ({timing.interval} ms)"),
    ]
    for y, start, width, color, label in rows:
        strip.barh(y, width, left=start, height=0.55, color=color, alpha=0.85)
        strip.text(start + width + 0.05, y, label, va="center", color=color, fontweight="bold")
    strip.set_ylim(-0.6, 2.6)
    strip.set_yticks([])
    for side in ("left", "right", "top"):
        strip.spines[side].set_visible(False)
    strip.set_title(
        f"{title}: defaults 30 s / 15 s / 7.5 s, here {timing.lock_duration} / "
        f"{timing.renew_time} / {timing.interval} ms",
        loc="left",
        fontweight="bold",
    )
    top = strip.secondary_xaxis("top", functions=(lambda x: x * scale, lambda x: x / scale))
    top.set_xlabel("seconds at the default durations", color=_GREY)
    top.tick_params(colors=_GREY)

    for ax, trace in zip(panels, traces, strict=True):
        ax.axhspan(floor, 1.0, color=_GREEN, alpha=0.12, lw=0)
        ax.axhline(floor, color=_GREEN, lw=0.8, ls="--")
        for tick in ticks:
            ax.axvline(tick, color=_GREY, lw=0.5, alpha=0.45, zorder=0)
        for lock in trace.locks:
            _draw_lock(ax, lock, ttl, run_end)
        _draw_marks(ax, trace.marks, ttl)
        ax.text(0.0, 1.02, trace.caption, transform=ax.transAxes, fontsize=8.5,
                color=_INK, style="italic", va="bottom")  # fmt: skip
        ax.set_ylim(0, 1.32)
        ax.set_yticks([0, floor, 1.0], ["0", "TTL - renew", "TTL"])
        ax.set_ylabel(trace.job_id, rotation=0, ha="right", va="center", fontweight="bold")
        ax.set_xlim(-0.05 * run_end, right)
        for side in ("right", "top"):
            ax.spines[side].set_visible(False)

    panels[-1].set_xlabel("seconds since the demo started")
    _legend(fig)
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)
    return path


def _draw_lock(ax: Axes, lock: LockSpan, ttl: float, run_end: float) -> None:
    end = lock.end if lock.end is not None else run_end
    renewed_until = lock.untracked_at if lock.untracked_at is not None else end
    xs, ys = _sawtooth(lock.sets, renewed_until, ttl)
    ax.plot(xs, ys, color=_BLUE, lw=1.4)
    ax.fill_between(xs, ys, color=_BLUE, alpha=0.10, lw=0)
    if lock.untracked_at is not None:
        # Nobody renews it now: it runs down to zero and expires.
        tail = [renewed_until, end]
        ax.plot(tail, [ys[-1], 0.0], color=_GREY, lw=1.4, ls="--")
        ax.fill_between(tail, [ys[-1], 0.0], color=_GREY, alpha=0.12, lw=0)
        ax.annotate("untracked: runs out", (end, 0.0), xytext=(-95, 6),
                    textcoords="offset points", color=_GREY, fontsize=8)  # fmt: skip
    ax.plot(lock.sets[1:], [1.0] * (len(lock.sets) - 1), "o", color=_GREEN, ms=4.5, zorder=3)
    ax.plot(lock.sets[:1], [1.0], "s", color=_BLUE, ms=5, zorder=3)
    if lock.how == "released":
        ax.annotate("released", (end, ys[-1]), xytext=(3, 6), textcoords="offset points",
                    color=_BLUE, fontsize=8)  # fmt: skip


_MARKS = {
    "stolen": ("X", _RED, "another worker's token"),
    "lost": ("v", _RED, "reported lost"),
    "abandoned": ("s", _RED, "abandoned"),
    "crashed": ("*", _INK, "crashed"),
    "restarted": (">", _INK, "restarted"),
}


def _draw_marks(ax: Axes, marks: Sequence[tuple[float, str]], ttl: float) -> None:
    # Marks of one story (within a TTL) share one label: "reported lost -> abandoned".
    groups: list[list[tuple[float, str]]] = []
    for at, kind in sorted(marks):
        if groups and at - groups[-1][-1][0] < ttl:
            groups[-1].append((at, kind))
        else:
            groups.append([(at, kind)])
    for group in groups:
        at, kind = group[0]
        shape, color, _ = _MARKS[kind]
        ax.plot([at], [1.16], shape, color=color, ms=7, zorder=4)
        # The report of a lost lock comes with a tick: mark it on the TTL line.
        for lost_at, later in group[1:]:
            if later == "lost":
                ax.plot([lost_at], [1.0], "v", color=_RED, ms=6, zorder=4)
        label = " → ".join(_MARKS[kind][2] for _, kind in group)
        ax.annotate(label, (at, 1.16), xytext=(8, -3), textcoords="offset points",
                    color=_MARKS[kind][1], fontsize=8)  # fmt: skip


def _legend(fig: Figure) -> None:
    from matplotlib.lines import Line2D  # noqa: PLC0415 (optional: the demo runs without it)
    from matplotlib.patches import Patch  # noqa: PLC0415 (optional: the demo runs without it)

    handles = [
        Line2D([], [], color=_BLUE, lw=1.4, label="remaining lock TTL"),
        Line2D([], [], color=_BLUE, marker="s", lw=0, label="lock taken"),
        Line2D([], [], color=_GREEN, marker="o", lw=0, label="renewed"),
        Patch(color=_GREEN, alpha=0.25, label="renew window"),
        Line2D([], [], color=_GREY, lw=0.8, label="timer tick"),
        Line2D([], [], color=_GREY, lw=1.4, ls="--", label="untracked lock running out"),
    ]
    fig.legend(
        handles=handles, loc="lower center", ncol=6, frameon=False, bbox_to_anchor=(0.5, -0.03)
    )
