"""A manager's mailbox: first in, first out, but for its own timer's tick.

pykka builds each actor's mailbox through the actor type's
``_create_actor_inbox``; a :class:`~actors.LockManager` builds this one.
"""

from __future__ import annotations

import queue
from typing import Any

import pykka

__all__ = ["TicksFirst"]


class TicksFirst(queue.Queue[Any]):
    """A manager's mailbox: first in, first out, except its own timer's tick, which goes first.

    A backlog (a burst of tells from many threads) would otherwise hold each
    tick behind all of it, and every lock would wait for the backlog to drain.
    Nothing is lost by the jump: tracks carry their caller's time, and a
    caller who must not race a tick untracks with ``wait=True``. Only the
    message the timer's thread is sending right now jumps: an
    ``ExtendLocks`` anyone else sends waits its turn.
    """

    def __init__(self) -> None:
        super().__init__()
        #: The tick the timer's thread is putting in, if any.
        self.tick: object = None
        #: How many messages at the front go before any tick put from now on:
        #: up to the last one put by :meth:`put_before_ticks`.
        self.first = 0
        #: The timer's tick waiting in the queue, if any.
        self.queued_tick: Any = None
        #: The envelope taken last: a process-mode manager answers some asks later.
        self.current: Any = None
        #: Set, under the queue's lock, as the manager begins to stop: a
        #: message is then either in already (answered, or failed by pykka's
        #: last pass over the mailbox) or refused here, never left unread.
        self.closed = False

    def _put(self, item: Any) -> None:
        # queue.Queue's documented override point, called under its lock.
        if self.closed:
            raise pykka.ActorDeadError("the manager is stopping")
        if item.message is self.tick:
            self.tick = None
            self.queued_tick = item
            self.queue.insert(self.first, item)
        else:
            self.queue.append(item)

    def _get(self) -> Any:
        if self.first:
            self.first -= 1
        self.current = item = self.queue.popleft()
        if item is self.queued_tick:
            self.queued_tick = None
        return item

    def put_before_ticks(self, item: Any) -> None:
        """Put ``item`` last, and every tick, waiting or to come, after it.

        First in, first out with every other message (a track sent before it
        is handled before it); only the timer's tick gives way.

        Raises:
            pykka.ActorDeadError: The manager is stopping.
        """
        with self.not_empty:
            if self.closed:
                raise pykka.ActorDeadError("the manager is stopping")
            tick = self.queued_tick
            if tick is not None:
                self.queue.remove(tick)
            self.queue.append(item)
            self.first = len(self.queue)
            if tick is not None:
                self.queue.append(tick)
            self.unfinished_tasks += 1
            self.not_empty.notify()

    def close(self) -> None:
        """Refuse every message from now on."""
        with self.mutex:
            self.closed = True
