"""distcomm's uneven all_to_all_single against torch.distributed's own, on the same inputs, in
3 gloo ranks: MoE-like routing (skewed splits, zero-row chunks, a chunk to itself), torch
tensors and numpy arrays, blocking and async."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

import distcomm
from distcomm.testing import WarmWorld


def routed(rank: int, world: int) -> tuple[list[int], list[int]]:
    """Rows rank ``rank`` sends each rank, and rows it receives from each (the transposed table
    of a skewed routing: rank r sends rank s (r * 2 + s * 3 + 1) % 5 rows)."""
    sent = [(rank * 2 + s * 3 + 1) % 5 for s in range(world)]
    received = [(s * 2 + rank * 3 + 1) % 5 for s in range(world)]
    return sent, received


def both_ways() -> dict[str, Any]:
    rank, world = distcomm.get_rank(), distcomm.get_world_size()
    sent, received = routed(rank, world)
    x = torch.arange(sum(sent) * 3, dtype=torch.float32).reshape(-1, 3) + 1000 * rank
    theirs = torch.empty(sum(received), 3)
    dist.all_to_all_single(theirs, x, received, sent)
    ours = torch.full((sum(received), 3), -1.0)
    distcomm.all_to_all_single(ours, x, received, sent)
    ours_async = torch.full((sum(received), 3), -1.0)
    work = distcomm.all_to_all_single(ours_async, x, received, sent, async_op=True)
    assert work is not None
    work.wait()
    as_numpy = np.full((sum(received), 3), -1, dtype=np.int64)
    distcomm.all_to_all_single(as_numpy, x.numpy().astype(np.int64), received, sent)
    return {
        "torch": theirs.tolist(),
        "distcomm": ours.tolist(),
        "async": ours_async.tolist(),
        "numpy": as_numpy.tolist(),
        "rows": received,
    }


def test_the_routing_has_empty_chunks_and_chunks_to_oneself() -> None:
    tables = [routed(r, 3)[0] for r in range(3)]
    assert any(0 in row for row in tables) and all(tables[r][r] for r in range(3)), tables


@pytest.mark.timeout(120)
def test_uneven_all_to_all_matches_torch_distributed(warm_world: Callable[..., WarmWorld]) -> None:
    for rank, seen in enumerate(warm_world(3).run(both_ways, timeout=100)):
        assert seen["distcomm"] == seen["torch"], rank
        assert seen["async"] == seen["torch"], rank
        assert seen["numpy"] == [[int(v) for v in row] for row in seen["torch"]], rank
        assert len(seen["torch"]) == sum(seen["rows"]), rank
