"""Where the user called distcomm from: the innermost frame outside the ``distcomm`` package.

The mismatch check names each kind of call by it, the flight recorder writes it beside every
operation, and ``rank_zero_first``-style helpers say which block a rank waits in.
"""

from __future__ import annotations

import os
import sys
from types import FrameType

__all__ = ["call_site", "user_frame"]

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def user_frame(skip: tuple[str, ...] = ()) -> FrameType | None:
    """The innermost frame of the calling thread outside distcomm (and outside the files
    ``skip``); None when every frame is distcomm's."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and (
        os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE)
        or frame.f_code.co_filename in skip
    ):
        frame = frame.f_back
    return frame


def call_site(skip: tuple[str, ...] = ()) -> str:
    """``file:line`` of :func:`user_frame` (``"?"`` where there is none): the user's call."""
    frame = user_frame(skip)
    if frame is None:
        return "?"
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"
