"""distcomm.compat.modelopt: modelopt.torch.export.distribute, at world 1 and on 4 ranks of every
backend (fakelink threads, gloo processes, mpirun; scenarios in tests/support/multirank.py)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest
import torch
from multirank import outcome, scenario

import distcomm
from distcomm.compat import modelopt
from distcomm.errors import InvalidArgumentError, RankFailedError

BACKENDS = ["threads", "gloo", "mpirun"]


def test_workspace_without_a_path_is_not_initialised() -> None:
    space = modelopt.NFSWorkspace()
    assert not space.is_initialized
    with pytest.raises(ValueError, match="made without a workspace_path"):
        space.write_configs_and_weights({}, {})
    with pytest.raises(ValueError, match="made without a workspace_path"):
        space.read_configs_and_weights_from_rank(0)


def test_workspace_files_are_private_and_replace_atomically(tmp_path: Path) -> None:
    space = modelopt.NFSWorkspace(tmp_path / "a" / "b")  # parents made
    assert space.is_initialized
    assert space.read_configs_and_weights_from_rank(0) == (None, None)
    space.write_configs_and_weights({"layers": 2}, {"w": torch.ones(2)})
    (path,) = (tmp_path / "a" / "b").iterdir()
    assert path.name == "distcomm-local-rank0-state.pkl"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    config, weights = space.read_configs_and_weights_from_rank(0)
    assert config == {"layers": 2} and weights is not None and weights["w"].tolist() == [1, 1]
    space.write_configs_and_weights({"layers": 3}, {})
    assert [p.name for p in (tmp_path / "a" / "b").iterdir()] == [path.name]  # no temp left
    assert modelopt.NFSWorkspace(tmp_path / "a" / "b").read_configs_and_weights_from_rank(0) == (
        None,
        None,
    )  # a new workspace removes this rank's stale file, as modelopt's


def test_world_of_one() -> None:
    with modelopt.get_tensors_parallel(torch.ones(2), [0]) as tensors:
        assert [t.tolist() for t in tensors] == [[1.0, 1.0]]
    with modelopt.get_configs_parallel({"a": 1}, [0], None) as configs:
        assert configs == [{"a": 1}]


def test_ranks_outside_the_group_are_refused() -> None:
    with (
        pytest.raises(InvalidArgumentError, match=r"ranks \[3\] are not in the group"),
        modelopt.get_tensors_parallel(torch.ones(1), [0, 3]),
    ):
        pass


# -- scenarios, on every backend ----------------------------------------------------------------
@scenario
def modelopt_exchanges(workdir: str) -> dict[str, Any]:
    rank = distcomm.get_rank()
    seen: dict[str, Any] = {}
    with modelopt.get_tensors_parallel(torch.full((2, 2), float(rank)), [3, 1, 2]) as tensors:
        seen["tensors"] = [t.tolist() for t in tensors]
    config = None if rank == 2 else {"name": f"layer{rank}", "weight": torch.full((2,), rank)}
    with modelopt.get_configs_parallel(config, [0, 1, 2, 3], None) as configs:
        seen["configs"] = [
            None if c is None else (c["name"], c["weight"].tolist()) for c in configs
        ]
    shared = Path(workdir, "nfs")
    with modelopt.get_configs_parallel({"r": rank}, [1, 0], None, workspace_path=shared) as configs:
        seen["nfs"] = configs
    seen["nfs_left"] = sorted(os.listdir(shared)) if shared.exists() else []
    odd = distcomm.new_group([1, 3])
    if odd:  # ranks are global ranks; the group is a distcomm communicator
        with modelopt.get_tensors_parallel(torch.tensor([rank]), [3, 1], odd) as tensors:
            seen["group"] = [t.tolist() for t in tensors]
    native = distcomm.get_communicator().native
    seen["torch_groups"] = isinstance(native, torch.distributed.ProcessGroup)
    if seen["torch_groups"]:  # an engine with torch groups
        pg = torch.distributed.new_group([0, 2])
        if rank in (0, 2):
            with modelopt.get_tensors_parallel(torch.tensor([rank]), [2, 0], pg) as tensors:
                seen["torch_group"] = [t.tolist() for t in tensors]
    space = modelopt.NFSWorkspace(Path(workdir, "state"))
    space.write_configs_and_weights({"rank": rank}, {"w": torch.full((1,), rank)})
    distcomm.barrier()  # NFSWorkspace itself never synchronises
    config_back, weights = space.read_configs_and_weights_from_rank((rank + 1) % 4)
    seen["nfs_workspace"] = (config_back, weights["w"].tolist() if weights else None)
    return seen


@scenario
def modelopt_faults(workdir: str) -> dict[str, Any]:
    rank = distcomm.get_rank()
    seen: dict[str, Any] = {}
    try:  # the merging rank raises inside the block: the others have nothing to wait for
        with modelopt.get_tensors_parallel(torch.ones(1), [0, 1, 2, 3]) as tensors:
            if tensors:
                raise RuntimeError("merge failed")
        seen["body"] = "finished"
    except RuntimeError as exc:
        seen["body"] = str(exc)
    try:  # a rank fails before the exchange (modelopt asserted and left the others hanging)
        with modelopt.get_tensors_parallel(None if rank == 2 else torch.ones(1), [0, 1, 2, 3]):
            pass
        seen["before"] = "finished"
    except RankFailedError as exc:
        seen["before"] = f"RankFailedError {exc.rank}"
    except InvalidArgumentError:
        seen["before"] = "InvalidArgumentError"
    distcomm.barrier()  # the world is still usable
    return seen


@pytest.mark.parametrize("backend", BACKENDS)
def test_exchanges_on_four_ranks(backend: str, scenario_worlds: Any) -> None:
    results = scenario_worlds(backend)[outcome(modelopt_exchanges)]
    assert results[3]["tensors"] == [[[r, r], [r, r]] for r in (3.0, 1.0, 2.0)]
    assert [results[r]["tensors"] for r in (0, 1, 2)] == [[]] * 3
    assert results[0]["configs"] == [
        ("layer0", [0, 0]),
        ("layer1", [1, 1]),
        None,
        ("layer3", [3, 3]),
    ]
    assert results[1]["nfs"] == [{"r": 1}, {"r": 0}] and results[0]["nfs"] == []
    assert all(seen["nfs_left"] == [] for seen in results)
    assert results[3]["group"] == [[3], [1]] and results[1]["group"] == []
    for rank, seen in enumerate(results):
        other = (rank + 1) % 4
        assert seen["nfs_workspace"] == ({"rank": other}, [other])
    torch_groups = {seen["torch_groups"] for seen in results}
    assert len(torch_groups) == 1, "every rank of a world sees the same engine"
    if torch_groups.pop():  # torch ProcessGroups exist there: they were used as the group
        assert results[2]["torch_group"] == [[2], [0]] and results[0]["torch_group"] == []
        assert "torch_group" not in results[1] and "torch_group" not in results[3]
    else:
        assert all("torch_group" not in seen for seen in results)


@pytest.mark.parametrize("backend", BACKENDS)
def test_failures_leave_no_rank_waiting(backend: str, scenario_worlds: Any) -> None:
    results = scenario_worlds(backend)[outcome(modelopt_faults)]
    assert [seen["body"] for seen in results] == ["merge failed", *["finished"] * 3]
    before = [seen["before"] for seen in results]
    assert before == [*["RankFailedError 2"] * 2, "InvalidArgumentError", "RankFailedError 2"]
