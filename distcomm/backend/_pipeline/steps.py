"""The steps every pipeline of :class:`~distcomm.backend.BaseCommunicator` is made of.

Each public operation runs validate -> normalise -> world of 1 -> stage -> primitive -> finish:

- :meth:`Steps._begin` checks the communicator is usable and finds the array adapter (validate,
  normalise); :meth:`Steps._count` numbers the operation once it passed validation (``seq``);
- a world of 1 answers locally, with no engine call;
- :meth:`Steps._stage` gives the engine contiguous memory of a native dtype on a native device;
- :meth:`Steps._call` runs the primitive: blocking under this rank's "blocked in" mark (set and
  cleared here, in a ``try/finally``), or started with ``async_op``; an engine's own exception
  becomes :class:`~distcomm.errors.EngineError`;
- :meth:`Steps._finish` (and :meth:`Steps._complete`,
  :meth:`Steps._finish_split`) copies results back where the engine worked on a copy, or
  hands the caller a Work that owns every buffer.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from sys import _getframe
from time import time as _wall
from typing import TYPE_CHECKING, Any

from distcomm._call_sites import user_site
from distcomm.backend._pipeline import mismatch_check, node_collectives, observing, recording
from distcomm.backend._pipeline.arguments import ArgumentChecks
from distcomm.backend._pipeline.defaults import Defaults
from distcomm.backend._pipeline.engine_failures import Failures
from distcomm.backend._pipeline.mismatch_check import MismatchCheck
from distcomm.backend._pipeline.plans import Plans
from distcomm.backend._pipeline.recording import COMPLETED, ISSUED, Recorder
from distcomm.backend._pipeline.staging import Staged, stage
from distcomm.backend.arrays import Adapter, adapter_for
from distcomm.backend.engine import ATTRIBUTES, OPTIONAL, REQUIRED, NotPlanned
from distcomm.backend.events import CollectiveEvent
from distcomm.backend.specs import Capabilities
from distcomm.backend.work import BaseWork, CompletedWork, PendingWorks
from distcomm.errors import CollectiveMismatchError, DistcommError, DistcommWarning
from distcomm.protocol import ReduceOp, Work

if TYPE_CHECKING:
    from distcomm.backend.communicator import BaseCommunicator
    from distcomm.environment.info import LaunchInfo

__all__ = ["DONE", "Steps", "compiled_messages"]

#: The registered hooks (empty: none), tested by each planned call.
_hooks = observing.registered

#: What an async operation of a world of 1 returns.
DONE = CompletedWork()
#: The optional engine methods bound under the same names with a ``_`` before them (``bind``
#: is called once; ``check_tag`` runs after the kit's own check).
_BOUND = tuple(name for name in OPTIONAL if name not in ("check_tag", "bind"))
_ABSENT = object()
#: What :meth:`Steps._planned_opening` returns for a call the pipeline must take.
_DECLINED = object()

try:  # the common case of a planned call compiled (built at install where a C compiler is)
    from distcomm.backend._pipeline import _planned_path
except ImportError:  # none: the Python runs every call
    _planned_path = None  # type: ignore[assignment]


def _compiled(planned: Callable[..., bool]) -> Any:
    """:meth:`Steps._planned` with its common case compiled (``_planned_path.c``: a known kind
    of call, no hook, the mismatch check's current run, no recorder or one at a site it knows)
    and every other call handed to the Python, untouched, as its ``__wrapped__``; the Python
    alone where the extension was not built."""
    if _planned_path is None:
        return planned
    return _planned_path.accelerate(planned, _hooks, NotPlanned, COMPLETED)


def compiled_messages(planned: Callable[..., Any]) -> Any:
    """``PointToPoint._planned_message`` with its common case compiled (a message of its op's
    latest kind, with a plan, on a usable communicator; a plan's exception goes to
    ``_message_raised``), every other message handed to the Python, its ``__wrapped__``; the
    Python alone where the extension was not built."""
    if _planned_path is None:
        return planned
    return _planned_path.accelerate_messages(planned)


class Steps(ArgumentChecks, Failures, Defaults):
    """The state of a communicator and the steps its pipelines share (module docstring).

    The state is in slots (``__slots__``): past about 30 names in an object's ``__dict__``,
    CPython (3.11) gives up its fast attribute and method look-ups on it, which cost a planned
    call about 0.2 us of the 0.7 it adds to the engine's. The ``__dict__`` keeps the engine's
    bound methods (:meth:`_use`) and the few names other modules add.
    """

    __slots__ = (
        "_children",
        "_control",
        "_debug",
        "_direct_dtypes",
        "_engine_tag",
        "_entry",
        "_entry_device",
        "_entry_seq",
        "_event",
        "_global_ranks",
        "_last_kind",
        "_launch",
        "_lineage",
        "_mismatch_check",
        "_native_avg",
        "_native_dtypes",
        "_native_ops",
        "_next_check",
        "_node",
        "_pending",
        "_plans",
        "_rank",
        "_recorder",
        "_site_code",
        "_site_via",
        "_solo",
        "_thread",
        "_vote",
        "_warned_staging",
        "_world_size",
        "backend_name",
        "blocked_op",
        "blocked_seq",
        "bound_device",
        "capabilities",
        "cpu_only_reason",
        "devices",
        "engine",
        "engine_errors",
        "name",
        "op",
        "p2p_marks",
        "seq",
        "timeout",
        "unusable",
    )

    #: The engine's own exceptions that mean it failed (its ``engine_errors``).
    engine_errors: tuple[type[BaseException], ...]
    #: The device types whose memory the engine moves (its ``devices``, without indices).
    devices: frozenset[str]
    #: The one accelerator device this rank's engine is bound to (``"cuda:0"``: NCCL; an
    #: indexed entry of the engine's ``devices``); tensors on another device of its type are
    #: refused. None: any device it moves.
    bound_device: str | None
    #: Why the engine moves no GPU memory, for the one staging warning (e.g. what MPI said).
    cpu_only_reason: str
    #: The next ``seq`` the mismatch check runs at (from the ``debug`` policy).
    _next_check: int
    #: The event of the public call in progress while hooks are registered, else None
    #: (:mod:`~distcomm.backend._pipeline.observing`).
    _event: Any
    #: The mismatch check's 16-byte buffer on this channel (made at the first check).
    _vote: Any
    #: The mismatch check (None: the policy is off, or a world of 1).
    _mismatch_check: MismatchCheck | None
    #: The flight recorder this communicator's calls go to (None: none records them), and the
    #: entry of the call the pipeline numbered last (:mod:`~distcomm.backend._pipeline.recording`).
    _recorder: Recorder | None
    _entry: list[Any] | None
    _entry_device: str | None
    _entry_seq: int
    #: What the flight recorder's planned calls learnt of their callers: the code of the user's
    #: function that made the last one, and of the distcomm module function it went through
    #: (None: none) (:meth:`_user_site`).
    _site_code: Any
    _site_via: Any
    #: Which communicator this is among those of the same members: "" for a world, then
    #: "/n.i" per generation (the n-th group made from its parent, its i-th part).
    _lineage: str
    #: How many groups were made from this communicator (new_group, split).
    _children: int

    def __init__(
        self,
        engine: Any,
        *,
        backend: str,
        capabilities: Capabilities,
        rank: int,
        world_size: int,
        launch: LaunchInfo,
        global_ranks: Sequence[int] | None = None,
        timeout: float = 1800.0,
        name: str = "world",
    ) -> None:
        self._event = self._vote = self._mismatch_check = self._recorder = None
        self._entry = self._entry_device = None
        self._site_code = self._site_via = None
        self._entry_seq = self._children = 0
        self._lineage = ""
        #: The engine this communicator drives (:mod:`distcomm.backend.engine`).
        self.engine = engine
        #: The backend's name (``"mpi"``) and what its engine does natively.
        self.backend_name = backend
        self.capabilities = capabilities
        if "uint8" not in capabilities.dtypes:
            raise TypeError(
                f"backend {backend!r}: capabilities.dtypes must include 'uint8': object "
                "collectives, new_group and split travel as bytes"
            )
        self._use(engine)
        self._rank = rank
        self._world_size = world_size
        self._solo = world_size == 1  # collectives return at once, the engine untouched
        self._launch = launch
        self._global_ranks = (
            tuple(global_ranks) if global_ranks is not None else tuple(range(world_size))
        )
        self.timeout = float(timeout)
        self.name = name
        self.seq = 0
        self.op = ""
        self.unusable: str | None = None
        #: What this rank is blocked in: the sequence number of the collective (negative for a
        #: point-to-point wait), 0 when none; ``blocked_op`` names a Work being waited for.
        self.blocked_seq = 0
        self.blocked_op = ""
        self.p2p_marks = itertools.count(1)
        #: The thread that made this communicator: the one that uses it (one thread per rank),
        #: whose stack :func:`distcomm.backend.stacks.where` shows a peer.
        self._thread = threading.get_ident()
        #: The kinds of call the pipeline took, their plans and fingerprints
        #: (:mod:`~distcomm.backend._pipeline.plans`).
        self._plans = Plans(self._plan, self._barrier_plan, self._global_ranks, self._rank)
        self._last_kind = self._plans.last  # the same dict for its life: read on every call
        self.debug = mismatch_check.policy()  # DISTCOMM_DEBUG; init(debug=...) sets it after
        #: The Works handed to the caller that may not have completed.
        self._pending = PendingWorks()
        self._warned_staging = False
        self._native_dtypes = self.capabilities.dtypes
        self._native_ops = tuple(op for op in ReduceOp if op.name in self.capabilities.reduce_ops)
        self._native_avg = ReduceOp.AVG in self._native_ops
        self._direct_dtypes = self._native_dtypes - {"bool"}
        bind = getattr(engine, "bind", None)
        if bind is not None:
            bind(self)
        #: CPU tensor collectives through node memory, where the engine has no such path
        #: (:mod:`~distcomm.backend._pipeline.node_collectives`): once the group proved it
        #: shares the node (a collective: every member makes the communicator at once), its
        #: methods stand for the engine's and hand it the calls they do not take.
        self._node = node_collectives.over(self)
        if self._node is not None and self._node.prove():
            for name, method in self._node.methods().items():
                setattr(self, "_" + name, method)
            self._plans.ask_through(self._plan)

    def _use(self, engine: Any) -> None:
        """Bind ``engine``'s methods to this communicator's ``_`` names (``self._all_reduce``
        is its ``all_reduce``): the ones it lacks stay the kit's (:mod:`.defaults`).

        Raises:
            TypeError: the engine lacks a required method; the message names them all.
        """
        missing = [name for name in REQUIRED if not callable(getattr(engine, name, None))]
        if missing:
            raise TypeError(
                f"backend {self.backend_name!r}: its engine ({type(engine).__qualname__}) lacks "
                f"the required method(s) {', '.join(missing)} of distcomm's engine contract. "
                "HINT: see distcomm.backend.engine (docs/plugins.md, 'The engine contract')."
            )
        for name in (*REQUIRED, *_BOUND):
            method = getattr(engine, name, None)
            if method is not None:
                setattr(self, "_" + name, method)
        self._engine_tag = getattr(engine, "check_tag", None)
        control = getattr(engine, "control_isend", _ABSENT)  # None: no votes here
        self._control = control is not None and (control is not _ABSENT or self.capabilities.p2p)
        devices = frozenset(getattr(engine, "devices", ATTRIBUTES["devices"]))
        self.devices = frozenset(d.partition(":")[0] for d in devices)
        self.bound_device = next((d for d in sorted(devices) if ":" in d), None)
        self.cpu_only_reason = getattr(engine, "cpu_only_reason", ATTRIBUTES["cpu_only_reason"])
        self.engine_errors = tuple(getattr(engine, "engine_errors", ATTRIBUTES["engine_errors"]))

    def _control_ready(self) -> bool:
        """Whether the kit's votes (``_control_isend``) travel here: the engine's own, or its
        point-to-point messages (the engine set ``control_isend`` to None: none)."""
        return self._control

    @property
    def node_memory(self) -> bool:
        """Whether this group's CPU tensor collectives go through node memory: its engine has
        no shared-memory path of its own and its ranks proved, when it was made, that they
        share this node (docs/backends.md, "Node memory")."""
        return self._node is not None and self._node.proved

    @property
    def world_of_one_shortcut(self) -> bool:
        """Whether, in a world of 1, collectives return at once without calling the engine
        (True, the default: nothing to exchange). Set it to False to make such a world call
        the engine like any other, e.g. to test a GPU engine on a machine with one GPU
        (``scripts/gpu-check.sh``)."""
        return self._solo or self._world_size > 1

    @world_of_one_shortcut.setter
    def world_of_one_shortcut(self, value: bool) -> None:
        self._solo = bool(value) and self._world_size == 1
        self._plans.forget()

    def describe(self) -> str:
        """A short label for messages: backend, name and size."""
        ranks = "rank" if self._world_size == 1 else "ranks"
        return f"{self.backend_name} {self.name!r} ({self._world_size} {ranks})"

    # -- validate, normalise -------------------------------------------------------------------
    def _check_usable(self) -> None:
        if self.unusable is not None:
            raise DistcommError(
                f"communicator {self.describe()} can no longer be used: {self.unusable}. "
                "HINT: create a new one with distcomm.init() after distcomm.finalize()."
            )

    def _begin(
        self, x: Any, what: str, adapter: Adapter | None = None, written: bool = False
    ) -> tuple[Adapter, str]:
        """The usable communicator's adapter and dtype of ``x`` (an array the call writes its
        result into where ``written``: refused where it may not be written)."""
        if self.unusable is not None:
            self._check_usable()
        if adapter is None:
            adapter = adapter_for(x, what)
        dtype = adapter.dtype(x)
        if written:
            self._check_written(adapter, x, what)
        return adapter, dtype

    def _count(
        self,
        op: str,
        x: Any = None,
        adapter: Adapter | None = None,
        root: int | None = None,
        reduce_op: ReduceOp | None = None,
        varies: bool = False,
        layout: tuple[int, ...] | None = None,
    ) -> None:
        """Count collective ``op``, which passed validation (see BaseCommunicator), fold it into
        the running fingerprint and, where the check policy says so, agree with the other
        ranks that they made the same calls (:mod:`~distcomm.backend._pipeline.mismatch_check`;
        ``_next_check`` is the next checked ``seq``, so that an unchecked call tests one
        integer). Registered hooks see the call here first
        (:mod:`~distcomm.backend._pipeline.observing`), and the flight recorder gets its entry
        (:mod:`~distcomm.backend._pipeline.recording`). ``varies``: the element count may
        differ from rank to rank; ``layout``: what every rank must pass alike in its place (the
        sizes of an uneven operation)."""
        seq = self.seq = self.seq + 1
        self.op = op
        if self._event is observing.PENDING:
            self._observe(observing.event_of(self, op, x, adapter, root, reduce_op))
        rec = self._recorder
        if rec is not None:
            entry = self._open_entry(op, seq, x, adapter, root)
            if self._solo:  # answered without the engine: issued and completed now
                entry[ISSUED] = recording.stamp(self._entry_device)
                entry[COMPLETED] = recording.stamp(self._entry_device)
        check = self._mismatch_check
        fp = 0
        try:
            if check is not None:
                fp = check.record(self, seq, op, x, adapter, root, reduce_op, varies, layout)
            if x is not None and not self._solo:  # a world of 1 calls no engine
                moved = self._native_dtypes if reduce_op is None else self._direct_dtypes
                self._plans.learn(op, x, adapter, root, reduce_op, fp, moved, varies)
            if check is not None and (seq >= self._next_check or check.check_at == seq):
                if seq >= self._next_check:
                    self._next_check = check.next_point(seq + 1)
                check.check(self, x)
        except BaseException as exc:
            if rec is not None:
                rec.failed(entry, exc)
            raise

    @property
    def debug(self) -> str:
        """The mismatch check policy of this communicator: ``"sample"`` (the default),
        ``"check"`` (every collective) or ``"off"``; settable (``DISTCOMM_DEBUG``,
        ``init(debug=...)``). Groups made from it inherit it."""
        return self._debug

    @debug.setter
    def debug(self, value: str) -> None:
        self._debug = mismatch_check.policy(value)
        if self._debug == "off" or self._world_size == 1:
            self._mismatch_check = None
        elif self._mismatch_check is None:
            self._mismatch_check = MismatchCheck(self, self._debug)
        else:
            self._mismatch_check.set_policy(self._debug)
        check = self._mismatch_check
        self._next_check = sys.maxsize if check is None else check.next_point(self.seq + 1)
        self._plans.forget()

    @contextlib.contextmanager
    def _setting_up(self) -> Iterator[None]:
        """distcomm's own calls on this communicator while ``init`` sets it up (the rendezvous
        of torch's group beside it): not the program's operations. Hooks do not see them, the
        mismatch check does not record them, and afterwards ``seq`` is what it was, so that the
        program's first collective is #1. Every rank makes the same calls here."""
        saved = (self.seq, self.op, self._next_check, self._mismatch_check, self._recorder)
        event, self._event = self._event, observing.UNSEEN
        self._mismatch_check = self._recorder = self._entry = None
        try:
            yield
        finally:
            self._event = event
            self.seq, self.op, self._next_check, self._mismatch_check, self._recorder = saved
            self._entry = None
            self._plans.forget()  # its calls were not recorded: no plan from them

    def _after_mismatch(self, error: CollectiveMismatchError) -> None:
        """The ranks found the collective mismatch ``error``. Where no rank ran the operation
        (this rank's latest), it counts as not made on every rank: the histories agree again,
        no kind is planned from what it described and the communicator
        stays usable. Otherwise it is retired."""
        h = self._mismatch_check
        if self._recorder is not None and self._entry is not None:
            self._recorder.failed(self._entry, error)
        if error.ran is not None:
            self.unusable = f"collective mismatch at operation #{error.seq}"
        elif h is not None and not h.ended and self.seq == error.seq:
            h.neutralise(self.seq)
            h.agree(self.seq)
            self._plans.forget()

    def _can_confirm(self) -> bool:
        """Whether this communicator's calls can be confirmed by a vote of point-to-point
        messages (:mod:`~distcomm.backend._pipeline.p2p_vote`)."""
        return self._world_size > 1 and self._object_channel()._control_ready()

    # -- stage ---------------------------------------------------------------------------------
    def _stage(
        self, adapter: Adapter, x: Any, dtype: str, what: str = "tensor", apart_from: Any = None
    ) -> Staged:
        return stage(
            adapter,
            x,
            dtype,
            native_dtypes=self._native_dtypes,
            devices=self.devices,
            backend=self.backend_name,
            warn_staging=self._warn_staging,
            what=what,
            bound=self.bound_device,
            apart_from=apart_from,
        )

    def _warn_staging(self, device: str) -> None:
        if not self._warned_staging:
            self._warned_staging = True
            why = f" ({self.cpu_only_reason})" if self.cpu_only_reason else ""
            warnings.warn(
                f"backend {self.backend_name!r} moves CPU memory only{why}: {device} tensors are "
                "copied through host memory (slower). HINT: use a GPU backend such as nccl.",
                DistcommWarning,
                stacklevel=5,
            )

    # -- primitive -----------------------------------------------------------------------------
    def _call(self, primitive: Callable[..., Work | None], async_op: bool, *args: Any) -> Any:
        """Run ``primitive(*args, async_op)``: blocking (and waited for) under this rank's
        "blocked in" mark, or started, returning its Work. An engine exception (one of
        ``engine_errors``) becomes EngineError naming the operation."""
        entry = self._entry
        if entry is not None and self._entry_seq == self.seq and self._checking_for is None:
            return self._call_recorded(entry, primitive, async_op, *args)
        if async_op:
            try:
                return primitive(*args, True)
            except DistcommError:  # distcomm's own (a timeout): never wrapped, whatever
                raise  # engine_errors lists (an OSError there catches DistTimeoutError)
            except self.engine_errors as exc:
                raise self.engine_failed(self.op, self.seq, exc) from exc
        self.blocked_seq = self.seq
        try:
            work = primitive(*args, False)
            if work is not None:
                work.wait()
        except DistcommError:
            raise
        except self.engine_errors as exc:
            raise self.engine_failed(self.op, self.seq, exc) from exc
        finally:
            self.blocked_seq = 0
        return None

    def _call_recorded(
        self, entry: list[Any], primitive: Callable[..., Work | None], async_op: bool, *args: Any
    ) -> Any:
        """:meth:`_call` of a call the flight recorder keeps: its entry stamped issued (at
        the first engine call), completed or failed (:mod:`~distcomm.backend._pipeline.
        recording`)."""
        device = None if async_op else self._entry_device
        if entry[ISSUED] is None:
            entry[ISSUED] = recording.stamp(device)
        self._entry = None  # the call proper: not recorded twice
        try:
            result = self._call(primitive, async_op, *args)
        except BaseException as exc:
            if self._recorder is not None:
                self._recorder.failed(entry, exc)
            raise
        finally:
            self._entry = entry
        entry[COMPLETED] = recording.stamp(device)
        return result

    @_compiled
    def _planned(self, op: str, x: Any, root: Any = None, y: Any = None) -> bool:
        """Run a blocking call of a kind the pipeline took before through the engine's plan for
        it (:mod:`~distcomm.backend._pipeline.plans`), under the call's ``seq`` and "blocked in"
        mark, seen by the hooks and the flight recorder. Returns whether it ran; False: nothing
        moved, nothing was counted, and the pipeline takes the call (and says what is wrong
        with it). A call that no hook observes, of the kind of the call before it, is numbered
        here; the others by :meth:`_planned_opening`. Where the extension was built, its common
        case runs compiled (:func:`_compiled`) and this is its ``__wrapped__``."""
        seq = self.seq + 1
        if seq >= self._next_check or self.unusable is not None:
            return False
        last = self._last_kind.get(op)
        try:
            if (
                last is not None
                and last[0] is x.__class__
                and last[1] is x.dtype
                and last[2] == x.nbytes
                and last[3] == root
            ):
                entry = last[4]
            else:
                entry = self._plans.find(op, x, root)
                if entry is None:
                    return False
        except (AttributeError, TypeError):  # not an array, or a root that is no key
            return False
        plan, fp, fits, name = entry
        if (
            plan is None
            or (root is not None and root.__class__ is not int)  # True is no rank
            or (fits is not None and not fits(y))
        ):
            return False
        h = self._mismatch_check
        event = None
        if _hooks or (h is not None and fp != h.free_fp):
            event = self._planned_opening(op, x, root, seq, fp)
            if event is _DECLINED:
                return False
        else:
            self.op = op
            self.seq = seq
        self.blocked_seq = seq
        rec = self._recorder
        record = None
        try:
            if rec is not None:  # the flight recorder's entry (recording: the kind's ``name``,
                bound = self.bound_device  # then the call's own; the site: the caller of the
                # public method that called this, or of the module function that called it,
                # where its code is the one the last such call found the user's; else found
                # by user_site, past this and the public method)
                frame = _getframe(2)
                code = frame.f_code
                if code is self._site_via:  # a module function's
                    frame = frame.f_back  # type: ignore[assignment]
                    code = frame.f_code
                record = [
                    name,
                    seq,
                    x.shape,
                    (code, frame.f_lasti) if code is self._site_code else self._user_site(),
                    _wall() if bound is None else recording.stamp(bound),
                    None,
                    None,
                ]
                rec.add(record)
                self._entry = None  # no later engine call stamps an earlier call's entry
            plan(x, y)
        except NotPlanned:
            return self._plan_declined(seq, record, event)
        except BaseException as exc:
            raise self._plan_failed(op, seq, exc, record, event)  # noqa: B904 (its cause set)
        finally:
            self.blocked_seq = 0
        if record is not None:
            record[COMPLETED] = _wall() if bound is None else recording.stamp(bound)
        if event is not None:
            self._event = None
            observing.ended(event, None)
        return True

    def _user_site(self) -> Any:
        """The flight recorder's site of the planned call in progress, found by
        :func:`~distcomm._call_sites.user_site` (past :meth:`_planned` and the public method);
        its code, and the module function's between them (if one), become :attr:`_site_code`
        and :attr:`_site_via`."""
        site = user_site(4)
        frame = _getframe(3)
        if site is None:
            self._site_code = self._site_via = None
        elif frame.f_code is site[0]:
            self._site_code, self._site_via = site[0], None
        elif frame.f_back is not None and frame.f_back.f_code is site[0]:
            self._site_code, self._site_via = site[0], frame.f_code
        return site

    def _planned_opening(self, op: str, x: Any, root: Any, seq: int, fp: int) -> Any:
        """The start of :meth:`_planned`'s call where the hooks see it, or where it is no
        repeat that may go unchecked (a new run of its fingerprint in the history, which may
        go to the engine only as :meth:`MismatchCheck.unchecked
        <distcomm.backend._pipeline.mismatch_check.MismatchCheck.unchecked>` says): the call
        numbered, its event (None: no hook sees it), or :data:`_DECLINED` where the pipeline
        must take it."""
        if _hooks and self._event is observing.PENDING:
            return _DECLINED  # part of an observed public call (reduce_scatter's
            # reduce_scatter_tensor): the pipeline numbers it and makes its event
        h = self._mismatch_check
        if h is not None and not h.unchecked(fp, op):
            return _DECLINED  # the pipeline confirms, or checks, a call that could differ
        self.op, self.seq = op, seq
        event = None
        if _hooks and self._event is None:  # the hooks see it (a hook may refuse it)
            event = self._observe(observing.planned_event(self, op, x, root), planned=True)
        if h is not None and fp != h.run_fp:
            h.start_run(seq, fp)
        return event

    def _observe(self, event: CollectiveEvent, planned: bool = False) -> CollectiveEvent:
        """``event``, the call being numbered, is this communicator's: the ``before`` hooks
        see it (:mod:`~distcomm.backend._pipeline.observing`). One that raises gives the call's
        number back and, on a plan's way (``planned``), the ``after`` hooks see the error."""
        self._event = event
        try:
            observing.started(event)
        except BaseException as exc:
            self.seq -= 1  # not run: the next call takes this number
            if planned:
                self._event = None
                observing.ended(event, exc)
            raise
        return event

    def _plan_declined(self, seq: int, record: list[Any] | None, event: Any) -> bool:
        """A plan raised NotPlanned for call ``seq``: nothing moved, so the call is not counted
        (the pipeline counts it), the flight recorder forgets its ``record`` and the pipeline
        takes the hooks' ``event`` (None: none). Returns False: the plan did not run."""
        self.seq = seq - 1
        if record is not None:
            self._recorder.retract(record)  # type: ignore[union-attr]
        if event is not None:
            self._event = observing.Carried(event)
        return False

    def _plan_failed(
        self, op: str, seq: int, exc: BaseException, record: list[Any] | None, event: Any
    ) -> BaseException:
        """What a plan's exception ``exc`` raises: distcomm's own as it is, the engine's as
        :class:`~distcomm.errors.EngineError` (caused by ``exc``), anything else as it is; the
        flight recorder's ``record`` and the hooks' ``event`` (None: none) get it."""
        error = exc
        if not isinstance(exc, DistcommError) and isinstance(exc, self.engine_errors):
            error = self.engine_failed(op, seq, exc)
            error.__cause__ = exc
        if record is not None:
            assert self._recorder is not None
            self._recorder.failed(record, error)
        if event is not None:
            self._event = None
            observing.ended(event, error)
        return error

    def _open_entry(
        self,
        op: str,
        seq: int,
        x: Any = None,
        adapter: Adapter | None = None,
        root: int | None = None,
    ) -> list[Any]:
        """The flight recorder's entry of call ``seq`` (the recorder is set), kept as the call
        the next engine calls stamp (:meth:`_call`)."""
        assert self._recorder is not None
        entry = recording.opened(self, op, seq, x, adapter, root)
        self._lend_entry(entry, None if adapter is None else adapter.device(x))
        self._recorder.add(entry)
        return entry

    def _lend_entry(self, entry: list[Any] | None, device: str | None = None) -> None:
        """Make ``entry`` the one this communicator's engine calls stamp until its ``seq``
        moves (a communicator's own, or the call's whose bytes travel on this object channel);
        None: no entry."""
        self._entry, self._entry_seq, self._entry_device = entry, self.seq, device

    @contextlib.contextmanager
    def _checking(self, comm: Steps) -> Iterator[None]:
        """This communicator (``comm``'s object channel, or ``comm`` itself) checks ``comm``'s
        collective: a failure here is that collective's, told and diagnosed there
        (:mod:`~distcomm.backend._pipeline.engine_failures`)."""
        if comm is self:
            yield
            return
        self._checking_for = comm
        try:
            yield
        finally:
            self._checking_for = None

    def _vote_pair(self) -> Any:
        """The 16 bytes of this communicator's votes on the running value, made at the first
        (:func:`~distcomm.backend._pipeline.mismatch_check.vote_buffer`; False: none)."""
        if self._vote is None:
            self._vote = mismatch_check.vote_buffer(self)
        return self._vote

    def _descend(self, parent: Steps, lineage: str) -> None:
        """This group, made from ``parent`` (:meth:`~distcomm.backend._pipeline.groups.Groups.
        _inherit`): its lineage, and the parent's check policy and flight recorder."""
        self._lineage = lineage
        self.debug = parent.debug
        self._record_into(parent._recorder)

    def _record_into(self, recorder: Recorder | None) -> None:
        """Give this communicator's calls to ``recorder`` (the flight recorder of this
        process's rank: a communicator of another thread-rank keeps none), or to none; the
        groups made from it later inherit it."""
        mine = recorder is not None and recorder.rank == self._global_ranks[self._rank]
        self._recorder = recorder if mine else None
        self._entry = None

    def _barrier_plan(self, x: Any, y: Any) -> None:
        """The barrier's plan where the engine has none (:mod:`~distcomm.backend._pipeline.plans`):
        its ``_barrier``, waited for."""
        work = self._barrier(False)
        if work is not None:
            work.wait()

    # -- finish --------------------------------------------------------------------------------
    def _complete(self, work: Work | None, async_op: bool, *keep: Any) -> Work | None:
        """A primitive's outcome for the caller: done, or (async) a Work owning ``keep``."""
        if not async_op:
            return None
        return self._handed(work, keep, None)

    def _finish(
        self,
        work: Work | None,
        async_op: bool,
        staged: Staged,
        divide: int | None = None,
        *keep: Any,
    ) -> Work | None:
        """As :meth:`_complete`, then copy the result back into the caller's tensor where it was
        staged (and divide an emulated AVG)."""
        after: Callable[[], None] | None = None
        if divide is not None:
            engine, adapter = staged.engine, staged.adapter

            def after() -> None:
                adapter.divide_(engine, divide)
                staged.write_back()

        elif staged.copied:
            after = staged.write_back
        if async_op:
            return self._handed(work, (staged.user, staged.engine, *keep), after)
        if after is not None:
            after()
        return None

    def _finish_split(
        self, work: Work | None, async_op: bool, staged: Staged, out: Any, parts: list[Any]
    ) -> Work | None:
        """As :meth:`_complete`, then copy the chunks of ``out`` into ``parts``."""
        adapter = staged.adapter

        def after() -> None:
            flat = adapter.flat(out)
            numel = adapter.numel(out) // len(parts)
            for r, part in enumerate(parts):
                adapter.copy_(part, flat[r * numel : (r + 1) * numel])

        if async_op:
            return self._handed(work, (staged.user, staged.engine, out, *parts), after)
        after()
        return None

    def _handed(
        self, work: Work | None, keep: tuple[Any, ...], after: Callable[[], None] | None
    ) -> BaseWork:
        """The Work the caller gets: it owns ``keep``, runs ``after`` once complete, and is
        remembered until it completes."""
        handed = self._then(work, after, *keep)
        if handed is None:
            return DONE
        self._pending.add(handed)
        return handed

    # -- the channel of internal traffic -------------------------------------------------------
    def _object_channel(self) -> BaseCommunicator:
        """The communicator object bytes travel on (a GPU engine returns a CPU side channel)."""
        return self  # type: ignore[return-value]

    def _objects(self, op: str, root: int | None = None) -> BaseCommunicator | None:
        """Count object collective ``op`` here (and on the object channel); return the channel
        its bytes travel on, or None in a world of 1. The kind (op, root) is remembered: a later
        call of it may skip the kit's steps
        (:mod:`~distcomm.backend._pipeline.object_collectives`)."""
        self._count(op, root=root)
        if self._solo:
            return None
        h = self._mismatch_check
        self._plans.learn_objects(op, root, 0 if h is None else h.run_fp)
        channel = self._object_channel()
        if channel is not self:
            channel._check_usable()
            channel.seq += 1  # counted, not checked again: the check ran on this communicator
            channel.op = op
            if self._entry is not None:  # the call's engine calls are the channel's
                channel._lend_entry(self._entry)
        return channel
