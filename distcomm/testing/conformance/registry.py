"""The registry of conformance checks: :func:`check` adds one, :func:`run_all` runs them.

A check is a function of no arguments that runs inside an already-initialised rank and talks to
the other ranks only through distcomm. Every rank runs the same checks in the same order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import overload

import distcomm
from distcomm.errors import InvalidArgumentError, did_you_mean

__all__ = ["CHECKS", "Check", "check", "run_all", "run_check"]

Check = Callable[[], None]

#: Every registered check by name, in registration order (topic by topic).
CHECKS: dict[str, Check] = {}


@overload
def check(name_or_fn: Check) -> Check: ...
@overload
def check(name_or_fn: str) -> Callable[[Check], Check]: ...


def check(name_or_fn: str | Check) -> Check | Callable[[Check], Check]:
    """Register a conformance check, as ``@check`` (named after the function) or ``@check(name)``.

    Raises:
        ValueError: a check of that name is already registered.
    """
    if isinstance(name_or_fn, str):
        name = name_or_fn

        def register(fn: Check) -> Check:
            return _register(name, fn)

        return register
    return _register(name_or_fn.__name__, name_or_fn)


def _register(name: str, fn: Check) -> Check:
    if name in CHECKS:
        raise ValueError(f"conformance check {name!r} is registered twice")
    CHECKS[name] = fn
    return fn


def run_check(name: str) -> None:
    """Run one check in this rank (every rank must run it).

    Raises:
        InvalidArgumentError: no check has that name.
        AssertionError: the check failed; the message names the check and this rank, and the
            original error is chained.
    """
    fn = CHECKS.get(name)
    if fn is None:
        close = did_you_mean(name, CHECKS)
        hint = f" HINT: {close}" if close else ""
        raise InvalidArgumentError(
            f"no conformance check named {name!r}; there are {len(CHECKS)}: "
            f"{', '.join(CHECKS)}.{hint}"
        )
    try:
        fn()
    except Exception as exc:
        rank = distcomm.get_rank()
        raise AssertionError(
            f"conformance check {name!r} failed on rank {rank}: {type(exc).__name__}: {exc}"
        ) from exc


def run_all(names: Iterable[str] | None = None) -> list[str]:
    """Run ``names`` (default: every check, in registration order) in this rank.

    Every rank must pass the same names. Stops at the first failure.

    Returns:
        The names of the checks run, in order.

    Raises:
        InvalidArgumentError: an unknown name (raised before any check runs).
        AssertionError: a check failed (see :func:`run_check`).
    """
    selected = list(CHECKS) if names is None else list(names)
    unknown = [n for n in selected if n not in CHECKS]
    if unknown:
        raise InvalidArgumentError(
            f"unknown conformance checks {unknown!r}; valid: {', '.join(CHECKS)}"
        )
    for name in selected:
        run_check(name)
    return selected
