"""The table of operations names every message once, and every helper is one of its rows."""

from __future__ import annotations

import inspect

import pytest

from actors import LockManager, aio, api, messages
from actors.admission import admit
from actors.operations import IS_TRACKED, MESSAGES, OPERATIONS, by_name


def test_every_message_is_the_message_of_exactly_one_operation() -> None:
    declared = {getattr(messages, name) for name in messages.__all__} - {messages.Notify}
    assert sorted(m.__name__ for m in MESSAGES) == sorted(m.__name__ for m in declared)
    assert len(set(MESSAGES)) == len(OPERATIONS)


def test_operations_are_found_by_their_names_and_unknown_names_are_not() -> None:
    for operation in OPERATIONS:
        assert by_name(operation.name) is operation
    assert by_name("stop") is None
    assert by_name("_on_track") is None


def test_each_operation_names_its_own_handler() -> None:
    handlers = [operation.handler for operation in OPERATIONS]
    assert len(set(handlers)) == len(handlers)
    assert all(handler.startswith("_on_") for handler in handlers)


def test_every_module_helper_but_start_and_stop_is_an_operation_of_the_same_name() -> None:
    names = {operation.name for operation in OPERATIONS}
    for module, lifecycle in ((api, {"start_link", "stop"}), (aio, {"answer", "ask", "stop"})):
        helpers = set(module.__all__) - lifecycle
        assert helpers <= names, module.__name__
        for name in helpers:
            assert next(iter(inspect.signature(getattr(module, name)).parameters)) == "manager"


def test_a_message_built_from_the_table_equals_the_raw_message() -> None:
    assert IS_TRACKED.build("42") == messages.IsTracked("42")


@pytest.mark.parametrize("bad", ["", 42])
def test_a_message_built_from_the_table_fails_as_the_raw_message_does(bad: object) -> None:
    raw = _error_of(messages.IsTracked, bad)
    with pytest.raises(type(raw)) as caught:
        IS_TRACKED.build(bad)
    assert str(caught.value) == str(raw)


def test_a_track_without_a_time_is_stamped_on_its_way_in() -> None:
    admitted = admit(messages.TrackJob("42", "token"), lambda: 1234)
    assert admitted == messages.TrackJob("42", "token", ts=1234)


def _error_of(kind: type, *args: object) -> Exception:
    try:
        kind(*args)
    except (TypeError, ValueError) as error:
        return error
    raise AssertionError(f"{kind.__name__}{args!r} was built")  # pragma: no cover


def test_every_operation_has_its_handler_on_the_manager() -> None:
    assert all(callable(getattr(LockManager, op.handler, None)) for op in OPERATIONS)
