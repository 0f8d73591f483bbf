"""Checks of the getters and of argument validation (docs/errors.md lists the messages).

Invalid arguments raise InvalidArgumentError (a ValueError) on the rank that passed them, before
anything is sent, so every check here may call with bad arguments on some ranks only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import distcomm
from distcomm.errors import InvalidArgumentError
from distcomm.protocol import Communicator
from distcomm.testing.conformance.registry import check
from distcomm.testing.conformance.support import (
    cases,
    check_policy,
    comm,
    empty,
    expect,
    libraries,
    make,
    raises,
    values_of,
)


@check
def getters() -> None:
    """get_rank, get_world_size, is_initialized, is_main_process, is_distributed agree with comm."""
    c = comm()
    rank, world = c.rank, c.world_size
    expect(isinstance(c, Communicator), f"{c!r} does not satisfy the Communicator protocol")
    expect(distcomm.is_initialized(), "is_initialized() is False inside a rank")
    expect(distcomm.get_rank() == rank, f"get_rank() is {distcomm.get_rank()}, comm.rank is {rank}")
    expect(
        distcomm.get_world_size() == world,
        f"get_world_size() is {distcomm.get_world_size()}, comm says {world}",
    )
    expect(0 <= rank < world, f"rank {rank} is not in range(world_size={world})")
    expect(
        tuple(c.global_ranks) == tuple(range(world)),
        f"the world's global_ranks are {c.global_ranks!r}",
    )
    expect(distcomm.is_main_process() == (rank == 0), f"is_main_process() is wrong on rank {rank}")
    expect(
        distcomm.is_distributed() == (world > 1),
        f"is_distributed() is wrong for a world of {world}",
    )
    expect(
        distcomm.get_backend() == c.backend,
        f"get_backend() is {distcomm.get_backend()!r}, comm says {c.backend!r}",
    )
    expect(distcomm.init() is c, "init() inside a running rank must return its communicator")
    seen = distcomm.all_gather_object((rank, world))
    expect(seen == [(r, world) for r in range(world)], f"ranks disagree on who they are: {seen}")


@check
def invalid_ranks() -> None:
    """src/dst outside the communicator raise InvalidArgumentError naming the value."""
    world = distcomm.get_world_size()
    for lib, dtype in cases(lambda d: d == "float32"):
        t = make(lib, dtype, [1.0, 2.0])
        parts = [empty(lib, dtype, (2,)) for _ in range(world)]
        for bad in (world, -1, world + 7):
            calls: list[tuple[str, Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = [
                ("src", distcomm.broadcast, (t,), {"src": bad}),
                ("dst", distcomm.reduce, (t,), {"dst": bad}),
                ("dst", distcomm.gather, (t,), {"dst": bad}),
                ("dst", distcomm.gather, (t, parts), {"dst": bad}),
                ("src", distcomm.scatter, (t,), {"src": bad}),
                ("src", distcomm.scatter, (t, parts), {"src": bad}),
                ("dst", distcomm.send, (t, bad), {}),
                ("dst", distcomm.isend, (t, bad), {}),
                ("src", distcomm.recv, (t, bad), {}),
                ("src", distcomm.irecv, (t, bad), {}),
                ("src", distcomm.broadcast_object, (1,), {"src": bad}),
                ("dst", distcomm.gather_object, (1,), {"dst": bad}),
                ("src", distcomm.scatter_object, ([1] * world,), {"src": bad}),
            ]
            for name, fn, args, kwargs in calls:
                exc = raises(InvalidArgumentError, fn, *args, **kwargs)
                expect(
                    f"{name}={bad}" in str(exc) or (name in str(exc) and repr(bad) in str(exc)),
                    f"{fn.__name__} with {name}={bad}: the message does not name the value: {exc}",
                )
        raises(InvalidArgumentError, distcomm.broadcast, t, src=True)
        raises(InvalidArgumentError, distcomm.broadcast, t, src=0.0)
        raises(InvalidArgumentError, distcomm.send, t, 0, tag=-1)


@check
def invalid_tensor_lists() -> None:
    """Lists of the wrong length or holding the wrong arrays raise before communicating."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    for lib, dtype in cases(lambda d: d == "int32"):
        t = make(lib, dtype, [1, 2, 3])
        for length in (world - 1, world + 1):
            parts = [empty(lib, dtype, (3,)) for _ in range(length)]
            exc = raises(InvalidArgumentError, distcomm.all_gather, parts, t)
            expect(
                str(world) in str(exc),
                f"all_gather with {length} outputs: the message lacks the size: {exc}",
            )
            if rank == 0:
                raises(InvalidArgumentError, distcomm.gather, t, parts, dst=0)
                raises(InvalidArgumentError, distcomm.scatter, t, parts, src=0)
        wrong_size = [empty(lib, dtype, (4,)) for _ in range(world)]
        raises(InvalidArgumentError, distcomm.all_gather, wrong_size, t)
        raises(InvalidArgumentError, distcomm.all_gather, empty(lib, dtype, (3 * world,)), t)


@check
def root_only_lists() -> None:
    """gather_list / scatter_list: required on the root, ValueError elsewhere (as in torch)."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    for lib, dtype in cases(lambda d: d == "float64"):
        t = make(lib, dtype, [1.0])
        parts = [empty(lib, dtype, (1,)) for _ in range(world)]
        for root in range(world):
            if rank == root:
                raises(ValueError, distcomm.gather, t, None, dst=root)
                raises(ValueError, distcomm.scatter, t, None, src=root)
            else:
                raises(ValueError, distcomm.gather, t, parts, dst=root)
                raises(ValueError, distcomm.scatter, t, parts, src=root)


@check
def mismatched_outputs() -> None:
    """Output and input of different dtypes, libraries or sizes raise before communicating."""
    world = distcomm.get_world_size()
    for lib, dtype in cases(lambda d: d == "float32"):
        other = "int64"
        inp = make(lib, dtype, [1.0] * 2 * world)
        for fn, out in (
            (distcomm.all_gather_into_tensor, empty(lib, other, (2 * world * world,))),
            (distcomm.all_gather_into_tensor, empty(lib, dtype, (2 * world * world + 1,))),
            (distcomm.reduce_scatter_tensor, empty(lib, other, (2,))),
            (distcomm.reduce_scatter_tensor, empty(lib, dtype, (3,))),
            (distcomm.all_to_all_single, empty(lib, other, (2 * world,))),
            (distcomm.all_to_all_single, empty(lib, dtype, (2 * world + 1,))),
        ):
            exc = raises(InvalidArgumentError, fn, out, inp)
            expect(
                isinstance(exc, ValueError),
                f"{fn.__name__}: {type(exc).__name__} is not a ValueError",
            )
        exc = raises(
            InvalidArgumentError,
            distcomm.all_gather_into_tensor,
            empty(lib, other, (2 * world * world,)),
            inp,
        )
        expect(
            other in str(exc) and dtype in str(exc),
            f"the dtype mismatch message names neither dtype: {exc}",
        )
        parts = [empty(lib, other, (2 * world,)) for _ in range(world)]
        raises(InvalidArgumentError, distcomm.all_gather, parts, inp)
    libs = sorted({lib for lib, _ in cases()})
    if len(libs) == 2:
        raises(
            InvalidArgumentError,
            distcomm.all_gather_into_tensor,
            empty(libs[0], "float32", (world,)),
            make(libs[1], "float32", [1.0]),
        )


@check
def read_only_outputs() -> None:
    """A numpy array the call writes its result into that is read-only (``flags.writeable``
    False: a read-only memory map, ``np.frombuffer`` of bytes) is refused with
    InvalidArgumentError naming it, before anything is sent: on every rank where every rank's
    is written (all_reduce, all_reduce_coalesced, the outputs, the uneven all-to-all's,
    scatter's tensor, a recv's buffer). A read-only array the call only reads is taken
    (broadcast's at src, also one the pipeline stages; inputs; reduce's off dst, also with an
    op an engine emulates; gather's tensor; scatter's list). Twice, with the check off, after
    calls of each kind on writable arrays: an engine's plan for the kind (or the uneven
    all-to-all's shortcut) is reached and must leave the call to the pipeline."""
    if "numpy" not in libraries():
        return
    import numpy as np

    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    n = 2 * world

    def ro(values: list[float]) -> Any:
        a = np.array(values, np.float32)
        a.flags.writeable = False
        return a

    def rw(size: int) -> Any:
        return np.zeros(size, np.float32)

    mine = [float(rank + 1)] * n
    everyone = [float(r + 1) for r in range(world) for _ in range(n)]
    splits = [1] * world  # the uneven all-to-all's rows, the same on every rank
    refused: dict[str, Callable[[Any], Any]] = {
        "all_reduce": lambda out: distcomm.all_reduce(out),
        "all_reduce_coalesced": lambda out: distcomm.all_reduce_coalesced([rw(n), out]),
        "uneven all_to_all_single": lambda out: distcomm.all_to_all_single(
            out.reshape(world, 2), rw(n).reshape(world, 2), splits, splits
        ),
        "all_gather_into_tensor": lambda out: distcomm.all_gather_into_tensor(out, rw(n)),
        "reduce_scatter_tensor": lambda out: distcomm.reduce_scatter_tensor(out, rw(n * world)),
        "all_to_all_single": lambda out: distcomm.all_to_all_single(out, rw(n)),
        "scatter": lambda out: distcomm.scatter(out, [rw(n)] * world if rank == 0 else None),
        "all_gather": lambda out: distcomm.all_gather([out] * world, rw(n)),
    }
    sizes = {"all_gather_into_tensor": n * world}
    if world > 1 and comm().capabilities.p2p:
        refused["recv"] = lambda out: distcomm.recv(out, (rank + 1) % world)
    with check_policy("off"):
        for step in range(2):
            for name, call in refused.items():
                size = sizes.get(name, n)
                if name != "recv":
                    call(rw(size))  # the kind known: its plan (if any) is reached next
                exc = raises(InvalidArgumentError, call, ro([0.0] * size))
                expect(
                    "read-only" in str(exc) and "HINT:" in str(exc),
                    f"{name} into a read-only array (round {step}): {exc}",
                )
            # a read-only source the pipeline stages (not contiguous: a copy is moved)
            strided = np.array(mine * 2, np.float32)[::2]
            strided.flags.writeable = False
            t = strided if rank == 0 else rw(n)
            distcomm.broadcast(t, src=0)
            expect(values_of(t) == [1.0] * n, f"broadcast of a strided read-only source: {t}")
            for src in range(world):
                t = ro(mine) if rank == src else rw(n)
                distcomm.broadcast(t, src=src)
                expect(
                    values_of(t) == [float(src + 1)] * n,
                    f"broadcast from a read-only array at src={src}: {values_of(t)}",
                )
            out = rw(n * world)
            distcomm.all_gather_into_tensor(out, ro(mine))
            expect(values_of(out) == everyone, f"all_gather of a read-only input: {values_of(out)}")
            t = rw(n) if rank == 0 else ro(mine)
            distcomm.reduce(t, dst=0)
            if rank == 0:
                want = [float(sum(range(2, world + 1)))] * n
                expect(values_of(t) == want, f"reduce of read-only inputs: {values_of(t)}")
            t = np.ones(n, np.float32) if rank == 0 else ro(mine)  # (an op emulated on some)
            distcomm.reduce(t, dst=0, op="product")
            if rank == 0:
                want = [float(math.prod(range(2, world + 1)))] * n
                expect(values_of(t) == want, f"product of read-only inputs: {values_of(t)}")
            parts = [rw(n) for _ in range(world)] if rank == 0 else None
            distcomm.gather(ro(mine), parts, dst=0)
            if parts is not None:
                got = [v for p in parts for v in values_of(p)]
                expect(got == everyone, f"gather of read-only inputs: {got}")
    expect(distcomm.all_reduce(1) == world, "the ranks are out of step after refused calls")


@check
def not_a_tensor() -> None:
    """Python lists, tuples and strings are refused with a hint (numbers only for all_reduce)."""
    world = distcomm.get_world_size()
    for bad in ([1, 2], (1.0,), "abc", None):
        exc = raises(InvalidArgumentError, distcomm.all_reduce, bad)
        expect(
            "tensor" in str(exc).lower(),
            f"all_reduce({bad!r}): the message does not say what it wants: {exc}",
        )
        raises(InvalidArgumentError, distcomm.broadcast, bad, src=0)
        raises(InvalidArgumentError, distcomm.all_gather, [bad] * world, bad)
        if world > 1:
            raises(InvalidArgumentError, distcomm.send, bad, 1 % world)


@check
def unknown_reduce_op() -> None:
    """A misspelt op names itself, every accepted spelling, a did-you-mean and a HINT."""
    from distcomm.protocol import _OP_NAMES  # every spelling ReduceOp.coerce accepts

    world = distcomm.get_world_size()
    for lib, dtype in cases(lambda d: d == "float32"):
        t = make(lib, dtype, [1.0] * world)
        for fn, args in (
            (distcomm.all_reduce, (t,)),
            (distcomm.reduce, (t,)),
            (distcomm.reduce_scatter_tensor, (empty(lib, dtype, (1,)), t)),
            (distcomm.all_reduce, (1.5,)),
        ):
            message = str(raises(InvalidArgumentError, fn, *args, op="summ"))
            expect(
                "'summ'" in message and "did you mean 'sum'?" in message and "HINT:" in message,
                f"{fn.__name__}(op='summ'): no value, did-you-mean or HINT: {message}",
            )
            missing = [a for a in _OP_NAMES if repr(a) not in message and a.upper() not in message]
            expect(
                not missing and "torch.distributed.ReduceOp" in message,
                f"{fn.__name__}(op='summ'): the message omits accepted ops {missing}: {message}",
            )
        expect(values_of(t) == [1.0] * world, f"a refused op changed the tensor: {values_of(t)}")
    expect(distcomm.all_reduce(1) == world, "the ranks are out of step after refused ops")


@check
def unsupported_dtypes() -> None:
    """Complex and object arrays are refused, naming the dtype, the valid ones and a HINT."""
    world = distcomm.get_world_size()
    bad = [(lib, "complex64") for lib in libraries()]
    bad += [("numpy", "object")] if "numpy" in libraries() else []
    bad += [("torch", "complex128")] if "torch" in libraries() else []
    for lib, dtype in bad:
        x = make(lib, dtype, [1, 2])
        calls: list[tuple[Callable[..., Any], tuple[Any, ...]]] = [
            (distcomm.all_reduce, (x,)),
            (distcomm.broadcast, (x,)),
            (distcomm.reduce, (x,)),
            (distcomm.all_gather, ([make(lib, dtype, [1, 2]) for _ in range(world)], x)),
            (distcomm.all_gather_into_tensor, (make(lib, dtype, [0, 0] * world), x)),
        ]
        if comm().capabilities.p2p and world > 1:
            calls.append((distcomm.send, (x, 1)))
        for fn, args in calls:
            message = str(raises(InvalidArgumentError, fn, *args))
            expect(
                "unsupported dtype" in message
                and (repr(x.dtype) in message or str(x.dtype) in message)
                and "float32" in message
                and "HINT:" in message,
                f"{fn.__name__} of a {lib} {dtype} array: the message lacks the dtype, the valid "
                f"dtypes or a HINT: {message}",
            )
    expect(distcomm.all_reduce(1) == world, "the ranks are out of step after refused dtypes")


@check
def scatter_lists_of_the_wrong_length() -> None:
    """scatter / scatter_object on src with a list that is not one per rank raise, naming both
    lengths, before anything is sent (the other ranks are not left waiting)."""
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    if rank == 0:
        for lib, dtype in cases(lambda d: d == "float32"):
            t = make(lib, dtype, [1.0])
            for length in (world - 1, world + 1):
                parts = [make(lib, dtype, [1.0]) for _ in range(length)]
                message = str(raises(InvalidArgumentError, distcomm.scatter, t, parts, src=0))
                expect(
                    f"list of {world} tensors" in message
                    and f"got {length}" in message
                    and "HINT:" in message,
                    f"scatter with {length} tensors in a world of {world}: {message}",
                )
        for length in (world - 1, world + 1):
            message = str(raises(InvalidArgumentError, distcomm.scatter_object, [1] * length))
            expect(
                f"list of {world} objects" in message
                and f"got {length}" in message
                and "HINT:" in message,
                f"scatter_object of {length} objects in a world of {world}: {message}",
            )
    got = distcomm.scatter_object([f"r{r}" for r in range(world)] if rank == 0 else None)
    expect(got == f"r{rank}", f"scatter_object after refused lists gave {got!r} on rank {rank}")
