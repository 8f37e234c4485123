"""A move's job, job id and token, read from its arguments as ``inspect.Signature.bind`` would."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from actors.bullmq.hooks import move_reader


class Backend:
    """The shapes of bullmq 3.4's moves (``RedisBackend``)."""

    def completed(
        self, job: Any, value: Any, remove_on_complete: Any, token: str, fetch_next: bool = True
    ) -> None: ...

    def delayed(self, job_id: str, timestamp: int, token: str = "0") -> None: ...

    def children(self, job_id: str, token: str, opts: Any = None) -> None: ...


def bound(move: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, Any]:
    given = inspect.signature(move).bind(*args, **kwargs).arguments
    return given.get("job"), given.get("job_id"), given.get("token")


CALLS = [
    (Backend().completed, ("J", 1, False, "t"), {}),
    (Backend().completed, ("J", 1, False, "t", False), {}),
    (Backend().completed, ("J", 1), {"remove_on_complete": False, "token": "t"}),
    (Backend().completed, (), {"job": "J", "value": 1, "remove_on_complete": 0, "token": "t"}),
    (Backend().delayed, ("7", 5), {}),
    (Backend().delayed, ("7", 5, "t"), {}),
    (Backend().delayed, ("7",), {"timestamp": 5, "token": "t"}),
    (Backend().children, ("7", "t"), {}),
    (Backend().children, ("7", "t", {"a": 1}), {}),
]


@pytest.mark.parametrize(("move", "args", "kwargs"), CALLS)
def test_the_reader_agrees_with_bind(
    move: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    read = move_reader(inspect.signature(move))
    assert read(args, kwargs) == bound(move, args, kwargs)


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [(("J", 1, False, "t", True, "extra"), {}), (("J",), {}), ((), {"nope": 1})],
)
def test_a_call_that_does_not_bind_raises_as_bind_does(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    read = move_reader(inspect.signature(Backend().completed))
    with pytest.raises(TypeError):
        read(args, kwargs)
