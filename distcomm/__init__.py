"""distcomm: one communication layer for distributed PyTorch/NumPy programs.

``distcomm.init()`` picks the launch method and the backend (and says why: ``distcomm info
--explain``); collectives, object exchange, rank getters and rank-zero helpers then work the
same on every backend.
Importing distcomm imports neither torch, numpy, mpi4py nor pluggy, and loads no plugin: the
names below are loaded on first use (PEP 562), so ``import distcomm`` costs about a millisecond.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from distcomm._version import __version__

if TYPE_CHECKING:  # what type checkers and the API reference see; run time: _EXPORTS
    from distcomm._runtime.collectives import (
        all_gather,
        all_gather_into_tensor,
        all_gather_object,
        all_reduce,
        all_reduce_coalesced,
        all_to_all_single,
        assert_same,
        barrier,
        broadcast,
        broadcast_object,
        gather,
        gather_object,
        reduce,
        reduce_scatter_tensor,
        scatter,
        scatter_object,
    )
    from distcomm._runtime.detection import detect_environment
    from distcomm._runtime.flight_recorder import dump_trace
    from distcomm._runtime.getters import (
        get_backend,
        get_communicator,
        get_local_rank,
        get_local_world_size,
        get_node_rank,
        get_rank,
        get_world_size,
        is_distributed,
        is_initialized,
        is_local_main_process,
        is_main_process,
        restart_count,
    )
    from distcomm._runtime.grouping import (
        mesh,
        new_group,
        new_subgroups,
        split_group,
    )
    from distcomm._runtime.init_forms import (
        DistContext,
        dist_finalize,
        dist_init,
        dist_mode,
    )
    from distcomm._runtime.lifecycle import (
        finalize,
        init,
    )
    from distcomm._runtime.lists import (
        all_gather_v,
        all_to_all,
        reduce_scatter,
    )
    from distcomm._runtime.messages import (
        batch_isend_irecv,
        irecv,
        isend,
        recv,
        recv_object,
        send,
        send_object,
    )
    from distcomm._runtime.profiling import profile
    from distcomm._unpickling import allow_objects
    from distcomm.backend.events import (
        CollectiveEvent,
        HookHandle,
        add_hook,
    )
    from distcomm.environment import LaunchInfo
    from distcomm.errors import (
        AlreadyInitializedError,
        BackendNotFoundError,
        BackendUnavailableError,
        CollectiveMismatchError,
        DistcommError,
        DistcommWarning,
        DistTimeoutError,
        EngineError,
        EnvironmentDetectionError,
        InvalidArgumentError,
        MainOnlyCollectiveError,
        NotInitializedError,
        NotSameError,
        ObjectRefusedError,
        PluginConflictError,
        RankFailedError,
    )
    from distcomm.helpers import (
        main_process_only,
        rank_prefixed_message,
        run_on_main,
        zero_first,
    )
    from distcomm.meshes import Mesh
    from distcomm.protocol import (
        NON_MEMBER,
        Communicator,
        P2POp,
        ReduceOp,
        Work,
    )

#: Where each public name lives: loaded from there at its first use.
_EXPORTS = {
    "all_gather": "distcomm._runtime.collectives",
    "all_gather_into_tensor": "distcomm._runtime.collectives",
    "all_gather_object": "distcomm._runtime.collectives",
    "all_reduce": "distcomm._runtime.collectives",
    "all_reduce_coalesced": "distcomm._runtime.collectives",
    "all_to_all_single": "distcomm._runtime.collectives",
    "all_to_all": "distcomm._runtime.lists",
    "all_gather_v": "distcomm._runtime.lists",
    "reduce_scatter": "distcomm._runtime.lists",
    "batch_isend_irecv": "distcomm._runtime.messages",
    "assert_same": "distcomm._runtime.collectives",
    "profile": "distcomm._runtime.profiling",
    "dump_trace": "distcomm._runtime.flight_recorder",
    "barrier": "distcomm._runtime.collectives",
    "broadcast": "distcomm._runtime.collectives",
    "broadcast_object": "distcomm._runtime.collectives",
    "gather": "distcomm._runtime.collectives",
    "gather_object": "distcomm._runtime.collectives",
    "irecv": "distcomm._runtime.messages",
    "isend": "distcomm._runtime.messages",
    "new_group": "distcomm._runtime.grouping",
    "new_subgroups": "distcomm._runtime.grouping",
    "split_group": "distcomm._runtime.grouping",
    "mesh": "distcomm._runtime.grouping",
    "Mesh": "distcomm.meshes",
    "recv": "distcomm._runtime.messages",
    "reduce": "distcomm._runtime.collectives",
    "reduce_scatter_tensor": "distcomm._runtime.collectives",
    "scatter": "distcomm._runtime.collectives",
    "scatter_object": "distcomm._runtime.collectives",
    "send": "distcomm._runtime.messages",
    "send_object": "distcomm._runtime.messages",
    "recv_object": "distcomm._runtime.messages",
    "detect_environment": "distcomm._runtime.detection",
    "DistContext": "distcomm._runtime.init_forms",
    "dist_finalize": "distcomm._runtime.init_forms",
    "dist_init": "distcomm._runtime.init_forms",
    "dist_mode": "distcomm._runtime.init_forms",
    "get_backend": "distcomm._runtime.getters",
    "get_communicator": "distcomm._runtime.getters",
    "get_local_rank": "distcomm._runtime.getters",
    "get_local_world_size": "distcomm._runtime.getters",
    "get_node_rank": "distcomm._runtime.getters",
    "get_rank": "distcomm._runtime.getters",
    "get_world_size": "distcomm._runtime.getters",
    "restart_count": "distcomm._runtime.getters",
    "is_distributed": "distcomm._runtime.getters",
    "is_initialized": "distcomm._runtime.getters",
    "is_local_main_process": "distcomm._runtime.getters",
    "is_main_process": "distcomm._runtime.getters",
    "finalize": "distcomm._runtime.lifecycle",
    "init": "distcomm._runtime.lifecycle",
    "CollectiveEvent": "distcomm.backend.events",
    "HookHandle": "distcomm.backend.events",
    "add_hook": "distcomm.backend.events",
    "LaunchInfo": "distcomm.environment",
    "AlreadyInitializedError": "distcomm.errors",
    "BackendNotFoundError": "distcomm.errors",
    "BackendUnavailableError": "distcomm.errors",
    "CollectiveMismatchError": "distcomm.errors",
    "DistcommError": "distcomm.errors",
    "DistcommWarning": "distcomm.errors",
    "DistTimeoutError": "distcomm.errors",
    "EngineError": "distcomm.errors",
    "EnvironmentDetectionError": "distcomm.errors",
    "InvalidArgumentError": "distcomm.errors",
    "MainOnlyCollectiveError": "distcomm.errors",
    "NotInitializedError": "distcomm.errors",
    "NotSameError": "distcomm.errors",
    "ObjectRefusedError": "distcomm.errors",
    "allow_objects": "distcomm._unpickling",
    "PluginConflictError": "distcomm.errors",
    "RankFailedError": "distcomm.errors",
    "main_process_only": "distcomm.helpers",
    "rank_prefixed_message": "distcomm.helpers",
    "run_on_main": "distcomm.helpers",
    "zero_first": "distcomm.helpers",
    "NON_MEMBER": "distcomm.protocol",
    "Communicator": "distcomm.protocol",
    "P2POp": "distcomm.protocol",
    "ReduceOp": "distcomm.protocol",
    "Work": "distcomm.protocol",
}
#: distcomm's subpackages and modules, reachable as attributes (``distcomm.errors``) as if imported.
_SUBMODULES = frozenset(
    {
        "backend",
        "cli",
        "compat",
        "environment",
        "errors",
        "fakelink",
        "helpers",
        "protocol",
        "testing",
        "workspace",
    }
)
#: The backend-author kit, not part of the user's API: ``from distcomm.backend import ...``.
_MOVED_TO_BACKEND = frozenset(
    {
        "BackendSpec",
        "BaseCommunicator",
        "BaseWork",
        "Capabilities",
        "EnvironmentSpec",
        "hookimpl",
        "hookspec",
    }
)

__all__ = [
    "all_gather_v",
    "all_to_all",
    "reduce_scatter",
    "Mesh",
    "mesh",
    "new_subgroups",
    "split_group",
    "P2POp",
    "batch_isend_irecv",
    "send_object",
    "recv_object",
    "NON_MEMBER",
    "AlreadyInitializedError",
    "BackendNotFoundError",
    "BackendUnavailableError",
    "CollectiveEvent",
    "CollectiveMismatchError",
    "Communicator",
    "DistContext",
    "DistTimeoutError",
    "DistcommError",
    "DistcommWarning",
    "EngineError",
    "EnvironmentDetectionError",
    "HookHandle",
    "InvalidArgumentError",
    "LaunchInfo",
    "MainOnlyCollectiveError",
    "NotInitializedError",
    "NotSameError",
    "ObjectRefusedError",
    "PluginConflictError",
    "RankFailedError",
    "ReduceOp",
    "Work",
    "__version__",
    "add_hook",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_reduce",
    "all_reduce_coalesced",
    "all_to_all_single",
    "allow_objects",
    "assert_same",
    "barrier",
    "broadcast",
    "broadcast_object",
    "detect_environment",
    "dist_finalize",
    "dist_init",
    "dist_mode",
    "dump_trace",
    "finalize",
    "gather",
    "gather_object",
    "get_backend",
    "get_communicator",
    "get_local_rank",
    "get_local_world_size",
    "get_node_rank",
    "get_rank",
    "get_world_size",
    "init",
    "irecv",
    "is_distributed",
    "is_initialized",
    "is_local_main_process",
    "is_main_process",
    "main_process_only",
    "isend",
    "new_group",
    "profile",
    "rank_prefixed_message",
    "recv",
    "reduce",
    "reduce_scatter_tensor",
    "restart_count",
    "run_on_main",
    "scatter",
    "scatter_object",
    "send",
    "zero_first",
]


def __getattr__(name: str) -> Any:
    """Load a public name (or a submodule) at its first use, and keep it; a torch.distributed
    name that distcomm lacks gets an AttributeError naming distcomm's equivalent."""
    module = _EXPORTS.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"{__name__}.{name}")
    elif name in _MOVED_TO_BACKEND:
        raise _moved_to_backend(name)
    else:
        from distcomm._torch_names import missing_name

        raise missing_name(__name__, name)
    globals()[name] = value
    return value


def _moved_to_backend(name: str) -> AttributeError:
    """The error for a backend-author name asked of ``distcomm``: it says where the name lives
    (``from distcomm import X`` shows Python's own "cannot import name" instead)."""
    return AttributeError(
        f"module {__name__!r} has no attribute {name!r}: it moved to distcomm.backend "
        f"(from distcomm.backend import {name})"
    )


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, *_SUBMODULES})
