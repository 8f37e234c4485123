"""Who holds a lock: each holder's claim, and a lock's claims together.

Pure data: nothing here talks to Redis or to an actor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, NamedTuple

if TYPE_CHECKING:
    from actors.messages import Notify

__all__ = ["PLAIN", "PLAIN_ONLY", "Claim", "Ended", "Holders", "ending", "past", "with_claim"]


class Claim(NamedTuple):
    """One holder's claim on a lock: who it is, and until when it wants the lock renewed."""

    #: Told :class:`~actors.LockLost` if the lock is lost while the claim
    #: holds; ``None`` for the plain claim of a worker that tracks without one.
    target: Notify | None
    #: Monotonic ms after which this claim ends (its ``max_hold``), or ``None``.
    deadline: int | None
    #: Ended only by an untrack that names :attr:`target` (a lease's claim).
    keep: bool = False
    #: This claim's ``safety_margin`` in ms, or ``None`` for the manager's.
    margin: int | None = None


class Holders(NamedTuple):
    """The claims of a lock that is more than one plain claim without a deadline."""

    #: Every claim on the lock's current token, in the order they were made.
    claims: tuple[Claim, ...]
    #: The claims' targets, in the same order: a lock with any is checked at every tick.
    targets: tuple[Notify, ...]
    #: The earliest of the claims' deadlines, or ``None``.
    deadline: int | None


#: What an untrack, a loss or a deadline took from one lock: its token, the
#: claims that ended (in the order they were made), and whether none is left
#: (the job is no longer tracked). A plain tuple: an untrack by the hundred
#: thousand builds one each.
Ended = tuple[str, tuple[Claim, ...], bool]

#: The claim of a job tracked plainly, without a deadline: the only one most
#: jobs have, stored as no :class:`Holders` at all.
PLAIN: Final = Claim(None, None)
#: The claims of a plainly tracked job.
PLAIN_ONLY: Final = (PLAIN,)


def with_claim(claims: tuple[Claim, ...], claim: Claim) -> tuple[Claim, ...]:
    """Return ``claims`` with ``claim`` added, or merged into the one its target made before.

    A claim made again is the same claim: it keeps its place and its hold
    deadline, which cannot slide; it only gains one it did not have.
    """
    # By identity: an actor's ``actor_ref`` is one object, and comparing
    # with ``==`` would run a target's own code on the manager's thread.
    for i, made in enumerate(claims):
        if made.target is claim.target:
            if made.deadline is None and claim.deadline is not None:
                return (*claims[:i], made._replace(deadline=claim.deadline), *claims[i + 1 :])
            return claims
    return (*claims, claim)


def ending(
    claims: tuple[Claim, ...], notify: Notify | None, *, everyone: bool = False
) -> tuple[tuple[Claim, ...], tuple[Claim, ...]]:
    """Split ``claims`` into those an untrack ends and those it keeps.

    Args:
        claims: A lock's claims.
        notify: End only the claim this target made. ``None`` ends every
            claim but those kept for their target (the leases').
        everyone: End every claim (the lock is lost).
    """
    if everyone:
        return claims, ()
    if notify is not None:
        return (
            tuple(claim for claim in claims if claim.target is notify),
            tuple(claim for claim in claims if claim.target is not notify),
        )
    return (
        tuple(claim for claim in claims if not claim.keep),
        tuple(claim for claim in claims if claim.keep),
    )


def past(claims: tuple[Claim, ...], now: int) -> tuple[tuple[Claim, ...], tuple[Claim, ...]]:
    """Split ``claims`` into those whose hold deadline is at or before ``now`` and the others."""
    return (
        tuple(c for c in claims if c.deadline is not None and c.deadline <= now),
        tuple(c for c in claims if c.deadline is None or c.deadline > now),
    )
