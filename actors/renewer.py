"""The renewer seam: what a manager renews through, and what a renewal returns.

A :class:`Renewer` renews due ids with their tokens and says what happened as a
:class:`BatchOutcome`: partial failure is a value, not an exception. Managers use
:class:`~actors.scripts.RedisRenewer` unless given ``start_link(renewer=...)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from redis.exceptions import RedisError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from actors.messages import Reason

__all__ = ["BatchOutcome", "ChunkError", "Renewer", "UnconfirmedLossError"]


@dataclass(frozen=True, slots=True)
class ChunkError:
    """A script call of a batch that the server did not run."""

    #: Index of the chunk's first job in the batch.
    start: int
    #: Index one past the chunk's last job.
    stop: int
    #: What the server or the connection answered.
    error: Exception


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """What one batched renewal did."""

    #: Ids whose lock was gone or held by another token (chunks that ran).
    failed: list[str]
    #: Chunks that did not run; their jobs' locks are in an unknown state.
    errors: list[ChunkError]
    #: Why each failed id lost its lock: ``"stolen"`` or ``"expired"``.
    reasons: dict[str, Reason] = field(default_factory=dict)


class UnconfirmedLossError(RedisError):
    """The script found no lock, yet a read-back finds it held with the job's token.

    It happens while a cluster slot migrates (the script ran where only part
    of the slot's keys were), or when the read-back itself failed. The job
    stays tracked and the next tick tries it again.
    """


class Renewer(Protocol):
    """Renews a batch of locks for one manager, on the manager's thread."""

    def __call__(self, job_ids: Sequence[str], tokens: Sequence[str]) -> BatchOutcome:
        """Renew ``job_ids`` held with ``tokens``.

        Returns:
            The ids whose lock is lost (with their reasons, when known), and
            the parts of the batch whose state is unknown.

        Raises:
            Exception: Nothing is known to have run; every job is retried.
        """
        ...

    def close(self) -> None:
        """Release what the renewer owns; called once when the manager stops."""
        ...
