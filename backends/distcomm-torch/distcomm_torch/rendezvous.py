"""The TCPStore rendezvous of gloo and nccl: ended within the timeout, with errors that say who
is missing.

Rank 0 serves the store at the master address and port (unless the launcher serves it: torchrun's
agent store, ``LaunchInfo.agent_store``); the other ranks first wait for that port
to accept connections (so that an unreachable master ends at the timeout with a DistTimeoutError
naming rank 0, not with torch's retries and C++ message), then connect. Each rank marks its
arrival in the store; when torch's rendezvous times out, the ranks without a mark are the ones
named as missing.

Only the job's own ranks meet (:mod:`distcomm.backend.claims`): the store records the job of the
process that serves it, each rank claims its rank with an atomic add, and a rank of another job,
or a second claim of one rank, fails at once (and makes the others of this rendezvous fail when
they confirm it, after torch's). A store for a one-node job (a loopback master address) listens
on loopback only: nothing of a single-node job can be reached from another machine.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import ipaddress
import re
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch.distributed as dist

from distcomm import BackendUnavailableError, DistTimeoutError, LaunchInfo
from distcomm.backend import aborts, claims, free_port
from distcomm.backend.engine_messages import engine_said
from distcomm.errors import DistcommError
from distcomm_torch.communicator import torch_timeout

__all__ = ["confirm", "failed", "open_store", "overrun_guard", "wait_for_all"]

_ARRIVED = "distcomm/arrived/"
_CLAIMED = "distcomm/claimed/"
_DUPLICATE = "distcomm/duplicate"
_JOB = "distcomm/job"
#: The namespace of one attempt (restart) of a job in torchrun's agent store.
_ATTEMPT = "distcomm/attempt-"
#: Gloo's error when a peer's address refuses connections ("... SO_ERROR: Connection refused,
#: remote=[127.0.0.1]:56744, rank=0, size=2"): the address.
_REFUSED = re.compile(r"Connection refused, remote=\[?([^\],\s]+)\]?:(\d+)")
#: Seconds a rank waits, after torch's rendezvous, for a second claim of a rank to show.
_SETTLE = 0.1
#: How far past its own timeout the engine's set-up may run before this rank ends itself:
#: max(5 s, this fraction of the timeout).
_OVERRUN = 0.1


def open_store(name: str, launch: LaunchInfo, addr: str, port: int, timeout: float) -> Any:
    """Rank 0's TCPStore server, or another rank's client of it, within ``timeout`` seconds.

    Raises:
        DistTimeoutError: the master did not accept a connection in time (missing rank: 0).
        BackendUnavailableError: the store cannot be served (the port is taken) or reached (an
            address that does not resolve, or something other than a store at that port).
    """
    deadline = time.monotonic() + timeout
    serves = launch.rank == 0 and not launch.agent_store  # torchrun's agent may serve it
    if not serves:
        _wait_for_master(name, launch, addr, port, timeout, deadline)
    try:
        listening = _loopback_socket(addr, port) if serves else None
        server: dict[str, Any] = {} if listening is None else {"master_listen_fd": listening}
        store = dist.TCPStore(  # type: ignore[attr-defined]  # re-exported from torch._C
            addr,
            port,
            launch.world_size,
            serves,
            timeout=datetime.timedelta(seconds=max(1.0, deadline - time.monotonic())),
            wait_for_workers=False,
            **server,
        )
    except (RuntimeError, OSError) as exc:
        role = "serve" if serves else "reach"
        if "address already in use" in str(exc).lower() or "eaddrinuse" in str(exc).lower():
            hint = (
                f"MASTER_PORT={port} is taken on {addr} (another job may be using it): pick a "
                f"free port, e.g. MASTER_PORT={free_port()}, the same on every rank"
            )
        else:
            hint = (
                "check that MASTER_ADDR is rank 0's host and MASTER_PORT a free port there; "
                "every rank must use the same values"
            )
        raise BackendUnavailableError(
            f"{name}: rank {launch.rank} could not {role} the rendezvous at {addr}:{port}: "
            f"{_first_line(exc)}. HINT: {hint}.",
            backend=name,
            reason=str(exc),
        ) from exc
    _claim(name, launch, store, f"{addr}:{port}")
    store.set_timeout(torch_timeout(timeout))  # never 0 ms, torch's "no timeout"
    if launch.agent_store:
        # torchrun's agent store outlives a restart of the workers and keeps their keys: each
        # attempt's go in a namespace of its own (torch's too: Gloo's peers' addresses), else
        # a new attempt reads the address of a peer of the last one, which is gone.
        attempt = dist.PrefixStore(  # type: ignore[attr-defined]  # re-exported from torch._C
            f"{_ATTEMPT}{launch.restart_count}", store
        )
        attempt.set_timeout(torch_timeout(timeout))
        attempt.set(f"{_ARRIVED}{launch.rank}", "1")
        return attempt
    store.set(f"{_ARRIVED}{launch.rank}", "1")
    return store


def wait_for_all(name: str, launch: LaunchInfo, store: Any, where: str, timeout: float) -> None:
    """On rank 0, which serves ``store``: wait until every rank has reached it (each marks its
    arrival in :func:`open_store`), so that the server is never ended (a ``finalize`` right
    after) before a slow rank connected, which would then retry until its timeout.

    Raises:
        DistTimeoutError: ranks that did not arrive within ``timeout`` seconds (named).
    """
    keys = [f"{_ARRIVED}{r}" for r in range(launch.world_size)]
    try:
        store.wait(keys, torch_timeout(timeout))
    except RuntimeError as exc:
        missing = _not_arrived(store, launch.world_size)
        raise DistTimeoutError(
            f"{name}: ranks {missing} did not reach the rendezvous at {where} within "
            f"{timeout:g} s. HINT: check that they are running and can reach rank 0; raise "
            "init(timeout=...) if they are slow.",
            op="init",
            seq=0,
            group=f"rendezvous at {where}",
            missing_ranks=missing or [],
        ) from exc


def _loopback_socket(addr: str, port: int) -> int | None:
    """A socket listening at ``addr:port`` for the store's server, when ``addr`` is a loopback
    address (its descriptor, which the server takes over); None otherwise (torch's server
    listens on every interface, as a multi-node job needs)."""
    try:
        if not ipaddress.ip_address(addr).is_loopback:
            return None
    except ValueError:
        if addr != "localhost":
            return None
        addr = "127.0.0.1"
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((addr, port))
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    return sock.detach()


def _claim(name: str, launch: LaunchInfo, store: Any, where: str) -> None:
    """Claim this rank (and the rendezvous, for this job) in ``store``; see the module docstring.

    Under torchrun's agent store nothing is claimed: torchrun's own rendezvous admitted these
    workers, and its store outlives a restart of them (whose claims would look like a second).

    Raises:
        BackendUnavailableError: the store is another job's, or another process has this rank.
    """
    if launch.agent_store:
        return
    if launch.job_id:
        owner = bytes(store.compare_set(_JOB, "", launch.job_id)).decode(errors="replace")
        if owner != launch.job_id:
            raise claims.other_job(name, where, launch.rank, launch.job_id, owner)
    if int(store.add(f"{_CLAIMED}{launch.rank}", 1)) > 1:
        store.set(_DUPLICATE, str(launch.rank))
        raise claims.duplicate_rank(name, where, launch.rank)


def confirm(name: str, launch: LaunchInfo, store: Any, where: str) -> None:
    """After torch's rendezvous: fail if a rank of it was claimed twice meanwhile (this process
    then met a process of another job).

    Raises:
        BackendUnavailableError: a second claim of a rank was seen.
    """
    if launch.agent_store:
        return
    time.sleep(_SETTLE)
    if store.check([_DUPLICATE]):
        rank = int(bytes(store.get(_DUPLICATE)).decode())
        raise claims.duplicate_rank(name, where, rank)


def failed(
    name: str, launch: LaunchInfo, store: Any, timeout: float, exc: RuntimeError
) -> DistcommError:
    """The distcomm error for torch's ``init_process_group`` raising ``exc``."""
    where = f"the {name} rendezvous at {launch.master_addr}:{launch.master_port}"
    text = _first_line(exc)
    if "NCCL" in str(exc) and "timed out" not in str(exc).lower():
        return _nccl_failed(name, launch, exc)
    refused = _REFUSED.search(str(exc))
    if refused is not None:  # Gloo says "timed out connecting", but it was refused at once
        address = f"{refused.group(1)}:{refused.group(2)}"
        return BackendUnavailableError(
            f"{name}: rank {launch.rank} could not connect to a peer at {address} during "
            f"init ({text}): that address, which a peer left in {where}, refuses connections. "
            "It belongs to a process that is gone: a rank of an earlier attempt of this job (a "
            "restart) or of another job that used the same rendezvous. HINT: start every rank "
            "of the job afresh, with a rendezvous port no other job uses; under torchrun on "
            "several nodes, set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (docs/elastic.md).",
            backend=name,
            reason=f"a peer's address refuses connections: {address}",
        )
    if "timeout" not in str(exc).lower() and "timed out" not in str(exc).lower():
        return BackendUnavailableError(
            f"{name}: rank {launch.rank} could not join {where}: {text}. HINT: every rank "
            "must be started with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE.",
            backend=name,
            reason=text,
        )
    missing = _not_arrived(store, launch.world_size)
    if missing is None:
        who = "the ranks that had not arrived are unknown (the store did not answer)"
    else:
        who = f"ranks that had not arrived: {missing} (they never reached the rendezvous)"
    return DistTimeoutError(
        f"init (rendezvous) of {launch.world_size} ranks on {where} did not complete within "
        f"{timeout:g} s; {who}. HINT: start every rank (WORLD_SIZE={launch.world_size}); if "
        "they are merely slow to start, raise init(timeout=...) or DISTCOMM_TIMEOUT.",
        op="init",
        seq=0,
        group=where,
        missing_ranks=missing,
    )


@contextlib.contextmanager
def overrun_guard(name: str, launch: LaunchInfo, timeout: float, engine: float) -> Iterator[None]:
    """End this rank, with a message, if the engine's set-up inside the block outlives its own
    timeout (``engine`` seconds) by max(5 s, 10 % of ``timeout``).

    Gloo's full-mesh connect does not always honour its timeout: a rank that waits for a peer to
    connect to it waits for ever when that peer is gone (it died, or it read a dead process's
    address and gave up). A thread cannot be raised into from C++, so the rank prints why and
    exits with status 1, which every launcher sees as a failed rank: a hang becomes a failure
    that says what happened.
    """
    overrun = max(5.0, _OVERRUN * timeout)
    where = f"the {name} rendezvous at {launch.master_addr}:{launch.master_port}"

    def expired() -> None:
        aborts.abort_job(
            f"distcomm: init of {launch.world_size} ranks on {where} did not complete within "
            f"{timeout:g} s: rank {launch.rank} is still inside {name}'s set-up "
            f"(torch's init_process_group), {overrun:g} s past the engine's own timeout, "
            "waiting for a peer that never connected (it died, or it failed to join). Ending "
            "this rank (exit status 1) rather than hang. HINT: see the other ranks' errors; "
            "start every rank of the job afresh, with a rendezvous port no other job uses."
        )

    if not engine + overrun < min(threading.TIMEOUT_MAX, 1e9):  # no timeout: nothing to guard
        yield
        return
    timer = threading.Timer(engine + overrun, expired)
    timer.name = "distcomm-init-guard"
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _wait_for_master(
    name: str, launch: LaunchInfo, addr: str, port: int, timeout: float, deadline: float
) -> None:
    pause, reason = 0.01, "no answer"
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DistTimeoutError(
                f"init: rank {launch.rank} could not reach the {name} rendezvous at "
                f"{addr}:{port} within {timeout:g} s ({reason}); ranks that had not arrived: [0] "
                "(rank 0 serves the rendezvous). HINT: check that rank 0 runs and that "
                "MASTER_ADDR/MASTER_PORT are its host and port, reachable from here.",
                op="init",
                seq=0,
                group=f"rendezvous at {addr}:{port}",
                missing_ranks=[0],
            )
        try:
            with socket.create_connection((addr, port), timeout=min(remaining, 2.0)):
                return
        except socket.gaierror as exc:
            raise BackendUnavailableError(
                f"{name}: MASTER_ADDR={addr!r} does not resolve ({exc}). HINT: set it to rank "
                "0's host name or address.",
                backend=name,
                reason=str(exc),
            ) from exc
        except OSError as exc:
            reason = exc.strerror or str(exc) or type(exc).__name__
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 2, 0.5)


def _not_arrived(store: Any, size: int) -> list[int] | None:
    try:
        return [r for r in range(size) if not store.check([f"{_ARRIVED}{r}"])]
    except RuntimeError:
        return None


def _nccl_failed(name: str, launch: LaunchInfo, exc: RuntimeError) -> BackendUnavailableError:
    """NCCL failed to start inside ``init_process_group`` (the default group bound to the GPU
    starts it there): the rendezvous itself went well, and NCCL's reason follows torch's first
    line ("Last error: ..."): the error shows those lines too (``engine_said``)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    first = lines[0] if lines else type(exc).__name__
    return BackendUnavailableError(
        f"{name}: NCCL failed to start on rank {launch.rank}: {first}{engine_said(exc)}\nHINT: run "
        "again with "
        "NCCL_DEBUG=WARN for NCCL's own account; check the GPUs (nvidia-smi) and that each rank "
        "has its own.",
        backend=name,
        reason=first,
    )


def _first_line(exc: BaseException) -> str:
    if (
        isinstance(exc, OSError)
        and exc.errno is not None
        and exc.errno in errno.errorcode
        and exc.strerror
    ):
        return f"{errno.errorcode[exc.errno]}: {exc.strerror}"  # as torch's own: EADDRINUSE
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__
