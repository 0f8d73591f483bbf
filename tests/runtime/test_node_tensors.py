"""CPU tensor collectives through node memory (distcomm.backend._pipeline.node_collectives).

- Real processes of one node (warm gloo worlds of 2 and 4 ranks, started with multiprocessing's
  spawn): every served op, dtype, size (none, one, odd, more than a slot) and reduce op moves
  through node memory and equals what the engine gives (a group made with node memory off);
  planned calls reach node memory's plan; two groups at once each use their own segment.
- Ranks that disagree: a mismatch the transport sees raises CollectiveMismatchError naming each
  rank's call on every rank, with the mismatch check off.
- A slow rank: the others raise DistTimeoutError naming it after the group's timeout, not before.
- A rank killed with SIGKILL mid-collective, under ``distcomm run`` and under torchrun: the others
  raise DistTimeoutError naming it within a second, and nothing of the job is left in /dev/shm or
  /tmp.
- Where it is not used: thread-ranks (one process), ``DISTCOMM_NODE_MEMORY=off``; ``require``
  where it cannot be used raises with a HINT.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import node_tensor_ranks as ranks
import pytest
import torch
from jobs import dev_shm_names, run_job

import distcomm
from distcomm.errors import NotSupportedError
from distcomm.testing import WarmWorld, run_threads

PROGRAM = ranks.__file__


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nprocs", [2, 4])
def test_every_call_moves_through_node_memory_and_equals_the_engine(
    warm_world: Callable[..., WarmWorld], nprocs: int
) -> None:
    moved = warm_world(nprocs).run(ranks.every_call, timeout=280)
    assert moved[0] > 300 and len(set(moved)) == 1, f"calls through node memory: {moved}"


@pytest.mark.timeout(120)
def test_planned_calls_reach_node_memory(warm_world: Callable[..., WarmWorld]) -> None:
    counts = warm_world(2).run(ranks.planned_calls, timeout=100)
    # 30 calls a round, and the mismatch check's check points (through node memory too)
    assert all(30 <= count < 70 for count in counts[0] + counts[1]), counts


@pytest.mark.timeout(120)
def test_ranks_that_disagree_raise_a_mismatch_naming_each_call(
    warm_world: Callable[..., WarmWorld],
) -> None:
    said = warm_world(2).run(ranks.mismatched, timeout=100)
    for text in said:
        assert "the ranks called different collectives" in text, text
        assert "rank 0: all_reduce SUM float32, 4000 bytes" in text, text
        assert "rank 1: broadcast root 0 float32, 4000 bytes" in text, text
        assert "HINT:" in text


@pytest.mark.timeout(120)
def test_a_slow_rank_is_named_after_the_timeout(warm_world: Callable[..., WarmWorld]) -> None:
    said = warm_world(2).run(ranks.slow_rank, 2.0, timeout=100)
    waited, missing, message = said[0].split(" ", 2)
    # the timeout, then the ranks asked out of band where they are (the stacks shown)
    assert 1.9 < float(waited) < 6.0, f"rank 0 waited {waited} s for a 2 s timeout"
    assert missing == "[1]" and "did not complete within 2" in message, said[0]


@pytest.mark.timeout(120)
def test_two_groups_at_once_each_through_their_own_segment(
    warm_world: Callable[..., WarmWorld],
) -> None:
    got = warm_world(4).run(ranks.two_groups, timeout=100)
    assert [g[0] for g in got] == [0, 1, 0, 1]
    assert all(g[1] >= 200 and g[2] for g in got), got


@pytest.mark.timeout(150)
@pytest.mark.parametrize("launcher", ["distcomm run", "torchrun"])
def test_a_rank_killed_mid_collective_is_named_and_nothing_is_left(
    launcher: str, tmp_path: Path
) -> None:
    shm_before, tmp_before = dev_shm_names(), set(os.listdir("/tmp"))
    if launcher == "torchrun":
        torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
        assert torchrun is not None, "torchrun not found (it comes with torch)"
        command = [torchrun, "--nproc-per-node", "3", PROGRAM, "kill", str(tmp_path)]
    else:
        command = [sys.executable, "-m", "distcomm", "run", "-n", "3", "--backend", "gloo"]
        command += ["--", sys.executable, PROGRAM, "kill", str(tmp_path)]
    done = run_job(command, timeout=120, env={"DISTCOMM_BACKEND": "gloo"})
    text = done.stdout + done.stderr
    assert done.returncode != 0, text
    for rank in (0, 2):
        report = tmp_path / f"rank-{rank}.txt"
        assert report.exists(), f"rank {rank} raised nothing:\n{text}"
        waited, error = report.read_text().split("\n", 1)
        assert error.startswith("DistTimeoutError: "), error
        assert "can never complete (the process of rank 1 (pid " in error, error
        # at once, then the others asked out of band whether the ranks parted (a few seconds)
        assert float(waited) < 0.3 + 8.0, f"rank {rank} took {waited} s to see rank 1 die"
    assert dev_shm_names() <= shm_before, "left in /dev/shm"
    left = {n for n in set(os.listdir("/tmp")) - tmp_before if "distcomm" in n or "torch" in n}
    assert not left, f"left in /tmp: {left}"


def test_thread_ranks_keep_their_engine() -> None:
    def body() -> object:
        comm = distcomm.get_communicator()
        distcomm.all_reduce(torch.ones(10))
        return comm._node.segment

    said = run_threads(body, 2, timeout=60)
    assert said == ["its ranks are threads of one process (their engine already shares memory)"] * 2


def test_require_where_it_cannot_be_used_raises_with_a_hint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DISTCOMM_NODE_MEMORY", "auto")  # put back after the test

    def body() -> str:
        os.environ["DISTCOMM_NODE_MEMORY"] = "require"  # read when a group is made
        try:
            distcomm.new_group([0, 1])
        except NotSupportedError as exc:
            return str(exc)
        return "no error"

    for text in run_threads(body, 2, timeout=60):
        assert re.search(r"DISTCOMM_NODE_MEMORY=require, but .* cannot use node memory", text)
        assert "threads of one process" in text and "HINT: unset DISTCOMM_NODE_MEMORY" in text


def test_off_makes_no_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTCOMM_NODE_MEMORY", "off")
    assert run_threads(lambda: distcomm.get_communicator()._node is None, 2) == [True, True]
