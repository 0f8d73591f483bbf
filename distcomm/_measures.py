"""What ``distcomm bench`` and the communication summary (``distcomm.profile``) both report:
message sizes for people, and nccl-tests' bus bandwidth factors; sizes as people write them
(``64K``, ``8GiB``: bench's ``--sizes``, ``DISTCOMM_MAX_OBJECT_BYTES``)."""

from __future__ import annotations

import re

from distcomm._operations import OPERATIONS

__all__ = ["busbw_factor", "human_bytes", "parse_bytes"]

_SIZE = re.compile(r"^\s*(\d+)\s*([A-Za-z]*)\s*$")
#: Binary units, with or without ``iB``; ``B`` or nothing for bytes.
_UNITS = {"": 1, "B": 1} | {
    f"{unit}{suffix}": 2 ** (10 * power)
    for power, unit in enumerate("KMGT", 1)
    for suffix in ("", "IB")
}

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


def parse_bytes(text: str) -> int | None:
    """``"64K"`` -> 65536 (binary units K, M, G, T, with or without ``iB``; ``B`` or nothing
    for bytes); None for anything that is not a positive number of bytes."""
    match = _SIZE.match(text)
    unit = match.group(2).upper() if match else ""
    if not match or unit not in _UNITS or int(match.group(1)) < 1:
        return None
    return int(match.group(1)) * _UNITS[unit]
