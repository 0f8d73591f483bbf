"""gloo when things go wrong: a rank that skips a collective, a rank that dies with no launcher
to stop the others, the abort policy, and a rendezvous that cannot complete.

Each one ends within the timeout with a distcomm error naming the operation, its sequence
number and the ranks that had not arrived (read from the rendezvous store), never with torch's
own RuntimeError and never with a hang.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch.distributed as dist
from skipped_ranks import skipped_barrier, skipped_group_barrier

import distcomm
from distcomm.backend import free_port
from distcomm.testing import WarmWorld, spawn

TIMEOUT = 3
DYING = Path(__file__).resolve().parents[3] / "tests" / "support" / "dying_rank.py"


@pytest.mark.timeout(120)
def test_a_skipped_barrier_names_the_op_its_seq_and_the_missing_rank(
    monkeypatch: pytest.MonkeyPatch, warm_world: Callable[..., WarmWorld]
) -> None:
    monkeypatch.setenv("DISTCOMM_TIMEOUT", str(TIMEOUT))
    results = warm_world(3).run(skipped_barrier, timeout=60)
    assert results[1][0] == "slept"
    for rank in (0, 2):
        kind, op, seq, missing, message, elapsed = results[rank]
        assert (kind, op, seq, missing) == ("DistTimeoutError", "barrier", 2, (1,)), message
        assert "barrier (operation #2) on gloo 'world' (3 ranks)" in message
        assert "ranks that had not arrived: [1] (rank 1 is at operation #1)" in message
        # the timeout, then a few monitor ticks to read the ranks' progress and ask where
        # rank 1 is (it may have left by then: no answer)
        assert elapsed < TIMEOUT + 4, f"rank {rank} waited {elapsed:.1f} s"


@pytest.mark.timeout(120)
def test_a_skipped_group_barrier_names_the_missing_rank_of_the_group(
    monkeypatch: pytest.MonkeyPatch, warm_world: Callable[..., WarmWorld]
) -> None:
    monkeypatch.setenv("DISTCOMM_TIMEOUT", "2")
    results = warm_world(3).run(skipped_group_barrier, timeout=60)
    assert results[0] == ("DistTimeoutError", "barrier", 1, (1,))


@pytest.mark.timeout(120)
def test_the_abort_policy_ends_every_waiting_rank_with_the_diagnostic(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DISTCOMM_TIMEOUT", str(TIMEOUT))
    monkeypatch.setenv("DISTCOMM_ON_TIMEOUT", "abort")
    with pytest.raises(distcomm.RankFailedError, match="exited with code 1"):
        spawn(skipped_barrier, 3, backend="gloo", timeout=60)
    err = capfd.readouterr().err
    assert re.search(
        r"barrier \(operation #2\) on gloo 'world' \(3 ranks\) did not complete within \d", err
    )
    assert "ranks that had not arrived: [1]" in err and "(DISTCOMM_ON_TIMEOUT=abort)" in err


@pytest.mark.timeout(120)
def test_a_rank_that_dies_without_a_launcher_to_stop_the_job(tmp_path: Path) -> None:
    """Three processes started by hand (what plain srun or a hand-made launcher does): when
    rank 2 raises, ranks 0 and 1 fail at once with a distcomm error saying a peer went away."""
    port = free_port()
    procs = []
    for rank in range(3):
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("DISTCOMM_")},
            "RANK": str(rank),
            "WORLD_SIZE": "3",
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": "3",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "DISTCOMM_TIMEOUT": "20",
        }
        command = [sys.executable, str(DYING), str(tmp_path), "gloo", "2"]
        procs.append(
            subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
        )
    try:
        outputs = [proc.communicate(timeout=90)[1].decode() for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    assert procs[2].returncode == 1 and "ValueError: rank 2 breaks on purpose" in outputs[2]
    for rank in (0, 1):
        assert procs[rank].returncode == 0, outputs[rank]
        report = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        assert report["error"] in ("EngineError", "DistTimeoutError"), report
        assert "all_reduce (operation #2) on gloo 'world' (3 ranks)" in report["message"]
        if report["error"] == "EngineError":
            assert "a peer went away" in report["message"]
        assert report["missing"] == [2], report["message"]
        assert report["seconds"] < 20, "it waited for the timeout: nothing noticed the death"


@pytest.mark.timeout(60)
def test_an_unreachable_master_ends_init_within_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _launch(monkeypatch, rank=1, port=free_port())  # nobody serves that port
    start = time.monotonic()
    with pytest.raises(distcomm.DistTimeoutError) as info:
        distcomm.init(backend="gloo", timeout=TIMEOUT)
    assert time.monotonic() - start < 2 * TIMEOUT
    assert info.value.missing_ranks == (0,) and info.value.op == "init"
    message = str(info.value)
    assert "could not reach the gloo rendezvous at 127.0.0.1:" in message
    assert "within 3 s" in message and "ranks that had not arrived: [0]" in message
    assert "HINT:" in message
    assert not dist.is_initialized()


@pytest.mark.timeout(60)
def test_a_master_address_that_does_not_resolve(monkeypatch: pytest.MonkeyPatch) -> None:
    _launch(monkeypatch, rank=1, port=free_port())
    monkeypatch.setenv("MASTER_ADDR", "no-such-host.invalid")
    start = time.monotonic()
    with pytest.raises(distcomm.BackendUnavailableError) as info:
        distcomm.init(backend="gloo", timeout=20)
    assert time.monotonic() - start < 20, "a name that does not resolve fails at once"
    message = str(info.value)
    assert "gloo: MASTER_ADDR='no-such-host.invalid' does not resolve" in message
    assert "HINT: set it to rank 0's host name or address" in message


@pytest.mark.timeout(60)
def test_a_rank_that_never_starts_is_named_by_init(monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    _launch(monkeypatch, rank=0, port=port)  # rank 1 never comes
    start = time.monotonic()
    with pytest.raises(distcomm.DistTimeoutError) as info:
        distcomm.init(backend="gloo", timeout=TIMEOUT)
    assert time.monotonic() - start < 2 * TIMEOUT
    assert info.value.missing_ranks == (1,)
    message = str(info.value)
    assert "init (rendezvous) of 2 ranks on the gloo rendezvous at 127.0.0.1:" in message
    assert "ranks that had not arrived: [1] (they never reached the rendezvous)" in message
    assert not dist.is_initialized()
    with socket.socket() as sock:  # the failed rendezvous let go of its port
        sock.bind(("127.0.0.1", port))


def _launch(monkeypatch: pytest.MonkeyPatch, *, rank: int, port: int) -> None:
    for name, value in {
        "RANK": rank,
        "WORLD_SIZE": 2,
        "LOCAL_RANK": rank,
        "LOCAL_WORLD_SIZE": 2,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": port,
    }.items():
        monkeypatch.setenv(name, str(value))
