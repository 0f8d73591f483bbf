"""torch.distributed's API on every distcomm backend: change one import.

``import torch.distributed as dist`` becomes ``import distcomm.compat.torch_distributed as
dist``; the program then runs under ``distcomm run``, torchrun, ``srun`` or ``mpirun``, on gloo,
nccl, mpi or any plugin, and in ``distcomm.testing.run_threads``. The guide, with every difference
in one table, is docs/from-torch.md.

Kept from torch: the names, signatures and defaults; ``src``, ``dst`` and ``peer`` are global
ranks (``group_src``, ``group_dst`` and ``group_peer`` the group's); the object functions fill
the lists they are given; a rank outside ``group`` does nothing and gets torch's warning
(``get_rank``/``get_world_size``: -1); ``async_op=True`` returns a Work (``wait()``,
``is_completed()``).

distcomm's safety kept where torch's behaviour is a known trap:

- A barrier (``barrier``, ``monitored_barrier``), like every operation, never waits forever: past
  the timeout it raises DistTimeoutError naming the ranks that had not arrived, on every backend
  (torch's ``monitored_barrier`` is gloo's only).
- The object functions read a peer's bytes through distcomm's allow-list, not plain pickle
  (docs/security.md); their ``device`` argument is accepted and unused: no GPU has to be the
  current one for them to work. A rank whose output list is the wrong size raises after the
  exchange instead of leaving the others waiting.
- Arguments distcomm cannot honour (``store``, ``pg_options``, a group's own backend or timeout)
  raise InvalidArgumentError naming them, never silently ignored.

A torch.distributed name this module lacks raises an AttributeError that names distcomm's way.
"""

from __future__ import annotations

from typing import Any

from distcomm._torch_names import missing_name
from distcomm.compat.torch_distributed._groups import (
    GroupMember,
    destroy_process_group,
    get_backend,
    get_global_rank,
    get_group_rank,
    get_process_group_ranks,
    get_rank,
    get_world_size,
    group,
    init_process_group,
    is_available,
    is_initialized,
    new_group,
)
from distcomm.compat.torch_distributed._objects import (
    all_gather_object,
    broadcast_object_list,
    gather_object,
    scatter_object_list,
)
from distcomm.compat.torch_distributed._tensors import (
    P2POp,
    all_gather,
    all_gather_into_tensor,
    all_reduce,
    all_to_all,
    all_to_all_single,
    barrier,
    batch_isend_irecv,
    broadcast,
    gather,
    irecv,
    isend,
    monitored_barrier,
    recv,
    reduce,
    reduce_scatter,
    reduce_scatter_tensor,
    scatter,
    send,
)
from distcomm.protocol import ReduceOp, Work

__all__ = [
    "GroupMember",
    "P2POp",
    "ReduceOp",
    "Work",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "batch_isend_irecv",
    "broadcast",
    "broadcast_object_list",
    "destroy_process_group",
    "gather",
    "gather_object",
    "get_backend",
    "get_global_rank",
    "get_group_rank",
    "get_process_group_ranks",
    "get_rank",
    "get_world_size",
    "group",
    "init_process_group",
    "irecv",
    "is_available",
    "is_initialized",
    "isend",
    "monitored_barrier",
    "new_group",
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
    "send",
]


def __getattr__(name: str) -> Any:
    """A torch.distributed name this module lacks: an AttributeError naming distcomm's way."""
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    raise missing_name(
        __name__,
        name,
        f"the drop-in has no {name}; where torch.distributed.{name} exists, call it on "
        "torch's default process group, which distcomm makes beside any backend "
        "(distcomm.init(torch_group=True); docs/interop.md)",
    )
