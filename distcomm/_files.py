"""Folders that only their owner can enter, made so from the start."""

from __future__ import annotations

import os

__all__ = ["private_folders"]


def private_folders(path: str | os.PathLike[str]) -> None:
    """Make ``path`` and each missing folder above it with mode 0700 (never wider: the umask can
    only narrow it); folders that exist are left as they are (a shared directory is its
    owner's)."""
    path = os.path.abspath(path)
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:  # made meanwhile by another rank
            if not os.path.isdir(folder):
                raise
