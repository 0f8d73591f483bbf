"""The zmq backend as its users meet it: distcomm's conformance kit at 1, 2, 3 and 4 ranks under
``distcomm run`` (with the summary docs/plugins.md shows), ``examples/hello.py`` on 4 ranks, and
the selection by name."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from distcomm.testing.conformance import CHECKS

ROOT = Path(__file__).resolve().parents[3]


def run(
    *args: str, timeout: float = 240, node_memory: str = "auto"
) -> subprocess.CompletedProcess[str]:
    """``python *args`` from the repository's root, as a user's shell would start it (with
    ``DISTCOMM_NODE_MEMORY=node_memory``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTCOMM_", "MASTER_"))}
    env["DISTCOMM_NODE_MEMORY"] = node_memory
    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("nprocs", "node_memory"), [(1, "auto"), (2, "require"), (3, "off"), (4, "require")]
)
def test_the_conformance_kit_passes(nprocs: int, node_memory: str) -> None:
    """Node memory (docs/backends.md#node-memory) forced on at 2 and 4 ranks, off at 3."""
    kit = ["-m", "pytest", "-q", "-p", "no:cacheprovider"]
    kit += ["--pyargs", "distcomm.testing.conformance"]
    command = ("-m", "distcomm", "run", "-n", str(nprocs), *kit, "--distcomm-backend=zmq")
    done = run(*command, node_memory=node_memory)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    for rank in range(nprocs):  # pytest's last line on every rank: every check passed
        assert f"[rank {rank}] {len(CHECKS)} passed in " in done.stdout, done.stdout[-4000:]
    # rank 0's summary, as docs/plugins.md shows it: the title, zmq's capabilities, no topic
    # with a failed check
    summary = [
        " ".join(line.split()[2:])
        for line in done.stdout.splitlines()
        if line.startswith("[rank 0]")
    ]
    ranks = "rank" if nprocs == 1 else "ranks"
    title = f"distcomm conformance: zmq, {nprocs} {ranks} (processes)"
    assert any(title in line for line in summary), done.stdout[-4000:]
    total = f"total {len(CHECKS)} 0"
    for shown in ("capability native", "topic passed failed", total):
        assert shown in summary, f"rank 0's summary lacks {shown!r}:\n{done.stdout[-4000:]}"
    start = summary.index("capability native")
    assert summary[start : start + len(CAPABILITIES)] == CAPABILITIES, summary[start:]
    topics = summary[summary.index("topic passed failed") + 1 : summary.index(total)]
    assert [row for row in topics if not row.endswith(" 0")] == [], "topics with failed checks"


#: zmq's capabilities in the kit's summary (whitespace collapsed).
CAPABILITIES = [
    "capability native",
    "dtypes all but bfloat16 (bridged through a wider dtype)",
    "reduce_ops all but AVG (emulated)",
    "ops all",
    "p2p yes",
    "p2p_tags yes",
    "any_source no",
    "async_ops yes",
    "timeouts yes",
    "cancellable yes",
    "subgroup_split yes",
]


@pytest.mark.timeout(120)
def test_hello_on_four_ranks() -> None:
    done = run("-m", "distcomm", "run", "-n", "4", "--backend", "zmq", "examples/hello.py")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "[rank 0] 4 ranks on zmq (env launch): sum of ranks 6 (expected 6)",
        "[rank 0] hello from rank-0, rank-1, rank-2, rank-3",
    ]


def test_info_explains_it() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "distcomm", "info", "--explain"],
        env={**os.environ, "DISTCOMM_BACKEND": "zmq"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "backend 'zmq' requested by DISTCOMM_BACKEND" in done.stdout, done.stdout
    assert "zmq                            distcomm-zmq" in done.stdout
