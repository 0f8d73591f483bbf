"""The arguments of ``distcomm run`` (:func:`distcomm._processes.supervisor.run`) taken in before
any rank starts: the command and the numbers checked, the ``--log-dir`` files opened."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import IO

from distcomm._files import private_folders
from distcomm.errors import InvalidArgumentError

__all__ = ["checked_argv", "open_logs"]


def checked_argv(
    cmd_argv: Sequence[str], nprocs: int, grace: float, max_restarts: int
) -> list[str]:
    """``cmd_argv`` as strings, once the arguments of ``run`` (but the backend) are checked.

    Raises:
        InvalidArgumentError: ``cmd_argv`` is empty, or ``nprocs``, ``grace`` or
            ``max_restarts`` is invalid.
    """
    argv = [str(arg) for arg in cmd_argv]
    if not argv:
        raise InvalidArgumentError(
            "cmd_argv=[] has nothing to run. HINT: e.g. [sys.executable, 'train.py']."
        )
    if not isinstance(nprocs, int) or isinstance(nprocs, bool) or nprocs < 1:
        raise InvalidArgumentError(
            f"nprocs={nprocs!r} must be a positive int. HINT: e.g. 2 for two ranks."
        )
    if isinstance(grace, bool) or not isinstance(grace, (int, float)) or not grace >= 0:
        raise InvalidArgumentError(
            f"grace={grace!r} must be a number of seconds >= 0. HINT: the default is 5."
        )
    if not isinstance(max_restarts, int) or isinstance(max_restarts, bool) or max_restarts < 0:
        raise InvalidArgumentError(f"max_restarts={max_restarts!r} must be >= 0. HINT: e.g. 3")
    return argv


def open_logs(log_dir: str | os.PathLike[str], nprocs: int) -> list[IO[bytes]]:
    """``log_dir/rank-N.log`` for every rank, created 0600 (the folder 0700 when made here)."""
    try:
        private_folders(log_dir)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
        return [
            os.fdopen(os.open(os.path.join(log_dir, f"rank-{rank}.log"), flags, 0o600), "wb")
            for rank in range(nprocs)
        ]
    except OSError as exc:
        raise InvalidArgumentError(
            f"--log-dir {os.fspath(log_dir)!r} cannot hold the ranks' logs: {exc.strerror or exc}."
            " HINT: give a folder you can write to (it is made if missing)."
        ) from exc
