"""A restarted job under torchrun: each attempt's keys in the agent's store apart from the last
attempt's, and a peer's address that refuses connections told as that, at once.

Under torchrun (>= 2.4) the agent serves one TCPStore for the whole job, and it keeps what the
workers of a failed attempt wrote there; Gloo's full-mesh connect waits for each peer's address
key and finds the dead peer's at once, then "Connection refused" (or a hang). Whole torchrun jobs:
tests/processes/test_torchrun.py."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch.distributed as dist
from distcomm_torch import rendezvous
from jobs import job_environment

from distcomm import BackendUnavailableError, LaunchInfo
from distcomm.backend import free_port

#: Gloo's error when a peer's published address refuses connections (torch 2.x, as users report
#: it; Gloo words it as a timeout although the refusal came at once).
GLOO_REFUSED = (
    "Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/pair.cc:144] timed "
    "out connecting: SO_ERROR: Connection refused, remote=[127.0.0.1]:56744, rank=0, size=2"
)


def test_a_refused_peer_address_is_told_as_that_not_as_a_rendezvous_timeout() -> None:
    launch = LaunchInfo("env", 1, 2, 1, 2, 0, 1, master_addr="127.0.0.1", master_port=29500)
    start = time.monotonic()
    error = rendezvous.failed("gloo", launch, None, 1800.0, RuntimeError(GLOO_REFUSED))
    assert time.monotonic() - start < 1.0, "nothing to wait for: the address refused"
    said = str(error)
    assert isinstance(error, BackendUnavailableError), said
    assert said.startswith("gloo: rank 1 could not connect to a peer at 127.0.0.1:56744 during"), (
        said
    )
    assert "an earlier attempt of this job (a restart) or of another job" in said
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in said and "1800" not in said
    assert error.reason == "a peer's address refuses connections: 127.0.0.1:56744"


@pytest.mark.parametrize("restart", [0, 1])
def test_under_the_agent_store_each_attempt_has_keys_of_its_own(restart: int) -> None:
    """The store handed to torch writes under distcomm/attempt-N/ (N: the restart count), so
    attempt 1 never reads attempt 0's keys; the agent's server is a real TCPStore here."""
    port = free_port()
    agent = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    agent.set("0//cpu//0/0", "attempt 0's address of rank 0")  # what a dead attempt left
    launch = LaunchInfo(
        "env",
        0,
        2,
        0,
        2,
        0,
        1,
        master_addr="127.0.0.1",
        master_port=port,
        agent_store=True,
        restart_count=restart,
    )
    store = rendezvous.open_store("gloo", launch, "127.0.0.1", port, 10.0)
    assert agent.check([f"distcomm/attempt-{restart}/distcomm/arrived/0"]), "arrival in its attempt"
    assert not store.check(["0//cpu//0/0"]), "an earlier attempt's key is seen"
    store.set("0//cpu//0/0", "this attempt's")
    assert bytes(agent.get("0//cpu//0/0")) == b"attempt 0's address of rank 0"
    assert bytes(agent.get(f"distcomm/attempt-{restart}/0//cpu//0/0")) == b"this attempt's"


#: One rank of a job whose rendezvous is an agent's store (as under torchrun): init (within
#: ``TIMEOUT`` s), a collective, finalize; rank 0 starts ``DELAY`` seconds late. Prints the
#: error of a failed init.
RANK = """
import os, sys, time
import distcomm
time.sleep(float(os.environ["DELAY"]) if os.environ["RANK"] == "0" else 0)
start = time.monotonic()
try:
    distcomm.init(backend="gloo", timeout=float(os.environ["TIMEOUT"]))
except distcomm.DistcommError as exc:
    print(f"{time.monotonic() - start:.1f} {type(exc).__name__}: {exc}", flush=True)
    sys.exit(3)
distcomm.all_reduce(1)
distcomm.finalize()
"""


#: How a rank of the second job may fail: at once, naming the dead address it was given, or, when
#: it waits in Gloo for a peer that never connects, at its timeout plus the overrun, saying so.
REFUSED = "BackendUnavailableError: gloo: rank {rank} could not connect to a peer at 127.0.0.1:"
OVERRUN = "[rank {rank}] distcomm: init of 2 ranks on the gloo rendezvous at 127.0.0.1:"


@pytest.mark.timeout(120)
def test_a_job_meeting_a_dead_jobs_addresses_ends_with_reasons_not_a_hang() -> None:
    """Two jobs, one after the other, in the same namespace of a store that outlives them (an
    agent's store, the same restart count): the second job's ranks may read the first job's
    addresses. Which rank connects and which one listens depends on the ports Gloo drew, so a
    run ends one of three ways, all within the timeout and a few seconds: both ranks meet (one
    of them was given the other's fresh address), or a rank fails at once naming the address
    that refused it (rather than at its timeout as "ranks that had not arrived: []"), or a rank
    that waits in Gloo for a peer that never connects (Gloo does not end that wait at its own
    timeout) ends itself shortly after its timeout, saying why, instead of hanging."""
    port = free_port()
    agent = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    environ = {
        **job_environment(),
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_RESTART_COUNT": "0",
    }

    def job(delay: float, timeout: float) -> list[subprocess.CompletedProcess[str]]:
        ranks = [
            subprocess.Popen(
                [sys.executable, "-c", RANK],
                env={
                    **environ,
                    **{"RANK": str(r), "LOCAL_RANK": str(r)},
                    **{"DELAY": str(delay), "TIMEOUT": str(timeout)},
                },
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for r in range(2)
        ]
        done = []
        for proc in ranks:
            out, err = proc.communicate(timeout=90)
            done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
        return done

    first = job(0.0, 60.0)
    assert [d.returncode for d in first] == [0, 0], [d.stderr[-2000:] for d in first]
    # Rank 0 starts after Gloo's connect retries (about 2 s) have given up on an old address.
    start = time.monotonic()
    second = job(8.0, 5.0)
    took_all = time.monotonic() - start
    assert took_all < 8.0 + 5.0 + 5.0 + 15.0, f"the second job ended after {took_all:.0f} s"
    codes = [d.returncode for d in second]
    assert codes in ([0, 0], [3, 3], [3, 1], [1, 3], [1, 1]), (codes, second)
    for rank, ended in enumerate(second):
        said = ended.stdout + ended.stderr[-2000:]
        if ended.returncode == 3:  # refused: at once, naming the address
            took, error = ended.stdout.split(" ", 1)
            assert float(took) < 5.0, f"rank {rank}'s init took {took} s to fail: {said}"
            assert error.startswith(REFUSED.format(rank=rank)), said
            assert "refuses connections" in error and "did not complete within" not in error
        elif ended.returncode == 1:  # waited for a peer in Gloo: ended past the timeout
            assert OVERRUN.format(rank=rank) in ended.stderr, said
            assert "did not complete within 5 s" in ended.stderr, said
            assert "rather than hang" in ended.stderr, said
    del agent
