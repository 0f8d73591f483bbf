"""The pytest-free half of the conformance kit: options, the world under test, reports, summary.

``python -m pytest --pyargs distcomm.testing.conformance --distcomm-backend=NAME`` runs the suite
as one pytest test per check (``test_conformance.py``, next to this module); distcomm's pytest
plugin (:mod:`distcomm.testing.pytest_plugin`) reads the options and prints the summary. This
module holds what neither needs pytest for, so that it can be tested and read on its own:

- :func:`parse_options` turns the command-line values into :class:`KitOptions`, or raises an
  error that names the bad value, the valid choices and a fix;
- :func:`start` makes this process's world (``distcomm.init`` once, or thread-ranks in threads
  mode) and :func:`run` runs one check in it;
- :func:`failure_report` and :func:`summary` are what the plugin prints.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

import distcomm
from distcomm.backend.specs import ALL_OPS, DTYPE_NAMES, Capabilities
from distcomm.errors import InvalidArgumentError, did_you_mean
from distcomm.protocol import ReduceOp
from distcomm.testing.conformance.registry import CHECKS, run_check
from distcomm.testing.threads import run_threads

__all__ = [
    "DEFAULT_TIMEOUT",
    "THREAD_BACKENDS",
    "KitOptions",
    "World",
    "failure_report",
    "parse_options",
    "run",
    "select_checks",
    "start",
    "summary",
    "title",
    "topic_of",
]

#: Seconds a check may take by default: the limit of each operation and of each test.
DEFAULT_TIMEOUT = 120.0
#: The backends whose ranks can be threads of one process (``--distcomm-threads``).
THREAD_BACKENDS = ("fakelink",)
_REDUCE_OPS = tuple(op.name for op in ReduceOp)
_FLAGS = (
    "p2p",
    "p2p_tags",
    "any_source",
    "async_ops",
    "timeouts",
    "cancellable",
    "subgroup_split",
)


@dataclasses.dataclass(frozen=True)
class KitOptions:
    """What the kit runs, from ``--distcomm-backend``, ``--distcomm-threads``,
    ``--distcomm-checks`` and ``--distcomm-timeout``.

    Attributes:
        backend: the backend's name, as ``distcomm.init(backend=...)`` takes it.
        threads: the number of thread-ranks in threads mode, or None: one rank per process,
            started by a launcher.
        checks: the names of the checks to run, in suite order.
        timeout: seconds for each check (and each operation in it).
    """

    backend: str
    threads: int | None
    checks: tuple[str, ...]
    timeout: float


@dataclasses.dataclass(frozen=True)
class World:
    """The world the checks run in, as the summary describes it.

    Attributes:
        backend: the backend's name.
        world_size: the number of ranks.
        rank: this process's rank (0 in threads mode: the process holds every rank).
        capabilities: what the backend's communicator does natively.
        threads: whether the ranks are threads of this process.
    """

    backend: str
    world_size: int
    rank: int
    capabilities: Capabilities
    threads: bool


def parse_options(
    backend: str, threads: int | None, checks: str | None, timeout: float | None
) -> KitOptions:
    """Check the kit's command-line values and return them as :class:`KitOptions`.

    Raises:
        BackendNotFoundError: no backend is called ``backend`` (distcomm's own error).
        InvalidArgumentError: ``threads`` < 1 or with a backend that has no thread-ranks, an
            unknown check name, or ``timeout`` <= 0.
    """
    from distcomm._plugins.loader import check_backend

    name = check_backend(backend)
    if threads is not None:
        _check_threads(name, threads)
    if timeout is not None and not timeout > 0:
        raise InvalidArgumentError(
            f"--distcomm-timeout={timeout!r} must be a number of seconds > 0. HINT: the default "
            f"is {DEFAULT_TIMEOUT:g}."
        )
    return KitOptions(
        backend=name,
        threads=threads,
        checks=select_checks(checks),
        timeout=DEFAULT_TIMEOUT if timeout is None else float(timeout),
    )


def _check_threads(backend: str, threads: int) -> None:
    if threads < 1:
        raise InvalidArgumentError(
            f"--distcomm-threads={threads!r} must be at least 1. HINT: e.g. --distcomm-threads=4 "
            "for a world of 4 thread-ranks."
        )
    if backend not in THREAD_BACKENDS:
        raise InvalidArgumentError(
            f"--distcomm-threads runs thread-ranks in this process, which only an in-process "
            f"backend has; got --distcomm-backend={backend!r}, valid: "
            f"{', '.join(THREAD_BACKENDS)}. HINT: drop --distcomm-threads and start one process "
            f"per rank, e.g. distcomm run -n {threads} -m pytest --pyargs "
            f"distcomm.testing.conformance --distcomm-backend={backend}"
        )


def select_checks(spec: str | None) -> tuple[str, ...]:
    """The checks named in ``spec`` (comma-separated; None or blank: all), in suite order.

    Raises:
        InvalidArgumentError: a name that no check has.
    """
    names = [part.strip() for part in (spec or "").split(",") if part.strip()]
    if not names:
        return tuple(CHECKS)
    unknown = [name for name in names if name not in CHECKS]
    if unknown:
        close = [hint for name in unknown if (hint := did_you_mean(name, CHECKS))]
        hint = " ".join(close) or "the check names are the test ids of a run without the option."
        raise InvalidArgumentError(
            f"--distcomm-checks: no conformance check named "
            f"{', '.join(repr(n) for n in unknown)}; valid: {', '.join(CHECKS)}. HINT: {hint}"
        )
    return tuple(name for name in CHECKS if name in names)


def start(options: KitOptions) -> World:
    """Make the world to run checks in: thread-ranks need nothing started; else initialise
    distcomm in this process (one rank of the launcher's job) with the kit's backend."""
    if options.threads is not None:
        found = run_threads(_capabilities, options.threads, timeout=60.0)
        return World(options.backend, options.threads, 0, found[0], threads=True)
    comm = distcomm.init(backend=options.backend, timeout=options.timeout)
    return World(comm.backend, comm.world_size, comm.rank, comm.capabilities, threads=False)


def _capabilities() -> Capabilities:
    return distcomm.get_communicator().capabilities


def run(options: KitOptions, name: str) -> None:
    """Run check ``name`` on every rank: in N new thread-ranks in threads mode, else here."""
    __tracebackhide__ = True  # a failure's report starts at the check
    if options.threads is not None:
        run_threads(run_check, options.threads, name, timeout=options.timeout)
    else:
        run_check(name)


def topic_of(name: str) -> str:
    """The topic of check ``name``: the module that defines it."""
    return CHECKS[name].__module__.rsplit(".", 1)[-1]


def failure_report(rank: int, world_size: int, test: str, when: str, text: str) -> str:
    """What a rank that failed ``test`` prints before it ends the job: each line prefixed."""
    lines = [
        f"distcomm: rank {rank} of {world_size} failed {test} ({when}); ending the whole job so "
        "that the other ranks do not wait for it.",
        *text.splitlines(),
    ]
    return "".join(f"[rank {rank}] {line}\n" for line in lines)


def summary(world: World, outcomes: Mapping[str, str]) -> list[str]:
    """The summary's lines (under :func:`title`): native capabilities, then checks per topic.

    Args:
        world: what ran the checks.
        outcomes: ``"passed"``, ``"failed"`` or ``"skipped"`` per check name that ran.
    """
    return [*_capability_table(world.capabilities), "", *_topic_table(outcomes)]


def title(world: World) -> str:
    """The summary's title, e.g. ``distcomm conformance: gloo, 4 ranks (processes)``."""
    kind = "thread-ranks" if world.threads else "processes"
    ranks = "rank" if world.world_size == 1 else "ranks"
    return f"distcomm conformance: {world.backend}, {world.world_size} {ranks} ({kind})"


def _capability_table(caps: Capabilities) -> list[str]:
    rows = [
        ("dtypes", _native(caps.dtypes, DTYPE_NAMES, "bridged through a wider dtype")),
        ("reduce_ops", _native(caps.reduce_ops, _REDUCE_OPS, "emulated")),
        ("ops", _native(caps.ops, sorted(ALL_OPS), "emulated")),
        *((flag, "yes" if getattr(caps, flag) else "no") for flag in _FLAGS),
    ]
    return _table(("capability", "native"), rows)


def _native(have: Iterable[str], every: Sequence[str], otherwise: str) -> str:
    """``"all"``, or the names of ``every`` missing from ``have`` and what distcomm does."""
    native = set(have)
    missing = [name for name in every if name not in native]
    if not missing:
        return "all"
    if len(missing) == len(every):
        return f"none ({otherwise})"
    return f"all but {', '.join(missing)} ({otherwise})"


def _topic_table(outcomes: Mapping[str, str]) -> list[str]:
    counts: dict[str, dict[str, int]] = {}
    for name, outcome in outcomes.items():
        row = counts.setdefault(topic_of(name), {"passed": 0, "failed": 0, "skipped": 0})
        row[outcome] = row.get(outcome, 0) + 1
    columns = ["passed", "failed"]
    if any(row["skipped"] for row in counts.values()):
        columns.append("skipped")
    total = {c: sum(row[c] for row in counts.values()) for c in columns}
    rows = [(topic, *(str(row[c]) for c in columns)) for topic, row in counts.items()]
    rows.append(("total", *(str(total[c]) for c in columns)))
    return _table(("topic", *columns), rows, numeric=True)


def _table(
    header: tuple[str, ...], rows: Iterable[tuple[str, ...]], numeric: bool = False
) -> list[str]:
    """Rows as aligned lines: the first column to the left, the others to the right when
    ``numeric``."""
    table = [header, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = []
    for row in table:
        cells = [
            cell.rjust(widths[i]) if numeric and i else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
    return lines
