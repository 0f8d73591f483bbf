"""Module-level list forms (torch's ``all_to_all`` and ``reduce_scatter``) and the uneven
all-gather ``all_gather_v``: the default communicator's, or ``group=``'s.
"""

from __future__ import annotations

from typing import Any

from distcomm._runtime.collectives import resolve_group
from distcomm.protocol import ReduceOp, Work

__all__ = ["all_gather_v", "all_to_all", "reduce_scatter"]


def all_to_all(
    output_list: list[Any], input_list: list[Any], group: Any = None, async_op: bool = False
) -> Work | None:
    """``input_list[r]`` goes to rank r; ``output_list[s]`` receives what rank s sent this rank.

    torch's list form. The tensors may differ in size (what rank r sends s must have as many
    elements as s's ``output_list[r]``); they travel as one uneven all-to-all, copied into one
    buffer and out of it.

    Args:
        output_list: world_size tensors, received into.
        input_list: world_size tensors of one dtype, sent.
        group: the communicator (one from ``new_group`` or ``split``); None: the default one.
        async_op: return a Work at once; ``output_list`` is filled when it completes.
    """
    return resolve_group(group).all_to_all(output_list, input_list, async_op)


def reduce_scatter(
    output: Any,
    input_list: list[Any],
    op: Any = ReduceOp.SUM,
    group: Any = None,
    async_op: bool = False,
) -> Work | None:
    """Reduce ``input_list[r]`` across ranks into rank r's ``output`` (torch's list form of
    ``reduce_scatter_tensor``).

    The entries may differ in size: this is also torchcomms' ``reduce_scatter_v``, rank r's
    ``output`` having ``input_list[r]``'s size (every rank passes the same sizes, which the
    mismatch check compares). Entries of one size are one ``reduce_scatter_tensor``; others
    one uneven reduce-scatter (mpi: ``Reduce_scatter``; elsewhere of chunks padded to the
    largest).

    Args:
        output: this rank's result, with ``input_list[rank]``'s element count and dtype.
        input_list: world_size tensors of ``output``'s dtype, entry r reduced into rank r's
            ``output``.
        op: a ReduceOp or any spelling it accepts; default SUM.
        group: the communicator (one from ``new_group`` or ``split``); None: the default one.
        async_op: return a Work at once instead of waiting for the result.

    Raises:
        InvalidArgumentError: ``input_list`` is not world_size tensors of ``output``'s kind and
            dtype, or ``output`` does not have this rank's entry's element count.
        CollectiveMismatchError: ranks passed entries of different sizes (when the check runs).
    """
    return resolve_group(group).reduce_scatter(output, input_list, op, async_op)


def all_gather_v(tensor: Any, sizes: list[int] | None = None, group: Any = None) -> list[Any]:
    """Every rank's ``tensor``, whose first dimension may differ from rank to rank, unpadded.

    torchcomms' ``all_gather_v`` and Ignite's ``all_gather_tensors_with_shapes`` in one call:
    the rows of each rank's tensor are given (``sizes``) or found with one exchange of shapes;
    the tensors travel as one variable-size all-gather (mpi: ``Allgatherv``; elsewhere of
    chunks padded to the largest) and come back as views of one buffer, each with its own
    rank's shape. Every rank passes the same ``sizes``: the mismatch check compares them.

    Args:
        tensor: this rank's torch tensor or numpy array (at least one dimension); the
            dimensions after the first are the same on every rank.
        sizes: the rows of every rank's tensor, when every rank knows them; None: found.
        group: the communicator (one from ``new_group`` or ``split``); None: the default one.

    Returns:
        world_size tensors of ``tensor``'s kind and dtype, in rank order.

    Raises:
        InvalidArgumentError: ``sizes`` that are not one non-negative int per rank or do not
            match this rank's tensor, or tensors that differ beyond the first dimension.
        CollectiveMismatchError: ranks passed different ``sizes`` (when the check runs).
    """
    return resolve_group(group).all_gather_v(tensor, sizes)
