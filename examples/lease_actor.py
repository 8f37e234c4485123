"""A job actor, tracked with ``notify=self.actor_ref``, is told ``LockLost`` in its mailbox.

It works one step per message, so it reads the news right after the step in
progress. Run it with ``python examples/lease_actor.py`` (``REDIS_URL``, or a
private server).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pykka
import redis

import actors
from actors.embedded import server_url

LOCK_MS = 1000  #: Lock TTL, in milliseconds: short, so the example ends soon.
KEYS = actors.QueueKeys("actor-jobs")


class JobActor(pykka.ThreadingActor):
    """Works on job-1 in 30 steps until done or its lock is lost; notes how it ended."""

    def __init__(self, manager: actors.ManagerRef, client: redis.Redis, ended: list[str]) -> None:
        super().__init__()
        self.manager, self.client, self.ended, self.done = manager, client, ended, 0

    def on_start(self) -> None:
        """Step 2: take the lock; track it, asking to be told if it is lost."""
        token = str(uuid.uuid4())
        self.client.set(KEYS.lock("job-1"), token, nx=True, px=LOCK_MS)
        actors.track_job(self.manager, "job-1", token, notify=self.actor_ref)
        self.actor_ref.tell("step")

    def on_receive(self, message: Any) -> None:
        """Do one step of work, or stop: the job is done, or its lock is lost."""
        if isinstance(message, actors.LockLost):
            # Step 3: told once, when the lock is lost (why: message.reason).
            self.ended.append(f"lost ({message.reason}) after {self.done} steps")
            self.stop()
        elif self.done == 30:
            # Step 4: done: untrack (and wait for it), then delete the lock.
            actors.untrack_job(self.manager, "job-1", wait=True)
            self.client.delete(KEYS.lock("job-1"))
            self.ended.append("done")
            self.stop()
        else:
            if self.done == 5:  # another worker takes the job over
                self.client.set(KEYS.lock("job-1"), "another-worker", px=LOCK_MS)
            time.sleep(LOCK_MS / 20_000)  # one step of work
            self.done += 1
            self.actor_ref.tell("step")


def run(url: str) -> list[str]:
    """Run one job actor beside its manager; return how the job ended."""
    # Step 1: one manager renews every lock this worker holds.
    manager = actors.start_link(connection=url, keys=KEYS, lock_duration=LOCK_MS)
    client, ended = redis.Redis.from_url(url, socket_timeout=5), list[str]()
    JobActor.start(manager, client, ended).actor_stopped.wait(10 * LOCK_MS / 1000)
    actors.stop(manager)
    client.close()
    return ended


if __name__ == "__main__":
    with server_url() as url:
        print(run(url))
