"""Tests of distcomm.protocol: ReduceOp spellings and the NON_MEMBER sentinel."""

from __future__ import annotations

import copy
import pickle

import pytest

import distcomm
from distcomm.errors import InvalidArgumentError
from distcomm.protocol import NON_MEMBER, NonMember, ReduceOp

ALL_OPS = ["SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR"]


def test_the_ops_are_exactly_the_documented_ones() -> None:
    assert [member.name for member in ReduceOp] == ALL_OPS


@pytest.mark.parametrize("member", list(ReduceOp))
def test_a_member_coerces_to_itself(member: ReduceOp) -> None:
    assert ReduceOp.coerce(member) is member


@pytest.mark.parametrize("member", list(ReduceOp))
def test_names_in_any_case(member: ReduceOp) -> None:
    name = member.name
    for spelling in (name, name.lower(), name.capitalize(), f"  {name.swapcase()} "):
        assert ReduceOp.coerce(spelling) is member


@pytest.mark.parametrize(
    ("alias", "member"),
    [
        ("prod", ReduceOp.PRODUCT),
        ("PROD", ReduceOp.PRODUCT),
        ("mean", ReduceOp.AVG),
        ("Mean", ReduceOp.AVG),
    ],
)
def test_aliases(alias: str, member: ReduceOp) -> None:
    assert ReduceOp.coerce(alias) is member


@pytest.mark.parametrize("name", ["SUM", "MAX", "MIN", "PRODUCT", "AVG", "BAND", "BOR", "BXOR"])
def test_torch_reduce_op_members(name: str) -> None:
    torch = pytest.importorskip("torch")
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available")
    assert ReduceOp.coerce(getattr(torch.distributed.ReduceOp, name)) is ReduceOp[name]


def test_torch_premul_sum_is_refused() -> None:
    torch = pytest.importorskip("torch")
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available")
    with pytest.raises(InvalidArgumentError, match="valid ops"):
        ReduceOp.coerce(torch.distributed.ReduceOp.PREMUL_SUM)


@pytest.mark.parametrize("bad", [3, "plus", None, "", True, 1.0, ["sum"]])
def test_bad_values_list_the_valid_ops(bad: object) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        ReduceOp.coerce(bad)
    assert isinstance(info.value, ValueError)
    message = str(info.value)
    assert repr(bad) in message
    assert all(name in message for name in ALL_OPS)
    assert "HINT" in message


def test_non_member_is_falsy_and_a_singleton() -> None:
    assert not NON_MEMBER
    assert bool(NON_MEMBER) is False
    assert NonMember() is NON_MEMBER
    assert distcomm.NON_MEMBER is NON_MEMBER
    assert repr(NON_MEMBER) == "distcomm.NON_MEMBER"


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_non_member_survives_pickling(protocol: int) -> None:
    assert pickle.loads(pickle.dumps(NON_MEMBER, protocol=protocol)) is NON_MEMBER
    assert pickle.loads(pickle.dumps([NON_MEMBER, 1], protocol=protocol))[0] is NON_MEMBER


def test_non_member_survives_copies() -> None:
    assert copy.copy(NON_MEMBER) is NON_MEMBER
    assert copy.deepcopy({"g": NON_MEMBER})["g"] is NON_MEMBER
