"""A TCP proxy on loopback that injects network faults between a client and a server.

The proxy forwards bytes both ways and can be switched at run time to:

- ``"pass"``: forward everything (plus :attr:`FaultProxy.latency`, if set);
- ``"blackhole"``: move no byte and accept no connection. Open connections
  stall; new ones complete the kernel's handshake but are never answered, as
  behind a dropped route. Bytes sent meanwhile wait in the socket buffers and
  move on once the mode goes back to ``"pass"``, as TCP's retransmission would
  deliver them after a partition heals;
- ``"reset"``: every open connection and every new one is reset (RST, by
  closing with ``SO_LINGER`` 0) as soon as it is seen or sends a command.

Apart from the modes, :meth:`FaultProxy.drop_reply_to` arms a one-shot cut: the
next chunk a client sends that holds one of the given commands reaches the server, and
the connection is closed as the server's reply comes back, so the client sees
a dropped connection for a command the server ran.

Example:
    >>> with FaultProxy("127.0.0.1", 6379) as proxy:
    ...     client = redis.Redis.from_url(proxy.url, socket_timeout=0.5)
    ...     proxy.mode = "blackhole"
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
import time
from typing import TYPE_CHECKING, Literal, get_args

if TYPE_CHECKING:
    from collections.abc import Iterator
    from types import TracebackType

__all__ = ["FaultProxy", "Mode"]

Mode = Literal["pass", "blackhole", "reset"]

#: How often an idle pump or the listener looks at the mode again, in seconds.
_POLL = 0.02
_CHUNK = 65536


def _reset(sock: socket.socket) -> None:
    # SO_LINGER on with a zero timeout makes close() send RST instead of FIN.
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class _Link:
    """One proxied connection: the client's socket, the server's, two pumps."""

    def __init__(self, proxy: FaultProxy, client: socket.socket, upstream: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream = upstream
        self._lock = threading.Lock()
        self._closed = False
        #: Set once a chunk holding the armed command went to the server.
        self._cut_on_reply = False
        self.threads = [
            threading.Thread(
                target=self._pump, args=(client, upstream, True), name="proxy-up", daemon=True
            ),
            threading.Thread(
                target=self._pump, args=(upstream, client, False), name="proxy-down", daemon=True
            ),
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def close(self, *, rst: bool = False) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for sock in (self.client, self.upstream):
            if rst:
                _reset(sock)
            else:
                with contextlib.suppress(OSError):
                    sock.close()
        self.proxy._forget(self)

    def _pump(self, src: socket.socket, dst: socket.socket, to_server: bool) -> None:
        proxy = self.proxy
        try:
            while not self._closed:
                if proxy.mode == "blackhole":
                    proxy._wait_for_change(_POLL)
                    continue
                if proxy.mode == "reset":
                    self.close(rst=True)
                    return
                readable, _, _ = select.select([src], [], [], _POLL)
                if not readable:
                    continue
                data = src.recv(_CHUNK)
                if not data:
                    break
                # Bytes read just as the proxy went dark are held, not sent.
                while proxy._current() == "blackhole" and not self._closed:
                    proxy._wait_for_change(_POLL)
                if proxy._current() == "reset":
                    self.close(rst=True)
                    return
                delay = proxy.latency
                if to_server and delay > 0:
                    time.sleep(delay)
                if not to_server and self._cut_on_reply:
                    break  # the server ran the command; its reply is lost
                if to_server and proxy._take_cut(data):
                    self._cut_on_reply = True
                dst.sendall(data)
        except (OSError, ValueError):
            # The other pump closed the link, or a peer went away.
            pass
        self.close()


class FaultProxy:
    """Forwards TCP connections from a loopback port to a server, with faults.

    Args:
        upstream_host: The server's host.
        upstream_port: The server's port.
        host: Where the proxy listens.
        port: The proxy's port; a free one when 0.
    """

    def __init__(
        self, upstream_host: str, upstream_port: int, *, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.upstream = (upstream_host, upstream_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((host, port))
        self._listener.listen(128)
        self.host, self.port = self._listener.getsockname()[:2]
        self._mode: Mode = "pass"
        self._latency = 0.0
        self._changed = threading.Condition()
        self._links: set[_Link] = set()
        self._links_lock = threading.Lock()
        self._closed = False
        self._cut: tuple[bytes, ...] = ()
        #: How many connections :meth:`drop_reply_to` cut.
        self.cuts = 0
        self.accepted = 0
        self._thread = threading.Thread(target=self._serve, name="proxy-accept", daemon=True)

    @classmethod
    def to(cls, url: str) -> FaultProxy:
        """A proxy (not yet started) to the server at ``redis://HOST:PORT/...``."""
        host, port = url.removeprefix("redis://").split("/")[0].split(":")
        return cls(host, int(port))

    # -- control ---------------------------------------------------------

    @property
    def url(self) -> str:
        """``redis://HOST:PORT/0`` of the proxy."""
        return f"redis://{self.host}:{self.port}/0"

    @property
    def mode(self) -> Mode:
        """``"pass"``, ``"blackhole"`` or ``"reset"``; settable at any time."""
        return self._mode

    @mode.setter
    def mode(self, mode: Mode) -> None:
        if mode not in get_args(Mode):
            raise ValueError(f"mode must be one of {get_args(Mode)}, got {mode!r}")
        with self._changed:
            self._mode = mode
            self._changed.notify_all()
        if mode == "reset":
            for link in self.links():
                link.close(rst=True)

    @property
    def latency(self) -> float:
        """Seconds each chunk from the client waits before it is forwarded."""
        return self._latency

    @latency.setter
    def latency(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"latency must not be negative, got {seconds!r}")
        self._latency = float(seconds)

    def passthrough(self) -> None:
        """Forward everything again (latency stays as set)."""
        self.mode = "pass"

    def blackhole(self) -> None:
        """Stall every connection and answer no new one."""
        self.mode = "blackhole"

    def reset(self) -> None:
        """Reset every connection, and each new one as soon as it arrives."""
        self.mode = "reset"

    def drop_reply_to(self, *commands: str) -> None:
        """Cut the connection that next sends any of ``commands``, once the server ran it.

        The chunk holding the command (as RESP sends it, ``$4\\r\\nEXEC\\r\\n``
        for ``"EXEC"``) is forwarded; the server's answer is not, and both
        sides are closed. One cut per call, on whichever command comes first.
        """
        with self._changed:
            self._cut = tuple(b"$%d\r\n%s\r\n" % (len(c), c) for c in map(str.encode, commands))

    @contextlib.contextmanager
    def fault(self, mode: Mode) -> Iterator[FaultProxy]:
        """Hold ``mode`` for the ``with`` block, then go back to ``"pass"``."""
        self.mode = mode
        try:
            yield self
        finally:
            self.mode = "pass"

    def links(self) -> list[_Link]:
        """The connections open through the proxy right now."""
        with self._links_lock:
            return list(self._links)

    # -- lifecycle -------------------------------------------------------

    def start(self) -> FaultProxy:
        """Start accepting connections."""
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop listening and close every connection."""
        self._closed = True
        with self._changed:
            self._changed.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        with contextlib.suppress(OSError):
            self._listener.close()
        for link in self.links():
            link.close()
            for thread in link.threads:
                if thread is not threading.current_thread():
                    thread.join(timeout=5)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- internals -------------------------------------------------------

    def _current(self) -> Mode:
        # A call, not the property, so a type checker does not narrow the
        # mode across a wait: another thread may change it at any time.
        return self._mode

    def _wait_for_change(self, timeout: float) -> None:
        with self._changed:
            self._changed.wait(timeout)

    def _take_cut(self, data: bytes) -> bool:
        with self._changed:
            if not any(cut.lower() in data.lower() for cut in self._cut):
                return False
            self._cut = ()
            self.cuts += 1
            return True

    def _forget(self, link: _Link) -> None:
        with self._links_lock:
            self._links.discard(link)

    def _serve(self) -> None:
        while not self._closed:
            if self._mode == "blackhole":
                # Leave new connections in the kernel's backlog: their
                # handshake completes, but nobody ever reads or answers.
                self._wait_for_change(_POLL)
                continue
            readable, _, _ = select.select([self._listener], [], [], _POLL)
            if not readable or self._closed:
                continue
            try:
                client, _ = self._listener.accept()
            except OSError:
                continue
            self.accepted += 1
            if self._mode != "pass":
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                _reset(client)
                continue
            for sock in (client, upstream):
                sock.settimeout(None)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = _Link(self, client, upstream)
            with self._links_lock:
                self._links.add(link)
            link.start()
