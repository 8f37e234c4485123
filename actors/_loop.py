"""Handing work from a thread to an asyncio loop, and settling a loop's futures.

Used wherever a manager's thread (or a bullmq fetch thread) tells code that
runs in an event loop that something happened.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable

__all__ = ["call_in_loop", "set_exception", "set_result"]

T = TypeVar("T")


def call_in_loop(
    loop: asyncio.AbstractEventLoop, callback: Callable[..., object], *args: object
) -> bool:
    """Schedule ``callback(*args)`` on ``loop`` from any thread, unless the loop is closed.

    Calls handed over from one thread run in the order they were handed over.

    Returns:
        Whether the call was handed over: ``False`` when the loop has closed
        and nobody is left to run it.
    """
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:
        return False
    return True


def set_result(waiter: asyncio.Future[T], value: T) -> None:
    """Set ``waiter``'s result unless it is done already (its task gave up, or was cancelled)."""
    if not waiter.done():
        waiter.set_result(value)


def set_exception(waiter: asyncio.Future[T], exc: BaseException) -> None:
    """Set ``waiter``'s exception unless it is done already."""
    if not waiter.done():
        waiter.set_exception(exc)
