"""distcomm.assert_same: one vote when the ranks agree, the ranks and keys when they do not.

On fakelink thread-ranks; the conformance topic ``debugging`` runs the state_dict case on every
backend (gloo and mpi included).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
import pytest
import torch

import distcomm
from distcomm.backend._pipeline.assert_same import digests
from distcomm.errors import NotSameError
from distcomm.testing import run_threads


def verdicts(make: Any, world: int = 4) -> list[Any]:
    """What each rank sees when it asserts that ``make(rank)`` is the same everywhere."""

    def body() -> Any:
        try:
            distcomm.assert_same(make(distcomm.get_rank()), what="the model")
        except NotSameError as exc:
            return exc.ranks, exc.keys, str(exc)
        return "same"

    return run_threads(body, world)


def test_equal_values_of_every_kind_pass() -> None:
    def value(rank: int) -> Any:
        model = torch.nn.Linear(2, 1)
        with torch.no_grad():
            model.weight.fill_(0.5)
            model.bias.fill_(0.0)
        return {
            "model": model,
            "state": OrderedDict(w=torch.arange(4.0, dtype=torch.bfloat16), b=np.float64("nan")),
            "tags": {"a", "b", "c", "d"} if rank % 2 else {"d", "c", "b", "a"},
            "config": {"lr": 0.1, "layers": [1, 2, (3, "x")]},
            "scalar": torch.tensor(1.5),
            "empty": np.zeros((0, 3)),
        }

    assert verdicts(value) == ["same"] * 4


def test_one_differing_key_of_a_state_dict_is_named_on_every_rank() -> None:
    def state(rank: int) -> dict[str, torch.Tensor]:
        bias = torch.tensor([0.25 if rank == 2 else 0.5])
        return {"layer.weight": torch.ones(3, 3), "layer.bias": bias}

    for ranks, keys, message in verdicts(state):
        assert ranks == [2] and keys == ["['layer.bias']"]
        assert "assert_same (the model) failed" in message
        assert "['layer.bias']: differs on ranks [2] from rank 0" in message
        assert "ranks [2] differ from ranks [0, 1, 3]" in message and "HINT" in message


def test_the_majority_is_the_reference_and_ties_go_to_rank_0() -> None:
    assert [v[0] for v in verdicts(lambda r: int(r == 0))] == [[0]] * 4
    assert [v[0] for v in verdicts(lambda r: r % 2, world=2)] == [[1]] * 2


def test_bit_for_bit_dtype_shape_and_structure_count() -> None:
    assert verdicts(lambda r: np.zeros(2, np.float32 if r else np.float64), 2)[0][1] == [""]
    assert verdicts(lambda r: np.zeros((2, 2) if r else (4,)), 2)[0][1] == [""]
    assert verdicts(lambda r: np.array([-0.0 if r else 0.0]), 2)[0][1] == [""]
    assert verdicts(lambda r: [1, 2] + [3] * r, 2)[0][1] == ["", "[2]"]
    assert verdicts(lambda r: {"a": 1, **({"b": 2} if r else {})}, 2)[0][1] == ["['b']"]


def test_many_differing_keys_are_listed_in_full_on_the_error() -> None:
    def state(rank: int) -> dict[str, int]:
        return {f"k{i:02d}": i + rank for i in range(15)}

    _, keys, message = verdicts(state, 2)[0]
    assert len(keys) == 15 and "... and 5 more" in message


def test_a_world_of_one_and_unpicklable_leaves() -> None:
    assert run_threads(lambda: distcomm.assert_same(np.ones(3)), 1) == [None]
    with pytest.raises(Exception, match="pickle"):
        digests({"f": lambda: 1})


def test_digests_are_stable_across_set_order_and_dict_order() -> None:
    assert digests({"a": 1, "b": 2}) == digests({"b": 2, "a": 1})
    assert digests({3, 1, 2}) == digests({2, 3, 1})
    assert digests(np.arange(3)) != digests(np.arange(3)[::-1].copy())
