"""Tests of distcomm._runtime.collectives before ``init``: identities in a world of 1, refused in
a launched larger world."""

from __future__ import annotations

import pytest

import distcomm
from distcomm.errors import NotInitializedError


def test_collectives_before_init_are_identities_in_a_world_of_one() -> None:
    np = pytest.importorskip("numpy")
    values = np.array([1.5, -2.0, 3.0])
    assert distcomm.all_reduce(values) is None
    np.testing.assert_array_equal(values, [1.5, -2.0, 3.0])
    assert distcomm.all_reduce(5) == 5
    assert distcomm.all_reduce(2.5, op="max") == 2.5
    payload = {"a": [1, 2], "b": "text"}
    assert distcomm.broadcast_object(payload) == payload
    assert distcomm.all_gather_object(7) == [7]
    assert not distcomm.is_initialized()


def test_a_number_follows_the_same_rules_in_a_world_of_one() -> None:
    """A world of 1 answers locally, with the rules of every world size (not the value back)."""
    from distcomm.errors import InvalidArgumentError

    assert distcomm.all_reduce(3, op="avg") == 3.0
    assert distcomm.all_reduce(True, op="band") is True
    with pytest.raises(InvalidArgumentError, match=r"AVG needs numbers, got bools"):
        distcomm.all_reduce(True, op="avg")
    with pytest.raises(InvalidArgumentError, match=r"BXOR needs ints or bools, got \[2\.5\]"):
        distcomm.all_reduce(2.5, op="bxor")


def test_collectives_before_init_refuse_a_larger_launched_world(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    np = pytest.importorskip("numpy")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(NotInitializedError) as info:
        distcomm.all_reduce(np.ones(3))
    assert "distcomm.init()" in str(info.value)
    assert "rank 1 of 2" in str(info.value)
    with pytest.raises(NotInitializedError, match=r"distcomm\.init\(\)"):
        distcomm.broadcast_object({"x": 1})
    with pytest.raises(NotInitializedError):
        distcomm.all_reduce(5)
