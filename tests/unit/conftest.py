"""Fixtures of the unit tests: a manager on a manual clock and timer, no Redis."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import pykka
import pytest

from actors import stop
from tests.support.fakes import LockTable
from tests.support.manual import ManualClock
from tests.support.user_code import Manual

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture
def manual() -> Iterator[Manual]:
    fixture = Manual(LockTable(), ManualClock())
    try:
        yield fixture
    finally:
        for event in fixture.releases:
            event.set()
        for manager in fixture.managers:
            with contextlib.suppress(pykka.Timeout):
                stop(manager, timeout=10)
