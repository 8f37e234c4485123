"""The benchmark's own server and its report.

The benchmark reads the server's SLOWLOG and command counters, so it runs on
a private server configured for that (or on ``REDIS_URL``, reconfigured with
CONFIG SET). Tables and target results are collected across the tests and
printed once, at the end of the run, so pytest's progress lines never cut
through them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from actors.embedded import EmbeddedServer


def env_ints(name: str, default: str) -> tuple[int, ...]:
    """The comma-separated whole numbers in the environment variable ``name``, or in ``default``."""
    return tuple(int(part) for part in os.environ.get(name, default).split(",") if part.strip())


#: Seed of the order contenders run in; each benchmark adds its own offset.
SEED = int(os.environ.get("ACTORS_BENCH_SEED", "20260101"))
#: Scripts slower than this many microseconds are logged by the server.
SLOWLOG_THRESHOLD_US = 100
#: Slow log entries the server keeps: more than a tick's script calls.
SLOWLOG_LENGTH = 4096
#: Generous bound, in seconds, on one tick, query or wait of a benchmark, and
#: the socket timeout of its own client: resets of 100,000 locks and reads of
#: the slow log must never time out.
ASK_TIMEOUT = 300.0


@dataclass
class BenchServer:
    """The server under test."""

    engine: str
    url: str


@dataclass
class Goal:
    """One performance target and what the run measured for it."""

    name: str
    measured: str
    limit: str
    passed: bool


@dataclass
class Report:
    """Markdown sections and target results, printed at the end of the run."""

    engine: str
    sections: list[str] = field(default_factory=list)
    targets: list[Goal] = field(default_factory=list)

    def section(self, text: str) -> None:
        self.sections.append(text.rstrip() + "\n")

    def check(self, name: str, measured: float, limit: float, unit: str, *, at_most: bool) -> bool:
        passed = measured <= limit if at_most else measured >= limit
        sign = "≤" if at_most else "≥"
        self.targets.append(
            Goal(
                name, f"{measured:,.3g} {unit}".strip(), f"{sign} {limit:g} {unit}".strip(), passed
            )
        )
        return passed

    def render(self) -> str:
        lines = [f"## Benchmark on {self.engine}\n", *self.sections]
        if self.targets:
            lines.append("| target | measured | limit | result |")
            lines.append("|---|---:|---:|:---:|")
            for target in self.targets:
                verdict = "PASS" if target.passed else "FAIL"
                lines.append(f"| {target.name} | {target.measured} | {target.limit} | {verdict} |")
        return "\n".join(lines) + "\n"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table, every column right-aligned."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _engine_version(client: redis.Redis) -> str:
    info = client.info("server")
    if "valkey_version" in info:
        return f"Valkey {info['valkey_version']}"
    return f"Redis {info['redis_version']}"


@pytest.fixture(scope="session")
def bench_server() -> Iterator[BenchServer]:
    """A server whose slow log records every script call over 0.1 ms."""
    url = os.environ.get("REDIS_URL")
    process: EmbeddedServer | None = None
    if url is None:
        engine = os.environ.get("ACTORS_ENGINE", "valkey")
        process = EmbeddedServer(
            engine,
            extra_args=[
                "--slowlog-log-slower-than",
                str(SLOWLOG_THRESHOLD_US),
                "--slowlog-max-len",
                str(SLOWLOG_LENGTH),
            ],
        ).start()
        url = process.url
    client = redis.Redis.from_url(url, socket_timeout=30)
    try:
        client.config_set("slowlog-log-slower-than", SLOWLOG_THRESHOLD_US)
        client.config_set("slowlog-max-len", SLOWLOG_LENGTH)
        yield BenchServer(engine=_engine_version(client), url=url)
    finally:
        client.close()
        if process is not None:
            process.stop()


@pytest.fixture(scope="session")
def report(bench_server: BenchServer) -> Iterator[Report]:
    """Collects the tables; prints them (and writes ``ACTORS_BENCH_OUT``) at the end."""
    collected = Report(engine=bench_server.engine)
    yield collected
    text = collected.render()
    sys.stdout.write("\n\n" + text)
    sys.stdout.flush()
    out = os.environ.get("ACTORS_BENCH_OUT")
    if out:
        Path(out).write_text(text, encoding="utf-8")


@pytest.fixture(scope="module")
def admin(bench_server: BenchServer) -> Iterator[redis.Redis]:
    """The benchmark's own client; the server is flushed before and after each module."""
    client = redis.Redis.from_url(bench_server.url, socket_timeout=ASK_TIMEOUT)
    client.flushall()
    try:
        yield client
    finally:
        client.flushall()
        client.close()
