"""The timing rules: defaults, validation, due-job selection and the tick grid."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors import Timing
from actors.timing import (
    MAX_DURATION_MS,
    MAX_TEXT_BYTES,
    check_lock_duration,
    check_safety_margin,
    default_safety_margin,
    is_valid_text,
    next_tick,
    require_int,
    require_text,
    select_due,
)


def test_defaults_are_30000_15000_7500() -> None:
    timing = Timing()

    assert timing.lock_duration == 30000
    assert timing.renew_time == 15000
    assert timing.interval == 7500
    assert timing.threshold == 7500
    assert timing.worst_gap == 15000
    assert timing.headroom == 15000


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


def test_the_default_safety_margin_is_half_an_interval() -> None:
    assert default_safety_margin(Timing()) == 3750
    assert default_safety_margin(Timing(800, 600)) == 150


def test_a_safety_margin_must_leave_an_interval_before_the_deadline() -> None:
    timing = Timing()  # interval 7500: at most 30000 - 7500 - 1

    assert check_safety_margin(0, timing) == 0
    assert check_safety_margin(22499, timing) == 22499
    with pytest.raises(ValueError, match="declared unconfirmed before its next renewal"):
        check_safety_margin(22500, timing)
    with pytest.raises(ValueError, match="safety_margin"):
        check_safety_margin(-1, timing)
    with pytest.raises(TypeError, match="safety_margin"):
        check_safety_margin(1.5, timing)


@pytest.mark.parametrize("seconds", [4, 30, 99])
def test_a_redis_lock_under_100_ms_is_refused_as_seconds_typed_for_ms(seconds: int) -> None:
    with pytest.raises(ValueError, match=f"lock_duration={seconds * 1000}"):
        check_lock_duration(seconds)
    check_lock_duration(100)


class Text(str):
    """A caller's ``str`` subclass, whose methods must never run on the manager's thread."""

    __slots__ = ()

    def __hash__(self) -> int:
        raise AssertionError("the caller's __hash__ ran")


class Count(int):
    """A caller's ``int`` subclass."""


def test_a_subclass_of_str_or_int_is_kept_as_the_plain_value() -> None:
    text = require_text(Text("job"), "job_id")
    count = require_int(Count(5), "max_batch")

    assert type(text) is str and text == "job"
    assert type(count) is int and count == 5


@given(st.one_of(st.text(max_size=4), st.binary(max_size=2), st.none(), st.integers()))
def test_is_valid_text_agrees_with_require_text(value: object) -> None:
    try:
        require_text(value, "job_id")
    except (TypeError, ValueError):
        assert not is_valid_text(value)
    else:
        assert is_valid_text(value)


def test_text_is_bounded_in_utf8_bytes_not_characters() -> None:
    assert is_valid_text("é" * (MAX_TEXT_BYTES // 2))
    assert not is_valid_text("é" * (MAX_TEXT_BYTES // 2 + 1))
    with pytest.raises(ValueError, match=f"at most {MAX_TEXT_BYTES} bytes"):
        require_text("é" * (MAX_TEXT_BYTES // 2 + 1), "token")
