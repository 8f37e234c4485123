"""What a :class:`~actors.LockManager` understands, and what it says when a lock is lost.

Each message is a small immutable record, one per intent, for
``ActorRef.tell`` and ``ActorRef.ask``. Most code never builds them: the
module helpers (:func:`actors.track_job`, ...) and ``manager.proxy()`` do the
same with less typing.

A message checks its own fields when it is built, so bad input fails in the
caller's thread with the same ``TypeError`` or ``ValueError`` whichever door
it came through. The renewer seam's answer (:class:`BatchOutcome`) lives
here too: what a renewal tells the manager.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal, Protocol

from redis.exceptions import RedisError

from actors.timing import MAX_DURATION_MS, is_valid_text, require_int, require_text

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "BY_NAME",
    "EXPIRED",
    "MANAGER_STOPPED",
    "MAX_HOLD",
    "MESSAGES",
    "REASONS",
    "STOLEN",
    "UNCONFIRMED",
    "BatchOutcome",
    "ChunkError",
    "ExtendLocks",
    "GetActiveJobCount",
    "GetStats",
    "GetTrackedJobIds",
    "IsTracked",
    "LockLost",
    "LostLock",
    "NotReplicatedError",
    "Notify",
    "Reason",
    "Renewer",
    "TrackJob",
    "UnconfirmedLossError",
    "UntrackJob",
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


class LockLost(Exception):
    """A job's lock is lost: raised by a lease's ``check()``, told to a job actor.

    A job actor that tracked its job with ``notify=self.actor_ref`` receives
    this once, as a message, when the lock is lost (like an Erlang monitor's
    ``DOWN``). Two losses are equal when job, token and reason are.

    Args:
        job_id: The job's id.
        token: The token of the lock that was lost.
        reason: One of :data:`REASONS`.
        detail: One line of measured facts about the loss (the age of the
            last confirmed renewal, failed ticks, how late the timer ran...).
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


class LostLock(str):
    """A lost job's id as ``on_lock_renewal_failed`` receives it: a ``str`` carrying its loss.

    It equals, hashes and prints as the plain id, so a callback written for a
    list of ids keeps working; :attr:`lost` is the :class:`LockLost`, and
    :attr:`token` (which lock was lost), :attr:`reason` and :attr:`detail` its fields.
    """

    __slots__ = ("lost",)

    lost: LockLost

    def __new__(cls, lost: LockLost) -> LostLock:
        """Make the id of ``lost``'s job, carrying ``lost``."""
        self = super().__new__(cls, lost.job_id)
        self.lost = lost
        return self

    @property
    def job_id(self) -> str:
        """The job's id, as a plain ``str``."""
        return str.__str__(self)

    @property
    def token(self) -> str:
        """The token of the lock that was lost."""
        return self.lost.token

    @property
    def reason(self) -> Reason:
        """Why the lock was lost (see :class:`LockLost`)."""
        return self.lost.reason

    @property
    def detail(self) -> str:
        """What the manager observed about the loss (see :class:`LockLost`)."""
        return self.lost.detail

    def __repr__(self) -> str:
        return f"LostLock({self.job_id!r}, token={self.token!r}, reason={self.reason!r})"

    def __reduce__(self) -> tuple[type[LostLock], tuple[LockLost]]:
        return (LostLock, (self.lost,))


#: The range of a monotonic time in milliseconds (``ts``, ``scheduled``).
_LOW, _HIGH = -(2**62), 2**62


class Notify(Protocol):
    """Anything with a ``tell``: a pykka ``ActorRef``, or a lease."""

    def tell(self, message: Any) -> None:
        """Deliver ``message``; must not block, and must be thread-safe.

        Called on the manager's teller threads: a target hears the messages
        of one tick in order, on one thread, and may hear the next tick's on
        another.
        """
        ...


def _require_target(notify: object) -> None:
    if notify is not None and not callable(getattr(notify, "tell", None)):
        raise TypeError(
            f"notify must have a tell() method (an ActorRef), got {type(notify).__name__}"
        )


def _set(message: object, field: str, value: object) -> None:
    # A frozen dataclass's own way to store a checked value in __post_init__:
    # the plain str or int the check returned, never the caller's subclass.
    object.__setattr__(message, field, value)


@dataclass(frozen=True, slots=True)
class TrackJob:
    """Claim a job's lock: renew it while any claim on its token holds (tell).

    Each target (``notify``, compared by identity) makes its own claim, with
    its own ``max_hold``; tracking without a target makes the plain claim.
    The same claim made again changes nothing (a progress hook never delays a
    renewal nor slides a hold limit). A new token is a new lock: the old one's
    targets are told ``"stolen"``; a lock lost lately is not tracked again with
    the same token. A watched lock (one with a target) whose
    renewal is not confirmed by its deadline is let go, its targets told
    ``"unconfirmed"``; a dead ``ActorRef`` target ends its own claim at the
    next tick. Asked, a track with a target answers the lock's
    :class:`~actors.jobs.Validity`, or ``None``.
    """

    #: The name of the module helper and of the proxy method.
    operation: ClassVar[str] = "track_job"

    #: The job's id, as in its lock key ``{prefix}:{queue}:{job_id}:lock``.
    job_id: str
    #: The value the lock holds for this worker.
    token: str
    #: When the lock was taken, on the manager's monotonic clock, in
    #: milliseconds; ``None`` stamps it when the message is sent.
    ts: int | None = None
    #: Told :class:`LockLost` once if the lock is lost (with any other target
    #: the lock was tracked with); ``None`` for nobody.
    notify: Notify | None = None
    #: Most milliseconds to keep renewing the lock for this claim; ``None``
    #: for the manager's ``max_hold``.
    max_hold: int | None = None
    #: End this claim only by an untrack that names ``notify`` (a lease's
    #: claim is kept so): an untrack without a target leaves it.
    keep: bool = False
    #: This claim's safety margin in milliseconds (needs ``notify``): the
    #: lock is trusted until ``lock_duration - safety_margin`` after its last
    #: confirmed renewal's send; ``None`` for the manager's ``safety_margin``.
    safety_margin: int | None = None
    #: The holder is releasing the lock by a call that deletes it (a BullMQ
    #: move): the lock stays renewed until the claim ends, and found gone
    #: meanwhile this claim ends quietly (the lock's other claims stay, and
    #: the next renewal tells them if it is gone). Tracked again with
    #: ``False``: the release failed.
    releasing: bool = False

    def __post_init__(self) -> None:
        # The common case in one cheap test: a worker tracks by the thousand.
        if not (is_valid_text(self.job_id) and is_valid_text(self.token)):
            _set(self, "job_id", require_text(self.job_id, "job_id"))
            _set(self, "token", require_text(self.token, "token"))
        if self.ts is not None and not (type(self.ts) is int and _LOW <= self.ts <= _HIGH):
            _set(self, "ts", require_int(self.ts, "ts", minimum=_LOW, maximum=_HIGH))
        _require_target(self.notify)
        if self.max_hold is not None:
            _set(self, "max_hold", require_int(self.max_hold, "max_hold", maximum=MAX_DURATION_MS))
        if type(self.releasing) is not bool:
            raise TypeError(f"releasing must be a bool, got {type(self.releasing).__name__}")
        if self.keep is not False:
            if type(self.keep) is not bool:
                raise TypeError(f"keep must be a bool, got {type(self.keep).__name__}")
            if self.notify is None:
                raise ValueError("keep=True needs a notify target: only its untrack ends the claim")
        if self.safety_margin is not None:
            margin = require_int(
                self.safety_margin, "safety_margin", minimum=0, maximum=MAX_DURATION_MS
            )
            _set(self, "safety_margin", margin)
            if self.notify is None:
                raise ValueError("safety_margin needs a notify target: it is a watcher's margin")


@dataclass(frozen=True, slots=True)
class UntrackJob:
    """End claims on a job's lock (tell; ask to wait until it is done). Unknown ids are ignored.

    With ``notify`` it ends that target's claim alone. Without, it ends every
    claim but the kept ones (the leases'): the plain claim and each
    ``notify`` target's, untold. The lock is renewed while a claim remains.
    """

    operation: ClassVar[str] = "untrack_job"

    #: The job's id.
    job_id: str
    #: Untrack only the lock holding this token (a later lock of the job stays);
    #: ``None`` untracks whatever lock the job holds.
    token: str | None = None
    #: End only the claim this target made (compared by identity); ``None``
    #: for every claim that is not kept.
    notify: Notify | None = None

    def __post_init__(self) -> None:
        if not is_valid_text(self.job_id):
            _set(self, "job_id", require_text(self.job_id, "job_id"))
        if self.token is not None:
            _set(self, "token", require_text(self.token, "token"))
        _require_target(self.notify)


@dataclass(frozen=True, slots=True)
class ExtendLocks:
    """Renew every due lock now (ask to wait until the tick's reports were delivered).

    Sent without ``scheduled`` it is a "renew now": it renews what is due and
    leaves the timer alone. The manager's timer sends it with the time it
    fired for, which keeps the ticks on their grid.
    """

    operation: ClassVar[str] = "extend_locks"

    #: The time the timer fired for, in monotonic milliseconds.
    scheduled: int | None = None

    def __post_init__(self) -> None:
        if self.scheduled is not None:
            scheduled = require_int(self.scheduled, "scheduled", minimum=_LOW, maximum=_HIGH)
            _set(self, "scheduled", scheduled)


@dataclass(frozen=True, slots=True)
class GetActiveJobCount:
    """Ask how many jobs are tracked; the reply is an ``int``."""

    operation: ClassVar[str] = "get_active_job_count"


@dataclass(frozen=True, slots=True)
class GetTrackedJobIds:
    """Ask which jobs are tracked; the reply is a ``list[str]``."""

    operation: ClassVar[str] = "get_tracked_job_ids"


@dataclass(frozen=True, slots=True)
class IsTracked:
    """Ask whether one job is tracked; the reply is a ``bool``."""

    operation: ClassVar[str] = "is_tracked"

    #: The job's id.
    job_id: str

    def __post_init__(self) -> None:
        _set(self, "job_id", require_text(self.job_id, "job_id"))


@dataclass(frozen=True, slots=True)
class GetStats:
    """Ask for the manager's counters; the reply is a :class:`~actors.Stats`."""

    operation: ClassVar[str] = "get_stats"


#: Every message, in the order the documentation lists them.
MESSAGES: Final[tuple[type, ...]] = (
    TrackJob,
    UntrackJob,
    GetActiveJobCount,
    GetTrackedJobIds,
    IsTracked,
    GetStats,
    ExtendLocks,
)

#: Each message by the name of its helper and proxy method.
BY_NAME: Final[dict[str, type]] = {kind.operation: kind for kind in MESSAGES}  # type: ignore[attr-defined]


# -- what a renewal returns (the renewer seam) -----------------------------------


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


class NotReplicatedError(RedisError):
    """Fewer replicas confirmed a write than the caller asked for (``WAIT``, ``WAITAOF``).

    The primary ran the write; a failover to a replica that did not confirm it
    may undo it. A renewal so answered moves no watched lock's deadline.
    """

    def __init__(
        self, acked: int, wanted: int, timeout: int, command: str = "WAIT", refused: str = ""
    ) -> None:
        #: How many replicas confirmed the write.
        self.acked = acked
        #: How many were asked for.
        self.wanted = wanted
        #: How long the server was asked to wait for them, in milliseconds.
        self.timeout = timeout
        #: ``"WAIT"`` or ``"WAITAOF"``.
        self.command = command
        #: The server's error, when it refused the command itself.
        self.refused = refused
        super().__init__(
            f"{command} failed, so no replica's confirmation could be counted: {refused}"
            if refused
            else f"{acked} of {wanted} replica(s) confirmed the write within {timeout} ms "
            f"({command})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # Crosses from the child process whole, not as its message alone.
        fields = (self.acked, self.wanted, self.timeout, self.command, self.refused)
        return (type(self), fields)


class Renewer(Protocol):
    """Renews a batch of locks for one manager, on its renewal thread (``renewer=``)."""

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
