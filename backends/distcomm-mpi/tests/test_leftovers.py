"""Which files a rank removes before distcomm aborts an MPICH job: only its own (the jobs
themselves are in test_mpi_mpirun.py)."""

from __future__ import annotations

from pathlib import Path

from distcomm_mpi.leftovers import mapped_mpich_files, topology_file

MAPS = """\
55d0c6a00000-55d0c6a01000 r--p 00000000 00:1f 4171 /usr/bin/python3.11
7f2a10000000-7f2a10205000 rw-s 00000000 00:1a 87 /dev/shm/mpich_shm_912f6b25_0
7f2a10400000-7f2a10605000 rw-s 00200000 00:1a 87 /dev/shm/mpich_shm_912f6b25_0
7f2a10800000-7f2a10801000 rw-s 00000000 00:1a 88 /dev/shm/mpich_vci_912f6b25_0
7f2a10900000-7f2a10901000 rw-s 00000000 00:1a 89 /dev/shm/mpich_shar_tmp4FHtHL (deleted)
7f2a10a00000-7f2a10a01000 rw-s 00000000 00:1a 90 /dev/shm/ucx_shm_posix_158f2a0d (deleted)
7f2a10b00000-7f2a10b01000 rw-s 00000000 00:1a 91 /dev/shm/distcomm-1234-0
7f2a10c00000-7f2a10c01000 rw-s 00000000 00:1a 92 /tmp/mpich_shm_elsewhere
7f2a10d00000-7f2a10d01000 rw-s 00000000 00:1a 93 /dev/shm/sub/mpich_shm_nested
7f2a10e00000-7f2a10e01000 rw-p 00000000 00:00 0
7ffd5a000000-7ffd5a021000 rw-p 00000000 00:00 0 [stack]
"""


def test_only_mpich_files_in_dev_shm_that_still_have_a_name(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text(MAPS)
    assert mapped_mpich_files(str(maps)) == [
        "/dev/shm/mpich_shm_912f6b25_0",
        "/dev/shm/mpich_vci_912f6b25_0",
    ]


def test_an_unreadable_map_names_nothing(tmp_path: Path) -> None:
    assert mapped_mpich_files(str(tmp_path / "missing")) == []


def test_a_process_not_started_by_hydra_has_no_topology_file() -> None:
    assert topology_file() is None  # pytest's own process: started by a shell, not mpirun
