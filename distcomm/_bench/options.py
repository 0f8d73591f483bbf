"""The options of ``distcomm bench``: sizes (``8,64K,1M``, ``8:64M`` or ``8:64M:4``), ops, and
the device the buffers live on (the selected backend's own unless ``--device`` says)."""

from __future__ import annotations

import argparse
from collections.abc import Set

from distcomm._bench.operations import OPERATIONS
from distcomm._measures import parse_bytes
from distcomm.errors import InvalidArgumentError

__all__ = [
    "DEVICES",
    "DEFAULT_SIZES",
    "add_arguments",
    "choose_device",
    "parse_ops",
    "parse_size",
    "parse_sizes",
]

DEFAULT_SIZES = "8:64M:8"
#: Where bench can put its buffers, in order of preference when the backend moves several.
DEVICES = ("cpu", "cuda")


def parse_size(text: str) -> int:
    """``"64K"`` -> 65536 (binary units: K, M, G, with or without iB; B or nothing for bytes)."""
    size = parse_bytes(text)
    if size is None:
        raise argparse.ArgumentTypeError(
            f"size {text!r} is not a positive number of bytes; valid: 8, 512B, 64K, 64KiB, 1M, "
            "2G. HINT: --sizes 8,64K,1M lists sizes; --sizes 8:64M:4 steps by 4x."
        )
    return size


def parse_sizes(text: str) -> list[int]:
    """A comma list of sizes, or ``LOW:HIGH[:FACTOR]`` (FACTOR 2 by default; HIGH included)."""
    if ":" not in text:
        parts = [part for part in text.split(",") if part.strip()]
        return sorted({parse_size(part) for part in parts or [text]})
    parts = text.split(":")
    if len(parts) > 3:
        raise argparse.ArgumentTypeError(
            f"--sizes {text!r}: a range is LOW:HIGH or LOW:HIGH:FACTOR. HINT: e.g. 8:64M:4."
        )
    low, high = parse_size(parts[0]), parse_size(parts[1])
    factor = int(parts[2]) if len(parts) == 3 and parts[2].strip().isdigit() else 0
    if (len(parts) == 3 and factor < 2) or low > high:
        raise argparse.ArgumentTypeError(
            f"--sizes {text!r}: need LOW <= HIGH and an integer FACTOR >= 2. HINT: e.g. 8:64M:4."
        )
    sizes, size = [], low
    while size < high:
        sizes.append(size)
        size *= factor or 2
    return [*sizes, high]


def parse_ops(text: str) -> list[str]:
    """A comma list of operation names, or ``all`` (every one, in the table's order)."""
    if text.strip() == "all":
        return list(OPERATIONS)
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in OPERATIONS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"--ops {text!r}: unknown operation {', '.join(unknown) or '(none)'}; valid: "
            f"{', '.join(OPERATIONS)} or all. HINT: e.g. --ops all_reduce,all_gather_object."
        )
    return list(dict.fromkeys(names))


def choose_device(requested: str | None, devices: Set[str], backend: str) -> str:
    """The device of bench's buffers: ``requested`` (``--device``), else the first of
    :data:`DEVICES` that the backend moves natively (``devices``: its communicator's).

    Raises:
        InvalidArgumentError: the backend moves none of them, or not ``requested``.
    """
    valid = [device for device in DEVICES if device in devices]
    if requested is None and valid:
        return valid[0]
    if requested is not None and requested in valid:
        return requested
    moves = ", ".join(sorted(devices)) or "no"
    if not valid:
        raise InvalidArgumentError(
            f"distcomm bench: backend {backend!r} moves {moves} tensors, and bench puts its "
            f"buffers on {' or '.join(DEVICES)}. HINT: choose another backend with --backend."
        )
    other = "nccl" if requested == "cuda" else "gloo"
    raise InvalidArgumentError(
        f"--device {requested}: backend {backend!r} moves {moves} tensors only; valid here: "
        f"{', '.join(valid)}. HINT: drop --device (bench then uses {valid[0]}), or choose a "
        f"backend that moves {requested} tensors (e.g. --backend {other})."
    )


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer. HINT: e.g. 20.")
    return int(text)


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a count (0 or more). HINT: e.g. 5.")
    return int(text)


_OPS_HELP = (
    f"comma-separated operations, or all (default: all: {', '.join(OPERATIONS)}); barrier has "
    "no size (one row: time per barrier); sendrecv is a ping-pong between ranks 0 and 1 (2 "
    "ranks or more), timed per message: half a round trip"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``distcomm bench``'s options to ``parser``."""
    parser.add_argument(
        "--ops",
        type=parse_ops,
        default=list(OPERATIONS),
        metavar="OPS",
        help=_OPS_HELP,
    )
    parser.add_argument(
        "--sizes",
        type=parse_sizes,
        default=parse_sizes(DEFAULT_SIZES),
        metavar="SIZES",
        help=f"message sizes: 8,64K,1M, or LOW:HIGH[:FACTOR] (default: {DEFAULT_SIZES}, i.e. 8 B, "
        "64 B, ..., 16 MiB, 64 MiB)",
    )
    parser.add_argument(
        "--iters",
        type=_positive,
        default=None,
        metavar="N",
        help="timed calls per round (default: enough for about 20 ms, 3 to 1000)",
    )
    parser.add_argument(
        "--warmup", type=_count, default=5, metavar="N", help="untimed calls first (default: 5)"
    )
    parser.add_argument(
        "--rounds",
        type=_positive,
        default=5,
        metavar="N",
        help="timed rounds; the result is their median, with min-max (default: 5)",
    )
    parser.add_argument(
        "--compare",
        choices=["raw"],
        default=None,
        help="also time the engine's own call (torch.distributed, mpi4py) on the same buffers, "
        "interleaved round by round",
    )
    parser.add_argument("--backend", metavar="B", help="the backend (default: automatic choice)")
    parser.add_argument(
        "--device",
        choices=DEVICES,
        default=None,
        help="where the buffers live (cuda: torch tensors on this rank's GPU; default: what the "
        "backend moves: cuda on nccl, cpu on the others)",
    )
    parser.add_argument("--json", metavar="FILE", help="write every record to FILE (rank 0)")
    parser.add_argument(
        "--plot",
        metavar="FILE.png",
        help="draw time and bus bandwidth against size to FILE.png (needs matplotlib, in "
        "distcomm's bench extra)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress display")
