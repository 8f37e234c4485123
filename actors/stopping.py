"""How a manager stops: nothing left unanswered, every watcher told, its parts closed.

As it stops a manager refuses every later message (its mailbox closes),
lets go of every watched lock (each target is told ``"manager_stopped"``),
takes what is left in its mailbox, telling the target of each ``TrackJob``
there too, answers every ask among it with :class:`~actors.ManagerStopped`,
and closes its timer and renewer.
"""

from __future__ import annotations

import logging
import queue
from typing import TYPE_CHECKING, Any

from pykka.messages import _ActorStop

from actors.lost import MANAGER_STOPPED, LockLost
from actors.messages import TrackJob
from actors.ref import ManagerStopped
from actors.tally import Tally

if TYPE_CHECKING:
    from collections.abc import Mapping

    import pykka

    from actors.jobs import JobTable, LostLocks
    from actors.mailbox import TicksFirst
    from actors.tally import Note

__all__ = ["Ask", "answer_stopped", "close_quietly", "let_go", "refuse_the_rest"]

logger = logging.getLogger("actors.lock_manager")

#: An ask found in the mailbox: the message, and where its answer goes.
Ask = tuple[Any, "pykka.Future[Any]"]


def let_go(jobs: JobTable) -> Tally:
    """Untrack every watched lock, with a ``"manager_stopped"`` note for each target."""
    tally = Tally()
    for job_id in list(jobs.watches):
        tally.forget(jobs, job_id, MANAGER_STOPPED, remember=False, detail="the manager stopped")
    return tally


def refuse_the_rest(mailbox: TicksFirst, notes: list[Note], lost: LostLocks) -> list[Ask]:
    """Take what is left in the mailbox; return the asks among it, to answer as stopped.

    pykka's own last pass would fail each ask with a bare
    ``ActorDeadError``, and drop a ``TrackJob`` whose target then never
    hears that nobody renews its lock: each such target not told yet gets a
    note in ``notes``.
    """
    told = {(id(target), message.job_id) for target, message in notes}
    asks: list[Ask] = []
    while True:
        try:
            envelope = mailbox.get_nowait()
        except queue.Empty:
            return asks
        message = envelope.message
        if type(message) is TrackJob and message.notify is not None:
            target, job_id, token = message.notify, message.job_id, message.token
            if (id(target), job_id) not in told and not _was_told(lost, job_id, token, target):
                told.add((id(target), job_id))
                notes.append((target, LockLost(job_id, token, MANAGER_STOPPED)))
        if envelope.reply_to is not None:
            asks.append((message, envelope.reply_to))


def _was_told(lost: LostLocks, job_id: str, token: str, target: object) -> bool:
    gone = lost.get(job_id, token) if lost else None
    return gone is not None and any(known is target for known in gone.told)


def answer_stopped(asks: list[Ask], queue_name: str) -> None:
    """Answer each ask with :class:`~actors.ManagerStopped` (a stop with ``None``, as pykka)."""
    for message, reply in asks:
        if isinstance(message, _ActorStop):
            reply.set(None)  # as pykka answers a second stop
        else:
            error = ManagerStopped(f"LockManager for queue {queue_name!r} is stopped")
            reply.set_exception((ManagerStopped, error, None))


def close_quietly(queue_name: str, parts: Mapping[str, object]) -> None:
    """Call each part's ``close()``, if it has one; a failure is logged, never raised."""
    for what, part in parts.items():
        close = getattr(part, "close", None)
        if close is None:
            continue
        try:
            close()
        except BaseException:
            # Left to pykka, a BaseException here would stop every actor.
            logger.warning(
                "LockManager for queue %r: closing its %s failed",
                queue_name,
                what,
                exc_info=True,
            )
