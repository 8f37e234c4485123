"""The deadline memory a process-mode manager shares with its child.

An anonymous ``memfd`` (no file, nothing to clean up) holds two 64-bit cells
per watched claim: the last confirmed renewal's send time and the deadline,
written by the child whenever the server confirms a renewal of the lock, so
``Lease.check()`` stays one local read. Both processes read
``CLOCK_MONOTONIC``. :class:`Slots` hands the cells out on the worker's side.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import mmap
import os
import tempfile
from typing import TYPE_CHECKING, Final

from actors.jobs import Validity

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["SLOTS", "SharedValidity", "Slots", "shared_memory"]

logger = logging.getLogger("actors.lock_manager")

#: Watched claims (leases) whose deadline can be shared at once.
SLOTS: Final = 65536


class SharedValidity(Validity):
    """A watched lock's validity read from the memory the child writes: one read, no lock.

    The child writes the last confirmed renewal's send time and the deadline
    into two aligned 64-bit cells each time the server confirms one; a write
    and a read of one cell are single machine words.
    """

    __slots__ = ("_at", "_cells")

    def __init__(self, cells: memoryview, slot: int) -> None:
        self._cells = cells
        self._at = 2 * slot

    @property
    def confirmed(self) -> int:
        """Monotonic ms at which the last confirmed renewal was sent (or the lock taken)."""
        return int(self._cells[self._at])

    @confirmed.setter
    def confirmed(self, value: int) -> None:
        self._cells[self._at] = value

    @property
    def deadline(self) -> int:
        """Monotonic ms past which the lock may be gone at the server."""
        return int(self._cells[self._at + 1])

    @deadline.setter
    def deadline(self, value: int) -> None:
        self._cells[self._at + 1] = value

    @property
    def span(self) -> int:
        """How long after :attr:`confirmed` the lock is trusted, in ms."""
        return self.deadline - self.confirmed

    @span.setter
    def span(self, value: int) -> None:
        self.deadline = self.confirmed + value


class Slots:
    """The worker's side of the shared cells: which watched claim holds which slot.

    A slot is ``(index, serial)``: the serial tells a slot given back by the
    child from the same index handed out again since.

    Args:
        queue: The queue's name, for the log.
    """

    def __init__(self, queue: str) -> None:
        self._queue = queue
        #: The descriptor passed to each child.
        self.fd = shared_memory(SLOTS * 16)
        self._map = mmap.mmap(self.fd, SLOTS * 16)
        self.cells = memoryview(self._map).cast("q")
        self._free = list(range(SLOTS - 1, -1, -1))
        #: Slot of each (target id, job) whose deadline is shared, and its serial.
        self._held: dict[tuple[int, str], tuple[int, int]] = {}
        self._serials = itertools.count(1)
        self._warned_full = False

    def held(self, tid: int, job_id: str) -> tuple[int, int] | None:
        """The slot of target ``tid``'s claim of ``job_id``, or ``None``."""
        return self._held.get((tid, job_id))

    def take(self, tid: int, job_id: str, ts: int, span: int) -> tuple[int, int] | None:
        """Return the claim's slot, given now if it has none; ``None`` when all are taken."""
        held = self._held.get((tid, job_id))
        if held is not None:
            return held
        if not self._free:
            if not self._warned_full:
                self._warned_full = True
                logger.warning(
                    "LockManager for queue %r: more than %d watched locks at once; the "
                    "newest leases read their deadline from the manager's word only",
                    self._queue,
                    SLOTS,
                )
            return None
        slot = (self._free.pop(), next(self._serials))
        at = 2 * slot[0]
        # Until the child confirms the claim, the deadline the lock earned by being taken.
        self.cells[at] = ts
        self.cells[at + 1] = ts + span
        self._held[(tid, job_id)] = slot
        return slot

    def validity(self, slot: tuple[int, int]) -> SharedValidity:
        """The validity read from ``slot``'s cells."""
        return SharedValidity(self.cells, slot[0])

    def confirmed(self, slot: tuple[int, int]) -> int:
        """The send time of the last renewal confirmed in ``slot``, in monotonic ms."""
        return int(self.cells[2 * slot[0]])

    def freed(self, entries: Iterable[tuple[int, str, tuple[int, int]]]) -> None:
        """Take back the slots the child let go of (unless handed out again since)."""
        for tid, job_id, slot in entries:
            if self._held.get((tid, job_id)) == slot:
                del self._held[(tid, job_id)]
                self._free.append(slot[0])

    def keep(self, live: set[tuple[int, str]]) -> None:
        """Take back every slot but those of the ``live`` claims."""
        for key in [key for key in self._held if key not in live]:
            self._free.append(self._held.pop(key)[0])

    def close(self) -> None:
        """Close the descriptor; the map stays while a lease holds a view of it."""
        with contextlib.suppress(OSError):
            os.close(self.fd)


def shared_memory(size: int) -> int:
    """Return a descriptor of ``size`` bytes of shared memory that no file names."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("actors-deadlines", os.MFD_CLOEXEC)
    else:  # pragma: no cover (macOS: an unlinked temporary file)
        with tempfile.TemporaryFile() as file:
            fd = os.dup(file.fileno())
    os.ftruncate(fd, size)
    return fd
