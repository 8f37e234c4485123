"""Run the fault suite and print what each fault did as a Markdown table.

Usage (from the project's root)::

    .venv/bin/python tests/faults/report.py [more pytest arguments]

Each scenario fills a row (see ``FaultRecord`` in ``conftest.py``): the fault,
what was asserted, and what happened: locks lost, false reports (a lock
reported lost that was not, or reported twice) and manager restarts. The
table goes to stdout after pytest's own output; the exit status is pytest's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from collections.abc import Sequence

ROOT = Path(__file__).resolve().parents[2]
ISOLATION_ROWS = (
    "tests/isolation/test_process_mode.py::"
    "test_a_gil_hold_of_three_lock_durations_loses_the_lock_only_in_thread_mode",
    "tests/isolation/test_process_mode.py::"
    "test_a_killed_worker_leaves_no_lock_but_those_another_worker_holds",
    # The child of a process-mode manager killed, then stopped (hung).
    "tests/isolation/test_child_faults.py::test_a_killed_child_loses_no_watched_lock",
    "tests/isolation/test_child_faults.py::"
    "test_a_stopped_child_leaves_no_watcher_untold_before_another_worker_takes_the_job",
)
BULLMQ_ROW = (
    "tests/bullmq/test_concurrency.py::test_a_job_fetched_beside_a_blocked_loop_keeps_its_lock"
)


class Collector:
    """A pytest plugin that keeps each test's outcome and its fault record."""

    def __init__(self) -> None:
        self.outcomes: dict[str, str] = {}
        self.durations: dict[str, float] = {}
        self.rows: dict[str, dict[str, Any]] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        node = report.nodeid
        if report.when == "call" or report.outcome != "passed":
            if self.outcomes.get(node, "passed") == "passed":
                self.outcomes[node] = report.outcome
            self.durations[node] = self.durations.get(node, 0.0) + report.duration
        if report.when == "teardown":
            for name, value in report.user_properties:
                if name == "fault" and isinstance(value, dict) and value.get("fault"):
                    self.rows[node] = value


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|")


def _notes(notes: dict[str, Any]) -> str:
    return ", ".join(f"{key} {value}" for key, value in notes.items())


def table(collector: Collector) -> str:
    """Return the Markdown table of the collected rows, in run order."""
    lines = [
        "| Fault | Asserted | Outcome | Locks lost | False reports | Restarts | Measured |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for node, row in collector.rows.items():
        outcome = collector.outcomes.get(node, "?")
        outcome = f"{outcome} ({collector.durations.get(node, 0.0):.1f} s)"
        lines.append(
            "| "
            + " | ".join(
                _cell(cell)
                for cell in (
                    row["fault"],
                    row["asserted"],
                    outcome,
                    row["locks_lost"],
                    row["false_reports"],
                    row["restarts"],
                    _notes(row["notes"]),
                )
            )
            + " |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``tests/faults`` with the collector, print the table, return pytest's status.

    The abort-before-steal scenarios and the child faults run 5 times each
    (``FAULT_RUNS``, ``CHILD_RUNS``), each partition share 4 times
    (``PARTITION_RUNS``), and once in the default test run, to give their
    figures a spread.
    """
    os.environ.setdefault("FAULT_RUNS", "5")
    os.environ.setdefault("CHILD_RUNS", "5")
    # Five shares of the TTL, twice (buffered and dead connections), four times: 20 of each.
    os.environ.setdefault("PARTITION_RUNS", "4")
    collector = Collector()
    args = [
        str(ROOT / "tests" / "faults"),
        # The bullmq integration's row: a blocked event loop beside a stalled check.
        str(ROOT / BULLMQ_ROW),
        # Both modes side by side: a GIL hold in the worker, and the worker killed.
        *(str(ROOT / row) for row in ISOLATION_ROWS),
        "-q",
        "-p",
        "no:cacheprovider",
        # The rows left out of the default run (the Sentinel failovers) too.
        "-m",
        "not bench and not soak and not chaos",
        *(argv or []),
    ]
    status = pytest.main(args, plugins=[collector])
    print()
    print(table(collector))
    return int(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
