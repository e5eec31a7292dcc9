"""`check_delete_batch` decides a batch of plain keys with one regex over the joined batch; it
must accept and reject exactly what `check_object_key` does key by key."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from levelzero.core.errors import InvalidInput
from levelzero.core.keys import format_l0_key
from levelzero.storage.keys_check import (
    KEY_BYTES_MAX,
    _all_plain,
    check_delete_batch,
    check_object_key,
)


def accepted_one_by_one(keys: list[str]) -> bool:
    try:
        for key in keys:
            check_object_key(key)
    except InvalidInput:
        return False
    return True


def accepted_as_batch(keys: list[str]) -> bool:
    try:
        check_delete_batch(keys, 1000)
    except InvalidInput:
        return False
    return True


# Segments drawn from characters that sit at the edges of both rules.
SEGMENT = st.text(alphabet="ab9_-.=+/\\ \n\x00\x7fé", min_size=0, max_size=6)
KEY = st.lists(SEGMENT, min_size=1, max_size=4).map("/".join)


@settings(max_examples=400, deadline=None)
@given(st.lists(KEY, min_size=1, max_size=5))
def test_a_batch_is_accepted_exactly_when_every_key_is(keys: list[str]) -> None:
    assert accepted_as_batch(keys) == accepted_one_by_one(keys)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=4))
def test_whatever_the_fast_path_accepts_each_key_check_accepts(keys: list[str]) -> None:
    if _all_plain(keys):
        assert accepted_one_by_one(keys)
    assert accepted_as_batch(keys) == accepted_one_by_one(keys)


@pytest.mark.parametrize(
    "bad",
    ["a/../b", "a//b", "/a", "a/", "a\nb", "a\\b", ".lz-tmp-x/y", "x/.hidden", "a" * 1025],
)
def test_one_bad_key_among_plain_ones_is_named(bad: str) -> None:
    keys = [format_l0_key(i, 1, f"{i:032x}") for i in range(999)] + [bad]
    if accepted_one_by_one([bad]):  # a key only the slow path may pass ("x/.hidden")
        assert check_delete_batch(keys, 1000) == keys
        return
    with pytest.raises(InvalidInput) as caught:
        check_delete_batch(keys, 1000)
    assert repr(bad[:64]) in str(caught.value) or repr(bad) in str(caught.value)


def test_plain_keys_pass_up_to_the_byte_limit() -> None:
    longest = "a/" + "b" * (KEY_BYTES_MAX - 2)
    assert check_delete_batch([longest, "c/d"], 1000) == [longest, "c/d"]
    with pytest.raises(InvalidInput, match="1025 bytes"):
        check_delete_batch([longest + "x"], 1000)


def test_duplicates_are_dropped_in_first_seen_order() -> None:
    assert check_delete_batch(["b/1", "a/2", "b/1"], 1000) == ["b/1", "a/2"]
