"""A 45-second chaos run with a fixed seed: no overlap, no unexplained loss, every job done.

The long run is ``make chaos`` (``python -m tests.chaos.run``); this one keeps
the same workers, nemesis and checker, and sizes its locks for a loaded
two-core machine (5 s TTL, 1.5 s safety margin). ``make test`` runs it after
the suite, alone: its workers are timed processes of their own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.chaos.run import Settings, report, run

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.chaos

#: The seed of the pytest run: its faults are the same kinds in the same order each time.
SEED = 20240532
SECONDS = 45.0


def test_a_chaos_run_keeps_every_job_in_one_hand_and_finishes_them_all(tmp_path: Path) -> None:
    settings = Settings(SECONDS, SEED)
    verdict = run(settings, tmp_path)
    table = report(verdict, SECONDS)
    print(table)
    assert verdict.ok, table
    assert sum(verdict.faults.values()) > 0, table
    assert verdict.jobs > 0
    assert verdict.runs >= verdict.jobs
