"""FakeLink: the built-in in-process backend (a world of 1, or N thread-ranks).

:mod:`~distcomm.fakelink.fabric` is the in-process world, :mod:`~distcomm.fakelink.communicator`
its engine (and ``world``, a communicator over one), :mod:`~distcomm.fakelink.plugin` the
registration.
"""

from distcomm.fakelink.communicator import CAPABILITIES, FakeLinkEngine, world
from distcomm.fakelink.fabric import Fabric, FabricAborted
from distcomm.fakelink.plugin import create, is_available

__all__ = [
    "CAPABILITIES",
    "Fabric",
    "FabricAborted",
    "FakeLinkEngine",
    "create",
    "is_available",
    "world",
]
