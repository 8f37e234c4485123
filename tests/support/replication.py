"""A primary and its replica, two real servers on loopback, for writes confirmed by replicas."""

from __future__ import annotations

import redis

from actors.embedded import EmbeddedServer
from tests.support.polling import wait_for
from tests.support.server import default_engine

__all__ = ["ReplicatedPair"]


class ReplicatedPair:
    """A primary and one replica of it; :meth:`detach` cuts the replica off, :meth:`attach` mends.

    Example:
        >>> with ReplicatedPair() as pair:
        ...     start_link(connection=pair.primary.url, keys=keys, replicas=1)
    """

    def __init__(self, engine: str | None = None) -> None:
        engine = engine or default_engine()
        self.primary = EmbeddedServer(engine)
        self.replica = EmbeddedServer(engine)

    def __enter__(self) -> ReplicatedPair:
        try:
            self.primary.start()
            self.replica.start()
            # The first sync otherwise waits 5 s for other replicas to join it.
            self.client().config_set("repl-diskless-sync-delay", 0)
            self.attach()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def client(self) -> redis.Redis:
        """A client of the primary."""
        return redis.Redis.from_url(self.primary.url, socket_timeout=10)

    def replica_client(self) -> redis.Redis:
        """A client of the replica."""
        return redis.Redis.from_url(self.replica.url, socket_timeout=10)

    def attach(self, timeout: float = 10.0) -> None:
        """Make the replica follow the primary; return once the primary counts it in sync."""
        with self.replica_client() as replica:
            replica.execute_command("REPLICAOF", self.primary.host, str(self.primary.port))
        with self.client() as primary:
            wait_for(lambda: self._synced(primary), timeout, "the replica in sync with its primary")

    @staticmethod
    def _synced(primary: redis.Redis) -> bool:
        # A write, then WAIT on its connection: a WAIT with no write of its own
        # counts a replica that is still loading its first sync.
        pipe = primary.pipeline(transaction=False)
        pipe.incr("replicated-pair:sync")
        pipe.execute_command("WAIT", 1, 100)  # type: ignore[no-untyped-call]
        return bool(pipe.execute()[1] >= 1)

    def flush(self) -> None:
        """Empty the primary; return once the replica is empty too."""
        with self.client() as primary:
            pipe = primary.pipeline(transaction=False)
            pipe.flushall()
            pipe.script_flush()
            pipe.execute_command("WAIT", 1, 10_000)
            assert pipe.execute()[2] >= 1, "the replica did not see the flush"

    def detach(self) -> None:
        """Cut the replica off: it keeps what it had, and confirms nothing more."""
        with self.replica_client() as replica:
            replica.execute_command("REPLICAOF", "NO", "ONE")

    def close(self) -> None:
        """Stop both servers."""
        self.replica.stop()
        self.primary.stop()
