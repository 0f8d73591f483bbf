"""Checks of the object collectives: broadcast_object, all_gather_object, gather_object and
scatter_object, from and to every rank, in the world and in a sub-group.

The objects mix what pickle protocol 5 sends in band (ints, strings, containers, None) with what
it sends out of band (numpy arrays, bytearrays), including a ~8 MiB array.
"""

from __future__ import annotations

from typing import Any

import distcomm
from distcomm.errors import InvalidArgumentError
from distcomm.testing.conformance.registry import check
from distcomm.testing.conformance.support import comm, expect, has_numpy, has_torch, raises

BIG = 8 * 2**20  # bytes


def sample(seed: int) -> dict[str, Any]:
    """An object that depends on ``seed``: containers, None, bytes, arrays of several layouts."""
    obj: dict[str, Any] = {
        "seed": seed,
        "text": f"rank-{seed}-é",
        "none": None,
        "nested": [seed, (seed, {"deep": [None, {seed}]}), frozenset({seed + 1})],
        "bytes": bytearray(f"payload {seed}", "ascii"),
    }
    if has_numpy():
        import numpy

        obj["ints"] = numpy.arange(7, dtype=numpy.int64) * seed
        obj["floats"] = numpy.full((2, 3), seed + 0.5, dtype=numpy.float32)
        obj["fortran"] = numpy.asfortranarray(
            numpy.arange(6, dtype=numpy.int16).reshape(2, 3) + seed
        )
        obj["strided"] = (numpy.arange(10, dtype=numpy.float64) + seed)[::3]
        obj["empty"] = numpy.zeros((0, 4), dtype=numpy.uint8)
    if has_torch():
        import torch

        obj["tensor"] = torch.arange(4, dtype=torch.bfloat16) + seed
    return obj


def big(seed: int) -> Any:
    """An ~8 MiB object that depends on ``seed``: a numpy array, or a bytearray without numpy."""
    if has_numpy():
        import numpy

        return numpy.arange(BIG // 8, dtype=numpy.float64) + seed
    return bytearray([seed % 256]) * BIG


def same(got: Any, want: Any) -> bool:
    """Deep equality that compares arrays by dtype, shape and values."""
    if type(got) is not type(want):
        return False
    if isinstance(want, dict):
        return got.keys() == want.keys() and all(same(got[k], want[k]) for k in want)
    if isinstance(want, (list, tuple)):
        return len(got) == len(want) and all(same(a, b) for a, b in zip(got, want, strict=True))
    if type(want).__module__.startswith(("numpy", "torch")) and hasattr(want, "shape"):
        return bool(
            got.dtype == want.dtype
            and tuple(got.shape) == tuple(want.shape)
            and bool((got == want).all())
        )
    return bool(got == want)


def _expect_same(got: Any, want: Any, what: str) -> None:
    expect(same(got, want), f"{what}: expected {want!r:.300}, got {got!r:.300}")


@check
def broadcast_object_every_src() -> None:
    """broadcast_object from every src returns src's object on every rank."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    for src in range(world):
        got = distcomm.broadcast_object(sample(rank), src=src)
        _expect_same(got, sample(src), f"broadcast_object src={src}")
    expect(distcomm.broadcast_object(None if rank == 0 else rank) is None, "broadcast_object(None)")
    got = distcomm.broadcast_object(["x" * rank, {"k": (rank,)}], src=world - 1)
    _expect_same(got, ["x" * (world - 1), {"k": (world - 1,)}], "broadcast_object of a list")


@check
def all_gather_object() -> None:
    """all_gather_object returns every rank's object, in rank order."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    _expect_same(
        distcomm.all_gather_object(sample(rank)),
        [sample(r) for r in range(world)],
        "all_gather_object",
    )
    _expect_same(distcomm.all_gather_object(None), [None] * world, "all_gather_object(None)")
    varied = distcomm.all_gather_object("y" * (rank * 1000))
    _expect_same(
        varied, ["y" * (r * 1000) for r in range(world)], "all_gather_object of different sizes"
    )


@check
def gather_object_every_dst() -> None:
    """gather_object returns the list on dst and None elsewhere."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    for dst in range(world):
        got = distcomm.gather_object(sample(rank), dst=dst)
        if rank == dst:
            _expect_same(got, [sample(r) for r in range(world)], f"gather_object dst={dst}")
        else:
            expect(
                got is None,
                f"gather_object dst={dst} returned {got!r:.100} on rank {rank}, not None",
            )


@check
def scatter_object_every_src() -> None:
    """scatter_object gives rank r ``objs[r]``; only src passes the list."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    for src in range(world):
        objs: list[Any] | None = None
        if rank == src:
            objs = [sample(src * world + r) for r in range(world)]
        _expect_same(
            distcomm.scatter_object(objs, src=src),
            sample(src * world + rank),
            f"scatter_object src={src}",
        )
    objs = [None if r % 2 else "x" * r * 100 for r in range(world)] if rank == 0 else None
    _expect_same(
        distcomm.scatter_object(objs),
        None if rank % 2 else "x" * rank * 100,
        "scatter_object of mixed sizes",
    )
    if rank == 0:
        raises(InvalidArgumentError, distcomm.scatter_object, [1] * (world + 1), src=0)
        raises(InvalidArgumentError, distcomm.scatter_object, None, src=0)


@check
def large_objects() -> None:
    """An ~8 MiB object travels by broadcast_object, all_gather_object and scatter_object."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    got = distcomm.broadcast_object({"big": big(rank)}, src=world - 1)
    _expect_same(got, {"big": big(world - 1)}, "broadcast_object of 8 MiB")
    gathered = distcomm.all_gather_object(big(rank) if rank == 0 else rank)
    _expect_same(gathered, [big(0), *range(1, world)], "all_gather_object with one 8 MiB entry")
    objs = [big(r) for r in range(world)] if rank == 0 else None
    _expect_same(distcomm.scatter_object(objs, src=0), big(rank), "scatter_object of 8 MiB objects")


@check
def objects_in_group() -> None:
    """Object collectives inside a group use group ranks as src/dst."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    group: Any = comm().split(rank % 2, key=world - rank)
    members = sorted((r for r in range(world) if r % 2 == rank % 2), reverse=True)
    size = len(members)
    for root in range(size):
        _expect_same(
            distcomm.broadcast_object(sample(rank), src=root, group=group),
            sample(members[root]),
            f"broadcast_object in group {members} src={root}",
        )
        got = distcomm.gather_object(sample(rank), dst=root, group=group)
        if group.rank == root:
            _expect_same(
                got, [sample(m) for m in members], f"gather_object in group {members} dst={root}"
            )
        else:
            expect(got is None, f"gather_object in group {members}: a non-dst got {got!r:.100}")
        objs = [sample(100 + m) for m in members] if group.rank == root else None
        _expect_same(
            distcomm.scatter_object(objs, src=root, group=group),
            sample(100 + rank),
            f"scatter_object in group {members} src={root}",
        )
    _expect_same(
        distcomm.all_gather_object(sample(rank), group=group),
        [sample(m) for m in members],
        f"all_gather_object in group {members}",
    )
    raises(InvalidArgumentError, distcomm.broadcast_object, 1, src=size, group=group)


def _layouts(seed: int) -> dict[str, Any]:
    """Large and small out-of-band buffers in one object, in an order that mixes them, plus a
    read-only and a non-contiguous large array (numpy only)."""
    import numpy

    large = 300 * 1024 // 8  # float64 elements: above the size sent straight from memory
    locked = numpy.full(large, seed, dtype=numpy.float64)
    locked.flags.writeable = False
    return {
        "a": numpy.arange(large, dtype=numpy.float64) + seed,
        "small": numpy.arange(3, dtype=numpy.int8) + seed,
        "b": numpy.full(large, -seed, dtype=numpy.float32),
        "locked": locked,
        "strided": (numpy.arange(2 * large, dtype=numpy.float64) + seed)[::2],
        "raw": bytearray([seed % 256]) * (400 * 1024),
        "tail": f"rank {seed}",
    }


@check
def objects_of_every_size() -> None:
    """Objects just under, at and over the first exchange's slot (2 KiB), of different sizes on
    different ranks, and objects mixing large and small, read-only and strided buffers, arrive
    whole, with writable arrays."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    for length in (0, 1800, 1900, 1950, 2000, 2100, 5000):
        text = "z" * length
        _expect_same(distcomm.broadcast_object(text if rank == 0 else None), text, f"{length} B")
        _expect_same(distcomm.all_gather_object(text), [text] * world, f"{length} B gathered")
    mixed = distcomm.all_gather_object("m" * (1500 + 400 * rank))
    _expect_same(mixed, ["m" * (1500 + 400 * r) for r in range(world)], "slot sizes mixed")
    if not has_numpy():
        return
    for src in range(world):
        got = distcomm.broadcast_object(_layouts(rank), src=src)
        _expect_same(got, _layouts(src), f"broadcast_object of mixed buffers from {src}")
        if rank != src:
            expect(got["a"].flags.writeable, "a received array is read-only")
    _expect_same(
        distcomm.all_gather_object(_layouts(rank)),
        [_layouts(r) for r in range(world)],
        "all_gather_object of mixed buffers",
    )
    got = distcomm.gather_object(_layouts(rank) if rank % 2 else rank, dst=0)
    if rank == 0:
        _expect_same(got, [_layouts(r) if r % 2 else r for r in range(world)], "gather_object")


class Unlisted:
    """A class on no allow-list: a peer's instance of it is refused (docs/security.md)."""

    def __init__(self, value: int) -> None:
        self.value = value


def allowed_sample(seed: int) -> dict[str, Any]:
    """What the default allow-list lets through: every builtin kind, numpy scalars and
    dtypes, torch dtypes, devices and sizes, beside :func:`sample`'s arrays and tensors."""
    obj: dict[str, Any] = {
        "sample": sample(seed),
        "kinds": [1.5, -(2**70), True, None, 3 + 4j, b"raw", "text", (seed,), [seed], {seed}],
        "frozen": frozenset({"a", seed}),
        "range": range(seed, 10, 3),
        "slice": slice(1, seed, 2),
    }
    if has_numpy():
        import numpy

        obj["scalars"] = [numpy.float32(seed + 0.25), numpy.int64(-seed), numpy.bool_(True)]
        obj["dtype"] = numpy.dtype("<u2")
    if has_torch():
        import torch

        obj["torch"] = [torch.float16, torch.device("cpu"), torch.Size([seed, 2])]
        obj["parameter"] = torch.nn.Parameter(torch.ones(3) * seed)
    return obj


@check
def allowed_objects_pass_unchanged_by_default() -> None:
    """Under the default policy (restricted unpickling), every kind on the allow-list comes
    back unchanged through each object collective."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    mine = allowed_sample(rank)
    gathered = distcomm.all_gather_object(mine)
    for r in range(world):
        _expect_same(gathered[r]["sample"], sample(r), f"all_gather_object from rank {r}")
        want = allowed_sample(r)
        for key in want:
            if key != "sample" and key != "parameter":
                expect(gathered[r][key] == want[key], f"{key} from rank {r}: {gathered[r][key]!r}")
        if has_torch():
            got = gathered[r]["parameter"]
            expect(
                type(got) is type(want["parameter"]) and bool((got == want["parameter"]).all()),
                f"nn.Parameter from rank {r}: {got!r}",
            )
    last = world - 1
    got = distcomm.broadcast_object(mine if rank == last else None, src=last)
    expect(got["kinds"] == allowed_sample(last)["kinds"], f"broadcast_object: {got['kinds']!r}")


@check
def a_refused_object_raises_on_every_receiving_rank() -> None:
    """A peer's object of a class on no allow-list raises ObjectRefusedError on every rank
    that received it (all of them, for all_gather_object: the sender's own copy too), naming
    the class and the sender; the communicator stays usable."""
    from distcomm.errors import ObjectRefusedError

    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    if world == 1:
        return  # nothing is pickled in a world of one
    sender = world - 1
    mine = Unlisted(rank) if rank == sender else rank
    error = raises(ObjectRefusedError, distcomm.all_gather_object, mine)
    assert isinstance(error, ObjectRefusedError)
    expect(
        error.refused == f"{__name__}.Unlisted" and error.sender == sender,
        f"all_gather_object: refused {error.refused!r} from {error.sender!r}: {error}",
    )
    expect(error.op == "all_gather_object" and "HINT" in str(error), str(error))
    expect(distcomm.all_gather_object(rank) == list(range(world)), "usable after a refusal")
    if rank == sender:  # its own object is not unpickled here
        distcomm.broadcast_object(Unlisted(rank), sender)
    else:
        error = raises(ObjectRefusedError, distcomm.broadcast_object, None, sender)
        expect(error.sender == sender and error.op == "broadcast_object", str(error))
    distcomm.barrier()
