"""What the demo shows while it runs: a live table (rich), or one line per event."""

from __future__ import annotations

import collections
import logging
from typing import TYPE_CHECKING

import redis
from rich.console import Group
from rich.table import Table
from rich.text import Text

import actors
from examples.demo.run import KEYS
from examples.demo.supervision import ProvokedCrash

if TYPE_CHECKING:
    from rich.console import RenderableType

    from examples.demo.run import Config, Event, Frame
    from examples.demo.supervision import Child

STYLE = {
    "acquired": "green",
    "waiting": "yellow",
    "starting": "dim",
    "finished": "bold green",
    "abandoned": "bold red",
    "gave up": "bold red",
    "lost": "red",
    "stolen": "red",
    "crashed": "bold magenta",
    "restarted": "cyan",
}


class LogLines(logging.Handler):
    """Keeps each warning and error as one line, for the view."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: collections.deque[str] = collections.deque(maxlen=200)

    def emit(self, record: logging.LogRecord) -> None:
        """Keep the record's first line, and its exception's."""
        text = record.getMessage().splitlines()[0]
        error = record.exc_info[1] if record.exc_info else None
        if error is not None:
            text += f" {error!r}"
        # The demo crashes one actor on purpose: its traceback is no bug.
        provoked = " (provoked on purpose)" if isinstance(error, ProvokedCrash) else ""
        self.lines.append(f"{record.levelname} {record.name}{provoked}: {text}")


class View:
    """Turns frames into the live table, or into lines of text."""

    def __init__(self, config: Config, url: str, started: float) -> None:
        self._config, self._started = config, started
        self._timing = actors.Timing(config.lock_duration)
        self._client = redis.Redis.from_url(url, socket_timeout=5, decode_responses=True)
        self._printed: set[Event] = set()
        self._logs_printed = 0
        self.log = LogLines()

    def close(self) -> None:
        """Close the view's connection."""
        self._client.close()

    def _line(self, at: float, job: str, kind: str, detail: str = "") -> str:
        return f"{at - self._started:6.2f}s  {kind:10} {job:8} {detail}"

    def lines(self, frame: Frame) -> list[str]:
        """Return a line for each event not shown yet; one line per tick for renewals."""
        new = [event for event in frame.events if event not in self._printed]
        self._printed.update(new)
        renewed: dict[float, list[str]] = {}
        out: list[tuple[float, str]] = []
        for event in new:
            if event.kind == "renewed":
                renewed.setdefault(event.at, []).append(event.job_id)
            else:
                out.append((event.at, self._line(*event)))
        for at, ids in renewed.items():
            out.append((at, self._line(at, ",".join(ids), "renewed")))
        logs = list(self.log.lines)[self._logs_printed :]
        self._logs_printed += len(logs)
        return [line for _, line in sorted(out)] + [f"        {line}" for line in logs]

    def render(self, frame: Frame) -> RenderableType:
        """Build the live view: the jobs table, the manager's counters, recent events."""
        timing, stats = self._timing, frame.stats
        table = Table(title_justify="left")
        table.title = Text(
            f"lock_duration {timing.lock_duration} ms · renew within {timing.renew_time} ms · "
            f"tick every {timing.interval} ms",
            style="bold",
        )
        for column in ("job", "actor", "state", "lock TTL (PTTL)", "held by", "renewals", "work"):
            table.add_column(column)
        pipe = self._client.pipeline(transaction=False)
        for job_id in frame.children:
            pipe.get(KEYS.lock(job_id))
            pipe.pttl(KEYS.lock(job_id))
        replies = pipe.execute()
        rows = zip(frame.children.items(), replies[::2], replies[1::2], strict=True)
        for (job_id, child), value, pttl in rows:
            renewals = sum(e.job_id == job_id and e.kind == "renewed" for e in frame.events)
            table.add_row(
                job_id,
                f"{job_id}#{child.generation}",
                Text(child.state, style=STYLE.get(child.state, "")),
                self._ttl_bar(int(pttl)),
                _holder(value, child.token),
                str(renewals),
                self._progress(job_id, child, frame),
            )
        header = Text(
            f"t = {frame.at - self._started:5.1f} s   manager: {stats.ticks} ticks, "
            f"{stats.tracked} jobs tracked, {stats.renewed} renewals, "
            f"{stats.script_calls} script calls, {stats.lost} lost",
            style="cyan",
        )
        log = Text()
        for event in [event for event in frame.events if event.kind != "renewed"][-9:]:
            log.append(self._line(*event) + "\n", STYLE.get(event.kind, ""))
        for entry in list(self.log.lines)[-3:]:
            log.append(f"        {entry}\n", "dim")
        return Group(table, header, log)

    def _ttl_bar(self, pttl: int) -> Text:
        if pttl < 0:
            return Text("no lock", style="dim")
        ttl, width = self._timing.lock_duration, 20
        filled = max(0, min(width, round(width * pttl / ttl)))
        # Green while the lock has more than the renew window's worth left.
        style = "green" if pttl >= ttl - self._timing.renew_time else "yellow"
        return Text("█" * filled + "·" * (width - filled) + f" {pttl:5d} ms", style=style)

    def _progress(self, job_id: str, child: Child, frame: Frame) -> str:
        work = self._config.work
        done = child.done_ms / 1000  # what the actor reported at its last change of state
        if child.state == "acquired":
            taken = [e.at for e in frame.events if e.job_id == job_id and e.kind == "acquired"]
            done = min(frame.at - taken[-1], work / 1000) if taken else 0.0
        return f"{done:4.1f}/{work / 1000:.1f} s"


def _holder(value: str | None, token: str) -> Text:
    if value is None:
        return Text("-", style="dim")
    if token and value == token:
        return Text("this worker", style="green")
    return Text("another worker", style="bold red")
