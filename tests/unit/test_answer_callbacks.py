"""Review 2: one user callback on an answer holds up every async ask in the process.

``Answer.add_done_callback`` now runs every callback of every manager's
answers on one process-wide thread (``ref._CALLBACKS``). The package's own
async door (``actors.aio.answer``, behind ``aio.ask``, async leases and
``untrack_job(wait=True)`` from asyncio) wakes its awaiting task through that
same thread. A user's callback that blocks (or simply waits for another
answer awaited from asyncio) therefore stalls every awaited answer of every
manager in the process: "a slow one delays the callbacks after it, nothing
else" does not hold, the package's own asyncio waits are among "the callbacks after it".
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
