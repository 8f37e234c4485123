"""A one-for-one supervisor over job actors that hear of their own lost lock.

A job actor tracks its lock with ``notify=self.actor_ref``: told :class:`actors.LockLost`, it
abandons the job. A crashed actor's ``on_failure`` tells the supervisor, which untracks the job
(its lock runs out) and restarts it. Run it with ``python examples/supervisor_tree.py [process]``
(``REDIS_URL``, or a private server): another worker takes job-2's lock; job-3's actor crashes once.
"""

from __future__ import annotations

import sys
import time
import uuid
from typing import Any

import pykka
import redis

import actors
from actors.embedded import server_url

LOCK_MS = 1500  #: Lock TTL, in milliseconds: short, so the example ends in seconds.
#: Delete the lock only while it holds our token: after a loss it is someone else's.
RELEASE = 'if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) end'
#: What every job actor shares: the queue's manager, a client, the queue's keys.
Setup = tuple[actors.ManagerRef, redis.Redis, actors.QueueKeys]


class JobActor(pykka.ThreadingActor):
    """Holds one job's lock while it works, and tells its supervisor how the job ended."""

    def __init__(self, boss: pykka.ActorRef[Any], setup: Setup, job_id: str) -> None:
        super().__init__()
        self.boss, self.job_id, (self.manager, self.client, keys) = boss, job_id, setup
        self.lock = keys.lock(job_id)
        self.token, self.held, self.done, self.ended = str(uuid.uuid4()), False, 0, "stopped"

    def on_receive(self, message: Any) -> None:
        """Abandon the job on a lost lock, crash on request, or do one more step."""
        if isinstance(message, actors.LockLost):
            self.ended = f"abandoned: lock {message.reason}"  # someone else owns the job now
            self.stop()
        elif message == "crash":
            raise RuntimeError(f"{self.job_id}'s actor crashes")  # as a bug in the job would
        elif self.done == 2 * LOCK_MS // 100:  # steps of 100 ms: two TTLs of work in all
            self.ended = "finished"
            self.stop()
        else:
            if not self.held and self.client.set(self.lock, self.token, nx=True, px=LOCK_MS):
                self.held = True  # the manager renews it from now on, and tells us of a loss
                actors.track_job(self.manager, self.job_id, self.token, notify=self.actor_ref)
            time.sleep(0.1)  # one step of work, or a wait for a crashed actor's lock to run out
            self.done += self.held
            self.actor_ref.tell("step")

    def on_stop(self) -> None:
        """Untrack the job (first: a queued tick would report the lock gone), release it."""
        if self.held:
            actors.untrack_job(self.manager, self.job_id, wait=True)
            self.client.eval(RELEASE, 1, self.lock, self.token)
        self.boss.tell((self.job_id, self.ended))

    def on_failure(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        """Tell the supervisor; cleaning up is its business now."""
        self.boss.tell((self.job_id, "crashed"))


class Supervisor(pykka.ThreadingActor):
    """Starts one job actor per job and restarts the one that crashes (one-for-one)."""

    def __init__(self, setup: Setup, job_ids: list[str]) -> None:
        super().__init__()
        self.setup, self.outcomes = setup, dict[str, str]()
        self.children: dict[str, pykka.ActorRef[Any]] = {}
        for job_id in job_ids:
            self.start_child(job_id)

    def start_child(self, job_id: str) -> None:
        """Start an actor for ``job_id``, and set it to work."""
        self.children[job_id] = JobActor.start(self.actor_ref, self.setup, job_id)
        self.children[job_id].tell("step")

    def on_receive(self, message: tuple[str, str]) -> None:
        """Restart a crashed job's actor; note how any other job ended."""
        job_id, outcome = message
        if outcome != "crashed":
            self.outcomes[job_id] = outcome
        else:  # nobody renews its lock now: it runs out, then the new actor takes it
            actors.untrack_job(self.setup[0], job_id)
            self.start_child(job_id)


def main(isolation: str = "thread") -> int:
    """Run four jobs; steal job-2's lock and crash job-3's actor once all of them work."""
    keys, job_ids = actors.QueueKeys(f"supervised-{isolation}"), [f"job-{n}" for n in range(1, 5)]
    lost: list[actors.LostLock] = []
    with server_url() as url, redis.Redis.from_url(url, socket_timeout=5) as client:
        # Step 1: one manager (renewing from a child with "process"); one actor per job.
        manager = actors.start_link(connection=url, keys=keys, lock_duration=LOCK_MS,
                                    on_lock_renewal_failed=lost.extend,
                                    isolation=isolation)  # fmt: skip
        tree = Supervisor.start((manager, client, keys), job_ids).proxy()
        # Step 2: once every job holds its lock, job-2's is stolen and job-3's actor crashes.
        while client.exists(*map(keys.lock, job_ids)) < len(job_ids):
            time.sleep(0.05)
        client.set(keys.lock("job-2"), "another-worker", xx=True, px=LOCK_MS)
        tree.children.get()["job-3"].tell("crash")
        # Step 3: once every job has ended, stop the tree and the manager.
        while len(outcomes := tree.outcomes.get()) < len(job_ids):
            time.sleep(0.05)
        tree.actor_ref.stop()
        actors.stop(manager)
    print(f"outcomes: {dict(sorted(outcomes.items()))}")
    print(f"lost: {[f'{job_id} ({job_id.reason})' for job_id in lost]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:2]))
