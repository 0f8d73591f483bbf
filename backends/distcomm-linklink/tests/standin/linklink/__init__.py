"""A stand-in for SenseTime's linklink, for distcomm's tests only.

linklink is proprietary and cannot be installed here, so this module implements the part of its
API that distcomm's ``linklink`` backend calls (and public code uses) over torch.distributed's
Gloo: ``initialize`` reads the launch from RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT (the
real library reads its own cluster environment), groups are made by every rank as in linklink,
a root is a world rank, and only torch tensors are accepted, as linklink's are.
"""

import os

import torch
import torch.distributed as dist

__all__ = [
    "allgather",
    "allreduce",
    "allreduceOp_t",
    "allreduce_async",
    "barrier",
    "broadcast",
    "finalize",
    "gather",
    "get_backend",
    "get_local_rank",
    "get_rank",
    "get_world_size",
    "group",
    "initialize",
    "is_initialized",
    "new_group",
    "synchronize",
    "syncbnVarMode_t",
]


class allreduceOp_t:
    Sum = 0
    Max = 1
    Min = 2


class syncbnVarMode_t:
    L1 = 0
    L2 = 1


class group:
    WORLD = 0


_OPS = {0: dist.ReduceOp.SUM, 1: dist.ReduceOp.MAX, 2: dist.ReduceOp.MIN}
_groups = [None]
_pending = []
#: Every call this module received, by name (the tests check what distcomm used).
calls = {}


def _count(name):
    calls[name] = calls.get(name, 0) + 1


def _tensor(t):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"linklink takes torch tensors, got {type(t).__name__}")
    return t


def _group(group_idx):
    return _groups[group_idx or 0]


def initialize():
    _count("initialize")
    if not dist.is_initialized():
        env = os.environ
        dist.init_process_group("gloo", rank=int(env["RANK"]), world_size=int(env["WORLD_SIZE"]))


def is_initialized():
    return dist.is_initialized()


def finalize():
    _count("finalize")
    synchronize()
    del _groups[1:]
    dist.destroy_process_group()


def get_rank():
    return dist.get_rank()


def get_world_size():
    return dist.get_world_size()


def get_local_rank():
    return int(os.environ.get("LOCAL_RANK", "0"))


def get_backend():
    return "stand-in (gloo)"


def allreduce(tensor, reduce_op=allreduceOp_t.Sum, group_idx=None):
    _count("allreduce")
    dist.all_reduce(_tensor(tensor), _OPS[reduce_op], group=_group(group_idx))


def allreduce_async(name, tensor, reduce_op=allreduceOp_t.Sum, group_idx=None):
    _count("allreduce_async")
    work = dist.all_reduce(_tensor(tensor), _OPS[reduce_op], group=_group(group_idx), async_op=True)
    _pending.append(work)


def synchronize():
    while _pending:
        _pending.pop(0).wait()


def broadcast(tensor, root, group_idx=None):
    _count("broadcast")
    dist.broadcast(_tensor(tensor), root, group=_group(group_idx))


def allgather(output, tensor, group_idx=None):
    _count("allgather")
    gather_into = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather_into(_tensor(output), _tensor(tensor), group=_group(group_idx))


def gather(output, tensor, dst):
    _count("gather")
    dist.gather(_tensor(tensor), output if dist.get_rank() == dst else None, dst)


def barrier():
    _count("barrier")
    dist.barrier()


def new_group(ranks):
    _count("new_group")
    _groups.append(dist.new_group(ranks=list(ranks)))
    return len(_groups) - 1
