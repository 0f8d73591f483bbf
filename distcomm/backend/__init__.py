"""The public kit for backend and plugin authors.

A backend is an engine (any object with the methods of :mod:`distcomm.backend.engine`: six
required, the rest found by presence), a factory that makes it from a :class:`LaunchInfo`, and a
:class:`BackendSpec` registered from a ``distcomm_register_backends`` hook (marked
:data:`hookimpl`) on the :class:`Registry`. Backend and plugin packages import only ``distcomm``,
``distcomm.backend`` (and its modules), ``distcomm.errors``, ``distcomm.protocol`` and
``distcomm.testing``; everything else in distcomm is private and may change. The kit makes a
:class:`BaseCommunicator` around each engine. The guide: docs/plugins.md.
"""

from distcomm.backend.aborts import (
    abort_job,
    abort_on_uncaught_exception,
    add_last_words,
    last_words,
    set_abort_notice,
)
from distcomm.backend.arrays import Adapter, adapter_for, as_torch
from distcomm.backend.communicator import BaseCommunicator
from distcomm.backend.devices import select_cuda_device
from distcomm.backend.engine import INTERNAL_TAG, PLANNED, CallKind, Engine, NotPlanned
from distcomm.backend.hooks import hookimpl, hookspec
from distcomm.backend.ports import free_port
from distcomm.backend.registry import PluginRecord, Registry
from distcomm.backend.specs import (
    ALL_DTYPES,
    DTYPE_NAMES,
    FLOAT_DTYPES,
    KIT_API,
    KIT_APIS,
    AdapterSpec,
    BackendSpec,
    Capabilities,
    EnvironmentSpec,
)
from distcomm.backend.work import AllOf, BaseWork, CompletedWork, EngineWork, WrappedWork
from distcomm.environment.info import LaunchInfo, read_int

__all__ = [
    "ALL_DTYPES",
    "AdapterSpec",
    "DTYPE_NAMES",
    "FLOAT_DTYPES",
    "INTERNAL_TAG",
    "KIT_API",
    "KIT_APIS",
    "PLANNED",
    "Adapter",
    "AllOf",
    "BackendSpec",
    "BaseCommunicator",
    "BaseWork",
    "CallKind",
    "Capabilities",
    "CompletedWork",
    "Engine",
    "EngineWork",
    "EnvironmentSpec",
    "LaunchInfo",
    "NotPlanned",
    "PluginRecord",
    "Registry",
    "WrappedWork",
    "abort_job",
    "abort_on_uncaught_exception",
    "add_last_words",
    "adapter_for",
    "as_torch",
    "free_port",
    "hookimpl",
    "hookspec",
    "last_words",
    "read_int",
    "select_cuda_device",
    "set_abort_notice",
]
