"""Fixtures for the bullmq tier: a queue on each engine, and the outcome table."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.bullmq.harness import OUTCOMES, Bench
from tests.faults.conftest import record  # noqa: F401  (the fault table's row, for its bullmq row)

if TYPE_CHECKING:
    from collections.abc import Iterator

    import redis

    from tests.conftest import Server


@pytest.fixture
def bench(engine_server: Server, engine_client: redis.Redis) -> Iterator[Bench]:
    """A fresh queue on each engine in turn; its workers are closed after the test."""
    bench = Bench(engine_server.url, engine_server.engine)
    try:
        yield bench
    finally:
        bench.close()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print what the tier measured: one table per kind of scenario."""
    for table, rows in OUTCOMES.tables.items():
        terminalreporter.section(f"bullmq: {table}")
        columns = list(dict.fromkeys(key for row in rows for key in row))
        terminalreporter.line("| " + " | ".join(columns) + " |")
        terminalreporter.line("|" + "---|" * len(columns))
        for row in rows:
            terminalreporter.line("| " + " | ".join(str(row.get(c, "")) for c in columns) + " |")


@pytest.fixture
def one_bench(server: Server, redis_client: redis.Redis) -> Iterator[Bench]:
    """A fresh queue on the run's default engine, for what no engine changes."""
    bench = Bench(server.url, server.engine)
    try:
        yield bench
    finally:
        bench.close()
