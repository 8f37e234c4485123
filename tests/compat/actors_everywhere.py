"""A pytest plugin that installs :func:`~actors.bullmq.use_actor_lock_manager` on every Worker.

For running a test suite written for stock bullmq-py (bullmq's own, or a
user's) against the integration, unchanged::

    PYTHONPATH=tests/compat python -m pytest -p actors_everywhere path/to/tests

Each ``bullmq.Worker`` gets the integration right after it is created, before
its loop runs again (so bullmq's default ``autorun`` works too).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import bullmq

from actors.bullmq import use_actor_lock_manager

if TYPE_CHECKING:
    import pytest

_STOCK_INIT = bullmq.Worker.__init__


def _init_with_actor_lock_manager(self: Any, *args: Any, **kwargs: Any) -> None:
    _STOCK_INIT(self, *args, **kwargs)
    use_actor_lock_manager(self)


def pytest_configure(config: pytest.Config) -> None:
    """Install on every Worker created from now on."""
    bullmq.Worker.__init__ = _init_with_actor_lock_manager


def pytest_unconfigure(config: pytest.Config) -> None:
    """Put bullmq's own constructor back."""
    bullmq.Worker.__init__ = _STOCK_INIT
