"""What ``distcomm bench`` and the communication summary (``distcomm.profile``) both report:
message sizes for people, and nccl-tests' bus bandwidth factors."""

from __future__ import annotations

from distcomm._operations import OPERATIONS

__all__ = ["busbw_factor", "human_bytes"]

#: Operations (distcomm's names, and distcomm bench's) whose bus bandwidth is algbw x (n-1)/n.
_SHARED = frozenset(name for op in OPERATIONS if op.shared for name in (op.name, op.bench) if name)


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests' bus bandwidth factor of ``op`` for ``n`` ranks: 2(n-1)/n for all_reduce,
    (n-1)/n for the gathers, scatters and all-to-all, 1 for the others (broadcast, reduce)."""
    if op == "all_reduce":
        return 2 * (n - 1) / n
    return (n - 1) / n if op in _SHARED else 1.0


def human_bytes(size: int) -> str:
    """``65536`` -> ``"64 KiB"``; sizes that are no whole number of a unit stay in bytes."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"
