"""Helpers of the process-isolation tests: the children of this process, read from /proc."""

from __future__ import annotations

import os
from pathlib import Path

from tests.faults.conftest import record  # noqa: F401  (the fault table's row, for its rows here)

__all__ = ["children", "gone"]


def children(parent: int | None = None) -> list[int]:
    """Return the pids of the live manager children (``actors.process.child``) of ``parent``."""
    parent = os.getpid() if parent is None else parent
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        # The command name may hold spaces: the fields after it start at the last ")".
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) == parent and b"actors.process.child" in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def gone(pid: int) -> bool:
    """Whether ``pid`` has ended (a zombie left to a reaper that is not ours counts as ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"
