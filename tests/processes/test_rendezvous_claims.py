"""A job accepts only its own ranks, and a single-node job opens nothing beyond the machine.

Two jobs of 2 ranks each meet at one fixed MASTER_PORT on gloo (the scenario of a shared script):
job A forms its world first, then job B starts. B's rank 0 cannot serve the port; B's rank 1
reaches A's store and must fail at once, naming the port (and both job ids where the launch
gives ids), never joining A. A completes with its own result. And during a ``distcomm run -n 2
--backend gloo`` job, every listening socket of every rank is on a loopback address (read from
/proc/net/tcp and tcp6, for the sockets of the rank's own descriptors).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from jobs import job_environment, run_job

from distcomm.backend import free_port

JOB = """
import sys, time
from pathlib import Path
import numpy as np
import distcomm

flags, value = Path(sys.argv[1]), float(sys.argv[2])
comm = distcomm.init(backend="gloo")
(flags / f"ready-{comm.rank}").touch()
deadline = time.monotonic() + 60
while not (flags / "go").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
print(f"rank {comm.rank}: {distcomm.all_reduce(value)}", flush=True)
distcomm.finalize()
"""


def start(script: Path, flags: Path, value: float, port: int, job: str | None) -> list[Any]:
    procs = []
    for rank in range(2):
        env = {**job_environment(), "RANK": str(rank), "WORLD_SIZE": "2"}
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), DISTCOMM_TIMEOUT="30")
        if job is not None:
            env["DISTCOMM_RUN_ID"] = job
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script), str(flags), str(value)],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    return procs


@pytest.mark.timeout(120)
@pytest.mark.parametrize("ids", [False, True], ids=["no-job-ids", "job-ids"])
def test_a_second_job_on_the_same_port_fails_and_the_first_completes(
    tmp_path: Path, ids: bool
) -> None:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    port = free_port()
    flags_a, flags_b = tmp_path / "a", tmp_path / "b"
    flags_a.mkdir()
    flags_b.mkdir()
    job_a = start(script, flags_a, 1.0, port, "job-a" if ids else None)
    try:
        deadline = time.monotonic() + 60
        while len(list(flags_a.glob("ready-*"))) < 2:
            assert time.monotonic() < deadline, "job A did not form its world"
            assert all(p.poll() is None for p in job_a), "job A died"
            time.sleep(0.05)
        began = time.monotonic()
        job_b = start(script, flags_b, 100.0, port, "job-b" if ids else None)
        outputs_b = [p.communicate(timeout=60) for p in job_b]
        took = time.monotonic() - began
        (flags_a / "go").touch()
        outputs_a = [p.communicate(timeout=60) for p in job_a]
    finally:
        for proc in job_a:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    where = f"127.0.0.1:{port}"
    assert [p.returncode for p in job_b] == [1, 1], outputs_b
    assert took < 20, f"job B took {took:.1f} s to fail"
    assert not list(flags_b.glob("ready-*")), "a rank of job B formed a world"
    assert f"could not serve the rendezvous at {where}" in outputs_b[0][1], outputs_b[0][1]
    if ids:
        said = f"rank 1 of job 'job-b' reached the rendezvous of job 'job-a' at {where}"
    else:
        said = f"two processes claim rank 1 at {where}: another job is using this rendezvous"
    assert said in outputs_b[1][1], outputs_b[1][1]
    assert "HINT" in outputs_b[1][1]
    assert [p.returncode for p in job_a] == [0, 0], outputs_a
    assert [out for out, _ in outputs_a] == ["rank 0: 2.0\n", "rank 1: 2.0\n"]


LISTENING = """
import os
import numpy as np
import distcomm


def listening():
    \"\"\"The local addresses (hex, as /proc/net/tcp* has them) of this process's listening
    TCP sockets.\"\"\"
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            mine.add(link[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in mine:  # 0A: LISTEN
                found.append(fields[1].split(":")[0])
    return found


distcomm.init()
distcomm.all_reduce(np.ones(2))
print(distcomm.get_rank(), *listening(), flush=True)
distcomm.barrier()
distcomm.finalize()
"""
#: 127.0.0.1, ::1 and ::ffff:127.0.0.1 as /proc/net/tcp and tcp6 write them.
LOOPBACK = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}


@pytest.mark.timeout(120)
def test_a_single_node_job_listens_on_loopback_only(tmp_path: Path) -> None:
    script = tmp_path / "listening.py"
    script.write_text(LISTENING)
    command = [sys.executable, "-m", "distcomm", "run", "-n", "2", "--backend", "gloo"]
    done = run_job([*command, str(script)], cwd=tmp_path, timeout=100)
    assert done.returncode == 0, done.stderr
    seen = {}
    for line in done.stdout.splitlines():
        rank, *addresses = line.split()[2:]  # after "[rank N]"
        seen[int(rank)] = addresses
    assert sorted(seen) == [0, 1], done.stdout
    assert seen[0], "rank 0 serves the store: it listens"
    for rank, addresses in seen.items():
        assert set(addresses) <= LOOPBACK, f"rank {rank} listens beyond loopback: {addresses}"
