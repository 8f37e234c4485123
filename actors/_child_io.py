"""The child process's ways out, and its watch on the worker.

Everything the child says goes through one :class:`Writer` thread, so no
renewal ever waits for the worker (a worker whose GIL is held reads nothing
for a while); its log lines go the same way (:class:`LogForward`). Where
Linux offers it, :func:`parent_handle` gives a handle that says when the
worker ended; the child then deletes each lock it was renewing with
:func:`release_locks` (only a lock that still holds its token).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import queue
import threading
from importlib import resources
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from collections.abc import Callable
    from multiprocessing.connection import Connection

    import redis

    from actors.keys import QueueKeys

__all__ = ["RELEASE_SCRIPT", "LogForward", "Writer", "parent_handle", "portable", "release_locks"]

logger = logging.getLogger("actors._child")

#: The compare-and-delete run for each lock when the worker is gone.
RELEASE_SCRIPT: Final = "releaseLock-1.lua"


def portable(error: BaseException) -> Exception:
    """Return ``error`` if it crosses a pickle unchanged in type, else a ``RuntimeError`` of it."""
    try:
        if isinstance(error, Exception) and type(pickle.loads(pickle.dumps(error))) is type(error):
            return error
    except Exception:  # any failure to pickle means: describe it instead
        pass
    return RuntimeError(f"{type(error).__name__}: {error}")


class LogForward(logging.Handler):
    """Sends the child's log lines to the worker, which logs them as its own."""

    def __init__(self, post: Callable[[tuple[Any, ...]], None], level: int) -> None:
        super().__init__(level)
        self._post = post
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        """Send one record, formatted (with its traceback, if any)."""
        try:
            self._post(("log", record.levelno, record.name, self.format(record)))
        except Exception:
            self.handleError(record)


class Writer:
    """The one thread that sends the child's words to the worker, in batches.

    Args:
        conn: The child's end of the socket pair.
    """

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._out: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._write, name="child-writer", daemon=True)

    def put(self, word: tuple[Any, ...]) -> None:
        """Queue ``word`` for the worker."""
        self._out.put(word)

    def start(self) -> None:
        """Start the writer thread."""
        self._thread.start()

    def close(self, timeout: float) -> None:
        """Send what is queued, then end the thread (waiting at most ``timeout`` seconds)."""
        self._out.put(None)
        self._thread.join(timeout)

    def _write(self) -> None:
        """Send what the child has to say, in batches, until told to end (the writer thread)."""
        while True:
            word = self._out.get()
            batch = []
            end = word is None
            if word is not None:
                batch.append(word)
            while not end:
                try:
                    more = self._out.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    end = True
                else:
                    batch.append(more)
            if batch:
                try:
                    self._conn.send(batch)
                except (OSError, ValueError):
                    return  # the worker is gone
                except Exception:
                    logger.debug("the child could not send a batch", exc_info=True)
            if end:
                return


def parent_handle(parent: int) -> int | None:
    """Return a descriptor that is readable once process ``parent`` ended, or ``None``.

    Only where the system offers process handles (Linux' ``pidfd_open``);
    elsewhere the closing socket alone says the worker is gone.
    """
    if hasattr(os, "pidfd_open"):
        with contextlib.suppress(OSError):
            return os.pidfd_open(parent)
    return None


def release_locks(
    client: redis.Redis, keys: QueueKeys, tokens: dict[str, str], ids: list[str]
) -> None:
    """Delete each lock of ``ids`` that still holds its token in ``tokens``, in one round trip."""
    source = (resources.files("actors") / "lua" / RELEASE_SCRIPT).read_text(encoding="utf-8")
    script = client.register_script(source)
    pipe = client.pipeline(transaction=False)
    held = [(job_id, tokens[job_id]) for job_id in ids if job_id in tokens]
    for job_id, token in held:
        script(keys=[keys.lock(job_id)], args=[token], client=pipe)
    try:
        pipe.execute(raise_on_error=False)
    except Exception:
        logger.warning("the child could not release the locks of a gone worker", exc_info=True)
