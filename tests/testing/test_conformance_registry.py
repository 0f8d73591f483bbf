"""Tests of the conformance registry: registering, selecting and reporting checks."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

import distcomm
from distcomm.errors import InvalidArgumentError, RankFailedError
from distcomm.testing import conformance, run_threads
from distcomm.testing.conformance import CHECKS, check, run_all, run_check


@pytest.fixture
def scratch_checks() -> Iterator[list[str]]:
    """Names of checks a test registers; they are removed afterwards."""
    names: list[str] = []
    try:
        yield names
    finally:
        for name in names:
            CHECKS.pop(name, None)


def test_every_topic_registers_checks_in_order() -> None:
    modules = [CHECKS[name].__module__.rsplit(".", 1)[-1] for name in CHECKS]
    topics = list(dict.fromkeys(modules))
    assert topics == list(conformance.TOPICS)
    assert len(CHECKS) >= 40


def test_checks_are_documented_and_take_no_arguments() -> None:
    for name, fn in CHECKS.items():
        assert fn.__doc__, f"check {name!r} has no docstring"
        assert fn.__code__.co_argcount == 0, f"check {name!r} takes arguments"


def test_the_suite_imports_neither_pytest_nor_torch() -> None:
    code = (
        "import sys, distcomm.testing.conformance as c; "
        "print(len(c.CHECKS), 'pytest' in sys.modules, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(len(CHECKS)), "False", "False"]


def test_check_registers_by_function_name_or_given_name(scratch_checks: list[str]) -> None:
    scratch_checks += ["zz_plain", "zz named"]

    @check
    def zz_plain() -> None:
        """Registered under its own name."""

    @check("zz named")
    def whatever() -> None:
        """Registered under the given name."""

    assert CHECKS["zz_plain"] is zz_plain
    assert CHECKS["zz named"] is whatever
    assert list(CHECKS)[-2:] == ["zz_plain", "zz named"]
    with pytest.raises(ValueError, match="registered twice"):
        check("zz_plain")(lambda: None)


def test_run_all_runs_the_selection_in_order_and_returns_the_names() -> None:
    names = ["getters", "barrier", "all_reduce_numbers"]
    assert run_threads(run_all, 2, names) == [names, names]


def test_unknown_names_are_refused_before_anything_runs(scratch_checks: list[str]) -> None:
    ran: list[int] = []
    scratch_checks.append("zz_records")
    check("zz_records")(lambda: ran.append(1))
    with pytest.raises(InvalidArgumentError, match="did you mean 'getters'"):
        run_check("getter")
    with pytest.raises(InvalidArgumentError, match="nope"):
        run_all(["zz_records", "nope"])
    assert ran == []


@pytest.mark.timeout(30)
def test_a_failure_names_the_check_and_the_rank(scratch_checks: list[str]) -> None:
    scratch_checks.append("zz_fails_on_rank_1")

    @check("zz_fails_on_rank_1")
    def fails() -> None:
        """Rank 1 disagrees."""
        if distcomm.get_rank() == 1:
            raise KeyError("disagreement")
        distcomm.barrier()

    with pytest.raises(RankFailedError) as info:
        run_threads(run_all, 3, ["getters", "zz_fails_on_rank_1", "barrier"], timeout=60)
    assert info.value.rank == 1
    assert "conformance check 'zz_fails_on_rank_1' failed on rank 1: KeyError" in str(info.value)
    assert "failed too" not in str(info.value)


def test_the_wrapped_error_is_chained(scratch_checks: list[str]) -> None:
    scratch_checks.append("zz_raises")
    original = ValueError("original")

    def raises() -> None:
        raise original

    check("zz_raises")(raises)
    with pytest.raises(
        AssertionError, match="conformance check 'zz_raises' failed on rank 0"
    ) as info:
        run_check("zz_raises")
    assert info.value.__cause__ is original
