"""``all_reduce_coalesced``: many tensors in a few engine calls.

The tensors are grouped by array library, dtype and device (in their order of first appearance),
each group cut into buckets of at most ``bucket_bytes`` (a larger tensor is a bucket of its own),
and each bucket all-reduced with one :meth:`all_reduce` (so that each bucket is checked, staged,
bridged and seen by hooks like any all-reduce):

- in place, with no copy, when its torch tensors are consecutive contiguous views of one buffer
  (as ``flat.split(sizes)`` makes them, or DDP's ``gradient_as_bucket_view``);
- else flattened into a scratch buffer kept between calls (one vectorised copy: ``torch.cat`` or
  ``numpy.concatenate``) and copied back (torch: the scratch's views shaped as the tensors, cut
  once and kept while the bucket's shapes repeat, and one ``torch._foreach_copy_``; numpy: one
  copy per array).

Every rank must pass tensors of the same dtypes and sizes in the same order: the buckets, and so
the all-reduces, then match (one rank's views and another's separate tensors match too).
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

from distcomm._operations import DEFAULT_BUCKET_BYTES
from distcomm.backend._pipeline.arguments import read_only
from distcomm.backend._pipeline.steps import Steps
from distcomm.backend.arrays import adapter_for
from distcomm.errors import InvalidArgumentError
from distcomm.protocol import ReduceOp

__all__ = ["Coalesced"]


class Coalesced(Steps):
    """all_reduce_coalesced (module docstring)."""

    #: The flattening buffers, by (library, dtype, device); made at the first use.
    _scratches: dict[Any, Any] | None = None
    #: The last bucket's views of its scratch buffer, by (library, dtype, device), while its
    #: shapes repeat (:class:`_Pieces`).
    _pieces: dict[Any, _Pieces] | None = None

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
        with _collector_paused():
            for key, bucket, numels in _buckets(tensors, bucket_bytes):
                if len(bucket) == 1:
                    self.all_reduce(bucket[0], op)  # type: ignore[attr-defined]
                    continue
                span = _span(bucket, numels)
                if span is not None:  # views of one buffer: reduced where they are
                    self.all_reduce(span, op)  # type: ignore[attr-defined]
                    continue
                flat = self._scratch(key, bucket[0], sum(numels))
                pieces = self._cut(key, flat, bucket, numels)
                _flatten(bucket, flat, pieces)
                self.all_reduce(flat, op)  # type: ignore[attr-defined]
                _unflatten(flat, bucket, numels, pieces)

    def _scratch(self, key: Any, like: Any, numel: int) -> Any:
        """A 1-D buffer of ``numel`` elements like ``like``'s, kept per (library, dtype,
        device) between calls: fresh memory costs page faults on every call (about 0.6 ms per
        MiB here)."""
        if self._scratches is None:
            self._scratches = {}
        kept = self._scratches.get(key)
        if kept is None or len(kept) < numel:
            kept = self._scratches[key] = _empty_like(like, numel)
        return kept[:numel]

    def _cut(self, key: Any, flat: Any, bucket: list[Any], numels: list[int]) -> _Pieces | None:
        """torch: ``flat``'s views shaped as the bucket's tensors, kept per key while the same
        scratch memory and shapes come back (cutting 1000 views costs about 1 ms here, as much as
        the copies); None for numpy."""
        if not _is_torch(flat):
            return None
        if self._pieces is None:
            self._pieces = {}
        shapes = [t.shape for t in bucket]
        kept = self._pieces.get(key)
        if kept is not None and kept.ptr == flat.data_ptr() and kept.shapes == shapes:
            return kept
        views = flat.split_with_sizes(numels)  # 1-D views, cut in C++
        flat_only = all(len(s) == 1 for s in shapes)
        if not flat_only:
            views = [v if len(s) == 1 else v.view(s) for v, s in zip(views, shapes, strict=True)]
        kept = self._pieces[key] = _Pieces(flat.data_ptr(), shapes, views, flat_only)
        return kept


class _Pieces(NamedTuple):
    """A scratch buffer's views, shaped as a bucket's tensors: where the buffer starts, the
    shapes, the views, whether all are 1-D."""

    ptr: int
    shapes: list[Any]
    views: list[Any]
    flat_only: bool


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the call: the views made here (one or two
    per tensor) die by reference count, but their number alone would start collections, which
    cost 40% of the call at 1000 tensors here. Back on after, if it was on."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _buckets(tensors: Sequence[Any], limit: int) -> list[tuple[Any, list[Any], list[int]]]:
    """The tensors grouped by (library, dtype, device), each group cut into buckets:
    ``(key, tensors, their numbers of elements)``."""
    groups = _one_group(tensors) or _groups(tensors)
    buckets: list[tuple[Any, list[Any], list[int]]] = []
    for key, (itemsize, members, numels) in groups.items():
        most = max(1, limit // itemsize)
        start, count = 0, 0
        for i, numel in enumerate(numels):
            if count and count + numel > most:
                buckets.append((key, members[start:i], numels[start:i]))
                start, count = i, 0
            count += numel
        buckets.append((key, members[start:], numels[start:]))
    return buckets


_Groups = dict[Any, tuple[int, list[Any], list[int]]]


def _one_group(tensors: Sequence[Any]) -> _Groups | None:
    """The common case at a few C calls per tensor: torch tensors of one dtype on one device,
    or numpy arrays of one dtype. None otherwise."""
    if not tensors:
        return None
    torch, numpy = sys.modules.get("torch"), sys.modules.get("numpy")
    classes = {t.__class__ for t in tensors}  # (sets of one attribute: tuples cost twice)
    if numpy is not None and classes == {numpy.ndarray}:
        dtypes = {t.dtype for t in tensors}
        if len(dtypes) != 1 or not all(t.flags.writeable for t in tensors):
            return None  # (_groups names a read-only one)
        dtype = dtypes.pop()
        return {("numpy", dtype.str): (dtype.itemsize, list(tensors), [t.size for t in tensors])}
    if torch is None or not all(issubclass(c, torch.Tensor) for c in classes):
        return None
    dtypes = {t.dtype for t in tensors}
    devices = {t.get_device() for t in tensors}  # -1: the CPU
    if len(dtypes) != 1 or len(devices) != 1:
        return None
    key = (dtypes.pop(), devices.pop())
    return {key: (tensors[0].element_size(), list(tensors), [t.numel() for t in tensors])}


def _groups(tensors: Sequence[Any]) -> _Groups:
    """Any mix: each tensor's group found in turn."""
    groups: _Groups = {}
    numpy = sys.modules.get("numpy")
    torch = sys.modules.get("torch")
    ndarray = None if numpy is None else numpy.ndarray
    tensor_type = None if torch is None else torch.Tensor
    for index, tensor in enumerate(tensors):
        if tensor.__class__ is ndarray:  # the common cases without the adapter: a few attributes
            if not tensor.flags.writeable:
                raise read_only(f"tensors[{index}]")
            key: Any = ("numpy", tensor.dtype.str)
            numel = tensor.size
        elif tensor_type is not None and isinstance(tensor, tensor_type):
            key = (tensor.dtype, tensor.get_device())
            numel = tensor.numel()
        else:
            adapter = adapter_for(tensor, f"tensors[{index}]")
            if not adapter.is_writable(tensor):
                raise read_only(f"tensors[{index}]")
            key = (adapter.kind, adapter.dtype(tensor), adapter.device(tensor))
            numel = adapter.numel(tensor)
        group = groups.get(key)
        if group is None:
            itemsize = tensor.itemsize if key[0] == "numpy" else tensor.element_size()
            group = groups[key] = (itemsize, [], [])
        group[1].append(tensor)
        group[2].append(numel)
    return groups


def _is_torch(tensor: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(tensor, torch.Tensor)


def _empty_like(tensor: Any, numel: int) -> Any:
    if _is_torch(tensor):
        return tensor.new_empty(numel)
    return sys.modules["numpy"].empty(numel, dtype=tensor.dtype)


def _span(bucket: list[Any], numels: list[int]) -> Any:
    """A 1-D view of the memory of ``bucket``'s torch tensors when they are consecutive
    contiguous views of one contiguous buffer of their dtype, in order; None otherwise (at the
    first tensor for tensors that own their memory). (The group is one dtype and device.)"""
    first = bucket[0]
    base = getattr(first, "_base", None)
    if (
        base is None
        or base.requires_grad  # a parameter's views: copied under no_grad instead
        or base.dtype != first.dtype
        or not base.is_contiguous()
    ):
        return None
    itemsize = first.element_size()
    start = address = first.data_ptr()
    for tensor, numel in zip(bucket, numels, strict=True):
        if tensor.data_ptr() != address or not tensor.is_contiguous():
            return None
        address += numel * itemsize
    # Contiguous and end to end from inside ``base``: within it, they are its memory.
    offset = (start - base.data_ptr()) // itemsize
    end = offset + (address - start) // itemsize
    return None if end > base.numel() else base.view(-1)[offset:end]


def _flatten(bucket: list[Any], flat: Any, pieces: _Pieces | None) -> None:
    """The bucket's tensors end to end in ``flat`` (one vectorised copy): torch's concatenated
    when all are 1-D, else copied into ``pieces``, its views shaped as the tensors."""
    if pieces is not None:
        torch = sys.modules["torch"]
        with torch.no_grad():
            if pieces.flat_only:
                torch.cat(bucket, out=flat)
            else:
                torch._foreach_copy_(pieces.views, bucket)
        return
    numpy = sys.modules["numpy"]
    numpy.concatenate([t if t.ndim == 1 else t.reshape(-1) for t in bucket], out=flat)


def _unflatten(flat: Any, bucket: list[Any], numels: list[int], pieces: _Pieces | None) -> None:
    """Copy the reduced ``flat`` back into the bucket's tensors (torch: one C++ call from
    ``pieces``, its views shaped as the tensors)."""
    if pieces is not None:
        torch = sys.modules["torch"]
        with torch.no_grad():
            torch._foreach_copy_(bucket, pieces.views)
        return
    offset = 0
    for tensor, numel in zip(bucket, numels, strict=True):
        tensor[...] = flat[offset : offset + numel].reshape(tensor.shape)
        offset += numel
