"""The worker's side of a process-mode manager's child: its life and its words.

:class:`ChildLink` starts the child (see :mod:`actors._spawn`), reads what
it says on a reader thread and puts it into the manager's mailbox, turns
those words into the user's callbacks and the targets' ``tell`` on the
manager's thread, and starts another child when one dies, giving it the
mirror. What it forwards and mirrors comes from :class:`~actors._forward.Forwarder`.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import pykka
from pykka._envelope import Envelope

from actors._forward import Forwarder
from actors._shared import SLOTS, Slots
from actors._spawn import STOP_TIMEOUT_S, Failed, connection_spec, end, spawn
from actors.lost import LockLost, LostLock
from actors.ref import ManagerStopped

if TYPE_CHECKING:
    from collections.abc import Callable

    from actors._spawn import ChildProcess
    from actors.jobs import JobTable
    from actors.keys import QueueKeys
    from actors.messages import Notify
    from actors.report import Reporter
    from actors.schedule import Timing

__all__ = ["MAX_RESTARTS", "RESTART_WINDOW_S", "ChildEvent", "ChildLink"]

logger = logging.getLogger("actors.lock_manager")

#: Restarts within :data:`RESTART_WINDOW_S` after which the manager gives up.
MAX_RESTARTS: Final = 5
#: The window of :data:`MAX_RESTARTS`, in seconds.
RESTART_WINDOW_S: Final = 60.0


@dataclass(frozen=True, slots=True)
class ChildEvent:
    """A word from the child for the manager's thread (internal: never sent by users)."""

    #: ``renewed``, ``lost``, ``error``, ``told``, ``freed`` or ``down``.
    kind: str
    #: What goes with it.
    payload: Any


class ChildLink(Forwarder):
    """The worker's side of a process-mode manager: forwards, mirrors, restarts.

    Used only on the manager's thread, but for the reader thread that puts
    the child's words into the manager's mailbox and sets the answers of
    forwarded asks.

    Args:
        connection: A ``redis.Redis`` client or a URL (see
            :func:`~actors._spawn.connection_spec`).
        keys: The queue's keys.
        timing: The manager's windows.
        safety_margin: The manager's default margin, in ms.
        max_batch: Most ids per script call.
        max_hold: The manager's ``max_hold``, or ``None``.
        mirror: The manager's job table, kept here as a mirror of the child's claims.
        reporter: The manager's reporter: its callbacks run here.
        mailbox: Puts a message in the manager's mailbox.
        idle: Whether the manager's mailbox is empty.
        tell: Tells targets their :class:`~actors.LockLost`, on the manager's thread.
        stop: Stops the manager (when the child cannot be started again).

    Raises:
        TypeError: ``connection`` cannot be used from a child process.
        ValueError: The client's encoding is not UTF-8.
        RuntimeError: The child did not start.
    """

    def __init__(
        self,
        *,
        connection: object,
        keys: QueueKeys,
        timing: Timing,
        safety_margin: int,
        max_batch: int,
        max_hold: int | None,
        mirror: JobTable,
        reporter: Reporter,
        mailbox: Callable[[Any], None],
        idle: Callable[[], bool],
        tell: Callable[[list[tuple[Notify, LockLost]]], None],
        local: Callable[[Any], Any],
        stop: Callable[[], object],
    ) -> None:
        config: dict[str, Any] = {
            "connection": connection_spec(connection),
            "queue": keys.name,
            "prefix": keys.prefix,
            "lock_duration": timing.lock_duration,
            "lock_renew_time": timing.lock_renew_time,
            "safety_margin": safety_margin,
            "max_batch": max_batch,
            "max_hold": max_hold,
            "renewed": reporter.wants("on_locks_renewed"),
            "errors": reporter.wants("on_error"),
            "log_level": logging.getLogger("actors").getEffectiveLevel(),
            "parent": os.getpid(),
            "slots": SLOTS,
        }
        super().__init__(
            keys=keys,
            timing=timing,
            max_hold=max_hold,
            mirror=mirror,
            reporter=reporter,
            idle=idle,
            tell=tell,
            local=local,
            shared=Slots(keys.name),
        )
        self._config = config
        self._post = mailbox
        self._stop_manager = stop
        self._restarts: list[float] = []
        self._generations = itertools.count(1)
        self._closing = False
        try:
            self._child = self._spawn()
        except BaseException:
            self._release()
            raise

    # -- the child's life -------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The running child's process id, or ``None``."""
        return None if self._child is None else self._child.process.pid

    def _spawn(self) -> ChildProcess:
        """Start a child and wait until it says it is ready.

        Raises:
            RuntimeError: It did not start, or said why it could not.
        """
        return spawn(self._config, self._shared.fd, next(self._generations))

    def start(self) -> None:
        """Start reading the child's words (from the manager's ``on_start``)."""
        child = self._child
        if child is not None and child.reader is None:
            child.reader = threading.Thread(
                target=self._read,
                args=(child,),
                name=f"LockManager-child-{self._keys.name}",
                daemon=True,
            )
            child.reader.start()

    def close(self) -> None:
        """Stop the child (its locks are left to the worker's own release) and free all."""
        self._closing = True
        child, self._child = self._child, None
        if child is not None:
            with contextlib.suppress(OSError, ValueError):
                child.conn.send([*self._outbox, ("stop",)])
            self._outbox = []
            try:
                child.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                logger.warning(
                    "LockManager for queue %r: the child process did not stop; killed",
                    self._keys.name,
                )
            end(child.process)
            child.conn.close()
            if child.reader is not None and child.reader is not threading.current_thread():
                child.reader.join(STOP_TIMEOUT_S)
        self._fail_pending()
        self._release()

    def _release(self) -> None:
        self._shared.close()

    def _fail_pending(self) -> None:
        pending, self._pending = self._pending, {}
        for _, answer in pending.values():
            error = ManagerStopped(f"LockManager for queue {self._keys.name!r} is stopped")
            answer.set_exception((ManagerStopped, error, None))

    def _read(self, child: ChildProcess) -> None:
        """Read the child's words until it is gone (the reader thread)."""
        while True:
            try:
                words = child.conn.recv()
            except (EOFError, OSError):
                break
            except Exception:
                logger.warning("LockManager: an unreadable word from the child", exc_info=True)
                continue
            for word in words:
                self._take(word)
        if not self._closing:
            self._put(ChildEvent("down", (child.generation,)))

    def _take(self, word: tuple[Any, ...]) -> None:
        kind = word[0]
        if kind == "reply":
            _, request, value = word
            entry = self._pending.pop(request, None)
            if entry is None:
                return
            answer = entry[1]
            if isinstance(value, Failed):
                error = value.error
                answer.set_exception((type(error), error, None))
            else:
                answer.set(value)
        elif kind == "log":
            _, level, name, text = word
            logging.getLogger(name).log(level, "%s", text)
        else:
            self._put(ChildEvent(kind, word[1:]))

    def _put(self, event: ChildEvent) -> None:
        with contextlib.suppress(pykka.ActorDeadError):
            self._post(Envelope(event, reply_to=None))

    # -- the child's words, on the manager's thread ------------------------

    def _receive(self, message: Any, envelope: Any) -> Any:
        if type(message) is ChildEvent:
            self._on_event(message)
            return None
        return super()._receive(message, envelope)

    def _on_event(self, event: ChildEvent) -> None:
        kind, payload = event.kind, event.payload
        if kind == "renewed":
            self._reporter.call("on_locks_renewed", payload[0])
        elif kind == "lost":
            self._on_lost(payload[0])
        elif kind == "error":
            self._reporter.call("on_error", payload[0])
        elif kind == "told":
            self._on_told(*payload)
        elif kind == "freed":
            self._shared.freed(payload[0])
        elif kind == "down":
            self._tell_the_ended()
            self._on_down(payload[0])

    def _on_lost(self, reported: list[LostLock]) -> None:
        # Only what the mirror still tracks: a loss the child found after the
        # worker untracked the job here is no loss of the worker's.
        tokens = self._mirror.tokens
        lost = [item for item in reported if tokens.get(item.job_id) == item.token]
        for item in lost:
            ended = self._mirror.untrack(item.job_id, item.token, everyone=True)
            targets = [] if ended is None else [c.target for c in ended[1] if c.target]
            if targets:
                # Each target's word follows from the child ("told"): still theirs to hear.
                word = LockLost(item.job_id, item.token, item.reason, item.detail)
                self._ended[(item.job_id, item.token)] = (targets, word)
        if lost:
            self._reporter.call("on_lock_renewal_failed", lost)

    def _on_told(self, tid: int, message: object) -> None:
        target = self._targets.get(tid)
        if target is not None and isinstance(message, LockLost) and self._claims(message, target):
            self._mirror.untrack(message.job_id, message.token, target)
            self._tell([(target, message)])

    def _claims(self, message: LockLost, target: Notify) -> bool:
        """Whether ``target`` claims the lock ``message`` speaks of, or did until its loss."""
        key = (message.job_id, message.token)
        ended = self._ended.get(key)
        if ended is not None and any(t is target for t in ended[0]):
            ended[0][:] = [t for t in ended[0] if t is not target]
            if not ended[0]:
                del self._ended[key]
            return True
        if self._mirror.tokens.get(message.job_id) != message.token:
            return False
        watch = self._mirror.watches.get(message.job_id)
        return watch is not None and any(claim.target is target for claim in watch.claims)

    def _tell_the_ended(self) -> None:
        """Tell the targets of a lost lock whose word died with the child."""
        ended, self._ended = self._ended, {}
        self._tell([(target, word) for targets, word in ended.values() for target in targets])

    def _on_down(self, generation: int) -> None:
        child = self._child
        if self._closing or child is None or child.generation != generation:
            return
        end(child.process)
        child.conn.close()
        logger.warning(
            "LockManager for queue %r: its child process ended (exit code %s); starting another",
            self._keys.name,
            child.process.returncode,
        )
        now = time.monotonic()
        self._restarts = [t for t in self._restarts if now - t < RESTART_WINDOW_S]
        self._restarts.append(now)
        self._child = None
        if len(self._restarts) > MAX_RESTARTS:
            logger.error(
                "LockManager for queue %r: its child process ended %d times within %g s; "
                "the manager stops",
                self._keys.name,
                len(self._restarts),
                RESTART_WINDOW_S,
            )
            self._stop_manager()
            return
        try:
            self._child = self._spawn()
        except Exception:
            logger.exception(
                "LockManager for queue %r: its child process could not be started again; "
                "the manager stops",
                self._keys.name,
            )
            self._stop_manager()
            return
        self.start()
        self._restore()
