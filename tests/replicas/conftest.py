"""What the tests of writes confirmed by replicas share."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.support.replication import ReplicatedPair

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture(scope="module")
def pair() -> Iterator[ReplicatedPair]:
    """A primary and its replica, in sync, for the tests of one module."""
    with ReplicatedPair() as replicated:
        yield replicated
