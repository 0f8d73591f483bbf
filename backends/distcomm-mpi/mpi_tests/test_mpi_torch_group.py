"""torch's default process group beside the mpi backend, inside a real MPI job (``mpirun -n N
pytest --with-mpi``): made when the program imported torch (``torch_group="auto"``), reachable
as ``comm.torch_group``, carrying torch's own collectives, and gone after ``finalize()``; not
made when turned off. Each test makes and ends its own world (the module's ``world`` fixture is
not used here)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

import distcomm

pytestmark = pytest.mark.mpi  # the launcher's variables stay: init() sees the MPI job


@pytest.fixture
def no_world() -> Iterator[None]:
    """Between the modules' shared worlds: none runs during the test, none is left after."""
    distcomm.finalize()
    yield
    distcomm.finalize()
    assert not dist.is_initialized()


@pytest.mark.usefixtures("no_world")
def test_auto_makes_torch_s_default_group_beside_mpi() -> None:
    from mpi4py import MPI

    comm = distcomm.init()
    assert comm.world_size == MPI.COMM_WORLD.Get_size(), "init() did not see the MPI job"
    if comm.world_size == 1:  # a world of 1 needs none
        assert comm.torch_group is None and not dist.is_initialized()  # type: ignore[attr-defined]
        return
    assert comm.backend == "mpi"
    assert dist.is_initialized() and comm.torch_group is dist.group.WORLD  # type: ignore[attr-defined]
    assert (dist.get_rank(), dist.get_world_size()) == (comm.rank, comm.world_size)
    x = torch.tensor([float(comm.rank)])
    dist.all_reduce(x)  # torch's own call, on the group distcomm made
    assert x.item() == sum(range(comm.world_size))
    assert os.environ["MASTER_PORT"].isdigit() and os.environ["MASTER_ADDR"]
    port = os.environ["MASTER_PORT"]
    assert distcomm.broadcast_object(port) == port, "every rank exports the same rendezvous"
    distcomm.finalize()
    assert not dist.is_initialized(), "finalize() ends the group distcomm made"
    assert "MASTER_PORT" not in os.environ, "finalize() takes back what init() exported"


@pytest.mark.usefixtures("no_world")
@pytest.mark.parametrize("how", ["argument", "environment"])
def test_it_can_be_turned_off(how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if how == "environment":
        monkeypatch.setenv("DISTCOMM_TORCH_GROUP", "0")
        comm = distcomm.init()
    else:
        comm = distcomm.init(torch_group=False)
    assert comm.torch_group is None and not dist.is_initialized()  # type: ignore[attr-defined]


@pytest.mark.usefixtures("no_world")
def test_bad_choices_are_refused_before_any_communication(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(distcomm.InvalidArgumentError, match="torch_group='always'") as info:
        distcomm.init(torch_group="always")  # type: ignore[arg-type]
    assert "'auto', True, False" in str(info.value) and "HINT" in str(info.value)
    monkeypatch.setenv("DISTCOMM_TORCH_GROUP", "maybe")
    with pytest.raises(distcomm.InvalidArgumentError, match="DISTCOMM_TORCH_GROUP='maybe'"):
        distcomm.init()
    assert not distcomm.is_initialized()


@pytest.mark.usefixtures("no_world")
def test_gloo_under_mpirun_exports_the_rendezvous_it_agreed_over_mpi() -> None:
    """mpirun gives no master address: gloo agrees on one over MPI, and exports it, so that
    env:// code that runs later meets at the same place."""
    comm = distcomm.init(backend="gloo")
    if comm.world_size == 1:  # a world of 1 meets nowhere: nothing to export
        assert "MASTER_PORT" not in os.environ
        return
    launch = comm.launch  # type: ignore[attr-defined]
    assert (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]) == (
        launch.master_addr,
        str(launch.master_port),
    )
    assert comm.torch_group is dist.group.WORLD  # type: ignore[attr-defined]
    distcomm.finalize()
    assert "MASTER_ADDR" not in os.environ and "MASTER_PORT" not in os.environ


@pytest.mark.usefixtures("no_world")
def test_a_group_the_program_made_is_used_and_left_alone() -> None:
    """torch's default group made by the program before ``init(backend="mpi")``: it is
    ``comm.torch_group``, and ``finalize()`` does not destroy it (distcomm did not make it)."""
    from mpi4py import MPI

    from distcomm.backend import free_port

    world = MPI.COMM_WORLD
    port = world.bcast(free_port() if world.Get_rank() == 0 else None, root=0)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=world.Get_rank(),
        world_size=world.Get_size(),
    )
    try:
        comm = distcomm.init(backend="mpi")
        assert comm.torch_group is dist.group.WORLD  # type: ignore[attr-defined]
        distcomm.finalize()
        assert dist.is_initialized(), "finalize() destroyed the program's own group"
    finally:
        dist.destroy_process_group()
