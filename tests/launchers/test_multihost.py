"""Two hosts on one machine: network namespaces joined by a veth link, each with its own address
and host name. Four processes started with the variables srun gives a task (2 nodes x 2 tasks,
SLURM_STEP_NODELIST naming both hosts) find each other over Gloo across the link: the master is
the first host of the node list, resolved inside each namespace to the other side's address.

Needs root (``ip netns``, ``unshare --uts``); without it the test skips and says so.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from jobs import job_environment
from test_slurm import RANK, reports

NODES, PER_NODE = 2, 2
SUBNET = "10.231.{}.{}"


class Hosts:
    """Namespaces ``names`` with host names ``hosts``, the veth end ``links[i]`` in each."""

    def __init__(self, tag: str) -> None:
        self.names = [f"distcomm-{tag}-{n}" for n in range(NODES)]
        self.links = [f"dc{tag}v{n}" for n in range(NODES)]
        self.hosts = [f"dcnode{n}" for n in range(NODES)]
        self.addresses = [SUBNET.format(int(tag) % 250, n + 1) for n in range(NODES)]
        self.made_etc = False  # whether up() made /etc/netns (down() removes it then, if empty)

    def up(self) -> None:
        self.down()
        self.made_etc = not Path("/etc/netns").exists()
        for name in self.names:
            _ip("netns", "add", name)
        _ip("link", "add", self.links[0], "type", "veth", "peer", "name", self.links[1])
        hosts_file = "127.0.0.1 localhost\n" + "".join(
            f"{address} {host}\n" for address, host in zip(self.addresses, self.hosts, strict=True)
        )
        for name, link, address in zip(self.names, self.links, self.addresses, strict=True):
            _ip("link", "set", link, "netns", name)
            _ip("-n", name, "addr", "add", f"{address}/24", "dev", link)
            _ip("-n", name, "link", "set", link, "up")
            _ip("-n", name, "link", "set", "lo", "up")
            etc = Path("/etc/netns", name)
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(hosts_file)  # ip netns exec mounts it over /etc/hosts

    def down(self) -> None:
        for name in self.names:
            subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)
            hosts = Path("/etc/netns", name)
            if hosts.exists():
                (hosts / "hosts").unlink(missing_ok=True)
                hosts.rmdir()
        if self.made_etc and not any(Path("/etc/netns").iterdir()):
            Path("/etc/netns").rmdir()

    def received(self, node: int) -> int:
        """Bytes node ``node``'s end of the link has received."""
        path = f"/sys/class/net/{self.links[node]}/statistics/rx_bytes"
        out = subprocess.run(
            ["ip", "netns", "exec", self.names[node], "cat", path],
            capture_output=True,
            text=True,
            check=True,
        )
        return int(out.stdout)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    if os.geteuid() != 0:
        pytest.skip("needs root: network namespaces (ip netns) stand in for hosts")
    made = Hosts(str(os.getpid() % 10000))
    made.up()
    try:
        yield made
    finally:
        made.down()


def task_environment(rank: int, node: int, local: int, nodelist: str) -> dict[str, str]:
    """What srun sets in task ``rank`` of a 2-node step (the variables distcomm reads)."""
    return {
        **job_environment(),
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(local),
        "SLURM_NODEID": str(node),
        "SLURM_NTASKS": str(NODES * PER_NODE),
        "SLURM_STEP_NUM_TASKS": str(NODES * PER_NODE),
        "SLURM_NNODES": str(NODES),
        "SLURM_STEP_NUM_NODES": str(NODES),
        "SLURM_TASKS_PER_NODE": f"{PER_NODE}(x{NODES})",
        "SLURM_STEP_TASKS_PER_NODE": f"{PER_NODE}(x{NODES})",
        "SLURM_STEP_NODELIST": nodelist,
        "SLURM_JOB_NODELIST": nodelist,
    }


@pytest.mark.timeout(240)
def test_gloo_rendezvous_across_two_hosts(hosts: Hosts, tmp_path: Path) -> None:
    nodelist = f"dcnode[0-{NODES - 1}]"
    procs = []
    try:
        for node in range(NODES):
            for local in range(PER_NODE):
                rank = node * PER_NODE + local
                rank_body = f"{sys.executable} {RANK} {tmp_path} init gloo"
                body = f"hostname {hosts.hosts[node]} && exec {rank_body}"
                procs.append(
                    subprocess.Popen(
                        [
                            "ip",
                            "netns",
                            "exec",
                            hosts.names[node],
                            "unshare",
                            "--uts",
                            "sh",
                            "-c",
                            body,
                        ],
                        env=task_environment(rank, node, local, nodelist),
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        text=True,
                    )
                )
        outputs = [proc.communicate(timeout=180)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert [proc.returncode for proc in procs] == [0] * len(procs), "\n".join(outputs)
    results = reports(tmp_path, NODES * PER_NODE)
    expected_hosts = [host for host in hosts.hosts for _ in range(PER_NODE)]
    for rank, seen in enumerate(results):
        node, local = divmod(rank, PER_NODE)
        assert (seen["rank"], seen["world_size"]) == (rank, NODES * PER_NODE)
        assert (seen["local_rank"], seen["local_world_size"]) == (local, PER_NODE)
        assert (seen["node_rank"], seen["num_nodes"]) == (node, NODES)
        assert (seen["backend"], seen["method"]) == ("gloo", "slurm")
        assert seen["master_addr"] == "dcnode0" and seen["host"] == hosts.hosts[node]
        assert seen["hosts"] == expected_hosts
        assert seen["sum"] == sum(range(1, NODES * PER_NODE + 1))
        # the namespaces are two hosts to the network, but one machine's memory: the ranks
        # prove it (they map rank 0's segment) and the world's tensors go through node memory
        assert seen["node_memory"], f"rank {rank}: the world kept Gloo on one machine"
    assert hosts.received(1) > 10_000  # the rendezvous crossed the link
