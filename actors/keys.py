"""Key names of one queue, as every EchoMQ and BullMQ runtime spells them.

Pure string building: nothing here talks to Redis.
"""

from __future__ import annotations

__all__ = ["DEFAULT_PREFIX", "QueueKeys", "hash_slot", "key_hash_tag", "require_text"]

#: The prefix EchoMQ puts before every queue's keys. BullMQ uses ``"bull"``.
DEFAULT_PREFIX = "emq"

_SLOTS = 16384


def require_text(value: object, argument: str) -> str:
    """Return ``value`` if it is a non-empty ``str``; raise naming ``argument`` otherwise.

    Raises:
        TypeError: ``value`` is not a ``str``.
        ValueError: ``value`` is empty.
    """
    if not isinstance(value, str):
        raise TypeError(f"{argument} must be a str, got {type(value).__name__}")
    if not value:
        raise ValueError(f"{argument} must not be empty")
    return value


class QueueKeys:
    """The keys of one queue: ``{prefix}:{name}:...``.

    Example:
        >>> keys = QueueKeys("myqueue")
        >>> keys.lock("42")
        'emq:myqueue:42:lock'

    Args:
        name: The queue's name. Wrap it in braces (``"{myqueue}"``) to keep all
            of the queue's keys in one hash slot on a Redis Cluster.
        prefix: The key prefix shared by all queues of one deployment.

    Raises:
        TypeError: ``name`` or ``prefix`` is not a ``str``.
        ValueError: ``name`` or ``prefix`` is empty.
    """

    __slots__ = ("_base", "_key_prefix", "_name", "_prefix", "_stalled")

    def __init__(self, name: str, prefix: str = DEFAULT_PREFIX) -> None:
        self._name = require_text(name, "name")
        self._prefix = require_text(prefix, "prefix")
        self._base = f"{self._prefix}:{self._name}"
        self._key_prefix = self._base + ":"
        self._stalled = self._key_prefix + "stalled"

    @property
    def name(self) -> str:
        """The queue's name."""
        return self._name

    @property
    def prefix(self) -> str:
        """The deployment's key prefix."""
        return self._prefix

    @property
    def base(self) -> str:
        """``{prefix}:{name}``, the stem of every key of the queue."""
        return self._base

    @property
    def key_prefix(self) -> str:
        """``{prefix}:{name}:``, with the final colon the renewal script relies on."""
        return self._key_prefix

    @property
    def stalled(self) -> str:
        """The set a stalled checker fills with active job ids each round."""
        return self._stalled

    @property
    def hash_tag(self) -> str | None:
        """The hash tag every key of the queue shares, or ``None``.

        Redis Cluster hashes only the text between the first ``{`` and the
        next ``}`` of a key. When that pair closes inside :attr:`base`, every
        key of the queue (whatever the job id) lands in one slot.
        """
        start = self._base.find("{")
        if start == -1:
            return None
        end = self._base.find("}", start + 1)
        if end <= start + 1:
            return None
        return self._base[start + 1 : end]

    def lock(self, job_id: str) -> str:
        """Return the lock key of one job: ``{prefix}:{name}:{job_id}:lock``.

        Raises:
            TypeError: ``job_id`` is not a ``str``.
            ValueError: ``job_id`` is empty.
        """
        return f"{self._key_prefix}{require_text(job_id, 'job_id')}:lock"

    def __repr__(self) -> str:
        return f"QueueKeys({self._name!r}, prefix={self._prefix!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, QueueKeys):
            return NotImplemented
        return (self._name, self._prefix) == (other._name, other._prefix)

    def __hash__(self) -> int:
        return hash((QueueKeys, self._name, self._prefix))


def key_hash_tag(key: str) -> str:
    """Return the part of ``key`` that Redis Cluster hashes.

    That is the text between the first ``{`` and the next ``}`` when it is not
    empty, and the whole key otherwise.
    """
    start = key.find("{")
    if start != -1:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key


def _crc16_xmodem(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def hash_slot(key: str) -> int:
    """Return the Redis Cluster hash slot (0-16383) of ``key``."""
    return _crc16_xmodem(key_hash_tag(key).encode("utf-8")) % _SLOTS
