"""A run that ends while the worker closes gracefully waits for the fetches in flight.

bullmq-py's run loop leaves at the first of its tasks to end without a job
once the worker closes: a job a fetch still in flight takes would never be
processed. These tests drive the wrappers of ``getNextJob`` and
``processJob`` as the run loop does (one ``asyncio.wait`` on both tasks),
with stand-ins for bullmq's two methods: no server is involved.
"""

from __future__ import annotations

import asyncio
from typing import Any

from actors.bullmq.hooks import InFlight, RunTokens, next_job, processing, sending

#: How long a stand-in fetch takes to answer, in seconds.
FETCH_S = 0.2
#: The bound of a run's wait for the fetches in flight, in seconds.
BOUND_S = 1.0


class Worker:
    """The flags of bullmq's ``Worker`` that the wrappers read."""

    def __init__(self) -> None:
        self.closing = False
        self.forceClosing = False


class Owner:
    """The lock manager's side of the ``getNextJob`` wrapper: these fetches take no lock."""

    def release_unstarted(self, job_id: str, token: str) -> None:
        """A job fetched but not handed on is let go (none here)."""


class Job:
    def __init__(self, job_id: str) -> None:
        self.id = job_id


def wrappers(
    worker: Worker, fetch_s: float | None, *, sends: bool = True
) -> tuple[Any, Any, list[str]]:
    """The wrapped ``getNextJob`` (its fetch answers after ``fetch_s``; ``None``: never)
    and ``processJob`` (it closes the worker, then ends), and the events the run emitted."""
    in_flight = InFlight(BOUND_S)
    events: list[str] = []

    async def get_next_job(token: str) -> Job | None:
        if not sends:
            await asyncio.sleep(fetch_s or 0)  # an idle wait: no fetch sent
            return None
        sending()
        await asyncio.sleep(3600 if fetch_s is None else fetch_s)
        return Job("slow")

    async def process_job(job: Job, token: str) -> None:
        worker.closing = True
        events.append(f"completed {job.id}")

    fetch = next_job(Owner(), get_next_job, RunTokens("w"), in_flight)  # type: ignore[arg-type]
    return fetch, processing(worker, process_job, in_flight), events


async def first_done(fetch: Any, process: Any) -> tuple[set[str], float]:
    """Run the two as bullmq's run loop does; which ended first, and when."""
    loop = asyncio.get_running_loop()
    fetching = asyncio.ensure_future(fetch("w:1"))
    await asyncio.sleep(0)  # the fetch is sent before the run starts
    running = asyncio.ensure_future(process(Job("closer"), "w:2"))
    started = loop.time()
    done, _ = await asyncio.wait({fetching, running}, return_when=asyncio.FIRST_COMPLETED)
    ended = {"fetch" if task is fetching else "run" for task in done}
    for task in (fetching, running):
        task.cancel()
    await asyncio.gather(fetching, running, return_exceptions=True)
    return ended, loop.time() - started


def test_a_run_ending_during_a_graceful_close_ends_after_the_fetch_in_flight() -> None:
    worker = Worker()
    fetch, process, events = wrappers(worker, FETCH_S)
    ended, _ = asyncio.run(first_done(fetch, process))
    assert "fetch" in ended, "the run loop saw the run end before the fetch's job"
    assert events == ["completed closer"]


def test_the_wait_for_a_fetch_that_never_answers_is_bounded() -> None:
    worker = Worker()
    fetch, process, _ = wrappers(worker, None)
    ended, took = asyncio.run(first_done(fetch, process))
    assert ended == {"run"}
    assert BOUND_S <= took < BOUND_S + 1.0


def test_a_forced_close_waits_for_no_fetch() -> None:
    worker = Worker()
    worker.forceClosing = True
    fetch, process, _ = wrappers(worker, None)
    ended, took = asyncio.run(first_done(fetch, process))
    assert ended == {"run"}
    assert took < BOUND_S / 2


def test_a_call_that_sent_no_fetch_is_not_waited_for() -> None:
    # bullmq's idle wait (BZPOPMIN) takes no lock: the close cancels it.
    worker = Worker()
    fetch, process, _ = wrappers(worker, 3600, sends=False)
    ended, took = asyncio.run(first_done(fetch, process))
    assert ended == {"run"}
    assert took < BOUND_S / 2


def test_a_run_cancelled_while_it_waits_has_emitted_its_events() -> None:
    worker = Worker()
    fetch, process, events = wrappers(worker, None)

    async def scenario() -> None:
        fetching = asyncio.ensure_future(fetch("w:1"))
        await asyncio.sleep(0)
        running = asyncio.ensure_future(process(Job("closer"), "w:2"))
        await asyncio.sleep(BOUND_S / 4)
        assert not running.done(), "the run did not wait for the fetch in flight"
        running.cancel()  # worker.close(force=True) after a graceful close
        fetching.cancel()
        await asyncio.gather(fetching, running, return_exceptions=True)

    asyncio.run(scenario())
    assert events == ["completed closer"]
