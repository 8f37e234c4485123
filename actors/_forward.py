"""What a process-mode manager forwards to its child, and the mirror it keeps of it.

:class:`Forwarder` is the manager-thread half of
:class:`~actors._link.ChildLink`: it turns the manager's messages into words
for the child (tracks and untracks batched, asks answered when the child
replies), keeps the manager's job table as a mirror of the child's claims,
and hands out the shared deadline slots of watched claims. A new child is
given the whole mirror by :meth:`Forwarder._restore`; what the child says
back is the link's to handle.
"""

from __future__ import annotations

import itertools
import logging
from typing import TYPE_CHECKING, Any, Final

import pykka

from actors.messages import (
    ExtendLocks,
    GetActiveJobCount,
    GetStats,
    GetTrackedJobIds,
    IsTracked,
    TrackJob,
    UntrackJob,
)
from actors.schedule import check_safety_margin, monotonic_ms

if TYPE_CHECKING:
    from collections.abc import Callable

    from actors._shared import Slots
    from actors._spawn import ChildProcess
    from actors.jobs import JobTable, Validity
    from actors.keys import QueueKeys
    from actors.lost import LockLost
    from actors.messages import Notify
    from actors.report import Reporter
    from actors.schedule import Timing

__all__ = ["OWN_THREAD_TIMEOUT_S", "Forwarder"]

logger = logging.getLogger("actors.lock_manager")

#: Most seconds a query from the manager's own thread waits for the child.
OWN_THREAD_TIMEOUT_S: Final = 10.0
#: Messages forwarded in one write at most.
_BATCH: Final = 512

#: The query the child answers: its counters.
_QUERIES: Final[dict[type, str]] = {GetStats: "stats"}

#: The queries of what the worker tracks: its manager answers them from its own
#: job table (the mirror), at once, whether or not the child can answer.
MIRRORED: Final = frozenset({GetActiveJobCount, GetTrackedJobIds, IsTracked})


class Forwarder:
    """Forwards the manager's messages to the child and mirrors its claims.

    Used only on the manager's thread, but for the answers of forwarded asks,
    which the link's reader thread sets.
    """

    def __init__(
        self,
        *,
        keys: QueueKeys,
        timing: Timing,
        max_hold: int | None,
        mirror: JobTable,
        reporter: Reporter,
        idle: Callable[[], bool],
        tell: Callable[[list[tuple[Notify, LockLost]]], None],
        local: Callable[[Any], Any],
        shared: Slots,
    ) -> None:
        self._keys = keys
        self._timing = timing
        self._max_hold = max_hold
        self._mirror = mirror
        #: The targets of each lock the child reported lost, until it tells each of them.
        self._ended: dict[tuple[str, str], tuple[list[Notify], LockLost]] = {}
        self._reporter = reporter
        self._idle = idle
        self._tell = tell
        #: The manager's own handling, for the queries its job table answers.
        self._local = local
        self._shared = shared
        #: Targets by the id the child knows them by, and back (by identity).
        self._targets: dict[int, Notify] = {}
        self._tids: dict[int, int] = {}
        self._next_tid = itertools.count(1)
        self._prune_at = 256
        #: Forwarded asks not answered yet: request id to (word, answer).
        self._pending: dict[int, tuple[tuple[Any, ...], pykka.Future[Any]]] = {}
        self._requests = itertools.count(1)
        self._outbox: list[tuple[Any, ...]] = []
        self._child: ChildProcess | None = None

    # -- forwarding (the manager's thread) --------------------------------

    def receive(self, message: Any, envelope: Any) -> Any:
        """Handle a message the manager took from its mailbox.

        An ask forwarded to the child takes the envelope's answer, to set it
        when the child replies: pykka then sets nothing.
        """
        try:
            return self._receive(message, envelope)
        finally:
            # Sent once the mailbox is empty (or the batch full): a burst of
            # tracks costs one write, a lone untrack goes at once.
            if self._outbox and (len(self._outbox) >= _BATCH or self._idle()):
                self._flush()

    def _receive(self, message: Any, envelope: Any) -> Any:
        kind = type(message)
        if kind in MIRRORED:
            return self._local(message)
        reply = getattr(envelope, "reply_to", None) if envelope is not None else None
        if kind is TrackJob:
            return self._track(message, reply is not None)
        if kind is UntrackJob:
            # Answered here, once the mirror has let go: whatever the child
            # still reports of the claim is dropped (see the link's events), so no
            # loss can reach anyone after the answer, as in thread mode.
            word = self._untrack(message)
            if word is not None:
                self._outbox.append((*word, None))
            return None
        if kind is ExtendLocks:
            if reply is None:
                self._outbox.append(("extend", None))
            else:
                self._ask(("extend",), reply, envelope)
            return None
        query = _QUERIES.get(kind)
        if query is not None:
            if reply is not None:
                argument = message.job_id if kind is IsTracked else None
                self._ask(("ask", query, argument), reply, envelope)
            return None
        logger.warning(
            "LockManager for queue %r ignored an unknown %s message", self._keys.name, kind.__name__
        )
        return None

    def handle(self, message: Any) -> Any:
        """Handle ``message`` asked from the manager's own thread (a callback): now.

        Raises:
            pykka.Timeout: The child did not answer a query in time.
        """
        if type(message) in MIRRORED:
            return self._local(message)
        if type(message) is TrackJob:
            return self._track(message, True)
        if type(message) is UntrackJob:
            word = self._untrack(message)
            if word is not None:
                self._outbox.append((*word, None))
            self._flush()
            return None
        answer: pykka.ThreadingFuture[Any] = pykka.ThreadingFuture()
        if type(message) is ExtendLocks:
            self._ask(("extend",), answer, None)
        elif type(message) in _QUERIES:
            argument = message.job_id if type(message) is IsTracked else None
            self._ask(("ask", _QUERIES[type(message)], argument), answer, None)
        else:
            return None
        self._flush()
        return answer.get(timeout=OWN_THREAD_TIMEOUT_S)

    def _ask(self, word: tuple[Any, ...], reply: pykka.Future[Any], envelope: Any) -> None:
        request = next(self._requests)
        full = (*word, request)
        self._pending[request] = (full, reply)
        if envelope is not None:
            envelope.reply_to = None  # answered when the child replies
        self._outbox.append(full)

    def _track(self, message: TrackJob, asked: bool) -> Validity | None:
        # Built again: a message changed after it was built raises here (dropped).
        message = TrackJob(
            message.job_id,
            message.token,
            message.ts,
            message.notify,
            message.max_hold,
            message.keep,
            message.safety_margin,
        )
        job_id, token, notify = message.job_id, message.token, message.notify
        margin = message.safety_margin
        if margin is not None:
            margin = check_safety_margin(margin, self._timing)
        now = monotonic_ms()
        ts = now if message.ts is None or message.ts > now else message.ts
        max_hold = message.max_hold if message.max_hold is not None else self._max_hold
        self._mirror.track(job_id, token, ts, notify, max_hold, message.keep, margin)
        tid = None if notify is None else self._target_id(notify)
        slot: tuple[int, int] | None = None
        if asked and tid is not None:
            validity = self._mirror.valid.get(job_id)
            span = (
                validity.span
                if validity is not None
                else self._timing.lock_duration - (margin or 0)
            )
            slot = self._shared.take(tid, job_id, ts, span)
        self._outbox.append(("track", job_id, token, ts, tid, max_hold, message.keep, margin, slot))
        if slot is None:
            return None
        return self._shared.validity(slot)

    def _untrack(self, message: UntrackJob) -> tuple[Any, ...] | None:
        message = UntrackJob(message.job_id, message.token, message.notify)
        notify = message.notify
        self._mirror.untrack(message.job_id, message.token, notify)
        tid = None
        if notify is not None:
            tid = self._tids.get(id(notify))
            if tid is None:
                return None  # a target the child never heard of holds nothing there
        return ("untrack", message.job_id, message.token, tid)

    def _target_id(self, target: Notify) -> int:
        tid = self._tids.get(id(target))
        if tid is None:
            if len(self._targets) >= self._prune_at:
                self._prune()
            tid = next(self._next_tid)
            self._tids[id(target)] = tid
            self._targets[tid] = target
        return tid

    def _prune(self) -> None:
        """Forget the targets that claim nothing any more, here and in the child."""
        live = {
            id(claim.target)
            for watch in self._mirror.watches.values()
            for claim in watch.claims
            if claim.target is not None
        }
        # And those of a lost lock whose word from the child is still to come.
        live.update(id(target) for targets, _ in self._ended.values() for target in targets)
        dropped = [tid for tid, target in self._targets.items() if id(target) not in live]
        for tid in dropped:
            del self._tids[id(self._targets.pop(tid))]
        self._prune_at = max(256, 2 * len(self._targets))
        if dropped:
            self._outbox.append(("drop", dropped))

    def _flush(self) -> None:
        outbox, self._outbox = self._outbox, []
        child = self._child
        if child is None or not outbox:
            return
        try:
            child.conn.send(outbox)
        except (OSError, ValueError):
            # The child is gone: its reader says so, and the restart sends
            # the mirror and every ask still waiting.
            logger.debug("LockManager for queue %r: the child is gone", self._keys.name)

    # -- a new child ----------------------------------------------------------

    def _restore(self) -> None:
        """Give a new child every claim of the mirror, then every ask still waiting."""
        mirror, shared = self._mirror, self._shared
        live: set[tuple[int, str]] = set()
        self._outbox = []
        for job_id in mirror.ids():
            token = mirror.tokens[job_id]
            ts = mirror.stamps[job_id]
            for claim in mirror.claims(job_id):
                tid = None if claim.target is None else self._tids.get(id(claim.target))
                slot = None if tid is None else shared.held(tid, job_id)
                if slot is not None:
                    assert tid is not None
                    live.add((tid, job_id))
                    # The deadline the dead child confirmed last stands.
                    ts = max(ts, shared.confirmed(slot))
            for claim in mirror.claims(job_id):
                tid = None if claim.target is None else self._target_id(claim.target)
                slot = None if tid is None else shared.held(tid, job_id)
                max_hold = None if claim.deadline is None else max(1, claim.deadline - ts)
                self._outbox.append(
                    ("track", job_id, token, ts, tid, max_hold, claim.keep, claim.margin, slot)
                )
        shared.keep(live)
        for request in sorted(self._pending):
            self._outbox.append(self._pending[request][0])
        # Renew what is due at once: the locks aged while no child ran.
        self._outbox.append(("extend", None))
        self._flush()
