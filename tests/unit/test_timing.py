"""The timing rules: defaults, validation, due-job selection and the tick grid."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors import Timing
from actors.timing import next_tick, select_due
from actors.timing import MAX_DURATION_MS


def test_defaults_are_30000_15000_7500() -> None:
    timing = Timing()

    assert timing.lock_duration == 30000
    assert timing.renew_time == 15000
    assert timing.interval == 7500
    assert timing.threshold == 7500
    assert timing.worst_gap == 15000
    assert timing.margin == 15000


def test_renew_time_defaults_to_half_the_duration() -> None:
    assert Timing(800).renew_time == 400
    assert Timing(800, 600).interval == 300


@pytest.mark.parametrize(
    ("duration", "renew", "error", "argument"),
    [
        (0, None, ValueError, "lock_duration"),
        (-5, None, ValueError, "lock_duration"),
        (1.5, None, TypeError, "lock_duration"),
        (True, None, TypeError, "lock_duration"),
        ("30000", None, TypeError, "lock_duration"),
        (3, None, ValueError, "lock_duration"),
        (1000, 1000, ValueError, "lock_renew_time"),
        (1000, 2000, ValueError, "lock_renew_time"),
        (1000, 0, ValueError, "lock_renew_time"),
        (1000, 1, ValueError, "lock_renew_time"),
        (1000, 10.0, TypeError, "lock_renew_time"),
    ],
)
def test_bad_durations_name_the_argument(
    duration: object, renew: object, error: type[Exception], argument: str
) -> None:
    with pytest.raises(error, match=argument):
        Timing(duration, renew)  # type: ignore[arg-type]


jobs_st = st.dictionaries(st.text(min_size=1, max_size=8), st.integers(-(10**6), 10**6))


@given(jobs=jobs_st, now=st.integers(-(10**6), 2 * 10**6), threshold=st.integers(1, 10**5))
def test_a_job_is_due_exactly_when_ts_plus_threshold_is_below_now(
    jobs: dict[str, int], now: int, threshold: int
) -> None:
    due = select_due(jobs, now, threshold)

    assert due == [job_id for job_id, ts in jobs.items() if ts + threshold < now]


@given(ts=st.integers(0, 10**9), threshold=st.integers(1, 10**5))
def test_the_boundary_is_strict(ts: int, threshold: int) -> None:
    jobs = {"j": ts}

    assert select_due(jobs, ts + threshold, threshold) == []
    assert select_due(jobs, ts + threshold + 1, threshold) == ["j"]


@given(
    previous=st.integers(0, 10**9),
    interval=st.integers(1, 10**5),
    late=st.integers(-(10**5), 10**6),
)
def test_ticks_stay_on_the_grid_and_an_overrun_fires_at_once_without_a_burst(
    previous: int, interval: int, late: int
) -> None:
    now = previous + late

    deadline = next_tick(previous, interval, now)

    assert (deadline - previous) % interval == 0
    assert deadline >= previous + interval
    if now < previous + interval:
        # On time: the next grid time, still ahead.
        assert deadline == previous + interval
    else:
        # Overran: the latest grid time already past, less than one interval late.
        assert deadline <= now < deadline + interval


def test_durations_are_bounded_by_max_duration_ms() -> None:
    assert Timing(MAX_DURATION_MS).lock_duration == MAX_DURATION_MS
    with pytest.raises(ValueError, match="lock_duration"):
        Timing(MAX_DURATION_MS + 1)
    with pytest.raises(ValueError, match="lock_renew_time"):
        Timing(1000, MAX_DURATION_MS + 1)
