"""`BaseCommunicator`: the public collectives, written once over an engine's few methods.

A backend's factory returns an engine (:mod:`distcomm.backend.engine`: six required methods,
optional ones found by presence); the kit makes a :class:`BaseCommunicator` around it, which
calls the engine and is never subclassed. Each public method is one pipeline of shared steps
(validate, normalise, world of 1, stage, primitive, finish; see
:mod:`distcomm.backend._pipeline.steps`), one module per kind of operation: reductions, data
movement, gathers and scatters, point to point, objects, ``assert_same`` and groups. The steps
accept torch tensors and numpy arrays, answer worlds of 1 locally, stage CUDA tensors through
host memory for CPU-only engines, bridge dtypes the engine lacks through wider ones, emulate AVG,
and copy results back into non-contiguous tensors. An engine method receives contiguous arrays
of a native dtype on a native device and, with ``async_op=True``, may return a
:class:`~distcomm.protocol.Work` (None means done). A contiguous CPU tensor of a native dtype
(the common case) goes to the engine as it is, with no copy and no wrapper.
"""

from __future__ import annotations

import sys
import warnings
from typing import TYPE_CHECKING, Any

from distcomm.backend._pipeline import p2p_vote, routing_ledger
from distcomm.backend._pipeline.assert_same import Sameness
from distcomm.backend._pipeline.coalesced import Coalesced
from distcomm.backend._pipeline.groups import Groups
from distcomm.backend._pipeline.lists import ListForms
from distcomm.backend._pipeline.movement import Movement
from distcomm.backend._pipeline.object_collectives import ObjectCollectives
from distcomm.backend._pipeline.p2p import PointToPoint
from distcomm.backend._pipeline.reductions import Reductions
from distcomm.backend._pipeline.rooted import Rooted
from distcomm.backend.work import retained
from distcomm.environment.info import LaunchInfo
from distcomm.errors import CollectiveMismatchError, DistcommError, DistcommWarning

if TYPE_CHECKING:
    from distcomm.backend.specs import BackendSpec

__all__ = ["BaseCommunicator", "world_over"]


class BaseCommunicator(
    Reductions,
    Coalesced,
    ListForms,
    Movement,
    Rooted,
    PointToPoint,
    ObjectCollectives,
    Sameness,
    Groups,
):
    """A communicator over an engine; see the module docstring.

    ``seq`` counts the collectives called on this communicator that passed validation (object
    collectives, ``new_group`` and ``split`` count once each; point-to-point messages do not):
    it is the same on every member, and timeouts and failures name operations by it. ``op`` is
    the name of the latest of them. ``blocked_seq`` and ``blocked_op`` say what this rank is
    blocked in (0 and "" when it is not), for watchdogs and diagnostics.

    Args:
        engine: the engine (:mod:`distcomm.backend.engine`).
        backend: the backend's name.
        capabilities: what the engine does natively (its spec's).
        rank: this process's rank in the communicator.
        world_size: the number of ranks.
        launch: how the job was launched.
        global_ranks: the world rank of each member (default: ``range(world_size)``).
        timeout: seconds an operation may block.
        name: a label for messages (``"world"``, ``"group 1"``).
    """

    #: torch's ProcessGroup over the same ranks, for torch-native code (DDP's
    #: ``process_group=``, FSDP): ``native`` on the torch backends; on any other, the default
    #: group ``init`` made beside it (``init(torch_group=...)``, docs/interop.md); else None.
    torch_group: Any = None

    # -- identity ----------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def global_ranks(self) -> tuple[int, ...]:
        return self._global_ranks

    @property
    def backend(self) -> str:
        return self.backend_name

    @property
    def native(self) -> Any:
        """The engine's own handle (an mpi4py ``Comm``, a torch ProcessGroup; None for engines
        without one)."""
        return getattr(self.engine, "native", None)

    @property
    def launch(self) -> LaunchInfo:
        return self._launch

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.backend_name} {self.name!r} "
            f"rank {self._rank} of {self._world_size}>"
        )

    def finalize(self) -> None:
        """Release the engine's resources for this communicator. Idempotent.

        First, unless the mismatch check is off, the ranks confirm that they made the same
        collectives (a vote of point-to-point messages: every member calls ``finalize``) and
        that the split tables of their uneven all-to-alls since the last check point agreed; if
        they did not, the communicator is released all the same and the
        :class:`~distcomm.errors.CollectiveMismatchError` raised, so that no rank ends as if
        nothing happened. Not while an exception is being handled (``finalize`` in a
        ``finally`` block or an ``except`` clause): that exception says what went wrong, and
        the other ranks may never come. Ranks that do not call ``finalize`` within the timeout
        (busy, failed or gone) are no evidence of a mismatch: a warning says so, and this rank
        finalizes alone.

        Waits (up to the timeout) for the Works handed out that have not completed; if one
        still has not, the engine may yet use its memory and the communicator, so both are
        kept until the process exits instead of freed (with a warning).
        """
        if self.unusable == "finalized":
            return
        failed = self._confirm_the_end()
        left = self._pending.settle(self.timeout if self.unusable is None else 0.0)
        if left:
            retained().append(self)
            warnings.warn(
                f"finalize: {len(left)} operation(s) on {self.describe()} had not completed "
                f"({', '.join(map(repr, left))}); the engine may still use their memory, so the "
                "communicator and their buffers are kept until the process exits. HINT: wait() "
                "for every Work before finalize().",
                DistcommWarning,
                stacklevel=2,
            )
        else:
            self._finalize()
        self.unusable = "finalized"
        if failed is not None:
            raise failed

    def _confirm_the_end(self) -> CollectiveMismatchError | None:
        """Before finalizing: confirm with the other ranks that they made the same calls (a
        vote, unless the policy is off, this communicator already failed or an exception is
        being handled); the mismatch to raise once the communicator is released, if they did
        not (a vote that cannot finish only warns)."""
        self._lend_entry(None)  # the last call's entry is complete: the vote's are not its
        channel = self._object_channel()
        if channel is not self:
            channel._lend_entry(None)
        h = self._mismatch_check
        if h is None:
            return None
        h.end()
        handling = sys.exc_info()[1] is not None  # the exception in flight says what went wrong
        if self.unusable is not None or handling or not self._can_confirm():
            return None
        try:
            p2p_vote.vote(self, p2p_vote.FINALIZE)
            routing_ledger.settle(self, self.seq, "finalize()")
        except CollectiveMismatchError as exc:
            return exc
        except DistcommError as exc:  # no evidence of a mismatch: the others are busy or gone
            first = (str(exc).splitlines() or [type(exc).__name__])[0]
            warnings.warn(
                f"{first} Finalized without it. HINT: every rank calls finalize() at the end; "
                "a rank that failed or left early explains this (look at its output).",
                DistcommWarning,
                stacklevel=3,
            )
        return None


def world_over(
    spec: BackendSpec, engine: Any, launch: LaunchInfo, timeout: float
) -> BaseCommunicator:
    """The world communicator over ``engine``, which ``spec``'s factory made for ``launch`` (or
    for the launch it settled on, its ``launch``: torch under MPI derives the rendezvous
    address)."""
    launch = getattr(engine, "launch", None) or launch
    return BaseCommunicator(
        engine,
        backend=spec.name,
        capabilities=spec.capabilities,
        rank=launch.rank,
        world_size=launch.world_size,
        launch=launch,
        timeout=timeout,
    )
