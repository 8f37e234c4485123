"""QueueKeys and the cluster slot helpers: pure string building."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors import QueueKeys
from actors.keys import hash_slot, hash_tag

#: Text a key may hold: any character that encodes as UTF-8 (no lone surrogate).
texts = st.text(st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=30)
#: Queue names: the same, without ':' (a name with one is a prefix run into a name).
names = st.text(
    st.characters(blacklist_categories=["Cs"], blacklist_characters=":"), min_size=1, max_size=30
)
#: Prefixes: any text that does not end with ':' (the separating colon is added).
prefixes = texts.filter(lambda text: not text.endswith(":"))


def test_layout_matches_the_shared_contract() -> None:
    keys = QueueKeys("myqueue")

    assert keys.base == "emq:myqueue"
    assert keys.key_prefix == "emq:myqueue:"
    assert keys.lock("42") == "emq:myqueue:42:lock"
    assert keys.stalled == "emq:myqueue:stalled"


def test_bullmq_prefix() -> None:
    keys = QueueKeys("mail", prefix="bull")

    assert keys.lock("7") == "bull:mail:7:lock"
    assert keys.stalled == "bull:mail:stalled"


@given(name=names, prefix=prefixes, job_id=texts)
def test_every_lock_key_is_key_prefix_id_lock_and_reads_back(
    name: str, prefix: str, job_id: str
) -> None:
    keys = QueueKeys(name, prefix=prefix)

    assert keys.lock(job_id) == keys.key_prefix + job_id + ":lock"
    assert keys.key_prefix == keys.base + ":"
    assert keys.stalled == keys.key_prefix + "stalled"
    assert keys.job_id(keys.lock(job_id)) == job_id
    assert keys.job_id(keys.lock(job_id).encode()) == job_id


@pytest.mark.parametrize(
    "key", ["emq:other:1:lock", "emq:myqueue:1", "emq:myqueue::lock", "emq:myqueue:stalled"]
)
def test_keys_of_other_queues_or_kinds_have_no_job_id(key: str) -> None:
    assert QueueKeys("myqueue").job_id(key) is None


@pytest.mark.parametrize(
    ("name", "prefix", "error"),
    [
        ("", "emq", ValueError),
        ("q", "", ValueError),
        (None, "emq", TypeError),
        (b"q", "emq", TypeError),
        ("q", 3, TypeError),
        ("q\udc80", "emq", ValueError),
    ],
)
def test_invalid_names_are_refused(name: object, prefix: object, error: type[Exception]) -> None:
    with pytest.raises(error, match=r"name|prefix"):
        QueueKeys(name, prefix=prefix)  # type: ignore[arg-type]


def test_a_name_with_a_colon_is_refused_with_the_split_that_was_meant() -> None:
    with pytest.raises(ValueError, match=r"QueueKeys\('emails', prefix='bull'\)"):
        QueueKeys("bull:emails")


@pytest.mark.parametrize(
    ("prefix", "fix"),
    [("bull:", "QueueKeys('emails', prefix='bull')"), ("{app}:bull::", "prefix='{app}:bull'")],
)
def test_a_prefix_ending_with_a_colon_is_refused_with_the_fix(prefix: str, fix: str) -> None:
    # Given a prefix written with the colon that separates it from the name,
    # the keys would read 'bull::emails:<id>:lock', which no worker writes.
    with pytest.raises(ValueError, match="prefix must not end with ':'") as refused:
        QueueKeys("emails", prefix=prefix)
    assert fix in str(refused.value)


def test_a_colon_inside_a_prefix_is_kept() -> None:
    assert QueueKeys("emails", prefix="app:bull").lock("1") == "app:bull:emails:1:lock"


@pytest.mark.parametrize("job_id", ["", None, 42, "j\udc80"])
def test_invalid_job_ids_are_refused(job_id: object) -> None:
    with pytest.raises((TypeError, ValueError), match="job_id"):
        QueueKeys("q").lock(job_id)  # type: ignore[arg-type]


def test_keys_compare_by_name_and_prefix() -> None:
    assert QueueKeys("q") == QueueKeys("q", prefix="emq")
    assert QueueKeys("q") != QueueKeys("q", prefix="bull")
    assert len({QueueKeys("q"), QueueKeys("q")}) == 1
    assert repr(QueueKeys("q")) == "QueueKeys('q', prefix='emq')"


@pytest.mark.parametrize(
    ("name", "pattern"),
    [("myqueue", "emq:myqueue:*:lock"), ("{q}*[x]", r"emq:\{q\}\*\[x\]:*:lock")],
)
def test_lock_pattern_matches_only_this_queues_locks(name: str, pattern: str) -> None:
    assert QueueKeys(name).lock_pattern == pattern


@pytest.mark.parametrize(
    ("key", "slot"),
    [("foo", 12182), ("123456789", 12739), ("{user1000}.following", hash_slot("user1000"))],
)
def test_hash_slot_matches_the_cluster_spec(key: str, slot: int) -> None:
    assert hash_slot(key) == slot


@pytest.mark.parametrize(
    ("key", "tag"),
    [("{a}b", "a"), ("x{a}{b}", "a"), ("{}a", None), ("a{b", None), ("a}b{c}", "c"), ("ab", None)],
)
def test_hash_tag_is_what_a_cluster_hashes_or_none(key: str, tag: str | None) -> None:
    assert hash_tag(key) == tag


@pytest.mark.parametrize(
    ("name", "prefix", "tag"),
    [
        ("{myqueue}", "emq", "myqueue"),
        ("myqueue", "{emq}", "emq"),
        ("myqueue", "emq", None),
        ("{}q", "emq", None),
        ("q{", "emq", None),
    ],
)
def test_queue_hash_tag(name: str, prefix: str, tag: str | None) -> None:
    assert QueueKeys(name, prefix=prefix).hash_tag == tag


@given(name=names, job_id=texts)
def test_a_tagged_queue_keeps_every_key_in_one_slot(name: str, job_id: str) -> None:
    keys = QueueKeys("{" + name.replace("}", "") + "x}")

    assert hash_slot(keys.lock(job_id)) == hash_slot(keys.stalled)


def test_a_prefix_written_into_the_queue_name_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match=r"QueueKeys\('emails', prefix='bull'\)"):
        QueueKeys("bull:emails")
