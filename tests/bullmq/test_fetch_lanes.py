"""Fetches on connections of their own: what befalls one connection costs no job.

In thread mode each fetch in flight has a connection of its own (the loop's,
unnamed; a lane's, with ``replicas=``). A connection cut under a fetch fails
that fetch alone (the worker fetches again); a server that forgets the script
runs it anew. Either way every job runs once and completes, and no lock is
reported lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from typing import TYPE_CHECKING, Any, cast

import redis
import redis.asyncio

from actors.bullmq.hooks import Fetcher
from actors.keys import QueueKeys
from tests.bullmq.harness import Bench, wait_until
from tests.bullmq.slowlink import slow_link

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.conftest import Server

#: Jobs per test, and the worker's concurrency.
JOBS = 60
CONCURRENCY = 8
#: Longest wait for every job to complete, in seconds.
SETTLE_S = 30.0
#: Longest wait for a connect the listener dropped once to succeed, in seconds
#: (the kernel sends a dropped attempt again after about one second, then three).
WAIT_CONNECT_S = 10.0


def cut_fetch_connections(client: redis.Redis) -> int:
    """Close every connection a fetch ran on last (none of the worker's own); return how many.

    The worker's own connections carry bullmq's client name, and so does the
    renewal client the tests give the manager (:func:`renewal_client`); the
    fetches' connections have none.
    """
    cut = 0
    for info in client.client_list():
        if not info.get("name") and info.get("cmd") in {"evalsha", "eval"}:
            cut += client.client_kill_filter(_id=info["id"])
    return cut


def renewal_client(bench: Bench) -> redis.Redis:
    """A client for the manager's renewals, named so that no cut takes it."""
    return redis.Redis.from_url(bench.url, socket_timeout=0.2, client_name="renewals")


def run_through(bench: Bench, fault: Callable[[], object]) -> Any:
    """Run ``JOBS`` jobs on a worker of ours, with ``fault`` done once a third have run."""
    runs: list[str] = []
    faulted: list[object] = []

    async def process(job: Any, token: str) -> str:
        runs.append(str(job.id))
        if len(runs) == JOBS // 3:
            faulted.append(fault())
        await asyncio.sleep(0.005)
        return "done"

    ids = [bench.add_job({}) for _ in range(JOBS)]
    worker = bench.start_worker(
        "A",
        process,
        {"concurrency": CONCURRENCY},
        actor=True,
        connection_for_renewal=renewal_client(bench),
    )
    wait_until(lambda: len(worker.events.of("completed")) >= JOBS, SETTLE_S, "every job completed")
    wait_until(lambda: not worker.busy(), SETTLE_S, "the worker to finish")

    assert faulted, "the fault was never done"
    assert sorted(runs) == sorted(ids), "a job ran twice, or not at all"
    completed = {str(event.args[0].id) for event in worker.events.of("completed")}
    assert completed == set(ids)
    assert worker.events.of("failed") == []
    assert worker.events.of("lockRenewalFailed") == []
    assert bench.client.llen(bench.key("active")) == 0
    return worker, faulted[0]


def test_a_fetch_whose_connection_is_cut_fails_alone_and_no_job_is_lost(bench: Bench) -> None:
    _, cut = run_through(bench, lambda: cut_fetch_connections(bench.client))
    assert cut >= 1


def test_fetches_go_on_when_the_server_forgets_the_script(bench: Bench) -> None:
    worker, _ = run_through(bench, bench.client.script_flush)
    assert worker.events.of("error") == []


#: How late the link hands each reply on, in milliseconds: a fetch is in flight that long.
REPLY_DELAY_MS = 100
#: The worker's lock duration and stalled check, in milliseconds: a job taken
#: by a fetch whose answer was lost is found stalled and fetched again soon.
LOCK_MS = 1000


def test_a_fetch_cut_in_flight_fails_and_its_job_runs_once_after_the_stalled_check(
    one_bench: Bench,
) -> None:
    bench = one_bench
    runs: list[str] = []

    async def process(job: Any, token: str) -> str:
        runs.append(str(job.id))
        return "done"

    ids = [bench.add_job({}) for _ in range(JOBS // 2)]
    # Replies come late, and a cut loses those still on their way: the server
    # ran the fetch (a job's lock taken), and the worker never hears of it.
    with slow_link(bench.url, REPLY_DELAY_MS, drop=True) as (url, _):
        options = {
            "concurrency": 4,
            "lockDuration": LOCK_MS,
            "stalledInterval": LOCK_MS,
            # A failed fetch is tried again this soon (bullmq's default: 15 s),
            # and an idle wait for jobs lasts this long (the close waits for it).
            "runRetryDelay": 100,
            "drainDelay": 1,
        }
        worker = bench.start_worker(
            "A",
            process,
            options,
            actor=True,
            connection=url,
            connection_for_renewal=renewal_client(bench),
        )
        # Cut once every CONCURRENCY completions (each fetch is in flight about
        # half the time) until one cut fetch had taken a job: it fails and
        # bullmq fetches again; the job has a lock nobody renews, and the
        # stalled check hands it on.
        cuts = [0]

        def cut_until_stalled() -> bool:
            if len(worker.events.of("completed")) >= (cuts[0] + 1) * 4:
                cuts[0] += 1
                cut_fetch_connections(bench.client)
            return bool(worker.events.of("stalled"))

        wait_until(
            cut_until_stalled, SETTLE_S, "a job taken by a fetch cut in flight to be found stalled"
        )
        wait_until(
            lambda: len(worker.events.of("completed")) >= len(ids), SETTLE_S, "every job completed"
        )
        worker.close()

    # It ran once all the same, and nothing else was lost.
    assert sorted(runs) == sorted(ids)
    assert worker.events.of("failed") == []
    assert worker.events.of("lockRenewalFailed") == []
    assert bench.client.llen(bench.key("active")) == 0


def test_a_fetch_on_a_new_connection_is_stamped_when_it_is_sent_not_before_the_handshake(
    one_bench: Bench,
) -> None:
    # Each new connection connects first: through a link that answers 300 ms late
    # the handshake takes several round trips. A lock stamped before it would look
    # older than it is, and be reported lost while the server holds it.
    bench = one_bench
    ids = [bench.add_job({}) for _ in range(4)]

    async def process(job: Any, token: str) -> str:
        return "done"

    with slow_link(bench.url, 3 * REPLY_DELAY_MS) as (url, _):
        worker = bench.start_worker(
            "A",
            process,
            {"concurrency": 4, "lockDuration": LOCK_MS, "drainDelay": 1},
            actor=True,
            connection=url,
            connection_for_renewal=renewal_client(bench),
        )
        wait_until(
            lambda: len(worker.events.of("completed")) >= len(ids), SETTLE_S, "every job completed"
        )
        worker.close()

    assert worker.events.of("lockRenewalFailed") == []
    assert worker.events.of("error") == []


class _Owner:
    """The parts of a worker's lock manager a fetch reads, for a fetch with no worker."""

    lock_duration = 10_000
    closing = False
    fetcher = None
    keys = QueueKeys("lanes", prefix="bull")
    connection = None

    def taker(self) -> None:
        return None

    def taken(self, *_: Any) -> None:
        raise AssertionError("nothing is taken here")


class _Script:
    script = "return {}"


def _forward(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)


def test_a_lane_cut_while_it_connects_leaves_no_thread_once_connected(server: Server) -> None:
    # A listener whose queue of connections is full drops the lane's first
    # attempt; the close cuts the lane meanwhile. Once the listener serves, the
    # lane's connect succeeds: it must give the connection up, not read it forever.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = [socket.socket() for _ in range(3)]
    for filler in fillers:
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            filler.connect(("127.0.0.1", port))
    host, server_port = server.url.removeprefix("redis://").split("/")[0].split(":")

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                accepted, _ = listener.accept()
                upstream = socket.create_connection((host, int(server_port)))
                for pair in ((accepted, upstream), (upstream, accepted)):
                    threading.Thread(target=_forward, args=pair, daemon=True).start()

    async def fetch_then_close() -> BaseException | None:
        conn = redis.asyncio.Redis(host="127.0.0.1", port=port)
        fetcher = Fetcher(cast("Any", _Owner()), _Script(), conn)
        fetch = asyncio.ensure_future(fetcher.run(["k"], ["bull:lanes:", "x", b"\x80"]))
        await asyncio.sleep(0.2)  # the lane's thread is in its connect
        await asyncio.get_running_loop().run_in_executor(None, fetcher.close)
        await asyncio.wait([fetch], timeout=WAIT_CONNECT_S)
        await conn.aclose()
        return fetch.exception()

    try:
        threading.Timer(0.2, threading.Thread(target=serve, daemon=True).start).start()
        failure = asyncio.run(fetch_then_close())
        assert isinstance(failure, redis.ConnectionError)
        # The dropped attempt is sent again about a second later, and succeeds.
        wait_until(
            lambda: not [t for t in threading.enumerate() if t.name.startswith("bullmq-fetch-")],
            WAIT_CONNECT_S,
            "the cut lane's thread to end",
        )
    finally:
        listener.close()
        for filler in fillers:
            filler.close()
