"""distcomm's own functions called as torch.distributed's namesakes are: an error naming torch's
form and distcomm's call, never a silent or empty result; a torch name distcomm lacks: an
AttributeError naming distcomm's equivalent."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed

import distcomm
from distcomm._torch_names import DROP_IN, EQUIVALENTS
from distcomm.errors import InvalidArgumentError
from distcomm.testing import run_threads


def errors_of(call: Any, world: int = 2) -> list[str]:
    """What ``call(rank)`` raised on each thread-rank (InvalidArgumentError), "" where nothing."""

    def rank() -> str:
        try:
            call(distcomm.get_rank())
        except InvalidArgumentError as exc:
            return str(exc)
        return ""

    return run_threads(rank, world, timeout=30)


TORCH_FORMS = {
    "all_gather_object(gathered, stats)": (
        lambda rank: distcomm.all_gather_object([None, None], {"rank": rank}),
        "object_list = distcomm.all_gather_object(obj)",
    ),
    "gather_object(obj, lst, dst=0)": (
        lambda rank: distcomm.gather_object(rank, [None, None] if rank == 0 else None, dst=0),
        "distcomm.gather_object(obj, dst=dst)",
    ),
    "gather_object(obj, lst)": (
        lambda rank: distcomm.gather_object(rank, [None, None]),
        "distcomm.gather_object(obj, dst=dst)",
    ),
    "scatter_object(out, inputs, src=0)": (
        lambda rank: distcomm.scatter_object([None], ["a", "b"] if rank == 0 else None, src=0),
        "distcomm.scatter_object(input_list, src=src)",
    ),
}


def test_the_catalogue_s_message_is_exact() -> None:
    said = errors_of(lambda rank: distcomm.all_gather_object([None, None], {"loss": 0.5}))
    assert said[0] == (
        "distcomm.all_gather_object: group={'loss': 0.5} is not a communicator; that is "
        "torch.distributed's form (all_gather_object(object_list, obj) fills object_list). "
        "distcomm's returns the result instead. HINT: object_list = "
        "distcomm.all_gather_object(obj); or keep torch's form: "
        "import distcomm.compat.torch_distributed as dist"
    )


@pytest.mark.parametrize("form", TORCH_FORMS)
def test_a_torch_form_call_names_torch_s_form_and_distcomm_s(form: str) -> None:
    call, ours = TORCH_FORMS[form]
    for rank, said in enumerate(errors_of(call)):
        assert "that is torch.distributed's form" in said, f"rank {rank}: {said!r}"
        assert ours in said and DROP_IN in said, said


def test_broadcast_object_fills_torch_s_list_of_nones_in_place() -> None:
    def rank() -> tuple[Any, Any, Any]:
        rank = distcomm.get_rank()
        objects = ["config", {"lr": 0.1}] if rank == 0 else [None, None]
        returned = distcomm.broadcast_object(objects, src=0)
        kept = [None, None, None] if rank else ["x"]  # another length: left as it was
        distcomm.broadcast_object(kept, src=0)
        return objects, returned, kept

    got = run_threads(rank, 3, timeout=30)
    for objects, returned, _ in got:
        assert objects == returned == ["config", {"lr": 0.1}]
    assert got[1][2] == [None, None, None]


def test_the_getters_take_torch_s_group_argument() -> None:
    def rank() -> tuple[int, int, int]:
        pair = distcomm.new_group([1, 2])
        if not pair:
            return -1, -1, distcomm.get_rank()
        return distcomm.get_rank(pair), distcomm.get_world_size(group=pair), distcomm.get_rank()

    assert run_threads(rank, 3, timeout=30) == [(-1, -1, 0), (0, 2, 1), (1, 2, 2)]


def test_a_torch_process_group_as_group_says_how_to_adopt_it() -> None:
    store = torch.distributed.HashStore()
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        with pytest.raises(InvalidArgumentError) as caught:
            distcomm.all_reduce(torch.ones(1), group=torch.distributed.group.WORLD)
    finally:
        torch.distributed.destroy_process_group()
    said = str(caught.value)
    assert "torch's ProcessGroup, not a distcomm communicator" in said
    assert "distcomm.get_communicator().adopt(pg)" in said


@pytest.mark.parametrize("name", sorted(EQUIVALENTS))
def test_a_torch_name_distcomm_lacks_names_the_equivalent(name: str) -> None:
    assert hasattr(torch.distributed, name), f"torch.distributed has no {name}: not torch's name"
    with pytest.raises(AttributeError) as caught:
        getattr(distcomm, name)
    said = str(caught.value)
    assert f"torch.distributed.{name} is, in distcomm: {EQUIVALENTS[name]}" in said
    assert DROP_IN in said


def test_an_unknown_name_is_a_plain_attribute_error() -> None:
    with pytest.raises(AttributeError, match=r"^module 'distcomm' has no attribute 'nope'$"):
        distcomm.nope  # noqa: B018


def test_the_porting_guide_names_every_equivalent() -> None:
    guide = (Path(__file__).resolve().parents[2] / "docs" / "from-torch.md").read_text()
    missing = [name for name in EQUIVALENTS if not re.search(rf"`{name}[`(.]", guide)]
    assert missing == [], f"docs/from-torch.md's table lacks {missing}"
