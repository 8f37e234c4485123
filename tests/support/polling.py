"""Waiting for something to happen, with a deadline instead of a guessed sleep."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, TypeVar

from actors import get_stats

if TYPE_CHECKING:
    from collections.abc import Callable

    from actors import ManagerRef

__all__ = ["wait_for", "wait_ticks"]

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T],
    timeout: float,
    what: str = "a condition",
    *,
    interval: float = 0.01,
    ignore: tuple[type[Exception], ...] = (),
) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that.

    Example:
        >>> wait_for(lambda: recorder.renewed()["j1"] >= 2, 4 * TTL / 1000, "two renewals")

    Args:
        predicate: Called at once, then every ``interval`` seconds.
        timeout: The most seconds to wait; derive it from the durations the
            test configured, with a margin.
        what: What is awaited, for the failure message.
        interval: Seconds between two calls.
        ignore: Exceptions ``predicate`` may raise while the system settles
            (a cluster being reshaped); they count as a falsy answer, and the
            last one is named in the failure message.

    Returns:
        The first truthy value ``predicate`` returned.

    Raises:
        AssertionError: ``predicate`` returned nothing truthy for ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = predicate()
        except ignore as exc:
            last_error = exc
        else:
            if value:
                return value
        if time.monotonic() > deadline:
            cause = (
                f" (last error: {type(last_error).__name__}: {last_error})" if last_error else ""
            )
            raise AssertionError(f"timed out after {timeout:.1f} s waiting for {what}{cause}")
        time.sleep(interval)


def wait_ticks(manager: ManagerRef, ticks: int, timeout: float) -> int:
    """Wait until ``manager`` has handled ``ticks`` more ticks than it had now.

    For a test that must let the manager's own timer run a few times (to see
    that a report is not repeated, say) without guessing how long that takes.

    Args:
        manager: A manager running on its own timer.
        ticks: How many more ticks to wait for.
        timeout: The most seconds to wait; a few intervals, with a margin.

    Returns:
        The manager's tick count once reached.

    Raises:
        AssertionError: Fewer ticks ran within ``timeout`` seconds.
    """
    target = get_stats(manager, timeout=timeout).ticks + ticks

    def reached() -> int:
        count = get_stats(manager, timeout=timeout).ticks
        return count if count >= target else 0

    return wait_for(reached, timeout, f"{ticks} more tick(s)")
