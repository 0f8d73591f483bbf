"""The backend conformance suite: checks every backend must pass, at any world size.

Each check is a function of no arguments that runs inside an already-initialised rank (a thread of
:func:`distcomm.testing.run_threads`, a process of ``spawn``, an ``mpirun`` rank) and uses only the
module-level API, so one start of N ranks runs the whole suite::

    from distcomm.testing import conformance

    conformance.run_all()             # in every rank, after distcomm.init()
    conformance.run_check("barrier")  # or one check

Checks compute exact expected values in Python from rank-dependent inputs, cover numpy and (when
installed) torch, branch on ``comm.capabilities`` and the world size but never on the backend's
name, and call the same collectives in the same order on every rank. A failure raises
AssertionError naming the check and the rank. The checks are grouped by topic, in the order they
run: arguments and getters, reductions, data movement, layouts and ``async_op``, point to point,
groups, objects, the adversarial checks (temporaries in async operations, churn, objects of
every size), timeouts (a collective that the other ranks do not join), the mismatch check
(ranks that call different collectives), and the debugging aids (the default sample, hooks, the
main-only guard, ``assert_same``), and long runs of interleaved collectives past the check
points (the backend's plans).
"""

import importlib

from distcomm.testing.conformance.registry import CHECKS, Check, check, run_all, run_check

__all__ = ["CHECKS", "TOPICS", "Check", "check", "run_all", "run_check"]

#: The topic modules, in the order their checks run; importing one registers its checks.
TOPICS = (
    "arguments",
    "reductions",
    "movement",
    "layouts",
    "p2p",
    "groups",
    "objects",
    "adversarial",
    "timeouts",
    "mismatches",
    "debugging",
    "repeats",
)

for _topic in TOPICS:
    importlib.import_module(f"{__name__}.{_topic}")
