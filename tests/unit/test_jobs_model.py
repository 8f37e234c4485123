"""The job table against a plain model of it, under any sequence of calls.

Also: the renewed ids a process-mode child sends survive msgpack.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import actors.jobs as jobs_module
from actors.jobs import JobTable
from actors.timing import MAX_TEXT_BYTES, is_valid_text

THRESHOLD = 50
IDS = st.sampled_from([f"j{i}" for i in range(6)])
TOKENS = st.sampled_from(["a", "b", "c"])


class Target:
    """A notify target: compared by identity only."""

    def __init__(self, name: str) -> None:
        self.name = name

    def tell(self, message: object) -> None:  # pragma: no cover
        pass

    def __repr__(self) -> str:
        return self.name


T1, T2 = Target("T1"), Target("T2")
TARGETS = st.sampled_from([None, T1, T2])


class Model:
    def __init__(self) -> None:
        self.tokens: dict[str, str] = {}
        self.stamps: dict[str, int] = {}
        # claim key (None: plain, else a target) -> releasing
        self.claims: dict[str, dict[object, bool]] = {}
        self.fresh: list[str] = []
        self.seq: dict[str, int] = {}  # id -> sequence number of its last taking
        self.counter = 0

    def take(self, job_id: str, token: str, ts: int) -> None:
        if job_id not in self.tokens:
            self.tokens[job_id] = token
            self.stamps[job_id] = ts
        else:
            self.tokens[job_id] = token
            self.stamps[job_id] = ts
        if job_id in self.fresh:
            self.fresh.remove(job_id)
        self.fresh.append(job_id)
        self.counter += 1
        self.seq[job_id] = self.counter

    def drop(self, job_id: str) -> None:
        del self.tokens[job_id]
        del self.stamps[job_id]
        del self.claims[job_id]
        if job_id in self.fresh:
            self.fresh.remove(job_id)
        self.seq.pop(job_id, None)

    def watched(self, job_id: str) -> bool:
        return any(k is not None for k in self.claims.get(job_id, {}))

    def due_set(self, now: int) -> set[str]:
        cutoff = now - THRESHOLD
        return {j for j, ts in self.stamps.items() if ts < cutoff or (self.watched(j) and ts < now)}


class JobTableMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.jobs = JobTable(1000, 100)
        self.model = Model()
        self.now = 10_000
        self.flight: tuple[Any, ...] | None = None
        # ids re-taken with the same token since the flight's batch was taken
        self.retaken_same: set[str] = set()

    @rule(dt=st.integers(0, 120))
    def advance(self, dt: int) -> None:
        self.now += dt

    @rule(
        job_id=IDS,
        token=TOKENS,
        back=st.sampled_from([0, 0, 0, 1, 3, 60, 500]),
        who=TARGETS,
        releasing=st.booleans(),
    )
    def track(
        self, job_id: str, token: str, back: int, who: Target | None, releasing: bool
    ) -> None:
        ts = self.now - back
        m = self.model
        held = m.tokens.get(job_id)
        self.jobs.track(job_id, token, ts, who, None, False, None, releasing)
        if held != token:
            m.take(job_id, token, ts)
            m.claims[job_id] = {who: releasing}
        else:
            m.claims[job_id][who] = releasing  # merged by target
        flight = self.flight
        if flight is not None and held is None and flight[6].get(job_id) == token:
            # untracked then taken again during the flight
            self.retaken_same.add(job_id)

    @rule(job_id=IDS, use_token=st.booleans(), who=TARGETS, everyone=st.booleans())
    def untrack(self, job_id: str, use_token: bool, who: Target | None, everyone: bool) -> None:
        target = who
        m = self.model
        held = m.tokens.get(job_id)
        token = held if use_token else None
        self.jobs.untrack(job_id, token, target, everyone=everyone)
        if held is None:
            return
        claims = m.claims[job_id]
        plain_only = list(claims.items()) == [(None, False)]
        if everyone:
            m.drop(job_id)
        elif target is not None:
            if plain_only:
                return
            claims.pop(target, None)
            if not claims:
                m.drop(job_id)
        else:
            m.drop(job_id)

    @rule(job_id=IDS)
    def released(self, job_id: str) -> None:
        m = self.model
        if job_id not in m.tokens:
            return
        self.jobs.end_claims(job_id, lambda claim: claim.releasing)
        claims = m.claims[job_id]
        for k in [k for k, r in claims.items() if r]:
            del claims[k]
        if not claims:
            m.drop(job_id)

    def check_due(self, at: int) -> tuple[list[str], list[str]]:
        due, tokens, oldest = self.jobs.due(at, THRESHOLD)
        m = self.model
        assert len(due) == len(set(due)), ("duplicate", due)
        assert set(due) == m.due_set(at), (due, m.due_set(at), m.stamps, at)
        assert tokens == [m.tokens[j] for j in due], "tokens misaligned"
        assert oldest == (min(m.stamps[j] for j in due) if due else None)
        real_fresh = list(self.jobs.fresh)
        # real fresh: tracked ids only, each once
        assert set(real_fresh) <= set(m.tokens)
        # never forgets a fresh job
        assert set(m.fresh) <= set(real_fresh), (m.fresh, real_fresh)
        assert [j for j in real_fresh if j in m.fresh] == m.fresh, "fresh order"
        due_set = set(due)
        lead = [j for j in real_fresh if j in due_set]
        assert due[: len(lead)] == lead, ("fresh not first", due, lead)
        # the rest keeps the tracking order for the plainly due ones
        cutoff = at - THRESHOLD
        order = list(m.tokens)
        plain_rest = [j for j in due[len(lead) :] if m.stamps[j] < cutoff]
        assert plain_rest == sorted(plain_rest, key=order.index)
        return due, tokens

    @precondition(lambda self: self.flight is None)
    @rule()
    def take_batch(self) -> None:
        due, tokens = self.check_due(self.now)
        if due:
            fresh_at = {j for j in self.model.fresh if j in set(due)}
            seq_at = dict(self.model.seq)
            self.flight = (
                due,
                tokens,
                self.now,
                self.jobs.changes,
                fresh_at,
                seq_at,
                dict(zip(due, tokens, strict=True)),
            )
            self.retaken_same = set()

    @rule(now_offset=st.integers(0, 200))
    def look(self, now_offset: int) -> None:
        self.check_due(self.now + now_offset)

    @precondition(lambda self: self.flight is not None)
    @rule(
        errored=st.sets(st.integers(0, 10)),
        mode=st.sampled_from(["thread", "parent"]),
        slice_=st.sampled_from([None, 1, 2, 8192]),
    )
    def land(self, errored: set[int], mode: str, slice_: int | None) -> None:
        assert self.flight is not None
        due, tokens, at, changes, fresh_at, seq_at, _token_of = self.flight
        self.flight = None
        jobs, m = self.jobs, self.model
        failed = {due[i] for i in errored if i < len(due)}
        held = jobs.tokens
        settled = changes == jobs.changes
        if mode == "thread":
            if settled and not failed:
                renewed = list(due)
            else:
                renewed = [
                    j
                    for j, t in zip(due, tokens, strict=True)
                    if j not in failed and (settled or held.get(j) == t)
                ]
        else:  # the parent: by id, raised only
            renewed = [j for j in due if j not in failed and j in held]
        old = jobs_module.STAMP_SLICE
        pauses = []
        if slice_ is not None:
            setattr(jobs_module, "STAMP_SLICE", slice_)  # noqa: B010 (a Final, patched)
        try:
            jobs.stamp(
                renewed,
                at,
                pause=(lambda: pauses.append(1)) if slice_ else None,
                raise_only=(mode == "parent"),
            )
        finally:
            setattr(jobs_module, "STAMP_SLICE", old)  # noqa: B010
        for j in renewed:
            if mode == "parent":
                m.stamps[j] = max(m.stamps[j], at)
            else:
                m.stamps[j] = at
            # Renewed: its taking at the batch is fresh no more (a taking since
            # may count as renewed too: conservative either way).
            at_batch = j in fresh_at and m.seq.get(j) == seq_at.get(j)
            if j in m.fresh and (at_batch or j not in jobs.fresh):
                m.fresh.remove(j)
        self.retaken_same = set()

    @invariant()
    def newest_bounds_every_stamp(self) -> None:
        stamps = self.jobs.stamps
        assert list(stamps) == list(self.jobs.tokens), "the two dicts out of order"
        if stamps:
            assert self.jobs.newest >= max(stamps.values())
        assert stamps == self.model.stamps
        assert self.jobs.tokens == self.model.tokens


TestJobTableMachine = JobTableMachine.TestCase
TestJobTableMachine.settings = settings(
    max_examples=400,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@pytest.mark.parametrize(
    "job_id",
    [
        "a",
        "é",
        "日本語",
        "\U0001f600x",
        "\x00nul",
        "\ufffe\uffff",
        "x" * MAX_TEXT_BYTES,
        "é" * (MAX_TEXT_BYTES // 2),
    ],
)
def test_a_valid_id_round_trips_msgpack(job_id: str) -> None:
    assert is_valid_text(job_id)
    assert msgpack.unpackb(msgpack.packb([job_id, job_id])) == [job_id, job_id]


def test_a_lone_surrogate_is_refused_before_msgpack() -> None:
    assert not is_valid_text("a\ud800")


def test_many_ids_round_trip_msgpack() -> None:
    ids = [f"job-{i}" for i in range(200_000)]
    assert msgpack.unpackb(msgpack.packb(ids)) == ids
