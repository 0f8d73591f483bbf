"""distcomm: one communication layer for distributed PyTorch/NumPy programs.

``distcomm.init()`` picks the launch method and the backend (and says why: ``distcomm info
--explain``); collectives, object exchange, rank getters and rank-zero helpers then work the
same on every backend.
Importing distcomm imports neither torch, numpy nor mpi4py, and loads no plugin.
"""

from distcomm._runtime.collectives import (
    all_gather,
    all_gather_into_tensor,
    all_gather_object,
    all_reduce,
    all_to_all_single,
    assert_same,
    barrier,
    broadcast,
    broadcast_object,
    gather,
    gather_object,
    irecv,
    isend,
    new_group,
    recv,
    reduce,
    reduce_scatter_tensor,
    scatter,
    scatter_object,
    send,
)
from distcomm._runtime.detection import detect_environment
from distcomm._runtime.doors import DistContext, dist_finalize, dist_init, dist_mode
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
)
from distcomm._runtime.lifecycle import finalize, init
from distcomm._version import __version__
from distcomm.backend._pipeline.observing import CollectiveEvent, HookHandle, add_hook
from distcomm.backend.communicator import BaseCommunicator
from distcomm.backend.hooks import hookimpl, hookspec
from distcomm.backend.specs import BackendSpec, Capabilities, EnvironmentSpec
from distcomm.backend.work import BaseWork
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
    PluginConflictError,
    RankFailedError,
)
from distcomm.helpers import main_process_only, rank_prefixed_message, run_on_main, zero_first
from distcomm.protocol import NON_MEMBER, Communicator, ReduceOp, Work

__all__ = [
    "NON_MEMBER",
    "AlreadyInitializedError",
    "BackendNotFoundError",
    "BackendSpec",
    "BackendUnavailableError",
    "BaseCommunicator",
    "BaseWork",
    "Capabilities",
    "CollectiveEvent",
    "CollectiveMismatchError",
    "Communicator",
    "DistContext",
    "DistTimeoutError",
    "DistcommError",
    "DistcommWarning",
    "EngineError",
    "EnvironmentDetectionError",
    "EnvironmentSpec",
    "HookHandle",
    "InvalidArgumentError",
    "LaunchInfo",
    "MainOnlyCollectiveError",
    "NotInitializedError",
    "NotSameError",
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
    "all_to_all_single",
    "assert_same",
    "barrier",
    "broadcast",
    "broadcast_object",
    "detect_environment",
    "dist_finalize",
    "dist_init",
    "dist_mode",
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
    "hookimpl",
    "hookspec",
    "init",
    "irecv",
    "is_distributed",
    "is_initialized",
    "is_local_main_process",
    "is_main_process",
    "main_process_only",
    "isend",
    "new_group",
    "rank_prefixed_message",
    "recv",
    "reduce",
    "reduce_scatter_tensor",
    "run_on_main",
    "scatter",
    "scatter_object",
    "send",
    "zero_first",
]
