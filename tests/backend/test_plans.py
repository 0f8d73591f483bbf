"""The kit's plans of blocking calls (:mod:`distcomm.backend._pipeline.plans`) on fakelink
thread-ranks.

FakeLink's engine has no ``plan``: each test gives its communicators one (:func:`give_plans`) whose
plans call the blocking primitives and log the ``seq`` each ran as. Proven here: a plan is taken
only past the check points; the kinds of call are remembered per (op, class, dtype, byte size,
root), so interleaved ops are taken, and the engine is asked for the plan of each once; a new kind
goes through the pipeline first; a policy change and a collective mismatch forget them (the engine
is asked again); the history's running value is what it would be with no plans; a plan raising
NotPlanned leaves ``seq`` alone and the pipeline answers, and a kind the engine has no plan for
(None) takes the pipeline every time. gather and scatter are kinds alike; a list the pipeline would
refuse (its length, an entry's dtype, class or size, a list off the root, none on it) never reaches
their plans. Reductions other than SUM and calls with ``async_op`` are never planned.

Each test runs twice: on the planned path's compiled common case and on the Python alone; the
compiled one is shown to run the calls it takes without the Python, and to be built in CI.

The plans of blocking messages alike (``send``, ``recv``, here built on the communicator's own
``_isend`` / ``_irecv`` waited for): asked on the first message of a kind (op, class, dtype, byte
size, peer, tag) and taken for every good message, under a "blocked in" mark of its own that is
cleared after; never reached by bad ranks and tags (the pipeline's error, nothing sent, the
engine not asked); a plan raising NotPlanned, or none, leaves the message to the pipeline; the
ring's check shown to catch a wrong plan; a plan's errors become distcomm's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import distcomm
from distcomm.backend import CallKind, NotPlanned
from distcomm.backend._pipeline.mismatch_check import SAMPLE_EVERY, SAMPLED_FIRST
from distcomm.backend._pipeline.p2p import PointToPoint
from distcomm.backend._pipeline.plans import NO_ARRAY, OUTPUTS, Fits, Plans
from distcomm.backend._pipeline.steps import Steps
from distcomm.backend.arrays import adapter_for
from distcomm.errors import (
    CollectiveMismatchError,
    DistTimeoutError,
    EngineError,
    InvalidArgumentError,
)
from distcomm.protocol import ReduceOp
from distcomm.testing import run_threads

#: The Python of Steps._planned (its compiled common case, where built, hands it every other call).
PYTHON_PLANNED = getattr(Steps._planned, "__wrapped__", Steps._planned)
#: The Python of PointToPoint._planned_message alike.
PYTHON_PLANNED_MESSAGE = getattr(
    PointToPoint._planned_message, "__wrapped__", PointToPoint._planned_message
)
COMPILED = PYTHON_PLANNED is not Steps._planned


@pytest.fixture(autouse=True, params=["compiled", "python"])
def planned_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test here runs on both ways of a planned call and message: the compiled common
    case (``_planned_path.c``, built at install where a C compiler is) and the Python alone."""
    if request.param == "python":
        monkeypatch.setattr(Steps, "_planned", PYTHON_PLANNED)
        monkeypatch.setattr(PointToPoint, "_planned_message", PYTHON_PLANNED_MESSAGE)
    elif not COMPILED:
        pytest.skip("distcomm was installed without its compiled planned path (no C compiler)")
    return str(request.param)


SUM = ReduceOp.SUM
OPS = (
    "broadcast",
    "reduce",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "all_reduce",
    "gather",
    "scatter",
)
#: The first check point past the first 64 under the default policy.
NEXT_CHECK = SAMPLED_FIRST + SAMPLE_EVERY
#: Elements of one rank's chunk.
K = 4


def give_plans(comm: Any, plan: Callable[[CallKind], Any]) -> None:
    """Give ``comm``, a fakelink communicator already made, an engine's ``plan`` (``_plan``,
    as the kit binds it). The kit reads the engine's ``plan`` once, when it makes a
    communicator (into its table of kinds, ``_plans``, whose dict it keeps for the
    communicator's life), so the table is given the plan here and forgets what it learned
    without it; call this before the calls whose kinds it should plan."""
    comm._plan = plan
    comm._plans.ask_through(plan)


def described(kind: CallKind) -> tuple[Any, ...]:
    """What the engine was asked: the kind's op, class, dtype, byte size, root and tag (not the
    example array, which is not to be kept)."""
    x = kind.array
    return (kind.op, x.__class__, x.dtype, x.nbytes, kind.root, kind.tag)


class Planner:
    """An engine's plans of collectives on ``comm`` (:func:`give_plans`) that run the blocking
    primitives; each kind the engine was asked about is in ``asked`` (:func:`described`), the
    (op, seq) each call a plan took in ``taken``. ``refuse``: the plans raise NotPlanned, moving
    nothing (logged in ``refused`` with the seq the kit gave the call); ``none``: the engine has
    no plan (``_plan`` returns None). A plan checks the ``y`` the kit passes: the output, the
    root's list, None elsewhere."""

    def __init__(self, comm: Any, refuse: bool = False, none: bool = False) -> None:
        self.comm, self.refuse, self.none = comm, refuse, none
        self.asked: list[tuple[Any, ...]] = []
        self.taken: list[tuple[str, int]] = []
        self.refused: list[tuple[str, int]] = []
        give_plans(comm, self.plan)

    def plan(self, kind: CallKind) -> Callable[[Any, Any], None] | None:
        self.asked.append(described(kind))
        if self.none:
            return None
        c, op, root = self.comm, kind.op, kind.root
        move: Callable[[Any, Any], Any] | None = {
            "broadcast": lambda x, y: c._broadcast(x, root, False),
            "reduce": lambda x, y: c._reduce(x, root, SUM, False),
            "all_gather_into_tensor": lambda x, y: c._all_gather_into(y, x, False),
            "reduce_scatter_tensor": lambda x, y: c._reduce_scatter(y, x, SUM, False),
            "all_to_all_single": lambda x, y: c._all_to_all(y, x, False),
            "all_reduce": lambda x, y: c._all_reduce(x, SUM, False),
            "gather": lambda x, y: plan_gather(c, x, y, root),
            "scatter": lambda x, y: plan_scatter(c, x, y, root),
        }.get(op)
        if move is None:  # the barrier: the kit's own plan
            return None
        with_y = op in OUTPUTS or (op in ROOTED and c.rank == root)

        def run(x: Any, y: Any) -> None:
            assert (y is not None) == with_y, f"{op}: y={y!r}"
            if self.refuse:
                self.refused.append((op, c.seq))
                raise NotPlanned
            move(x, y)
            self.taken.append((op, c.seq))

        return run


def plan_gather(comm: Any, tensor: Any, parts: Any, dst: int) -> None:
    """gather through the blocking ``_gather``, copied out into ``parts`` on ``dst``."""
    adapter = adapter_for(tensor)
    numel = adapter.numel(tensor)
    out = None if parts is None else adapter.empty(tensor, numel * comm.world_size)
    comm._gather(out, tensor, dst, False)
    for r, part in enumerate(parts or ()):
        adapter.copy_(part, adapter.flat(out)[r * numel : (r + 1) * numel])


def plan_scatter(comm: Any, tensor: Any, parts: Any, src: int) -> None:
    """scatter through the blocking ``_scatter``, ``parts`` copied in on ``src``."""
    adapter = adapter_for(tensor)
    numel = adapter.numel(tensor)
    full = None if parts is None else adapter.empty(tensor, numel * comm.world_size)
    for r, part in enumerate(parts or ()):
        adapter.copy_(adapter.flat(full)[r * numel : (r + 1) * numel], part)
    comm._scatter(tensor, full, src, False)


def fill(comm: Any) -> None:
    """One collective of a kind of its own: a barrier, whose calls have no size (a collective
    of another size would make its op's calls checked, each before its plan runs)."""
    comm.barrier()


def past_the_first_checks(comm: Any) -> None:
    while comm.seq < SAMPLED_FIRST:
        fill(comm)


def values(dtype: str, rank: int, step: int, size: int) -> Any:
    """Rank ``rank``'s values at ``step``: rank-dependent, not symmetric."""
    return (np.arange(size) % 7 + 1 + 3 * rank + step % 4).astype(dtype)


#: Kinds of call, each differing from the first in one part of its key (op, class, dtype, byte
#: size, root): (op, lib, dtype, elements, root).
KINDS = [
    ("broadcast", "numpy", "float32", 4, 0),
    ("broadcast", "numpy", "float32", 4, 1),
    ("broadcast", "torch", "float32", 4, 0),
    ("broadcast", "numpy", "int32", 4, 0),
    ("broadcast", "numpy", "float64", 2, 0),  # the same byte size
    ("broadcast", "numpy", "float32", 8, 0),
    ("reduce", "numpy", "float32", 4, 0),
    ("reduce", "numpy", "float32", 4, 1),
    ("all_reduce", "numpy", "float32", 4, None),
    ("all_gather_into_tensor", "numpy", "float32", 4, None),
    ("reduce_scatter_tensor", "numpy", "float32", 4, None),
    ("all_to_all_single", "numpy", "float32", 4, None),
    ("gather", "numpy", "float32", 4, 0),
    ("gather", "torch", "int32", 4, 1),
    ("scatter", "numpy", "float32", 4, 1),
    ("scatter", "torch", "float64", 2, 0),
]
#: The ops whose list of world_size arrays is given on the root only.
ROOTED = ("gather", "scatter")


def call_kind(comm: Any, kind: tuple[Any, ...], step: int) -> bool:
    """Make a call of ``kind`` (:data:`KINDS`); whether its result is right (rank-dependent
    values; the chunked ops' input is ``elements`` a rank) and it counted one operation."""
    op, lib, dtype, numel, root = kind
    n, r = comm.world_size, comm.rank
    chunked = op in ("reduce_scatter_tensor", "all_to_all_single")
    size = numel * n if chunked else numel
    everyone = [values(dtype, s, step, size) for s in range(n)]
    total = np.sum(everyone, axis=0).astype(dtype)
    mine = slice(r * numel, (r + 1) * numel)
    make = torch.from_numpy if lib == "torch" else np.asarray
    x = make(everyone[r].copy())
    seq = comm.seq
    if op in ROOTED:
        right = call_rooted(comm, op, make, everyone, root, step)
        return comm.seq == seq + 1 and right
    if op in ("broadcast", "reduce"):
        getattr(comm, op)(x, root)
        want = everyone[root] if op == "broadcast" else total if r == root else None
        got = x
    elif op == "all_reduce":
        comm.all_reduce(x)
        want, got = total, x
    else:
        wants = {
            "all_gather_into_tensor": np.concatenate(everyone),
            "reduce_scatter_tensor": total[mine],
            "all_to_all_single": np.concatenate([e[mine] for e in everyone]),
        }
        want = wants[op]
        got = make(np.full(want.size, -1, dtype))
        getattr(comm, op)(got, x)
    return comm.seq == seq + 1 and (want is None or np.array_equal(np.asarray(got), want))


def rooted_parts(make: Callable[[Any], Any], arrays: list[Any], shared: bool) -> list[Any]:
    """Copies of ``arrays`` (of one size): views of one buffer (``shared``), or of their own."""
    if not shared:
        return [make(a.copy()) for a in arrays]
    whole = make(np.concatenate(arrays))
    n = arrays[0].size
    return [whole[i * n : (i + 1) * n] for i in range(len(arrays))]


def call_rooted(
    comm: Any, op: str, make: Callable[[Any], Any], everyone: list[Any], root: int, step: int
) -> bool:
    """A gather to or scatter from ``root`` of rank r's ``everyone[r]`` (scatter: the root's
    entry r is ``everyone[r] + root``), the root's list views of one buffer at even steps, of
    their own at odd ones; whether the result is right."""
    r, shared = comm.rank, step % 2 == 0
    if op == "gather":
        parts = rooted_parts(make, [np.full_like(e, -1) for e in everyone], shared)
        comm.gather(make(everyone[r].copy()), parts if r == root else None, root)
        return r != root or all(
            np.array_equal(np.asarray(p), e) for p, e in zip(parts, everyone, strict=True)
        )
    parts = rooted_parts(make, [e + root for e in everyone], shared)
    got = make(np.full_like(everyone[r], -1))
    comm.scatter(got, parts if r == root else None, root)
    return bool(np.array_equal(np.asarray(got), everyone[r] + root))


@pytest.mark.parametrize(
    ("policy", "first", "calls"),
    [("sample", SAMPLED_FIRST + 1, NEXT_CHECK + 12), ("off", 2, 100), ("check", None, 100)],
)
def test_the_plan_is_taken_only_past_the_check_points(
    policy: str, first: int | None, calls: int
) -> None:
    """Broadcasts of one kind: under the default policy the plan is taken from call 65 on but
    not at the check point 1088; off, from the second call (the first teaches the kind, and the
    engine is asked for its plan then, once); under check, never. Every result is right."""

    def body() -> tuple[list[int], int, bool]:
        comm: Any = distcomm.get_communicator()
        comm.debug = policy
        planner = Planner(comm)
        kind = ("broadcast", "numpy", "float32", K, comm.world_size - 1)
        right = [call_kind(comm, kind, step) for step in range(calls)]
        return [seq for _, seq in planner.taken], len(planner.asked), all(right)

    want = [] if first is None else list(range(first, calls + 1))
    if policy == "sample":
        want.remove(NEXT_CHECK)
    for taken, asked, right in run_threads(body, 3):
        assert right, "a wrong broadcast"
        assert taken == want, f"taken at {taken[:3]}..{taken[-3:]} ({len(taken)}), want {len(want)}"
        assert asked == 1, f"the engine was asked {asked} times for the plan of one kind"


def _key(kind: tuple[Any, ...], world_size: int) -> tuple[Any, ...]:
    """The key of a kind of :data:`KINDS` in the table: (op, class, dtype, byte size, root)."""
    op, lib, dtype, numel, root = kind
    dt = getattr(torch, dtype) if lib == "torch" else np.dtype(dtype)
    size = numel * world_size if op in ("reduce_scatter_tensor", "all_to_all_single") else numel
    cls = torch.Tensor if lib == "torch" else np.ndarray
    return (op, cls, dt, size * np.dtype(dtype).itemsize, root)


def test_kinds_are_remembered_so_that_interleaved_calls_take_their_plans() -> None:
    """Past the check points, rounds of the calls of :data:`KINDS` in turn: the first round
    goes through the pipeline (each kind new; the engine asked for its plan, once, with the
    kind's op, an array like the call's tensor and the root), every later call takes its plan;
    the kinds are remembered under their (op, class, dtype, byte size, root); each op's latest
    kind (kept to be found without a key's hash) is the entry the kinds hold for it."""

    def body() -> tuple[list[list[str]], list[Any], list[Any], bool, list[str]]:
        comm: Any = distcomm.get_communicator()
        planner = Planner(comm)
        past_the_first_checks(comm)
        asked = len(planner.asked)  # the fill's kind
        rounds, right, stale = [], True, []
        for step in range(4):
            before = len(planner.taken)
            for kind in KINDS:
                right &= call_kind(comm, kind, step)
                kinds, last = comm._plans.kinds, comm._plans.last
                stale += [
                    op for op, (*key, entry) in last.items() if kinds.get((op, *key)) is not entry
                ]
            rounds.append([op for op, _ in planner.taken[before:]])
        return rounds, list(comm._plans.kinds), planner.asked[asked:], right, stale

    ops = [kind[0] for kind in KINDS]
    keys = [_key(kind, 3) for kind in KINDS]
    # the pipeline takes, past the first round, the calls the mismatch check confirms or
    # checks first: the step from the round's last call to its first (new in the second
    # round: confirmed once), and the two calls after the numpy float32 broadcast from rank 0
    # (KINDS[1] and [3]), whose torch twin (KINDS[2]) has its fingerprint: two broadcasts of
    # different sizes follow that fingerprint, so each is checked first
    checked = [op for i, op in enumerate(ops) if i not in (1, 3)]
    for rounds, remembered, asked, right, stale in run_threads(body, 3):
        assert right, "a wrong result"
        assert stale == [], f"an op's latest kind is not the entry the kinds hold: {stale}"
        assert rounds == [[], checked[1:], checked, checked], rounds
        assert set(keys) <= set(remembered), set(keys) - set(remembered)
        assert asked == [(*key, 0) for key in keys], asked


def _path(comm: Any, planner: Planner, kind: tuple[Any, ...], step: int) -> str:
    """Make a call of ``kind``: "plan" or "pipeline", the way it went ("wrong": a wrong
    result)."""
    before = len(planner.taken)
    if not call_kind(comm, kind, step):
        return "wrong"
    return "plan" if len(planner.taken) > before else "pipeline"


def test_a_new_kind_goes_through_the_pipeline_first_then_takes_its_plan() -> None:
    """Past the check points, three calls of each broadcast of :data:`KINDS` (a new size,
    dtype, class or root) in a row, then of the first again: a new kind's first call goes
    through the pipeline (recorded, confirmed with the other ranks), and so does its second, a
    repeat the ranks never agreed on (confirmed once); the third takes its plan. The torch
    twin of the first kind (its fingerprint) and the first kind again go through the pipeline
    each time: by then the ranks agreed on two broadcasts after that fingerprint (itself, and
    the one from rank 1), so each call after it is checked first."""
    broadcasts = [kind for kind in KINDS if kind[0] == "broadcast"]

    def body() -> list[str]:
        comm: Any = distcomm.get_communicator()
        planner = Planner(comm)
        past_the_first_checks(comm)
        kinds = [*broadcasts, broadcasts[0]]
        return [_path(comm, planner, kind, step) for kind in kinds for step in range(3)]

    new, checked = ["pipeline", "pipeline", "plan"], ["pipeline"] * 3
    want = new * 2 + checked + new * 3 + checked
    assert len(broadcasts) == 6
    assert run_threads(body, 3) == [want] * 3


@pytest.mark.parametrize("policy", ["sample", "off"])
def test_a_policy_change_forgets_the_kinds(policy: str) -> None:
    """Setting ``debug`` (even to the policy in force) forgets the remembered kinds: a kind
    taken before goes through the pipeline once (the engine asked for its plan again), then
    takes its plan again."""

    def body() -> tuple[Any, ...]:
        comm: Any = distcomm.get_communicator()
        planner = Planner(comm)
        past_the_first_checks(comm)
        path = [_path(comm, planner, KINDS[0], step) for step in range(3)]
        before = len(comm._plans.kinds) > 0
        comm.debug = policy
        after = dict(comm._plans.kinds)
        path += [_path(comm, planner, KINDS[0], step) for step in range(3)]
        key = (*_key(KINDS[0], comm.world_size), 0)
        return before, after, path, planner.asked.count(key)

    # the first repeat is a step the ranks confirm once; a policy change forgets the kinds,
    # never what the ranks agreed on
    want = ["pipeline", "pipeline", "plan", "pipeline", "plan", "plan"]
    assert run_threads(body, 3) == [(True, {}, want, 2)] * 3


def test_a_collective_mismatch_forgets_the_kinds() -> None:
    """Past the check points and the plans taken, ranks making different new calls (a vote
    finds it before the engine) all raise CollectiveMismatchError; nothing ran, the
    communicator stays usable, and the kinds are forgotten: a known kind goes through the
    pipeline once, then its plan."""

    def body() -> tuple[Any, ...]:
        comm: Any = distcomm.get_communicator()
        planner = Planner(comm)
        past_the_first_checks(comm)
        path = [_path(comm, planner, KINDS[0], step) for step in range(3)]
        odd = ("broadcast", "numpy", "float64" if comm.rank == 0 else "int32", 3, 0)
        at = comm.seq + 1
        try:
            call_kind(comm, odd, 0)
            outcome: Any = "no error"
        except CollectiveMismatchError as exc:
            outcome = (exc.seq == at, exc.ran)
        after = (dict(comm._plans.kinds), comm.unusable)
        path += [_path(comm, planner, KINDS[0], step) for step in range(3)]
        return outcome, after, path

    # the first repeat is a step the ranks confirm once; the mismatch forgets the kinds,
    # never what the ranks agreed on
    want = ["pipeline", "pipeline", "plan", "pipeline", "plan", "plan"]
    assert run_threads(body, 3) == [((True, None), ({}, None), want)] * 3


def test_a_kind_whose_agreement_was_forgotten_is_confirmed_again_first() -> None:
    """A remembered kind whose fingerprint the history no longer counts as agreed (it keeps
    4096; here cleared) goes through the pipeline, which confirms it with the other ranks,
    before it takes its plan again. (The first broadcast after a reduce, a step from one call
    to the next that the ranks never made, is confirmed once too.)"""

    def body() -> list[str]:
        comm: Any = distcomm.get_communicator()
        planner = Planner(comm)
        past_the_first_checks(comm)
        kinds = (KINDS[0], KINDS[6])  # a broadcast and a reduce in turn
        path = [_path(comm, planner, kind, step) for step in range(2) for kind in kinds]
        comm._mismatch_check.agreed.clear()
        path += [_path(comm, planner, kind, step) for step in (3, 4) for kind in kinds]
        return path

    want = ["pipeline"] * 3 + ["plan"] + ["pipeline"] + ["plan"] * 3
    assert run_threads(body, 3) == [want] * 3


def _bad_calls(comm: Any) -> dict[str, tuple[tuple[Any, ...], Callable[[], Any]]]:
    """Calls the pipeline refuses, each with the kind of a good call of its op."""
    n = comm.world_size
    x = np.ones(K, np.float32)
    gather = ("all_gather_into_tensor", "numpy", "float32", K, None)
    return {
        "output too small": (
            gather,
            lambda: comm.all_gather_into_tensor(np.zeros(K * n - 1, np.float32), x),
        ),
        "float64 output": (gather, lambda: comm.all_gather_into_tensor(np.zeros(K * n), x)),
        "int32 output": (
            gather,
            lambda: comm.all_gather_into_tensor(np.zeros(K * n, np.int32), x),
        ),
        "torch output": (gather, lambda: comm.all_gather_into_tensor(torch.zeros(K * n), x)),
        "src=True": (KINDS[1], lambda: comm.broadcast(x, True)),
        "dst=True": (KINDS[7], lambda: comm.reduce(x, True)),
        **_bad_rooted_calls(comm, x),
    }


def _bad_rooted_calls(comm: Any, x: Any) -> dict[str, tuple[tuple[Any, ...], Callable[[], Any]]]:
    """gathers to rank 0 and scatters from rank 1 the pipeline refuses on every rank: a bad list
    on the root, a list (of good arrays) on the others, or a root of True."""
    n = comm.world_size
    gather = ("gather", "numpy", "float32", K, 0)
    scatter = ("scatter", "numpy", "float32", K, 1)

    def z(size: int = K, dtype: Any = np.float32) -> Any:
        return np.zeros(size, dtype)

    def listed(root: int, bad: Any) -> Any:
        return bad if comm.rank == root else [z() for _ in range(n)]

    lists = {
        "one short": [z() for _ in range(n - 1)],
        "one long": [z() for _ in range(n + 1)],
        "int32 in it": [z(), z(K, np.int32), *[z() for _ in range(n - 2)]],
        "a torch tensor in it": [torch.zeros(K), *[z() for _ in range(n - 1)]],
        "a larger array in it": [z(), *[z() for _ in range(n - 2)], z(K + 1)],
        "None on the root": None,
        "a generator": (z() for _ in range(n)),
    }
    calls = {}
    for what, bad in lists.items():
        calls[f"gather: list {what}"] = (gather, lambda b=bad: comm.gather(x, listed(0, b), 0))
        calls[f"scatter: list {what}"] = (scatter, lambda b=bad: comm.scatter(x, listed(1, b), 1))
    calls["gather: dst=True"] = (gather, lambda: comm.gather(x, listed(1, None), True))
    calls["scatter: src=True"] = (scatter, lambda: comm.scatter(x, listed(1, None), True))
    return calls


def test_bad_calls_of_a_known_kind_are_left_to_the_pipeline() -> None:
    """Past the check points, right after a good call of its op (its plan taken), a call with
    an output unlike the input (size, dtype of the same byte size, class), a root of True (a
    rank's equal) or a bad list (:func:`_bad_rooted_calls`) reaches no plan: the pipeline
    raises InvalidArgumentError, counting nothing."""

    def body() -> dict[str, str]:
        comm: Any = distcomm.get_communicator()
        planner = Planner(comm)
        past_the_first_checks(comm)
        outcomes = {}
        for what, (kind, call) in _bad_calls(comm).items():
            for step in range(2):
                call_kind(comm, kind, step)
            seq, taken = comm.seq, len(planner.taken)
            try:
                call()
                outcomes[what] = "no error"
            except InvalidArgumentError:
                outcomes[what] = "refused" if comm.seq == seq else "refused, seq moved"
            if len(planner.taken) != taken:
                outcomes[what] += ", plan taken"
        return outcomes

    for outcomes in run_threads(body, 3):
        assert outcomes == dict.fromkeys(outcomes, "refused"), outcomes


def program(comm: Any) -> bool:
    """Past the first check points and the one at 1088: cycles of the kinds in turn, a run of
    one kind (a new one each cycle), and runs of broadcasts of a new size or root; whether
    every result was right."""
    past_the_first_checks(comm)
    right, step = True, 0
    while comm.seq < NEXT_CHECK + 30:
        cycle, i = divmod(step, 30)
        if i < len(KINDS):
            kind = KINDS[i]
        elif i < 22:
            kind = KINDS[cycle % len(KINDS)]
        else:
            kind = ("broadcast", "numpy", "float32", 1 + cycle % 5, cycle % comm.world_size)
        right &= call_kind(comm, kind, step)
        step += 1
    return right


def _state(comm: Any) -> tuple[Any, ...]:
    """What the mismatch check knows of ``comm``'s calls: its running value and the runs, and
    which call the ranks agreed follows which."""
    h = comm._mismatch_check
    state = comm.seq, h.value(comm.seq), h.run_fp, h.run_start, list(h.runs), h.agreed_seq
    return (*state, h.follow, list(h.steps), h.free_fp)


@pytest.mark.parametrize("refuse", [False, True], ids=["taken", "refused"])
def test_the_running_value_is_the_one_without_plans(refuse: bool) -> None:
    """The same program with plans (taken, or all raising NotPlanned) and without any: the
    history's running value, runs and agreement are the same at the end."""

    def body(planned: bool) -> tuple[Any, ...]:
        comm: Any = distcomm.get_communicator()
        given = Planner(comm, refuse) if planned else None
        right = program(comm)
        reached = 0 if given is None else len(given.refused if refuse else given.taken)
        return right, reached, _state(comm)

    without = run_threads(body, 3, False)
    for (right, reached, state), (_, _, state_without) in zip(
        run_threads(body, 3, True), without, strict=True
    ):
        assert right, "a wrong result"
        # of the 1118 calls past the first check points, those after a call the ranks agreed
        # was followed by two sizes of their op (the broadcasts of each cycle's new size or
        # root) are checked first, through the pipeline: a third reach the plans
        assert reached > 350, f"only {reached} calls reached the plans"
        assert state == state_without


def test_a_plan_raising_not_planned_leaves_seq_and_the_pipeline_answers() -> None:
    """Plans that raise NotPlanned (nothing sent) are reached, past the check points, by every
    call of a known kind with that call's seq; the call is then counted once, by the pipeline,
    with the right result, and the plan stays: the engine is asked once per kind."""

    def body() -> tuple[bool, list[tuple[str, int]], int, int]:
        comm: Any = distcomm.get_communicator()
        planner = Planner(comm, refuse=True)
        past_the_first_checks(comm)
        right = all(call_kind(comm, kind, step) for step in range(3) for kind in KINDS)
        return right, planner.refused, comm.blocked_seq, len(planner.asked)

    known = SAMPLED_FIRST + len(KINDS)  # the first round goes through the pipeline
    # and, past it, the calls the mismatch check confirms or checks first: the second round's
    # first (a step from the round's last call never made) and, in every round, the two after
    # the numpy float32 broadcast from rank 0, whose torch twin has its fingerprint (two
    # broadcasts of different sizes follow that fingerprint)
    want = [
        (kind[0], known + 1 + i)
        for i, kind in enumerate(KINDS * 2)
        if i % len(KINDS) not in (1, 3) and i != 0
    ]
    asked = 1 + len(KINDS)  # the fill's kind, then each of KINDS
    assert run_threads(body, 3) == [(True, want, 0, asked)] * 3


def test_a_kind_without_a_plan_takes_the_pipeline_every_time() -> None:
    """An engine with no plan for the kinds (``_plan`` returns None) is asked once per kind;
    past the check points every call then goes through the pipeline, right, one operation
    each, and the kinds are remembered without a plan."""

    def body() -> tuple[bool, int, list[Any], list[Any]]:
        comm: Any = distcomm.get_communicator()
        planner = Planner(comm, none=True)
        past_the_first_checks(comm)
        asked = len(planner.asked)
        right = all(call_kind(comm, kind, step) for step in range(3) for kind in KINDS)
        plans = [comm._plans.kinds[_key(kind, comm.world_size)][0] for kind in KINDS]
        return right, len(planner.taken) + len(planner.refused), planner.asked[asked:], plans

    asked = [(*_key(kind, 3), 0) for kind in KINDS]
    assert run_threads(body, 3) == [(True, 0, asked, [None] * len(KINDS))] * 3


def test_reductions_other_than_sum_and_async_calls_are_never_planned() -> None:
    """Past the check points, all_reduce, reduce and reduce_scatter_tensor by MAX go through
    the pipeline every time and the engine is never asked about them; the same calls by SUM
    are planned (asked once, the plan taken from the second call); then async_op=True calls of
    those kinds go through the pipeline. Every result is right."""

    def body() -> tuple[bool, list[str], list[tuple[str, int]], list[str], int]:
        comm: Any = distcomm.get_communicator()
        planner = Planner(comm)
        past_the_first_checks(comm)
        fills = len(planner.asked)
        n, r = comm.world_size, comm.rank
        ops = ("all_reduce", "reduce", "reduce_scatter_tensor")
        right = True

        def call(op: str, reduce_op: ReduceOp, step: int, async_op: bool = False) -> bool:
            size = K * n if op == "reduce_scatter_tensor" else K
            everyone = [values("float32", s, step, size) for s in range(n)]
            want = (np.max if reduce_op is ReduceOp.MAX else np.sum)(everyone, axis=0)
            x = everyone[r].copy()
            if op == "all_reduce":
                work, got = comm.all_reduce(x, reduce_op, async_op=async_op), x
            elif op == "reduce":
                work, got = comm.reduce(x, 0, reduce_op, async_op=async_op), x
                want = want if r == 0 else x
            else:
                got = np.full(K, -1, np.float32)
                work = comm.reduce_scatter_tensor(got, x, reduce_op, async_op=async_op)
                want = want[r * K : (r + 1) * K]
            if work is not None:
                work.wait()
            return bool(np.array_equal(got, want))

        for step in range(3):
            for op in ops:
                right &= call(op, ReduceOp.MAX, step)
        by_max = [kind[0] for kind in planner.asked[fills:]]
        for step in range(3):
            for op in ops:
                right &= call(op, SUM, step)
        taken = list(planner.taken)
        for step in range(3):
            for op in ops:
                right &= call(op, SUM, step, async_op=True)
        by_sum = [kind[0] for kind in planner.asked[fills:]]
        return right, by_max, taken, by_sum, len(planner.taken) - len(taken)

    ops = ["all_reduce", "reduce", "reduce_scatter_tensor"]
    start = SAMPLED_FIRST + 3 * len(ops)  # the MAX calls
    taken = [(op, start + len(ops) * step + 1 + i) for step in (1, 2) for i, op in enumerate(ops)]
    # the second round's first call is a step the ranks never made (the last SUM call to the
    # first; the first round came after the MAX calls): confirmed, through the pipeline
    assert run_threads(body, 3) == [(True, [], taken[1:], ops, 0)] * 3


@pytest.mark.parametrize("who", ["rank 0", "every rank"])
def test_a_refused_bad_call_leaves_the_history_as_the_pipeline_would(who: str) -> None:
    """Past the check points, an all-gather of a known kind with an output of the wrong size,
    right after a call of another op, raises InvalidArgumentError (caught) and counts nothing:
    the running value is the one without plans, and the check point at 1088 finds no
    mismatch, whether one rank or every rank made it."""

    def body(planned: bool) -> tuple[int, str]:
        comm: Any = distcomm.get_communicator()
        if planned:
            Planner(comm)
        past_the_first_checks(comm)
        gather = ("all_gather_into_tensor", "numpy", "float32", K, None)
        for step in range(3):
            call_kind(comm, gather, step)
            call_kind(comm, KINDS[0], step)
        if who == "every rank" or comm.rank == 0:
            out = np.zeros(K * comm.world_size - 1, np.float32)
            with pytest.raises(InvalidArgumentError):
                comm.all_gather_into_tensor(out, np.ones(K, np.float32))
        value = comm._mismatch_check.value(comm.seq)
        try:
            while comm.seq < NEXT_CHECK:
                fill(comm)
        except CollectiveMismatchError as exc:
            return value, f"mismatch at #{exc.seq}"
        return value, "no mismatch"

    assert run_threads(body, 2, True) == run_threads(body, 2, False)


@pytest.mark.parametrize("op", ["all_gather_into_tensor", "reduce_scatter_tensor"])
def test_a_none_output_past_the_check_points_is_refused_by_the_pipeline(op: str) -> None:
    """output=None (a forgotten buffer) after calls of a known kind raises InvalidArgumentError
    and counts nothing, as it does within the first check points."""

    def body() -> tuple[str, bool]:
        comm: Any = distcomm.get_communicator()
        Planner(comm)
        past_the_first_checks(comm)
        for step in range(3):
            call_kind(comm, (op, "numpy", "float32", K, None), step)
        seq = comm.seq
        size = K if op == "all_gather_into_tensor" else K * comm.world_size
        try:
            getattr(comm, op)(None, np.ones(size, np.float32))
            outcome = "no error"
        except Exception as exc:
            outcome = type(exc).__name__
        return outcome, comm.seq == seq

    assert run_threads(body, 2) == [("InvalidArgumentError", True)] * 2


# -- blocking messages ---------------------------------------------------------------------------
#: Tags of the messages: 0, a small one, the largest a user's (INTERNAL_TAG - 1).
TAGS = (0, 7, 2**30 - 1)
MESSAGE_KINDS = [
    (lib, dtype) for lib in ("numpy", "torch") for dtype in ("float32", "int64", "int8")
]


class PlannedMessages:
    """An engine's plans of ``send`` and ``recv`` on ``comm`` (:func:`give_plans`) that start the
    communicator's ``_isend`` / ``_irecv`` and wait for it; each kind the engine was asked about
    is logged in ``asked`` (:func:`described`), each message a plan took in ``taken`` as (way,
    peer, tag, the "blocked in" mark meanwhile). They raise NotPlanned for an array that is not
    contiguous, and for every message when ``refuse`` is set (logged in ``refused``); ``none``:
    the engine has no plan (``_plan`` returns None). ``spoil`` corrupts what a recv received;
    ``lie`` changes the sender it returns (to show that the ring's check catches both);
    ``broken`` makes a send raise OSError (an engine's error)."""

    def __init__(self, comm: Any, refuse: bool = False, none: bool = False) -> None:
        self.comm, self.refuse, self.none = comm, refuse, none
        self.asked: list[tuple[Any, ...]] = []
        self.taken: list[tuple[str, Any, int, tuple[int, str]]] = []
        self.refused: list[tuple[str, Any, int]] = []
        self.spoil = self.lie = self.broken = False
        give_plans(comm, self.plan)

    def plan(self, kind: CallKind) -> Callable[[Any, Any], Any] | None:
        way, peer, tag = kind.op, kind.root, kind.tag
        self.asked.append(described(kind))
        if self.none:
            return None
        move = self._send if way == "send" else self._recv

        def run(tensor: Any, y: Any) -> Any:
            assert y is None, f"{way}: y={y!r}"
            contiguous = (
                tensor.is_contiguous()
                if isinstance(tensor, torch.Tensor)
                else tensor.flags.c_contiguous
            )
            if self.refuse or not contiguous:
                self.refused.append((way, peer, tag))
                raise NotPlanned
            self.taken.append((way, peer, tag, (self.comm.blocked_seq, self.comm.blocked_op)))
            return move(tensor, peer, tag)

        return run

    def _send(self, tensor: Any, dst: int, tag: int) -> None:
        if self.broken:
            raise OSError("link down")
        self.comm._isend(tensor, dst, tag).wait()

    def _recv(self, tensor: Any, src: int | None, tag: int) -> int:
        work = self.comm._irecv(tensor, src, tag)
        work.wait()
        if self.spoil:
            tensor[0] += 1
        return int(work.source) + self.lie


def message_kinds(rank: int, world_size: int) -> list[tuple[Any, ...]]:
    """The kinds of message of :func:`message_rings` on ``rank`` (:func:`described`), in the
    order of their first messages: per kind and tag, the send to the next rank, the receives
    from the rank before and from any rank."""
    nxt, prev = (rank + 1) % world_size, (rank - 1) % world_size
    kinds = []
    for lib, dtype in MESSAGE_KINDS:
        cls = torch.Tensor if lib == "torch" else np.ndarray
        dt = getattr(torch, dtype) if lib == "torch" else np.dtype(dtype)
        nbytes = K * np.dtype(dtype).itemsize
        for tag in TAGS:
            for way, peer in (("send", nxt), ("recv", prev), ("recv", None)):
                kinds.append((way, cls, dt, nbytes, peer, tag))
    return kinds


def messages_in_order(rank: int, world_size: int) -> list[tuple[str, int | None, int]]:
    """The (op, peer, tag) of ``rank``'s messages in :func:`message_rings`, in the order it
    makes them: per kind and tag, the send to the next rank, the receives from the rank before
    and from any rank."""
    nxt, prev = (rank + 1) % world_size, (rank - 1) % world_size
    order: list[tuple[str, int | None, int]] = []
    for _kind in MESSAGE_KINDS:
        for tag in TAGS:
            for src in (prev, None):
                order += [("send", nxt, tag), ("recv", src, tag)]
    return order


def message_ring(
    comm: Any, kind: tuple[str, str], tag: int, step: int, any_source: bool
) -> list[str]:
    """Every rank sends to the next one and receives from the one before (from it, or from any
    rank); what went wrong: the data, the sender returned, the mark left set."""
    lib, dtype = kind
    n, r = comm.world_size, comm.rank
    prev = (r - 1) % n
    make = torch.from_numpy if lib == "torch" else np.asarray
    out = make(np.zeros(K, dtype))
    comm.send(make(values(dtype, r, step, K)), (r + 1) % n, tag)  # fakelink buffers a send
    got = comm.recv(out, None if any_source else prev, tag)
    wrong = []
    if not np.array_equal(np.asarray(out), values(dtype, prev, step, K)):
        wrong.append(f"data {np.asarray(out).tolist()}")
    if got != prev:
        wrong.append(f"returned {got}, the sender is {prev}")
    if (comm.blocked_seq, comm.blocked_op) != (0, ""):
        wrong.append(f"still blocked in {comm.blocked_op!r} ({comm.blocked_seq})")
    return wrong


def message_rings(comm: Any) -> list[tuple[Any, ...]]:
    """:func:`message_ring` of every kind, tag and way of receiving; what went wrong where."""
    wrong = []
    step = 0
    for kind in MESSAGE_KINDS:
        for tag in TAGS:
            for any_source in (False, True):
                step += 1
                wrong += [
                    (*kind, tag, any_source, w)
                    for w in message_ring(comm, kind, tag, step, any_source)
                ]
    return wrong


def test_good_messages_take_their_plans_under_a_mark_of_their_own() -> None:
    """Rings of numpy and torch, three dtypes, three tags, from the rank before and from any
    rank: the engine is asked for the plan of each kind of message (op, class, dtype, byte size,
    peer, tag) on its first message, and every message takes its plan (no check points for
    messages), right, the sender returned; meanwhile the mark names the message (a negative
    number), cleared after. Rings of the same kinds again take the plans without asking."""

    def body() -> tuple[list[Any], list[Any], list[Any], list[Any], tuple[int, bool]]:
        comm: Any = distcomm.get_communicator()
        planned = PlannedMessages(comm)
        wrong = message_rings(comm)
        asked = list(planned.asked)
        taken = len(planned.taken)
        wrong += message_rings(comm)
        again = len(planned.taken) - taken, planned.asked == asked
        return wrong, planned.taken[:taken], planned.refused, asked, again

    n = 3
    for r, (wrong, taken, refused, asked, again) in enumerate(run_threads(body, n)):
        assert wrong == [] and refused == [], f"rank {r}: {wrong}, declined {refused}"
        want = messages_in_order(r, n)
        assert [t[:3] for t in taken] == want, f"rank {r}: {taken[:4]}..."
        assert asked == message_kinds(r, n), f"rank {r}: asked {asked[:4]}..."
        assert again == (len(want), True), f"rank {r}: again {again}"
        labels = [
            f"send to rank {peer} (tag {tag})"
            if way == "send"
            else f"recv from {'any rank' if peer is None else f'rank {peer}'} (tag {tag})"
            for way, peer, tag, _ in taken
        ]
        assert [mark[1] for *_, mark in taken] == labels, f"rank {r}: {taken[:4]}..."
        seqs = [mark[0] for *_, mark in taken]
        assert all(s < 0 for s in seqs) and len(set(seqs)) == len(seqs), seqs


@pytest.mark.parametrize("fault", ["spoil", "lie"])
def test_the_ring_check_catches_a_plan_that_is_wrong(fault: str) -> None:
    """A recv plan that corrupts what it received, or returns another sender, is caught at
    every message (each takes it); without the fault nothing is."""

    def body() -> tuple[list[Any], list[Any]]:
        comm: Any = distcomm.get_communicator()
        planned = PlannedMessages(comm)
        setattr(planned, fault, True)
        wrong = message_rings(comm)
        setattr(planned, fault, False)
        return wrong, message_rings(comm)

    what = "data" if fault == "spoil" else "returned"
    caught = {
        (lib, dtype, tag, a) for lib, dtype in MESSAGE_KINDS for tag in TAGS for a in (False, True)
    }
    for r, (wrong, after) in enumerate(run_threads(body, 3)):
        assert {w[:4] for w in wrong} == caught, f"rank {r}: caught {len(wrong)}"
        assert all(w[4].startswith(what) for w in wrong), f"rank {r}: {wrong[:3]}"
        assert after == [], f"rank {r}: {after}"


def _bad_messages(comm: Any) -> dict[str, Callable[[], Any]]:
    """Messages the pipeline refuses (``True`` is rank 1's equal), their data unlike any good
    one's."""
    n, peer = comm.world_size, (comm.rank + 1) % comm.world_size
    x = np.full(K, -7, np.int64)
    return {
        "send: dst=world_size": lambda: comm.send(x, n),
        "send: dst=-1": lambda: comm.send(x, -1),
        "send: dst=True": lambda: comm.send(x, True),
        "send: dst=1.0": lambda: comm.send(x, 1.0),
        "send: dst=an array": lambda: comm.send(x, np.array([peer, peer])),
        "send: tag=-1": lambda: comm.send(x, peer, -1),
        "send: tag=True": lambda: comm.send(x, peer, True),
        "send: tag=2**30": lambda: comm.send(x, peer, 2**30),
        "recv: src=world_size": lambda: comm.recv(x, n),
        "recv: src=True": lambda: comm.recv(x, True),
        "recv: tag=an array": lambda: comm.recv(x, None, np.array([0, 0])),
        "recv: tag=-1": lambda: comm.recv(x, None, -1),
        "recv: tag=2**30": lambda: comm.recv(x, peer, 2**30),
    }


def test_bad_messages_never_reach_the_plans_and_send_nothing() -> None:
    """Bad ranks and tags raise the pipeline's InvalidArgumentError; the engine is not asked
    for a plan of them and no plan is reached, also where a good message of the same kind was
    planned before (``True`` finds rank 1's kind); the mark stays clear; a ring after them on
    tag 0 gets the good messages (a bad one sent would be received instead)."""

    def body() -> tuple[dict[str, str], list[Any]]:
        comm: Any = distcomm.get_communicator()
        planned = PlannedMessages(comm)
        known = message_ring(comm, ("numpy", "int64"), 0, 0, False)  # rank 1's kinds known
        assert known == [] and planned.taken, (known, planned.taken)
        outcomes = {}
        for what, call in _bad_messages(comm).items():
            reached = len(planned.asked) + len(planned.taken) + len(planned.refused)
            try:
                call()
                outcomes[what] = "no error"
            except InvalidArgumentError:
                outcomes[what] = "refused"
            if len(planned.asked) + len(planned.taken) + len(planned.refused) != reached:
                outcomes[what] += ", plan reached"
            if (comm.blocked_seq, comm.blocked_op) != (0, ""):
                outcomes[what] += f", blocked in {comm.blocked_op!r}"
        return outcomes, message_ring(comm, ("numpy", "int64"), 0, 1, False)

    for r, (outcomes, wrong) in enumerate(run_threads(body, 3)):
        assert outcomes == dict.fromkeys(outcomes, "refused"), f"rank {r}: {outcomes}"
        assert wrong == [], f"rank {r}: after the bad messages, {wrong}"


def test_a_plan_raising_not_planned_leaves_the_message_to_the_pipeline() -> None:
    """Plans that raise NotPlanned for every message (having sent nothing) are reached by each
    with its peer and tag; the pipeline then moves it: right data and sender, mark cleared. A
    strided view is declined by the plan itself, alike."""

    def body() -> tuple[list[Any], list[Any], list[Any], list[str]]:
        comm: Any = distcomm.get_communicator()
        planned = PlannedMessages(comm, refuse=True)
        wrong = message_rings(comm)
        planned.refuse = False
        refused, planned.refused = planned.refused, []
        n, r = comm.world_size, comm.rank
        holder = np.full(2 * K, 99, np.int64)
        comm.send(values("int64", r, 0, 2 * K)[::2], (r + 1) % n, 3)
        got = comm.recv(holder[::2], None, 3)
        want = np.stack([values("int64", (r - 1) % n, 0, 2 * K)[::2], np.full(K, 99)], 1)
        strided = [] if got == (r - 1) % n and np.array_equal(holder, want.ravel()) else [got]
        return wrong, refused, planned.refused, strided

    n = 3
    for r, (wrong, refused, declined, strided) in enumerate(run_threads(body, n)):
        assert wrong == [], f"rank {r}: {wrong}"
        want = messages_in_order(r, n)
        assert refused == want, f"rank {r}: {refused[:4]}..."
        assert declined == [("send", (r + 1) % n, 3), ("recv", None, 3)], f"rank {r}: {declined}"
        assert strided == [], f"rank {r}: a strided message went wrong: {strided}"


def test_a_kind_of_message_without_a_plan_takes_the_pipeline() -> None:
    """An engine with no plan for the messages (``_plan`` returns None) is asked once per kind,
    on its first message; every message goes through the pipeline: right data and sender, mark
    cleared, the engine not asked again."""

    def body() -> tuple[list[Any], list[Any], int]:
        comm: Any = distcomm.get_communicator()
        planned = PlannedMessages(comm, none=True)
        wrong = message_rings(comm) + message_rings(comm)
        return wrong, planned.asked, len(planned.taken) + len(planned.refused)

    n = 3
    for r, (wrong, asked, reached) in enumerate(run_threads(body, n)):
        assert wrong == [], f"rank {r}: {wrong}"
        assert asked == message_kinds(r, n), f"rank {r}: asked {asked[:4]}..."
        assert reached == 0, f"rank {r}: {reached} messages reached a plan"


def test_a_plans_errors_become_distcomms_and_the_mark_is_cleared() -> None:
    """Rank 0 receives from rank 1, which never sends: the wait inside the plan ends in
    distcomm's DistTimeoutError (the fabric sees the stall; its Work names the message). On
    rank 1 an engine's exception (one of ``engine_errors``) raised by a send's plan becomes
    EngineError naming the message. Both leave the mark clear and retire the communicator."""

    def body() -> tuple[str, str, tuple[int, str], str | None]:
        comm: Any = distcomm.get_communicator()
        planned = PlannedMessages(comm)
        try:
            if comm.rank == 0:
                comm.recv(np.zeros(K), 1, 9)
            else:
                comm.engine_errors = (OSError,)
                planned.broken = True
                comm.send(np.zeros(K), 0, 4)
            error, message = "no error", ""
        except (DistTimeoutError, EngineError) as exc:
            error, message = type(exc).__name__, str(exc)
        return error, message, (comm.blocked_seq, comm.blocked_op), comm.unusable

    (error0, message0, mark0, unusable0), (error1, message1, mark1, unusable1) = run_threads(
        body, 2
    )
    assert error0 == "DistTimeoutError", message0
    assert "no message from rank 1 with tag 9 arrived" in message0, message0  # fakelink's Work
    assert error1 == "EngineError", message1
    assert "send to rank 0 (tag 4)" in message1 and "link down" in message1, message1
    assert mark0 == mark1 == (0, ""), (mark0, mark1)
    assert unusable0 is not None and unusable1 is not None, (unusable0, unusable1)


def test_a_world_of_one_asks_for_no_plan_until_it_calls_its_engine() -> None:
    """A world of 1 answers collectives without its engine: no plan is asked for, so none runs;
    made to call its engine (``world_of_one_shortcut = False``), it plans like any other."""
    asked: list[str] = []

    def body() -> tuple[list[str], float]:
        comm: Any = distcomm.get_communicator()
        comm.debug = "off"
        give_plans(comm, lambda kind: asked.append(kind.op))  # asked, no plan given
        x = np.ones(2)
        for _ in range(3):
            comm.all_reduce(x)
            comm.broadcast(x, 0)
        before = list(asked)
        comm.world_of_one_shortcut = False
        for _ in range(3):
            comm.all_reduce(x)
        return before, float(x[0])

    before, value = run_threads(body, 1)[0]
    assert before == [], f"a world of 1 asked its engine for plans: {before}"
    assert asked == ["all_reduce"], f"the engine called by a world of 1 was asked: {asked}"
    assert value == 1.0


def _uneven(comm: Any, width: int) -> None:
    """An uneven all_to_all_single moving 2 elements to every rank in rows of ``width``: the
    engine sees the same counts whatever the width, the split tables do not."""
    rows = [2 // width] * comm.world_size
    t = np.ones((sum(rows), width), np.float32)
    comm.all_to_all_single(np.empty_like(t), t, rows, rows)


@pytest.mark.parametrize("first", ["async barrier", "none"])
def test_a_barrier_settles_split_tables_that_wait_even_after_an_async_barrier(first: str) -> None:
    """Split tables of uneven all-to-alls wait to be settled: the barrier's plan is dropped until
    a blocking barrier votes and settles them (an async barrier, which cannot, does not bring
    the plan back), and the mismatch is named there."""

    def body() -> int | None:
        comm: Any = distcomm.get_communicator()
        past_the_first_checks(comm)
        comm.barrier()  # the first barrier: voted; the next ones have a plan
        _uneven(comm, 2)
        _uneven(comm, 1 if comm.rank == 1 else 2)  # the tables disagree
        if first == "async barrier":
            comm.barrier(async_op=True).wait()
        try:
            comm.barrier()
        except CollectiveMismatchError as exc:
            return exc.seq
        return None

    seqs = run_threads(body, 2)
    assert seqs[0] is not None and seqs[0] == seqs[1], f"the barrier named no mismatch: {seqs}"


def test_an_engine_whose_plan_raises_is_warned_about_and_its_calls_take_the_pipeline() -> None:
    """An engine's ``_plan`` that raises (here: for the barrier, which a plugin may not expect)
    is no plan: a warning names it, once, and every call still runs (the pipeline's)."""

    def body() -> tuple[list[str], int]:
        comm: Any = distcomm.get_communicator()
        give_plans(comm, lambda kind: {"all_reduce": lambda x, y: None}[kind.op])
        with pytest.warns(distcomm.DistcommWarning, match=r"engine's plan\('barrier'.*KeyError"):
            for _ in range(3):
                comm.barrier()
        x = np.ones(2)
        comm.all_reduce(x)
        return [op for op, *_ in comm._plans.kinds], comm.seq

    ops, seq = run_threads(body, 2)[0]
    assert seq == 4 and "barrier" in ops, (ops, seq)


def test_an_ops_latest_kind_goes_with_its_entry_and_no_further() -> None:
    """``Plans.last`` (each op's latest kind, found without a key's hash) never outlives the
    entry it points to: a new fingerprint for a kind replaces it, forgetting empties it, and
    dropping the barrier's kind (every uneven all-to-all does) drops the barrier's alone."""
    plans = Plans(lambda kind: lambda x, y: None, lambda x, y: None, (0, 1), 0)
    x, adapter = np.ones(4, np.float32), adapter_for(np.ones(1, np.float32))
    native = frozenset({"float32"})
    plans.learn("all_reduce", x, adapter, None, ReduceOp.SUM, 7, native)
    plans.learn("barrier", NO_ARRAY, None, None, None, 7, native)
    assert plans.find("all_reduce", x, None) is not None
    assert plans.find("barrier", NO_ARRAY, None) is not None
    assert sorted(plans.last) == ["all_reduce", "barrier"]
    plans.drop_barrier()
    assert sorted(plans.last) == ["all_reduce"], plans.last
    plans.learn("all_reduce", x, adapter, None, ReduceOp.SUM, 8, native)  # a new fingerprint
    assert plans.last == {}, "an op's latest kind kept a replaced entry"
    assert plans.find("all_reduce", x, None)[1] == 8
    plans.forget()
    assert plans.last == {} and plans.kinds == {}


def test_the_flight_recorder_names_the_users_line_of_a_planned_call() -> None:
    """A planned call's flight-recorder entry names the line that made it, called through the
    module function or the method, from one function or another, with and without a hook
    watching, the first of a run of calls of its kind or a later one (the plan's two paths
    through the kit; the recorder remembers the last caller's code: a caller that changes
    is looked for again)."""
    import inspect

    from distcomm._runtime.flight_recorder import FlightRecorder
    from distcomm.compat import ding

    def elsewhere(x: Any) -> int:
        distcomm.all_reduce(x)
        return inspect.currentframe().f_lineno - 1  # type: ignore[union-attr]

    def body() -> tuple[list[tuple[str | None, str]], int]:
        comm: Any = distcomm.get_communicator()
        planner = Planner(comm)
        past_the_first_checks(comm)
        recorder = FlightRecorder(100, "/nonexistent/never-dumped", comm.rank, comm.world_size)
        comm._record_into(recorder)
        x = np.ones(K, np.float32)
        here = inspect.currentframe()
        assert here is not None
        wanted = []
        for watched in (False, True, False):
            handle = distcomm.add_hook(after=lambda event: None) if watched else None
            for _ in range(3):  # runs of a kind: the plain path past each run's first
                distcomm.all_reduce(x)
                wanted.append(f"{__file__}:{here.f_lineno - 1} in body")
                line = elsewhere(x)
                wanted.append(f"{__file__}:{line} in elsewhere")
            for _ in range(3):
                comm.broadcast(x, 0)
                wanted.append(f"{__file__}:{here.f_lineno - 1} in body")
                distcomm.broadcast(x, 0)
                wanted.append(f"{__file__}:{here.f_lineno - 1} in body")
                ding.broadcast(x, 0)  # two of distcomm's frames: the module function's too
                wanted.append(f"{__file__}:{here.f_lineno - 1} in body")
            if handle is not None:
                handle.remove()
        sites = [record["site"] for record in recorder.records()]
        return list(zip(sites, wanted, strict=True)), len(planner.taken)

    for pairs, taken in run_threads(body, 2):
        # not the first call of each kind, nor the first repeat of each, nor the first
        # all-reduce after a broadcast: steps the ranks confirm once, through the pipeline
        assert taken == 40, f"{taken} of the 45 calls took their plan (want all but five)"
        wrong = [(site, want) for site, want in pairs if site != want]
        assert not wrong, f"recorded sites (got, wanted): {wrong}"


def test_the_compiled_path_is_built_in_ci() -> None:
    """CI installs with a C compiler: a build that fell back to the Python must fail there,
    not pass on the slower path unnoticed."""
    import os

    if os.environ.get("CI", "").lower() not in ("1", "true", "yes"):
        pytest.skip("only CI promises a C compiler")
    assert COMPILED, "distcomm.backend._pipeline._planned_path was not built: see pip's output"


def _python_calls(run: Callable[[], Any], *functions: Callable[..., Any]) -> tuple[Any, int]:
    """What ``run()`` returns, and how many times the Python of ``functions`` ran in it (on
    this thread: each thread-rank counts its own)."""
    import sys

    codes = tuple(f.__code__ for f in functions)
    count = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        if event == "call" and frame.f_code in codes:
            count += 1

    sys.setprofile(profile)
    try:
        result = run()
    finally:
        sys.setprofile(None)
    return result, count


@pytest.mark.parametrize("recorded", [False, True], ids=["no recorder", "recorder"])
def test_the_compiled_path_takes_a_run_of_a_known_kind_without_the_python(
    planned_path: str, recorded: bool
) -> None:
    """Runs of calls of one kind (all_reduce, a rooted broadcast, all_gather_into_tensor with
    its output, gather with its list on the root), each kind and step taken before: the compiled
    path hands the Python only the first call of each run (a new run of its fingerprint in the
    mismatch check's history), and with the flight recorder on, the first of each site too; the
    plan takes every call, numbered in turn, the recorder keeping each with its seq and site."""
    from distcomm._runtime.flight_recorder import FlightRecorder

    def body() -> tuple[int, list[tuple[str, int]], list[Any], int]:
        comm: Any = distcomm.get_communicator()
        planner = Planner(comm)
        past_the_first_checks(comm)
        x = np.ones(K, np.float32)
        out = np.zeros(K * comm.world_size, np.float32)
        parts = (
            [np.zeros(K, np.float32) for _ in range(comm.world_size)] if comm.rank == 0 else None
        )
        calls = [
            lambda: comm.all_reduce(x),
            lambda: comm.broadcast(x, 1),
            lambda: comm.all_gather_into_tensor(out, x),
            lambda: comm.gather(x, parts, 0),
        ]

        def runs() -> None:
            for call in calls:
                for _ in range(40):
                    call()

        for _ in range(2):  # each kind, and each step from one call to the next (the last
            runs()  # run's kind to the first's in the second), taken before
        recorder = None
        if recorded:
            recorder = FlightRecorder(1000, "/nonexistent/never-dumped", comm.rank, 2)
            comm._record_into(recorder)
        first = comm.seq

        # the Python of Steps._planned, or of a kind's check of y (Fits, which the compiled
        # path reads as data)
        _, python = _python_calls(runs, PYTHON_PLANNED, Fits.__call__)
        records = [] if recorder is None else recorder.records()
        return first, planner.taken[-160:], records, python

    for rank, (first, taken, records, python) in enumerate(run_threads(body, 2)):
        ops = [op for op, _ in taken]
        want = [op for op in OPS_IN_RUNS for _ in range(40)]
        assert ops == want, f"rank {rank}: the plans took {ops[:3]}... (want 40 of each in turn)"
        assert [seq for _, seq in taken] == list(range(first + 1, first + 161)), f"rank {rank}"
        # the first call of each run (a new run of its fingerprint), whose check of y is
        # called in the two runs whose kind has one (all_gather_into_tensor's output, gather's
        # list on the root, None elsewhere); the rest compiled, the checks read as data
        if planned_path == "compiled":
            assert python == 4 + 2, (
                f"rank {rank}: the Python ran {python} times in 160 calls of 4 runs "
                "(want 6: the first of each run, and its check of y in two)"
            )
        else:  # each call, and the check of y of the two kinds that have one
            assert python == 160 + 80, f"rank {rank}: the Python ran {python} times, not 240"
        if recorded:
            assert [r["seq"] for r in records[-160:]] == list(range(first + 1, first + 161))
            assert all(r["site"] and r["site"].endswith(" in <lambda>") for r in records[-160:])


#: The ops of the runs of test_the_compiled_path_takes_a_run_of_a_known_kind_without_the_python.
OPS_IN_RUNS = ("all_reduce", "broadcast", "all_gather_into_tensor", "gather")


def test_a_collective_plans_engine_error_becomes_engine_error_and_the_mark_is_cleared() -> None:
    """A plan of a known kind raising one of the engine's errors (a link that went down): the
    call raises EngineError naming the operation, caused by the engine's error; the "blocked
    in" mark is cleared and the communicator retired, on the compiled path and the Python."""

    def body() -> tuple[str, Any, int, str | None]:
        comm: Any = distcomm.get_communicator()
        Planner(comm)
        past_the_first_checks(comm)
        x = np.ones(K, np.float32)
        comm.all_reduce(x)
        comm.all_reduce(x)  # the kind's run started: the next call is the plain one

        def broken(kind: CallKind) -> Callable[[Any, Any], None]:
            def run(x: Any, y: Any) -> None:
                raise OSError("link down")

            return run

        kinds = comm._plans.kinds
        for key, entry in list(kinds.items()):
            if key[0] == "all_reduce":
                kinds[key] = (broken(None), *entry[1:])  # type: ignore[arg-type]
        comm._plans.last.clear()
        comm.engine_errors = (OSError,)
        try:
            comm.all_reduce(x)
            error: Any = None
        except EngineError as exc:
            error = exc
        return (
            "" if error is None else str(error),
            None if error is None else error.__cause__,
            comm.blocked_seq,
            comm.unusable,
        )

    for rank, (message, cause, mark, unusable) in enumerate(run_threads(body, 2, timeout=30)):
        assert "all_reduce" in message and "link down" in message, f"rank {rank}: {message!r}"
        assert isinstance(cause, OSError), f"rank {rank}: caused by {cause!r}"
        assert mark == 0, f"rank {rank}: blocked_seq {mark} left set"
        assert unusable is not None, f"rank {rank}: the communicator is still usable"


def test_the_compiled_path_takes_known_messages_without_the_python(planned_path: str) -> None:
    """Ping-pongs between ranks 0 and 1, of one kind each way (a recv from a rank and from any
    rank): past the first message of each kind, the compiled path runs every send and recv
    itself (the Python of ``_planned_message`` is never called), under a "blocked in" mark of
    each message's own, and a receive from any rank returns the sender the plan names."""

    def body() -> tuple[list[Any], int, list[int]]:
        comm: Any = distcomm.get_communicator()
        planned = PlannedMessages(comm)
        x, got = np.arange(K, dtype=np.float32), np.zeros(K, np.float32)
        senders = []

        def ping_pong() -> None:
            if comm.rank == 0:
                comm.send(x, 1, 3)
                senders.append(comm.recv(got, None, 5))
            else:
                senders.append(comm.recv(got, 0, 3))
                comm.send(x + 1, 0, 5)

        ping_pong()  # each kind learnt: its plan asked for

        def ping_pongs() -> None:
            for _ in range(30):
                ping_pong()

        _, count = _python_calls(ping_pongs, PYTHON_PLANNED_MESSAGE)
        return planned.taken[-60:], count, senders

    for rank, (taken, python, senders) in enumerate(run_threads(body, 2)):
        marks = [mark for *_, mark in taken]
        assert len(taken) == 60, f"rank {rank}: the plans took {len(taken)} of 60 messages"
        assert all(seq < 0 and label for seq, label in marks), f"rank {rank}: marks {marks[:2]}"
        assert len({seq for seq, _ in marks}) == 60, f"rank {rank}: a mark used twice"
        assert senders == [1 - rank] * 31, f"rank {rank}: senders {senders[:4]}"
        # compiled: the Python for the first of each kind past the one that learnt it (which
        # keeps the op's latest kind), then never
        want = 2 if planned_path == "compiled" else 60
        assert python == want, f"rank {rank}: the Python ran for {python} of 60 messages"
