"""distcomm.compat.torch_distributed: torch.distributed's names and meanings on distcomm.

The acceptance run: examples/from_torch.py gives each rank exactly what torch.distributed gives
under torchrun, with the drop-in, under ``distcomm run``, ``mpirun`` (mpi) and torchrun. The
rest runs in thread-ranks of one fakelink world: global ranks in subgroups, the ranks outside a
group, the list-in-place object functions, and the arguments refused with a clear error.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from jobs import find_mpirun, run_job

import distcomm
import distcomm.compat.torch_distributed as dist
from distcomm.errors import DistTimeoutError, InvalidArgumentError
from distcomm.testing import run_threads

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "from_torch.py"


def per_rank(stdout: str) -> dict[int, dict[str, Any]]:
    """The example's JSON line of each rank (``distcomm run``'s ``[rank N]`` prefix dropped)."""
    found = {}
    for line in stdout.splitlines():
        if "{" in line:
            try:
                got = json.loads(line[line.index("{") :])
            except json.JSONDecodeError as exc:
                raise AssertionError(f"not one rank's JSON line ({exc}):\n{stdout}") from exc
            found[got["rank"]] = got
    return found


def launch(how: str, tmp_path: Path, *flags: str) -> dict[int, dict[str, Any]]:
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    commands = {
        "torchrun": [str(torchrun), "--nproc-per-node", "2", str(EXAMPLE), *flags],
        "distcomm run": [sys.executable, "-m", "distcomm", "run", "-n", "2", str(EXAMPLE)],
        "mpirun": [str(find_mpirun()), "-n", "2", sys.executable, str(EXAMPLE)],
    }
    env = {"TMPDIR": str(tmp_path), "DISTCOMM_BACKEND": "mpi"} if how == "mpirun" else {}
    done = run_job(commands[how], timeout=120, cwd=tmp_path, env={"TMPDIR": str(tmp_path), **env})
    assert done.returncode == 0, f"{how}: {done.stdout}\n{done.stderr}"
    got = per_rank(done.stdout)
    assert sorted(got) == [0, 1], f"{how}: not one line per rank:\n{done.stdout}"
    return got


@pytest.mark.timeout(300)
def test_a_torch_program_gets_what_torch_gives_under_every_launcher(tmp_path: Path) -> None:
    expected = launch("torchrun", tmp_path, "--torch")
    assert expected[1]["on_last"] == [0, 10] and expected[0]["rank_in_tail"] == -1, expected
    for how in ("distcomm run", "mpirun", "torchrun"):
        got = launch(how, tmp_path)
        for rank in (0, 1):
            assert got[rank] == expected[rank], f"{how}, rank {rank}: {got[rank]} != torch's"


def test_the_drop_in_alone_runs_the_example_as_a_world_of_one(tmp_path: Path) -> None:
    done = run_job([sys.executable, str(EXAMPLE)], timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert per_rank(done.stdout)[0]["gathered"] == [{"loss": 1.0, "rank": 0}]


def in_threads(function: Any, world: int = 4) -> list[Any]:
    def rank() -> Any:
        dist.init_process_group()
        return function(dist.get_rank())

    return run_threads(rank, world, timeout=30)


def test_src_dst_and_peer_are_global_ranks_in_a_subgroup() -> None:
    def program(rank: int) -> Any:
        tail = dist.new_group([1, 2, 3])
        if not tail:
            return None
        value = torch.tensor([float(rank)])
        dist.broadcast(value, src=2, group=tail)  # global rank 2: the group's rank 1
        by_group = torch.tensor([float(rank)])
        dist.broadcast(by_group, group=tail, group_src=2)  # the group's rank 2: global 3
        summed = torch.tensor([float(rank)])
        dist.reduce(summed, dst=3, group=tail)
        message = torch.zeros(1)
        if rank == 1:
            dist.send(torch.tensor([7.0]), dst=3, group=tail)
            sender = None
        elif rank == 3:
            sender = dist.recv(message, src=1, group=tail)
        else:
            sender = None
        ranks = (dist.get_group_rank(tail, rank), dist.get_global_rank(tail, 0))
        return value.item(), by_group.item(), summed.item() if rank == 3 else None, sender, ranks

    got = in_threads(program)
    assert got[0] is None
    assert got[1] == (2.0, 3.0, None, None, (0, 1))
    assert got[3] == (2.0, 3.0, 6.0, 1, (2, 1)), "recv returns the sender's global rank"


def test_a_rank_outside_the_group_does_nothing_and_is_warned() -> None:
    def program(rank: int) -> Any:
        pair = dist.new_group([0, 1])
        value = torch.tensor([1.0])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            work = dist.all_reduce(value, group=pair)
            objects = [None, None]
            dist.all_gather_object(objects, rank, group=pair)
        said = [str(w.message) for w in caught]
        return value.item(), work, objects, said, dist.get_rank(pair), dist.get_world_size(pair)

    got = in_threads(program)
    assert got[0][:3] == (2.0, None, [0, 1]) and got[0][4:] == (0, 2)
    value, work, objects, said, rank, size = got[2]
    assert (value, work, objects, rank, size) == (1.0, None, [None, None], -1, -1)
    assert said == [
        "Running all_reduce on global rank 2 which does not belong to the given group.",
        "Running all_gather_object on global rank 2 which does not belong to the given group.",
    ]


def test_p2pop_peers_are_global_and_batches_run() -> None:
    def program(rank: int) -> Any:
        tail = dist.new_group([2, 3])
        if not tail:
            return None
        other = 5 - rank
        inbox = torch.zeros(1)
        ops = [
            dist.P2POp(dist.isend, torch.tensor([float(rank)]), other, group=tail),
            dist.P2POp(dist.irecv, inbox, other, group=tail),
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        return inbox.item(), ops[0].peer, ops[0].group_peer

    got = in_threads(program)
    assert got[2] == (3.0, 3, 1) and got[3] == (2.0, 2, 0), "peer global, group_peer the group's"


def test_the_object_functions_fill_lists_and_refuse_wrong_sizes() -> None:
    def program(rank: int) -> Any:
        short = [None]
        try:
            dist.all_gather_object(short, rank)
        except InvalidArgumentError as exc:
            error = str(exc)
        received = [None, None, None] if rank else ["a", 1, {"b": 2}]
        dist.broadcast_object_list(received, src=0)
        wrong = [None] if rank == 3 else [1, 2]
        try:
            dist.broadcast_object_list(wrong, src=0)
            length_error = ""
        except InvalidArgumentError as exc:
            length_error = str(exc)
        stray = [None] * 4  # given on every rank: torch requires None except on dst
        try:
            dist.gather_object(rank, stray, dst=1)
            stray_error = ""
        except InvalidArgumentError as exc:
            stray_error = str(exc)
        return error, received, length_error, stray, stray_error

    got = in_threads(program)
    assert "object_list must be a list of at least 4 items, not 1 items" in got[0][0]
    assert "HINT: object_list = [None] * 4" in got[0][0]
    assert all(rank[1] == ["a", 1, {"b": 2}] for rank in got)
    assert "object_list has 1 items, src's 2" in got[3][2] and got[2][2] == ""
    assert got[1][3] == [0, 1, 2, 3] and got[1][4] == ""
    assert "must be None on the ranks other than dst" in got[0][4]


def test_init_process_group_reads_torch_arguments_or_names_what_it_refuses() -> None:
    refused = {
        "store": dict(store=object()),
        "pg_options": dict(pg_options=object()),
        "'file:///tmp/x'": dict(init_method="file:///tmp/x"),
        "names 2 backends": dict(backend="cpu:gloo,cuda:nccl"),
    }
    for said, arguments in refused.items():
        with pytest.raises(InvalidArgumentError, match="HINT") as caught:
            dist.init_process_group(**arguments)
        assert said in str(caught.value)
    assert not dist.is_initialized()
    dist.init_process_group(
        "cpu:fakelink,cuda:fakelink", "tcp://127.0.0.1:29999", datetime.timedelta(seconds=9)
    )
    try:
        assert dist.get_backend() == "fakelink" and dist.group.WORLD is distcomm.get_communicator()
        assert dist.GroupMember.NON_GROUP_MEMBER is distcomm.NON_MEMBER
        dist.init_process_group("fakelink")  # again, alike: nothing (as distcomm.init)
        with pytest.raises(distcomm.AlreadyInitializedError, match="backend='gloo'"):
            dist.init_process_group("gloo")
    finally:
        dist.destroy_process_group()
    assert dist.group.WORLD is None and not dist.is_initialized()


def test_new_group_refuses_what_a_group_cannot_take() -> None:
    def program(rank: int) -> Any:
        said = []
        for arguments in (
            dict(backend="nccl"),
            dict(timeout=datetime.timedelta(seconds=1)),
            dict(use_local_synchronization=True),
            dict(ranks=[2, 0], sort_ranks=False),
            dict(pg_options=object()),
        ):
            try:
                dist.new_group(**arguments)
                said.append("")
            except InvalidArgumentError as exc:
                said.append(str(exc))
        return said

    said = in_threads(program, 2)[0]
    assert "backend='nccl': a group runs on the default group's, 'fakelink'" in said[0]
    assert "a group shares the default group's timeout" in said[1]
    assert "every rank of the world calls new_group" in said[2]
    assert "members are numbered in rank order" in said[3]
    assert "pg_options" in said[4] and all("HINT" in line for line in said)


def test_a_monitored_barrier_names_the_rank_that_did_not_come() -> None:
    def program(rank: int) -> Any:
        if rank == 1:
            return None
        try:
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=0.5))
        except DistTimeoutError as exc:
            return list(exc.missing_ranks)
        return "passed"

    assert in_threads(program, 3)[0] == [1]


def test_src_and_dst_default_where_torch_s_do_and_are_needed_elsewhere() -> None:
    def program(rank: int) -> Any:
        said = []
        for call in (
            lambda: dist.broadcast(torch.zeros(1)),
            lambda: dist.send(torch.zeros(1)),
            lambda: dist.P2POp(dist.isend, torch.zeros(1)),
            lambda: dist.broadcast(torch.zeros(1), src=0, group_src=0),
        ):
            try:
                call()
                said.append("")
            except InvalidArgumentError as exc:
                said.append(str(exc))
        objects = ["from 0"] if rank == 0 else [None]
        dist.broadcast_object_list(objects)  # torch: src 0 when none is given
        return said, objects

    for said, objects in in_threads(program, 2):
        assert objects == ["from 0"]
        assert "neither src nor group_src given" in said[0] and "HINT" in said[0]
        assert "neither dst nor group_dst given" in said[1]
        assert "neither peer nor group_peer given" in said[2]
        assert "src=0 and group_src=0: give one" in said[3]


def test_tensor_gather_scatter_and_any_source_receive_use_global_ranks() -> None:
    def program(rank: int) -> Any:
        tail = dist.new_group([1, 2, 3])
        if not tail:
            return None
        gathered = [torch.zeros(1) for _ in range(3)] if rank == 3 else None
        dist.gather(torch.tensor([float(rank)]), gathered, dst=3, group=tail)
        mine = torch.zeros(1)
        chunks = [torch.tensor([10.0 * r]) for r in (1, 2, 3)] if rank == 2 else None
        dist.scatter(mine, chunks, src=2, group=tail)
        sender = None
        if rank == 1:
            dist.send(torch.ones(1), dst=2, group=tail)
        elif rank == 2:
            sender = dist.recv(torch.zeros(1), group=tail)  # from any rank
        dist.barrier(group=tail, timeout=datetime.timedelta(seconds=20))
        with pytest.raises(InvalidArgumentError, match=r"\.wait\(timeout=\.\.\.\)"):
            dist.barrier(group=tail, async_op=True, timeout=datetime.timedelta(seconds=1))
        dist.destroy_process_group(tail)
        return [t.item() for t in gathered] if gathered else None, mine.item(), sender

    got = in_threads(program)
    assert got[3] == ([1.0, 2.0, 3.0], 30.0, None)
    assert got[1] == (None, 10.0, None) and got[2] == (None, 20.0, 1)


def test_torch_names_it_lacks_say_what_to_use() -> None:
    with pytest.raises(AttributeError, match=r"distcomm\.Communicator"):
        dist.ProcessGroup  # noqa: B018
    with pytest.raises(AttributeError, match=r"torch\.distributed\.all_reduce_multigpu exists"):
        dist.all_reduce_multigpu  # noqa: B018


def test_every_name_is_torch_s() -> None:
    import torch.distributed

    missing = [name for name in dist.__all__ if not hasattr(torch.distributed, name)]
    assert missing == [], f"not torch.distributed names: {missing}"


def test_async_work_waits_with_torch_s_timedelta() -> None:
    def program(rank: int) -> Any:
        value = torch.tensor([float(rank)])
        work = dist.all_reduce(value, async_op=True)
        assert work is not None
        return work.wait(timeout=datetime.timedelta(seconds=20)), value.item()

    assert in_threads(program, 2) == [(True, 1.0), (True, 1.0)]


def test_init_process_group_passes_torch_s_arguments_to_init(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[dict[str, Any]] = []
    monkeypatch.setattr(distcomm, "init", lambda **kwargs: asked.append(kwargs))
    dist.init_process_group("GLOO", "tcp://[::1]:29500", world_size=2, rank=1, device_id=0)
    dist.init_process_group(device_id="cpu")
    assert asked[0] == {
        "backend": "gloo",
        "rank": 1,
        "world_size": 2,
        "timeout": None,
        "device": "cuda:0",  # torch's int device_id
        "master_addr": "::1",
        "master_port": 29500,
    }
    assert asked[1]["device"] == "cpu" and asked[1]["backend"] is None
