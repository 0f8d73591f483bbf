"""Fitting a caller's tensor to what an engine takes: device, dtype and contiguity.

:func:`stage` returns the array the engine primitive should see and a function that writes the
engine's result back into the caller's tensor. When the caller's tensor already fits (the common
case: a contiguous CPU tensor of a native dtype) nothing is copied and there is nothing to do after.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from distcomm.backend.arrays import Adapter
from distcomm.errors import InvalidArgumentError

__all__ = ["BRIDGES", "Staged", "stage"]

#: Wider dtypes used where an engine lacks one, in order of preference.
BRIDGES: dict[str, tuple[str, ...]] = {
    "bool": ("uint8", "int32"),
    "uint8": ("int16", "int32"),
    "int8": ("int16", "int32"),
    "int16": ("int32", "int64"),
    "int32": ("int64",),
    "float16": ("float32",),
    "bfloat16": ("float32",),
}


class Staged:
    """A tensor as the engine will see it.

    Attributes:
        engine: the array to hand to the primitive (the caller's own when it fits).
        dtype: ``engine``'s dtype name.
        copied: whether ``engine`` is a copy that must be written back.
    """

    __slots__ = ("adapter", "copied", "dtype", "engine", "user")

    def __init__(self, adapter: Adapter, user: Any, engine: Any, dtype: str) -> None:
        self.adapter = adapter
        self.user = user
        self.engine = engine
        self.dtype = dtype
        self.copied = engine is not user

    def write_back(self) -> None:
        """Copy ``engine`` into the caller's tensor if it is a copy."""
        if self.copied:
            self.adapter.copy_(self.user, self.engine)


def stage(
    adapter: Adapter,
    x: Any,
    dtype: str,
    *,
    native_dtypes: frozenset[str],
    devices: frozenset[str],
    backend: str,
    warn_staging: Callable[[str], None],
    what: str = "tensor",
    bound: str | None = None,
    apart_from: Any = None,
) -> Staged:
    """Return ``x`` fitted to the engine (see the module docstring); ``bound``: the one
    accelerator device (``"cuda:0"``) of an engine bound to it, None if unbound;
    ``apart_from``: the output the engine writes while it reads ``x`` (an input that may share
    memory with it is copied).

    Raises:
        InvalidArgumentError: a CPU tensor on a GPU-only engine, a tensor on another device
            than the engine's bound one, or a dtype it cannot bridge.
    """
    device = adapter.device(x)
    engine = x
    target_device: str | None = None
    if device == "cpu":
        if "cpu" not in devices:
            raise InvalidArgumentError(
                f"{what} is on the CPU, but backend {backend!r} moves {sorted(devices)} tensors "
                f"only. HINT: move it first ({what}.cuda()), or init a CPU backend such as gloo."
            )
    elif device.split(":")[0] not in devices:
        warn_staging(device)
        target_device = "cpu"
    elif bound is not None and device != bound:
        raise InvalidArgumentError(
            f"{what} is on {device}, but this rank's {backend!r} communicator uses {bound} (one "
            f"device per rank). HINT: move it first ({what}.to({bound!r})), or init(device="
            f"{device!r}) if this rank should use {device}."
        )
    target_dtype = dtype
    if dtype not in native_dtypes:
        target_dtype = next((d for d in BRIDGES.get(dtype, ()) if d in native_dtypes), "")
        if not target_dtype:
            raise InvalidArgumentError(
                f"backend {backend!r} cannot move dtype {dtype!r}; it moves "
                f"{', '.join(sorted(native_dtypes))}. HINT: convert the {what} first."
            )
    if target_device is not None:
        engine = adapter.to_device(engine, target_device)
    if target_dtype != dtype:
        engine = adapter.astype(engine, target_dtype)
    if engine is x and (
        not adapter.is_contiguous(x)
        or (apart_from is not None and adapter.shares_memory(x, apart_from))
    ):
        engine = adapter.clone(x)
    return Staged(adapter, x, engine, target_dtype)
