"""The servers the tests run against, and what a server counts about itself."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

import redis

from actors.embedded import EmbeddedServer

__all__ = ["Server", "Servers", "command_calls", "default_engine", "engines", "evalsha_calls"]


@dataclass
class Server:
    """A server the tests can reach; ``process`` is set when this run owns it."""

    #: ``"valkey"``, ``"redis"``, or ``"url"`` for ``REDIS_URL``.
    engine: str
    #: Its ``redis://`` URL.
    url: str
    #: The child process, when this run started it.
    process: EmbeddedServer | None = None

    def client(self, **options: Any) -> redis.Redis:
        """Return a new client (socket timeout 10 s unless ``options`` say otherwise)."""
        options.setdefault("socket_timeout", 10)
        client = redis.Redis.from_url(self.url, **options)
        if "db" in options:
            # A database in the URL's path wins over the keyword: apply it after.
            client.connection_pool.connection_kwargs["db"] = options["db"]
        return client


class Servers:
    """Starts each engine's private server once, on first use; ``REDIS_URL`` wins."""

    def __init__(self) -> None:
        self._started: dict[str, Server] = {}
        self._lock = threading.Lock()

    def get(self, engine: str) -> Server:
        """Return the server of ``engine``, starting it on first use."""
        url = os.environ.get("REDIS_URL")
        if url:
            return Server(engine="url", url=url)
        with self._lock:
            if engine not in self._started:
                process = EmbeddedServer(engine).start()
                self._started[engine] = Server(engine, process.url, process)
            return self._started[engine]

    def close(self) -> None:
        """Stop every server this pool started."""
        for server in self._started.values():
            if server.process is not None:
                server.process.stop()


def default_engine() -> str:
    """The engine of the run's default server: ``ACTORS_ENGINE``, else ``"valkey"``."""
    return os.environ.get("ACTORS_ENGINE", "valkey")


def engines() -> list[str]:
    """The engines that ``both_engines`` tests run on."""
    if os.environ.get("REDIS_URL"):
        return ["url"]
    return ["valkey", "redis"]


def command_calls(client: redis.Redis, *commands: str) -> int:
    """Return how many times the server ran ``commands``, from ``INFO commandstats``.

    Example:
        >>> before = command_calls(client, "evalsha", "eval")

    Args:
        client: A client of the server (a plain one: cluster nodes count apart).
        *commands: Lower-case command names, as ``INFO`` spells them.
    """
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in commands)


def evalsha_calls(client: redis.Redis) -> int:
    """Return how many EVALSHA calls the server ran (the renewal script's calls)."""
    return command_calls(client, "evalsha")
