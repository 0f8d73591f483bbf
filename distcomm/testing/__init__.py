"""Testing tools: thread-ranks (:func:`run_threads`), process-ranks (:func:`spawn`, and
:class:`WarmWorld`, whose processes are kept from call to call), fault
injection (:mod:`~distcomm.testing.faults`) and the backend conformance suite.

``distcomm.testing.conformance`` holds the checks every backend must pass, written once and run
inside already-running ranks (threads here; processes or mpirun ranks for other backends).
"""

from distcomm.testing import faults as faults  # the submodule (its reference: its own page)
from distcomm.testing._spawn import spawn
from distcomm.testing._warm import WarmWorld
from distcomm.testing.threads import run_threads

__all__ = ["WarmWorld", "run_threads", "spawn"]
