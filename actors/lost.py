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
    "UNCONFIRMED",
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
#: No renewal was confirmed in time: the lock may have expired at the server
#: (a partition, a paused server or process). Said of a watched lock at its
#: deadline, before the server can have let another worker take the job.
UNCONFIRMED: Final = "unconfirmed"

Reason = Literal["stolen", "expired", "max_hold", "manager_stopped", "unconfirmed"]

#: Every reason, in the order above.
REASONS: Final = (STOLEN, EXPIRED, MAX_HOLD, MANAGER_STOPPED, UNCONFIRMED)


class LostLock(str):
    """A job id as ``on_lock_renewal_failed`` receives it: a ``str``, plus why.

    It equals, hashes and prints as the plain id, so a callback written for a
    list of ids keeps working; one that wants more reads :attr:`token` (which
    lock was lost: a report about an old lock is never read as the loss of a
    new one), :attr:`reason` and :attr:`detail`.
    """

    __slots__ = ("detail", "reason", "token")

    token: str
    reason: Reason
    #: One line of what the manager observed about the loss (see :class:`LockLost`).
    detail: str

    def __new__(cls, job_id: str, token: str, reason: Reason, detail: str = "") -> LostLock:
        """Make the id ``job_id`` that lost the lock ``token`` for ``reason``, and why."""
        self = super().__new__(cls, job_id)
        self.token = token
        self.reason = reason
        self.detail = detail
        return self

    @property
    def job_id(self) -> str:
        """The job's id, as a plain ``str``."""
        return str.__str__(self)

    def __repr__(self) -> str:
        return f"LostLock({self.job_id!r}, token={self.token!r}, reason={self.reason!r})"

    def __reduce__(self) -> tuple[type[LostLock], tuple[str, str, Reason, str]]:
        return (LostLock, (self.job_id, self.token, self.reason, self.detail))


class LockLost(Exception):
    """A job's lock is lost: raised by a lease's ``check()``, told to a job actor.

    A job actor that tracked its job with ``notify=self.actor_ref`` receives
    this once, as a message, when the lock is lost (like an Erlang monitor's
    ``DOWN``). Its fields are read-only.

    Two losses are equal when job, token and reason are: :attr:`detail` is
    what the manager observed, for people, not for comparing.

    Args:
        job_id: The job's id.
        token: The token of the lock that was lost.
        reason: One of :data:`REASONS`.
        detail: One line of measured facts about the loss (the age of the
            last confirmed renewal, ticks failed since and the last error,
            how late the timer ran, the hold deadline passed...).
    """

    __slots__ = ("detail",)

    def __init__(self, job_id: str, token: str, reason: Reason, detail: str = "") -> None:
        super().__init__(job_id, token, reason)
        #: One line of what the manager observed; empty when it has nothing to add.
        self.detail = detail

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
        """Why: one of :data:`REASONS` (``"stolen"``, ``"unconfirmed"``, ...)."""
        reason: Reason = self.args[2]
        return reason

    def __str__(self) -> str:
        detail = f": {self.detail}" if self.detail else ""
        return f"the lock of job {self.job_id!r} is lost ({self.reason}){detail}"

    def __repr__(self) -> str:
        return f"LockLost({self.job_id!r}, {self.token!r}, {self.reason!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LockLost):
            return NotImplemented
        return self.args == other.args

    def __hash__(self) -> int:
        return hash((LockLost, *self.args))

    def __reduce__(self) -> tuple[type[LockLost], tuple[str, str, Reason, str]]:
        return (LockLost, (self.job_id, self.token, self.reason, self.detail))
