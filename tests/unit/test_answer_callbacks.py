"""A user's callback on an answer holds up no asyncio ask, of this manager or any other.

User callbacks (``Answer.add_done_callback``) run on one thread of their own;
``actors.aio``'s wake-ups, which only schedule on a loop, run as the answer is set.
"""

from __future__ import annotations

import asyncio
import threading

from actors import ExtendLocks, GetStats, aio
from tests.support.user_code import Manual


def test_a_blocking_answer_callback_holds_up_no_other_managers_async_ask(manual: Manual) -> None:
    mine = manual.start("r2-callback-owner")
    other = manual.start("r2-callback-victim")
    release = manual.release()
    entered = threading.Event()

    def slow(_answer: object) -> None:
        entered.set()
        release.wait(30)

    # Given a user's callback that blocks, on an answer of one manager
    answer = mine.ask(GetStats(), block=False)
    answer.get(timeout=5)
    answer.add_done_callback(slow)
    assert entered.wait(5)

    # When asyncio code awaits an unrelated manager's renewal
    async def renew() -> object:
        return await aio.ask(other, ExtendLocks(), timeout=3)

    # Then it is answered all the same
    asyncio.run(renew())
