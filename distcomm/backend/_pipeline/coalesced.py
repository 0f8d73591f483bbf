"""``all_reduce_coalesced``: many tensors in a few engine calls.

The tensors are grouped by array library, dtype and device (in their order of first appearance),
each group cut into buckets of at most ``bucket_bytes`` (a larger tensor is a bucket of its own),
and each bucket flattened into one contiguous buffer (one vectorised copy: ``torch.cat`` or
``numpy.concatenate``), all-reduced with one :meth:`all_reduce` (so that each bucket is checked,
staged, bridged and seen by hooks like any all-reduce), and copied back (torch: ``torch.split``,
a view per tensor of more than one dimension, one ``torch._foreach_copy_``; numpy: one copy per
array). Every rank must pass tensors
of the same dtypes and sizes in the same order: the buckets, and so the all-reduces, then match.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from distcomm.backend._pipeline.steps import Steps
from distcomm.backend.arrays import adapter_for
from distcomm.errors import InvalidArgumentError
from distcomm.protocol import ReduceOp

__all__ = ["DEFAULT_BUCKET_BYTES", "Coalesced"]

#: The default size of a bucket: 25 MiB, as torch's DDP.
DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024


class Coalesced(Steps):
    """all_reduce_coalesced (module docstring)."""

    def all_reduce_coalesced(
        self,
        tensors: Sequence[Any],
        op: Any = ReduceOp.SUM,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    ) -> None:
        """Reduce every tensor of ``tensors`` across ranks, in place, in a few engine calls.

        Args:
            tensors: torch tensors and numpy arrays, of any dtypes and shapes (the same on every
                rank, in the same order).
            op: the reduce op, as for :meth:`all_reduce`.
            bucket_bytes: the most bytes one engine call carries (a larger tensor goes alone).

        Raises:
            InvalidArgumentError: ``tensors`` is not a list or tuple of tensors, or
                ``bucket_bytes`` is not a positive int.
        """
        self._check_usable()
        if not isinstance(tensors, (list, tuple)):
            raise InvalidArgumentError(
                "all_reduce_coalesced: tensors must be a list or tuple of tensors, got "
                f"{type(tensors).__name__}. HINT: pass list(model.parameters()) or a list of "
                "arrays."
            )
        if not isinstance(bucket_bytes, int) or isinstance(bucket_bytes, bool) or bucket_bytes < 1:
            raise InvalidArgumentError(
                f"all_reduce_coalesced: bucket_bytes={bucket_bytes!r} must be a positive int "
                f"(default {DEFAULT_BUCKET_BYTES}, 25 MiB). HINT: pass a number of bytes."
            )
        for bucket in _buckets(tensors, bucket_bytes):
            if len(bucket) == 1:
                self.all_reduce(bucket[0], op)  # type: ignore[attr-defined]
                continue
            flat = _flatten(bucket)
            self.all_reduce(flat, op)  # type: ignore[attr-defined]
            _unflatten(flat, bucket)


def _buckets(tensors: Sequence[Any], limit: int) -> list[list[Any]]:
    """The tensors grouped by (library, dtype, device), each group cut into buckets."""
    groups: dict[Any, list[tuple[Any, int]]] = {}
    numpy = sys.modules.get("numpy")
    torch = sys.modules.get("torch")
    ndarray = None if numpy is None else numpy.ndarray
    tensor_type = None if torch is None else torch.Tensor
    for index, tensor in enumerate(tensors):
        if tensor.__class__ is ndarray:  # the common cases without the adapter: a few attributes
            key: Any = ("numpy", tensor.dtype.str)
            nbytes = tensor.nbytes
        elif tensor_type is not None and isinstance(tensor, tensor_type):
            key = ("torch", tensor.dtype, tensor.get_device())  # device -1: the CPU
            nbytes = tensor.numel() * tensor.element_size()
        else:
            adapter = adapter_for(tensor, f"tensors[{index}]")
            key = (adapter.kind, adapter.dtype(tensor), adapter.device(tensor))
            nbytes = int(getattr(tensor, "nbytes", 0))
        groups.setdefault(key, []).append((tensor, nbytes))
    buckets: list[list[Any]] = []
    for group in groups.values():
        current: list[Any] = []
        size = 0
        for tensor, nbytes in group:
            if current and size + nbytes > limit:
                buckets.append(current)
                current, size = [], 0
            current.append(tensor)
            size += nbytes
        buckets.append(current)
    return buckets


def _is_torch(tensor: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(tensor, torch.Tensor)


def _flatten(bucket: list[Any]) -> Any:
    """One contiguous 1-D copy of the bucket's tensors, end to end (torch: in C++)."""
    if _is_torch(bucket[0]):
        torch = sys.modules["torch"]
        with torch.no_grad():
            return torch._C._nn.flatten_dense_tensors(bucket)
    numpy = sys.modules["numpy"]
    return numpy.concatenate([t.reshape(-1) for t in bucket])


def _unflatten(flat: Any, bucket: list[Any]) -> None:
    """Copy the reduced ``flat`` back into the bucket's tensors (torch: two C++ calls)."""
    if _is_torch(flat):
        torch = sys.modules["torch"]
        pieces = torch.split(flat, [t.numel() for t in bucket])  # 1-D views, cut in C++
        parts = [
            p if t.dim() == 1 else p.view(t.shape) for p, t in zip(pieces, bucket, strict=True)
        ]
        with torch.no_grad():
            torch._foreach_copy_(bucket, parts)
        return
    offset = 0
    for tensor in bucket:
        size = tensor.size
        tensor[...] = flat[offset : offset + size].reshape(tensor.shape)
        offset += size
