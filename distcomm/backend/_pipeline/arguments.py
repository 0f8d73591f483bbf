"""Argument checks of the public collectives: clear errors before any communication.

They raise locally, before the engine is called, so a bad argument on one rank never leaves the
others waiting inside a half-started collective.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from distcomm.backend.arrays import Adapter, adapter_for
from distcomm.backend.engine import INTERNAL_TAG
from distcomm.errors import InvalidArgumentError

__all__ = ["ArgumentChecks", "read_only"]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_only(what: str) -> InvalidArgumentError:
    """The error of an array the call would write its result into that may not be written
    (before, a torch engine wrote through it: a read-only memory map ended the process with
    SIGSEGV; mpi4py refused it with a BufferError of its own)."""
    return InvalidArgumentError(
        f"{what} is read-only (flags.writeable is False: a read-only memory map, np.frombuffer "
        "of bytes, a broadcast view), but the call writes its result into it. HINT: pass a "
        "writable array, such as a copy (x.copy())."
    )


class ArgumentChecks:
    """Mixin of BaseCommunicator: validation of ranks, tags, lists and tensor pairs."""

    _rank: int
    _world_size: int
    #: The engine's ``check_tag`` (None: it carries every tag the kit lets through).
    _engine_tag: Callable[[int], None] | None

    def describe(self) -> str:
        raise NotImplementedError

    def _check_rank(self, value: Any, name: str) -> None:
        if not _is_int(value) or not 0 <= value < self._world_size:
            raise InvalidArgumentError(
                f"{name}={value!r} is not a rank of {self.describe()}: valid ranks are 0.."
                f"{self._world_size - 1}. HINT: ranks are ranks of the communicator in use; "
                "map a world rank with comm.global_ranks.index(world_rank)."
            )

    def _check_tag(self, tag: Any) -> None:
        if not _is_int(tag) or not 0 <= tag < INTERNAL_TAG:
            raise InvalidArgumentError(
                f"tag={tag!r} must be an int in [0, {INTERNAL_TAG}) (larger tags are distcomm's). "
                "HINT: pass a small non-negative int, the same on the sender and the receiver."
            )
        if self._engine_tag is not None:
            self._engine_tag(tag)

    def _check_members(self, ranks: Sequence[int]) -> tuple[int, ...]:
        try:
            members = tuple(sorted(ranks))
        except TypeError:
            raise InvalidArgumentError(
                f"new_group: ranks {ranks!r} must be a sequence of ints. HINT: pass e.g. [0, 1]."
            ) from None
        valid = all(_is_int(r) and 0 <= r < self._world_size for r in members)
        if not members or len(set(members)) != len(members) or not valid:
            raise InvalidArgumentError(
                f"new_group: ranks {list(ranks)!r} must be distinct ranks of {self.describe()} "
                f"(0..{self._world_size - 1}), at least one. HINT: pass e.g. [0, 1]."
            )
        return members

    def _check_written(self, adapter: Adapter, x: Any, what: str) -> None:
        """Refuse ``x``, which the call writes its result into, where it may not be written."""
        if not adapter.is_writable(x):
            raise read_only(what)

    def _check_pair(
        self,
        x: Any,
        what: str,
        adapter: Adapter,
        dtype: str,
        numel: int | None,
        written: bool = False,
    ) -> None:
        if adapter_for(x, what).kind != adapter.kind:
            raise InvalidArgumentError(
                f"{what} must be the same kind of array as the input ({adapter.kind}). HINT: "
                "pass torch tensors everywhere or numpy arrays everywhere in one call."
            )
        other = adapter.dtype(x)
        if other != dtype:
            raise InvalidArgumentError(
                f"{what} has dtype {other!r} but the input has {dtype!r}. HINT: use one dtype."
            )
        if numel is not None and adapter.numel(x) != numel:
            raise self._size_error(what, adapter.numel(x), "", numel)
        if written:
            self._check_written(adapter, x, what)

    def _check_list(
        self,
        parts: Any,
        what: str,
        adapter: Adapter,
        dtype: str,
        numel: int | None,
        written: bool = False,
    ) -> None:
        if not isinstance(parts, (list, tuple)) or len(parts) != self._world_size:
            got = len(parts) if isinstance(parts, (list, tuple)) else type(parts).__name__
            raise InvalidArgumentError(
                f"{what} must be a list of {self._world_size} tensors (one per rank of "
                f"{self.describe()}), got {got!r}. "
                "HINT: [torch.empty_like(t) for _ in range(world_size)]."
            )
        for i, part in enumerate(parts):
            self._check_pair(part, f"{what}[{i}]", adapter, dtype, numel, written)

    def _check_root_list(
        self,
        parts: Any,
        what: str,
        root: int,
        root_name: str,
        adapter: Adapter,
        dtype: str,
        numel: int,
        written: bool = False,
    ) -> None:
        if self._rank == root:
            if parts is None:
                raise InvalidArgumentError(
                    f"{what} is required on {root_name}={root} (this rank). HINT: pass a list of "
                    f"{self._world_size} tensors like the input on the rank where rank == "
                    f"{root_name}, None elsewhere."
                )
            self._check_list(parts, what, adapter, dtype, numel, written)
        elif parts is not None:
            raise InvalidArgumentError(
                f"{what} must be None on rank {self._rank}: only {root_name}={root} passes it, "
                f"as in torch.distributed. HINT: pass it only where rank == {root_name}."
            )

    def _size_error(self, what: str, got: int, rule: str, expected: int) -> InvalidArgumentError:
        rule = f" ({rule})" if rule else ""
        return InvalidArgumentError(
            f"{what} has {got} elements; expected {expected}{rule} on {self.describe()}. "
            f"HINT: size {what} for {expected} elements; every rank passes the same sizes."
        )
