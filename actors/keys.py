"""Key names of one queue, as every EchoMQ and BullMQ runtime spells them.

Pure string building: a job id to its lock key and back, and the Redis
Cluster rules those names must follow.
"""

from __future__ import annotations

from redis.crc import key_slot

from actors.timing import require_text

__all__ = [
    "DEFAULT_PREFIX",
    "LOCK_SUFFIX",
    "QueueKeys",
    "check_cluster_keys",
    "hash_slot",
    "hash_tag",
    "lock_key",
]

#: The prefix EchoMQ puts before every queue's keys. BullMQ uses ``"bull"``.
DEFAULT_PREFIX = "emq"
#: What ends every lock key: ``{prefix}:{queue}:{job_id}:lock``.
LOCK_SUFFIX = ":lock"


def lock_key(key_prefix: str, job_id: str) -> str:
    """Return the lock key of ``job_id`` exactly as ``extendLocks-1.lua`` builds it.

    No check, for ids that came back from the server; :meth:`QueueKeys.lock` checks.
    """
    return key_prefix + job_id + LOCK_SUFFIX


def hash_slot(key: str) -> int:
    """Return the Redis Cluster hash slot (0-16383) of ``key``."""
    return int(key_slot(key.encode("utf-8")))


def hash_tag(key: str) -> str | None:
    """Return the hash tag of ``key``: the text Redis Cluster hashes, or ``None``.

    That is the text between the first ``{`` and the next ``}``, if not empty.
    """
    start = key.find("{")
    if start != -1:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return None


class QueueKeys:
    """The keys of one queue: ``{prefix}:{name}:...``.

    Example:
        >>> keys = QueueKeys("myqueue")
        >>> keys.lock("42")
        'emq:myqueue:42:lock'
        >>> keys.job_id("emq:myqueue:42:lock")
        '42'

    Args:
        name: The queue's name, without the prefix; ``"{myqueue}"`` keeps all
            its keys in one Redis Cluster hash slot.
        prefix: The key prefix of the deployment (``"bull"`` for BullMQ).

    Raises:
        TypeError: ``name`` or ``prefix`` is not a ``str``.
        ValueError: ``name`` or ``prefix`` is empty, ``name`` holds a ``:``, or
            ``prefix`` ends with ``:`` (the colon between them is added here).
    """

    __slots__ = ("_base", "_key_prefix", "_name", "_prefix", "_stalled")

    def __init__(self, name: str, prefix: str = DEFAULT_PREFIX) -> None:
        self._name = require_text(name, "name")
        self._prefix = require_text(prefix, "prefix")
        if ":" in name:
            head, _, tail = name.rpartition(":")
            raise ValueError(
                f"name must not contain ':', got {name!r}; for the keys "
                f"'{name}:<job_id>:lock' use QueueKeys({tail!r}, prefix={head!r})"
            )
        prefix, name = self._prefix, self._name
        if prefix.endswith(":"):
            fixed = prefix.rstrip(":")
            fix = f"QueueKeys({name!r}, prefix={fixed!r})" if fixed else "a prefix without ':'"
            raise ValueError(
                f"prefix must not end with ':', got {prefix!r}: the ':' between prefix and "
                f"name is added here, so it would give '{prefix}:{name}:<job_id>:lock'; "
                f"use {fix}"
            )
        self._build(name)

    def _build(self, name: str) -> None:
        self._name = name
        self._base = f"{self._prefix}:{name}"
        self._key_prefix = self._base + ":"
        self._stalled = self._key_prefix + "stalled"

    @classmethod
    def as_bullmq_names(cls, name: str, prefix: str) -> QueueKeys:
        """Return the keys of a queue named as bullmq-py (PyPI) accepts it.

        bullmq-py runs a queue of any name, empty or holding ``:`` included,
        with keys ``{prefix}:{name}:...``; other runtimes refuse such names.

        Raises:
            TypeError: ``name`` or ``prefix`` is not a ``str``.
            ValueError: ``prefix`` is empty, or either is not UTF-8.
        """
        if name != "" and ":" not in name:
            return cls(name, prefix)
        keys = cls("_", prefix)
        keys._build(require_text(name, "name") if name else "")
        return keys

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

        When the first ``{...}`` pair closes inside :attr:`base`, every key
        of the queue lands in one cluster slot.
        """
        return hash_tag(self._base)

    @property
    def lock_pattern(self) -> str:
        """A SCAN ``MATCH`` pattern for every lock key of the queue."""
        return _glob_escape(self._key_prefix) + "*" + LOCK_SUFFIX

    def lock(self, job_id: str) -> str:
        """Return the lock key of one job: ``{prefix}:{name}:{job_id}:lock``.

        Raises:
            TypeError: ``job_id`` is not a ``str``.
            ValueError: ``job_id`` is not a valid id (empty, not UTF-8, too long).
        """
        return lock_key(self._key_prefix, require_text(job_id, "job_id"))

    def job_id(self, lock_key: str | bytes) -> str | None:
        """Return the job id of one of this queue's lock keys, or ``None``.

        Bytes are decoded as UTF-8, undecodable bytes replaced.
        """
        key = lock_key.decode("utf-8", "replace") if isinstance(lock_key, bytes) else lock_key
        prefix = self._key_prefix
        if (
            len(key) > len(prefix) + len(LOCK_SUFFIX)
            and key.startswith(prefix)
            and key.endswith(LOCK_SUFFIX)
        ):
            return key[len(prefix) : -len(LOCK_SUFFIX)]
        return None

    def __repr__(self) -> str:
        return f"QueueKeys({self._name!r}, prefix={self._prefix!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, QueueKeys):
            return NotImplemented
        return (self._name, self._prefix) == (other._name, other._prefix)

    def __hash__(self) -> int:
        return hash((QueueKeys, self._name, self._prefix))


def check_cluster_keys(keys: QueueKeys) -> None:
    """Check that all of a queue's keys share one Redis Cluster hash slot.

    The renewal script touches lock keys it does not declare in KEYS, which a
    cluster allows only within the slot of its declared key.

    Raises:
        ValueError: The queue name and prefix carry no hash tag.
    """
    if keys.hash_tag is None:
        raise ValueError(
            f"queue keys {keys.base!r} do not share one hash slot, so the renewal script "
            f"cannot run on a Redis Cluster: put a hash tag in the queue name or the prefix, "
            f"as in QueueKeys('{{{keys.name}}}', prefix={keys.prefix!r}), which gives "
            f"'{keys.prefix}:{{{keys.name}}}:<job_id>:lock' (the same rule as BullMQ's "
            f"'{{queue}}' names)"
        )


_GLOB_SPECIAL = frozenset("\\*?[]{}^-")


def _glob_escape(text: str) -> str:
    return "".join("\\" + char if char in _GLOB_SPECIAL else char for char in text)
