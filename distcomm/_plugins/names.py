"""The first-party backends: their names, distributions and places in the automatic order.

Only to say what to install ("gloo: not installed (pip install ./backends/distcomm-torch)") and
to spell a requested backend name one way everywhere.
"""

from __future__ import annotations

__all__ = [
    "FIRST_PARTY_BACKENDS",
    "FIRST_PARTY_PRIORITIES",
    "install_hint",
    "normalise_backend",
]

#: First-party backends and the distributions that provide them, to say what to install.
FIRST_PARTY_BACKENDS: dict[str, str] = {
    "nccl": "distcomm-torch",
    "gloo": "distcomm-torch",
    "mpi": "distcomm-mpi",
    "linklink": "distcomm-linklink",
}
#: Their places in the automatic order (docs/backends.md#priorities), shown even when not installed.
FIRST_PARTY_PRIORITIES: dict[str, int] = {"nccl": 300, "mpi": 200, "gloo": 100, "linklink": 0}


def install_hint(distribution: str) -> str:
    """Return how to install a first-party distribution from a distcomm checkout."""
    return f"pip install ./backends/{distribution}"


def normalise_backend(name: str) -> str:
    """The one spelling of a requested backend name: stripped and lower case."""
    return name.strip().lower()
