"""Every operation of distcomm, declared once: what the rest of the code lists is derived here.

An :class:`Operation` says, for one method of a communicator (and function of ``distcomm``):
its name in ``Capabilities.ops`` (the native/emulated split a backend declares), whether the
hooks, the profiler and the flight recorder see it, whether each rank holds a share of the
buffer (nccl-tests' bus bandwidth factor), and its name in ``distcomm bench``. From the table
come ``distcomm.backend.specs.ALL_OPS``, the observed methods
(``distcomm.backend._pipeline.observing.OBSERVED``), the bus bandwidth factors
(:mod:`distcomm._measures`), bench's operations and the module-level functions of
``distcomm._runtime.collectives``; tests keep ``distcomm.__all__``, the ``Communicator``
protocol and ``BaseCommunicator`` in step with it. docs/architecture.md ("Add an operation")
lists the files a new operation touches.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_BUCKET_BYTES", "OPERATIONS", "Operation", "named"]

#: all_reduce_coalesced's default size of a bucket: 25 MiB, as torch's DDP.
DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024


@dataclass(frozen=True)
class Operation:
    """One operation.

    Attributes:
        name: the communicator's method and ``distcomm``'s function.
        capability: its name in ``Capabilities.ops`` ("" for distcomm's own, on every backend).
        observed: the hooks (``distcomm.add_hook``), the profiler and the flight recorder see it.
        shared: each rank holds 1/n of the operation's buffer (gathers, scatters, all-to-all).
        bench: its name in ``distcomm bench`` ("" when bench does not time it; send's is
            ``sendrecv``, a ping-pong of send and recv between ranks 0 and 1).
        module_function: ``distcomm`` has a function of that name acting on a group.
    """

    name: str
    capability: str
    observed: bool = False
    shared: bool = False
    bench: str = ""
    module_function: bool = True

    @property
    def objects(self) -> bool:
        """Whether it moves Python objects (pickled) rather than arrays."""
        return self.capability == "objects"


OPERATIONS: tuple[Operation, ...] = (
    Operation("all_reduce", "all_reduce", observed=True, bench="all_reduce"),
    Operation("all_reduce_coalesced", "all_reduce"),
    Operation("broadcast", "broadcast", observed=True, bench="broadcast"),
    Operation("reduce", "reduce", observed=True, bench="reduce"),
    Operation("all_gather", "all_gather", observed=True, shared=True),
    Operation(
        "all_gather_into_tensor",
        "all_gather_into_tensor",
        observed=True,
        shared=True,
        bench="all_gather",
    ),
    Operation(
        "reduce_scatter_tensor",
        "reduce_scatter_tensor",
        observed=True,
        shared=True,
        bench="reduce_scatter",
    ),
    Operation(
        "all_to_all_single", "all_to_all_single", observed=True, shared=True, bench="all_to_all"
    ),
    Operation("all_to_all", "all_to_all_single", shared=True),
    Operation("reduce_scatter", "reduce_scatter_tensor", observed=True, shared=True),
    Operation("all_gather_v", "all_gather_into_tensor", observed=True, shared=True),
    Operation("gather", "gather", observed=True, shared=True, bench="gather"),
    Operation("scatter", "scatter", observed=True, shared=True, bench="scatter"),
    Operation("barrier", "barrier", observed=True, bench="barrier"),
    Operation("send", "send", bench="sendrecv"),  # bench: a ping-pong of send and recv
    Operation("recv", "recv"),
    Operation("isend", "send"),
    Operation("irecv", "recv"),
    Operation("batch_isend_irecv", "send"),
    Operation("send_object", "send"),
    Operation("recv_object", "recv"),
    Operation(
        "all_gather_object", "objects", observed=True, shared=True, bench="all_gather_object"
    ),
    Operation("broadcast_object", "objects", observed=True, bench="broadcast_object"),
    Operation("gather_object", "objects", observed=True, shared=True, bench="gather_object"),
    Operation("scatter_object", "objects", observed=True, shared=True, bench="scatter_object"),
    Operation("assert_same", "", observed=True),
    Operation("new_group", "new_group"),
    Operation("split", "split", module_function=False),
    Operation("split_group", "split"),
    Operation("new_subgroups", "split"),
    Operation("mesh", "split"),
)


def named(**where: bool) -> tuple[str, ...]:
    """The names of the operations whose attributes are as given, in table order:
    ``named(observed=True)``."""
    return tuple(
        op.name
        for op in OPERATIONS
        if all(getattr(op, key) == value for key, value in where.items())
    )
