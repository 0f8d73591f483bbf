"""The point-to-point pipeline: send, recv, isend and irecv.

Messages carry no sequence number (only collectives are numbered); a blocking send or recv is
the non-blocking one waited for, under a "blocked in" mark of its own (the Work sets it). On a
backend that does not match messages by tag (``capabilities.p2p_tags`` False) a non-zero tag is
refused before anything is sent.
"""

from __future__ import annotations

from typing import Any

from distcomm.backend._pipeline.steps import Steps
from distcomm.errors import DistcommError, InvalidArgumentError, NotSupportedError
from distcomm.protocol import Work

__all__ = ["PointToPoint"]


class PointToPoint(Steps):
    """send, recv, isend, irecv (module docstring)."""

    def send(self, tensor: Any, dst: int, tag: int = 0) -> None:
        """Send ``tensor`` to ``dst`` (a rank of this communicator)."""
        self.isend(tensor, dst, tag).wait()

    def recv(self, tensor: Any, src: int | None = None, tag: int = 0) -> int:
        """Receive into ``tensor`` from ``src`` (None: any rank); return the sender's rank."""
        work = self.irecv(tensor, src, tag)
        work.wait()
        source = getattr(work, "source", None)
        return int(source) if source is not None else int(src or 0)

    def isend(self, tensor: Any, dst: int, tag: int = 0) -> Work:
        """Start sending ``tensor`` to ``dst``; don't modify it before the Work completes."""
        adapter, dtype = self._kit_begin(tensor, "tensor")
        self._kit_check_rank(dst, "dst")
        self._check_tag(tag)
        self._kit_check_p2p("isend")
        self._kit_check_tag_matched("isend", tag)
        staged = self._kit_stage(adapter, tensor, dtype)
        work = self._kit_start(self._isend, "isend", staged.engine, dst, tag)
        return self._kit_handed(work, (tensor, staged.engine), None)

    def irecv(self, tensor: Any, src: int | None = None, tag: int = 0) -> Work:
        """Start receiving into ``tensor``; the Work's ``source`` is the sender once complete."""
        adapter, dtype = self._kit_begin(tensor, "tensor")
        if src is not None:
            self._kit_check_rank(src, "src")
        elif not self.capabilities.any_source:
            raise InvalidArgumentError(
                f"backend {self.backend_name!r} cannot receive from any source (src=None). "
                "HINT: pass the sender's rank as src."
            )
        self._check_tag(tag)
        self._kit_check_p2p("irecv")
        self._kit_check_tag_matched("irecv", tag)
        staged = self._kit_stage(adapter, tensor, dtype)
        work = self._kit_start(self._irecv, "irecv", staged.engine, src, tag)
        after = staged.write_back if staged.copied else None
        return self._kit_handed(work, (tensor, staged.engine), after)

    def _kit_start(self, primitive: Any, op: str, *args: Any) -> Work:
        """Start a message; an engine exception becomes EngineError."""
        try:
            work: Work = primitive(*args)
        except DistcommError:  # distcomm's own: never wrapped, whatever engine_errors lists
            raise
        except self.engine_errors as exc:
            raise self.engine_failed(op, None, exc) from exc
        return work

    def _kit_check_p2p(self, op: str) -> None:
        if not self.capabilities.p2p:
            raise NotSupportedError(
                f"{op}: backend {self.backend_name!r} has no point-to-point messages. HINT: use "
                "collectives (broadcast, all_gather, ...), or a backend with them (gloo, mpi)."
            )

    def _kit_check_tag_matched(self, op: str, tag: int) -> None:
        if tag and not self.capabilities.p2p_tags:
            raise InvalidArgumentError(
                f"{op}: tag={tag!r}, but backend {self.backend_name!r} does not match messages "
                "by tag: a receive takes the next message from its sender whatever its tag, so "
                "two messages in flight could swap their data. HINT: use tag=0 and post the "
                "receives in the order of the sends, or a backend that matches tags (gloo, mpi)."
            )
