"""The mailbox: in order but for the manager's own messages and quiet tells; exact as it closes."""

from __future__ import annotations

import queue
import threading

import pykka
import pytest
from pykka._envelope import Envelope

from actors import TrackJob, UntrackJob
from actors.lock_manager import QUIET_MAX, Fired, TicksFirst

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


# -- messages put without a wake ------------------------------------------------------


def test_a_quiet_message_wakes_no_reader_until_the_next_message_comes() -> None:
    mailbox = TicksFirst(quiet=True)
    taken: list[object] = []
    waiter = threading.Thread(target=lambda: taken.append(mailbox.get(timeout=WAIT_S).message))
    waiter.start()
    mailbox.post(tell("quiet"), wake=False)
    waiter.join(0.2)
    assert waiter.is_alive(), "a message put without a wake woke the reader"
    assert not mailbox.empty()  # seen by a reader that looks, as pykka's teardown does

    mailbox.put(fire(1))
    waiter.join(WAIT_S)
    # Read first: what the timer's tick does must see it.
    assert taken == [UntrackJob("quiet")]
    assert drain(mailbox) == [Fired(1)]


def test_a_quiet_message_keeps_its_place_between_the_messages_around_it() -> None:
    mailbox = TicksFirst(quiet=True)
    mailbox.put(tell("a"))
    mailbox.put(fire(1))
    mailbox.post(tell("b"), wake=False)
    mailbox.put(tell("c"))
    mailbox.put(fire(2))
    mailbox.post(tell("d"), wake=False)

    # A fire jumps the tells put with a wake, never a quiet one put before it;
    # a quiet one comes after every tell put before it and before every one after.
    assert drain(mailbox) == [
        Fired(1),
        UntrackJob("a"),
        UntrackJob("b"),
        Fired(2),
        UntrackJob("c"),
        UntrackJob("d"),
    ]


def test_quiet_messages_wake_the_reader_once_enough_wait() -> None:
    mailbox = TicksFirst(quiet=True)
    taken: list[object] = []

    def read() -> None:
        taken.append(mailbox.get(timeout=WAIT_S).message)

    waiter = threading.Thread(target=read)
    waiter.start()
    for i in range(QUIET_MAX):
        mailbox.post(tell(str(i)), wake=False)
    waiter.join(WAIT_S)
    assert taken == [UntrackJob("0")]


def test_a_mailbox_without_a_timer_to_read_it_wakes_for_a_quiet_message() -> None:
    mailbox = TicksFirst()
    taken: list[object] = []
    waiter = threading.Thread(target=lambda: taken.append(mailbox.get(timeout=WAIT_S).message))
    waiter.start()
    mailbox.post(tell("a"), wake=False)
    waiter.join(WAIT_S)
    assert taken == [UntrackJob("a")]


def test_a_closed_mailbox_refuses_a_quiet_message() -> None:
    mailbox = TicksFirst(quiet=True)
    mailbox.post(tell("in"), wake=False)
    mailbox.close()
    with pytest.raises(pykka.ActorDeadError):
        mailbox.post(tell("late"), wake=False)
    assert drain(mailbox) == [UntrackJob("in")]
