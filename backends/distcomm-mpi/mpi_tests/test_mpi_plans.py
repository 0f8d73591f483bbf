"""The mpi backend's plans of blocking collectives inside a real MPI job (``mpirun -n N pytest
--with-mpi``).

Past the mismatch check's check points (the default policy checks collectives 1..64, then every
1024th), a blocking call of a kind the pipeline took goes to the plan the engine gave for that
kind (``MpiEngine.plan``, :mod:`distcomm_mpi.plans`: broadcast, reduce,
all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single, all_reduce, gather, scatter,
and the uneven all-to-all of numpy arrays, ``all_to_all_v``; counted here by wrapping the plans
where the kit keeps the engine's ``plan``). As a careless user would call them:

- every op's plan taken, counted, with the right results (numpy and torch, five dtypes,
  rank-dependent values, a root that is not 0), in runs of one op and interleaved, under the
  default policy and ``off``, the engine asked once per kind; and the result check shown to
  catch a wrong plan;
- gather and scatter to and from the first and the last rank, the root's list chunks of one
  buffer, arrays of their own or strided views, and its tensor one of the list's entries: taken,
  right;
- bad calls (bad lists too) refused by the pipeline alike on every rank; strided views, an
  in-place gather and async calls through the pipeline, right;
- groups made by ``split`` and ``new_group``;
- a group of one member (a world of 1 under ``mpirun -n 1``, a group of 1 of ``split`` or
  ``new_group``) answers every call locally: no plan is asked for or taken, the results are
  right (:func:`plans_taken` says which groups plan; each count expected comes from it); with
  ``world_of_one_shortcut = False`` it calls its engine and takes the plans like any group;
- a mismatch between check points named at the next one (seq 1088), on every rank;
- hooks see every call: the plans are bypassed while hooks are registered;
- uneven all-to-alls whose routing changes on every call take the plan, right; torch tensors
  (no such plan) right too; a plan that declines on one rank leaves its calls to the pipeline
  there, with the split tables kept once (the barrier that settles them finds no mismatch).

And the plans of blocking messages (send, recv, counted alike): rings of numpy arrays and torch
tensors of five dtypes on three tags (the largest this MPI takes), from a given rank and from
any rank (the sender returned), taken every time with the right data, the check shown to catch
a wrong plan; plans that raise NotPlanned and strided views through the pipeline; bad ranks and
tags refused by the pipeline alike on every rank, sending nothing; a group of split.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import distcomm_mpi.plans as mpi_plans
import numpy as np
import pytest
import torch
from mpi4py import MPI

import distcomm
from distcomm.backend import CallKind, NotPlanned
from distcomm.backend._pipeline.mismatch_check import SAMPLE_EVERY, SAMPLED_FIRST
from distcomm.errors import CollectiveMismatchError, InvalidArgumentError
from distcomm.protocol import Communicator

pytestmark = pytest.mark.mpi

LIBS = ("numpy", "torch")
DTYPES = ("float32", "float64", "int32", "int64", "int8")
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
#: The ops with an output beside the input (the plan's ``y``).
OUTPUTS = ("all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single")
#: The ops whose input holds one chunk per rank.
CHUNKED = ("reduce_scatter_tensor", "all_to_all_single")
#: The ops whose list of world_size arrays is given on the root only.
ROOTED = ("gather", "scatter")
#: Elements of one rank's chunk.
K = 4
#: Calls of each op per library and dtype.
STEPS = 4
#: The first check point past the first 64 under the default policy.
NEXT_CHECK = SAMPLED_FIRST + SAMPLE_EVERY


Run = Callable[[Any, Any], Any]


def plans_taken(group: Any) -> bool:
    """Whether ``group`` asks its engine for plans and takes them: every group but one of one
    member that answers its collectives locally (``world_of_one_shortcut``, the default in a
    world of 1), which never calls the engine, so learns no kind and asks for no plan."""
    return group.world_size > 1 or not group.world_of_one_shortcut


def if_planned(group: Any, count: int) -> int:
    """``count`` (of plans asked for or taken) where ``group`` takes plans, else 0."""
    return count if plans_taken(group) else 0


def wrap_plans(comm: Any, wrap: Callable[[CallKind, Run], Run]) -> None:
    """Wrap the plans ``comm``'s engine gives from now on: each ``run`` it returns for a kind
    becomes ``wrap(kind, run)``. The kit read ``MpiEngine.plan`` when it made ``comm``
    (into its table of kinds, ``_plans``): the table is given the wrapper of it, and forgets
    the kinds learned before (so that the engine is asked again)."""
    table = comm._plans
    engine = table.engine_plan

    def plan(kind: CallKind) -> Run | None:
        run = engine(kind)
        return None if run is None else wrap(kind, run)

    table.ask_through(plan)


class Counted:
    """Counting wrappers on the plans of collectives ``comm``'s engine gives (:func:`wrap_plans`):
    per op, the kinds it planned, the calls that reached a plan and those it took (a plan that
    raised NotPlanned took none). ``spoil[op]``, when set, corrupts what a taken plan wrote (to
    show that the result check fails)."""

    def __init__(self, comm: Any) -> None:
        self.planned = dict.fromkeys(OPS, 0)
        self.calls = dict.fromkeys(OPS, 0)
        self.taken = dict.fromkeys(OPS, 0)
        self.spoil: dict[str, Callable[..., None]] = {}
        wrap_plans(comm, self._wrap)

    def _wrap(self, kind: CallKind, run: Run) -> Run:
        op = kind.op
        if op not in self.calls:
            return run
        self.planned[op] += 1

        def counted(x: Any, y: Any) -> Any:
            self.calls[op] += 1
            result = run(x, y)  # NotPlanned passes: not taken
            self.taken[op] += 1
            if op in self.spoil:
                self.spoil[op](written(op, x, y))
            return result

        return counted


def written(op: str, x: Any, y: Any) -> Any:
    """What the plan of ``op`` run with ``x`` and ``y`` wrote on this rank: the tensor (in place,
    or scatter's), the output, gather's last part on the root (None elsewhere)."""
    if op == "gather":
        return None if y is None else y[-1]
    return y if op in OUTPUTS else x


def fill(group: Any) -> None:
    """One cheap collective: a broadcast of one byte from rank 0."""
    group.broadcast(np.zeros(1, np.uint8), 0)


def _past_the_first_checks(group: Any, policy: str = "sample") -> Any:
    """Move ``group`` past the first check points (unchecked calls: broadcasts of one byte from
    rank 0, the cheapest collective of 4 ranks on 2 cores), then set ``policy``."""
    group.debug = "off"
    while group.seq < SAMPLED_FIRST:
        fill(group)
    group.debug = policy
    return group


@pytest.fixture
def group(world: Communicator) -> Iterator[Any]:
    """A new group of every rank, past the first check points of the default policy."""
    made = _past_the_first_checks(distcomm.new_group(range(world.world_size)))
    yield made
    made.finalize()


def values(dtype: str, rank: int, step: int, size: int = K) -> Any:
    """Rank ``rank``'s values at ``step``: positive (a MAX differs from a SUM), rank-dependent,
    not symmetric, and small enough that four ranks' sum fits in int8."""
    return (np.arange(size) % 7 + 1 + 3 * rank + step % 4).astype(dtype)


def make(lib: str, array: Any) -> Any:
    return torch.from_numpy(array) if lib == "torch" else array


def _wants(op: str, everyone: list[Any], rank: int, root: int) -> Any:
    """What ``op`` leaves on ``rank`` (None: unspecified) when rank s passed ``everyone[s]``."""
    total = np.sum(everyone, axis=0).astype(everyone[0].dtype)
    mine = slice(rank * K, (rank + 1) * K)
    return {
        "broadcast": lambda: everyone[root],
        "reduce": lambda: total if rank == root else None,
        "all_reduce": lambda: total,
        "all_gather_into_tensor": lambda: np.concatenate(everyone),
        "reduce_scatter_tensor": lambda: total[mine],
        "all_to_all_single": lambda: np.concatenate([e[mine] for e in everyone]),
        "gather": lambda: np.concatenate(everyone) if rank == root else None,
        "scatter": lambda: everyone[rank] + root,
    }[op]()


def listed(lib: str, arrays: list[Any], how: str) -> list[Any]:
    """Copies of ``arrays`` (of one size) as a root's list: ``chunks`` of one buffer, arrays of
    their own (``separate``), or every other element of arrays twice their size (``strided``)."""
    if how == "chunks":
        whole = make(lib, np.concatenate(arrays))
        n = arrays[0].size
        return [whole[i * n : (i + 1) * n] for i in range(len(arrays))]
    return [(spread if how == "strided" else as_is)(lib, a.copy())[1] for a in arrays]


def run_rooted(
    group: Any, op: str, x: Any, everyone: list[Any], how: str, root: int, **options: Any
) -> tuple[Any, Any]:
    """gather ``x`` to, or scatter into ``x`` from, ``root``, whose list is as ``how`` says
    (:func:`listed`; scatter's entry r: ``everyone[r] + root``): (the Work, what holds the
    result: the gathered list on the root, None elsewhere, or ``x``)."""
    lib = "torch" if isinstance(x, torch.Tensor) else "numpy"
    arrays = [np.full_like(e, -1) if op == "gather" else e + root for e in everyone]
    parts = listed(lib, arrays, how) if group.rank == root else None
    work = getattr(group, op)(x, parts, root, **options)
    if op == "scatter":
        return work, x
    return work, None if parts is None else [np.asarray(p).reshape(-1) for p in parts]


def _output(op: str, dtype: str, n: int) -> Any:
    """A fresh output of ``op``, filled with -1 (None: the op works in place)."""
    size = {"all_gather_into_tensor": K * n, "reduce_scatter_tensor": K, "all_to_all_single": K * n}
    return np.full(size[op], -1, dtype) if op in size else None


Place = Callable[[str, Any], tuple[Any, Any]]


def as_is(lib: str, array: Any) -> tuple[Any, Any]:
    """``array`` of ``lib`` as it is: (what holds it, what is passed)."""
    made = make(lib, array)
    return made, made


def spread(lib: str, array: Any) -> tuple[Any, Any]:
    """``array`` as every other element (a strided view) of one twice its size, 99 between."""
    holder = np.full(2 * array.size, 99, array.dtype)
    holder[::2] = array
    made = make(lib, holder)
    return made, made[::2]


def fortran(lib: str, array: Any) -> tuple[Any, Any]:
    """``array`` as a (2, n/2) array in Fortran order (a transposed view): numpy's is contiguous
    memory not in the logical order, torch's a view that is not contiguous."""
    made = make(lib, np.ascontiguousarray(array.reshape(2, -1).T).T)
    return made, made


def _untouched(holder: Any, view: Any) -> bool:
    """Whether the elements of ``holder`` between those of ``view`` (:func:`spread`) kept 99."""
    return holder is view or bool((np.asarray(holder)[1::2] == 99).all())


def run_op(
    group: Any,
    op: str,
    lib: str,
    dtype: str,
    step: int,
    place: Place = as_is,
    place_out: Place = as_is,
    root: int | None = None,
    how: str | None = None,
    **options: Any,
) -> bool:
    """Run ``op`` once on ``group`` (root: the last rank unless given) with rank-dependent
    values, its input and output placed by ``place`` and ``place_out`` (a rooted op's list as
    ``how`` says, :func:`listed`; by default chunks of one buffer at even steps, arrays of their
    own at odd ones); whether its result is right and it counted one operation. ``options`` go
    to the call (async_op: the Work is waited for)."""
    n, r = group.world_size, group.rank
    root = n - 1 if root is None else root
    everyone = [values(dtype, s, step, K * n if op in CHUNKED else K) for s in range(n)]
    held, x = place(lib, everyone[r].copy())
    empty = _output(op, dtype, n)
    held_out, out = (None, None) if empty is None else place_out(lib, empty)
    seq = group.seq
    rooted = None
    if op in ROOTED:
        how = how or ("separate" if step % 2 else "chunks")
        work, rooted = run_rooted(group, op, x, everyone, how, root, **options)
    elif op in ("broadcast", "reduce"):
        work = getattr(group, op)(x, root, **options)
    elif op == "all_reduce":
        work = group.all_reduce(x, **options)
    else:
        work = getattr(group, op)(out, x, **options)
    if work is not None:
        work.wait()
    want = _wants(op, everyone, r, root)
    if op == "gather":
        got = None if rooted is None else np.concatenate(rooted)
    else:
        got = np.asarray(x if out is None else out).reshape(-1)
    right = want is None or np.array_equal(got, want)
    kept = _untouched(held, x) and (out is None or _untouched(held_out, out))
    return group.seq == seq + 1 and right and kept


def _program(
    group: Any, order: str, libs: tuple[str, ...] = LIBS, dtypes: tuple[str, ...] = DTYPES
) -> list[tuple[str, str, str, int]]:
    """For each library and dtype, every op STEPS times: in ``order`` "runs" (each op STEPS
    times in a row) or "interleaved" (the six ops in turn); the (lib, dtype, op, step) whose
    result was wrong."""
    wrong = []
    for lib in libs:
        for dtype in dtypes:
            if order == "runs":
                calls = [(op, step) for op in OPS for step in range(STEPS)]
            else:
                calls = [(op, step) for step in range(STEPS) for op in OPS]
            for op, step in calls:
                if not run_op(group, op, lib, dtype, step):
                    wrong.append((lib, dtype, op, step))
    return wrong


def _taken(counted: Counted, kinds: int) -> dict[str, str]:
    return {
        op: f"{counted.planned[op]} kinds planned, taken {counted.taken[op]} of {kinds * STEPS}"
        for op in OPS
    }


def _expected(kinds: int, group: Any, order: str) -> dict[str, str]:
    """What :func:`_taken` must say after :func:`_program` in ``order`` on ``group`` over
    ``kinds`` libraries x dtypes: the engine planned each kind once, when its first call went
    through the pipeline. The other calls took the plan, where no history is kept (policy off);
    with one, the mismatch check has the pipeline confirm or check some first:

    - "runs": each numpy kind's first repeat, a step the ranks never made (a torch kind's
      repeats follow its numpy twin's fingerprint: known);
    - "interleaved": the first op's calls after the first round, which follow the last op's:
      a step never made in a numpy block, confirmed once (its second round); in a torch block,
      the last op of that dtype had been followed by the first op of the next block too (two
      sizes of one op), so each is checked.

    A group that answers locally (:func:`plans_taken`) planned and took nothing."""
    planned = if_planned(group, kinds)
    taken = dict.fromkeys(OPS, kinds * (STEPS - 1))
    if group._mismatch_check is not None:
        numpy = kinds // len(LIBS)
        if order == "runs":
            taken = dict.fromkeys(OPS, kinds * (STEPS - 1) - numpy)
        else:
            taken[OPS[0]] = numpy * (STEPS - 2)
    return {
        op: f"{planned} kinds planned, taken {if_planned(group, n)} of {kinds * STEPS}"
        for op, n in taken.items()
    }


@pytest.mark.parametrize("order", ["runs", "interleaved"])
@pytest.mark.parametrize("policy", ["sample", "off"])
def test_every_plan_is_taken_past_the_check_points_and_right(
    group: Any, policy: str, order: str
) -> None:
    """Past the check points every op's plan is taken (counted) for numpy and torch, five
    dtypes, a root that is not 0, with the right results and one operation a call (a world of
    1: none asked for or taken, the results right)."""
    group.debug = policy
    counted = Counted(group)
    wrong = _program(group, order)
    kinds = len(LIBS) * len(DTYPES)
    assert not wrong, f"rank {group.rank}: wrong results (or seq) at {wrong}"
    assert _taken(counted, kinds) == _expected(kinds, group, order)
    assert counted.calls == counted.taken, f"refused: {counted.calls} reached, {counted.taken}"


def test_a_world_of_one_that_calls_its_engine_takes_the_plans(group: Any) -> None:
    """With ``world_of_one_shortcut = False`` a group of one member calls its engine like any
    group: the engine plans each kind once and every later call takes the plan, with the right
    results (on a group of several ranks, which always calls its engine, the setting changes
    nothing)."""
    group.world_of_one_shortcut = False
    assert plans_taken(group), "a world of 1 calling its engine takes no plan"
    counted = Counted(group)
    wrong = _program(group, "interleaved", dtypes=("float32", "int8"))
    kinds = len(LIBS) * 2
    assert not wrong, f"rank {group.rank}: wrong results (or seq) at {wrong}"
    assert _taken(counted, kinds) == _expected(kinds, group, "interleaved")
    assert counted.calls == counted.taken, f"refused: {counted.calls} reached, {counted.taken}"


def _planned_steps(ops: tuple[str, ...], group: Any) -> list[tuple[str, str, str, int]]:
    """The (lib, dtype, op, step) that take the plan in a "runs" program over ``ops`` (of
    float32 and int64), in the program's order: every step but the first, and but the second
    of a numpy kind where a history is kept (its first repeat, a step the ranks confirm once;
    a torch kind follows its numpy twin's fingerprint); a reduce's and a gather's result is
    checked on the root. None in a group that takes no plan."""
    if not plans_taken(group):
        return []
    rank, root = group.rank, group.world_size - 1
    confirmed = group._mismatch_check is not None
    return [
        (lib, dtype, op, step)
        for lib in LIBS
        for dtype in ("float32", "int64")
        for op in OPS
        if op in ops and (op not in ("reduce", "gather") or rank == root)
        for step in range(2 if confirmed and lib == "numpy" else 1, STEPS)
    ]


@pytest.mark.mpi(min_size=2)
def test_the_result_check_catches_plans_that_reduce_by_max(
    group: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check fails where it must: with the MPI op of the reduction plans made MAX (the
    pipeline's own table untouched; reduce_scatter_tensor's plan calls the group's
    ``Reduce_scatter_block`` with its default op, SUM, which is made MAX here), exactly the
    calls that took them are wrong."""
    monkeypatch.setattr(mpi_plans, "_MPI_SUM", MPI.MAX)
    block = group.engine._reduce_scatter_block
    monkeypatch.setattr(group.engine, "_reduce_scatter_block", lambda s, r: block(s, r, MPI.MAX))
    wrong = _program(group, "runs", dtypes=("float32", "int64"))
    reductions = ("reduce", "reduce_scatter_tensor", "all_reduce")
    assert wrong == _planned_steps(reductions, group)


@pytest.mark.parametrize("op", OPS)
def test_the_result_check_catches_a_plan_that_writes_wrong_data(group: Any, op: str) -> None:
    """A plan that corrupts one element of what it wrote (the tensor, the output, or gather's
    last part on the root) is caught at exactly the calls that took it (a world of 1 takes
    none: nothing is caught)."""
    counted = Counted(group)

    def spoil(target: Any) -> None:
        if target is not None:
            target[0] += 1

    counted.spoil[op] = spoil
    wrong = _program(group, "runs", dtypes=("float32", "int64"))
    assert wrong == _planned_steps((op,), group)


def _bad_calls(group: Any, lib: str) -> dict[str, Callable[[], Any]]:
    """Calls the pipeline refuses, each next to a good call like it (float32, K a rank)."""
    n = group.world_size
    other = "numpy" if lib == "torch" else "torch"
    x = make(lib, np.ones(K, np.float32))
    full = make(lib, np.ones(K * n, np.float32))

    def out(size: int, dtype: str = "float32", of: str = lib) -> Any:
        return make(of, np.zeros(size, dtype))

    return {
        "all_gather: output too small": lambda: group.all_gather_into_tensor(out(K * n - 1), x),
        "all_gather: float64 output": lambda: group.all_gather_into_tensor(out(K * n, "f8"), x),
        "all_gather: output of the other library": lambda: group.all_gather_into_tensor(
            out(K * n, of=other), x
        ),
        "reduce_scatter: output too large": lambda: group.reduce_scatter_tensor(out(K + 1), full),
        "reduce_scatter: int32 output": lambda: group.reduce_scatter_tensor(out(K, "i4"), full),
        "all_to_all: output too small": lambda: group.all_to_all_single(out(K * n - 1), full),
        "all_to_all: int32 output": lambda: group.all_to_all_single(out(K * n, "i4"), full),
        "broadcast: src=True": lambda: group.broadcast(x, True),
        "broadcast: src=world_size": lambda: group.broadcast(x, n),
        "broadcast: src=-1": lambda: group.broadcast(x, -1),
        "reduce: dst=True": lambda: group.reduce(x, True),
        "reduce: dst=world_size": lambda: group.reduce(x, n),
        **_bad_rooted_calls(group, lib, x),
    }


def _bad_rooted_calls(group: Any, lib: str, x: Any) -> dict[str, Callable[[], Any]]:
    """gathers to the last rank and scatters from rank 0 that the pipeline refuses on every
    rank: a bad list on the root, a list (of good arrays) on the others, or a bad root."""
    n, last = group.world_size, group.world_size - 1
    other = "numpy" if lib == "torch" else "torch"

    def z(size: int = K, dtype: str = "float32", of: str = lib) -> Any:
        return make(of, np.zeros(size, dtype))

    def listed_bad(root: int, bad: Any) -> Any:
        return bad if group.rank == root else [z() for _ in range(n)]

    lists = {
        "one short": [z() for _ in range(n - 1)],
        "one long": [z() for _ in range(n + 1)],
        "int32 in it": [*[z() for _ in range(n - 1)], z(K, "int32")],
        "one of the other library in it": [z(of=other), *[z() for _ in range(n - 1)]],
        "a larger array in it": [*[z() for _ in range(n - 1)], z(K + 1)],
        "None on the root": None,
    }
    calls: dict[str, Callable[[], Any]] = {}
    for what, bad in lists.items():
        calls[f"gather: list {what}"] = lambda b=bad: group.gather(x, listed_bad(last, b), last)
        calls[f"scatter: list {what}"] = lambda b=bad: group.scatter(x, listed_bad(0, b), 0)
    calls["gather: dst=True"] = lambda: group.gather(x, listed_bad(1 % n, None), True)
    calls["scatter: src=world_size"] = lambda: group.scatter(x, listed_bad(0, None), n)
    return calls


def _good_call(group: Any, what: str, lib: str) -> None:
    """A good call of the op of bad call ``what`` (src and dst 1 where the world has a rank 1:
    True would be that rank; gather to the last rank, scatter from 0), so that the bad one comes
    in a run of its op."""
    n = group.world_size
    x = make(lib, np.ones(K, np.float32))
    full = make(lib, np.ones(K * n, np.float32))
    zeros = make(lib, np.zeros(K * n, np.float32))
    op = what.split(":")[0]
    if op == "all_gather":
        group.all_gather_into_tensor(zeros, x)
    elif op == "reduce_scatter":
        group.reduce_scatter_tensor(zeros[:K], full)
    elif op == "all_to_all":
        group.all_to_all_single(zeros, full)
    elif op in ROOTED:  # to the last rank, from rank 0
        root = n - 1 if op == "gather" else 0
        parts = list(zeros.chunk(n) if lib == "torch" else np.split(zeros, n))
        getattr(group, op)(x, parts if group.rank == root else None, root)
    else:
        getattr(group, op)(x, 1 % n)


@pytest.mark.parametrize("lib", LIBS)
def test_bad_calls_past_the_check_points_are_refused_alike_on_every_rank(
    group: Any, lib: str
) -> None:
    """Past the check points, with every op's plan open (its kind known), a bad call
    raises the pipeline's InvalidArgumentError on every rank, counts nothing, sends nothing;
    the group goes on with right results."""
    counted = Counted(group)
    for what in _bad_calls(group, lib):  # every op's kinds known and agreed
        _good_call(group, what, lib)
    outcomes = {}
    for what, call in _bad_calls(group, lib).items():
        _good_call(group, what, lib)
        seq, taken = group.seq, dict(counted.taken)
        try:
            call()
            outcomes[what] = "no error"
        except InvalidArgumentError:
            outcomes[what] = "InvalidArgumentError" if group.seq == seq else "seq moved"
        except Exception as exc:
            outcomes[what] = f"{type(exc).__name__}: {exc}"
        if counted.taken != taken:
            outcomes[what] += ", plan taken"
    wrong = _program(group, "interleaved", libs=(lib,), dtypes=("float32",))
    everyone = group.all_gather_object(outcomes)
    bad = {k: v for k, v in outcomes.items() if v != "InvalidArgumentError"}
    assert not bad, f"rank {group.rank}: {bad}"
    assert all(o == outcomes for o in everyone), f"the ranks differ: {everyone}"
    assert not wrong, f"after the bad calls, wrong results at {wrong}"


@pytest.mark.parametrize("op", ["all_gather_into_tensor", "reduce_scatter_tensor"])
def test_a_none_output_past_the_check_points_is_refused(group: Any, op: str) -> None:
    """output=None (a forgotten buffer) raises InvalidArgumentError, as in the first calls."""
    for step in range(3):
        run_op(group, op, "numpy", "float32", step)
    n = group.world_size
    seq = group.seq
    with pytest.raises(InvalidArgumentError):
        size = K if op == "all_gather_into_tensor" else K * n
        getattr(group, op)(None, np.ones(size, np.float32))
    assert group.seq == seq


@pytest.mark.parametrize(("place", "place_out"), [(spread, as_is), (as_is, spread)])
@pytest.mark.parametrize("lib", LIBS)
def test_strided_views_go_through_the_pipeline_and_are_right(
    group: Any, lib: str, place: Place, place_out: Place
) -> None:
    """A strided view (every other element) as input, or as output, right after a call like it
    (its plan open) goes through the pipeline (the plan raises NotPlanned, or the kit takes no
    plan for an output unlike the input): right results, the elements between kept."""
    counted = Counted(group)
    ops = [op for op in OPS if place is spread or _output(op, "float32", 1) is not None]
    wrong = []
    for step in range(3):
        for op in ops:
            run_op(group, op, lib, "float32", step)  # contiguous: the plan from step 1 on
            taken = dict(counted.taken)
            if not run_op(group, op, lib, "float32", step, place, place_out):
                wrong.append((op, step, "wrong"))
            if counted.taken != taken:
                wrong.append((op, step, "taken"))
    assert not wrong, f"rank {group.rank}: strided views {wrong}"
    opened = {op: bool(counted.taken[op]) for op in ops}
    assert opened == dict.fromkeys(ops, plans_taken(group)), f"plans taken: {counted.taken}"


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_transposed_inputs_are_right(group: Any, lib: str) -> None:
    """Ranks other than 0 pass a transposed view (Fortran order) where rank 0 passes a
    contiguous array, right after calls like it: every rank's results must be right (gathered,
    so that every rank fails or passes alike)."""
    for op in OPS:
        run_op(group, op, lib, "float32", 0)  # every op's kind known: its plan open
    place = fortran if group.rank else as_is
    wrong = [
        (op, step)
        for step in (1, 2)
        for op in OPS
        if not run_op(group, op, lib, "float32", step, place)
    ]
    everyone = group.all_gather_object(wrong)
    assert everyone == [[]] * group.world_size, f"wrong results by rank: {everyone}"


@pytest.mark.parametrize("lib", LIBS)
def test_an_in_place_gather_goes_through_the_pipeline_and_is_right(group: Any, lib: str) -> None:
    """all_gather_into_tensor whose input is a view of its own slot of the output (torch's
    in-place gather; MPI forbids aliased buffers) after calls like it: the pipeline takes it."""
    counted = Counted(group)
    n, r = group.world_size, group.rank
    wrong = []
    for step in range(4):
        run_op(group, "all_gather_into_tensor", lib, "float32", step)  # the plan open
        everyone = [values("float32", s, step) for s in range(n)]
        full = np.full(K * n, -1, np.float32)
        full[r * K : (r + 1) * K] = everyone[r]
        out = make(lib, full)
        taken = counted.taken["all_gather_into_tensor"]
        group.all_gather_into_tensor(out, out[r * K : (r + 1) * K])
        if not np.array_equal(np.asarray(out), np.concatenate(everyone)):
            wrong.append((step, "wrong"))
        if counted.taken["all_gather_into_tensor"] != taken:
            wrong.append((step, "taken"))
    assert not wrong, f"rank {r}: in-place gathers {wrong}"
    assert counted.taken["all_gather_into_tensor"] == if_planned(group, 3), counted.taken


@pytest.mark.parametrize("how", ["chunks", "separate"])
def test_a_read_only_gather_list_is_refused_on_the_root_before_anything_moves(
    group: Any, how: str
) -> None:
    """After gathers of the kind (the plan open), the root's read-only list (chunks of one
    read-only buffer, or read-only arrays of their own) reaches the plan, which leaves it to the
    pipeline: InvalidArgumentError naming the list, nothing sent (the other ranks call
    nothing), ``seq`` unchanged; the next gather is right on every rank."""
    n, r = group.world_size, group.rank
    counted = Counted(group)
    for step in range(3):
        parts = [np.zeros(K, np.float32) for _ in range(n)] if r == 0 else None
        group.gather(values("float32", r, step), parts, 0)
    seq, reached = group.seq, counted.calls["gather"]
    refused = ""
    if r == 0:
        full = np.zeros(K * n, np.float32)
        ro = np.split(full, n) if how == "chunks" else [np.zeros(K, np.float32) for _ in range(n)]
        for p in (full, *ro):
            p.flags.writeable = False
        try:
            group.gather(values("float32", 0, 9), ro, 0)
        except InvalidArgumentError as exc:
            refused = str(exc)
    after = (group.seq, counted.calls["gather"] - reached)
    parts = [np.zeros(K, np.float32) for _ in range(n)] if r == 0 else None
    group.gather(values("float32", r, 5), parts, 0)
    right = parts is None or all(
        np.array_equal(p, values("float32", s, 5)) for s, p in enumerate(parts)
    )
    if r == 0:
        assert "gather_list[0] is read-only" in refused and "HINT" in refused, refused
        assert after == (seq, if_planned(group, 1)), f"seq, plans reached: {after}"
    assert right, f"rank {r}: the gather after the refused one: {parts}"


@pytest.mark.parametrize("how", ["chunks", "separate", "strided"])
@pytest.mark.parametrize("root", ["first", "last"])
def test_gather_and_scatter_take_the_plan_for_every_list_and_root(
    group: Any, root: str, how: str
) -> None:
    """Past the check points, gathers to and scatters from rank 0 or the last rank, numpy and
    torch, five dtypes, the root's list chunks of one buffer (MPI takes it as it is), arrays of
    their own or strided views (both copied through the communicator's scratch): every call but
    the first of its kind takes the plan, right (and but the first repeat of a numpy kind, a
    step the ranks confirm once: a torch kind's follows its numpy twin's fingerprint)."""
    at = 0 if root == "first" else group.world_size - 1
    counted = Counted(group)
    wrong = [
        (lib, dtype, op, step)
        for lib in LIBS
        for dtype in DTYPES
        for op in ROOTED
        for step in range(STEPS)
        if not run_op(group, op, lib, dtype, step, root=at, how=how)
    ]
    kinds = len(LIBS) * len(DTYPES)
    assert not wrong, f"rank {group.rank}: wrong results (or seq) at {wrong}"
    taken = {op: counted.taken[op] for op in ROOTED}
    confirmed = len(DTYPES) if group._mismatch_check is not None else 0
    want = if_planned(group, kinds * (STEPS - 1) - confirmed)
    assert taken == dict.fromkeys(ROOTED, want), taken


def _aliased(group: Any, op: str, lib: str, step: int, how: str, slot: int) -> bool:
    """A gather to or scatter from the last rank whose tensor, on the root, is entry ``slot``
    of its list (``how``: :func:`listed`); whether the result is right (the pipeline's: the
    gathered list; a scatter's tensor gets the root's own entry)."""
    n, r, root = group.world_size, group.rank, group.world_size - 1
    everyone = [values("float32", s, step) for s in range(n)]
    if r != root:
        x = make(lib, everyone[r].copy())
        getattr(group, op)(x, None, root)
        return op == "gather" or bool(np.array_equal(np.asarray(x), everyone[r] + root))
    arrays = [np.full_like(e, -1) if op == "gather" else e + root for e in everyone]
    parts = listed(lib, arrays, how)
    x = parts[slot]
    if op == "gather":
        x[:] = make(lib, everyone[root].copy())
    getattr(group, op)(x, parts, root)
    if op == "scatter":
        return bool(np.array_equal(np.asarray(x), everyone[root] + root))
    return all(np.array_equal(np.asarray(p), e) for p, e in zip(parts, everyone, strict=True))


@pytest.mark.parametrize("how", ["chunks", "separate"])
@pytest.mark.parametrize("lib", LIBS)
def test_rooted_calls_whose_tensor_is_in_the_list_are_right(group: Any, lib: str, how: str) -> None:
    """On the root, the tensor is an entry of its own list: its own slot (a chunk of the
    buffer: MPI_IN_PLACE) or another rank's (MPI forbids aliased buffers: through the scratch),
    after calls like it (the plan open). Every result is the pipeline's, and MPI takes
    every call (the plan, every call past the first repeat)."""
    counted = Counted(group)
    n, root = group.world_size, group.world_size - 1
    wrong = []
    for op in ROOTED:
        run_op(group, op, lib, "float32", 0)  # the kind known: its plan open
        for step in range(1, 3):
            for slot in sorted({root, (root + 1) % n}):
                if not _aliased(group, op, lib, step, how, slot):
                    wrong.append((op, step, slot))
    # every call but the first repeat of each op's kind, a step the ranks confirm once
    calls = 2 * len({root, (root + 1) % n}) - (group._mismatch_check is not None)
    assert not wrong, f"rank {group.rank}: in-place rooted calls {wrong}"
    taken = {op: counted.taken[op] for op in ROOTED}
    assert taken == dict.fromkeys(ROOTED, if_planned(group, calls)), taken


@pytest.mark.parametrize("lib", LIBS)
def test_async_calls_take_no_plan_and_are_right(group: Any, lib: str) -> None:
    """async_op=True calls like the ones before them never run a plan; their Works complete
    with the right results."""
    counted = Counted(group)
    for op in OPS:
        run_op(group, op, lib, "float32", 0)
    reached = dict(counted.calls)
    wrong = [
        (op, step)
        for step in range(1, 4)
        for op in OPS
        if not run_op(group, op, lib, "float32", step, async_op=True)
    ]
    assert not wrong, f"rank {group.rank}: async calls wrong at {wrong}"
    assert counted.calls == reached, f"an async call reached a plan: {counted.calls}"


@pytest.mark.parametrize("how", ["split", "new_group"])
def test_groups_from_split_and_new_group_take_the_plans(world: Communicator, how: str) -> None:
    """A group of split (by parity, ranks in reverse order: group ranks are not world ranks) or
    of new_group (every rank but 0) takes every plan past its check points, rightly; one of a
    single member (split's and new_group's under 1 or 2 ranks) answers locally, rightly, and
    takes none."""
    n, r = world.world_size, world.rank
    if how == "split":
        made: Any = world.split(r % 2, key=-r)
    else:
        made = world.new_group(range(1, n) if n > 1 else [0])
    if made is distcomm.NON_MEMBER:
        return
    group = _past_the_first_checks(made)
    try:
        counted = Counted(group)
        wrong = _program(group, "interleaved", dtypes=("float32", "int8"))
    finally:
        group.finalize()
    kinds = len(LIBS) * 2
    assert not wrong, f"rank {r} ({group.rank} of {group.global_ranks}): wrong at {wrong}"
    assert _taken(counted, kinds) == _expected(kinds, group, "interleaved")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("kind", ["dtype", "reduce op"])
def test_a_mismatch_between_check_points_is_named_before_mpi_runs_it(group: Any, kind: str) -> None:
    """Rank 1 alone makes a call of another kind than the others', both known and agreed, and
    both agreed to follow the call before (a fill, after which the ranks made the two in turn):
    a broadcast of int32 for one of float32 (planned both; MPI would move the same bytes) or an
    all_reduce by MAX for one by SUM (MPI would run the same Allreduce). Every rank checks the
    call before it is issued: every rank raises CollectiveMismatchError naming it, nothing ran,
    and the group stays usable."""
    root = group.world_size - 1
    if kind == "dtype":
        calls = (
            lambda: group.broadcast(np.ones(K, np.float32), root),
            lambda: group.broadcast(np.ones(K, np.int32), root),
        )
        named = f"rank 1: broadcast, shape ({K},), int32, {K} elements, root {root}"
    else:
        calls = (
            lambda: group.all_reduce(np.ones(K)),
            lambda: group.all_reduce(np.ones(K), op="MAX"),
        )
        named = f"rank 1: all_reduce, shape ({K},), float64, {K} elements, op MAX"
    for _ in range(3):
        fill(group)
        calls[0]()
        fill(group)
        calls[1]()
    fill(group)
    at = group.seq + 1
    with pytest.raises(CollectiveMismatchError) as caught:
        calls[1 if group.rank == 1 else 0]()
    error = caught.value
    assert (error.seq, error.ran, group.seq) == (at, None, at), str(error)
    assert named in str(error), str(error)
    calls[0]()  # still usable
    assert group.seq == at + 1


def test_hooks_registered_past_the_check_points_see_every_call(group: Any) -> None:
    """With the plans open, hooks added see every call once (before and after), in order and
    numbered, and the plans keep running under them (a world of 1 takes none)."""
    counted = Counted(group)
    _program(group, "interleaved", libs=("numpy",), dtypes=("float32",))
    seen: list[tuple[str, str, int]] = []

    def before(e: distcomm.CollectiveEvent) -> None:
        if e.group is group:
            seen.append(("before", e.op, e.seq))

    def after(e: distcomm.CollectiveEvent) -> None:
        if e.group is group:
            seen.append(("after", e.op, e.seq))

    seq = group.seq
    taken = dict(counted.taken)
    with distcomm.add_hook(before=before, after=after):
        wrong = _program(group, "interleaved", libs=("numpy",), dtypes=("float32",))
    calls = [op for step in range(STEPS) for op in OPS]
    want = [(w, op, seq + i + 1) for i, op in enumerate(calls) for w in ("before", "after")]
    assert not wrong, f"rank {group.rank}: wrong under hooks at {wrong}"
    assert seen == want, f"rank {group.rank}: the hooks saw {len(seen)} events, want {len(want)}"
    under = {op: counted.taken[op] - taken[op] for op in OPS}
    assert under == dict.fromkeys(OPS, if_planned(group, STEPS)), f"under the hooks, taken {under}"


# -- blocking messages ---------------------------------------------------------------------------
MESSAGES = ("send", "recv")


class CountedMessages:
    """Counting wrappers on the plans of ``send`` and ``recv`` ``comm``'s engine gives
    (:func:`wrap_plans`): the kinds it planned, the messages that reached each plan and those
    it took (a plan that raised NotPlanned took none). ``spoil``, when set, corrupts what a
    taken recv wrote; ``refuse`` makes both raise NotPlanned without asking MPI."""

    def __init__(self, comm: Any) -> None:
        self.planned = dict.fromkeys(MESSAGES, 0)
        self.calls = dict.fromkeys(MESSAGES, 0)
        self.taken = dict.fromkeys(MESSAGES, 0)
        self.spoil: Callable[[Any], None] | None = None
        self.refuse = False
        wrap_plans(comm, self._wrap)

    def _wrap(self, kind: CallKind, run: Run) -> Run:
        way = kind.op
        if way not in self.calls:
            return run
        self.planned[way] += 1

        def counted(tensor: Any, y: Any) -> Any:
            self.calls[way] += 1
            if self.refuse:
                raise NotPlanned
            said = run(tensor, y)  # NotPlanned passes: not taken
            self.taken[way] += 1
            if way == "recv" and self.spoil is not None:
                self.spoil(tensor)
            return said

        return counted


@pytest.fixture
def peers(world: Communicator) -> Iterator[Any]:
    """A new group of every rank (its plans wrapped by the tests, not the world's)."""
    made: Any = distcomm.new_group(range(world.world_size))
    yield made
    made.finalize()


def tags(group: Any) -> tuple[int, ...]:
    """Three tags: 0, a small one, the largest this MPI takes from users (MPI_TAG_UB and the
    one below it are distcomm's own)."""
    return (0, 5, min(2**30, group.engine._tag_ub - 1) - 1)


def ring(
    group: Any, lib: str, dtype: str, tag: int, step: int, any_source: bool, place: Place = as_is
) -> list[str]:
    """Every rank sends to the next rank and receives from the one before (even ranks send
    first, odd ones receive first: no rank waits on itself), from that rank or from any rank,
    the arrays placed by ``place``; what went wrong (the data, the sender returned, the
    elements between a strided view's, the "blocked in" mark left set)."""
    n, r = group.world_size, group.rank
    nxt, prev = (r + 1) % n, (r - 1) % n
    _, x = place(lib, values(dtype, r, step))
    held, out = place(lib, np.zeros(K, dtype))
    got: list[Any] = []

    def send() -> None:
        group.send(x, nxt, tag)

    def recv() -> None:
        got.append(group.recv(out, None if any_source else prev, tag))

    for call in (send, recv) if r % 2 == 0 else (recv, send):
        call()
    wrong = []
    if not np.array_equal(np.asarray(out), values(dtype, prev, step)):
        wrong.append(f"data {np.asarray(out).tolist()}")
    if got != [prev]:
        wrong.append(f"returned {got}, the sender is {prev}")
    if not _untouched(held, out):
        wrong.append("a strided view's holder changed")
    if (group.blocked_seq, group.blocked_op) != (0, ""):
        wrong.append(f"blocked in {group.blocked_op!r} ({group.blocked_seq})")
    return wrong


def rings(group: Any, libs: tuple[str, ...] = LIBS, dtypes: tuple[str, ...] = DTYPES) -> list[Any]:
    """:func:`ring` for every library, dtype, tag and way of receiving; the ones that went
    wrong, (lib, dtype, tag, from any rank, step, what)."""
    wrong = []
    step = 0
    for lib in libs:
        for dtype in dtypes:
            for tag in tags(group):
                for any_source in (False, True):
                    step += 1
                    for what in ring(group, lib, dtype, tag, step, any_source):
                        wrong.append((lib, dtype, tag, any_source, step, what))
    return wrong


@pytest.mark.mpi(min_size=2)
def test_messages_in_a_ring_take_the_plans_and_are_right(peers: Any) -> None:
    """Blocking send and recv of numpy arrays and torch tensors, five dtypes, three tags, from
    the rank before and from any rank: the engine plans each kind of message (class, dtype,
    size, peer, tag) once, on its first message, and every message takes its plan (no check
    points for messages), with the right data and sender, and the mark cleared after each."""
    counted = CountedMessages(peers)
    wrong = rings(peers)
    messages = len(LIBS) * len(DTYPES) * 3 * 2
    assert not wrong, f"rank {peers.rank}: {wrong}"
    kinds = {"send": messages // 2, "recv": messages}  # a send's kind for both ways of receiving
    assert counted.planned == kinds, f"rank {peers.rank}: planned {counted.planned}"
    want = dict.fromkeys(MESSAGES, messages)
    assert counted.calls == want, f"rank {peers.rank}: reached {counted.calls}, want {want}"
    assert counted.taken == want, f"rank {peers.rank}: taken {counted.taken}, want {want}"


@pytest.mark.mpi(min_size=2)
def test_the_message_check_catches_a_recv_plan_that_writes_wrong_data(peers: Any) -> None:
    """A recv plan that corrupts one element of what it received is caught at exactly the
    messages that took it (every one), and nowhere once it is gone."""
    counted = CountedMessages(peers)

    def spoil(target: Any) -> None:
        target[0] += 1

    counted.spoil = spoil
    wrong = rings(peers, dtypes=("float32", "int64"))
    spoiled = {(lib, dtype, tag, any_source) for lib, dtype, tag, any_source, *_ in wrong}
    want = {
        (lib, dtype, tag, any_source)
        for lib in LIBS
        for dtype in ("float32", "int64")
        for tag in tags(peers)
        for any_source in (False, True)
    }
    assert spoiled == want, f"rank {peers.rank}: caught {sorted(spoiled)}"
    assert all(what.startswith("data ") for *_, what in wrong), wrong
    counted.spoil = None
    assert not rings(peers, dtypes=("float32",)), "wrong without the spoiling"


@pytest.mark.mpi(min_size=2)
def test_declined_messages_go_through_the_pipeline_and_the_count_says_so(peers: Any) -> None:
    """Plans that raise NotPlanned for every message (having sent nothing) are reached by each;
    the pipeline moves them, right, and the count of those taken, 0, tells them from the plans'
    (the count check above fails for them)."""
    counted = CountedMessages(peers)
    counted.refuse = True
    wrong = rings(peers, dtypes=("float32", "int8"))
    messages = len(LIBS) * 2 * 3 * 2
    assert not wrong, f"rank {peers.rank}: {wrong}"
    assert counted.calls == dict.fromkeys(MESSAGES, messages), f"reached {counted.calls}"
    assert counted.taken == dict.fromkeys(MESSAGES, 0), f"taken {counted.taken}"


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("lib", LIBS)
def test_strided_messages_go_through_the_pipeline_and_are_right(peers: Any, lib: str) -> None:
    """A strided view sent, and received into (the elements between kept): each plan is
    reached and raises NotPlanned (mpi4py refuses the buffer), having sent nothing; the
    pipeline moves the right data."""
    counted = CountedMessages(peers)
    wrong = [
        (tag, any_source, what)
        for step, tag in enumerate(tags(peers))
        for any_source in (False, True)
        for what in ring(peers, lib, "float32", tag, step, any_source, spread)
    ]
    assert not wrong, f"rank {peers.rank}: strided messages {wrong}"
    assert counted.calls == dict.fromkeys(MESSAGES, 6), f"reached {counted.calls}"
    assert counted.taken == dict.fromkeys(MESSAGES, 0), f"taken {counted.taken}"


def _bad_messages(group: Any, lib: str) -> dict[str, Callable[[], Any]]:
    """Messages the pipeline refuses (``True`` is rank 1's equal; MPI_TAG_UB - 1 and MPI_TAG_UB
    are the backend's own), their data unlike any good message's."""
    n, peer = group.world_size, (group.rank + 1) % group.world_size
    x = make(lib, np.full(K, -7, np.float32))
    big = group.engine._tag_ub - 1
    return {
        "send: dst=world_size": lambda: group.send(x, n),
        "send: dst=-1": lambda: group.send(x, -1),
        "send: dst=True": lambda: group.send(x, True),
        "send: tag=-1": lambda: group.send(x, peer, -1),
        "send: tag=True": lambda: group.send(x, peer, True),
        "send: tag=2**30": lambda: group.send(x, peer, 2**30),
        "send: tag=MPI_TAG_UB-1": lambda: group.send(x, peer, big),
        "recv: src=world_size": lambda: group.recv(x, n),
        "recv: src=True": lambda: group.recv(x, True),
        "recv: tag=-1": lambda: group.recv(x, None, -1),
        "recv: tag=2**30": lambda: group.recv(x, peer, 2**30),
        "recv: tag=MPI_TAG_UB-1": lambda: group.recv(x, None, big),
    }


@pytest.mark.parametrize("lib", LIBS)
def test_bad_messages_are_refused_alike_on_every_rank_and_send_nothing(
    peers: Any, lib: str
) -> None:
    """Bad ranks and tags raise the pipeline's InvalidArgumentError on every rank and take no
    plan (the engine gives none for a tag this MPI lacks); a ring after them, on tag 0,
    receives the good messages (a bad one sent would be received instead)."""
    counted = CountedMessages(peers)
    n = peers.world_size
    if n > 1:
        rings(peers, libs=(lib,), dtypes=("float32",))  # the plans in use
    outcomes = {}
    for what, call in _bad_messages(peers, lib).items():
        taken = dict(counted.taken)
        try:
            call()
            outcomes[what] = "no error"
        except InvalidArgumentError:
            outcomes[what] = "InvalidArgumentError"
        except Exception as exc:
            outcomes[what] = f"{type(exc).__name__}: {exc}"
        if counted.taken != taken:
            outcomes[what] += ", plan taken"
        if (peers.blocked_seq, peers.blocked_op) != (0, ""):
            outcomes[what] += f", blocked in {peers.blocked_op!r}"
    wrong = (
        [w for step in (90, 91) for w in ring(peers, lib, "int64", 0, step, False)] if n > 1 else []
    )
    everyone = peers.all_gather_object(outcomes)
    bad = {k: v for k, v in outcomes.items() if v != "InvalidArgumentError"}
    assert not bad, f"rank {peers.rank}: {bad}"
    assert all(o == outcomes for o in everyone), f"the ranks differ: {everyone}"
    assert not wrong, f"rank {peers.rank}: after the bad messages, {wrong}"


@pytest.mark.mpi(min_size=2)
def test_messages_on_a_group_of_split_use_its_ranks(world: Communicator) -> None:
    """A group of split in reverse order (by parity on 4 ranks: two groups of 2), whose ranks
    are not the world's: rings take the plans, with the group's ranks as peers and as the
    sender returned."""
    n, r = world.world_size, world.rank
    group: Any = world.split(r % 2 if n >= 4 else 0, key=-r)
    try:
        counted = CountedMessages(group)
        wrong = rings(group, dtypes=("float32", "int8"))
        ranks = (group.rank, group.world_size, list(group.global_ranks))
    finally:
        group.finalize()
    messages = len(LIBS) * 2 * 3 * 2
    assert not wrong, f"rank {r} ({ranks}): {wrong}"
    assert counted.taken == dict.fromkeys(MESSAGES, messages), counted.taken
    assert ranks[2] == sorted(ranks[2], reverse=True), ranks


@pytest.mark.parametrize("op", ["gather", "scatter"])
def test_the_roots_list_of_views_is_found_once_and_found_again_when_it_changes(
    group: Any, op: str
) -> None:
    """The root's plan remembers where a list of numpy views lies (one buffer, no copy): the
    same list again moves the right data through what it remembered; a list with another view
    in one place, a list of arrays of their own, then the views again, each move the right data
    (the memory found anew each time)."""
    _past_the_first_checks(group, "off")
    size, rank, root = group.world_size, group.rank, 0
    big, other = np.zeros(size * K, np.float32), np.zeros(size * K, np.float32)
    views = [big[r * K : (r + 1) * K] for r in range(size)]
    changed = [*views[:-1], other[(size - 1) * K :]]
    own = [np.zeros(K, np.float32) for _ in range(size)]
    wrong = []
    for step, parts in enumerate([views, views, changed, own, views, views]):
        x = np.full(K, 10.0 * rank + step, np.float32)
        if op == "gather":
            group.gather(x, parts if rank == root else None, root)
            got = [p.tolist() for p in parts] if rank == root else None
            want = [[10.0 * r + step] * K for r in range(size)] if rank == root else None
        else:
            for r, p in enumerate(parts if rank == root else []):
                p[...] = 100.0 * r + step
            group.scatter(x, parts if rank == root else None, root)
            got, want = x.tolist(), [100.0 * rank + step] * K
        if got != want:
            wrong.append((step, got, want))
    assert not wrong, f"rank {rank}: {op} moved wrong data (step, got, want): {wrong}"
    plan = group._plans.kinds.get((op, np.ndarray, np.dtype("float32"), 4 * K, root))
    if rank == root and plans_taken(group):
        root_plan = getattr(plan[0], "__self__", None) if plan is not None else None
        assert isinstance(root_plan, mpi_plans._Root), plan
        assert root_plan.memo is not None, "the root's plan remembered no list of views"


@pytest.mark.parametrize("declining", [False, True], ids=["taking", "declining"])
@pytest.mark.parametrize("policy", ["sample", "off"])
@pytest.mark.parametrize("lib", LIBS)
def test_uneven_all_to_alls_whose_routing_changes_take_the_plan_and_are_right(
    group: Any, lib: str, policy: str, declining: bool
) -> None:
    """An uneven all-to-all of numpy arrays whose routing changes on every call (rows of 3
    elements, each rank sending each rank a number of rows that depends on both and on the
    step) runs mpi's plan of the kind (``all_to_all_v``, asked once) on every call past the
    first, with the right rows; torch tensors have no such plan (their buffer is made per byte
    size) and go through the engine's ``all_to_all_v``, right too. Where rank 0's plan declines
    every other call (NotPlanned), rank 0 makes those through the pipeline, right, and its split
    tables are kept once a call: the barrier that settles them finds no mismatch (kept twice on
    one rank, they would not cancel)."""
    size, rank, row = group.world_size, group.rank, 3
    group.debug = policy
    ran = {"asked": 0, "calls": 0, "taken": 0}

    def wrap(kind: CallKind, run: Run) -> Run:
        if kind.op != "all_to_all_v":
            return run
        ran["asked"] += 1

        def counted(x: Any, y: Any) -> Any:
            ran["calls"] += 1
            if declining and rank == 0 and ran["calls"] % 2:
                raise NotPlanned
            result = run(x, y)
            ran["taken"] += 1
            return result

        return counted

    wrap_plans(group, wrap)

    def rows(src: int, dst: int, step: int) -> int:
        return (src + 2 * dst + step) % 4

    wrong, steps = [], 12
    for step in range(steps):
        sent = [rows(rank, dst, step) for dst in range(size)]
        expected = [rows(src, rank, step) for src in range(size)]
        x = np.array(
            [[100 * rank + 10 * dst + i] * row for dst in range(size) for i in range(sent[dst])],
            np.float32,
        ).reshape(-1, row)
        out = np.full((sum(expected), row), -1.0, np.float32)
        group.all_to_all_single(make(lib, out), make(lib, x), expected, sent)
        want = [
            [100 * src + 10 * rank + i] * row for src in range(size) for i in range(expected[src])
        ]
        if out.tolist() != want:
            wrong.append((step, out.tolist(), want))
    assert not wrong, f"rank {rank}: wrong rows (step, got, wanted): {wrong}"
    group.barrier()  # settles the split tables kept since the last check point
    planned = plans_taken(group) and lib == "numpy"
    assert ran["asked"] == int(planned), f"rank {rank}: plans given {ran}"
    # every call but the first, and but the second where a history is kept (the first
    # repeat: a step the ranks confirm once)
    reached = steps - 1 - (group._mismatch_check is not None) if planned else 0
    taken = reached // 2 if declining and rank == 0 else reached
    want = {"asked": int(planned), "calls": reached, "taken": taken}
    assert ran == want, f"rank {rank}: plans {ran}, want {want}"
