"""The point-to-point pipeline: send, recv, isend, irecv, batch_isend_irecv, and the objects'
send_object and recv_object.

Messages carry no sequence number (only collectives are numbered); a blocking send or recv is
the non-blocking one waited for, under a "blocked in" mark of its own (the Work sets it), or
the engine's plan for the message's kind (:mod:`~distcomm.backend._pipeline.plans`) under the
same mark, for arguments the pipeline would take as they are. On a
backend that does not match messages by tag (``capabilities.p2p_tags`` False) a non-zero tag is
refused before anything is sent. A batch checks every one of its messages before it starts
any, then posts the receives before the sends (so that neighbours sending to each other never
wait on one another). An object travels as two messages on its tag: its size, then its bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from distcomm._unpickling import Refused
from distcomm.backend._pipeline import object_transport as objects
from distcomm.backend._pipeline.object_collectives import refusal
from distcomm.backend._pipeline.steps import Steps, compiled_messages
from distcomm.backend.arrays import adapter_for
from distcomm.backend.engine import INTERNAL_TAG, NotPlanned
from distcomm.errors import DistcommError, InvalidArgumentError, NotSupportedError
from distcomm.protocol import P2POp, Work

__all__ = ["PointToPoint"]

#: What :meth:`PointToPoint._planned_message` returns when nothing moved.
_NOT_RUN = object()


class PointToPoint(Steps):
    """send, recv, isend, irecv (module docstring)."""

    def send(self, tensor: Any, dst: int, tag: int = 0) -> None:
        """Send ``tensor`` to ``dst`` (a rank of this communicator)."""
        if self._planned_message("send", tensor, dst, tag) is _NOT_RUN:
            self.isend(tensor, dst, tag).wait()

    def recv(self, tensor: Any, src: int | None = None, tag: int = 0) -> int:
        """Receive into ``tensor`` from ``src`` (None: any rank); return the sender's rank."""
        source = self._planned_message("recv", tensor, src, tag)
        if source is not _NOT_RUN:
            rank = src if source is None else source  # any rank: the plan says
            assert rank is not None, "a plan of a receive from any rank names the sender"
            return int(rank)
        work = self.irecv(tensor, src, tag)
        work.wait()
        source = getattr(work, "source", None)
        return int(source) if source is not None else int(src or 0)

    def isend(self, tensor: Any, dst: int, tag: int = 0) -> Work:
        """Start sending ``tensor`` to ``dst``; don't modify it before the Work completes."""
        adapter, dtype = self._begin(tensor, "tensor")
        self._check_rank(dst, "dst")
        self._check_tag(tag)
        self._check_p2p("isend")
        self._check_tag_matched("isend", tag)
        staged = self._stage(adapter, tensor, dtype)
        work = self._start(self._isend, "isend", staged.engine, dst, tag)
        return self._handed(work, (tensor, staged.engine), None)

    def irecv(self, tensor: Any, src: int | None = None, tag: int = 0) -> Work:
        """Start receiving into ``tensor``; the Work's ``source`` is the sender once complete."""
        adapter, dtype = self._begin(tensor, "tensor", written=True)
        if src is not None:
            self._check_rank(src, "src")
        elif not self.capabilities.any_source:
            raise InvalidArgumentError(
                f"backend {self.backend_name!r} cannot receive from any source (src=None). "
                "HINT: pass the sender's rank as src."
            )
        self._check_tag(tag)
        self._check_p2p("irecv")
        self._check_tag_matched("irecv", tag)
        staged = self._stage(adapter, tensor, dtype)
        work = self._start(self._irecv, "irecv", staged.engine, src, tag)
        after = staged.write_back if staged.copied else None
        return self._handed(work, (tensor, staged.engine), after)

    def batch_isend_irecv(self, ops: Sequence[P2POp]) -> list[Work]:
        """Start every message of ``ops`` at once, receives first; their Works, in order.

        Every op is checked (its kind, tensor, peer, tag and group) before any message starts,
        so that a bad one leaves nothing half sent.
        """
        if isinstance(ops, P2POp) or not isinstance(ops, Sequence):
            raise InvalidArgumentError(
                f"batch_isend_irecv takes a list of P2POp, got {type(ops).__name__}. HINT: "
                "batch_isend_irecv([P2POp(distcomm.isend, x, peer), ...])."
            )
        kinds = [self._check_message(op, i) for i, op in enumerate(ops)]
        if kinds:  # every op's arguments first, then what the backend can do
            self._check_p2p("batch_isend_irecv")
        works: list[Work | None] = [None] * len(ops)
        for wanted in ("irecv", "isend"):
            for i, (op, kind) in enumerate(zip(ops, kinds, strict=True)):
                if kind == wanted:
                    start = self.irecv if kind == "irecv" else self.isend
                    works[i] = start(op.tensor, op.peer, op.tag)
        return [w for w in works if w is not None]

    def send_object(self, obj: Any, dst: int, tag: int = 0) -> None:
        """Send a picklable ``obj`` to ``dst``; it returns once the bytes are handed over."""
        self._check_usable()
        self._check_rank(dst, "dst")
        self._check_message_tag("send_object", tag)
        try:
            objects.send_object(self._object_channel(), obj, dst, tag)
        except Refused as refused:  # too large: the receiver refuses it too
            raise refusal(self, refused, "send_object", None) from None

    def recv_object(self, src: int | None = None, tag: int = 0) -> Any:
        """Receive the object that ``src`` (None: any rank) sent with :meth:`send_object`."""
        self._check_usable()
        if src is not None:
            self._check_rank(src, "src")
        elif not self.capabilities.any_source:
            raise InvalidArgumentError(
                f"backend {self.backend_name!r} cannot receive from any source (src=None). "
                "HINT: pass the sender's rank as src."
            )
        self._check_message_tag("recv_object", tag)
        try:
            return objects.recv_object(self._object_channel(), src, tag)
        except Refused as refused:
            raise refusal(self, refused, "recv_object", None) from None

    def _check_message(self, op: Any, index: int) -> str:
        """Check the ``index``-th op of a batch; its kind."""
        if not isinstance(op, P2POp):
            raise InvalidArgumentError(
                f"batch_isend_irecv: op {index} is a {type(op).__name__}, not a P2POp. HINT: "
                "P2POp(distcomm.isend, tensor, peer) or P2POp(distcomm.irecv, buffer, peer)."
            )
        kind = op.kind
        if op.group is not None and op.group is not self:
            raise InvalidArgumentError(
                f"batch_isend_irecv: op {index} is on {op.group!r}, not on {self.describe()}: "
                "one batch is on one communicator. HINT: one batch_isend_irecv per group."
            )
        self._begin(op.tensor, f"op {index}'s tensor", written=kind == "irecv")
        self._check_rank(op.peer, f"op {index}'s peer")
        self._check_tag(op.tag)
        self._check_tag_matched(f"op {index} ({kind})", op.tag)
        return kind

    def _check_message_tag(self, op: str, tag: int) -> None:
        self._check_tag(tag)
        self._check_p2p(op)
        self._check_tag_matched(op, tag)

    @compiled_messages
    def _planned_message(self, op: str, x: Any, peer: Any, tag: Any) -> Any:
        """Run blocking message ``op`` of ``x`` to or from ``peer`` (a rank; None: any, for a
        receive) with ``tag`` through the engine's plan for its kind, under a "blocked in" mark
        of its own (the kind's label), as a waited-for Work's; an engine's exception becomes
        EngineError. Returns what the plan returned (a receive from any rank: the sender), or
        :data:`_NOT_RUN`: nothing moved (no plan, arguments the pipeline must explain, or the
        plan declined), and the pipeline takes the message. A kind is remembered only for
        arguments that fit: a known one needs only its classes checked (``True`` is equal to
        ``1``, but no rank). Where the extension was built, a message of its op's latest kind
        runs compiled (:func:`~distcomm.backend._pipeline.steps.compiled_messages`)."""
        last = self._last_kind.get(op)
        try:
            if (
                last is not None
                and last[0] is x.__class__
                and last[1] is x.dtype
                and last[2] == x.nbytes
                and last[3] == (peer, tag)
            ):
                entry = last[4]
            else:
                entry = self._message_kind(op, x, peer, tag)
        except (AttributeError, TypeError, ValueError):  # not an array; a peer or tag no key
            return _NOT_RUN
        if (
            entry is None
            or entry[0] is None
            or self.unusable is not None
            or tag.__class__ is not int
            or (peer is not None and peer.__class__ is not int)
        ):
            return _NOT_RUN
        label = entry[3]
        self.blocked_op, self.blocked_seq = label, -next(self.p2p_marks)
        try:
            return entry[0](x, None)
        except BaseException as exc:
            return self._message_raised(label, exc)
        finally:
            self.blocked_seq, self.blocked_op = 0, ""

    def _message_raised(self, label: str, exc: BaseException) -> Any:
        """What a message's plan that raised ``exc`` comes to, under its mark ``label``:
        :data:`_NOT_RUN` for NotPlanned (nothing moved: the pipeline takes the message);
        distcomm's own errors raised as they are, whatever ``engine_errors`` lists; an engine's
        as EngineError caused by it; anything else as it is."""
        if isinstance(exc, NotPlanned):
            return _NOT_RUN
        if isinstance(exc, DistcommError) or not isinstance(exc, self.engine_errors):
            raise exc
        raise self.engine_failed(label, None, exc) from exc

    def _message_kind(self, op: str, x: Any, peer: Any, tag: Any) -> Any:
        """The entry of a message's kind not the op's latest (:meth:`Plans.find_message
        <distcomm.backend._pipeline.plans.Plans.find_message>`), learnt (the engine asked for
        its plan: :meth:`Plans.learn_message
        <distcomm.backend._pipeline.plans.Plans.learn_message>`) where the pipeline would take
        the arguments as they are; None where it would not (it explains them)."""
        entry = self._plans.find_message(op, x, peer, tag)
        if entry is not None:
            return entry
        if not self._message_fits(peer, tag):
            return None
        try:  # (made here for the process's first array of its class: its first message plans)
            adapter = adapter_for(x)
        except InvalidArgumentError:
            return None  # the pipeline explains
        if adapter.dtype(x) not in self._native_dtypes:
            return None
        return self._plans.learn_message(op, x, peer, tag)

    def _message_fits(self, peer: Any, tag: Any) -> bool:
        """Whether a message to or from ``peer`` with ``tag`` has arguments the pipeline takes
        as they are, on a usable communicator."""
        return (
            self.unusable is None
            and (
                (peer.__class__ is int and 0 <= peer < self._world_size)
                or (peer is None and self.capabilities.any_source)  # a receive from any rank
            )
            and tag.__class__ is int
            and 0 <= tag < INTERNAL_TAG
            and (tag == 0 or self.capabilities.p2p_tags)
        )

    def _start(self, primitive: Any, op: str, *args: Any) -> Work:
        """Start a message; an engine exception becomes EngineError."""
        try:
            work: Work = primitive(*args)
        except DistcommError:  # distcomm's own: never wrapped, whatever engine_errors lists
            raise
        except self.engine_errors as exc:
            raise self.engine_failed(op, None, exc) from exc
        return work

    def _check_p2p(self, op: str) -> None:
        if not self.capabilities.p2p:
            raise NotSupportedError(
                f"{op}: backend {self.backend_name!r} has no point-to-point messages. HINT: use "
                "collectives (broadcast, all_gather, ...), or a backend with them (gloo, mpi)."
            )

    def _check_tag_matched(self, op: str, tag: int) -> None:
        if tag and not self.capabilities.p2p_tags:
            raise InvalidArgumentError(
                f"{op}: tag={tag!r}, but backend {self.backend_name!r} does not match messages "
                "by tag: a receive takes the next message from its sender whatever its tag, so "
                "two messages in flight could swap their data. HINT: use tag=0 and post the "
                "receives in the order of the sends, or a backend that matches tags (gloo, mpi)."
            )
