"""Slurm's compressed notations, expanded without ``scontrol``.

Two forms appear in a Slurm task's environment:

* hostlists (``SLURM_NODELIST`` and friends): ``node[01-03,07],login1``, ``x[1-2]y[3-4]``;
* task counts per node (``SLURM_TASKS_PER_NODE``): ``2(x3),1``.

Both expand into plain lists in Slurm's own order. A malformed value raises
:class:`~distcomm.errors.EnvironmentDetectionError` naming the variable and the value.
"""

from __future__ import annotations

import itertools
import math
import re

from distcomm.errors import EnvironmentDetectionError

__all__ = ["MAX_HOSTS", "expand_hostlist", "expand_tasks_per_node"]

#: The most hosts (or task counts) one expansion may produce; more is a malformed value.
MAX_HOSTS = 1_000_000

_HOSTLIST_HINT = (
    "HINT: a Slurm hostlist looks like 'node[01-04,07],login1' (comma-separated names, each "
    "with optional [ranges]); check how {variable} was set, or unset it."
)
_TASKS_HINT = (
    "HINT: Slurm writes task counts per node like '2(x3),1' (2 tasks on each of 3 nodes, then "
    "1); check how {variable} was set, or unset it."
)
_RANGE = re.compile(r"([0-9]+)\s*(?:-\s*([0-9]+))?")
_TASK_COUNT = re.compile(r"([0-9]+)(?:\(x([0-9]+)\))?")


def expand_hostlist(value: str, variable: str = "SLURM_NODELIST") -> list[str]:
    """Expand a Slurm hostlist into host names, in Slurm's order.

    Names are separated by commas (a comma inside brackets belongs to the bracket). Each name
    may hold several bracket groups of numbers and ranges; their cartesian product is taken with
    the first group varying slowest (``x[1-2]y[3-4]`` gives x1y3, x1y4, x2y3, x2y4). A range keeps
    the zero padding of its lower bound (``[08-10]`` gives 08, 09, 10). Whitespace around names
    and bracket items is ignored.

    Args:
        value: the hostlist, e.g. ``"node[01-03],gpu-[1-2]-ib"``.
        variable: the variable it came from, named in error messages.

    Returns:
        The host names, duplicates kept.

    Raises:
        EnvironmentDetectionError: the value is empty or malformed (an empty name or bracket
            item, unbalanced or nested brackets, a range whose bounds are not numbers or whose
            lower bound exceeds the upper), or it expands to more than :data:`MAX_HOSTS` hosts.
    """
    hosts: list[str] = []
    for element in _split_top_level(value, variable):
        parts = _parse_element(element, value, variable)
        count = math.prod(len(part) for part in parts)
        if len(hosts) + count > MAX_HOSTS:
            raise _hostlist_error(value, variable, f"expands to more than {MAX_HOSTS:,} hosts")
        hosts.extend("".join(combination) for combination in itertools.product(*parts))
    return hosts


def expand_tasks_per_node(value: str, variable: str = "SLURM_TASKS_PER_NODE") -> list[int]:
    """Expand Slurm's compressed task counts per node: ``2(x3),1`` gives ``[2, 2, 2, 1]``.

    Args:
        value: the compressed list, e.g. ``"4"`` or ``"2(x3),1"``.
        variable: the variable it came from, named in error messages.

    Returns:
        One task count (at least 1) per node, in node order.

    Raises:
        EnvironmentDetectionError: the value is empty or malformed, a count or repetition is
            zero, or it expands to more than :data:`MAX_HOSTS` nodes.
    """
    counts: list[int] = []
    for element in value.split(","):
        match = _TASK_COUNT.fullmatch(element.strip())
        if match is None:
            problem = f"{element.strip()!r} is not 'N' or 'N(xM)'"
            raise _tasks_error(value, variable, problem)
        tasks, repeat = int(match.group(1)), int(match.group(2) or 1)
        if tasks < 1 or repeat < 1:
            raise _tasks_error(value, variable, f"{element.strip()!r} has a zero count")
        if len(counts) + repeat > MAX_HOSTS:
            raise _tasks_error(value, variable, f"expands to more than {MAX_HOSTS:,} nodes")
        counts.extend([tasks] * repeat)
    return counts


def _split_top_level(value: str, variable: str) -> list[str]:
    """Split at the commas outside brackets; check that brackets balance and do not nest."""
    elements: list[str] = []
    start, depth = 0, 0
    for index, char in enumerate(value):
        if char == "[":
            if depth:
                raise _hostlist_error(value, variable, f"nested '[' at offset {index}")
            depth = 1
        elif char == "]":
            if not depth:
                raise _hostlist_error(value, variable, f"unmatched ']' at offset {index}")
            depth = 0
        elif char == "," and not depth:
            elements.append(value[start:index])
            start = index + 1
    if depth:
        raise _hostlist_error(value, variable, "a '[' is never closed")
    elements.append(value[start:])
    for element in elements:
        if not element.strip():
            raise _hostlist_error(value, variable, "it has an empty host name")
    return [element.strip() for element in elements]


def _parse_element(element: str, value: str, variable: str) -> list[list[str]]:
    """Split one host name into alternating literal texts and expanded bracket groups."""
    parts: list[list[str]] = []
    for index, piece in enumerate(re.split(r"\[([^\]]*)\]", element)):
        if index % 2 == 0:
            if any(char.isspace() for char in piece):
                raise _hostlist_error(value, variable, f"host name {element!r} has whitespace")
            parts.append([piece])
        else:
            parts.append(_expand_brackets(piece, value, variable))
    return parts


def _expand_brackets(body: str, value: str, variable: str) -> list[str]:
    """Expand the inside of one bracket group: ``01-03,07`` gives 01, 02, 03, 07."""
    numbers: list[str] = []
    for item in body.split(","):
        match = _RANGE.fullmatch(item.strip())
        if match is None:
            problem = f"[{body}] holds {item.strip()!r}, which is not a number or a range 'lo-hi'"
            raise _hostlist_error(value, variable, problem)
        low_text, high_text = match.group(1), match.group(2)
        if high_text is None:
            numbers.append(low_text)
            continue
        low, high = int(low_text), int(high_text)
        if low > high:
            raise _hostlist_error(value, variable, f"range {item.strip()!r} runs backwards")
        if len(numbers) + high - low + 1 > MAX_HOSTS:
            raise _hostlist_error(value, variable, f"expands to more than {MAX_HOSTS:,} hosts")
        width = len(low_text)
        numbers.extend(str(number).zfill(width) for number in range(low, high + 1))
    return numbers


def _hostlist_error(value: str, variable: str, problem: str) -> EnvironmentDetectionError:
    return EnvironmentDetectionError(
        f"{variable}={value!r} is not a valid Slurm hostlist: {problem}. "
        + _HOSTLIST_HINT.format(variable=variable),
        variable=variable,
        value=value,
    )


def _tasks_error(value: str, variable: str, problem: str) -> EnvironmentDetectionError:
    return EnvironmentDetectionError(
        f"{variable}={value!r} is not a valid Slurm task count per node: {problem}. "
        + _TASKS_HINT.format(variable=variable),
        variable=variable,
        value=value,
    )
