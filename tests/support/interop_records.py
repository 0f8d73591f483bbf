"""What every rank of tests/support/interop_clients.py must have seen, under any launcher."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def check_interop(directory: Path, size: int, backend: str, torch_backend: str = "gloo") -> None:
    """Each rank's report in ``directory``: the backend, torch's default group (of
    ``torch_backend``, as Ignite sees it), and every client's results (DDP and FSDP: the same
    weights everywhere after a step; Accelerate and Ignite: the world and their collectives)."""
    reports = sorted(directory.glob("rank-*.json"))
    assert len(reports) == size, f"{len(reports)} of {size} ranks reported"
    for rank in range(size):
        seen: dict[str, Any] = json.loads((directory / f"rank-{rank}.json").read_text())
        errors = {k: v for k, v in seen.items() if isinstance(v, str) and v.startswith("error")}
        assert not errors, f"rank {rank}: {errors}"
        assert (seen["backend"], seen["torch_group"]) == (backend, True), seen
        assert seen["ddp"] == {"same_weights": True, "stepped": True}, seen["ddp"]
        assert seen["fsdp"] == {"same_weights": True}, seen["fsdp"]
        assert seen["accelerate"] == {
            "num_processes": size,
            "process_index": rank,
            "gather": [float(r) for r in range(size)],
            "gather_object": [f"rank {r}" for r in range(size)],
        }
        assert seen["ignite"] == {
            "backend": torch_backend,
            "world_size": size,
            "rank": rank,
            "all_reduce": [float(size)],
            "all_gather": [float(r) for r in range(size)],
        }
