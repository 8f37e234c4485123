"""The history of a chaos run: JSON lines, one file per writer, read back as one list.

Every record has a ``kind``:

- ``"run"``: ``event`` is ``"started"``, ``"lost"`` (told of a loss, or a move
  refused for want of the lock) or ``"finished"`` (bullmq moved the job:
  ``outcome`` ``"completed"`` or ``"failed"``), with ``job``, ``attempt``,
  ``token``, ``worker`` (the process's incarnation, ``thread#2``), ``base``
  (the worker's name, ``thread``), ``created`` (the job's ``timestamp``) and
  ``t``; a refused move's ``lost`` and a ``finished`` also ``seen`` (when the
  refusal or the answer came; ``t`` is when the move was sent), a ``started``
  also ``taken`` (the job's ``processedOn``) and, for BullMQ for Node.js,
  ``watched: false``;
- ``"write"``: a result written to a store (:mod:`tests.chaos.store`);
- ``"fault"``: ``fault`` (its kind), ``target`` (a worker's base name or
  ``"redis"``), ``start`` and ``end``; a ``"kill"`` names the ``incarnation``
  it killed; a fault of a replicated run gives ``synced`` (the replica held
  every write made before it), one that failed an ``error``;
- ``"hold"``: a run of the ``bullmq`` worker held the event loop its runs
  share (``target``: the base name, ``holder``: the run's token, ``start``, ``end``);
- ``"exit"``: a worker incarnation ended without being killed (``worker``, ``t``);
- ``"job"``: ``event`` ``"added"`` (``job``, ``sent``, ``t``) or ``"final"`` (``job``,
  ``state``: what bullmq says of it once the run is over);
- ``"config"``: the run's settings (``seed``, ``lock_ms``, ``grace_ms``...).

Times are ``time.time_ns()``: one machine, one clock for every process.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

__all__ = ["History", "now", "read_history"]


def now() -> int:
    """The history's clock: wall-clock nanoseconds, shared by every process of the machine."""
    return time.time_ns()


class History:
    """Appends records to one file, one ``write`` per line, so a SIGKILL tears none.

    Args:
        path: The file; created if missing, appended to otherwise.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, **record: Any) -> None:
        """Append one record."""
        os.write(self._fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())

    def close(self) -> None:
        """Close the file."""
        os.close(self._fd)


def read_history(folder: Path) -> list[dict[str, Any]]:
    """Every record of every ``*.jsonl`` file in ``folder`` (a torn last line is dropped)."""
    records: list[dict[str, Any]] = []
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
    return records
