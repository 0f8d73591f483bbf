"""The operation table (distcomm._operations) is the one list of operations: what other modules
list is derived from it, and what cannot be (the package's static names, the protocol) is kept
in step with it here."""

from __future__ import annotations

import distcomm
from distcomm import _operations
from distcomm._bench.operations import OPERATIONS as BENCHED
from distcomm._measures import busbw_factor
from distcomm._runtime import collectives, grouping, lists, messages
from distcomm.backend import BaseCommunicator, Capabilities
from distcomm.backend._pipeline.observing import OBSERVED
from distcomm.backend.specs import ALL_OPS
from distcomm.protocol import Communicator


def test_every_operation_is_a_method_of_the_protocol_and_of_the_kit() -> None:
    for op in _operations.OPERATIONS:
        assert callable(getattr(Communicator, op.name, None)), f"Communicator lacks {op.name}"
        assert callable(getattr(BaseCommunicator, op.name, None)), f"kit lacks {op.name}"


def test_every_module_function_is_distcomms_and_nothing_else_is() -> None:
    functions = set(_operations.named(module_function=True))
    homes = (collectives, messages, grouping, lists)
    assert set().union(*(home.__all__ for home in homes)) == functions
    assert sum(len(home.__all__) for home in homes) == len(functions), "a name in two homes"
    assert functions <= set(distcomm.__all__), functions - set(distcomm.__all__)
    for name in functions:
        home = next(home for home in homes if name in home.__all__)
        assert distcomm._EXPORTS[name] == home.__name__, name
        assert getattr(distcomm, name) is getattr(home, name)
    assert "split" not in distcomm.__all__, "split is a method only"


def test_the_derived_lists_follow_the_table() -> None:
    table = _operations.OPERATIONS
    assert {op.capability for op in table if op.capability} == ALL_OPS == Capabilities().ops
    assert set(OBSERVED) == {op.name for op in table if op.observed}
    assert {op.bench for op in table if op.bench} == set(BENCHED)
    for op in table:
        expected = 2 * 3 / 4 if op.name == "all_reduce" else (3 / 4 if op.shared else 1.0)
        assert busbw_factor(op.name, 4) == expected, op.name
        if op.bench:
            assert busbw_factor(op.bench, 4) == expected, op.bench
            assert BENCHED[op.bench].capability == op.capability
            assert BENCHED[op.bench].split == op.shared
