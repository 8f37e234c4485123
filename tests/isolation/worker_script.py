"""A worker that renews its locks (in either mode), then waits to be killed.

Run by the SIGKILL test: ``python worker_script.py URL QUEUE LOCK_MS ISOLATION JOB=TOKEN...``.
It prints ``ready`` once the renewing side knows every job, then waits to be killed, or exits
normally (without stopping the manager) when ``WORKER_THEN=exit``.
"""

from __future__ import annotations

import os
import sys
import threading

from actors import ExtendLocks, QueueKeys, get_active_job_count, start_link, track_job

if __name__ == "__main__":
    url, queue, lock_ms, isolation, *pairs = sys.argv[1:]
    manager = start_link(
        connection=url, keys=QueueKeys(queue), lock_duration=int(lock_ms), isolation=isolation
    )
    for pair in pairs:
        job_id, token = pair.split("=", 1)
        track_job(manager, job_id, token)
    assert get_active_job_count(manager, timeout=30) == len(pairs)
    # A renew now is answered once the renewing side ran it: it knows every lock by then.
    manager.ask(ExtendLocks(), timeout=30)
    print("ready", flush=True)
    if os.environ.get("WORKER_THEN") == "exit":
        sys.exit(0)  # a normal exit, without stopping the manager
    threading.Event().wait()
