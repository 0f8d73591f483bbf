"""What a peer's object payload may contain: restricted unpickling, the allow-list, the size limit.

Every object a rank receives (the object collectives, ``send_object``/``recv_object``, and what
is built on them: the helpers, the compat modules, the workspace) is unpickled here. By default
the unpickler builds only what is on the allow-list (:data:`ALLOWED`: Python's containers and
scalars, numpy arrays, dtypes and scalars, torch tensors, dtypes, devices and ``Size``) and what
the program allows (:func:`allow_objects`, ``DISTCOMM_ALLOW_OBJECTS``); any other global the
stream names (``posix.system``, ``builtins.eval``, a class of the program) is refused before it
is looked up, so nothing a peer sends runs code here. The check runs once per global the stream
names, not per object. A torch tensor's storage comes as bytes of ``torch.save``: they are read
with torch's own restricted loader (``weights_only=True``), never with plain pickle. What a rank
pickled itself and reads back from its own memory (its own part of an all-gather, a gather or a
scatter) is read with plain pickle when it names no global (:func:`loads_own`): the cost of the
allow-list is paid for peers' bytes only, and a rank refuses its own object when its peers do.

``DISTCOMM_OBJECTS=pickle`` (or ``init(objects="pickle")``) restores plain pickle for a job whose
every rank is trusted (docs/security.md). An object message announcing more than
``DISTCOMM_MAX_OBJECT_BYTES`` is refused before anything is allocated for it.
"""

from __future__ import annotations

import copyreg
import importlib
import io
import pickle
import re
from collections.abc import Sequence
from typing import Any

from distcomm import _settings as settings
from distcomm.errors import InvalidArgumentError

__all__ = [
    "ALLOWED",
    "Refused",
    "allow_objects",
    "allowed_names",
    "check_size",
    "loads",
    "loads_own",
    "max_bytes",
    "policy",
    "reset_policy",
    "set_policy",
]

#: What a payload may name by default, by module: Python's containers and scalars, numpy's
#: arrays, dtypes and scalars (numpy 1 and 2 spell the modules differently), torch's tensors,
#: devices and sizes (its dtypes are checked as such: :func:`_is_allowed`), and distcomm's own
#: records.
ALLOWED: dict[str, frozenset[str]] = {
    "builtins": frozenset(
        {"dict", "list", "tuple", "set", "frozenset", "str", "bytes", "bytearray", "int"}
        | {"float", "complex", "bool", "slice", "range", "NoneType"}
    ),
    "collections": frozenset({"OrderedDict"}),  # a tensor's backward hooks: an empty one
    "numpy": frozenset({"dtype", "ndarray"}),
    "numpy.core.multiarray": frozenset({"_reconstruct", "scalar"}),
    "numpy._core.multiarray": frozenset({"_reconstruct", "scalar"}),
    "numpy.core.numeric": frozenset({"_frombuffer"}),
    "numpy._core.numeric": frozenset({"_frombuffer"}),
    "torch": frozenset({"Size", "device"}),
    "torch._utils": frozenset({"_rebuild_tensor_v2", "_rebuild_parameter"}),
    "torch.nn.parameter": frozenset({"Parameter"}),
    "torch.storage": frozenset({"_load_from_bytes"}),  # replaced: :func:`_storage_from_bytes`
    # distcomm's own records (plain data): a helper's failure, the workspace's notes
    "distcomm._peer_failures": frozenset({"Failure"}),
    "distcomm.workspace": frozenset({"_Note"}),
}

#: What the program allowed (:func:`allow_objects`, ``DISTCOMM_ALLOW_OBJECTS``), by module.
_allowed: dict[str, set[str]] = {}
#: The policy and the size limit ``init()`` fixed (its keyword or ``DISTCOMM_OBJECTS``, and
#: ``DISTCOMM_MAX_OBJECT_BYTES``); None: not fixed, read the variable.
_policy: str | None = None
_limit: int | None = None


class Refused(pickle.UnpicklingError):
    """A payload named a global that is not allowed, or announced more bytes than the limit.
    The object pipeline turns it into :class:`~distcomm.errors.ObjectRefusedError` with the
    operation; ``refused`` is the global (``module.name``) or None for a size, ``size`` the
    announced bytes, ``sender`` the rank that sent it where known."""

    def __init__(self, message: str, *, entry: str | None = None, size: int | None = None) -> None:
        super().__init__(message)
        self.entry = entry  # module:name, as allow_objects takes it
        self.refused = entry.replace(":", ".") if entry else None
        self.size = size
        self.sender: int | None = None


def policy() -> str:
    """``restricted`` or ``pickle``: what ``init()`` set, else ``DISTCOMM_OBJECTS``."""
    return _policy if _policy is not None else settings.read("DISTCOMM_OBJECTS")


def set_policy(value: str | None) -> None:
    """Fix the policy for this process (``init()``): ``value`` (its ``objects`` keyword), else
    ``DISTCOMM_OBJECTS`` as it is now; and the size limit. Both are read once, not at every
    object."""
    global _policy, _limit
    if value is None:
        _policy = settings.read("DISTCOMM_OBJECTS")
    else:
        _policy = settings.convert("DISTCOMM_OBJECTS", value, "objects")
    _limit = settings.read("DISTCOMM_MAX_OBJECT_BYTES")


def reset_policy() -> None:
    """``finalize()``: the policy and the limit follow their variables again until the next
    ``init()``."""
    global _policy, _limit
    _policy = _limit = None


def max_bytes() -> int:
    """The most bytes an object message may announce: what ``init()`` fixed, else
    ``DISTCOMM_MAX_OBJECT_BYTES``."""
    limit: int = _limit if _limit is not None else settings.read("DISTCOMM_MAX_OBJECT_BYTES")
    return limit


def allow_objects(*allowed: Any) -> None:
    """Let object payloads name these classes or functions, besides the default allow-list.

    Each is a class or function (``MyConfig``), or its name as ``"module:Name"``
    (``"my_project.config:MyConfig"``, what ``DISTCOMM_ALLOW_OBJECTS`` takes, comma-separated).
    Call it on every rank that receives them, before they arrive (a name is not imported until
    a payload names it). Allow only what you trust to be built from a peer's bytes: a class
    whose ``__reduce__``/``__setstate__`` runs code, or a function, runs it with the peer's
    arguments. ``DISTCOMM_OBJECTS=pickle`` allows everything (docs/security.md).

    Raises:
        InvalidArgumentError: an argument is neither a named class or function nor a
            ``"module:Name"`` text.
    """
    for item in allowed:
        module, name = _split(item)
        _allowed.setdefault(module, set()).add(name)


def _split(item: Any) -> tuple[str, str]:
    if isinstance(item, str):
        if settings.is_object_name(item.strip()):
            module, _, name = item.strip().partition(":")
            return module, name
    else:
        module = getattr(item, "__module__", None)
        name = getattr(item, "__qualname__", None)
        if isinstance(module, str) and isinstance(name, str) and "<" not in name:
            return module, name
    raise InvalidArgumentError(
        f"allow_objects: {item!r} is neither a class or function defined at a module's top "
        "level nor a 'module:Name' text. HINT: pass the class itself (allow_objects(MyConfig)) "
        "or its name (allow_objects('my_project.config:MyConfig'), or DISTCOMM_ALLOW_OBJECTS="
        "'my_project.config:MyConfig')."
    )


def allowed_names() -> list[str]:
    """What the program allowed beyond the default, as ``module:Name`` (``distcomm info``)."""
    named = {f"{m}:{n}" for m, names in _allowed.items() for n in names}
    named.update(settings.read("DISTCOMM_ALLOW_OBJECTS"))
    return sorted(named)


def _is_allowed(module: str, name: str) -> bool:
    if name in ALLOWED.get(module, ()) or name in _allowed.get(module, ()):
        return True
    if module == "torch":  # a dtype: torch.float32, torch.bfloat16
        torch = importlib.import_module("torch")
        if isinstance(getattr(torch, name, None), torch.dtype):
            return True
    return f"{module}:{name}" in settings.read("DISTCOMM_ALLOW_OBJECTS")


class _Restricted(pickle.Unpickler):
    """pickle's unpickler that looks up only allowed globals (module docstring)."""

    def find_class(self, module: str, name: str) -> Any:
        found = _found.get((module, name))
        if found is not None:
            return found
        if not _is_allowed(module, name):
            raise Refused(
                f"refused to unpickle {module}.{name}: it is not on the allow-list",
                entry=f"{module}:{name}",
            )
        if module == "torch.storage" and name == "_load_from_bytes":
            return _storage_from_bytes
        found = importlib.import_module(module)
        for part in name.split("."):
            found = getattr(found, part)
        if name in ALLOWED.get(module, ()):
            _found[module, name] = found  # the default list never shrinks: looked up once
        return found


#: The default allow-list's globals, once looked up.
_found: dict[tuple[str, str], Any] = {}


def _storage_from_bytes(data: bytes) -> Any:
    """A tensor's storage from the bytes of ``torch.save``, read by torch's restricted loader;
    what it refuses is refused here (named where torch names it)."""
    import torch

    try:
        return torch.load(io.BytesIO(data), weights_only=True)
    except pickle.UnpicklingError as exc:
        named = re.search(r"GLOBAL ([\w.]+)", str(exc))
        module, _, name = named[1].rpartition(".") if named else ("torch", "load")
        raise Refused(
            f"refused a tensor's storage: it names {module}.{name}, which torch.load("
            "weights_only=True) does not allow",
            entry=f"{module}:{name}",
        ) from None


def loads(stream: Any, buffers: Sequence[Any] = (), sender: int | None = None) -> Any:
    """The object pickled in ``stream`` (out-of-band ``buffers`` beside it), under the policy;
    ``sender``: the rank it came from, for the error.

    Raises:
        Refused: the stream names a global that is not allowed.
        pickle.UnpicklingError: the stream is not a whole pickle.
    """
    if policy() == "pickle":
        return pickle.loads(stream, buffers=buffers) if buffers else pickle.loads(stream)
    try:
        if buffers:
            return _Restricted(io.BytesIO(stream), buffers=buffers).load()
        return _Restricted(io.BytesIO(stream)).load()
    except Refused as refused:
        refused.sender = sender
        raise
    except (EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError) as exc:
        raise pickle.UnpicklingError(f"a broken object payload: {exc!r}") from exc


def loads_own(stream: Any, buffers: Sequence[Any] = (), sender: int | None = None) -> Any:
    """The object this rank pickled itself in ``stream`` (bytes, or a view of its own memory:
    its part of an all-gather, a gather or a scatter; never a peer's bytes), unpickled so that
    it is accepted or refused exactly as its peers accept or refuse the same bytes: with plain
    pickle when the stream names no global at all, which the allow-list accepts too (pickle's
    protocol 5 names one only with STACK_GLOBAL, a byte absent from the stream, or with a
    copyreg extension code, of which none is registered); else as :func:`loads` does
    (``sender``: this rank, for the error)."""
    data = stream
    if data.__class__ is not bytes:
        data = stream.tobytes() if stream.nbytes <= _SCANNED_BYTES else pickle.STACK_GLOBAL
    if _STACK_GLOBAL not in data and not copyreg._extension_registry:
        return pickle.loads(data, buffers=buffers) if buffers else pickle.loads(data)
    return loads(stream, buffers, sender)


#: The byte of pickle's STACK_GLOBAL opcode, and the longest view :func:`loads_own` copies to
#: scan for it (a copy of a longer one would cost more than it saves).
_STACK_GLOBAL = pickle.STACK_GLOBAL[0]  # an int: `in` is a memchr (a bytes needle: 4x slower)
_SCANNED_BYTES = 64 * 1024


def check_size(size: int, sender: int | None = None) -> None:
    """Raise :class:`Refused` if an object message of ``size`` bytes (from ``sender``) is over
    the limit: before anything is allocated for it."""
    limit = max_bytes()
    if size > limit:
        refused = Refused(
            f"refused an object message of {size} bytes: more than DISTCOMM_MAX_OBJECT_BYTES "
            f"({limit})",
            size=size,
        )
        refused.sender = sender
        raise refused
