"""The first-party backends: their names, distributions and places in the automatic order.

Only to say what to install, for how distcomm was installed (:func:`install_hint`: "gloo: not
installed (pip install 'distcomm[torch]')", or from a checkout "(pip install
./backends/distcomm-torch)"), and to spell a requested backend name one way everywhere.
:func:`backend_hint` is the one hint for a first-party backend, wherever it is missing: its
distribution, and what pip cannot install (SenseTime's linklink library).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = [
    "EXTRAS",
    "FIRST_PARTY_BACKENDS",
    "FIRST_PARTY_PRIORITIES",
    "LIBRARIES",
    "backend_hint",
    "extra_hint",
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


#: distcomm's extra that installs each first-party distribution (pyproject.toml).
EXTRAS: dict[str, str] = {
    "distcomm-torch": "torch",
    "distcomm-mpi": "mpi",
    "distcomm-linklink": "linklink",
}


#: What a first-party backend needs besides its distribution, that pip cannot install, and how
#: to do without it.
LIBRARIES: dict[str, str] = {
    "linklink": "SenseTime's linklink library, which is not on PyPI (your cluster's build: "
    "`import linklink` or `import spring.linklink` must work); without them, run linklink code "
    "unchanged on gloo, nccl or mpi with distcomm.compat.linklink (docs/compat.md)",
}


def backend_hint(name: str) -> str:
    """The one hint for first-party backend ``name``, said alike wherever it cannot run (not
    installed; installed, but its library is missing): ``the linklink backend needs
    distcomm-linklink (pip install ...) and SenseTime's linklink library, ...``; for a backend
    that pip installs whole, :func:`install_hint`."""
    distribution = FIRST_PARTY_BACKENDS[name]
    install = install_hint(distribution)
    if name not in LIBRARIES:
        return install
    return f"the {name} backend needs {distribution} ({install}) and {LIBRARIES[name]}"


def install_hint(distribution: str) -> str:
    """How to install a first-party distribution, for how distcomm was installed: from a
    checkout (distcomm imported from a source tree that holds ``backends/``), the path to its
    folder; from wheels or an index, distcomm's extra (``pip install 'distcomm[torch]'``)."""
    root = checkout()
    if root is not None:
        return f"pip install {_shown(root / 'backends' / distribution)}"
    extra = EXTRAS.get(distribution)
    return f"pip install 'distcomm[{extra}]'" if extra else f"pip install {distribution}"


def extra_hint(extra: str) -> str:
    """How to install one of distcomm's extras (``bench``), for how distcomm was installed."""
    root = checkout()
    if root is not None:
        return f"pip install '{_shown(root)}[{extra}]'"
    return f"pip install 'distcomm[{extra}]'"


def checkout() -> Path | None:
    """The source tree distcomm is imported from (an editable install, or run from it), or
    None when it was installed from a wheel or an sdist."""
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file() and (root / "backends").is_dir():
        return root
    return None


def _shown(path: Path) -> str:
    """``path`` as the user types it: relative to the working directory when inside it."""
    try:
        relative = path.relative_to(Path(os.getcwd()).resolve())
    except (ValueError, OSError):
        return str(path)
    return "." if not relative.parts else f"./{relative}"


def normalise_backend(name: str) -> str:
    """The one spelling of a requested backend name: stripped and lower case."""
    return name.strip().lower()
