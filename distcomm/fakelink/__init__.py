"""FakeLink: the built-in in-process backend (a world of 1, or N thread-ranks).

:mod:`~distcomm.fakelink.fabric` is the in-process world, :mod:`~distcomm.fakelink.communicator`
the communicator over it, :mod:`~distcomm.fakelink.plugin` the registration.
"""

from distcomm.fakelink.communicator import FakeLinkCommunicator
from distcomm.fakelink.fabric import Fabric, FabricAborted
from distcomm.fakelink.plugin import create, is_available

__all__ = ["Fabric", "FabricAborted", "FakeLinkCommunicator", "create", "is_available"]
