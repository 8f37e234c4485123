"""examples/bullmq_worker.py runs as a script and does what it says."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "bullmq_worker.py"


def test_the_example_completes_its_blocking_job_once() -> None:
    # The example starts its own private server; its job blocks for 3 s.
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=60, check=False
    )

    assert done.returncode == 0, done.stderr
    outcome = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert outcome["result"] == "rendered"
    assert outcome["attempts_started"] == 1
    assert outcome["stalled"] == 0
    assert outcome["lost"] == 0
    # Three lock durations of blocking, one renewal per half of one.
    assert outcome["renewals"] >= 5
