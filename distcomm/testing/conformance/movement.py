"""Checks of the collectives that move data without reducing it.

broadcast, all_gather, all_gather_into_tensor, gather, scatter, all_to_all_single and barrier,
on every dtype, from and to every root; the uneven ones (all_gather_v, the list forms with
entries of different sizes, all_to_all_single with split sizes).
"""

from __future__ import annotations

from typing import Any

import distcomm
from distcomm.errors import CollectiveMismatchError
from distcomm.testing.conformance.registry import check
from distcomm.testing.conformance.support import (
    cases,
    check_policy,
    comm,
    empty,
    expect,
    expect_values,
    make,
    pattern,
)

SHAPE = (2, 3)
N = 6


@check
def broadcast_every_src() -> None:
    """broadcast from every src on every dtype; src's tensor is left as it was."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    for lib, dtype in cases():
        for src in range(world):
            t = make(lib, dtype, pattern(dtype, rank, N), SHAPE)
            distcomm.broadcast(t, src=src)
            expect_values(t, pattern(dtype, src, N), f"broadcast src={src} {lib} {dtype}")


@check
def all_gather_list() -> None:
    """all_gather into a list with one tensor per rank, on every dtype."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    for lib, dtype in cases():
        parts = [empty(lib, dtype, SHAPE) for _ in range(world)]
        t = make(lib, dtype, pattern(dtype, rank, N), SHAPE)
        distcomm.all_gather(parts, t)
        for r, part in enumerate(parts):
            expect_values(part, pattern(dtype, r, N), f"all_gather {lib} {dtype} entry {r}")
        expect_values(t, pattern(dtype, rank, N), f"all_gather {lib} {dtype} modified its input")


@check
def all_gather_into_tensor() -> None:
    """all_gather_into_tensor concatenates along the first dimension, on every dtype."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    for lib, dtype in cases():
        out = empty(lib, dtype, (world * SHAPE[0], SHAPE[1]))
        distcomm.all_gather_into_tensor(out, make(lib, dtype, pattern(dtype, rank, N), SHAPE))
        expected = [v for r in range(world) for v in pattern(dtype, r, N)]
        expect_values(out, expected, f"all_gather_into_tensor {lib} {dtype}")
        # In place, as FSDP and ZeRO do it: the input is this rank's slice of the output.
        out = make(lib, dtype, pattern(dtype, rank, N * world), (world * SHAPE[0], SHAPE[1]))
        mine = out[rank * SHAPE[0] : (rank + 1) * SHAPE[0]]
        mine[...] = make(lib, dtype, pattern(dtype, rank, N), SHAPE)
        distcomm.all_gather_into_tensor(out, mine)
        expect_values(out, expected, f"in-place all_gather_into_tensor {lib} {dtype}")


@check
def gather_every_dst() -> None:
    """gather to every dst; gather_list is passed on dst only."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    for lib, dtype in cases():
        for dst in range(world):
            parts = [empty(lib, dtype, SHAPE) for _ in range(world)] if rank == dst else None
            distcomm.gather(make(lib, dtype, pattern(dtype, rank, N), SHAPE), parts, dst=dst)
            if parts is not None:
                for r, part in enumerate(parts):
                    expect_values(
                        part, pattern(dtype, r, N), f"gather dst={dst} {lib} {dtype} entry {r}"
                    )


@check
def scatter_every_src() -> None:
    """scatter from every src; scatter_list is passed on src only."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    for lib, dtype in cases():
        for src in range(world):
            parts = None
            if rank == src:
                parts = [
                    make(lib, dtype, pattern(dtype, src * world + r, N), SHAPE)
                    for r in range(world)
                ]
            t = empty(lib, dtype, SHAPE)
            distcomm.scatter(t, parts, src=src)
            expect_values(
                t, pattern(dtype, src * world + rank, N), f"scatter src={src} {lib} {dtype}"
            )


@check
def all_to_all_single() -> None:
    """all_to_all_single: chunk r of every rank's input lands in rank r's output, in rank order."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    n = 2
    for lib, dtype in cases():
        inp = make(
            lib,
            dtype,
            [v for r in range(world) for v in pattern(dtype, rank * world + r, n)],
            (world, n),
        )
        out = empty(lib, dtype, (world, n))
        distcomm.all_to_all_single(out, inp)
        expected = [v for s in range(world) for v in pattern(dtype, s * world + rank, n)]
        expect_values(out, expected, f"all_to_all_single {lib} {dtype}")


@check
def all_gather_v_of_different_sizes() -> None:
    """all_gather_v: rank r's tensor has r + 1 rows (rank 0's none where the world is larger
    than 1: an empty tensor), found by the call or given as sizes; each comes back unpadded."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    rows = [0 if (r == 0 and world > 1) else r + 1 for r in range(world)]
    for lib, dtype in cases(lambda d: d in ("int64", "float32", "bfloat16")):
        mine = make(lib, dtype, [rank, 1] * rows[rank], (rows[rank], 2))
        for sizes in (None, rows):
            got = distcomm.all_gather_v(mine, sizes)
            expect(len(got) == world, f"all_gather_v returned {len(got)} tensors for {world}")
            for r, part in enumerate(got):
                expect(tuple(part.shape) == (rows[r], 2), f"rank {r}'s shape {tuple(part.shape)}")
                expect_values(part, [r, 1] * rows[r], f"all_gather_v rank {r}, {lib} {dtype}")


@check
def list_forms() -> None:
    """torch's list forms: all_to_all(output_list, input_list) with entries of different sizes
    (rank r sends rank s r + s + 1 elements), async; reduce_scatter(output, input_list)."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    for lib, dtype in cases(lambda d: d in ("int64", "float32")):
        inputs = [make(lib, dtype, [100 * rank + s] * (rank + s + 1)) for s in range(world)]
        outputs = [empty(lib, dtype, (s + rank + 1,)) for s in range(world)]
        work = distcomm.all_to_all(outputs, inputs, async_op=True)
        expect(work is not None and work.wait() is True, "an async all_to_all's Work")
        for s in range(world):
            want = [100 * s + rank] * (s + rank + 1)
            expect_values(outputs[s], want, f"all_to_all from rank {s}, {lib} {dtype}")
        out = empty(lib, dtype, (2,))
        parts = [make(lib, dtype, [rank + s, 1]) for s in range(world)]
        distcomm.reduce_scatter(out, parts)
        total = sum(r + rank for r in range(world))
        expect_values(out, [total, world], f"reduce_scatter of a list, {lib} {dtype}")


@check
def reduce_scatter_of_different_sizes() -> None:
    """reduce_scatter(output, input_list) whose entries differ in size (torchcomms'
    reduce_scatter_v): entry r has r + 1 elements (rank 0's none where the world is larger
    than 1) and rank r's output has entry r's size; SUM and MAX, blocking and async."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    sizes = [0 if (r == 0 and world > 1) else r + 1 for r in range(world)]
    wanted = {  # rank q's entry r holds q + r + i at i
        distcomm.ReduceOp.SUM: [world * (rank + i) + world * (world - 1) // 2 for i in range(9)],
        distcomm.ReduceOp.MAX: [world - 1 + rank + i for i in range(9)],
    }
    for lib, dtype in cases(lambda d: d in ("int64", "float32", "bfloat16")):
        parts = [make(lib, dtype, [rank + r + i for i in range(n)]) for r, n in enumerate(sizes)]
        for op, want in wanted.items():
            for async_op in (False, True):
                out = empty(lib, dtype, (sizes[rank],))
                work = distcomm.reduce_scatter(out, parts, op=op, async_op=async_op)
                if async_op:
                    expect(work is not None and work.wait() is True, "an async call's Work")
                what = f"uneven reduce_scatter {op.name} async={async_op}, {lib} {dtype}"
                expect_values(out, want[: sizes[rank]], what)


@check
def all_gather_v_sizes_that_differ_raise_everywhere() -> None:
    """Rank 0 passes all_gather_v sizes that give rank 1 a row more than the other ranks'
    (its own entry right): every rank raises CollectiveMismatchError before anything moves,
    and the communicator stays usable. Needs 2 ranks or more."""
    c: Any = comm()
    if c.world_size < 2 or not hasattr(c, "debug"):
        return
    rank, world = c.rank, c.world_size
    lib, _ = next(cases(lambda d: d == "float32"))
    sizes = [2 if (r == 1 and rank == 0) else 1 for r in range(world)]
    with check_policy("check"):
        try:
            distcomm.all_gather_v(make(lib, "float32", [rank, 1], (1, 2)), sizes)
        except CollectiveMismatchError as exc:
            expect(exc.op == "all_gather_v", f"the mismatch names {exc.op!r}: {exc}")
            expect(exc.seq == c.seq and exc.ran is None, f"seq {exc.seq}, ran {exc.ran}: {exc}")
            expect(len(exc.table) == world, f"a table of {len(exc.table)} rows for {world}")
        else:
            raise AssertionError(f"rank {rank}: all_gather_v with other sizes was not stopped")
        got = distcomm.all_gather_v(make(lib, "float32", [rank, 1], (1, 2)), [1] * world)
        expect_values(got[world - 1], [world - 1, 1], "all_gather_v after the mismatch")


@check
def all_to_all_single_uneven() -> None:
    """all_to_all_single with split sizes (rows, as torch's): rank r sends (r + s) % 3 rows to
    rank s, zero-row chunks and a chunk to itself among them; a Work with async_op."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    sent = [(rank + s) % 3 for s in range(world)]
    expected_rows = [(s + rank) % 3 for s in range(world)]
    for lib, dtype in cases(lambda d: d in ("int64", "float32", "bfloat16")):
        values = [v for s in range(world) for _ in range(sent[s]) for v in (rank, s)]
        inp = make(lib, dtype, values, (sum(sent), 2))
        out = empty(lib, dtype, (sum(expected_rows), 2))
        work = distcomm.all_to_all_single(out, inp, expected_rows, sent, async_op=True)
        expect(work is not None and work.wait() is True, "an async uneven all_to_all's Work")
        got = [v for s in range(world) for _ in range(expected_rows[s]) for v in (s, rank)]
        expect_values(out, got, f"uneven all_to_all_single {lib} {dtype}")


@check
def barrier() -> None:
    """barrier returns None, or a completed Work with async_op=True; collectives around it agree."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    expect(distcomm.barrier() is None, "barrier() must return None")
    work = distcomm.barrier(async_op=True)
    expect(isinstance(work, distcomm.Work), f"barrier(async_op=True) returned {work!r}, not a Work")
    assert work is not None
    expect(work.wait() is True, "barrier Work.wait() must return True")
    expect(work.is_completed(), "barrier Work is not completed after wait()")
    for _ in range(3):
        distcomm.barrier()
    expect(
        distcomm.all_reduce(rank + 1) == world * (world + 1) // 2,
        "all_reduce after barriers is wrong",
    )
