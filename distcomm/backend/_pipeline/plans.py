"""Plans: a call of a kind the pipeline took before runs the engine's plan for that kind.

The first call of a kind goes through the pipeline (validated, counted, recorded by the mismatch
check). Its kind, (op, array class, dtype, byte size, root) and for a message its tag, is then
remembered with its fingerprint in the check's history, and the engine is asked once for a plan
of it (:meth:`distcomm.backend.engine.Engine.plan`): a callable ``run(x, y)`` that moves any
call of that kind, ``y`` being the output, the root's list or None. A later blocking
call of a remembered kind, outside the check points, on a communicator that no hook observes,
runs the plan from the public method (:meth:`Steps._planned
<distcomm.backend._pipeline.steps.Steps._planned>`), its ``seq`` counted and its fingerprint
kept: where calls of several kinds interleave, the history starts the run of the kind's
fingerprint (the ranks agreed on it before). A plan that cannot move a call of its kind as it is
(memory that is not contiguous) raises :class:`NotPlanned` before it moves anything, and the
pipeline takes the call.

What the kit checks before it runs a plan: the kind (the class, dtype and byte size of ``x``
and the root, an int), and ``y``: for an op with an output (:data:`OUTPUTS`), of ``x``'s class
and dtype and the size the op implies; for gather and scatter (:data:`ROOTED`), on the root a
list or tuple of world_size arrays of ``x``'s class, dtype and byte size, None elsewhere.
Anything else goes to the pipeline, which says what is wrong with it. Reductions are planned for
SUM only; ``all_reduce``'s plan runs in place.

The barrier's plan is the engine's (its kind's array is :data:`NO_ARRAY`), else its
``_barrier``; it is dropped while split tables of uneven all-to-alls wait to be settled, which
the next barrier's pipeline does (:meth:`~distcomm.backend._pipeline.movement.Movement.barrier`).
The uneven all-to-all (sizes differ from call to call) is planned per class and dtype (the
op :data:`UNEVEN`): a blocking one of a remembered class and dtype, whose arrays and split
lists need no more than a look, runs the engine's plan with ``y = (output, output_splits,
input_splits)`` in elements, else the engine's ``_all_to_all_v``
(:meth:`~distcomm.backend._pipeline.movement.Movement._uneven_planned`); object collectives
skip the kit's steps for a kind (op, root) taken before.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from distcomm.backend._pipeline import recording
from distcomm.backend.engine import PLANNED, CallKind
from distcomm.errors import DistcommWarning
from distcomm.protocol import ReduceOp

if TYPE_CHECKING:
    from distcomm.backend.arrays import Adapter

__all__ = ["NO_ARRAY", "OUTPUTS", "ROOTED", "UNEVEN", "Fits", "Plans"]


class _NoArray:
    """What a call without an array (the barrier) passes where a kind's array goes: its kind is
    the op's alone."""

    __slots__ = ()
    dtype = shape = None
    nbytes = 0


#: The array of a call that has none (:class:`_NoArray`).
NO_ARRAY = _NoArray()
_BARRIER = ("barrier", _NoArray, None, 0, None)
#: The rooted ops: ``y`` is the list of world_size arrays like ``x`` on the root, None elsewhere.
ROOTED = frozenset({"gather", "scatter"})
#: The ops with an output beside the input: its byte size for an input of ``n`` bytes.
OUTPUTS: dict[str, Callable[[int, int], int]] = {
    "all_gather_into_tensor": lambda n, world: n * world,
    "reduce_scatter_tensor": lambda n, world: n // world if n % world == 0 else -1,
    "all_to_all_single": lambda n, world: n,
}
#: The kind of the uneven all-to-alls of a class and dtype (the op their plan is asked for).
UNEVEN = "all_to_all_v"
_PLANNED_REDUCE_OPS = (None, ReduceOp.SUM)
#: How many kinds of call a communicator remembers (then it starts over).
_REMEMBERED = 256


class Plans:
    """The kinds of call a communicator took through its pipeline: each kind's plan (None: the
    engine has none) and fingerprint in the mismatch check's history. Its communicator reads
    :attr:`last` on every planned call and blocking message, and :attr:`kinds` for object
    collectives (the same dicts for the object's life: they are cleared, never replaced);
    only this object writes them (:meth:`find`, :meth:`find_uneven` and :meth:`find_message`
    keep an op's latest kind)."""

    __slots__ = ("_barrier", "_engine_plan", "_group", "_rank", "_warned", "kinds", "last")

    def __init__(
        self,
        engine_plan: Callable[[CallKind], Any] | None,
        barrier: Callable[[Any, Any], Any],
        group: tuple[int, ...],
        rank: int,
    ) -> None:
        #: (op, class, dtype, byte size, root[, tag]) -> (plan or None, fingerprint, the check
        #: of ``y`` or None, what names a call of the kind: its flight recorder entry's kind
        #: (:func:`~distcomm.backend._pipeline.recording.head`), a message's label for the
        #: "blocked in" mark); an object collective's kind is (op, None, None, None, root), with
        #: no plan; an uneven call's (:data:`UNEVEN`, op, class, dtype).
        self.kinds: dict[tuple[Any, ...], tuple[Any, int, Any, Any]] = {}
        #: op -> (class, dtype, byte size, root, the entry in :attr:`kinds`): the kind of the
        #: op's latest planned call, found without hashing a key (a numpy dtype's hash is
        #: computed on every call); under :data:`UNEVEN`, the uneven all-to-all's latest
        #: (class, dtype, 0, None, entry); a message's root is (peer, tag). Emptied whenever
        #: :attr:`kinds` changes (the same dict for the object's life, as :attr:`kinds`).
        self.last: dict[str, tuple[Any, Any, int, Any, tuple[Any, int, Any, Any]]] = {}
        self._group = group  # the communicator's global ranks, for the recorder's kinds
        self._rank = rank  # its rank in them, for the check of a rooted call's list
        self._engine_plan = engine_plan
        self._barrier = barrier  # the barrier's plan, the kit's own
        self._warned: set[str] = set()  # the ops whose engine's _plan raised (warned once)

    def learn(
        self,
        op: str,
        x: Any,
        adapter: Adapter | None,
        root: int | None,
        reduce_op: ReduceOp | None,
        fp: int,
        native_dtypes: frozenset[str],
        varies: bool = False,
    ) -> None:
        """Remember the kind of collective ``op`` (which the pipeline validated and counted;
        ``fp``: its fingerprint, 0 without a history) and ask the engine for its plan, once per
        kind. Ops of :data:`PLANNED`, SUM reductions, arrays of a dtype the engine moves; an
        uneven all-to-all (``varies``) by its class and dtype; the barrier (``x`` is
        :data:`NO_ARRAY`) by its op, with the kit's plan."""
        if x is NO_ARRAY:
            known = self.kinds.get(_BARRIER)
            if known is not None:
                self._keep(_BARRIER, known[0], fp, None, known[3])
                return
            plan = self._ask(CallKind(op, x, None))
            name = recording.head(op, self._group, None, None, None)
            self._keep(_BARRIER, plan or self._barrier, fp, None, name)
            return
        if adapter is None or reduce_op not in _PLANNED_REDUCE_OPS:
            return
        native = adapter.dtype(x) in native_dtypes
        if varies:
            if native:
                key = (UNEVEN, op, x.__class__, x.dtype)
                known = self.kinds.get(key)
                plan = self._ask(CallKind(UNEVEN, x, None)) if known is None else known[0]
                self._keep(key, plan, fp, None, None)
            return
        if op not in PLANNED:
            return
        key = (op, x.__class__, x.dtype, x.nbytes, root)
        known = self.kinds.get(key)
        if known is not None:
            if known[1] != fp:
                self._keep(key, known[0], fp, known[2], known[3])
            return
        plan = self._ask(CallKind(op, x, root)) if native else None
        name = recording.head(op, self._group, adapter.dtype(x), x.nbytes, root)
        fits = _fits(op, x, root, self._rank, len(self._group))
        self._keep(key, plan, fp, fits, name)

    def find(self, op: str, x: Any, root: Any) -> tuple[Any, int, Any, Any] | None:
        """The entry of collective ``op``'s kind for ``x`` and ``root``, kept as the op's latest
        (:attr:`last`); None: a kind not taken before. Raises AttributeError or TypeError for
        an ``x`` that is no array, a ``root`` that is no key."""
        cls, dtype, nbytes = x.__class__, x.dtype, x.nbytes
        entry = self.kinds.get((op, cls, dtype, nbytes, root))
        if entry is not None:
            self.last[op] = (cls, dtype, nbytes, root, entry)
        return entry

    def find_uneven(self, x: Any) -> tuple[Any, int, Any, Any] | None:
        """The entry of the uneven all-to-all of ``x``'s class and dtype, kept as its latest
        (:attr:`last`, under :data:`UNEVEN`); None: a kind not taken before. Raises
        AttributeError for an ``x`` that is no array, TypeError for a dtype that is no key."""
        cls, dtype = x.__class__, x.dtype
        last = self.last.get(UNEVEN)
        if last is not None and last[0] is cls and last[1] is dtype:
            return last[4]  # type: ignore[no-any-return]
        entry = self.kinds.get((UNEVEN, "all_to_all_single", cls, dtype))
        if entry is not None:
            self.last[UNEVEN] = (cls, dtype, 0, None, entry)
        return entry

    def find_message(
        self, op: str, x: Any, peer: Any, tag: Any
    ) -> tuple[Any, int, Any, Any] | None:
        """The entry of message ``op`` of ``x``'s kind with ``peer`` and ``tag``, kept as the
        op's latest (:attr:`last`, its root ``(peer, tag)``, which the caller compares first);
        None: a kind not taken before. Raises TypeError for a ``peer`` or ``tag`` that is no
        key."""
        cls, dtype, nbytes = x.__class__, x.dtype, x.nbytes
        entry = self.kinds.get((op, cls, dtype, nbytes, peer, tag))
        if entry is not None:
            self.last[op] = (cls, dtype, nbytes, (peer, tag), entry)
        return entry

    def learn_message(
        self, op: str, x: Any, peer: int | None, tag: int
    ) -> tuple[Any, int, Any, str]:
        """The entry of message ``op`` (send, recv) of ``x``'s kind with ``peer`` and ``tag``
        (which the kit checked): the engine's plan (asked the first time; None: it has none)
        and, last, the label a rank blocked in it is said to be in (``send to rank 1 (tag
        0)``)."""
        key = (op, x.__class__, x.dtype, x.nbytes, peer, tag)
        known = self.kinds.get(key)
        if known is None:
            if op == "send":
                label = f"send to rank {peer} (tag {tag})"
            else:
                label = f"recv from {'any rank' if peer is None else f'rank {peer}'} (tag {tag})"
            known = self._keep(key, self._ask(CallKind(op, x, peer, tag)), 0, None, label)
        return known  # type: ignore[return-value]

    def learn_objects(self, op: str, root: int | None, fp: int) -> None:
        """Remember object collective ``op`` at ``root`` as a kind taken before."""
        self._keep((op, None, None, None, root), None, fp, None, None)

    def _ask(self, kind: CallKind) -> Any:
        """The engine's plan of ``kind``; None where it has none, or where asking raised (an
        engine's bug must not break the call the pipeline is making: it warns, once per op and
        communicator)."""
        if self._engine_plan is None:
            return None
        try:
            return self._engine_plan(kind)
        except Exception as exc:  # any bug of a plugin's
            if kind.op not in self._warned:
                self._warned.add(kind.op)
                warnings.warn(
                    f"the engine's plan({kind.op!r} ...) raised {type(exc).__name__}: {exc}; "
                    "such calls take the general pipeline. HINT: plan returns None for a kind "
                    "it does not plan (docs/plugins.md).",
                    DistcommWarning,
                    stacklevel=2,
                )
            return None

    @property
    def engine_plan(self) -> Callable[[CallKind], Any] | None:
        """What is asked for the plan of a kind learnt (the engine's ``plan``; None: none)."""
        return self._engine_plan

    def ask_through(self, engine_plan: Callable[[CallKind], Any] | None) -> None:
        """Ask ``engine_plan`` for the plans of the kinds learnt from now on, forgetting those
        known (so that it is asked again): for the conformance kit and tests, which count or
        wrap the engine's plans (:attr:`engine_plan` gives the one to wrap, or to put back)."""
        self._engine_plan = engine_plan
        self.forget()

    def drop_barrier(self) -> None:
        """Forget the barrier's kind: split tables wait to be settled, which the next barrier's
        pipeline does (:meth:`~distcomm.backend._pipeline.movement.Movement.barrier`)."""
        self.kinds.pop(_BARRIER, None)
        self.last.pop("barrier", None)  # called on every uneven call: the other ops' stay

    def forget(self) -> None:
        """Forget every kind: the next call of each takes the pipeline."""
        self.kinds.clear()
        self.last.clear()

    def _keep(
        self, key: tuple[Any, ...], plan: Any, fp: int, fits: Any, name: Any
    ) -> tuple[Any, int, Any, Any]:
        if key in self.kinds:  # an entry replaced: no op's latest kind keeps the old one
            self.last.clear()
        elif len(self.kinds) >= _REMEMBERED:
            self.kinds.clear()
            self.last.clear()
        entry = self.kinds[key] = (plan, fp, fits, name)
        return entry


#: How a :class:`Fits` checks ``y``: an op's output; nothing (a rooted op off its root); the
#: root's list.
OUTPUT, NOTHING, PARTS = 1, 2, 3


class Fits(tuple):  # type: ignore[type-arg]
    """The check of ``y`` for a kind of call, made once per kind: ``(how, class, dtype, byte
    size, count)``, ``how`` one of :data:`OUTPUT` (``y`` of the class, dtype and byte size),
    :data:`NOTHING` (``y`` is None) and :data:`PARTS` (a list or tuple of ``count`` arrays of
    exactly the class, dtype and byte size). Called, it answers for ``y``; the compiled planned
    path (``_planned_path.c``) reads it as data, without a call."""

    __slots__ = ()

    def __call__(self, y: Any) -> bool:
        how, cls, dtype, nbytes, count = self
        if how == OUTPUT:
            return y.__class__ is cls and y.dtype is dtype and y.nbytes == nbytes  # type: ignore[no-any-return]
        if how == NOTHING:
            return y is None
        kind = y.__class__
        if (kind is not list and kind is not tuple) or len(y) != count:
            return False
        for p in y:
            if p.__class__ is not cls or p.dtype is not dtype or p.nbytes != nbytes:
                return False
        return True


def _fits(op: str, x: Any, root: Any, rank: int, world_size: int) -> Fits | None:
    """The check of ``y`` for a kind of ``op`` on ``x`` and ``root`` (:class:`Fits`): None
    where the op has no ``y``. For an op with an output, ``y`` of ``x``'s class and dtype and
    the size the op implies; for a rooted op, None off the root, and on it a list or tuple of
    world_size arrays of exactly ``x``'s class, dtype and byte size (so its element count)."""
    cls, dtype, nbytes = x.__class__, x.dtype, x.nbytes
    if op in OUTPUTS:
        return Fits((OUTPUT, cls, dtype, OUTPUTS[op](nbytes, world_size), 1))
    if op not in ROOTED:
        return None
    if rank != root:
        return Fits((NOTHING, None, None, 0, 0))
    return Fits((PARTS, cls, dtype, nbytes, world_size))
