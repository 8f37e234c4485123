"""What a process-mode manager and its child share: the deadline cells, and the words they say.

An anonymous ``memfd`` holds one 64-bit cell per watched lock: the send time
of its last confirmed renewal, written by the child. A lease's ``check()``
stays one local read, and the worker keeps each watched lock's true deadline
even while its own threads could not run (a GIL hold): the child's word may
come late, its cell never. Words go over a socket pair as lists of tuples.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import queue
import tempfile
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from actors.jobs import Validity
from actors.telemetry import Log

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from multiprocessing.connection import Connection

__all__ = ["SLOTS", "Cells", "SharedValidity", "Tick", "Writer", "map_cells"]

logger = Log("actors.lock_manager")

#: Watched locks whose deadline can be shared at once; past it a lock's
#: deadline follows the child's words alone.
SLOTS: Final = 65536


@dataclass(frozen=True, slots=True)
class Tick:
    """What one tick of the child did, for the worker's manager to apply and report."""

    #: ``"grid"``, ``"retry"`` or ``"now"`` (asked for).
    kind: str
    #: The time the tick selected and stamped at, in monotonic ms.
    at: int
    #: How late a grid tick ran, in ms.
    late_ms: int
    #: How many jobs it sent, in how many script calls, and how long it took (ms).
    jobs: int
    calls: int
    elapsed_ms: float
    #: When the answer was read, in monotonic ms.
    answered: int
    #: The ids renewed, in the batch's order (the worker's stamps follow
    #: them), as a msgpack array: a third of pickle's time each way.
    renewed: bytes
    #: Each lost lock: ``(job_id, token, reason, detail)``.
    lost: list[tuple[str, str, str, str]]
    #: The error of a renewal that did not run, and how many jobs it left unknown.
    error: Exception | None
    unknown: int
    #: The oldest stamp of the batch, for the least margin.
    oldest: int | None
    #: The worker's changes count in the last ``mark`` word read before the tick.
    mark: int | None = None
    #: The ``"extend"`` requests this tick answers.
    requests: list[int] = field(default_factory=list)
    #: The cells the child no longer writes.
    freed: list[int] = field(default_factory=list)


def shared_memory(size: int) -> int:
    """Return a descriptor of ``size`` bytes of shared memory that no file names."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("actors-deadlines", os.MFD_CLOEXEC)
    else:  # pragma: no cover (macOS: an unlinked temporary file)
        with tempfile.TemporaryFile() as file:
            fd = os.dup(file.fileno())
    os.ftruncate(fd, size)
    return fd


def map_cells(fd: int, slots: int = SLOTS) -> tuple[mmap.mmap, memoryview]:
    """Map the cells of descriptor ``fd``: the map, and its cells as 64-bit integers."""
    mapped = mmap.mmap(fd, slots * 8)
    return mapped, memoryview(mapped).cast("q")


class SharedValidity(Validity):
    """A watched lock's deadline, read from the cell the child writes: one read, no lock.

    The confirmed send time is the later of the cell's and the one the child's words told.
    """

    __slots__ = ("_cells", "_local", "slot")

    def __init__(self, cells: Cells, slot: int, confirmed: int, span: int) -> None:
        self._cells = cells
        #: The cell this lock's confirmations are written in.
        self.slot = slot
        self._local = confirmed
        super().__init__(confirmed, span)

    @property
    def confirmed(self) -> int:
        """Monotonic ms at which the last confirmed renewal was sent (or the lock taken)."""
        return max(self._local, int(self._cells.cells[self.slot]))

    @confirmed.setter
    def confirmed(self, value: int) -> None:
        self._local = value

    def release(self) -> None:
        """Give the cell back once the child has let go of it."""
        self._cells.retire(self.slot)


class Cells:
    """The worker's side of the cells: which watched lock writes in which.

    A cell given back is handed out again only once the child says it
    writes in it no more (or a new child starts), so a late write of an old
    lock never lands in a new one's cell.
    """

    def __init__(self, queue: str, slots: int | None = None) -> None:
        slots = SLOTS if slots is None else slots
        self._queue = queue
        #: The descriptor each child maps.
        self.fd = shared_memory(slots * 8)
        self._map, self.cells = map_cells(self.fd, slots)
        self.slots = slots
        self._free = list(range(slots - 1, -1, -1))
        #: Guards the free cells: a take reserves one on the fetch's thread.
        self._free_lock = threading.Lock()
        #: The cell reserved for each job a take took, until its lock is watched.
        self._taken: dict[str, int] = {}
        #: Reserved cells a newer take of their job replaced, to retire on the manager's thread.
        self._replaced: list[int] = []
        self._retired: list[int] = []
        self._unsent: list[int] = []
        self._warned = False

    def validity(self, job_id: str, confirmed: int, span: int) -> Validity:
        """A new watched lock's deadline record: in a cell, or only local if none is free.

        A lock a take took reads the cell the child has written since the take.
        """
        with self._free_lock:
            slot = self._taken.pop(job_id, None)
            if slot is None and self._free:
                slot = self._free.pop()
                # Until the child confirms a renewal: the lock's taking.
                self.cells[slot] = confirmed
        if slot is not None:
            return SharedValidity(self, slot, confirmed, span)
        if not self._warned:
            self._warned = True
            logger.warning(
                "LockManager for queue %r: more than %d watched locks at once; the newest "
                "follow the child's words alone (a long GIL hold can then end them early)",
                self._queue,
                self.slots,
                extra={"queue": self._queue},
            )
        return Validity(confirmed, span)

    def reserve(self, now: int) -> int | None:
        """Reserve a cell for a take about to be sent at ``now`` (ms); ``None`` if none is free.

        Any thread. The cell holds ``now`` until the child writes the take's
        send time, then each renewal it confirms.
        """
        with self._free_lock:
            if not self._free:
                return None
            slot = self._free.pop()
            self.cells[slot] = now
            return slot

    def bind(self, job_id: str, slot: int) -> None:
        """The take of ``slot`` took ``job_id``'s lock: its deadline will read that cell."""
        with self._free_lock:
            older = self._taken.get(job_id)
            self._taken[job_id] = slot
            if older is not None:
                # Written for an older lock of the job: freed once the child says it is done.
                self._replaced.append(older)

    def unbind(self, job_id: str, slot: int) -> None:
        """The worker let go of what the take of ``slot`` took: the cell waits for the child."""
        with self._free_lock:
            if self._taken.get(job_id) == slot:
                del self._taken[job_id]
                self._replaced.append(slot)

    def give_back(self, slot: int) -> None:
        """A reserved cell the child never wrote (its take took nothing, or never ran)."""
        with self._free_lock:
            self._free.append(slot)

    def retire(self, slot: int) -> None:
        """The lock of ``slot`` is watched no more: the cell waits for the child's word."""
        self._retired.append(slot)
        self._unsent.append(slot)

    def to_retire(self) -> list[int]:
        """The cells retired since last asked: to tell the child, which echoes them once done."""
        if self._replaced:
            with self._free_lock:
                replaced, self._replaced = self._replaced, []
            for slot in replaced:
                self.retire(slot)
        unsent, self._unsent = self._unsent, []
        return unsent

    def freed(self, slots: Iterable[int]) -> None:
        """The child writes in ``slots`` no more: they can be handed out again."""
        gone = set(slots)
        kept = [slot for slot in self._retired if slot not in gone]
        with self._free_lock:
            self._free.extend(slot for slot in self._retired if slot in gone)
        self._retired = kept

    def restart(self) -> None:
        """A new child writes nothing yet but what it is told: every retired cell is free."""
        with self._free_lock:
            self._free.extend(self._retired)
        self._retired, self._unsent = [], []

    def close(self) -> None:
        """Close the descriptor; the map stays while a lease holds a view of it."""
        with contextlib.suppress(OSError):
            os.close(self.fd)


class Writer:
    """One thread that sends a side's words over the socket, in batches, in order.

    Neither side ever waits for the other to read: a worker whose GIL is
    held, or a child that is stopped, reads nothing for a while, and its
    socket fills; only this thread waits then.
    """

    def __init__(self, conn: Connection, name: str) -> None:
        self._conn = conn
        self._words: queue.SimpleQueue[tuple[Any, ...] | Callable[[], object] | None] = (
            queue.SimpleQueue()
        )
        # Set once the thread ended: a callback given after that runs at once.
        self._ended = False
        self._end_lock = threading.Lock()
        # Held while the last callbacks run: one given meanwhile runs after them, not beside.
        self._last_lock = threading.RLock()
        self._thread = threading.Thread(target=self._write, name=name, daemon=True)
        self._thread.start()

    def put(self, *words: tuple[Any, ...]) -> None:
        """Send ``words``, after every word put before them."""
        for word in words:
            self._words.put(word)

    def then(self, sent: Callable[[], object]) -> None:
        """Call ``sent`` on this thread once every word put before it is in the socket.

        Called as well if the other side is gone, since nothing will be sent any
        more; once this writer has ended, at once on the caller's thread (an ask
        answered when its words are sent is never left unanswered).
        """
        with self._end_lock:
            if not self._ended:
                self._words.put(sent)
                return
        with self._last_lock, contextlib.suppress(Exception):
            sent()

    def close(self, timeout: float) -> None:
        """Send what is queued, then end (waiting at most ``timeout`` seconds)."""
        self._words.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _send(self, batch: list[tuple[Any, ...]]) -> bool:
        """Send ``batch``; return whether the other side is gone (a bad word is dropped)."""
        try:
            self._conn.send(batch)
        except (OSError, ValueError):
            return True  # the other side is gone: only the callbacks still run
        except Exception:
            # Pickled whole before a byte is sent: word by word, the others still go.
            for word in batch:
                try:
                    self._conn.send([word])
                except (OSError, ValueError):
                    return True
                except Exception:
                    logger.warning(
                        "a %r word for the child could not be sent", word[0], exc_info=True
                    )
        return False

    def _write(self) -> None:
        gone = False
        while True:
            word = self._words.get()
            batch: list[tuple[Any, ...]] = []
            after: list[Callable[[], object]] = []
            end = word is None
            while word is not None:
                if callable(word):
                    after.append(word)
                else:
                    batch.append(word)
                try:
                    word = self._words.get_nowait()
                except queue.Empty:
                    break
                end = word is None
            if batch and not gone:
                gone = self._send(batch)
            if not end:
                for sent in after:
                    with contextlib.suppress(Exception):
                        sent()
                continue
            with self._last_lock:
                with self._end_lock:
                    self._ended = True
                for sent in [*after, *self._left_behind()]:
                    with contextlib.suppress(Exception):
                        sent()
            return

    def _left_behind(self) -> list[Callable[[], object]]:
        """The callbacks queued after the end: their words will never be sent."""
        left = []
        with contextlib.suppress(queue.Empty):
            while True:
                word = self._words.get_nowait()
                if callable(word):
                    left.append(word)
        return left
