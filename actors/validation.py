"""Argument checks: one rule per kind of value, one place for all of them.

Every door into a manager (the module helpers, the messages, proxy calls)
checks its arguments with these functions, so bad input fails at the caller
with the same ``TypeError`` or ``ValueError``, naming the argument, whichever
door it came through. A wrong type is a ``TypeError``; a value of the right
type that is out of range is a ``ValueError``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "MAX_DURATION_MS",
    "MAX_TEXT_BYTES",
    "is_valid_text",
    "require_batch",
    "require_callback",
    "require_int",
    "require_text",
]

#: Longest duration a manager accepts, in milliseconds (about 24.8 days): the
#: longest delay Node.js timers, and so BullMQ peers, can wait, and far inside
#: what Redis and ``threading`` accept.
MAX_DURATION_MS = 2**31 - 1

#: Longest job id or token, in UTF-8 bytes. A tick sends every due id and
#: token in one script argument; this keeps one call well inside what a server
#: accepts, so one huge id cannot fail the renewal of the jobs beside it.
MAX_TEXT_BYTES = 65536


def is_valid_text(value: object) -> bool:
    """Whether ``value`` passes :func:`require_text`, without raising."""
    if type(value) is not str or not value:
        return False
    if value.isascii():
        return len(value) <= MAX_TEXT_BYTES
    try:
        return len(value.encode("utf-8")) <= MAX_TEXT_BYTES
    except UnicodeEncodeError:
        return False


def require_text(value: object, argument: str) -> str:
    """Return ``value`` as a plain ``str`` if it is a non-empty one that encodes as UTF-8.

    Lock keys, tokens and the script's packed arguments are UTF-8 on every
    runtime, so a lone surrogate (as ``surrogateescape`` decoding leaves) could
    never name a lock. A ``str`` subclass is copied to a plain ``str``: what
    the manager keeps must not run a caller's methods (``__hash__``,
    ``__eq__``, ``__repr__``) on its thread.

    Raises:
        TypeError: ``value`` is not a ``str``.
        ValueError: ``value`` is empty, longer than :data:`MAX_TEXT_BYTES`
            bytes, or not encodable as UTF-8.
    """
    if is_valid_text(value):
        return value  # type: ignore[return-value]
    if not isinstance(value, str):
        raise TypeError(f"{argument} must be a str, got {type(value).__name__}")
    # str's own __str__ copies a subclass's characters, calling none of its methods.
    value = str.__str__(value)
    if is_valid_text(value):
        return value
    if not value:
        raise ValueError(f"{argument} must not be empty")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{argument} must encode as UTF-8, got {value!r} ({exc.reason} at {exc.start})"
        ) from None
    raise ValueError(f"{argument} must be at most {MAX_TEXT_BYTES} bytes, got {size}")


def require_int(
    value: object, argument: str, *, minimum: int = 1, maximum: int | None = None
) -> int:
    """Return ``value`` as a plain ``int`` if it is an ``int`` (not a ``bool``) within the bounds.

    An ``int`` subclass (an ``IntEnum``, say) is copied to a plain ``int``, as
    :func:`require_text` does for ``str``.

    Raises:
        TypeError: ``value`` is not an ``int``.
        ValueError: ``value`` is below ``minimum`` or above ``maximum``.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{argument} must be an int, got {type(value).__name__}")
    # int's own __index__ copies a subclass's value, calling none of its methods.
    value = int.__index__(value)
    if value < minimum:
        floor = "positive" if minimum == 1 else f"at least {minimum}"
        raise ValueError(f"{argument} must be {floor}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{argument} must be at most {maximum}, got {value}")
    return value


def require_callback(value: Any, argument: str) -> None:
    """Check that ``value`` is callable or ``None``.

    Raises:
        TypeError: It is neither.
    """
    if value is not None and not callable(value):
        raise TypeError(f"{argument} must be callable or None, got {type(value).__name__}")


def require_batch(
    job_ids: Sequence[str], tokens: Sequence[str], duration: int, *, each: bool = True
) -> None:
    """Check the arguments of one batched renewal before anything is sent.

    Args:
        job_ids: The ids to renew.
        tokens: Each id's token, in the same order.
        duration: The TTL to set, in milliseconds.
        each: Check every id and token too; a caller that checked them when
            they were tracked passes ``False`` to save a pass over the batch.

    Raises:
        TypeError: ``duration`` is not an ``int``.
        ValueError: The lengths differ, ``duration`` is not positive, or an
            id or token is not a non-empty ``str``.
    """
    if len(job_ids) != len(tokens):
        raise ValueError(
            f"job_ids and tokens must have the same length, got {len(job_ids)} and {len(tokens)}"
        )
    require_int(duration, "duration")
    if not each:
        return
    for argument, values in (("job_ids", job_ids), ("tokens", tokens)):
        for value in values:
            if not isinstance(value, str) or not value:
                raise ValueError(f"{argument} must be non-empty str, got {value!r}")
