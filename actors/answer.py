"""A manager's answer to an ask: a pykka future that also calls back once set."""

from __future__ import annotations

import logging
import sys
import threading
from typing import TYPE_CHECKING, Any, TypeVar

import pykka

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["Answer"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


class Answer(pykka.ThreadingFuture[T]):
    """A manager's answer to an ask: a pykka future that also calls back once set.

    pykka's futures can only be waited on; a callback lets asyncio code (see
    :mod:`actors.aio`) hear of the answer without a thread blocked on it.
    """

    def __init__(self) -> None:
        super().__init__()
        self._callbacks_lock = threading.Lock()
        self._callbacks: list[Callable[[Answer[T]], object]] | None = []

    def set(self, value: Any | None = None) -> None:
        """Set the answer, then run the callbacks (on the setting thread)."""
        super().set(value)
        self._settled()

    def set_exception(self, exc_info: Any = None) -> None:
        """Set the failure (``sys.exc_info()`` when ``None``), then run the callbacks."""
        if exc_info is None:
            exc_info = sys.exc_info()
        super().set_exception(exc_info)
        self._settled()

    def add_done_callback(self, callback: Callable[[Answer[T]], object]) -> None:
        """Call ``callback(self)`` once the answer is set: at once if it is already.

        It runs on the thread that sets the answer (the manager's, mostly):
        keep it short. What it raises is logged.
        """
        with self._callbacks_lock:
            if self._callbacks is not None:
                self._callbacks.append(callback)
                return
        _call_back(callback, self)

    def _settled(self) -> None:
        with self._callbacks_lock:
            callbacks, self._callbacks = self._callbacks or [], None
        for callback in callbacks:
            _call_back(callback, self)


def _call_back(callback: Callable[[Answer[T]], object], answer: Answer[T]) -> None:
    try:
        callback(answer)
    except Exception:
        logger.warning("a callback of a LockManager's answer raised", exc_info=True)
