"""The kit's shortcuts of blocking collectives (:mod:`distcomm.backend._pipeline.shortcuts`) on
fakelink thread-ranks.

FakeLink has no plain primitives: each test gives its communicators some (instance attributes,
which the kit reads) that call the blocking primitives and log the ``seq`` each ran as. Proven
here: a shortcut is taken only past the check points; the kinds of call are remembered per
(op, class, dtype, byte size, root), so interleaved ops are taken; a new kind goes through the
pipeline first; a policy change and a collective mismatch forget them; the history's running
value is what it would be with no shortcuts; a primitive returning False leaves ``seq`` alone
and the pipeline answers. gather and scatter are kinds alike; a list the pipeline would refuse
(its length, an entry's dtype, class or size, a list off the root, none on it) never reaches
their shortcuts.

The shortcuts of blocking messages alike (``_send_plain``, ``_recv_plain``, here built on the
communicator's own ``_isend`` / ``_irecv`` waited for): taken for every good message, under a
"blocked in" mark of its own that is cleared after; never reached by bad ranks and tags (the
pipeline's error, nothing sent); a False or None answer leaves the message to the pipeline; the
ring's check shown to catch a wrong shortcut; a shortcut's errors become distcomm's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import distcomm
from distcomm.backend._pipeline.agreement import SAMPLE_EVERY, SAMPLED_FIRST
from distcomm.backend.arrays import adapter_for
from distcomm.errors import (
    CollectiveMismatchError,
    DistTimeoutError,
    EngineError,
    InvalidArgumentError,
)
from distcomm.protocol import ReduceOp
from distcomm.testing import run_threads

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


class Plain:
    """Plain primitives on ``comm`` (instance attributes) that run the blocking primitives; the
    (op, seq) each took is in ``taken``. ``refuse``: return False, sending nothing (logged in
    ``refused`` with the seq the kit gave the call)."""

    def __init__(self, comm: Any, refuse: bool = False) -> None:
        self.comm, self.refuse = comm, refuse
        self.taken: list[tuple[str, int]] = []
        self.refused: list[tuple[str, int]] = []
        c = comm
        c._broadcast_plain = self._wrap("broadcast", lambda t, s: c._broadcast(t, s, False))
        c._reduce_plain = self._wrap("reduce", lambda t, d: c._reduce(t, d, SUM, False))
        c._all_gather_into_plain = self._wrap(
            "all_gather_into_tensor", lambda o, t: c._all_gather_into(o, t, False)
        )
        c._reduce_scatter_plain = self._wrap(
            "reduce_scatter_tensor", lambda o, i: c._reduce_scatter(o, i, SUM, False)
        )
        c._all_to_all_plain = self._wrap(
            "all_to_all_single", lambda o, i: c._all_to_all(o, i, False)
        )
        c._all_reduce_plain = self._wrap("all_reduce", lambda t: c._all_reduce(t, SUM, False))
        c._gather_plain = self._wrap("gather", lambda t, parts, d: plain_gather(c, t, parts, d))
        c._scatter_plain = self._wrap("scatter", lambda t, parts, s: plain_scatter(c, t, parts, s))

    def _wrap(self, op: str, call: Callable[..., Any]) -> Callable[..., bool]:
        def plain(*args: Any) -> bool:
            if self.refuse:
                self.refused.append((op, self.comm.seq))
                return False
            call(*args)
            self.taken.append((op, self.comm.seq))
            return True

        return plain


def plain_gather(comm: Any, tensor: Any, parts: Any, dst: int) -> None:
    """gather through the blocking ``_gather``, copied out into ``parts`` on ``dst``."""
    adapter = adapter_for(tensor)
    numel = adapter.numel(tensor)
    out = None if parts is None else adapter.empty(tensor, numel * comm.world_size)
    comm._gather(out, tensor, dst, False)
    for r, part in enumerate(parts or ()):
        adapter.copy_(part, adapter.flat(out)[r * numel : (r + 1) * numel])


def plain_scatter(comm: Any, tensor: Any, parts: Any, src: int) -> None:
    """scatter through the blocking ``_scatter``, ``parts`` copied in on ``src``."""
    adapter = adapter_for(tensor)
    numel = adapter.numel(tensor)
    full = None if parts is None else adapter.empty(tensor, numel * comm.world_size)
    for r, part in enumerate(parts or ()):
        adapter.copy_(adapter.flat(full)[r * numel : (r + 1) * numel], part)
    comm._scatter(tensor, full, src, False)


def fill(comm: Any) -> None:
    """One collective of a kind of its own (a broadcast of one byte from rank 0)."""
    comm.broadcast(np.zeros(1, np.uint8), 0)


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
def test_the_shortcut_is_taken_only_past_the_check_points(
    policy: str, first: int | None, calls: int
) -> None:
    """Broadcasts of one kind: under the default policy the shortcut is taken from call 65 on
    but not at the check point 1088; off, from the second call (the first marks the kind);
    under check, never. Every result is right."""

    def body() -> tuple[list[int], bool]:
        comm: Any = distcomm.get_communicator()
        comm.debug = policy
        plain = Plain(comm)
        kind = ("broadcast", "numpy", "float32", K, comm.world_size - 1)
        right = [call_kind(comm, kind, step) for step in range(calls)]
        return [seq for _, seq in plain.taken], all(right)

    want = [] if first is None else list(range(first, calls + 1))
    if policy == "sample":
        want.remove(NEXT_CHECK)
    for taken, right in run_threads(body, 3):
        assert right, "a wrong broadcast"
        assert taken == want, f"taken at {taken[:3]}..{taken[-3:]} ({len(taken)}), want {len(want)}"


def test_kinds_are_remembered_so_that_interleaved_calls_take_the_shortcut() -> None:
    """Past the check points, rounds of the calls of :data:`KINDS` in turn: the first round
    goes through the pipeline (each kind new), every later call takes the shortcut; the kinds
    are remembered under their (op, class, dtype, byte size, root)."""

    def body() -> tuple[list[list[str]], list[Any], bool]:
        comm: Any = distcomm.get_communicator()
        past_the_first_checks(comm)
        plain = Plain(comm)
        rounds, right = [], True
        for step in range(4):
            before = len(plain.taken)
            for kind in KINDS:
                right &= call_kind(comm, kind, step)
            rounds.append([op for op, _ in plain.taken[before:]])
        return rounds, list(comm._kit_plain_fps), right

    ops = [kind[0] for kind in KINDS]
    libs = {"numpy": np.ndarray, "torch": torch.Tensor}
    keys = []
    for op, lib, dtype, numel, root in KINDS:
        dt = getattr(torch, dtype) if lib == "torch" else np.dtype(dtype)
        size = numel * 3 if op in ("reduce_scatter_tensor", "all_to_all_single") else numel
        keys.append((op, libs[lib], dt, size * np.dtype(dtype).itemsize, root))
    for rounds, remembered, right in run_threads(body, 3):
        assert right, "a wrong result"
        assert rounds == [[], ops, ops, ops], rounds
        assert set(keys) <= set(remembered), set(keys) - set(remembered)


def _path(comm: Any, plain: Plain, kind: tuple[Any, ...], step: int) -> str:
    """Make a call of ``kind``: "shortcut" or "pipeline", the way it went ("wrong": a wrong
    result)."""
    before = len(plain.taken)
    if not call_kind(comm, kind, step):
        return "wrong"
    return "shortcut" if len(plain.taken) > before else "pipeline"


def test_a_new_kind_goes_through_the_pipeline_first_then_takes_the_shortcut() -> None:
    """Past the check points, three calls of each broadcast of :data:`KINDS` (a new size,
    dtype, class or root) in a row, then of the first again: a new kind's first call goes
    through the pipeline (recorded, confirmed with the other ranks), the next take the
    shortcut; the first kind, remembered, takes it at once."""
    broadcasts = [kind for kind in KINDS if kind[0] == "broadcast"]

    def body() -> list[str]:
        comm: Any = distcomm.get_communicator()
        past_the_first_checks(comm)
        plain = Plain(comm)
        kinds = [*broadcasts, broadcasts[0]]
        return [_path(comm, plain, kind, step) for kind in kinds for step in range(3)]

    want = ["pipeline", "shortcut", "shortcut"] * len(broadcasts) + ["shortcut"] * 3
    assert run_threads(body, 3) == [want] * 3


@pytest.mark.parametrize("policy", ["sample", "off"])
def test_a_policy_change_forgets_the_kinds(policy: str) -> None:
    """Setting ``debug`` (even to the policy in force) forgets the remembered kinds and closes
    the run: a kind taken before goes through the pipeline once, then the shortcut again."""

    def body() -> tuple[Any, ...]:
        comm: Any = distcomm.get_communicator()
        past_the_first_checks(comm)
        plain = Plain(comm)
        path = [_path(comm, plain, KINDS[0], step) for step in range(3)]
        before = (len(comm._kit_plain_fps) > 0, comm._kit_plain_op)
        comm.debug = policy
        after = (dict(comm._kit_plain_fps), comm._kit_plain_op, comm._kit_plain_nbytes)
        path += [_path(comm, plain, KINDS[0], step) for step in range(3)]
        return before, after, path

    want = ["pipeline", "shortcut", "shortcut"] * 2
    assert run_threads(body, 3) == [((True, "broadcast"), ({}, None, -1), want)] * 3


def test_a_collective_mismatch_forgets_the_kinds() -> None:
    """Past the check points and the shortcuts taken, ranks making different new calls (a
    vote finds it before the engine) all raise CollectiveMismatchError; nothing ran, the
    communicator stays usable, and the kinds are forgotten: a known kind goes through the
    pipeline once, then the shortcut."""

    def body() -> tuple[Any, ...]:
        comm: Any = distcomm.get_communicator()
        past_the_first_checks(comm)
        plain = Plain(comm)
        path = [_path(comm, plain, KINDS[0], step) for step in range(3)]
        odd = ("broadcast", "numpy", "float64" if comm.rank == 0 else "int32", 3, 0)
        at = comm.seq + 1
        try:
            call_kind(comm, odd, 0)
            outcome: Any = "no error"
        except CollectiveMismatchError as exc:
            outcome = (exc.seq == at, exc.ran)
        after = (dict(comm._kit_plain_fps), comm._kit_plain_op, comm.unusable)
        path += [_path(comm, plain, KINDS[0], step) for step in range(3)]
        return outcome, after, path

    want = ["pipeline", "shortcut", "shortcut"] * 2
    assert run_threads(body, 3) == [((True, None), ({}, None, None), want)] * 3


def test_a_kind_whose_agreement_was_forgotten_is_confirmed_again_first() -> None:
    """A remembered kind whose fingerprint the history no longer counts as agreed (it keeps
    4096; here cleared) goes through the pipeline, which confirms it with the other ranks,
    before it takes the shortcut again; the run in progress keeps it."""

    def body() -> list[str]:
        comm: Any = distcomm.get_communicator()
        past_the_first_checks(comm)
        plain = Plain(comm)
        kinds = (KINDS[0], KINDS[6])  # a broadcast and a reduce in turn
        path = [_path(comm, plain, kind, step) for step in range(2) for kind in kinds]
        comm._kit_history.agreed.clear()
        path += [_path(comm, plain, kinds[1], 2)]  # the run in progress: the reduce's
        path += [_path(comm, plain, kind, step) for step in (3, 4) for kind in kinds]
        return path

    want = ["pipeline"] * 2 + ["shortcut"] * 3 + ["pipeline"] + ["shortcut"] * 3
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
    """Past the check points, right after a good call of its op (the shortcut open), a call with
    an output unlike the input (size, dtype of the same byte size, class), a root of True (a
    rank's equal) or a bad list (:func:`_bad_rooted_calls`) takes no shortcut: the pipeline
    raises InvalidArgumentError, counting nothing."""

    def body() -> dict[str, str]:
        comm: Any = distcomm.get_communicator()
        past_the_first_checks(comm)
        plain = Plain(comm)
        outcomes = {}
        for what, (kind, call) in _bad_calls(comm).items():
            for step in range(2):
                call_kind(comm, kind, step)
            seq, taken = comm.seq, len(plain.taken)
            try:
                call()
                outcomes[what] = "no error"
            except InvalidArgumentError:
                outcomes[what] = "refused" if comm.seq == seq else "refused, seq moved"
            if len(plain.taken) != taken:
                outcomes[what] += ", shortcut taken"
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
    """What the mismatch check knows of ``comm``'s calls: its running value and the runs."""
    h = comm._kit_history
    return comm.seq, h.value(comm.seq), h.run_fp, h.run_start, list(h.runs), h.agreed_seq


@pytest.mark.parametrize("refuse", [False, True], ids=["taken", "refused"])
def test_the_running_value_is_the_one_without_shortcuts(refuse: bool) -> None:
    """The same program with plain primitives (taken, or all returning False) and without any:
    the history's running value, runs and agreement are the same at the end."""

    def body(plain: bool) -> tuple[Any, ...]:
        comm: Any = distcomm.get_communicator()
        given = Plain(comm, refuse) if plain else None
        right = program(comm)
        reached = 0 if given is None else len(given.refused if refuse else given.taken)
        return right, reached, _state(comm)

    without = run_threads(body, 3, False)
    for (right, reached, state), (_, _, plain_state) in zip(
        run_threads(body, 3, True), without, strict=True
    ):
        assert right, "a wrong result"
        assert reached > 900, f"only {reached} calls reached the primitives"
        assert state == plain_state


def test_a_primitive_returning_false_leaves_seq_and_the_pipeline_answers() -> None:
    """Primitives that return False (nothing sent) are reached, past the check points, by every
    call of a known kind with that call's seq; the call is then counted once, by the pipeline,
    with the right result."""

    def body() -> tuple[bool, list[tuple[str, int]], int]:
        comm: Any = distcomm.get_communicator()
        past_the_first_checks(comm)
        plain = Plain(comm, refuse=True)
        right = all(call_kind(comm, kind, step) for step in range(3) for kind in KINDS)
        return right, plain.refused, comm.blocked_seq

    known = SAMPLED_FIRST + len(KINDS)  # the first round goes through the pipeline
    want = [(kind[0], known + 1 + i) for i, kind in enumerate(KINDS * 2)]
    assert run_threads(body, 3) == [(True, want, 0)] * 3


@pytest.mark.parametrize("who", ["rank 0", "every rank"])
def test_a_refused_bad_call_leaves_the_history_as_the_pipeline_would(who: str) -> None:
    """Past the check points, an all-gather of a known kind with an output of the wrong size,
    right after a call of another op, raises InvalidArgumentError (caught) and counts nothing:
    the running value is the one without shortcuts, and the check point at 1088 finds no
    mismatch, whether one rank or every rank made it."""

    def body(plain: bool) -> tuple[int, str]:
        comm: Any = distcomm.get_communicator()
        if plain:
            Plain(comm)
        past_the_first_checks(comm)
        gather = ("all_gather_into_tensor", "numpy", "float32", K, None)
        for step in range(3):
            call_kind(comm, gather, step)
            call_kind(comm, KINDS[0], step)
        if who == "every rank" or comm.rank == 0:
            out = np.zeros(K * comm.world_size - 1, np.float32)
            with pytest.raises(InvalidArgumentError):
                comm.all_gather_into_tensor(out, np.ones(K, np.float32))
        value = comm._kit_history.value(comm.seq)
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
        past_the_first_checks(comm)
        Plain(comm)
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


class PlainMessages:
    """``_send_plain`` and ``_recv_plain`` on ``comm`` (instance attributes) that start the
    communicator's ``_isend`` / ``_irecv`` and wait for it; each message taken is logged in
    ``taken`` as (way, peer, tag, the "blocked in" mark meanwhile). They decline (False, None)
    an array that is not contiguous, and every message when ``refuse`` is set (logged in
    ``refused``). ``spoil`` corrupts what a recv received; ``lie`` changes the sender it
    returns (to show that the ring's check catches both)."""

    def __init__(self, comm: Any, refuse: bool = False) -> None:
        self.comm, self.refuse = comm, refuse
        self.taken: list[tuple[str, Any, int, tuple[int, str]]] = []
        self.refused: list[tuple[str, Any, int]] = []
        self.spoil = self.lie = False
        comm._send_plain, comm._recv_plain = self.send, self.recv

    def _declines(self, way: str, tensor: Any, peer: Any, tag: int) -> bool:
        contiguous = (
            tensor.is_contiguous()
            if isinstance(tensor, torch.Tensor)
            else (tensor.flags.c_contiguous)
        )
        if self.refuse or not contiguous:
            self.refused.append((way, peer, tag))
            return True
        self.taken.append((way, peer, tag, (self.comm.blocked_seq, self.comm.blocked_op)))
        return False

    def send(self, tensor: Any, dst: int, tag: int) -> bool:
        if self._declines("send", tensor, dst, tag):
            return False
        self.comm._isend(tensor, dst, tag).wait()
        return True

    def recv(self, tensor: Any, src: int | None, tag: int) -> int | None:
        if self._declines("recv", tensor, src, tag):
            return None
        work = self.comm._irecv(tensor, src, tag)
        work.wait()
        if self.spoil:
            tensor[0] += 1
        return int(work.source) + self.lie


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


def test_good_messages_take_the_shortcuts_under_a_mark_of_their_own() -> None:
    """Rings of numpy and torch, three dtypes, three tags, from the rank before and from any
    rank: every message takes its shortcut (no check points for messages), right, the sender
    returned; meanwhile the mark names the message (a negative number), cleared after."""

    def body() -> tuple[list[Any], list[Any], list[Any]]:
        comm: Any = distcomm.get_communicator()
        plain = PlainMessages(comm)
        wrong = message_rings(comm)
        return wrong, plain.taken, plain.refused

    n = 3
    for r, (wrong, taken, refused) in enumerate(run_threads(body, n)):
        assert wrong == [] and refused == [], f"rank {r}: {wrong}, declined {refused}"
        want = []
        for _kind in MESSAGE_KINDS:
            for tag in TAGS:
                for src in ((r - 1) % n, None):
                    want += [("send", (r + 1) % n, tag), ("recv", src, tag)]
        assert [t[:3] for t in taken] == want, f"rank {r}: {taken[:4]}..."
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
def test_the_ring_check_catches_a_shortcut_that_is_wrong(fault: str) -> None:
    """A recv shortcut that corrupts what it received, or returns another sender, is caught at
    every message (each takes it); without the fault nothing is."""

    def body() -> tuple[list[Any], list[Any]]:
        comm: Any = distcomm.get_communicator()
        plain = PlainMessages(comm)
        setattr(plain, fault, True)
        wrong = message_rings(comm)
        setattr(plain, fault, False)
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
        "send: tag=-1": lambda: comm.send(x, peer, -1),
        "send: tag=True": lambda: comm.send(x, peer, True),
        "send: tag=2**30": lambda: comm.send(x, peer, 2**30),
        "recv: src=world_size": lambda: comm.recv(x, n),
        "recv: src=True": lambda: comm.recv(x, True),
        "recv: tag=-1": lambda: comm.recv(x, None, -1),
        "recv: tag=2**30": lambda: comm.recv(x, peer, 2**30),
    }


def test_bad_messages_never_reach_the_shortcuts_and_send_nothing() -> None:
    """Bad ranks and tags raise the pipeline's InvalidArgumentError and never reach a shortcut;
    the mark stays clear; a ring after them on tag 0 gets the good messages (a bad one sent
    would be received instead)."""

    def body() -> tuple[dict[str, str], list[Any]]:
        comm: Any = distcomm.get_communicator()
        plain = PlainMessages(comm)
        outcomes = {}
        for what, call in _bad_messages(comm).items():
            reached = len(plain.taken) + len(plain.refused)
            try:
                call()
                outcomes[what] = "no error"
            except InvalidArgumentError:
                outcomes[what] = "refused"
            if len(plain.taken) + len(plain.refused) != reached:
                outcomes[what] += ", shortcut reached"
            if (comm.blocked_seq, comm.blocked_op) != (0, ""):
                outcomes[what] += f", blocked in {comm.blocked_op!r}"
        return outcomes, message_ring(comm, ("numpy", "int64"), 0, 1, False)

    for r, (outcomes, wrong) in enumerate(run_threads(body, 3)):
        assert outcomes == dict.fromkeys(outcomes, "refused"), f"rank {r}: {outcomes}"
        assert wrong == [], f"rank {r}: after the bad messages, {wrong}"


def test_a_false_or_none_answer_leaves_the_message_to_the_pipeline() -> None:
    """Shortcuts that decline every message (False, None, having sent nothing) are reached by
    each with its peer and tag; the pipeline then moves it: right data and sender, mark
    cleared. A strided view is declined by the shortcut itself, alike."""

    def body() -> tuple[list[Any], list[Any], list[Any], list[str]]:
        comm: Any = distcomm.get_communicator()
        plain = PlainMessages(comm, refuse=True)
        wrong = message_rings(comm)
        plain.refuse = False
        refused, plain.refused = plain.refused, []
        n, r = comm.world_size, comm.rank
        holder = np.full(2 * K, 99, np.int64)
        comm.send(values("int64", r, 0, 2 * K)[::2], (r + 1) % n, 3)
        got = comm.recv(holder[::2], None, 3)
        want = np.stack([values("int64", (r - 1) % n, 0, 2 * K)[::2], np.full(K, 99)], 1)
        strided = [] if got == (r - 1) % n and np.array_equal(holder, want.ravel()) else [got]
        return wrong, refused, plain.refused, strided

    n = 3
    for r, (wrong, refused, declined, strided) in enumerate(run_threads(body, n)):
        assert wrong == [], f"rank {r}: {wrong}"
        want = []
        for _kind in MESSAGE_KINDS:
            for tag in TAGS:
                for src in ((r - 1) % n, None):
                    want += [("send", (r + 1) % n, tag), ("recv", src, tag)]
        assert refused == want, f"rank {r}: {refused[:4]}..."
        assert declined == [("send", (r + 1) % n, 3), ("recv", None, 3)], f"rank {r}: {declined}"
        assert strided == [], f"rank {r}: a strided message went wrong: {strided}"


def test_a_shortcuts_errors_become_distcomms_and_the_mark_is_cleared() -> None:
    """Rank 0 receives from rank 1, which never sends: the wait inside the shortcut ends in
    distcomm's DistTimeoutError (the fabric sees the stall; its Work names the message). On
    rank 1 an engine's exception (one of ``engine_errors``) raised by a send shortcut becomes
    EngineError naming the message. Both leave the mark clear and retire the communicator."""

    def body() -> tuple[str, str, tuple[int, str], str | None]:
        comm: Any = distcomm.get_communicator()
        PlainMessages(comm)
        try:
            if comm.rank == 0:
                comm.recv(np.zeros(K), 1, 9)
            else:
                comm.engine_errors = (OSError,)

                def broken(tensor: Any, dst: int, tag: int) -> bool:
                    raise OSError("link down")

                comm._send_plain = broken
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
