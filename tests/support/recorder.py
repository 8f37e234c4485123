"""A thread-safe record of what a manager told its callbacks."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import TYPE_CHECKING, Any, TypedDict

from actors import start_link

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from actors import LostLock, ManagerRef, QueueKeys
    from actors.connection import Client

__all__ = ["Callbacks", "Recorder"]


class Callbacks(TypedDict):
    """The three callback keywords of ``start_link``, as :meth:`Recorder.callbacks` gives them."""

    on_locks_renewed: Callable[[list[str]], None]
    on_lock_renewal_failed: Callable[[list[LostLock]], None]
    on_error: Callable[[Exception], None]


class Recorder:
    """Records ``on_locks_renewed``, ``on_lock_renewal_failed`` and ``on_error`` calls.

    The manager calls them on its delivery thread, once the step that
    decided them is done (a test that looks right after a ``settle`` waits
    for them: :meth:`wait`, or :func:`~tests.support.manual.delivered`); the
    test reads them from its thread. Each call is kept with the monotonic time (in seconds,
    ``time.monotonic()``) it was made at, so a test can ask what happened
    after a moment, and :meth:`wait` wakes as soon as a call changes the answer.

    Example:
        >>> recorder = Recorder()
        >>> manager = recorder.start(url, KEYS, lock_duration=800)
        >>> recorder.wait_renewed(tokens, timeout=3 * TTL / 1000)
        >>> assert recorder.lost() == [] and recorder.errors() == []
    """

    def __init__(self) -> None:
        # Re-entrant: a predicate given to wait() reads through the methods below.
        self._changed = threading.Condition(threading.RLock())
        self._renewals: list[tuple[float, list[str]]] = []
        self._losses: list[tuple[float, list[LostLock]]] = []
        self._errors: list[tuple[float, Exception]] = []

    # -- the callbacks -----------------------------------------------------

    def on_locks_renewed(self, job_ids: list[str]) -> None:
        """Record one tick's renewed ids."""
        with self._changed:
            self._renewals.append((time.monotonic(), list(job_ids)))
            self._changed.notify_all()

    def on_lock_renewal_failed(self, lost: list[LostLock]) -> None:
        """Record one report of lost locks."""
        with self._changed:
            self._losses.append((time.monotonic(), list(lost)))
            self._changed.notify_all()

    def on_error(self, error: Exception) -> None:
        """Record one failed tick's exception."""
        with self._changed:
            self._errors.append((time.monotonic(), error))
            self._changed.notify_all()

    def callbacks(self) -> Callbacks:
        """Return the three callbacks as keyword arguments for ``start_link``."""
        return {
            "on_locks_renewed": self.on_locks_renewed,
            "on_lock_renewal_failed": self.on_lock_renewal_failed,
            "on_error": self.on_error,
        }

    def start(self, connection: Client | str, keys: QueueKeys, **options: Any) -> ManagerRef:
        """Start a manager (``start_link``) whose three callbacks this recorder records.

        Args:
            connection: The manager's client or URL.
            keys: The queue's keys.
            **options: Any other keyword of ``start_link``.
        """
        return start_link(connection=connection, keys=keys, **self.callbacks(), **options)

    # -- what was recorded -------------------------------------------------

    def renewed(self, since: float | None = None) -> Counter[str]:
        """Return how many times each id was renewed (after ``since``, monotonic seconds)."""
        with self._changed:
            return Counter(
                job_id for at, ids in self._renewals if _after(at, since) for job_id in ids
            )

    def lost(self, since: float | None = None) -> list[LostLock]:
        """Return every lost lock reported (after ``since``), in order, repeats included."""
        with self._changed:
            return [item for at, lost in self._losses if _after(at, since) for item in lost]

    def lost_counts(self, since: float | None = None) -> Counter[str]:
        """Return how many times each id was reported lost (after ``since``)."""
        return Counter(item.job_id for item in self.lost(since))

    def errors(self, since: float | None = None) -> list[Exception]:
        """Return the exceptions ``on_error`` got (after ``since``), in order."""
        with self._changed:
            return [error for at, error in self._errors if _after(at, since)]

    # -- waiting -----------------------------------------------------------

    def wait(self, predicate: Callable[[], object], timeout: float, what: str) -> None:
        """Wait until ``predicate`` is true, checking it each time a callback runs.

        Raises:
            AssertionError: It was not true within ``timeout`` seconds.
        """
        with self._changed:
            if not self._changed.wait_for(predicate, timeout):
                raise AssertionError(f"timed out after {timeout:.1f} s waiting for {what}")

    def wait_renewed(
        self, job_ids: Iterable[str], timeout: float, *, since: float | None = None
    ) -> None:
        """Wait until every one of ``job_ids`` was renewed (after ``since``).

        Raises:
            AssertionError: Some were not renewed within ``timeout`` seconds.
        """
        wanted = set(job_ids)

        def renewed() -> bool:
            return self.renewed(since).keys() >= wanted

        self.wait(renewed, timeout, f"the renewal of {len(wanted)} job(s)")


def _after(at: float, since: float | None) -> bool:
    return since is None or at > since
