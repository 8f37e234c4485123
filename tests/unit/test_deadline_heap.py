"""The deadlines' heap stays about as large as the watched locks, however often margins change.

A lock watched by a job actor while short leases with their own
``safety_margin`` come and go changes its span at each: the heap's stale
entries are dropped, or the heap built anew once they outnumber the live ones.
"""

from __future__ import annotations

from actors.jobs import JobTable


class Target:
    def tell(self, _message: object) -> None:
        pass


def test_leases_coming_and_going_on_a_watched_lock_keep_the_heap_small() -> None:
    jobs = JobTable(30_000, 5_000)
    actor, lease = Target(), Target()
    # Given a lock watched by a job actor with the default margin
    jobs.track("j", "t", 1_000, notify=actor)
    # When 5,000 short leases with a margin of their own come and go, with no renewal between
    for _ in range(5_000):
        jobs.track("j", "t", 1_000, notify=lease, margin=9_000)
        jobs.untrack("j", "t", lease)
    # Then the heap holds about one entry per watched lock
    heap = jobs.deadlines._heap
    assert len(heap) <= 4, f"{len(heap)} heap entries for one watched lock"
