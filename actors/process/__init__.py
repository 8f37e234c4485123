"""Process isolation: a manager whose timer and renewals run in a child process.

``start_link(..., isolation="process")`` starts a :class:`ProcessLockManager`:
the worker's half (:mod:`actors.process.parent`) keeps the claims, the
decisions and the doors; the child's half (:mod:`actors.process.child`)
renews; :mod:`actors.process.shared` is what they share.
"""

from __future__ import annotations

from actors.process.parent import ProcessLockManager

__all__ = ["ProcessLockManager"]
