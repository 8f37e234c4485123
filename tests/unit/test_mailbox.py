"""The manager's mailbox: in order but for the manager's own messages; exact as it closes."""

from __future__ import annotations

import queue
import threading

import pykka
import pytest
from pykka._envelope import Envelope

from actors import TrackJob, UntrackJob
from actors.lock_manager import Fired, TicksFirst

#: Longest wait for another thread, in seconds.
WAIT_S = 10.0


def tell(job_id: str) -> Envelope[object]:
    return Envelope(UntrackJob(job_id), reply_to=None)


def fire(at: int) -> Envelope[object]:
    return Envelope(Fired(at), reply_to=None)


def drain(mailbox: TicksFirst) -> list[object]:
    """What pykka's teardown takes: ``get`` while not ``empty``."""
    taken = []
    while not mailbox.empty():
        taken.append(mailbox.get().message)
    return taken


def test_tells_come_in_order_and_the_managers_own_messages_first() -> None:
    mailbox = TicksFirst()
    for envelope in (tell("a"), fire(1), tell("b"), fire(2), tell("c")):
        mailbox.put(envelope)

    taken = [mailbox.get().message for _ in range(5)]

    assert taken == [Fired(1), Fired(2), UntrackJob("a"), UntrackJob("b"), UntrackJob("c")]
    assert mailbox.empty()
    with pytest.raises(queue.Empty):
        mailbox.get_nowait()


def test_the_envelope_taken_last_is_kept_for_a_later_answer() -> None:
    mailbox = TicksFirst()
    envelope = tell("a")
    mailbox.put(envelope)
    assert mailbox.get() is envelope
    assert mailbox.current is envelope


def test_empty_is_exact_once_the_jumps_were_taken() -> None:
    # Each jump leaves a marker in the queue; neither empty nor get may stop at one.
    mailbox = TicksFirst()
    mailbox.put(fire(1))
    mailbox.put(fire(2))
    assert mailbox.get().message == Fired(1)
    assert mailbox.get().message == Fired(2)

    assert mailbox.empty()
    assert drain(mailbox) == []
    with pytest.raises(queue.Empty):
        mailbox.get(timeout=0.01)


def test_a_tell_behind_markers_is_found_and_keeps_its_turn() -> None:
    mailbox = TicksFirst()
    mailbox.put(fire(1))
    mailbox.put(tell("a"))
    mailbox.put(tell("b"))
    assert mailbox.get().message == Fired(1)

    assert not mailbox.empty()
    mailbox.put(tell("c"))
    assert drain(mailbox) == [UntrackJob("a"), UntrackJob("b"), UntrackJob("c")]


def test_a_waiting_get_wakes_for_a_message_that_jumps() -> None:
    mailbox = TicksFirst()
    taken: list[object] = []
    waiter = threading.Thread(target=lambda: taken.append(mailbox.get(timeout=WAIT_S).message))
    waiter.start()
    mailbox.put(fire(7))
    waiter.join(WAIT_S)
    assert taken == [Fired(7)]


def test_a_closed_mailbox_refuses_and_loses_nothing_put_before() -> None:
    # Senders race the close: each message is refused, or the last pass finds it.
    mailbox = TicksFirst()
    accepted: list[int] = []
    refused: list[int] = []
    go = threading.Barrier(5)

    def send(base: int) -> None:
        go.wait(WAIT_S)
        for i in range(base, base + 20_000):
            try:
                mailbox.put(Envelope(TrackJob(str(i), "t", 1), reply_to=None))
            except pykka.ActorDeadError:
                refused.append(i)
            else:
                accepted.append(i)

    senders = [threading.Thread(target=send, args=(n * 100_000,)) for n in range(4)]
    for sender in senders:
        sender.start()
    go.wait(WAIT_S)
    while not accepted:
        pass
    mailbox.close()
    found = []
    while True:
        try:
            found.append(int(mailbox.get_nowait().message.job_id))
        except queue.Empty:
            break
    for sender in senders:
        sender.join(WAIT_S)

    assert refused, "the close came after every send: the race was not run"
    assert sorted(found) == sorted(accepted)
    with pytest.raises(pykka.ActorDeadError):
        mailbox.put(tell("late"))


def test_a_look_at_the_mailbox_keeps_the_jumps_first() -> None:
    # The process-mode manager asks empty() between messages; a tell it looks at
    # must not then go before a timer fire put after it.
    mailbox = TicksFirst()
    mailbox.put(tell("a"))
    mailbox.put(tell("b"))
    assert not mailbox.empty()
    mailbox.put(fire(1))

    assert drain(mailbox) == [Fired(1), UntrackJob("a"), UntrackJob("b")]
