"""The replicated deployment of a chaos run (``CHAOS_REPLICATED=1``), and its three faults.

A :class:`~tests.support.sentinel.SentinelSet` (a primary, one replica, three
sentinels) whose replica replicates through a
:class:`~tests.faults.proxy.FaultProxy`, so that its link can be cut. The
workers reach the primary through the sentinels (:attr:`Replicated.url`).

The faults, each returning what its history record adds:

- :meth:`Replicated.fail_over`: ``SENTINEL FAILOVER``; then the old primary
  replicates the new one, through the proxy again. Given a lag, the replica's
  link is cut that long first: the replica promoted lacks the writes since;
- :meth:`Replicated.cut_link`: the proxy black-holes the replica's link a while;
- :meth:`Replicated.restart_replica`: the replica's server is killed, its
  files removed, and it starts again empty (it resyncs from the primary).

Each first confirms that the replica holds every write made so far (a write
and a ``WAIT`` on the primary: ``synced``) and ends once it does again
(``end``): a failover can undo only writes made between the two.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import redis

from tests.chaos.history import now
from tests.faults.proxy import FaultProxy
from tests.support.sentinel import SentinelSet

__all__ = ["SYNC_KEY", "Replicated"]

#: The key each fault writes to learn that the replica holds everything written before.
SYNC_KEY = "chaos:synced"
#: A sentinel calls the primary down after this long without an answer, in
#: milliseconds: no fault of this mode stops the primary, and a loaded machine
#: must not fail it over unasked.
DOWN_AFTER_MS = 5000
#: How long the replica may take to hold every write again after a fault, in seconds.
RESYNC_S = 30.0
#: Server files that keep data across a restart.
DATA_FILES = ("*.rdb", "appendonlydir", "*.aof")


class Replicated:
    """A Sentinel-managed primary and replica, the replica's link through a proxy.

    Args:
        run_s: How long the whole run may take, in seconds: the sentinels'
            failover timeout is longer, or they would point the replica back
            at the primary, around the proxy, that long after it was moved.
    """

    def __init__(self, run_s: float) -> None:
        self.sentinels = SentinelSet(
            "chaos", down_after_ms=DOWN_AFTER_MS, failover_timeout_ms=int(run_s * 1000) + 600_000
        )
        self.proxy: FaultProxy | None = None

    @property
    def url(self) -> str:
        """The Sentinel URL of the primary, as the workers take it."""
        return self.sentinels.url

    def start(self) -> None:
        """Start the processes, then move the replica's link onto the proxy."""
        self.sentinels.start()
        host, port = self.sentinels.primary()
        self.proxy = FaultProxy(host, port).start()
        self.sentinels.replicate_through((self.proxy.host, self.proxy.port))

    def close(self) -> None:
        """Stop every process and the proxy."""
        self.sentinels.close()
        if self.proxy is not None:
            self.proxy.close()

    def switches(self) -> int:
        """How many times the first sentinel saw the primary change (``+switch-master``)."""
        log = self.sentinels.sentinel_processes[0].logfile
        return log.read_text(errors="replace").count("+switch-master") if log.exists() else 0

    def client(self, **options: Any) -> redis.Redis:
        """A client of the current primary (it asks the sentinels at each connect)."""
        return self.sentinels.client(**options)

    def synced(self) -> int:
        """Wait until the replica holds every write made so far; return when (ns).

        A write on the primary, then ``WAIT 1``: replication keeps the order
        of writes, so the replica's confirmation covers every earlier one.

        Raises:
            AssertionError: Not so within :data:`RESYNC_S`.
        """
        deadline = time.monotonic() + RESYNC_S
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError, OSError, RuntimeError):
                # One connection for both: WAIT counts what its own connection wrote.
                pipe: Any = self.sentinels.admin(self.sentinels.primary()).pipeline(False)
                pipe.incr(SYNC_KEY)
                pipe.execute_command("WAIT", 1, 1000)
                if int(pipe.execute()[1]) >= 1:
                    return now()
            time.sleep(0.05)
        raise AssertionError(f"the replica did not confirm a write within {RESYNC_S} s")

    # -- faults ----------------------------------------------------------

    def fail_over(self, lag_s: float = 0.0) -> dict[str, Any]:
        """Fail over to the replica; return once the old primary replicates it through the proxy.

        Args:
            lag_s: How long the replica's link is cut before the failover is
                asked (it stays cut until the replica is the primary). The
                replica does not know its link is cut, so the sentinels
                promote it, lacking the writes of those seconds.

        Returns:
            ``synced`` (ns), the old and the new primary's ports.
        """
        assert self.proxy is not None
        synced = self.synced()
        old = self.sentinels.primary()
        if lag_s > 0:
            self.proxy.blackhole()
            time.sleep(lag_s)
        try:
            new = self.sentinels.failover()
        finally:
            # The promoted replica closed its link: what the proxy held goes nowhere.
            self.proxy.passthrough()
        # The sentinels make the old primary a replica of the new one, directly.
        self.sentinels.wait_replicating()
        self.proxy.upstream = new
        self.sentinels.replicate_through((self.proxy.host, self.proxy.port))
        self.synced()
        return {"synced": synced, "old": old[1], "new": new[1]}

    def cut_link(self, seconds: float) -> dict[str, Any]:
        """Black-hole the replica's link for ``seconds``, then let it through again.

        Returns:
            ``synced`` (ns): before the cut.
        """
        assert self.proxy is not None
        synced = self.synced()
        self.proxy.blackhole()
        time.sleep(seconds)
        self.proxy.passthrough()
        self.synced()
        return {"synced": synced}

    def restart_replica(self, down_s: float) -> dict[str, Any]:
        """Kill the replica's server, remove its files, start it empty ``down_s`` later.

        It starts as a replica of the proxy, and resyncs in full.

        Returns:
            ``synced`` (ns): before the kill; ``port``: the replica's.
        """
        assert self.proxy is not None
        synced = self.synced()
        address = self.sentinels.replica()
        server = self.sentinels.server_at(address)
        server.kill()
        _remove_data(server.data_dir)
        args = server.extra_args
        if "--replicaof" in args:
            at = args.index("--replicaof")
            del args[at : at + 3]
        args += ["--replicaof", self.proxy.host, str(self.proxy.port)]
        time.sleep(down_s)
        server.start()
        self.synced()
        return {"synced": synced, "port": address[1]}


def _remove_data(folder: Path) -> None:
    for pattern in DATA_FILES:
        for path in Path(folder).glob(pattern):
            if path.is_dir():
                for inner in path.iterdir():
                    inner.unlink()
                path.rmdir()
            else:
                path.unlink()
