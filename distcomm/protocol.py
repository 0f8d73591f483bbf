"""The contracts of every communicator: :class:`Communicator`, :class:`Work` and :class:`ReduceOp`.

A backend's factory returns an engine (:mod:`distcomm.backend.engine`), and the kit's
:class:`distcomm.backend.BaseCommunicator` implements this protocol over it; the protocol is
what user code and the module-level functions rely on.

A communicator is used by one thread per rank.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from distcomm._operations import OPERATIONS
from distcomm.errors import InvalidArgumentError

if TYPE_CHECKING:
    import datetime

    from distcomm.environment.info import LaunchInfo
    from distcomm.meshes import Mesh

__all__ = [
    "ALL_DTYPES",
    "ALL_OPS",
    "DTYPE_NAMES",
    "FLOAT_DTYPES",
    "NON_MEMBER",
    "Capabilities",
    "Communicator",
    "NonMember",
    "P2POp",
    "ReduceOp",
    "Work",
]

#: Every dtype name distcomm accepts, on every backend (some engines bridge through wider types),
#: narrowest first.
DTYPE_NAMES: tuple[str, ...] = (
    "bool",
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
)
ALL_DTYPES = frozenset(DTYPE_NAMES)
FLOAT_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64"})
#: Every collective a Communicator offers.
ALL_OPS = frozenset(op.capability for op in OPERATIONS if op.capability)


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a backend does natively; the rest distcomm emulates or refuses.

    Attributes:
        ops: collectives the engine runs (see :data:`ALL_OPS`).
        dtypes: dtype names the engine reduces natively; others are bridged through wider types.
        reduce_ops: ReduceOp names the engine has; AVG is emulated with SUM where missing.
        async_ops: whether ``async_op=True`` overlaps with the caller (else it completes eagerly).
        timeouts: whether a blocked operation ends with DistTimeoutError.
        cancellable: whether a blocking call past its timeout can be given up (it raises
            DistTimeoutError); False for engines that cannot (MPI), where distcomm ends the
            job with the same diagnostic instead. ``Work.wait(timeout)`` raises either way.
        any_source: whether ``recv(src=None)`` is supported.
        p2p: whether point-to-point messages (send, recv, isend, irecv) exist at all.
        p2p_tags: whether the engine matches point-to-point messages by tag. Where it does not
            (NCCL ignores tags: a receive takes the next message from its sender, whatever its
            tag), a non-zero tag is refused with InvalidArgumentError instead of two messages
            being silently swapped; tag 0 works, messages matching in the order they are sent.
        subgroup_split: whether a sub-communicator can itself be split (``new_group(...,
            group=g)``, ``g.split``); engines whose groups are made by the whole world cannot.
        node_memory: whether CPU tensors and large object payloads may go through node
            memory when every rank of a group is a process of one node (docs/backends.md,
            "Node memory"); False where the engine has a shared-memory path of its own (MPI's:
            a 16 MiB broadcast_object at 2 ranks took 2.5 ms through it, 3.9 ms through node
            memory).
    """

    ops: frozenset[str] = ALL_OPS
    dtypes: frozenset[str] = ALL_DTYPES
    reduce_ops: frozenset[str] = frozenset(
        {"SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR"}
    )
    async_ops: bool = True
    timeouts: bool = True
    cancellable: bool = True
    any_source: bool = True
    p2p: bool = True
    p2p_tags: bool = True
    subgroup_split: bool = True
    node_memory: bool = True


class ReduceOp(enum.Enum):
    """Reduction operations. Accepted wherever an op is: a member, its name in any case
    (``"sum"``, ``"SUM"``, ``"Max"``), its value (``"product"``, ``"avg"``, ``"band"``, ...),
    the aliases ``"prod"`` (PRODUCT), ``"mean"`` and ``"average"`` (AVG), or a
    ``torch.distributed.ReduceOp`` member of those names (recognised without importing torch).
    Anything else raises InvalidArgumentError (a ValueError) listing the valid ops;
    ``ReduceOp.coerce(op)`` performs the same conversion.

    AVG works on every backend: an engine without a native average gets SUM, and distcomm
    then divides by the world size. AVG needs a floating-point dtype, and BAND, BOR and BXOR
    an integer or bool dtype: any other combination raises InvalidArgumentError, which names
    the dtype. On bools, SUM, MAX and BOR mean logical or; PRODUCT, MIN and BAND logical and;
    BXOR logical xor.
    """

    SUM = "sum"
    PRODUCT = "product"
    MIN = "min"
    MAX = "max"
    AVG = "avg"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"

    @classmethod
    def coerce(cls, op: object) -> ReduceOp:
        """Convert any accepted spelling of an op to a member.

        Raises:
            InvalidArgumentError: ``op`` is not a reduction op; the message lists the valid ones.
        """
        if isinstance(op, cls):
            return op
        if isinstance(op, str):
            key = op.strip().lower()
            found = _OP_NAMES.get(key)
            if found is not None:
                return found
        else:
            # torch.distributed.ReduceOp members (and RedOpType) print as "ReduceOp.SUM" or
            # "RedOpType.SUM"; recognise them without importing torch.
            cls_name = type(op).__name__
            if cls_name in ("ReduceOp", "RedOpType"):
                found = _OP_NAMES.get(str(op).rsplit(".", 1)[-1].lower())
                if found is not None:
                    return found
        from distcomm.errors import did_you_mean

        # Built from _OP_NAMES, so that the message lists every spelling accepted above.
        valid = ", ".join(m.name for m in cls)
        aliases = ", ".join(
            f"{alias!r} ({member.name})"
            for alias, member in _OP_NAMES.items()
            if alias != member.name.lower()
        )
        close = did_you_mean(op.strip(), _OP_NAMES) if isinstance(op, str) else ""
        hint = close or "e.g. op=distcomm.ReduceOp.SUM or op='sum'."
        raise InvalidArgumentError(
            f"unknown reduce op {op!r}; valid ops: {valid}, given as a distcomm.ReduceOp "
            f"member, by name in any case ('sum', 'SUM'), by the aliases {aliases}, or as a "
            f"torch.distributed.ReduceOp member of those names. HINT: {hint}"
        )


_OP_NAMES: dict[str, ReduceOp] = {m.name.lower(): m for m in ReduceOp}
_OP_NAMES.update({m.value: m for m in ReduceOp})
_OP_NAMES.update({"prod": ReduceOp.PRODUCT, "mean": ReduceOp.AVG, "average": ReduceOp.AVG})


class NonMember:
    """What :func:`distcomm.new_group` and ``split`` return on ranks outside the new group.

    It is falsy, and any collective given it as ``group=`` raises a clear error instead of
    silently running on the whole world.
    """

    _instance: NonMember | None = None

    def __new__(cls) -> NonMember:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "distcomm.NON_MEMBER"

    def __reduce__(self) -> str:
        return "NON_MEMBER"


NON_MEMBER = NonMember()

#: The kinds of message a :class:`P2POp` may be, by the name of its ``op``.
P2P_KINDS = ("isend", "irecv")


@dataclasses.dataclass(frozen=True)
class P2POp:
    """One message of :func:`distcomm.batch_isend_irecv`, as torch's ``P2POp``.

    Attributes:
        op: ``distcomm.isend`` or ``distcomm.irecv``, their names as strings, or torch's
            ``torch.distributed.isend`` / ``irecv`` (a drop-in for code written for torch).
        tensor: the message (isend) or the buffer (irecv).
        peer: the rank sent to or received from, a rank of ``group``.
        group: the communicator; None: the default one (every op of a batch on one
            communicator).
        tag: an int in ``[0, 2**30)``, the same on both sides.
    """

    op: Any
    tensor: Any
    peer: int
    group: Any = None
    tag: int = 0

    @property
    def kind(self) -> str:
        """``"isend"`` or ``"irecv"``.

        Raises:
            InvalidArgumentError: ``op`` is neither.
        """
        name = self.op if isinstance(self.op, str) else getattr(self.op, "__name__", None)
        if name not in P2P_KINDS:
            raise InvalidArgumentError(
                f"P2POp(op={self.op!r}) is not a kind of message: valid: distcomm.isend, "
                "distcomm.irecv (or torch.distributed's, or the strings 'isend', 'irecv'). "
                "HINT: P2POp(distcomm.isend, tensor, peer) sends, P2POp(distcomm.irecv, "
                "buffer, peer) receives."
            )
        return str(name)


"""What ``new_group`` and ``split`` return on ranks outside the new group. It is falsy, so
``if group:`` tells whether this rank is a member; passing it as ``group=`` raises
InvalidArgumentError instead of silently using the whole world."""


@runtime_checkable
class Work(Protocol):
    """A handle on an asynchronous operation (``async_op=True``, ``isend``, ``irecv``).

    A Work owns everything the engine may still touch until the operation completes (see
    "Work" in the API reference). Call ``wait()``, or see ``is_completed()`` return True,
    from the rank's own thread before reading the result: where distcomm had to copy the
    tensor (non-contiguous, staged or bridged), the first of the two to see the operation
    complete copies the result back into it.

    Attributes:
        op: the operation's name, e.g. ``"all_reduce"``.
        seq: the operation's sequence number on its communicator; None for point-to-point
            messages.
        source: on an ``irecv``'s Work only: the sender's rank, once the Work completes.
    """

    def wait(self, timeout: float | datetime.timedelta | None = None) -> bool:
        """Block until the operation completes; return True.

        Args:
            timeout: seconds to wait (or a ``datetime.timedelta``, as torch's Work takes);
                default: the communicator's timeout.

        Raises:
            DistTimeoutError: it did not complete within ``timeout`` seconds; the message
                names the timeout waited (``wait(timeout=0.5)``: "did not complete within
                0.5 s"). The Work then keeps its buffers until the process exits (the engine
                may still write into them), and the communicator can no longer be used.
        """
        ...

    def is_completed(self) -> bool:
        """Return whether the operation has completed, without blocking."""
        ...


@runtime_checkable
class Communicator(Protocol):
    """A group of ranks and the collectives over it.

    Ranks (``src``, ``dst``, ``recv``'s return value) are always ranks of this communicator;
    ``global_ranks[r]`` maps rank ``r`` to the world. ``native`` is the engine's own handle.
    Tensor arguments are torch tensors or numpy arrays; collectives are in place, as in
    torch.distributed, and return None, or a ``Work`` when ``async_op=True``.

    Its methods are the module-level functions without their ``group`` argument
    (``comm.all_reduce(tensor, op, async_op)``), plus ``split``. ``init()`` returns the default
    one; ``new_group`` and ``split`` make more, and those can be split again.
    """

    @property
    def rank(self) -> int:
        """This rank's position in the communicator."""
        ...

    @property
    def world_size(self) -> int:
        """The number of ranks of the communicator."""
        ...

    @property
    def global_ranks(self) -> tuple[int, ...]:
        """The world rank of each member: ``global_ranks.index(world_rank)`` maps back."""
        ...

    @property
    def backend(self) -> str:
        """The backend's name, e.g. ``"gloo"``."""
        ...

    @property
    def native(self) -> Any:
        """The engine's own handle, for code that needs it (DDP's ``process_group=``): a torch
        ``ProcessGroup`` on gloo and nccl, an mpi4py ``Comm`` on mpi, the in-process fabric on
        fakelink."""
        ...

    @property
    def launch(self) -> LaunchInfo:
        """How the job was launched (the detected launch, with ``init``'s overrides)."""
        ...

    @property
    def capabilities(self) -> Capabilities:
        """What the engine does natively (the rest is emulated): a
        ``distcomm.backend.Capabilities`` (docs/backends.md)."""
        ...

    def all_reduce(self, tensor: Any, op: Any = ReduceOp.SUM, async_op: bool = False) -> Any: ...
    def all_reduce_coalesced(
        self, tensors: Sequence[Any], op: Any = ReduceOp.SUM, bucket_bytes: int = ...
    ) -> None: ...
    def broadcast(self, tensor: Any, src: int = 0, async_op: bool = False) -> Work | None: ...
    def reduce(
        self, tensor: Any, dst: int = 0, op: Any = ReduceOp.SUM, async_op: bool = False
    ) -> Work | None: ...
    def all_gather(
        self, tensor_list: list[Any], tensor: Any, async_op: bool = False
    ) -> Work | None: ...
    def all_gather_into_tensor(
        self, output_tensor: Any, input_tensor: Any, async_op: bool = False
    ) -> Work | None: ...
    def reduce_scatter_tensor(
        self, output: Any, input: Any, op: Any = ReduceOp.SUM, async_op: bool = False
    ) -> Work | None: ...
    def gather(
        self,
        tensor: Any,
        gather_list: list[Any] | None = None,
        dst: int = 0,
        async_op: bool = False,
    ) -> Work | None: ...
    def scatter(
        self,
        tensor: Any,
        scatter_list: list[Any] | None = None,
        src: int = 0,
        async_op: bool = False,
    ) -> Work | None: ...
    def all_to_all_single(
        self,
        output: Any,
        input: Any,
        output_split_sizes: Sequence[int] | None = None,
        input_split_sizes: Sequence[int] | None = None,
        async_op: bool = False,
    ) -> Work | None: ...
    def all_to_all(
        self, output_list: list[Any], input_list: list[Any], async_op: bool = False
    ) -> Work | None: ...
    def reduce_scatter(
        self, output: Any, input_list: list[Any], op: Any = ReduceOp.SUM, async_op: bool = False
    ) -> Work | None: ...
    def all_gather_v(self, tensor: Any, sizes: list[int] | None = None) -> list[Any]: ...
    def send(self, tensor: Any, dst: int, tag: int = 0) -> None: ...
    def recv(self, tensor: Any, src: int | None = None, tag: int = 0) -> int: ...
    def isend(self, tensor: Any, dst: int, tag: int = 0) -> Work: ...
    def irecv(self, tensor: Any, src: int | None = None, tag: int = 0) -> Work: ...
    def batch_isend_irecv(self, ops: Sequence[P2POp]) -> list[Work]: ...
    def send_object(self, obj: Any, dst: int, tag: int = 0) -> None: ...
    def recv_object(self, src: int | None = None, tag: int = 0) -> Any: ...
    def barrier(self, async_op: bool = False) -> Work | None: ...

    def broadcast_object(self, obj: Any, src: int = 0) -> Any: ...
    def all_gather_object(self, obj: Any) -> list[Any]: ...
    def gather_object(self, obj: Any, dst: int = 0) -> list[Any] | None: ...
    def scatter_object(self, objs: Sequence[Any] | None, src: int = 0) -> Any: ...
    def assert_same(self, x: Any, what: str = "") -> None: ...

    def new_group(self, ranks: Sequence[int]) -> Communicator | NonMember: ...
    def split(self, color: int | None, key: int | None = None) -> Communicator | NonMember:
        """Split into groups by ``color``; collective over this communicator.

        Ranks with the same ``color`` form one group. Within a group, members are ordered by
        ``key``, ties broken by rank in this communicator (the default key).

        Args:
            color: a non-negative int; None: this rank joins no group.
            key: the order within the group; default: this rank.

        Returns:
            The new communicator on its members; ``NON_MEMBER`` on a rank whose ``color`` is
            None.
        """
        ...

    def split_group(self, split_ranks: Sequence[Sequence[int]]) -> Communicator | NonMember: ...
    def new_subgroups(self, group_size: int) -> Communicator: ...
    def mesh(self, shape: Sequence[int], names: Sequence[str]) -> Mesh: ...

    def finalize(self) -> None: ...
