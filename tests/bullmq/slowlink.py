"""A TCP proxy in a process of its own that hands each reply to the client late.

Run by the tests as ``python slowlink.py HOST PORT DELAY_MS [drop]``; it
prints the port it listens on, then forwards every connection to the server,
each chunk the server sends held ``DELAY_MS`` before the client gets it
(requests go at once). A command then runs at the server well before its
sender reads the answer: the window in which a worker's process may be stuck
(a GIL hold) with a lock taken and unread. A process of its own: the worker's
GIL hold cannot stop it. With ``drop``, a connection the server closes is
closed to the client at once and the replies still held are lost: a command
the server ran whose sender never hears of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator


async def _up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()


async def _down(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float, drop: bool
) -> None:
    held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, data = await held.get()
            if not data:
                writer.close()
                return
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            writer.write(data)
            await writer.drain()

    delivering = asyncio.ensure_future(deliver())
    while data := await reader.read(65536):
        held.put_nowait((time.monotonic() + delay, data))
    if drop:
        delivering.cancel()
        writer.close()
        return
    held.put_nowait((0.0, b""))
    await delivering


async def main(host: str, port: int, delay_ms: int, drop: bool = False) -> None:
    """Serve until killed."""

    async def link(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(host, port)
        await asyncio.gather(
            _up(client_r, server_w),
            _down(server_r, client_w, delay_ms / 1000, drop),
            return_exceptions=True,
        )

    server = await asyncio.start_server(link, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


@contextlib.contextmanager
def slow_link(
    url: str, delay_ms: int, *, drop: bool = False
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Run a link to the server at ``url`` whose replies come ``delay_ms`` late.

    With ``drop``, the replies held when the server closes a connection are lost.
    Yields its URL and its process (a test may stop it); killed at the end.
    """
    host, port = url.removeprefix("redis://").split("/")[0].split(":")
    command = [sys.executable, str(Path(__file__)), host, port, str(delay_ms)]
    proxy = subprocess.Popen([*command, "drop"] if drop else command, stdout=subprocess.PIPE)
    try:
        assert proxy.stdout is not None
        listening = proxy.stdout.readline().decode().strip()
        assert listening, "the slow link did not start"
        yield f"redis://127.0.0.1:{listening}/0", proxy
    finally:
        proxy.kill()
        proxy.wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:] == ["drop"]))
