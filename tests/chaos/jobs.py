"""What a chaos job does, written into its data by the runner and done by every worker kind.

A job is ``steps`` steps of ``step_ms`` each: sleeping, or (``busy``) a tight
pure-Python loop that keeps the GIL busy and, in the bullmq worker, blocks its
event loop. Its first ``fail_first`` attempts fail on purpose, so bullmq retries it.
The ``actors`` workers run a ``lease`` job on a thread holding a lease.
"""

from __future__ import annotations

import random
import time
from typing import Any

__all__ = ["MAX_STEP_MS", "busy", "plan"]

#: Longest step, in milliseconds: a job reads its mailbox (or its abort signal) between steps.
MAX_STEP_MS = 100


def plan(rng: random.Random, longest_ms: int) -> dict[str, Any]:
    """A random job of at most ``longest_ms`` milliseconds of work."""
    step_ms = rng.randint(20, MAX_STEP_MS)
    return {
        "steps": rng.randint(1, max(1, longest_ms // step_ms)),
        "step_ms": step_ms,
        "busy": rng.random() < 0.3,
        "fail_first": rng.choices((0, 1, 2), weights=(70, 20, 10))[0],
        # Run as a lease on a thread by the ``actors`` workers (a pykka job actor otherwise).
        "lease": rng.random() < 0.35,
    }


def busy(seconds: float) -> None:
    """Spin in pure Python for ``seconds``: the interpreter switches threads, the loop waits."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
