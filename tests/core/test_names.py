"""The one name rule: a topic name the API accepts can always be stored by every object store."""

from __future__ import annotations

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from levelzero.core.errors import InvalidInput, MalformedKey
from levelzero.core.keys import format_l1_key, parse_l1_key
from levelzero.core.names import TEMP_SEGMENT_PREFIX, is_topic_name, topic_name_problem
from levelzero.storage.keys_check import check_object_key
from levelzero.storage.memory_store import MemoryObjectStore

UUID = "0" * 32


@pytest.mark.parametrize(
    "name", [".", "..", "...", ".lz-tmp-x", TEMP_SEGMENT_PREFIX, "", "a/b", "a b", "é", "a" * 201, "x\n"]
)
def test_names_no_store_can_hold_are_refused(name: str) -> None:
    assert topic_name_problem(name) is not None
    with pytest.raises(MalformedKey, match="cannot be part of a key"):
        format_l1_key(name, 0, 0, 0, 1, UUID)


@pytest.mark.parametrize(
    "name", ["orders", "a.b", ".hidden", "-x", "_", "a..b", "x" * 200, ".lz-tmp", "a.lz-tmp-b"]
)
def test_names_every_store_can_hold_are_accepted(name: str) -> None:
    assert topic_name_problem(name) is None
    key = format_l1_key(name, 3, 0, 9, 1, UUID)
    assert check_object_key(key) == key
    assert parse_l1_key(key).topic == name


def test_a_non_string_name_is_refused_with_its_type() -> None:
    assert topic_name_problem(7) == "must be a string, not int"


# Names drawn from the characters at the edges of both rules, and the temp prefix itself.
NAME = st.lists(
    st.sampled_from(["a", "9", ".", "_", "-", "/", " ", TEMP_SEGMENT_PREFIX, ".."]), min_size=0, max_size=5
).map("".join)


@settings(max_examples=400, deadline=None)
@given(NAME)
def test_a_name_is_accepted_exactly_when_its_l1_key_can_be_stored(name: str) -> None:
    try:
        key = format_l1_key(name, 0, 0, 0, 1, UUID)
        check_object_key(key)
        storable = True
    except (MalformedKey, InvalidInput):
        storable = False
    if is_topic_name(name):
        assert storable, name
        # ... by a real store too, and read back under the same key.
        store = MemoryObjectStore()
        anyio.run(store.put, key, b"x")
        assert anyio.run(store.get, key) == b"x"
    else:
        assert not storable or name.strip(".") == "" or len(name) > 200, name


def test_the_object_stores_refuse_the_segments_the_name_rule_refuses() -> None:
    for segment in (".", "..", ".lz-tmp-x"):
        with pytest.raises(InvalidInput, match="path segment"):
            check_object_key(f"level_one/{segment}/0/x")
