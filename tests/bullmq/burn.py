"""A regular expression that backtracks for seconds without letting go of the GIL.

Kept apart, with nothing else imported, so a process pool's children load it fast.
"""

from __future__ import annotations

import math
import re
import time

#: Nested quantifiers: matching ``"a" * n + "b"`` tries about 2**n ways.
PATTERN = re.compile(r"(a+)+$")

#: The size calibrated against: a few hundred ms, long enough to time well.
_PROBE = 21


def backtrack(n: int) -> float:
    """Match ``"a" * n + "b"`` (it never matches); return how long it took, in seconds."""
    started = time.perf_counter()
    PATTERN.match("a" * n + "b")
    return time.perf_counter() - started


def backtrack_for(n: int, seconds: float) -> float:
    """Match as :func:`backtrack` does, again and again until ``seconds`` have passed.

    Returns how long it took, in seconds: at least ``seconds``, whatever the
    machine's load does to each match.
    """
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        backtrack(n)
    return time.perf_counter() - started


def size_for(seconds: float) -> int:
    """Return the ``n`` whose :func:`backtrack` takes about ``seconds`` here, now.

    Each step of ``n`` doubles the time; the machine's load changes it too,
    so callers check how long the match really took.
    """
    probe = min(backtrack(_PROBE) for _ in range(2))
    return _PROBE + max(0, round(math.log2(seconds / probe)))
