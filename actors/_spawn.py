"""Starting and ending the child process of a process-mode manager.

A plain subprocess rather than ``multiprocessing``'s spawn: it does not
import the worker's ``__main__`` again (no second copy of a worker's heavy
imports, no guard needed in the user's script), starts no resource tracker,
and passes exactly two descriptors: the socket and the shared memory. The
child builds its own Redis client from what :func:`connection_spec` returns.
"""

from __future__ import annotations

import contextlib
import pickle
import socket
import subprocess
import sys
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import redis
import redis.asyncio

from actors.connection import client_settings, encoding, is_cluster

if TYPE_CHECKING:
    import threading

__all__ = [
    "START_TIMEOUT_S",
    "STOP_TIMEOUT_S",
    "ChildProcess",
    "Failed",
    "connection_spec",
    "end",
    "spawn",
]

#: Most seconds a child may take to start and answer that it is ready.
START_TIMEOUT_S: Final = 30.0
#: Most seconds a stopping child is waited for before it is killed.
STOP_TIMEOUT_S: Final = 5.0

#: The folder holding the package, put first on the child's path so that it
#: imports this very ``actors``, wherever it was imported from.
_ROOT: Final = str(Path(__file__).resolve().parents[1])
_BOOT: Final = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from actors._child import main; sys.exit(main(sys.argv[2:]))"
)


@dataclass(frozen=True, slots=True)
class Failed:
    """A request the child answered with an exception (sent as the answer)."""

    error: BaseException


@dataclass
class ChildProcess:
    """One child process and the socket to it."""

    generation: int
    process: subprocess.Popen[bytes]
    conn: Connection
    reader: threading.Thread | None = None


def connection_spec(connection: object) -> str | dict[str, Any]:
    """Return what the child builds its client from: the URL, or a client's settings.

    Raises:
        TypeError: ``connection`` is missing, a cluster or asyncio client, or
            a client whose settings cannot be sent to another process.
        ValueError: The client's encoding is not UTF-8.
    """
    if isinstance(connection, str):
        return connection
    if connection is None:
        raise TypeError("connection is required (a redis.Redis or a URL)")
    if is_cluster(connection) or isinstance(connection, redis.asyncio.RedisCluster):
        raise TypeError(
            "isolation='process' does not take a Redis Cluster client yet: use "
            "isolation='thread' with actors.connection.cluster_client(...)"
        )
    if not isinstance(connection, redis.Redis):
        raise TypeError(
            "with isolation='process', connection must be a redis.Redis or a URL, "
            f"got {type(connection).__name__}"
        )
    name = encoding(connection)
    if name.replace("_", "-").lower() not in ("utf-8", "utf8"):
        raise ValueError(
            f"connection encodes with {name!r}; lock keys and tokens are UTF-8: build the "
            "client with encoding='utf-8'"
        )
    settings = client_settings(connection)
    try:
        pickle.dumps(settings)
    except Exception as exc:
        raise TypeError(
            "the client's settings cannot be sent to the child process "
            f"({type(exc).__name__}: {exc}): pass the server's URL instead"
        ) from None
    return settings


def spawn(config: dict[str, Any], memfd: int, generation: int) -> ChildProcess:
    """Start a child with ``config`` and the shared memory, and wait until it says it is ready.

    Raises:
        RuntimeError: It did not start, or said why it could not.
    """
    ours, theirs = socket.socketpair()
    try:
        process = subprocess.Popen(
            [sys.executable, "-c", _BOOT, _ROOT, str(theirs.fileno()), str(memfd)],
            pass_fds=(theirs.fileno(), memfd),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    conn = Connection(ours.detach())
    try:
        conn.send([("start", config)])
        if not conn.poll(START_TIMEOUT_S):
            raise RuntimeError(f"the child did not start within {START_TIMEOUT_S:g} s")
        words = conn.recv()
    except BaseException as exc:
        conn.close()
        end(process)
        if isinstance(exc, EOFError):
            raise RuntimeError(
                f"the child process exited with code {process.returncode} before it "
                "was ready (see its output above)"
            ) from None
        raise
    kind, detail = words[0]
    if kind != "ready":
        conn.close()
        end(process)
        if isinstance(detail, Exception):
            raise detail
        raise RuntimeError(f"the child process could not start: {detail}")
    return ChildProcess(generation, process, conn)


def end(process: subprocess.Popen[bytes]) -> None:
    """Kill ``process`` if it still runs, and reap it: no zombie is left."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(STOP_TIMEOUT_S)
