"""Process isolation: the manager's timer and renewals in a child process.

With ``isolation="process"`` a manager starts ``python -c ... actors._child``
(see :mod:`actors._child`), an ordinary thread-mode manager with its own
Redis client built from the same settings. The manager in the worker stays
the one door: it keeps a mirror of every claim (a :class:`~actors.jobs.JobTable`),
forwards tracks, untracks and queries to the child over a socket pair, and
turns what the child reports (renewals, lost locks, failed ticks, a watcher's
:class:`~actors.LockLost`) into the user's callbacks and the targets'
``tell``, on its own thread, as in thread mode. A child that dies is started
again and given the mirror.

This module is the manager's way in: the option checks and :func:`link_for`.
The parts: :mod:`actors._spawn` starts and ends the child,
:mod:`actors._shared` holds the lease deadlines the child writes into shared
memory, :mod:`actors._forward` forwards and mirrors, and :mod:`actors._link`
runs the child's life and turns its words into callbacks.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import weakref
from typing import TYPE_CHECKING, Any, Final

from actors._forward import OWN_THREAD_TIMEOUT_S
from actors._link import MAX_RESTARTS, RESTART_WINDOW_S, ChildEvent, ChildLink
from actors._shared import SLOTS, SharedValidity
from actors._spawn import START_TIMEOUT_S, STOP_TIMEOUT_S, Failed, connection_spec
from actors.schedule import check_lock_duration

if TYPE_CHECKING:
    from collections.abc import Sequence

    from actors.keys import QueueKeys
    from actors.outcome import BatchOutcome

__all__ = [
    "ISOLATIONS",
    "MAX_RESTARTS",
    "OWN_THREAD_TIMEOUT_S",
    "RESTART_WINDOW_S",
    "SLOTS",
    "START_TIMEOUT_S",
    "STOP_TIMEOUT_S",
    "ChildEvent",
    "ChildLink",
    "Failed",
    "InChild",
    "SharedValidity",
    "check_process_options",
    "connection_spec",
    "link_for",
    "require_isolation",
]

#: The isolation modes a manager accepts.
ISOLATIONS: Final = ("thread", "process")


def check_process_options(
    lock_duration: int, renewer: object, clock: object, timer: object
) -> None:
    """Refuse what a process-mode manager cannot take: the seams that run the worker's code.

    Raises:
        TypeError: ``renewer``, ``clock`` or ``timer`` is given.
        ValueError: ``lock_duration`` is too short for a Redis lock.
    """
    check_lock_duration(lock_duration)
    for name, given in (("renewer", renewer), ("clock", clock), ("timer", timer)):
        if given is not None:
            raise TypeError(
                f"isolation='process' takes no {name}: the child process renews with its "
                "own client, clock and timer"
            )


class InChild:
    """The renewer of a process-mode manager: never called, its child renews."""

    def __call__(self, job_ids: Sequence[str], tokens: Sequence[str]) -> BatchOutcome:
        """Refuse: the worker's manager sends no renewal of its own.

        Raises:
            RuntimeError: Always.
        """
        raise RuntimeError("a process-mode manager renews in its child process")

    def close(self) -> None:
        """Nothing to release: the link closes the child."""


def require_isolation(isolation: object) -> str:
    """Return ``isolation`` if it is one of :data:`ISOLATIONS`.

    Raises:
        TypeError: It is not a ``str``.
        ValueError: It is another string.
    """
    if not isinstance(isolation, str):
        raise TypeError(f"isolation must be a str, got {type(isolation).__name__}")
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation must be 'thread' or 'process', got {isolation!r}")
    return str.__str__(isolation)


def link_for(manager: Any, connection: object, keys: QueueKeys, settings: Any) -> ChildLink:
    """Build the child link of a process-mode ``manager`` (a ``LockManager`` being built).

    Its job table becomes the mirror of the child's claims; the child's words
    reach it through its mailbox, and its reporter passes them on.
    """
    _RUNNING.add(manager)
    mailbox = manager._mailbox
    return ChildLink(
        connection=connection,
        keys=keys,
        timing=settings.timing,
        safety_margin=settings.safety_margin,
        max_batch=settings.max_batch,
        max_hold=settings.max_hold,
        mirror=manager._jobs,
        reporter=manager._reporter,
        mailbox=mailbox.put,
        idle=mailbox.empty,
        tell=manager._tell_now,
        local=manager._dispatch,
        stop=lambda: manager._actor_ref.stop(block=False),
    )


#: The process-mode managers of this process, stopped at its normal exit.
_RUNNING: weakref.WeakSet[Any] = weakref.WeakSet()
# A fork has copies of the managers but none of their threads: nothing to stop there.
os.register_at_fork(after_in_child=_RUNNING.clear)


@atexit.register
def _stop_at_exit() -> None:
    # A worker that exits normally without stopping its managers stops them
    # here: each child then leaves its locks to the worker's own release, as
    # after stop(). (Without it the child would see its worker gone, as after
    # a kill, and delete them.) Managers are daemon threads: nothing else
    # stops them.
    for manager in list(_RUNNING):
        ref = getattr(manager, "_actor_ref", None)
        if ref is not None and ref.is_alive():
            with contextlib.suppress(Exception):  # at exit: nobody is left to tell
                ref.stop(timeout=STOP_TIMEOUT_S + 1)
