"""Uniform handling of the array types distcomm accepts, without importing their libraries.

A tensor argument may be a ``torch.Tensor``, a ``numpy.ndarray``, or (internally, for object
collectives) a writable uint8 buffer (``bytearray`` / ``memoryview``). :func:`adapter_for` returns
the :class:`Adapter` for an object's type; torch and numpy are looked up in ``sys.modules`` only,
so a caller who never imported them never pays for them.
"""

from __future__ import annotations

import sys
from typing import Any

from distcomm.backend.specs import ALL_DTYPES, FLOAT_DTYPES
from distcomm.errors import InvalidArgumentError
from distcomm.protocol import ReduceOp

__all__ = ["Adapter", "adapter_for", "cached_adapter", "check_op_dtype", "normalise_bool_op"]

_BITWISE = frozenset({ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR})


def check_op_dtype(op: ReduceOp, dtype: str) -> None:
    """Reject op/dtype pairs that have no meaning (AVG of integers, bitwise ops on floats)."""
    if op is ReduceOp.AVG and dtype not in FLOAT_DTYPES:
        raise InvalidArgumentError(
            f"ReduceOp.AVG needs a floating-point tensor, got dtype {dtype!r}. HINT: reduce with "
            "SUM and divide, or convert the tensor to float first."
        )
    if op in _BITWISE and dtype in FLOAT_DTYPES:
        raise InvalidArgumentError(
            f"ReduceOp.{op.name} needs an integer or bool tensor, got dtype {dtype!r}. "
            "HINT: bitwise reductions are defined for integer and bool tensors only."
        )


def normalise_bool_op(op: ReduceOp) -> ReduceOp:
    """Map an op on bool data to its logical meaning: SUM/MAX/BOR are or, PRODUCT/MIN/BAND and."""
    if op in (ReduceOp.SUM, ReduceOp.BOR):
        return ReduceOp.MAX
    if op in (ReduceOp.PRODUCT, ReduceOp.BAND):
        return ReduceOp.MIN
    return op


class Adapter:
    """Operations distcomm needs on one array library. Subclasses implement them."""

    kind = "abstract"

    def dtype(self, x: Any) -> str:
        """The canonical dtype name (one of :data:`distcomm.backend.specs.ALL_DTYPES`)."""
        raise NotImplementedError

    def device(self, x: Any) -> str:
        """``"cpu"`` or ``"cuda:N"``."""
        return "cpu"

    def is_contiguous(self, x: Any) -> bool:
        raise NotImplementedError

    def is_plain(self, x: Any, devices: frozenset[str], bound: str | None = None) -> bool:
        """Whether an engine moving ``devices`` takes ``x`` as it is: contiguous, on one of them
        (and, for an engine bound to one accelerator, ``bound`` such as ``"cuda:0"``, on it)."""
        return "cpu" in devices and self.is_contiguous(x)

    def plain_pair(
        self, output: Any, input: Any, devices: frozenset[str], bound: str | None
    ) -> bool:
        """Whether an engine moving ``devices`` writes ``output`` from ``input`` as they are:
        both plain (:meth:`is_plain`), the output writable, the two sharing no memory (one
        look for a call with an output, such as an uneven all-to-all's)."""
        return (
            self.is_plain(input, devices, bound)
            and self.is_plain(output, devices, bound)
            and self.is_writable(output)
            and not self.shares_memory(input, output)
        )

    def numel(self, x: Any) -> int:
        raise NotImplementedError

    def is_writable(self, x: Any) -> bool:
        """Whether ``x``'s memory may be written (a numpy array's ``flags.writeable``: False for
        a read-only memory map, ``np.frombuffer`` of bytes, a broadcast view)."""
        return True

    def shares_memory(self, a: Any, b: Any) -> bool:
        """Whether ``a`` and ``b`` may share memory (False only where they surely do not): an
        engine reading one while it writes the other must get a copy (MPI refuses aliased
        buffers; Gloo's all-to-all would race with itself). This default knows identity only:
        an adapter of a library with views (numpy's, torch's) compares their memory."""
        return a is b

    def empty(
        self, like: Any, numel: int, dtype: str | None = None, device: str | None = None
    ) -> Any:
        """A new flat, contiguous array of ``like``'s kind (and dtype/device unless given)."""
        raise NotImplementedError

    def clone(self, x: Any) -> Any:
        """A contiguous copy with the same shape."""
        raise NotImplementedError

    def flat(self, x: Any) -> Any:
        """A 1-D view of a contiguous array."""
        raise NotImplementedError

    def copy_(self, dst: Any, src: Any) -> None:
        """Copy ``src``'s elements into ``dst`` (same number of elements, any shapes)."""
        raise NotImplementedError

    def astype(self, x: Any, dtype: str) -> Any:
        """A contiguous copy converted to ``dtype``."""
        raise NotImplementedError

    def to_device(self, x: Any, device: str) -> Any:
        """A contiguous copy on ``device``."""
        raise InvalidArgumentError(f"{self.kind} arrays live on the CPU only")

    def combine_(self, acc: Any, other: Any, op: ReduceOp) -> None:
        """``acc = acc (op) other`` elementwise, in place (AVG is SUM here; see :meth:`divide_`)."""
        raise InvalidArgumentError(
            f"reductions need a torch tensor or numpy array, not {self.kind}"
        )

    def divide_(self, x: Any, divisor: int) -> None:
        """``x /= divisor`` in place (floating-point arrays)."""
        raise NotImplementedError

    def from_other(self, like: Any, src: Any) -> Any:
        """``src`` (any supported kind) as an array of this kind, sharing memory where possible."""
        raise NotImplementedError


class TorchAdapter(Adapter):
    kind = "torch"

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.names = {
            torch.bool: "bool",
            torch.uint8: "uint8",
            torch.int8: "int8",
            torch.int16: "int16",
            torch.int32: "int32",
            torch.int64: "int64",
            torch.float16: "float16",
            torch.bfloat16: "bfloat16",
            torch.float32: "float32",
            torch.float64: "float64",
        }
        self.dtypes = {v: k for k, v in self.names.items()}

    def dtype(self, x: Any) -> str:
        try:
            return self.names[x.dtype]
        except KeyError:
            raise _bad_dtype(x.dtype) from None

    def device(self, x: Any) -> str:
        device = x.device
        return "cpu" if device.type == "cpu" else str(device)

    def is_contiguous(self, x: Any) -> bool:
        return bool(x.is_contiguous())

    def is_plain(self, x: Any, devices: frozenset[str], bound: str | None = None) -> bool:
        if x.is_cpu:  # is_cpu is several times faster than .device
            return "cpu" in devices and bool(x.is_contiguous())
        on = x.device
        if on.type not in devices or (bound is not None and str(on) != bound):
            return False
        return bool(x.is_contiguous())

    def numel(self, x: Any) -> int:
        return int(x.numel())

    def shares_memory(self, a: Any, b: Any) -> bool:
        if a.get_device() != b.get_device():  # (an int, -1 on the CPU: no device object made)
            return False
        start, end = _span(a)
        other, other_end = _span(b)
        return other < end and start < other_end

    def empty(
        self, like: Any, numel: int, dtype: str | None = None, device: str | None = None
    ) -> Any:
        return self.torch.empty(
            numel,
            dtype=self.dtypes[dtype] if dtype else like.dtype,
            device=device or like.device,
        )

    def clone(self, x: Any) -> Any:
        return x.clone(memory_format=self.torch.contiguous_format)

    def flat(self, x: Any) -> Any:
        return x.view(-1)

    def copy_(self, dst: Any, src: Any) -> None:
        src = self.from_other(dst, src)
        with self.torch.no_grad():
            dst.copy_(src.reshape(dst.shape))

    def astype(self, x: Any, dtype: str) -> Any:
        return x.to(self.dtypes[dtype], memory_format=self.torch.contiguous_format)

    def to_device(self, x: Any, device: str) -> Any:
        return x.to(device, memory_format=self.torch.contiguous_format)

    def combine_(self, acc: Any, other: Any, op: ReduceOp) -> None:
        torch = self.torch
        other = self.from_other(acc, other).reshape(acc.shape)
        if acc.dtype == torch.bool:
            op = normalise_bool_op(op)
        if op in (ReduceOp.SUM, ReduceOp.AVG):
            acc.add_(other)
        elif op is ReduceOp.PRODUCT:
            acc.mul_(other)
        elif op is ReduceOp.MIN:
            torch.minimum(acc, other, out=acc)
        elif op is ReduceOp.MAX:
            torch.maximum(acc, other, out=acc)
        elif op is ReduceOp.BAND:
            acc.bitwise_and_(other)
        elif op is ReduceOp.BOR:
            acc.bitwise_or_(other)
        else:
            acc.bitwise_xor_(other)

    def divide_(self, x: Any, divisor: int) -> None:
        x.div_(divisor)

    def from_other(self, like: Any, src: Any) -> Any:
        if isinstance(src, self.torch.Tensor):
            return src
        if isinstance(src, (bytearray, bytes, memoryview)):
            return (
                self.torch.frombuffer(src, dtype=self.torch.uint8)
                if len(src)
                else self.torch.empty(0, dtype=self.torch.uint8)
            )
        return self.torch.from_numpy(src)


class NumpyAdapter(Adapter):
    kind = "numpy"

    def __init__(self) -> None:
        import numpy

        self.np = numpy
        self.names: dict[Any, str] = {}

    def dtype(self, x: Any) -> str:
        dtype = x.dtype
        name = self.names.get(dtype)
        if name is None:
            name = str(dtype.name)
            if name not in ALL_DTYPES:
                raise _bad_dtype(dtype)
            if not dtype.isnative:
                raise InvalidArgumentError(
                    f"dtype {dtype.str!r} is {name} in non-native byte order, which no engine "
                    "moves. HINT: convert it first: x.astype(x.dtype.newbyteorder('='))."
                )
            self.names[dtype] = name
        return name

    def is_contiguous(self, x: Any) -> bool:
        return x.flags.c_contiguous  # type: ignore[no-any-return]

    def is_plain(self, x: Any, devices: frozenset[str], bound: str | None = None) -> bool:
        # the base's test without its call of is_contiguous (a frame less on every call)
        return "cpu" in devices and x.flags.c_contiguous

    def plain_pair(
        self, output: Any, input: Any, devices: frozenset[str], bound: str | None
    ) -> bool:
        # the base's looks in one, through the buffer protocol where the extension was built
        # (_apart: None where an array exports no buffer); else with each array's flags read once
        if "cpu" not in devices:
            return False
        if _apart is not None:
            looked = _apart(output, input)
            if looked is not None:
                return looked  # type: ignore[no-any-return]
        out = output.flags
        return (
            out.c_contiguous
            and out.writeable
            and input.flags.c_contiguous
            and not self.shares_memory(input, output)
        )

    def numel(self, x: Any) -> int:
        return int(x.size)

    def is_writable(self, x: Any) -> bool:
        return x.flags.writeable  # type: ignore[no-any-return]

    def shares_memory(self, a: Any, b: Any) -> bool:
        if a is b:
            return True
        if a.base is None and b.base is None:  # two arrays that own their memory
            return False
        return bool(self.np.may_share_memory(a, b))

    def empty(
        self, like: Any, numel: int, dtype: str | None = None, device: str | None = None
    ) -> Any:
        return self.np.empty(numel, dtype=dtype or like.dtype)

    def clone(self, x: Any) -> Any:
        return self.np.array(x, order="C", copy=True)

    def flat(self, x: Any) -> Any:
        return x.reshape(-1)

    def copy_(self, dst: Any, src: Any) -> None:
        src = self.from_other(dst, src)
        dst[...] = src.reshape(dst.shape)

    def astype(self, x: Any, dtype: str) -> Any:
        return self.np.ascontiguousarray(x.astype(dtype))

    def combine_(self, acc: Any, other: Any, op: ReduceOp) -> None:
        np = self.np
        other = self.from_other(acc, other).reshape(acc.shape)
        if acc.dtype == np.bool_:
            op = normalise_bool_op(op)
        ufunc = {
            ReduceOp.SUM: np.add,
            ReduceOp.AVG: np.add,
            ReduceOp.PRODUCT: np.multiply,
            ReduceOp.MIN: np.minimum,
            ReduceOp.MAX: np.maximum,
            ReduceOp.BAND: np.bitwise_and,
            ReduceOp.BOR: np.bitwise_or,
            ReduceOp.BXOR: np.bitwise_xor,
        }[op]
        if acc.dtype == np.bool_ and op is ReduceOp.BXOR:
            ufunc = np.logical_xor
        ufunc(acc, other, out=acc)

    def divide_(self, x: Any, divisor: int) -> None:
        self.np.divide(x, divisor, out=x)

    def from_other(self, like: Any, src: Any) -> Any:
        if isinstance(src, self.np.ndarray):
            return src
        if isinstance(src, (bytearray, bytes, memoryview)):
            return self.np.frombuffer(src, dtype=self.np.uint8)
        if src.dtype == sys.modules["torch"].bfloat16:
            raise InvalidArgumentError("a bfloat16 torch tensor cannot meet a numpy array")
        return src.detach().cpu().numpy()


class BytesAdapter(Adapter):
    """A writable uint8 buffer: the transport of object collectives."""

    kind = "bytes"

    def dtype(self, x: Any) -> str:
        return "uint8"

    def is_contiguous(self, x: Any) -> bool:
        return isinstance(x, bytearray) or memoryview(x).c_contiguous

    def is_writable(self, x: Any) -> bool:
        return not memoryview(x).readonly

    def numel(self, x: Any) -> int:
        return memoryview(x).nbytes

    def empty(
        self, like: Any, numel: int, dtype: str | None = None, device: str | None = None
    ) -> Any:
        return bytearray(numel)

    def clone(self, x: Any) -> Any:
        return bytearray(memoryview(x).cast("B"))

    def flat(self, x: Any) -> Any:
        return memoryview(x).cast("B")

    def copy_(self, dst: Any, src: Any) -> None:
        if isinstance(src, (bytes, bytearray, memoryview)):
            view = memoryview(src)
        else:  # a numpy array or a torch tensor (which has no buffer protocol)
            view = memoryview(_as_bytes_view(src))
        memoryview(dst).cast("B")[:] = view.cast("B")


def _span(t: Any) -> tuple[int, int]:
    """The addresses a torch tensor's memory may occupy: its own bytes where it is contiguous,
    else its storage's."""
    if t.is_contiguous():
        start = t.data_ptr()
        return start, start + t.nbytes
    storage = t.untyped_storage()
    start = storage.data_ptr()
    return start, start + storage.nbytes()


def as_torch(x: Any) -> Any:
    """``x`` as a torch tensor sharing its memory (numpy arrays, byte buffers, tensors), for
    engines that take torch tensors only; a read-only numpy array as a copy (torch has no
    read-only tensors; the kit refuses read-only arrays it would write into, so such an array
    is an input). Imports torch (call it where torch is in use)."""
    import torch

    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (bytearray, memoryview)):
        view = memoryview(x).cast("B")
        if not view.nbytes:
            return torch.empty(0, dtype=torch.uint8)
        return torch.frombuffer(view, dtype=torch.uint8)
    return torch.from_numpy(x if x.flags.writeable else x.copy())


def _as_bytes_view(src: Any) -> Any:
    if type(src).__module__.startswith("torch"):
        src = src.detach().cpu().numpy()
    return src.reshape(-1).view("uint8")


def _bad_dtype(dtype: object) -> InvalidArgumentError:
    valid = ", ".join(sorted(ALL_DTYPES))
    return InvalidArgumentError(
        f"unsupported dtype {dtype!r}; distcomm moves {valid}. HINT: convert the tensor to one "
        "of these (complex data: view it as real pairs)."
    )


try:  # NumpyAdapter.plain_pair's look compiled (distcomm/backend/_pipeline/_planned_path.c)
    from distcomm.backend._pipeline._planned_path import apart as _apart
except ImportError:  # not built: the Python looks
    _apart = None

_adapters: dict[type, Adapter] = {}
_BYTES = BytesAdapter()


def cached_adapter(x: Any) -> Adapter | None:
    """The adapter for ``x``'s type if one was made already (the fast path), else None."""
    return _adapters.get(type(x))


def adapter_for(x: Any, what: str = "tensor") -> Adapter:
    """Return the adapter for ``x``'s type.

    Raises:
        InvalidArgumentError: ``x`` is not a torch tensor, numpy array or byte buffer.
    """
    cls = type(x)
    found = _adapters.get(cls)
    if found is not None:
        return found
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        found = TorchAdapter()
    else:
        numpy = sys.modules.get("numpy")
        if numpy is not None and isinstance(x, numpy.ndarray):
            found = NumpyAdapter()
        elif isinstance(x, (bytearray, memoryview)):
            found = _BYTES
    if found is None:
        raise InvalidArgumentError(
            f"{what} must be a torch.Tensor or numpy.ndarray, got {cls.__qualname__} ({x!r:.60}). "
            "HINT: wrap Python numbers with torch.tensor(...) or numpy.asarray(...); "
            "all_reduce also takes a plain int or float and returns the result."
        )
    _adapters[cls] = found
    return found
