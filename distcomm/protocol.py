"""The contracts every backend meets: :class:`Communicator`, :class:`Work` and :class:`ReduceOp`.

A backend returns an object satisfying :class:`Communicator` from its factory. Most backends derive
from :class:`distcomm.backend.BaseCommunicator`, which implements this protocol over a few engine
primitives; the protocol is what user code and the module-level functions rely on.

A communicator is used by one thread per rank.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from distcomm.errors import InvalidArgumentError

if TYPE_CHECKING:
    from distcomm.backend.specs import Capabilities
    from distcomm.environment import LaunchInfo

__all__ = ["NON_MEMBER", "Communicator", "NonMember", "ReduceOp", "Work"]


class ReduceOp(enum.Enum):
    """Reduction operations. Accepted wherever an op is: a member, its name in any case, the
    aliases ``"prod"`` (PRODUCT), ``"mean"`` and ``"average"`` (AVG), or a
    ``torch.distributed.ReduceOp`` member of those names."""

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


@runtime_checkable
class Work(Protocol):
    """A handle on an asynchronous operation (``async_op=True``, ``isend``, ``irecv``)."""

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the operation completes; return True.

        Raises:
            DistTimeoutError: it did not complete within ``timeout`` seconds (default: the
                communicator's timeout).
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
    torch.distributed, and return None, or a :class:`Work` when ``async_op=True``.
    """

    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def global_ranks(self) -> tuple[int, ...]: ...
    @property
    def backend(self) -> str: ...
    @property
    def native(self) -> Any: ...
    @property
    def launch(self) -> LaunchInfo: ...
    @property
    def capabilities(self) -> Capabilities:
        """What the engine does natively (the rest is emulated)."""
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
    def all_to_all_single(self, output: Any, input: Any, async_op: bool = False) -> Work | None: ...
    def send(self, tensor: Any, dst: int, tag: int = 0) -> None: ...
    def recv(self, tensor: Any, src: int | None = None, tag: int = 0) -> int: ...
    def isend(self, tensor: Any, dst: int, tag: int = 0) -> Work: ...
    def irecv(self, tensor: Any, src: int | None = None, tag: int = 0) -> Work: ...
    def barrier(self, async_op: bool = False) -> Work | None: ...

    def broadcast_object(self, obj: Any, src: int = 0) -> Any: ...
    def all_gather_object(self, obj: Any) -> list[Any]: ...
    def gather_object(self, obj: Any, dst: int = 0) -> list[Any] | None: ...
    def scatter_object(self, objs: Sequence[Any] | None, src: int = 0) -> Any: ...
    def assert_same(self, x: Any, what: str = "") -> None: ...

    def new_group(self, ranks: Sequence[int]) -> Communicator | NonMember: ...
    def split(self, color: int | None, key: int | None = None) -> Communicator | NonMember: ...
    def finalize(self) -> None: ...
