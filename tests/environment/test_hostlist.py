"""Tests of distcomm.environment.hostlist: Slurm hostlists and task counts per node."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distcomm.environment import expand_hostlist, expand_tasks_per_node
from distcomm.errors import EnvironmentDetectionError


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("node1", ["node1"]),
        ("a,b,c", ["a", "b", "c"]),
        ("node[01-03]", ["node01", "node02", "node03"]),
        ("a[1-3,5]", ["a1", "a2", "a3", "a5"]),
        ("a,b[1-2],c", ["a", "b1", "b2", "c"]),
        ("linux[1,2]", ["linux1", "linux2"]),
        ("nodeA,nodeB[001,003],nodeC", ["nodeA", "nodeB001", "nodeB003", "nodeC"]),
        ("b-[01-02]x", ["b-01x", "b-02x"]),
        ("gpu-[1-2]-ib", ["gpu-1-ib", "gpu-2-ib"]),
        ("x[1-2]y[3-4]", ["x1y3", "x1y4", "x2y3", "x2y4"]),
        ("x[1-2][7,9]", ["x17", "x19", "x27", "x29"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("n[9-10]", ["n9", "n10"]),
        ("n[098-101]", ["n098", "n099", "n100", "n101"]),
        ("n[5]", ["n5"]),
        ("[1-2]", ["1", "2"]),
        ("n[3-3]", ["n3"]),
        (" a , b[ 1 - 2 ] ", ["a", "b1", "b2"]),
        ("a[1-2],a[1-2]", ["a1", "a2", "a1", "a2"]),
        ("rack1-n[1-2],rack2-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ],
)
def test_expand_hostlist(value: str, expected: list[str]) -> None:
    assert expand_hostlist(value) == expected


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("", "empty host name"),
        (" ", "empty host name"),
        (",", "empty host name"),
        ("a,,b", "empty host name"),
        ("a,", "empty host name"),
        ("node[1-", "never closed"),
        ("node]1", "unmatched ']'"),
        ("node[[1]]", "nested '['"),
        ("node[3-1]", "runs backwards"),
        ("node[a-b]", "not a number or a range"),
        ("node[]", "not a number or a range"),
        ("node[1,,2]", "not a number or a range"),
        ("node[1-2-3]", "not a number or a range"),
        ("node[-3]", "not a number or a range"),
        ("node[1-]", "not a number or a range"),
        ("node[\u0661-\u0662]", "not a number or a range"),
        ("node a", "whitespace"),
        ("n[1-1000001]", "more than 1,000,000 hosts"),
        ("n[1-1000]m[0-1000]", "more than 1,000,000 hosts"),
    ],
)
def test_expand_hostlist_rejects(value: str, problem: str) -> None:
    with pytest.raises(EnvironmentDetectionError) as info:
        expand_hostlist(value, "SLURM_STEP_NODELIST")
    message = str(info.value)
    assert f"SLURM_STEP_NODELIST={value!r}" in message
    assert problem in message
    assert "HINT:" in message
    assert info.value.variable == "SLURM_STEP_NODELIST"
    assert info.value.value == value


def test_expand_hostlist_names_the_default_variable() -> None:
    with pytest.raises(EnvironmentDetectionError, match=r"SLURM_NODELIST='n\[2-1\]'"):
        expand_hostlist("n[2-1]")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("4", [4]),
        ("2(x3),1", [2, 2, 2, 1]),
        ("1,2(x2),3", [1, 2, 2, 3]),
        (" 1(x2) , 3 ", [1, 1, 3]),
        ("16(x1)", [16]),
    ],
)
def test_expand_tasks_per_node(value: str, expected: list[int]) -> None:
    assert expand_tasks_per_node(value) == expected


@pytest.mark.parametrize(
    "value",
    ["", "2(x)", "x3", "2(3)", "2,,1", "0", "2(x0)", "-1", "2(x3", "1.5", "2(x1000001)"],
)
def test_expand_tasks_per_node_rejects(value: str) -> None:
    with pytest.raises(EnvironmentDetectionError) as info:
        expand_tasks_per_node(value)
    message = str(info.value)
    assert f"SLURM_TASKS_PER_NODE={value!r}" in message
    assert "HINT:" in message
    assert info.value.variable == "SLURM_TASKS_PER_NODE"
    assert info.value.value == value


# -- property: the expansion equals an independent construction from the generated parts ------

_TEXT = st.text(alphabet="abcxyzAZ019-", max_size=6)


@st.composite
def _bracket_group(draw: st.DrawFn) -> tuple[str, list[str]]:
    """Return ``(body, numbers)``: a bracket's inside and the numbers it stands for."""
    body: list[str] = []
    numbers: list[str] = []
    for _ in range(draw(st.integers(1, 3))):
        low = draw(st.integers(0, 120))
        low_text = str(low).zfill(draw(st.integers(1, 4)))
        if draw(st.booleans()):
            body.append(low_text)
            numbers.append(low_text)
            continue
        high = low + draw(st.integers(0, 4))
        high_text = str(high).zfill(draw(st.integers(1, 4)))
        body.append(f"{low_text}-{high_text}")
        numbers.extend(str(n).zfill(len(low_text)) for n in range(low, high + 1))
    return ",".join(body), numbers


@st.composite
def _host_name(draw: st.DrawFn) -> tuple[str, list[str]]:
    """Return ``(text, hosts)``: one top-level hostlist element and its hosts, in Slurm's order."""
    groups = draw(st.lists(_bracket_group(), max_size=3))
    texts = [draw(_TEXT if groups else _TEXT.filter(bool)) for _ in range(len(groups) + 1)]
    rendered = texts[0]
    hosts = [texts[0]]
    for (body, numbers), text in zip(groups, texts[1:], strict=True):
        rendered += f"[{body}]{text}"
        hosts = [host + number + text for host in hosts for number in numbers]
    return rendered, hosts


@settings(max_examples=200, deadline=None)
@given(st.lists(_host_name(), min_size=1, max_size=4))
def test_expand_hostlist_matches_a_reference_construction(
    elements: list[tuple[str, list[str]]],
) -> None:
    value = ",".join(text for text, _ in elements)
    expected = [host for _, hosts in elements for host in hosts]
    assert expand_hostlist(value) == expected
