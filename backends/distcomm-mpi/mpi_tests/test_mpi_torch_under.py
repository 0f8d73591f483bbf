"""torch's groups over distcomm on mpi (``init(torch_group="distcomm")``), inside a real MPI job
(``mpirun -n N pytest --with-mpi``, PyPI torch, which has no MPI of its own): DDP, FSDP2, a
DeviceMesh with a DTensor redistribution and torch.distributed's calls run on distcomm's
communicator, its hooks see them, and a mismatch raises distcomm's error through torch.

Each test makes and ends its own world (the module's ``world`` fixture is not used here).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

import distcomm
from distcomm.errors import CollectiveMismatchError, InvalidArgumentError
from distcomm.protocol import Communicator

pytestmark = pytest.mark.mpi  # the launcher's variables stay: init() sees the MPI job

# torch 2.13's names for the one-tensor gather and reduce-scatter (the old ones warn there)
all_gather_single = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
reduce_scatter_single = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)


@pytest.fixture
def under() -> Iterator[Communicator]:
    """distcomm's world on mpi, torch's default group over it; none left after."""
    distcomm.finalize()
    comm = distcomm.init(backend="mpi", torch_group="distcomm")
    yield comm
    distcomm.finalize()
    assert not dist.is_initialized(), "finalize() ends torch's group over distcomm"


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def _batch(rank: int, step: int) -> torch.Tensor:
    return torch.randn(8, 16, generator=torch.Generator().manual_seed(100 * rank + step))


def test_torch_s_default_group_runs_on_the_communicator(under: Communicator) -> None:
    assert dist.is_initialized() and dist.get_backend() == "distcomm"
    assert under.torch_group is dist.group.WORLD  # type: ignore[attr-defined]
    assert (dist.get_rank(), dist.get_world_size()) == (under.rank, under.world_size)
    assert dist.group.WORLD.comm is under  # type: ignore[union-attr]


def test_ddp_averages_as_a_reference_does_and_the_hooks_see_its_all_reduces(
    under: Communicator,
) -> None:
    """Five DDP steps on different data per rank: the parameters equal (1e-5) those of one
    model trained in-process on every rank's batch; distcomm's hooks saw DDP's all-reduces."""
    model, reference = _model(), _model()
    seen: list[tuple[str, int | None]] = []
    with distcomm.add_hook(before=lambda e: seen.append((e.op, e.numel))):
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for step in range(5):
            optimizer.zero_grad()
            ddp(_batch(under.rank, step)).pow(2).mean().backward()
            optimizer.step()
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    world = under.world_size
    for step in range(5):
        ref_optimizer.zero_grad()
        loss = sum(reference(_batch(r, step)).pow(2).mean() for r in range(world))
        (loss / world).backward()  # type: ignore[operator]
        ref_optimizer.step()
    for (name, got), want in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert torch.allclose(got, want, atol=1e-5), f"{name} differs from the reference"
    params = sum(p.numel() for p in model.parameters())
    reduced = [n for op, n in seen if op == "all_reduce"]
    assert sum(reduced) == 5 * params, f"the hooks saw all-reduces of {reduced}, not DDP's"


def test_torch_distributed_calls_give_torch_s_results(under: Communicator) -> None:
    rank, world = under.rank, under.world_size
    x = torch.arange(4.0) + rank
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    assert x.tolist() == [float(i + world - 1) for i in range(4)]
    gathered = torch.empty(2 * world)
    all_gather_single(gathered, torch.full((2,), float(rank)))
    assert gathered.tolist() == [float(r) for r in range(world) for _ in range(2)]
    parts = [torch.empty(1) for _ in range(world)]
    dist.all_gather(parts, torch.tensor([rank * 10.0]))
    assert [p.item() for p in parts] == [r * 10.0 for r in range(world)]
    shard = torch.empty(2)
    reduce_scatter_single(shard, torch.arange(2.0 * world))
    assert shard.tolist() == [world * float(2 * rank + i) for i in range(2)]
    swapped = torch.empty(world)
    dist.all_to_all_single(swapped, torch.full((world,), float(rank)))
    assert swapped.tolist() == [float(r) for r in range(world)]
    root = world - 1
    y = torch.tensor([float(rank)])
    dist.broadcast(y, src=root)
    assert y.item() == root
    z = torch.tensor([1.0])
    dist.reduce(z, dst=0)
    if rank == 0:
        assert z.item() == world
    into = [torch.empty(1) for _ in range(world)] if rank == 0 else None
    dist.gather(torch.tensor([float(rank)]), into, dst=0)
    if into is not None:
        assert [t.item() for t in into] == [float(r) for r in range(world)]
    out = torch.empty(1)
    dist.scatter(out, [torch.tensor([r * 2.0]) for r in range(world)] if rank == 0 else None)
    assert out.item() == rank * 2.0
    work = dist.all_reduce(torch.ones(3), async_op=True)
    assert work is not None and work.wait() and work.get_future().wait()[0].tolist() == [world] * 3
    dist.barrier()
    if world > 1:  # a ring: every rank sends first (isend), then receives
        sent = dist.isend(torch.tensor([float(rank)]), (rank + 1) % world)
        got = torch.empty(1)
        dist.recv(got, (rank - 1) % world)
        assert sent is not None
        sent.wait()
        assert got.item() == (rank - 1) % world


def test_torch_s_other_call_forms_give_torch_s_results(under: Communicator) -> None:
    """The group's methods in torch's other forms: a tensor for a list of one, a ReduceOp or a
    root for the options (DDP's Join calls ``pg.allreduce(tensor)``)."""
    rank, world = under.rank, under.world_size
    group = dist.group.WORLD
    assert group is not None
    x = torch.ones(2) * (rank + 1)
    group.allreduce(x).wait()
    assert x.tolist() == [float(sum(range(1, world + 1)))] * 2
    y = torch.ones(2) * (rank + 1)
    group.allreduce([y], dist.ReduceOp.MAX).wait()
    assert y.tolist() == [float(world)] * 2, "a bare ReduceOp was not honoured"
    z = torch.tensor([float(rank)])
    group.broadcast(z, world - 1).wait()
    assert z.item() == world - 1
    r = torch.tensor([rank + 2.0])
    group.reduce(r, 0, dist.ReduceOp.PRODUCT).wait()
    if rank == 0:
        assert r.item() == float(torch.arange(2, world + 2).prod())
    parts = [torch.empty(1) for _ in range(world)]
    group.allgather(parts, torch.tensor([rank * 3.0])).wait()
    assert [p.item() for p in parts] == [r * 3.0 for r in range(world)]


def test_ddp_join_with_unused_parameters_and_uneven_inputs(under: Communicator) -> None:
    """DDP's Join (ranks with different numbers of batches) with find_unused_parameters: the
    ranks end with the same parameters."""
    from torch.distributed.algorithms.join import Join

    model = torch.nn.parallel.DistributedDataParallel(_model(), find_unused_parameters=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with Join([model]):
        for step in range(3 + 2 * under.rank):
            optimizer.zero_grad()
            model(_batch(under.rank, step)).pow(2).mean().backward()
            optimizer.step()
    mine = torch.cat([p.detach().flatten() for p in model.parameters()])
    everyone = [torch.empty_like(mine) for _ in range(under.world_size)]
    dist.all_gather(everyone, mine)
    assert all(torch.equal(other, mine) for other in everyone), "the ranks' parameters differ"


def test_coalesced_calls_give_each_call_s_result(under: Communicator) -> None:
    """torch's coalescing manager (FSDP's and DTensor's way of batching gathers and
    reduce-scatters): every call's result, in order."""
    rank, world = under.rank, under.world_size
    outs = [torch.empty(2 * world), torch.empty(3 * world)]
    with dist._coalescing_manager():
        all_gather_single(outs[0], torch.full((2,), float(rank)))
        all_gather_single(outs[1], torch.full((3,), 1.0 + rank))
    assert outs[0].tolist() == [float(r) for r in range(world) for _ in range(2)]
    assert outs[1].tolist() == [1.0 + r for r in range(world) for _ in range(3)]
    shards = [torch.empty(1), torch.empty(2)]
    with dist._coalescing_manager():
        reduce_scatter_single(shards[0], torch.ones(world))
        reduce_scatter_single(shards[1], torch.ones(2 * world))
    assert [s.tolist() for s in shards] == [[float(world)], [float(world)] * 2]


def test_new_group_is_a_group_of_the_communicator(under: Communicator) -> None:
    world = under.world_size
    evens = list(range(0, world, 2))
    group = dist.new_group(evens)
    if under.rank not in evens:
        assert group is dist.GroupMember.NON_GROUP_MEMBER
        return
    assert group.comm.global_ranks == tuple(evens)  # type: ignore[union-attr]
    x = torch.ones(1)
    dist.all_reduce(x, group=group)
    assert x.item() == len(evens)


def test_new_subgroups_are_groups_of_the_communicator(under: Communicator) -> None:
    size = 2 if under.world_size % 2 == 0 else 1
    mine, _ = dist.new_subgroups(size)
    assert mine.comm.world_size == size  # type: ignore[union-attr]
    x = torch.tensor([float(under.rank)])
    dist.all_reduce(x, group=mine)
    first = under.rank - under.rank % size
    assert x.item() == sum(range(first, first + size))


def test_a_device_mesh_redistributes_a_dtensor(under: Communicator) -> None:
    """A 2 x 2 DeviceMesh at 4 ranks (1 x N below): a DTensor sharded on both dimensions,
    redistributed to replicated x sharded, gives back the full tensor."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    world = under.world_size
    shape = (2, 2) if world == 4 else (1, world)
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("dp", "tp"))
    full = torch.arange(16.0).reshape(4, 4)
    sharded = distribute_tensor(full, mesh, [Shard(0), Shard(1)])
    moved = sharded.redistribute(mesh, [Replicate(), Shard(0)])
    assert moved.to_local().shape == (4 // shape[1], 4)
    assert torch.equal(moved.full_tensor(), full)
    assert mesh.get_group("tp").comm.world_size == shape[1]  # type: ignore[union-attr]


def test_fsdp2_gives_the_losses_of_torch_s_own_gloo(under: Communicator) -> None:
    """FSDP2 (``fully_shard``), five steps over distcomm on mpi, then the same on torch's own
    Gloo group (``init(backend="gloo")`` in the same job): the same losses."""

    def losses() -> list[float]:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        comm = distcomm.get_communicator()
        mesh = init_device_mesh("cpu", (comm.world_size,))
        model = _model()
        for layer in (model[0], model[2], model):
            fully_shard(layer, mesh=mesh)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        seen = []
        for step in range(5):
            loss = model(_batch(comm.rank, step)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total = loss.detach().clone()
            dist.all_reduce(total)
            seen.append(total.item())
        return seen

    over_distcomm = losses()
    distcomm.finalize()
    distcomm.init(backend="gloo")
    assert dist.get_backend() == "gloo"
    on_gloo = losses()
    assert over_distcomm == pytest.approx(on_gloo, abs=1e-6), (over_distcomm, on_gloo)


@pytest.mark.mpi(min_size=2)
def test_a_size_mismatch_through_torch_raises_distcomm_s_error(under: Communicator) -> None:
    with pytest.raises(CollectiveMismatchError) as info:
        dist.all_reduce(torch.ones(3 + under.rank))
    assert "all_reduce" in str(info.value) and "rank 1" in str(info.value)


def test_a_cuda_tensor_is_refused_with_the_engine_named(under: Communicator) -> None:
    meta = torch.empty(2, device="meta")  # a device mpi does not move (no GPU here)
    group = dist.group.WORLD
    assert group is not None
    with pytest.raises(InvalidArgumentError, match=r"engine \(mpi\) moves \['cpu'\]"):
        group.allreduce([meta])
    out = torch.empty(2 * under.world_size, device="meta")  # an output too
    with pytest.raises(InvalidArgumentError, match="all_gather_into_tensor: a tensor on meta"):
        group.all_gather_single(out, torch.ones(2))


def test_the_program_may_call_init_process_group_itself() -> None:
    """``init(torch_group=False)``, then ``init_process_group("distcomm")`` (env://): init
    exported the rendezvous torch reads, and the group runs on distcomm's world."""
    distcomm.finalize()
    comm = distcomm.init(backend="mpi", torch_group=False)
    try:
        dist.init_process_group("distcomm")
        x = torch.ones(1)
        dist.all_reduce(x)
        assert x.item() == comm.world_size
        assert dist.group.WORLD.comm is comm  # type: ignore[union-attr]
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        distcomm.finalize()


@pytest.mark.mpi(min_size=2)
def test_a_rank_slow_to_reach_torch_s_store_is_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The last rank reaches torch's store 1 s late, and every rank finalizes at once: rank 0,
    which serves the store, waits for it (``rendezvous.wait_for_all``; else the late rank
    retried for half an hour)."""
    import time

    from distcomm_torch import rendezvous

    distcomm.finalize()
    late = dist.get_world_size() if dist.is_initialized() else None
    assert late is None, "a torch default group was left by an earlier test"
    opened = rendezvous.open_store

    def slowly(*args: object, **kwargs: object) -> object:
        if args[1].rank == args[1].world_size - 1:  # type: ignore[attr-defined]
            time.sleep(1.0)
        return opened(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(rendezvous, "open_store", slowly)
    started = time.monotonic()
    distcomm.init(backend="mpi", torch_group="distcomm", timeout=20)
    distcomm.finalize()
    assert not dist.is_initialized()
    assert time.monotonic() - started < 15, "a rank waited for a store that had gone"
