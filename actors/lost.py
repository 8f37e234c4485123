"""How a lost lock is reported: the reasons, and the two records that carry them.

Pure data: nothing here talks to Redis or to an actor.
"""

from __future__ import annotations

from typing import Final, Literal

__all__ = [
    "EXPIRED",
    "MANAGER_STOPPED",
    "MAX_HOLD",
    "REASONS",
    "STOLEN",
    "LockLost",
    "LostLock",
    "Reason",
]

#: The lock holds another token, or the key holds something that is not a token.
STOLEN: Final = "stolen"
#: The lock key is gone: it expired, or somebody deleted it.
EXPIRED: Final = "expired"
#: The job held its lock longer than its ``max_hold``; the manager let it go.
MAX_HOLD: Final = "max_hold"
#: The manager stopped while the job was tracked: nobody renews its lock now.
MANAGER_STOPPED: Final = "manager_stopped"

Reason = Literal["stolen", "expired", "max_hold", "manager_stopped"]

#: Every reason, in the order above.
REASONS: Final = (STOLEN, EXPIRED, MAX_HOLD, MANAGER_STOPPED)


class LostLock(str):
    """A job id as ``on_lock_renewal_failed`` receives it: a ``str``, plus why.

    It equals, hashes and prints as the plain id, so a callback written for a
    list of ids keeps working; one that wants more reads :attr:`token` (which
    lock was lost: a report about an old lock is never read as the loss of a
    new one) and :attr:`reason`.
    """

    __slots__ = ("reason", "token")

    token: str
    reason: Reason

    def __new__(cls, job_id: str, token: str, reason: Reason) -> LostLock:
        """Make the id ``job_id`` that lost the lock ``token`` for ``reason``."""
        self = super().__new__(cls, job_id)
        self.token = token
        self.reason = reason
        return self

    @property
    def job_id(self) -> str:
        """The job's id, as a plain ``str``."""
        return str.__str__(self)

    def __repr__(self) -> str:
        return f"LostLock({self.job_id!r}, token={self.token!r}, reason={self.reason!r})"

    def __reduce__(self) -> tuple[type[LostLock], tuple[str, str, Reason]]:
        return (LostLock, (self.job_id, self.token, self.reason))


class LockLost(Exception):
    """A job's lock is lost: raised by a lease's ``check()``, told to a job actor.

    A job actor that tracked its job with ``notify=self.actor_ref`` receives
    this once, as a message, when the lock is lost (like an Erlang monitor's
    ``DOWN``). Its fields are read-only.

    Args:
        job_id: The job's id.
        token: The token of the lock that was lost.
        reason: One of :data:`REASONS`.
    """

    __slots__ = ()

    def __init__(self, job_id: str, token: str, reason: Reason) -> None:
        super().__init__(job_id, token, reason)

    @property
    def job_id(self) -> str:
        """The job's id."""
        return str(self.args[0])

    @property
    def token(self) -> str:
        """The token of the lock that was lost."""
        return str(self.args[1])

    @property
    def reason(self) -> Reason:
        """Why: ``"stolen"``, ``"expired"``, ``"max_hold"`` or ``"manager_stopped"``."""
        reason: Reason = self.args[2]
        return reason

    def __str__(self) -> str:
        return f"the lock of job {self.job_id!r} is lost ({self.reason})"

    def __repr__(self) -> str:
        return f"LockLost({self.job_id!r}, {self.token!r}, {self.reason!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LockLost):
            return NotImplemented
        return self.args == other.args

    def __hash__(self) -> int:
        return hash((LockLost, *self.args))
