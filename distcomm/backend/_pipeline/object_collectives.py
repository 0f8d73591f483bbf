"""The object pipeline: broadcast_object, all_gather_object, gather_object, scatter_object.

Objects travel as pickle protocol 5 bytes with out-of-band buffers (:mod:`~distcomm._object_codec`)
moved by :mod:`~distcomm.backend._pipeline.object_transport`, on the communicator's object
channel (itself, or a CPU side channel for a GPU engine). Each counts as one collective,
whatever it sends inside.

A call like one the pipeline took before (the same op and root) skips the kit's steps outside
the mismatch check's points, on a communicator that is its own object channel
(:meth:`ObjectCollectives._object_shortcut`): nothing is left to check or record but its
fingerprint, as for the tensors' plans (:mod:`~distcomm.backend._pipeline.plans`), and the
hooks see it as they see the pipeline's (its event made where it is numbered). Its bytes move
as the pipeline's would, so that ranks may take either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from distcomm import _unpickling
from distcomm._unpickling import Refused
from distcomm.backend._pipeline import object_transport as objects
from distcomm.backend._pipeline import observing
from distcomm.backend._pipeline.observing import observed
from distcomm.backend._pipeline.steps import Steps
from distcomm.errors import ObjectRefusedError

if TYPE_CHECKING:
    from distcomm.backend.communicator import BaseCommunicator

__all__ = ["ObjectCollectives", "refusal"]


class ObjectCollectives(Steps):
    """The object collectives (module docstring)."""

    # A peer's object that the unpickler refused (docs/security.md) raises the operation's
    # ObjectRefusedError on every rank that received it (:func:`refusal`).
    @observed
    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """Return ``src``'s ``obj`` on every rank (pickle protocol 5, out-of-band buffers)."""
        try:
            fast = self._object_shortcut("broadcast_object", src)
            if fast is not None:
                return objects.broadcast_object(fast, obj, src)
            self._check_usable()
            self._check_rank(src, "src")
            channel = self._objects("broadcast_object", src)
            return obj if channel is None else objects.broadcast_object(channel, obj, src)
        except Refused as refused:
            raise refusal(self, refused, "broadcast_object", self.seq) from None

    @observed
    def all_gather_object(self, obj: Any) -> list[Any]:
        """Return every rank's ``obj``, in rank order, on every rank."""
        try:
            fast = self._object_shortcut("all_gather_object")
            if fast is not None:
                return objects.all_gather_object(fast, obj)
            self._check_usable()
            channel = self._objects("all_gather_object")
            return [obj] if channel is None else objects.all_gather_object(channel, obj)
        except Refused as refused:
            raise refusal(self, refused, "all_gather_object", self.seq) from None

    @observed
    def gather_object(self, obj: Any, dst: int = 0) -> list[Any] | None:
        """Return every rank's ``obj`` on ``dst``; None elsewhere."""
        try:
            fast = self._object_shortcut("gather_object", dst)
            if fast is not None:
                return objects.gather_object(fast, obj, dst)
            self._check_usable()
            self._check_rank(dst, "dst")
            channel = self._objects("gather_object", dst)
            return [obj] if channel is None else objects.gather_object(channel, obj, dst)
        except Refused as refused:
            raise refusal(self, refused, "gather_object", self.seq) from None

    @observed
    def scatter_object(self, objs: Sequence[Any] | None, src: int = 0) -> Any:
        """Return ``objs[rank]`` from ``src`` (``objs`` is read on ``src`` only)."""
        if self._rank == src and self.unusable is None:
            objects.check_scatter_list(objs, self._world_size)
        try:
            fast = self._object_shortcut("scatter_object", src)
            if fast is not None:
                return objects.scatter_object(fast, objs, src)
            self._check_usable()
            self._check_rank(src, "src")
            if self._rank == src:
                objects.check_scatter_list(objs, self._world_size)
            channel = self._objects("scatter_object", src)
            if channel is None:
                assert objs is not None
                return objs[0]
            return objects.scatter_object(channel, objs, src)
        except Refused as refused:
            raise refusal(self, refused, "scatter_object", self.seq) from None

    def _object_shortcut(self, op: str, root: int | None = None) -> BaseCommunicator | None:
        """Count object collective ``op`` if it may skip the kit's steps (module docstring):
        a kind (op, root) the pipeline took before (:meth:`_objects` remembers it) and the
        ranks agreed on, outside the check points, not inside another public call. Registered
        hooks see it: its event is made where it is numbered, as the pipeline's. Returns the
        communicator to run it on (this one) if it did; None: nothing happened, and the
        pipeline takes it."""
        seq = self.seq + 1
        event = self._event
        if (
            seq >= self._next_check
            or (event is not None and event is not observing.PENDING)  # inside another call
            or self.unusable is not None
            or (root is not None and (root.__class__ is not int or root < 0))
        ):
            return None
        entry = self._plans.kinds.get((op, None, None, None, root))
        h = self._mismatch_check
        channel = self._object_channel()
        if entry is None or channel is not self:
            return None
        fp = entry[1]
        if h is not None and not h.unchecked(fp, op):
            return None
        self.op = op
        self.seq = seq
        if event is not None:  # hooks registered (the public method is observed): numbered here
            self._observe(observing.event_of(self, op, None, None, root, None))
        if h is not None and fp != h.run_fp:
            h.start_run(seq, fp)
        if self._recorder is not None:
            self._open_entry(op, seq, root=root)
        return channel


def refusal(comm: Any, refused: Refused, op: str, seq: int | None) -> ObjectRefusedError:
    """The error of operation ``op`` (number ``seq``; None for a message) on ``comm`` whose
    peer's object the unpickler refused (:mod:`~distcomm._unpickling`)."""
    label = f"{op} (operation #{seq})" if seq else op
    who = "a peer" if refused.sender is None else f"rank {refused.sender}"
    if refused.entry is not None:
        what = (
            f"it names {refused.refused}, which is not on the allow-list; nothing of it was "
            f"built. HINT: if {who} is trusted and sends {refused.refused} on purpose, allow it "
            f"on every rank: distcomm.allow_objects({refused.entry!r}) or "
            f"DISTCOMM_ALLOW_OBJECTS={refused.entry}; DISTCOMM_OBJECTS=pickle trusts every rank "
            "with any object (docs/security.md)."
        )
    else:
        what = (
            f"its message announces {refused.size} bytes, more than DISTCOMM_MAX_OBJECT_BYTES "
            f"({_unpickling.max_bytes()}); nothing was allocated for it. HINT: if objects that "
            "large are meant, raise DISTCOMM_MAX_OBJECT_BYTES on every rank (e.g. 32G)."
        )
    return ObjectRefusedError(
        f"{label} on {comm.describe()} refused {who}'s object: {what}",
        refused=refused.refused,
        size=refused.size,
        sender=refused.sender,
        op=op,
        seq=seq,
        group=comm.describe(),
    )
