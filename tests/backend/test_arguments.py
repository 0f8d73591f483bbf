"""Tests of distcomm.backend._pipeline.arguments: the argument checks of the collectives.

They run on rank 1 of a 3-rank communicator whose engine moves nothing (:class:`Probe`): a check
raises before anything is sent, so no engine method is ever called. docs/errors.md promises that
every message names the offending value, the valid choices and a HINT with the fix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from distcomm.backend import INTERNAL_TAG, BaseCommunicator, Capabilities
from distcomm.backend.arrays import adapter_for
from distcomm.environment import LaunchInfo
from distcomm.errors import InvalidArgumentError

WHERE = "probe 'world' (3 ranks)"


class Probe:
    """An engine that moves nothing: each of its required methods raises NotImplementedError."""

    def _never(self, *args: Any) -> Any:
        raise NotImplementedError("the probe engine moves nothing: a check should have raised")

    all_reduce = broadcast = all_gather_into = isend = irecv = split = _never


@pytest.fixture
def comm() -> BaseCommunicator:
    """Rank 1 of 3 over a :class:`Probe`."""
    return BaseCommunicator(
        Probe(),
        backend="probe",
        capabilities=Capabilities(node_memory=False),  # a probe in one process: no proof
        rank=1,
        world_size=3,
        launch=LaunchInfo("env", 1, 3, 1, 3, 0, 1),
    )


F32 = np.zeros(4, dtype=np.float32)
NUMPY = adapter_for(F32)


def message(check: Callable[[], Any]) -> str:
    with pytest.raises(InvalidArgumentError) as info:
        check()
    return str(info.value)


# -- ranks ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [3, -1, 7, True, "1", 1.0, None])
def test_a_rank_out_of_range_is_named_with_the_valid_ranks(
    comm: BaseCommunicator, value: Any
) -> None:
    text = message(lambda: comm._check_rank(value, "dst"))
    assert text.startswith(f"dst={value!r} is not a rank of {WHERE}: valid ranks are 0..2. HINT:")
    assert "comm.global_ranks.index(world_rank)" in text


@pytest.mark.parametrize("value", [0, 1, 2])
def test_every_rank_of_the_communicator_is_accepted(comm: BaseCommunicator, value: int) -> None:
    comm._check_rank(value, "src")


def test_a_public_call_checks_before_sending(comm: BaseCommunicator) -> None:
    """broadcast with a bad src raises InvalidArgumentError, not the engine's error."""
    text = message(lambda: comm.broadcast(F32, src=3))
    assert text.startswith(f"src=3 is not a rank of {WHERE}")
    assert comm.seq == 0, "a refused call is not counted"


# -- tags ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("tag", [-1, INTERNAL_TAG, 2**31, "7", 1.5, True])
def test_a_bad_tag_is_named_with_the_valid_range(comm: BaseCommunicator, tag: Any) -> None:
    text = message(lambda: comm._check_tag(tag))
    assert text.startswith(f"tag={tag!r} must be an int in [0, {INTERNAL_TAG})")


@pytest.mark.parametrize("tag", [0, 7, INTERNAL_TAG - 1])
def test_user_tags_below_the_internal_one_are_accepted(comm: BaseCommunicator, tag: int) -> None:
    comm._check_tag(tag)


# -- group members -------------------------------------------------------------------------------
@pytest.mark.parametrize("ranks", [[], [0, 0], [1, 3], [-1], [True, 2]])
def test_bad_group_members_are_named(comm: BaseCommunicator, ranks: list[Any]) -> None:
    text = message(lambda: comm._check_members(ranks))
    assert text.startswith(f"new_group: ranks {ranks!r} must be distinct ranks of {WHERE} (0..2)")
    assert "HINT: pass e.g. [0, 1]." in text


def test_group_members_that_cannot_be_sorted_are_refused(comm: BaseCommunicator) -> None:
    text = message(lambda: comm._check_members(["a", 1]))
    assert text.startswith("new_group: ranks ['a', 1] must be a sequence of ints")


def test_group_members_come_back_sorted(comm: BaseCommunicator) -> None:
    assert comm._check_members([2, 0]) == (0, 2)
    assert comm._check_members((1,)) == (1,)


# -- tensor pairs and lists ----------------------------------------------------------------------
def test_a_pair_of_another_dtype_is_named(comm: BaseCommunicator) -> None:
    other = np.zeros(4, dtype=np.int64)
    text = message(lambda: comm._check_pair(other, "output", NUMPY, "float32", 4))
    assert text == ("output has dtype 'int64' but the input has 'float32'. HINT: use one dtype.")


def test_a_pair_of_another_size_is_named_with_the_expected_size(comm: BaseCommunicator) -> None:
    text = message(lambda: comm._check_pair(np.zeros(3, np.float32), "output", NUMPY, "float32", 4))
    assert text.startswith(f"output has 3 elements; expected 4 on {WHERE}.")


def test_a_pair_of_another_kind_is_named(comm: BaseCommunicator) -> None:
    text = message(lambda: comm._check_pair(bytearray(4), "output", NUMPY, "float32", 4))
    assert text.startswith("output must be the same kind of array as the input (numpy)")


def test_a_matching_pair_is_accepted(comm: BaseCommunicator) -> None:
    comm._check_pair(np.ones((2, 2), np.float32), "output", NUMPY, "float32", 4)
    comm._check_pair(np.ones(9, np.float32), "output", NUMPY, "float32", None)  # any size


@pytest.mark.parametrize(
    ("parts", "got"),
    [([F32, F32], "2"), ([F32] * 4, "4"), ([], "0"), (F32, "'ndarray'"), (None, "'NoneType'")],
)
def test_a_list_of_the_wrong_length_is_named(comm: BaseCommunicator, parts: Any, got: str) -> None:
    text = message(lambda: comm._check_list(parts, "gather_list", NUMPY, "float32", 4))
    assert text == (
        f"gather_list must be a list of 3 tensors (one per rank of {WHERE}), got {got}. "
        "HINT: [torch.empty_like(t) for _ in range(world_size)]."
    )


def test_a_list_names_the_index_of_a_mismatched_entry(comm: BaseCommunicator) -> None:
    parts = [F32, np.zeros(4, dtype=np.float64), F32]
    text = message(lambda: comm._check_list(parts, "gather_list", NUMPY, "float32", 4))
    assert text.startswith("gather_list[1] has dtype 'float64' but the input has 'float32'.")
    parts = [F32, F32, np.zeros(5, dtype=np.float32)]
    text = message(lambda: comm._check_list(parts, "gather_list", NUMPY, "float32", 4))
    assert text.startswith(f"gather_list[2] has 5 elements; expected 4 on {WHERE}.")


def test_a_list_is_for_the_root_only(comm: BaseCommunicator) -> None:
    text = message(
        lambda: comm._check_root_list([F32] * 3, "scatter_list", 0, "src", NUMPY, "float32", 4)
    )
    assert text == (
        "scatter_list must be None on rank 1: only src=0 passes it, as in torch.distributed. "
        "HINT: pass it only where rank == src."
    )
    text = message(
        lambda: comm._check_root_list(None, "scatter_list", 1, "src", NUMPY, "float32", 4)
    )
    assert text.startswith("scatter_list is required on src=1 (this rank)")
    comm._check_root_list(None, "scatter_list", 0, "src", NUMPY, "float32", 4)
    comm._check_root_list([F32] * 3, "scatter_list", 1, "src", NUMPY, "float32", 4)


def test_a_public_call_checks_the_list_of_its_root(comm: BaseCommunicator) -> None:
    text = message(lambda: comm.gather(F32, [F32], dst=1))
    assert text.startswith("gather_list must be a list of 3 tensors")
    assert comm.seq == 0


# -- the promise of docs/errors.md: a HINT in every message -------------------------------------
@pytest.mark.parametrize(
    "check",
    [
        pytest.param(lambda c: c._check_rank(5, "dst"), id="rank"),
        pytest.param(lambda c: c._check_members([0, 0]), id="members"),
        pytest.param(
            lambda c: c._check_pair(np.zeros(4, np.int8), "output", NUMPY, "float32", 4),
            id="dtype",
        ),
        pytest.param(lambda c: c._check_list([F32], "gather_list", NUMPY, "float32", 4), id="list"),
        pytest.param(
            lambda c: c._check_root_list([F32] * 3, "gather_list", 0, "dst", NUMPY, "float32", 4),
            id="list-off-the-root",
        ),
        pytest.param(lambda c: c._check_tag(-1), id="tag"),
        pytest.param(lambda c: c._check_members(["a", 1]), id="unsortable"),
        pytest.param(
            lambda c: c._check_pair(np.zeros(3, np.float32), "output", NUMPY, "float32", 4),
            id="size",
        ),
        pytest.param(
            lambda c: c._check_pair(bytearray(4), "output", NUMPY, "float32", 4),
            id="kind",
        ),
        pytest.param(
            lambda c: c._check_root_list(None, "gather_list", 1, "dst", NUMPY, "float32", 4),
            id="list-missing-on-the-root",
        ),
    ],
)
def test_every_message_has_a_hint(
    comm: BaseCommunicator, check: Callable[[BaseCommunicator], Any]
) -> None:
    assert "HINT: " in message(lambda: check(comm))
