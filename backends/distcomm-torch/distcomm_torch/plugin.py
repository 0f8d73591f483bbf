"""The entry point: registers ``gloo`` and ``nccl`` with distcomm, and the ``torch`` adapter
(torch.distributed's backend ``"distcomm"``, :mod:`distcomm_torch.process_group`). Imports no
torch."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from distcomm import LaunchInfo
from distcomm.backend import (
    KIT_API,
    AdapterSpec,
    BackendSpec,
    Capabilities,
    Registry,
    hookimpl,
)

__all__ = ["GLOO", "NCCL", "distcomm_register_backends"]

_NO_INT16 = frozenset(
    {"bool", "uint8", "int8", "int32", "int64", "float16", "bfloat16", "float32", "float64"}
)
GLOO = Capabilities(dtypes=_NO_INT16)
NCCL = Capabilities(
    dtypes=_NO_INT16,
    reduce_ops=frozenset({"SUM", "PRODUCT", "MIN", "MAX", "AVG"}),
    any_source=False,
    p2p_tags=False,  # ProcessGroupNCCL ignores tags: messages match in the order they are posted
    node_memory=False,  # its tensors are on GPUs; its objects travel on a Gloo side group
)


def _torch_missing() -> str | None:
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed (pip install torch)"
    return None


def gloo_available(launch: LaunchInfo) -> tuple[bool, str]:
    """gloo needs torch built with distributed support; it runs anywhere torch does."""
    missing = _torch_missing()
    if missing:
        return False, missing
    return True, "torch.distributed with Gloo: CPU tensors, any launch"


def nccl_available(launch: LaunchInfo) -> tuple[bool, str]:
    """nccl needs a CUDA device and torch with NCCL; with no GPU driver, torch is not imported."""
    missing = _torch_missing()
    if missing:
        return False, missing
    if not (os.path.exists("/dev/nvidiactl") or os.path.exists("/proc/driver/nvidia")):
        return False, "no NVIDIA driver on this machine (no /dev/nvidiactl)"
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        return False, "torch sees no CUDA device (torch.cuda.is_available() is False)"
    if not dist.is_nccl_available():
        return False, "this torch build has no NCCL"
    return True, f"{torch.cuda.device_count()} CUDA device(s) visible"


def _create_gloo(launch: LaunchInfo, **options: Any) -> Any:
    from distcomm_torch.factory import create

    return create("gloo", launch, **options)


def _create_nccl(launch: LaunchInfo, **options: Any) -> Any:
    from distcomm_torch.factory import create

    return create("nccl", launch, **options)


def _install() -> None:
    from distcomm_torch.process_group import install

    install()


def _make_torch_group(comm: Any, host: str | None, share: Any, timeout: float) -> Any:
    from distcomm_torch.process_group import make

    return make(comm, host, share, timeout)


@hookimpl
def distcomm_register_backends(registry: Registry) -> None:
    """Register gloo (priority 100), nccl (priority 300) and the torch adapter."""
    registry.add_adapter(
        AdapterSpec(
            name="torch",
            install=_install,
            make=_make_torch_group,
            description="torch.distributed's backend 'distcomm': torch's groups over distcomm",
        )
    )
    registry.add_backend(
        BackendSpec(
            name="gloo",
            factory=_create_gloo,
            is_available=gloo_available,
            priority=100,
            devices=frozenset({"cpu"}),
            capabilities=GLOO,
            description="torch.distributed Gloo: CPU tensors over TCP",
            kit_api=KIT_API,
            makes_torch_group=True,
        )
    )
    registry.add_backend(
        BackendSpec(
            name="nccl",
            factory=_create_nccl,
            is_available=nccl_available,
            priority=300,
            devices=frozenset({"cuda"}),
            capabilities=NCCL,
            description="torch.distributed NCCL: CUDA tensors; objects over a CPU side channel",
            kit_api=KIT_API,
            makes_torch_group=True,
        )
    )
