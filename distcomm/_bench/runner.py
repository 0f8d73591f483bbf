"""The timing loop of ``distcomm bench``: every rank runs the same plan in the same order.

After barriers that take the communicator past the mismatch check's first checked collectives,
for each (operation, size): ``--warmup`` calls of each side, then ``--rounds`` rounds in which
the sides take turns (distcomm and the engine's own call with ``--compare raw``; the one that
went first goes last in the next round), each side timing ``--iters`` calls after a barrier. A
round's time is the slowest rank's time per call; the record holds the median over rounds, with
min and max. Without ``--iters``, the warm-up's
slowest rank decides how many calls make about 20 ms (3 to 1000), the same number on every rank.
barrier has one record per run (size 0: it moves nothing; no bandwidth); sendrecv's calls are
round trips, reported per message (half a round trip); without 2 ranks, or on a backend without
point-to-point messages, it is left out with a note.

On CUDA buffers the clock is read once the device finished (``device_clock``): the engines return
when the work is queued, so a host clock alone would time the launches. Each timed block
synchronises after its barrier and after its last call, not per call (as nccl-tests).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from typing import Any

from distcomm import _device_clock as device_clock
from distcomm._bench.operations import OPERATIONS, Operation, prepare
from distcomm._bench.options import choose_device
from distcomm._bench.report import Progress, print_table, write_json
from distcomm._measures import busbw_factor, human_bytes

__all__ = ["run"]

_TARGET_SECONDS = 0.02


def run(args: argparse.Namespace) -> int:
    """Run the benchmark ``args`` asks for on this rank; rank 0 reports. Returns 0."""
    import distcomm

    if args.plot:  # before any communication: every rank fails alike, at once
        from distcomm._bench.plot import require_matplotlib

        require_matplotlib()
    if args.device == "cuda":
        _require_cuda()
    for option, path in (("--json", args.json), ("--plot", args.plot)):
        if path is not None:
            _check_writable(option, path)
    distcomm.init(backend=args.backend)
    try:
        comm: Any = distcomm.get_communicator()  # BaseCommunicator: devices, _native_call
        args.device = choose_device(args.device, comm.devices, comm.backend)
        records, unmatched = _measure(comm, args)
        if comm.rank == 0:
            node_memory = comm.node_memory and args.device == "cpu"
            print_table(records, unmatched, node_memory)
            header = _header(comm, args)
            header["node_memory"] = node_memory
            if args.compare == "raw":
                header["no_raw_call"] = unmatched
            if args.json:
                write_json(args.json, header, records)
            if args.plot:
                from distcomm._bench.plot import plot

                plot(args.plot, header, records)
    finally:
        distcomm.finalize()
    return 0


def _check_writable(option: str, path: str) -> None:
    """Fail before the run, not after it, when rank 0 could not write ``path``."""
    import os

    from distcomm.errors import DistcommError

    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise DistcommError(
            f"{option} {path!r}: the folder {folder!r} does not exist or is not writable. "
            "HINT: create it first, or give a path in a writable folder."
        )


def _require_cuda() -> None:
    import importlib.util

    from distcomm.errors import DistcommError

    if importlib.util.find_spec("torch") is None:
        reason = "torch is not installed"
    else:
        import torch

        if torch.cuda.is_available():
            return
        reason = "torch sees no GPU"
    raise DistcommError(
        f"--device cuda: no CUDA device is usable here ({reason}). HINT: run on a GPU node with "
        "a CUDA build of torch, or drop --device cuda to measure CPU buffers."
    )


def _header(comm: Any, args: argparse.Namespace) -> dict[str, Any]:
    from distcomm import __version__

    return {
        "distcomm": __version__,
        "backend": comm.backend,
        "world_size": comm.world_size,
        "launcher": comm.launch.method,
        "device": args.device,
        "rounds": args.rounds,
        "warmup": args.warmup,
    }


def _plan(comm: Any, args: argparse.Namespace) -> tuple[list[tuple[Operation, int]], list[str]]:
    """(operation, size) in the order asked, and why ops were left out: barrier once (size 0: it
    moves nothing), sendrecv only with 2 ranks or more and point-to-point messages, the others
    at every size."""
    plan: list[tuple[Operation, int]] = []
    skipped: list[str] = []
    for name in args.ops:
        op = OPERATIONS[name]
        if op.pairwise and (comm.world_size < 2 or not comm.capabilities.p2p):
            why = "a world of 1" if comm.world_size < 2 else f"{comm.backend} has no send/recv"
            skipped.append(f"{name} skipped: a ping-pong between ranks 0 and 1; here {why}")
            continue
        plan += [(op, size) for size in (args.sizes if op.sized else [0])]
    return plan, skipped


def _measure(comm: Any, args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[str]]:
    """The records, and the ops that ``--compare raw`` found no engine call for."""
    plan, skipped = _plan(comm, args)
    _past_the_first_checks(comm)
    progress = Progress(len(plan), enabled=comm.rank == 0 and not args.quiet)
    records: list[dict[str, Any]] = []
    unmatched: list[str] = []
    for line in skipped:
        progress.note(line)
    for op, size in plan:
        progress.start(f"{op.name} {human_bytes(size)}" if op.sized else op.name)
        prepared = prepare(comm, op, size, args.device)
        sides: dict[str, Callable[[], object]] = {"distcomm": prepared.call}
        raw = None  # the engine's own call, where it has the operation (distcomm emulates)
        if args.compare == "raw" and op.capability in comm.capabilities.ops:
            raw = comm._native_call(op.name, prepared.args)
        if raw is not None:
            sides["raw"] = raw
        elif args.compare == "raw" and op.name not in unmatched:
            unmatched.append(op.name)
            progress.note(f"{op.name}: raw: n/a (the {comm.backend} engine has no own call)")
        iters, times = _time(comm, sides, args, prepared.device)
        for engine, rounds in times.items():
            per_unit = [seconds / prepared.units for seconds in rounds]
            records.append(_record(comm, op, size, prepared.nbytes, engine, iters, per_unit))
            if engine == "raw":
                ratios = [r / d for r, d in zip(rounds, times["distcomm"], strict=True)]
                records[-1]["raw_over_distcomm"] = statistics.median(ratios)
        progress.done(records[-len(times) :])
    progress.close()
    return records, unmatched


def _past_the_first_checks(comm: Any) -> None:
    """Barriers until the mismatch check's first checked collectives are behind (the default
    checks the first 64 of a communicator): every op is then timed as a long job runs it."""
    from distcomm.backend._pipeline.mismatch_check import SAMPLED_FIRST

    while getattr(comm, "seq", SAMPLED_FIRST) < SAMPLED_FIRST:
        comm.barrier()


def _record(
    comm: Any, op: Operation, size: int, nbytes: int, engine: str, iters: int, rounds: list[float]
) -> dict[str, Any]:
    """One (op, size, engine) record; barrier's bandwidths are None (it moves no data)."""
    seconds = statistics.median(rounds)
    algbw = nbytes / seconds / 1e9 if op.sized else None
    factor = busbw_factor(op.name, comm.world_size) if op.sized else None
    return {
        "op": op.name,
        "size": size,
        "bytes": nbytes,
        "engine": engine,
        "backend": comm.backend,
        "world_size": comm.world_size,
        "iters": iters,
        "time_s": seconds,
        "time_min_s": min(rounds),
        "time_max_s": max(rounds),
        "algbw_GBps": algbw,
        "busbw_factor": factor,
        "busbw_GBps": None if algbw is None or factor is None else algbw * factor,
    }


def _time(
    comm: Any, sides: dict[str, Callable[[], object]], args: argparse.Namespace, device: str
) -> tuple[int, dict[str, list[float]]]:
    """(calls per round, each side's per-call seconds per round, the slowest rank's), on
    buffers on ``device``."""
    warm = {
        name: _block(comm, fn, args.warmup, device) for name, fn in sides.items() if args.warmup
    }
    iters = args.iters
    if iters is None:
        slowest = comm.all_reduce(max(warm.values(), default=0.0), op="max")
        iters = max(3, min(1000, int(_TARGET_SECONDS / slowest) if slowest > 0 else 1000))
    mine: dict[str, list[float]] = {name: [] for name in sides}
    order = list(sides.items())
    for _ in range(args.rounds):
        for name, fn in order:
            mine[name].append(_block(comm, fn, iters, device))
        order.reverse()  # each side runs first in every other round: no side has the warm cache
    every = comm.all_gather_object(mine)
    return iters, {
        name: [max(rank[name][i] for rank in every) for i in range(args.rounds)] for name in sides
    }


def _block(comm: Any, fn: Callable[[], object], calls: int, device: str) -> float:
    """Seconds per call of ``calls`` calls of ``fn``, started together after a barrier; on a
    CUDA ``device``, from an idle device to the end of the last call's work."""
    comm.barrier()
    start = device_clock.now(device)
    for _ in range(calls):
        fn()
    return (device_clock.now(device) - start) / calls
