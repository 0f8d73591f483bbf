"""torch's groups over distcomm (``DISTCOMM_TORCH_GROUP=distcomm``), under any launcher and
backend: the body of every rank in tests/test_torch_under.py.

    python torch_under.py OUT_DIR

The program is a torch script that calls ``distcomm.init()`` (the setting, from the test, asks for
torch's default group over distcomm), then:
- five DDP steps on different data per rank, the parameters compared (1e-5) with one model
  trained in-process on every rank's batch, distcomm's hooks counting DDP's all-reduces;
- whether the engine's Work has a future of its own, and the kind of torch Work an all-reduce
  then gets (started, completing with that future, where it has);
- a size mismatch through ``torch.distributed.all_reduce``: distcomm's CollectiveMismatchError;
- rank 1 missing from an all-reduce (asleep in Python): the others' DistTimeoutError names it
  (an engine that cannot give up a blocking call, ``capabilities.cancellable`` False, ends the
  job with the same diagnostic instead).
Each rank writes ``OUT_DIR/rank-<rank>.json`` with what it saw before the missing rank, then
``OUT_DIR/missing-<rank>.txt``, then ends at once (a rank whose communicator timed out cannot
finalize it).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import distcomm

LATE = 1  # the rank missing from the last all-reduce


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def _batch(rank: int, step: int) -> torch.Tensor:
    return torch.randn(8, 16, generator=torch.Generator().manual_seed(100 * rank + step))


def ddp(rank: int, world: int) -> dict[str, Any]:
    model, reference = _model(), _model()
    reduced: list[int] = []
    record = lambda e: reduced.append(e.numel) if e.op == "all_reduce" else None  # noqa: E731
    with distcomm.add_hook(before=record):
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for step in range(5):
            optimizer.zero_grad()
            ddp(_batch(rank, step)).pow(2).mean().backward()
            optimizer.step()
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(5):
        ref_optimizer.zero_grad()
        loss = sum(reference(_batch(r, step)).pow(2).mean() for r in range(world))
        (loss / world).backward()  # type: ignore[operator]
        ref_optimizer.step()
    worst = max(
        float((a.detach() - b.detach()).abs().max())
        for a, b in zip(model.parameters(), reference.parameters(), strict=True)
    )
    params = sum(p.numel() for p in model.parameters())
    return {"worst": worst, "hooked": sum(reduced), "expected": 5 * params}


def mismatch(rank: int) -> str:
    try:
        dist.all_reduce(torch.ones(3 + rank))  # MISMATCH: the line the error names
    except distcomm.CollectiveMismatchError as exc:
        return f"CollectiveMismatchError: {exc}"
    except Exception as exc:  # anything else is what the test reports
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def missing(rank: int, world: int, out: Path) -> str:
    if rank == LATE:  # asleep in Python until every other rank has given up waiting for it
        while len(list(out.glob("gave-up-*"))) < world - 1:
            time.sleep(0.05)
        return "slept"
    try:
        dist.all_reduce(torch.ones(2))
    except distcomm.DistTimeoutError as exc:
        return f"DistTimeoutError: {exc}"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        (out / f"gave-up-{rank}").touch()
    return "no error"


def main() -> None:
    out = Path(sys.argv[1])
    comm = distcomm.init(timeout=float(os.environ.get("TORCH_UNDER_TIMEOUT", "30")))
    rank, world = comm.rank, comm.world_size
    seen: dict[str, Any] = {
        "backend": comm.backend,
        "torch_backend": dist.get_backend(),
        "over": getattr(dist.group.WORLD, "comm", None) is comm,
    }
    seen["ddp"] = ddp(rank, world)
    offered = comm.all_reduce(torch.ones(2), async_op=True)
    seen["engine_future"] = offered.engine_future() is not None
    offered.wait()
    seen["torch_work"] = type(dist.group.WORLD.allreduce([torch.ones(2)])).__name__
    seen["mismatch"] = mismatch(rank)
    seen["cancellable"] = comm.capabilities.cancellable
    (out / f"rank-{rank}.json").write_text(json.dumps(seen))
    (out / f"missing-{rank}.txt").write_text(missing(rank, world, out))
    sys.stdout.flush()
    os._exit(0)  # the communicator timed out on some ranks: nothing to finalize


if __name__ == "__main__":
    main()
