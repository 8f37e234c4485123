"""Fencing under pauses: a stale holder's writes are refused, whatever the timing.

A job is leased by one worker, who takes its fence; the worker is then paused
past the lock's TTL (SIGSTOP of its process, or a GIL-holding call) while a
second worker takes the job, takes a fence and writes. Once resumed, the stale
holder writes without checking its lease (it was paused right after its last
check) three ways: with its fence to a store that refuses smaller fences,
through :func:`actors.guarded`, and plainly. The first two must be refused; the
plain write lands, which shows the test sees a stale write when one gets in.
``FAULT_RUNS`` repeats each (``make faults`` runs several; CI one).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import redis

import actors
from actors import lease
from tests.faults.fenced_store import JOB, KEYS, create, write_all, writers
from tests.support import new_token

if TYPE_CHECKING:
    from actors.embedded import EmbeddedServer
    from tests.faults.conftest import FaultRecord

RUNS = range(int(os.environ.get("FAULT_RUNS", "1")))
LOCK_MS = 2000
STORE = Path(__file__).with_name("fenced_store.py")

#: The stale holder in a process of its own: leases the job, takes its fence,
#: says so, and makes the three writes when told to (after its pause).
HOLDER = f"""
import json, sys
sys.path.insert(0, {str(STORE.parents[2])!r})
import actors, redis
from pathlib import Path
from tests.faults.fenced_store import JOB, KEYS, write_all
url, path, token = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
manager = actors.start_link(connection=url, keys=KEYS, lock_duration={LOCK_MS})
client = redis.Redis.from_url(url, socket_timeout=5)
with actors.lease(manager, JOB, token) as held:
    fence = held.fence
    print("ready", fence, flush=True)
    sys.stdin.readline()
    print(json.dumps(write_all(client, path, token, fence, "stale")), flush=True)
actors.stop(manager)
"""


def take(direct: redis.Redis) -> str:
    token = new_token()
    direct.hset(KEYS.key_prefix + JOB, mapping={"name": "work", "data": "{}"})
    assert direct.set(KEYS.lock(JOB), token, nx=True, px=LOCK_MS)
    return token


def second_worker(url: str, path: Path) -> subprocess.Popen[str]:
    worker = subprocess.Popen(
        [sys.executable, str(STORE), url, str(path), new_token()],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert worker.stdout is not None
    assert worker.stdout.readline().strip() == "ready"
    return worker


def second_fence(worker: subprocess.Popen[str]) -> int:
    """The fence the second worker wrote with, once it took the job and wrote."""
    assert worker.stdout is not None
    try:
        worker.wait(LOCK_MS / 1000 + 10)
    except subprocess.TimeoutExpired:
        worker.kill()
        raise AssertionError("the second worker never took the job") from None
    return int(worker.stdout.readline())


def judge(
    record: FaultRecord, direct: redis.Redis, path: Path, stale: dict[str, int], fences: list[int]
) -> None:
    last = writers(direct, path)
    record.notes = {
        "fences": "/".join(map(str, fences)),
        "stale_fenced_accepted": stale["fenced"],
        "stale_guarded_applied": stale["guarded"],
        "unfenced_stale_landed": stale["plain"],
    }
    # the second holder's number is larger, so the store refused the stale one
    assert fences[0] < fences[1]
    assert stale["fenced"] == 0
    assert last["fenced"] == "second"
    # the guarded write saw the lock hold another token, and wrote nothing
    assert stale["guarded"] == 0
    assert last["guarded"] == "second"
    # and without either, the stale write landed over the second worker's
    assert stale["plain"] == 1
    assert last["plain"] == "stale"


@pytest.mark.parametrize("run", RUNS)
def test_a_holder_stopped_past_its_ttl_has_its_stale_writes_refused(
    run: int,
    private_server: EmbeddedServer,
    direct: redis.Redis,
    tmp_path: Path,
    record: FaultRecord,
) -> None:
    record.fault = "stale holder SIGSTOPped past the TTL, then writes"
    record.asserted = "fenced and guarded stale writes refused; a plain one lands"
    path = tmp_path / "store.db"
    create(path)
    token = take(direct)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, private_server.url, str(path), token],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    second = None
    try:
        assert holder.stdin is not None and holder.stdout is not None
        word, fence = holder.stdout.readline().split()
        assert word == "ready"
        second = second_worker(private_server.url, path)
        # when the holder is stopped until the second worker took the job and wrote
        holder.send_signal(signal.SIGSTOP)
        try:
            taken = second_fence(second)
        finally:
            holder.send_signal(signal.SIGCONT)
        # then, resumed, its writes
        holder.stdin.write("write\n")
        holder.stdin.flush()
        stale = json.loads(holder.stdout.readline())
        holder.wait(30)
    finally:
        for process in (holder, second):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
    judge(record, direct, path, stale, [int(fence), taken])


@pytest.mark.parametrize("run", RUNS)
def test_a_holder_paused_by_a_gil_holding_call_has_its_stale_writes_refused(
    run: int,
    private_server: EmbeddedServer,
    direct: redis.Redis,
    tmp_path: Path,
    record: FaultRecord,
) -> None:
    record.fault = "stale holder in a GIL-holding call 2.5x the TTL, then writes"
    record.asserted = "fenced and guarded stale writes refused; a plain one lands"
    path = tmp_path / "store.db"
    create(path)
    token = take(direct)
    manager = actors.start_link(connection=private_server.url, keys=KEYS, lock_duration=LOCK_MS)
    second = None
    try:
        with lease(manager, JOB, token) as held:
            fence = held.fence
            second = second_worker(private_server.url, path)
            # when the holder's process holds the GIL past the TTL (usleep through PyDLL)
            ctypes.PyDLL(None).usleep(int(2.5 * LOCK_MS * 1000))
            taken = second_fence(second)
            # then, resumed without a check, its writes
            stale = write_all(direct, path, token, fence, "stale")
    finally:
        actors.stop(manager)
        if second is not None and second.poll() is None:
            second.kill()
            second.wait()
    judge(record, direct, path, stale, [fence, taken])
