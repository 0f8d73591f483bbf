"""How :mod:`distcomm.workspace` turns values into bytes and back: tensors and arrays by their
memory (no pickling), other objects by pickle protocol 5 (out-of-band buffers)."""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import sys
from collections.abc import Callable
from typing import Any

from distcomm.backend._pipeline import object_transport as objects
from distcomm.errors import InvalidArgumentError

__all__ = ["OBJECTS", "TENSORS", "Codec", "copy"]


@dataclasses.dataclass(frozen=True)
class Codec:
    """How one kind of value becomes bytes and back.

    ``encode(value) -> (meta, bytes)``; ``allocate(meta, nbytes) -> (holder, writable bytes)``
    makes room the bytes are copied into, and ``finish(holder)`` is the value;
    ``from_buffer(meta, buffer)`` is the value over a buffer it keeps (a private mapping).
    """

    encode: Callable[[Any], tuple[Any, memoryview]]
    allocate: Callable[[Any, int], tuple[Any, memoryview]]
    finish: Callable[[Any], Any]
    from_buffer: Callable[[Any, Any], Any]


def copy(codec: Codec, value: Any) -> Any:
    meta, data = codec.encode(value)
    holder, view = codec.allocate(meta, data.nbytes)
    view[:] = data
    return codec.finish(holder)


def _encode_tensor(tensor: Any) -> tuple[Any, memoryview]:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(tensor, torch.Tensor):
        t = tensor.detach().cpu().contiguous()
        meta = ("torch", str(t.dtype).removeprefix("torch."), tuple(t.shape))
        return meta, _address_view(t, writable=False)
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(tensor, numpy.ndarray):
        if tensor.dtype.hasobject:
            raise InvalidArgumentError(
                f"a numpy array of dtype {tensor.dtype} holds Python objects, not data. "
                "HINT: use distcomm.workspace.gather_objects for it."
            )
        a = numpy.ascontiguousarray(tensor)
        return ("numpy", a.dtype.str, a.shape), a.reshape(-1).view(numpy.uint8).data
    raise InvalidArgumentError(
        f"tensor={type(tensor).__name__!r} is not a torch.Tensor or a numpy.ndarray. "
        "HINT: use distcomm.workspace.gather_objects for other values."
    )


def _allocate_tensor(meta: Any, nbytes: int) -> tuple[Any, memoryview]:
    kind, dtype, shape = meta
    if kind == "torch":
        import torch

        t = torch.empty(shape, dtype=getattr(torch, dtype))
        return t, _address_view(t, writable=True)
    import numpy

    a = numpy.empty(shape, dtype=numpy.dtype(dtype))
    return a, a.reshape(-1).view(numpy.uint8).data


def _tensor_from_buffer(meta: Any, buffer: Any) -> Any:
    kind, dtype, shape = meta
    if kind == "torch":
        import torch

        torch_dtype = getattr(torch, dtype)
        if not len(buffer):
            return torch.empty(shape, dtype=torch_dtype)
        return torch.frombuffer(buffer, dtype=torch_dtype).reshape(shape)
    import numpy

    return numpy.frombuffer(buffer, dtype=numpy.dtype(dtype)).reshape(shape)


def _address_view(tensor: Any, writable: bool) -> memoryview:
    """The bytes of a contiguous CPU torch tensor (kept alive by the view), without numpy."""
    if tensor.nbytes == 0:
        return memoryview(b"")
    array = (ctypes.c_char * tensor.nbytes).from_address(tensor.data_ptr())
    array.owner = tensor
    view = memoryview(array).cast("B")
    return view if writable else view.toreadonly()


def _encode_object(obj: Any) -> tuple[Any, memoryview]:
    return None, memoryview(objects.pack(obj))


def _allocate_object(meta: Any, nbytes: int) -> tuple[Any, memoryview]:
    payload = bytearray(nbytes)
    return payload, memoryview(payload)


def _identity(value: Any) -> Any:
    return value


def _object_from_buffer(meta: Any, buffer: Any) -> Any:
    return objects.unpack(memoryview(buffer))


TENSORS = Codec(_encode_tensor, _allocate_tensor, _identity, _tensor_from_buffer)
OBJECTS = Codec(
    _encode_object,
    _allocate_object,
    functools.partial(_object_from_buffer, None),
    _object_from_buffer,
)
