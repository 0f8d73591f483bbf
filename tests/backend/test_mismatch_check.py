"""Tests of distcomm.backend._pipeline.mismatch_check: the mismatch check, on fakelink thread-ranks.

The conformance topic ``mismatches`` runs the same kinds of mismatch on every backend (gloo and
mpi included); here are the policy, the sampling by ``seq``, the cost in engine calls, the table
and what a user sees.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import distcomm
from distcomm.backend._pipeline import mismatch_check
from distcomm.errors import CollectiveMismatchError, InvalidArgumentError
from distcomm.testing import run_threads


def sizes_at(seq: int, policy: str | None) -> list[str]:
    """4 ranks run ``seq - 1`` matching all_reduces, then rank 0 reduces 6 elements and the
    others 4 at collective ``seq``; what each rank saw."""

    def body() -> str:
        comm: Any = distcomm.get_communicator()
        if policy is not None:
            comm.debug = policy
        one = np.ones(1)
        for _ in range(seq - 1):
            distcomm.all_reduce(one, op="max")  # stays 1
        x = np.ones(6 if comm.rank == 0 else 4, dtype=np.float32)
        try:
            distcomm.all_reduce(x)
        except CollectiveMismatchError as exc:
            assert exc.seq == seq and exc.op == "all_reduce"
            return "mismatch"
        except Exception as exc:  # the engine's own failure, after the op was issued
            return f"engine: {type(exc).__name__}"
        return "returned"

    return run_threads(body, 4, timeout=60)


def test_a_size_mismatch_raises_on_every_rank_with_the_table() -> None:
    def body() -> tuple[str, list[dict[str, Any]], float]:
        rank = distcomm.get_rank()
        x = np.ones(6 if rank == 0 else 4, dtype=np.float32)
        with pytest.raises(CollectiveMismatchError) as info:
            distcomm.all_reduce(x)
        after = np.ones(2)
        distcomm.all_reduce(after)  # the communicator is still usable
        return str(info.value), info.value.table, float(after[0])

    results = run_threads(body, 4)
    message, table, after = results[1]
    assert [row["numel"] for row in table] == [6, 4, 4, 4]
    assert table[0]["shape"] == (6,) and table[0]["dtype"] == "float32"
    assert all(row["site"].startswith(__file__ + ":") for row in table)
    assert "rank 0: all_reduce, shape (6,), float32, 6 elements, op SUM" in message
    assert "was not run" in message and "HINT:" in message
    assert after == 4.0
    assert all(r[0] == message for r in results)


def test_shapes_are_shown_but_not_compared() -> None:
    def body() -> list[float]:
        rank = distcomm.get_rank()
        x = np.ones((2, 3) if rank == 0 else (6,), dtype=np.float32)
        distcomm.get_communicator().debug = "check"  # type: ignore[attr-defined]
        distcomm.all_reduce(x)
        return [float(v) for v in x.reshape(-1)]

    assert run_threads(body, 2) == [[2.0] * 6, [2.0] * 6]


def test_by_default_every_mismatch_is_caught_before_it_runs() -> None:
    # a check point (the first 64, then every 1024th): one collective agreement
    assert set(sizes_at(64, None)) == {"mismatch"}
    assert set(sizes_at(64 + 1024, None)) == {"mismatch"}
    # between them, a call the ranks never agreed on is confirmed by a vote before it is issued
    assert set(sizes_at(65, None)) == {"mismatch"}
    assert set(sizes_at(64 + 1023, None)) == {"mismatch"}
    sample = mismatch_check.limits("sample")
    assert mismatch_check.next_checked(64 + 2 * 1024, *sample) == 64 + 2 * 1024
    assert mismatch_check.next_checked(64 + 1023, *sample) == 64 + 1024


def test_check_catches_every_call_and_off_none() -> None:
    assert set(sizes_at(70, "check")) == {"mismatch"}
    assert "mismatch" not in sizes_at(1, "off")


def test_a_checked_call_costs_one_16_byte_engine_call() -> None:
    def body() -> list[int]:
        comm: Any = distcomm.get_communicator()
        sizes: list[int] = []
        engine = comm._all_reduce

        def counting(tensor: Any, op: Any, async_op: bool) -> Any:
            sizes.append(int(tensor.nbytes))
            return engine(tensor, op, async_op)

        comm._all_reduce = counting
        x = np.ones(1000, dtype=np.float32)
        comm.debug = "check"
        distcomm.all_reduce(x)
        comm.debug = "off"
        distcomm.all_reduce(x)
        return sizes

    assert run_threads(body, 2) == [[16, 4000, 4000]] * 2


def test_groups_inherit_the_policy() -> None:
    def body() -> tuple[str, str]:
        comm: Any = distcomm.get_communicator()
        comm.debug = "off"
        group: Any = distcomm.new_group([0, 1])
        part: Any = comm.split(0)
        return group.debug, part.debug

    assert run_threads(body, 2) == [("off", "off")] * 2


def test_policy_values(monkeypatch: pytest.MonkeyPatch) -> None:
    assert mismatch_check.policy(environ={}) == "sample"
    assert mismatch_check.policy(environ={"DISTCOMM_DEBUG": " CHECK "}) == "check"
    assert mismatch_check.policy("off") == "off"
    with pytest.raises(InvalidArgumentError, match=r"DISTCOMM_DEBUG='loud'.*valid: sample"):
        mismatch_check.policy(environ={"DISTCOMM_DEBUG": "loud"})
    monkeypatch.setenv("DISTCOMM_DEBUG", "loud")
    with pytest.raises(InvalidArgumentError, match="HINT"):
        distcomm.init()
    monkeypatch.setenv("DISTCOMM_DEBUG", "off")
    assert distcomm.init().debug == "off"  # type: ignore[attr-defined]
    distcomm.finalize()
    assert distcomm.init(debug="check").debug == "check"  # type: ignore[attr-defined]


def test_a_rank_that_skips_the_collective_times_out_naming_it() -> None:
    def body() -> Any:
        comm: Any = distcomm.get_communicator()
        comm.debug, comm.timeout = "check", 1.0
        if comm.rank == 1:
            return None  # skips the barrier
        with pytest.raises(distcomm.DistTimeoutError) as info:
            distcomm.barrier()  # waits in the check
        return info.value.op, info.value.missing_ranks

    assert run_threads(body, 2)[0] == ("barrier", (1,))


def test_a_mismatch_of_calls_agreed_before_is_named_where_it_is_made() -> None:
    """Both calls were agreed on earlier, but never the step from the sums to the max: rank 1
    confirms its call with the others, who are in the engine (their step was agreed); every
    rank names operation #100 at once, none goes on past it, and the communicator is
    retired."""

    def body() -> tuple[int | None, tuple[int, int] | None, str]:
        comm: Any = distcomm.get_communicator()
        distcomm.all_reduce(np.ones(4), op="max")
        for _ in range(98):
            distcomm.all_reduce(np.ones(4))
        with pytest.raises(CollectiveMismatchError) as info:
            distcomm.all_reduce(np.ones(4), op="max" if comm.rank == 1 else "sum")  # #100
        with pytest.raises(distcomm.DistcommError, match=r"can no longer be used|mismatch"):
            distcomm.all_reduce(np.ones(1))  # the communicator is retired
        return info.value.seq, info.value.ran, str(info.value)

    results = run_threads(body, 4)
    assert {(seq, ran) for seq, ran, _ in results} == {(100, (100, 100))}
    for _, _, message in results:
        assert "rank 1: all_reduce, shape (4,), float64, 4 elements, op MAX" in message, message
        assert "all_reduce, shape (4,), float64, 4 elements, op SUM" in message, message


def test_finalize_releases_the_communicator_after_a_mismatch() -> None:
    def body() -> tuple[int | None, str]:
        comm: Any = distcomm.get_communicator()
        distcomm.all_reduce(np.ones(2), op="min")
        distcomm.all_reduce(np.ones(2))
        with pytest.raises(CollectiveMismatchError) as info:
            for _ in range(200):
                distcomm.all_reduce(np.ones(2), op="min" if comm.rank == 2 and _ == 120 else "sum")
        comm.finalize()
        return info.value.seq, comm.unusable

    assert run_threads(body, 3) == [(123, "finalized")] * 3


def test_finalize_while_an_exception_is_handled_does_not_wait_for_the_others() -> None:
    def body() -> str:
        comm: Any = distcomm.get_communicator()
        comm.timeout = 30.0
        distcomm.all_reduce(np.ones(2))
        if comm.rank == 0:
            try:
                raise ValueError("rank 0 gives up")
            except ValueError:
                comm.finalize()  # the others never call finalize: no vote now
        return str(comm.unusable)

    assert run_threads(body, 2, timeout=20) == ["finalized", "None"]


def test_a_rank_in_the_engine_and_a_rank_that_votes_both_name_the_mismatch() -> None:
    """Rank 1's call is new (it votes before issuing it); the others' was agreed before (they
    are in the engine): every rank raises CollectiveMismatchError naming #100."""

    def body() -> tuple[str, int | None]:
        comm: Any = distcomm.get_communicator()
        comm.timeout = 5.0
        for _ in range(99):
            distcomm.all_reduce(np.ones(4))
        try:
            distcomm.all_reduce(np.ones(6 if comm.rank == 1 else 4))
        except CollectiveMismatchError as exc:
            return type(exc).__name__, exc.seq
        return "returned", None

    assert run_threads(body, 4, timeout=30) == [("CollectiveMismatchError", 100)] * 4


def test_changing_the_policy_keeps_one_check_and_its_history() -> None:
    """The check is one object per communicator: "sample" to "check" mid-job keeps it and its
    history (its running value unchanged, the next call checked); "off" drops it, and a check
    made again later starts at the communicator's ``seq`` and still catches a mismatch."""

    def body() -> tuple[bool, bool, bool, bool, str]:
        comm: Any = distcomm.get_communicator()
        x = np.ones(2, np.float32)
        for _ in range(mismatch_check.SAMPLED_FIRST + 6):  # past the sampled first calls
            distcomm.all_reduce(x)
        check = comm._mismatch_check
        value = check.value(comm.seq)
        comm.debug = "check"
        kept = comm._mismatch_check is check and check.value(comm.seq) == value
        checks_next = check.next_point(comm.seq + 1) == comm.seq + 1
        distcomm.all_reduce(x)
        comm.debug = "off"
        dropped = comm._mismatch_check is None
        for _ in range(3):
            distcomm.all_reduce(x)
        comm.debug = "check"
        fresh = comm._mismatch_check
        restarted = fresh is not check and fresh.agreed_seq == comm.seq
        y = np.ones(6 if comm.rank == 0 else 4, np.float32)
        try:
            distcomm.all_reduce(y)
        except CollectiveMismatchError as exc:
            return kept, checks_next, dropped, restarted, f"mismatch at #{exc.seq}"
        return kept, checks_next, dropped, restarted, "returned"

    results = run_threads(body, 2, timeout=60)
    for rank, (kept, checks_next, dropped, restarted, outcome) in enumerate(results):
        assert kept, f"rank {rank}: the check or its history changed with the policy"
        assert checks_next, f"rank {rank}: debug='check' did not make the next call a check point"
        assert dropped, f"rank {rank}: debug='off' kept a check"
        assert restarted, f"rank {rank}: the check made again did not start at the current seq"
        assert outcome == f"mismatch at #{mismatch_check.SAMPLED_FIRST + 11}", (
            f"rank {rank}: {outcome}"
        )
