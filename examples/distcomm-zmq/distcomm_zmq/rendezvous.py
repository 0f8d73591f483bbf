"""How the ranks find each other: rank 0 collects every rank's inbox address and sends the table.

Rank 0 binds a ROUTER socket at the launch's master address and port; every other rank connects
a DEALER socket there and says ``(rank, its inbox address)``; once all have, rank 0 answers each
with the full table. Everything comes from the :class:`~distcomm.backend.LaunchInfo` the backend
is given (no environment reading here). A rank missing at the deadline makes rank 0 fail naming
it; a rank that hears nothing names rank 0.

Only the job's own ranks meet (the kit's :mod:`distcomm.backend.claims`): a rank says its job
id too, and rank 0 turns away a rank of another job (it fails naming both ids); a rank claimed
twice ends the rendezvous for every process in it, with the kit's error.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import time
import uuid
from typing import Any

import zmq

from distcomm.backend import LaunchInfo, claims
from distcomm.errors import BackendUnavailableError, DistTimeoutError, InvalidArgumentError

__all__ = ["bind_inbox", "exchange", "is_loopback", "single_node"]


def is_loopback(address: str) -> bool:
    """Whether ``address`` (a name or an IP) is this machine's loopback."""
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def single_node(launch: LaunchInfo) -> bool:
    """Whether every rank runs on this machine: one node, and a loopback master address."""
    return launch.num_nodes == 1 and is_loopback(launch.master_addr or "127.0.0.1")


def bind_inbox(inbox: zmq.Socket[Any], launch: LaunchInfo) -> str:
    """Bind this rank's inbox; return the address the other ranks reach it at.

    A single-node job binds a Unix socket in Linux's abstract namespace (``ipc://@...``: faster
    than TCP, no file to remove, nothing reachable from another machine); elsewhere, or where
    that fails, TCP: on loopback for a single-node job, else on every interface, advertised as
    the address this host reaches the master from.
    """
    if single_node(launch):
        name = f"ipc://@distcomm-zmq-{uuid.uuid4().hex}-{launch.rank}"
        try:
            inbox.bind(name)
            return name
        except zmq.ZMQError:  # no abstract namespace (not Linux): loopback TCP
            pass
        port = inbox.bind_to_random_port("tcp://127.0.0.1")
        return f"tcp://127.0.0.1:{port}"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((launch.master_addr or "127.0.0.1", launch.master_port or 9))  # no packet
        host = str(probe.getsockname()[0])
    port = inbox.bind_to_random_port("tcp://*")
    return f"tcp://{host}:{port}"


def exchange(
    context: zmq.Context[Any], launch: LaunchInfo, endpoint: str, timeout: float
) -> list[str]:
    """Every rank's inbox address, by rank, with ``endpoint`` as this rank's.

    Raises:
        InvalidArgumentError: the launch has no master address and port (several ranks).
        DistTimeoutError: some rank did not arrive within ``timeout`` seconds.
    """
    if launch.world_size == 1:
        return [endpoint]
    if launch.master_addr is None or launch.master_port is None:
        raise InvalidArgumentError(
            f"backend 'zmq' needs a master address and port to start {launch.world_size} ranks; "
            f"the {launch.method!r} launch has none. HINT: start the job with distcomm run, "
            "torchrun or srun, or set MASTER_ADDR and MASTER_PORT."
        )
    address = f"tcp://{launch.master_addr}:{launch.master_port}"
    if launch.rank == 0:
        return _collect(context, address, endpoint, launch, timeout)
    return _report(context, address, endpoint, launch, timeout)


def _collect(
    context: zmq.Context[Any], address: str, endpoint: str, launch: LaunchInfo, timeout: float
) -> list[str]:
    size, where = launch.world_size, address.removeprefix("tcp://")
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 1000)
    try:
        try:
            router.bind(address)
        except zmq.ZMQError as exc:
            raise InvalidArgumentError(
                f"backend 'zmq': rank 0 could not serve the rendezvous at {address}: {exc}. "
                "HINT: another job may use this MASTER_PORT; pick a free one."
            ) from exc
        table: list[str | None] = [endpoint] + [None] * (size - 1)
        senders: list[bytes] = []
        deadline = time.monotonic() + timeout
        while None in table:
            left = deadline - time.monotonic()
            if left <= 0 or not router.poll(int(left * 1000)):
                missing = [r for r, e in enumerate(table) if e is None]
                raise DistTimeoutError(
                    f"backend 'zmq': ranks {missing} did not join the rendezvous at {address} "
                    f"within {timeout:g} s. HINT: check that every rank was started and can "
                    "reach the master address.",
                    op="rendezvous",
                    missing_ranks=missing,
                )
            sender, message = router.recv_multipart()
            rank, theirs, job = json.loads(message)
            if launch.job_id and job and job != launch.job_id:  # turned away; rank 0 goes on
                error = claims.other_job("zmq", where, rank, job, launch.job_id)
                router.send_multipart((sender, json.dumps({"error": str(error)}).encode()))
                continue
            if table[rank] is not None:  # everyone in this rendezvous fails
                error = claims.duplicate_rank("zmq", where, rank)
                for each in [*senders, sender]:
                    router.send_multipart((each, json.dumps({"error": str(error)}).encode()))
                raise error
            table[rank] = theirs
            senders.append(sender)
        reply = json.dumps(table).encode()
        for sender in senders:
            router.send_multipart((sender, reply))
        return [e for e in table if e is not None]
    finally:
        router.close()


def _report(
    context: zmq.Context[Any], address: str, endpoint: str, launch: LaunchInfo, timeout: float
) -> list[str]:
    rank = launch.rank
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    try:
        dealer.connect(address)
        dealer.send(json.dumps([rank, endpoint, launch.job_id]).encode())
        if not dealer.poll(int(timeout * 1000)):
            raise DistTimeoutError(
                f"backend 'zmq': rank {rank} got no address table from rank 0's rendezvous at "
                f"{address} within {timeout:g} s. Rank 0 answers once every rank has joined, so "
                "another rank is missing (rank 0's error names it) or rank 0 is not there. HINT: "
                "check that every rank was started and reaches the master address (MASTER_ADDR).",
                op="rendezvous",
            )
        answer = json.loads(dealer.recv())
        if isinstance(answer, dict):  # turned away: another job's, or a rank claimed twice
            raise BackendUnavailableError(answer["error"], backend="zmq", reason="rendezvous")
        table: list[str] = answer
        return table
    finally:
        dealer.close()
