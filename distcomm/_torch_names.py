"""What a torch.distributed user reaches for, and distcomm's answer.

Two tables: torch names that ``distcomm`` does not have (:data:`EQUIVALENTS`, read by
``distcomm.__getattr__`` and ``distcomm.compat.torch_distributed.__getattr__`` for the hint of
their AttributeError), and distcomm functions whose torch namesake takes other arguments
(:data:`FORMS`, read when such a call arrives in torch's shape). Both errors end on the drop-in
that keeps torch's names and meanings, ``distcomm.compat.torch_distributed`` (docs/from-torch.md
lists every difference).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from distcomm.errors import InvalidArgumentError

__all__ = [
    "DROP_IN",
    "EQUIVALENTS",
    "FORMS",
    "explains_torch_form",
    "fill_placeholders",
    "missing_name",
    "not_a_communicator",
    "short",
    "torch_form_error",
]

F = TypeVar("F", bound=Callable[..., Any])

#: The import that keeps torch.distributed's names and meanings.
DROP_IN = "import distcomm.compat.torch_distributed as dist"

_NO_STORE = "no store: the rendezvous is the launch's (init(master_addr=..., master_port=...))"

#: torch.distributed names that ``distcomm`` lacks -> distcomm's way to do the same.
EQUIVALENTS = {
    "is_available": "nothing to check: distcomm is available wherever it is installed",
    "init_process_group": "distcomm.init(): it picks the launch and the backend "
    "(`distcomm info --explain` says why)",
    "destroy_process_group": "distcomm.finalize() (a group of your own: group.finalize())",
    "group": "group=None for the world, or distcomm.get_communicator()",
    "GroupMember": "distcomm.get_communicator() for WORLD, distcomm.NON_MEMBER for "
    "NON_GROUP_MEMBER",
    "get_global_rank": "group.global_ranks[group_rank]",
    "get_group_rank": "group.global_ranks.index(global_rank)",
    "get_process_group_ranks": "list(group.global_ranks)",
    "broadcast_object_list": "obj = distcomm.broadcast_object(obj, src): it returns src's object",
    "scatter_object_list": "mine = distcomm.scatter_object(objs, src): it returns this rank's "
    "object",
    "monitored_barrier": "distcomm.barrier(): a barrier that times out "
    "(init(timeout=...)) names the ranks that did not arrive",
    "ProcessGroup": "distcomm.Communicator (torch's own group under a torch backend: comm.native)",
    "Backend": "a backend's name as a string, e.g. 'gloo' (`distcomm info` lists them)",
    "is_gloo_available": "`distcomm info`: it lists every backend and whether it is available",
    "is_nccl_available": "`distcomm info`: it lists every backend and whether it is available",
    "is_mpi_available": "`distcomm info`: it lists every backend and whether it is available",
    "is_torchelastic_launched": "distcomm.detect_environment().method (the launch distcomm "
    "detected)",
    "init_device_mesh": "distcomm.mesh(shape, names); mesh.torch() is torch's DeviceMesh",
    "DeviceMesh": "distcomm.Mesh (distcomm.mesh(shape, names)); mesh.torch() is torch's",
    "TCPStore": _NO_STORE,
    "FileStore": _NO_STORE,
}

#: distcomm functions whose torch namesake takes other arguments: (torch's form, distcomm's).
FORMS = {
    "all_gather_object": (
        "all_gather_object(object_list, obj) fills object_list",
        "object_list = distcomm.all_gather_object(obj)",
    ),
    "gather_object": (
        "gather_object(obj, object_gather_list, dst) fills object_gather_list on dst",
        "object_gather_list = distcomm.gather_object(obj, dst=dst) (None on the other ranks)",
    ),
    "scatter_object": (
        "scatter_object_list(output_list, input_list, src) puts this rank's object in "
        "output_list[0]",
        "mine = distcomm.scatter_object(input_list, src=src) (input_list read on src only)",
    ),
}


def missing_name(module: str, name: str, otherwise: str = "") -> AttributeError:
    """The AttributeError for ``module.name``: distcomm's equivalent when ``name`` is a
    torch.distributed name it knows, else ``otherwise`` (when given) as the HINT. Asked of
    ``distcomm``, it names the drop-in too."""
    equivalent = EQUIVALENTS.get(name)
    message = f"module {module!r} has no attribute {name!r}"
    if equivalent is not None:
        message += f"; torch.distributed.{name} is, in distcomm: {equivalent}"
        if module == "distcomm":
            message += f". HINT: or keep torch's names: {DROP_IN}"
    elif otherwise:
        message += f". HINT: {otherwise}"
    return AttributeError(message)


def torch_form_error(function: str, argument: str) -> InvalidArgumentError:
    """The error for distcomm's ``function`` called in torch's form (``argument`` says what
    gave it away)."""
    torch_form, ours = FORMS[function]
    return InvalidArgumentError(
        f"distcomm.{function}: {argument}; that is torch.distributed's form ({torch_form}). "
        f"distcomm's returns the result instead. HINT: {ours}; or keep torch's form: {DROP_IN}"
    )


def not_a_communicator(group: Any, torch_form: str = "") -> InvalidArgumentError:
    """The error for ``group=`` something that is not a communicator: torch's ProcessGroup
    gets the way to adopt it; a caller whose torch namesake takes a list there (``torch_form``,
    its name) gets the error naming torch's form."""
    kind = type(group)
    if kind.__name__ == "ProcessGroup" and kind.__module__.startswith("torch"):
        return InvalidArgumentError(
            f"group={group!r} is torch's ProcessGroup, not a distcomm communicator. HINT: adopt "
            "it once, `g = distcomm.get_communicator().adopt(pg)` (under a torch backend, gloo "
            "or nccl), and pass group=g; or make the group with distcomm.new_group(ranks); or "
            f"keep torch's calls on torch's groups: {DROP_IN} takes distcomm's groups only."
        )
    if torch_form:
        return torch_form_error(torch_form, f"group={short(group)} is not a communicator")
    return InvalidArgumentError(
        f"group={group!r} is not a distcomm communicator. HINT: pass one returned by "
        "distcomm.new_group(), comm.split(), or None for the default."
    )


def short(value: Any) -> str:
    """``repr(value)``, cut to 60 characters for a message."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def explains_torch_form(function: F) -> F:
    """Wrap an object collective whose torch namesake takes a list as its second argument: a
    call in torch's form that Python cannot bind (``gather_object(obj, lst, dst=0)``: "multiple
    values for 'dst'") gets the error naming torch's form instead."""

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except TypeError as exc:
            # Raised binding the arguments (no frame of the function's own), with torch's list
            # (or its None) second.
            traceback = exc.__traceback__
            binding = traceback is not None and traceback.tb_next is None
            if binding and len(args) > 1 and (args[1] is None or isinstance(args[1], list)):
                raise torch_form_error(function.__name__, str(exc)) from exc
            raise

    return call  # type: ignore[return-value]


def fill_placeholders(placeholders: list[Any], received: Any) -> None:
    """torch's list-in-place form, ``broadcast_object(lst, src)`` with ``[None] * n`` on the
    receivers: a receiver's list of Nones is filled with ``src``'s list of the same length, so
    that code reading the list, not the value returned, gets ``src``'s objects."""
    if (
        received.__class__ is list
        and len(received) == len(placeholders)
        and all(item is None for item in placeholders)
    ):
        placeholders[:] = received
