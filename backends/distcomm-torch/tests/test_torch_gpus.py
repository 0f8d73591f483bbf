"""One GPU per rank (distcomm_torch.gpus), checked before NCCL starts: the ranks of a node
compare their GPUs' identities through a real torch store (a HashStore shared by thread-ranks).
CUDA is mocked (no GPU in CI): ``get_device_properties`` gives each visible index a UUID the
test chooses, as CUDA_VISIBLE_DEVICES would per process."""

from __future__ import annotations

import threading
import types
from typing import Any

import pytest
import torch
import torch.distributed as dist
from distcomm_torch.gpus import check_one_gpu_per_rank

from distcomm import BackendUnavailableError, LaunchInfo


def node_of(uuids: list[str], monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Each local rank of a node of ``len(uuids)`` ranks checks its GPU, index 0 of what it
    sees, whose UUID is ``uuids[rank]``; what each raised (None if nothing)."""
    store = dist.HashStore()
    seen = threading.local()
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda index: types.SimpleNamespace(uuid=f"GPU-{uuids[seen.rank]}"),
    )
    size = len(uuids)
    results: list[Any] = [None] * size

    def rank(r: int) -> None:
        seen.rank = r
        launch = LaunchInfo("env", r, size, r, size, 0, 1)
        try:
            check_one_gpu_per_rank("nccl", launch, store, torch.device("cuda", 0), 10.0)
        except BackendUnavailableError as exc:
            results[r] = exc

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def test_ranks_sharing_a_gpu_all_fail_naming_ranks_gpu_and_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Four ranks on a node whose ranks 0 and 2, and 1 and 3, see the same GPU (more ranks
    than GPUs): NCCL would say "Duplicate GPU detected" or hang; every rank fails at init."""
    results = node_of(["a", "b", "a", "b"], monkeypatch)
    assert all(isinstance(r, BackendUnavailableError) for r in results), results
    said = str(results[3])
    assert said.startswith("nccl: NCCL needs one GPU per rank, but ranks 0, 2 on cuda:0 of "), said
    assert "; ranks 1, 3 on cuda:0 of " in said and "would share one (4 ranks on this node" in said
    assert "HINT: start at most 1 rank(s) per node (torchrun --nproc-per-node 1" in said
    assert "CUDA_VISIBLE_DEVICES, srun --gpus-per-task=1" in said
    assert {str(r) for r in results} == {said}, "every rank tells the same"
    assert results[0].reason == "ranks share a GPU"


def test_one_visible_gpu_each_is_fine_although_every_rank_calls_it_cuda_0(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """srun --gpus-per-task=1: each rank sees its own GPU as cuda:0; no false alarm."""
    assert node_of(["a", "b", "c"], monkeypatch) == [None, None, None]


def test_nccl_init_checks_before_torch_starts_nccl(monkeypatch: pytest.MonkeyPatch) -> None:
    """The factory runs the check on the rendezvous store before init_process_group (where,
    with the device bound, NCCL itself starts). Mocked: CUDA (2 devices), the check (it
    refuses), and init_process_group (recorded: it must not be called)."""
    from distcomm_torch import factory

    asked: list[Any] = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: None)
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **k: asked.append("init"))

    def refuse(name: str, launch: LaunchInfo, store: Any, device: Any, timeout: float) -> None:
        asked.append((name, launch.rank, str(device), timeout))
        raise BackendUnavailableError("shared", backend=name, reason="ranks share a GPU")

    monkeypatch.setattr(factory.gpus, "check_one_gpu_per_rank", refuse)
    launch = LaunchInfo("env", 0, 1, 0, 1, 0, 1)
    with pytest.raises(BackendUnavailableError, match="shared"):
        factory.create("nccl", launch, timeout=5.0, device="cuda:1")
    assert asked == [("nccl", 0, "cuda:1", 5.0)], asked


def test_nccl_failing_to_start_in_init_is_not_called_a_rendezvous_failure() -> None:
    """With the default group bound to the GPU, NCCL starts inside init_process_group: its
    failure (torch's text, as users report it) is told as NCCL's, with NCCL's reason from
    after the first line, not as "could not join the rendezvous" with a MASTER_ADDR hint."""
    from distcomm_torch import rendezvous

    exc = RuntimeError(
        "NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, unhandled cuda "
        "error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5\n"
        "ncclUnhandledCudaError: Call to CUDA function failed.\n"
        "Last error:\nCuda failure 'out of memory'\n"
        "Exception raised from create at x.cpp:1 (most recent call first):\nframe #0: f()\n"
    )
    launch = LaunchInfo("env", 1, 2, 1, 2, 0, 1, master_addr="127.0.0.1", master_port=29500)
    error = rendezvous.failed("nccl", launch, None, 30.0, exc)
    said = str(error)
    assert isinstance(error, BackendUnavailableError), said
    assert said.startswith("nccl: NCCL failed to start on rank 1: NCCL error in: "), said
    assert "\nThe engine said:\n  ncclUnhandledCudaError" in said
    assert "\n  Cuda failure 'out of memory'\nHINT: run again with NCCL_DEBUG=WARN" in said
    assert "rendezvous" not in said and "MASTER_ADDR" not in said and "frame #0" not in said
