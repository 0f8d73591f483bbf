"""The files an MPICH job leaves behind when it is killed or aborted, and their removal.

MPICH unlinks its shared-memory files (``/dev/shm/mpich_shm_*``, one per node and job, 2-4 MB;
``mpich_vci_*`` too when it runs several VCIs) in ``MPI_Finalize`` only, and hydra's proxy removes
the topology file it gives the ranks of its node (``/tmp/hydra_hwloc_xmlfile_*``) only at a
normal end. A job ended by ``MPI_Abort``, or killed (mpirun killed with SIGKILL: its proxies
SIGKILL the ranks; the OOM killer; ``scancel``), would leave them all until the machine reboots,
so that a machine running many failing jobs fills ``/dev/shm``. So the backend's factory, once
every rank has mapped MPICH's files and read the topology (a barrier after ``MPI_Init``), runs
:func:`remove_leftovers`: the names go, the memory stays with the ranks' mappings (MPICH opens
them by name at init only), and a job killed any way leaves nothing. Files MPICH makes later are
removed before distcomm aborts a job: every rank runs :func:`remove_leftovers` again
(:func:`remove_at_abort` makes it one of its last words; the job's abort calls it too, just
before ``MPI_Abort``).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from distcomm.backend import add_last_words

__all__ = [
    "clean_abort",
    "mapped_mpich_files",
    "remove_at_abort",
    "remove_leftovers",
    "topology_file",
]

#: Where MPICH's shared-memory files live, and how their names start.
_SHM, _MPICH = "/dev/shm", "mpich_"
#: Hydra's proxy (one per node, the ranks' parent) and the name of its topology file.
_PROXY, _TOPOLOGY = "hydra_pmi_proxy", "hydra_hwloc_xmlfile_"
#: How far up the process tree the proxy is looked for (a rank may run under a shell).
_ANCESTORS = 4
_at_abort = False


def mapped_mpich_files(maps: str = "/proc/self/maps") -> list[str]:
    """The MPICH files in /dev/shm that this process maps and that still have a name.

    Args:
        maps: the memory map to read (``/proc/self/maps``: this process's).

    Returns:
        Their paths, each once, in the order of the map; none where the map cannot be read.
    """
    try:
        with open(maps, encoding="utf-8", errors="surrogateescape") as lines:
            fields = [line.rstrip("\n").split(maxsplit=5) for line in lines]
    except OSError:
        return []
    paths = (row[5] for row in fields if len(row) == 6 and not row[5].endswith(" (deleted)"))
    found = (p for p in paths if os.path.dirname(p) == _SHM)
    return list(dict.fromkeys(p for p in found if os.path.basename(p).startswith(_MPICH)))


def topology_file(pid: int | None = None) -> str | None:
    """The topology file of the hydra proxy that started process ``pid`` (default: this one).

    Returns:
        Its path, if that proxy holds it open; None under other launchers (srun), or where
        /proc cannot tell.
    """
    pid = os.getpid() if pid is None else pid
    with contextlib.suppress(OSError, ValueError, IndexError):
        for _ in range(_ANCESTORS):
            with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as stat:
                pid = int(stat.read().rpartition(")")[2].split()[1])  # the parent's
            if pid <= 1:
                return None
            if os.path.basename(os.readlink(f"/proc/{pid}/exe")) == _PROXY:
                return _open_topology_file(pid)
    return None


def _open_topology_file(proxy: int) -> str | None:
    """The topology file that process ``proxy`` holds open, if any."""
    for fd in os.listdir(f"/proc/{proxy}/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile
            path = os.readlink(f"/proc/{proxy}/fd/{fd}")
            name = os.path.basename(path)
            if name.startswith(_TOPOLOGY) and not name.endswith(" (deleted)"):
                return path
    return None


def remove_leftovers() -> None:
    """Unlink this job's MPICH files on this node (module docstring), ignoring every error."""
    for path in [*mapped_mpich_files(), topology_file()]:
        if path is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)


def remove_at_abort() -> None:
    """Make every rank remove its node's leftovers when the job is aborted, by this rank or
    another (:func:`distcomm.backend.add_last_words`); once per process."""
    global _at_abort
    if not _at_abort:
        _at_abort = True
        add_last_words(remove_leftovers)


def clean_abort(world: Any) -> None:
    """``world.Abort(1)`` (MPI_Abort: the job's abort), this node's leftovers removed just
    before, whichever path led here (the last words run only through ``abort_job``)."""
    remove_leftovers()
    world.Abort(1)
