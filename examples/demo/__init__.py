"""The demo: a supervisor tree renewing job locks, with a live view.

It runs the tree of ``examples/supervisor_tree.py`` (its fuller form,
:mod:`examples.demo.supervision`) on a private server (or
``REDIS_URL``) with jobs whose work outlasts the lock's TTL several times, and
shows each job's state, its lock's remaining TTL as the server reports it
(PTTL), its renewals and the manager's ticks. Mid-way another worker takes
one job's lock and another job's actor crashes: the view shows the lost lock
reported and the work abandoned, and the crashed actor restarted.

It ends with a summary, writes ``summary.json`` and a timeline picture
(``timeline.png``, with matplotlib) to ``--out``, and exits 0 unless a lock
was lost that the demo did not provoke.

Run it from the project's root with ``python -m examples.demo [--no-live]
[--quiet] [--out DIR]`` (``make demo``).
"""
