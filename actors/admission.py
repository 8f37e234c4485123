"""What a manager lets in, by any door, checked in the caller's thread.

Everything sent to a manager — a module helper's message, a raw message, a
``manager.proxy()`` call, deferred or not — passes through :func:`admit`
before it reaches the mailbox, so each door behaves the same:

- a proxy call becomes the message of its operation, built (and so checked)
  in the caller's thread: ``proxy.track_job("", t).defer()`` raises there,
  as ``track_job(manager, "", t)`` and ``TrackJob("", t)`` do, instead of
  failing inside the actor and stopping it;
- a ``TrackJob`` without a time is stamped with the caller's clock;
- a proxy reads only a few plain values of the manager and sets none;
- anything that is not one of the manager's messages (or pykka's own, as a
  proxy or ``stop`` sends them) is refused with a ``TypeError``; what goes on
  to the manager is built here from checked parts, never the caller's object.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from pykka.messages import ProxyCall, ProxyGetAttr, ProxySetAttr, _ActorStop

from actors.messages import TrackJob
from actors.operations import MESSAGES, OPERATIONS, by_name

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["admit"]

#: The attributes a proxy may read: values, none of the manager's machinery
#: (its mailbox, its locks, its methods run from another thread).
_READABLE = frozenset({"queue_name", "actor_urn", "use_daemon_thread"})
#: Messages that need nothing done on their way in: they checked themselves.
_PASS = frozenset(MESSAGES) - {TrackJob}
#: The operations a proxy may call, for the error that names them.
_NAMES = ", ".join(operation.name for operation in OPERATIONS)

#: What a proxy's ``stop()`` is forwarded as: built here, not the caller's.
_STOP = ProxyCall(attr_path=("stop",), args=(), kwargs={})


def admit(message: Any, clock: Callable[[], int]) -> Any:
    """Return what goes on to the manager for ``message``, or raise.

    Args:
        message: What a caller sent: a message, or pykka's proxy or stop message.
        clock: The manager's monotonic clock in milliseconds, to stamp a
            ``TrackJob`` sent without a time.

    Raises:
        TypeError: Not a message the manager takes, or a proxy call with bad
            arguments.
        ValueError: A proxy call with values out of range.
        AttributeError: A proxy call of something that is not an operation, a
            read of something that is not a plain value, or any write.
    """
    cls = type(message)
    if cls is TrackJob:
        if message.ts is None:
            return dataclasses.replace(message, ts=clock())
        return message
    if cls in _PASS:
        return message
    if cls is ProxyCall:
        path, args, kwargs = _parts(message)
        operation = by_name(path[0]) if len(path) == 1 else None
        if operation is None:
            if path == ("stop",):
                if args or kwargs:
                    raise TypeError("stop() takes no arguments through a proxy")
                return _STOP
            raise AttributeError(
                f"LockManager has no operation {'.'.join(path)!r} for a proxy to call; "
                f"the operations are {_NAMES}"
            )
        return admit(operation.build(*args, **kwargs), clock)
    if cls is ProxySetAttr:
        raise AttributeError("a LockManager's attributes cannot be set through a proxy")
    if cls is ProxyGetAttr:
        path = _path(message.attr_path)
        if len(path) != 1 or path[0] not in _READABLE:
            raise AttributeError(
                f"a proxy can read only {', '.join(sorted(_READABLE))} of a LockManager, "
                f"not {'.'.join(path)!r}"
            )
        return ProxyGetAttr(attr_path=path)
    if cls is _ActorStop:
        return message
    raise TypeError(
        f"a LockManager takes its messages ({', '.join(m.__name__ for m in MESSAGES)}) "
        f"or proxy calls, got {cls.__name__}"
    )


def _path(path: object) -> tuple[str, ...]:
    """Return a proxy message's attribute path, as plain strings, or raise."""
    if type(path) is not tuple or not all(type(name) is str for name in path):
        raise TypeError(f"a proxy message's path must be a tuple of str, got {type(path).__name__}")
    return path


def _parts(message: ProxyCall) -> tuple[tuple[str, ...], tuple[Any, ...], dict[str, Any]]:
    """Return a proxy call's path, arguments and keywords, each of its plain type, or raise."""
    args, kwargs = message.args, message.kwargs
    if type(args) is not tuple or type(kwargs) is not dict:
        raise TypeError(
            "a proxy call's args must be a tuple and its kwargs a dict, got "
            f"{type(args).__name__} and {type(kwargs).__name__}"
        )
    return _path(message.attr_path), args, kwargs
