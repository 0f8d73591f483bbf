"""Launch detection: which launcher started this process, and the job it describes.

Pure: detection reads an environ mapping (``os.environ`` by default) and writes nothing; it
imports no engine (torch, numpy, mpi4py). Built-in methods, by automatic precedence: ``env``
(torchrun), ``slurm`` (an srun task step), ``mpi`` (mpirun / mpiexec), then
plugin environments, then ``single_node`` (no launcher: a world of 1). See
docs/launch.md#precedence.
``distcomm.detect_environment`` asks the registered environments; this package is given them.
"""

from __future__ import annotations

from distcomm.environment.detect import detect_launch, explain_launch
from distcomm.environment.hostlist import expand_hostlist, expand_tasks_per_node
from distcomm.environment.info import LaunchInfo

__all__ = [
    "LaunchInfo",
    "detect_launch",
    "expand_hostlist",
    "expand_tasks_per_node",
    "explain_launch",
]
