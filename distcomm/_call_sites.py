"""Where the user called distcomm from: the innermost frame outside the ``distcomm`` package,
the packages of its plugins (``distcomm_*``) and torch's package.

torch's frames are skipped too because, with torch's group over distcomm
(``torch_group="distcomm"``), a call reaches distcomm through torch: ``dist.all_reduce`` and the
plugin's process group, or DDP's reducer from autograd; the user's line is the one that called
torch (``loss.backward()``, ``dist.all_reduce(...)``).

The mismatch check names each kind of call by it, the flight recorder writes it beside every
operation, and ``rank_zero_first``-style helpers say which block a rank waits in.
"""

from __future__ import annotations

import os
import sys
from types import CodeType, FrameType

__all__ = ["call_site", "format_site", "user_frame", "user_site"]

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
#: Whether each code object met is distcomm's (a frame's file, resolved once per code object),
#: by the code object's id (a code object's own hash reads its bytecode on every call); the
#: entry holds the code object, so that its id is not reused while it is there.
_OURS: dict[int, tuple[CodeType, bool]] = {}


def _ours(code: CodeType) -> bool:
    """Whether ``code`` is distcomm's, a plugin's or torch's (its file resolved once, then
    remembered in :data:`_OURS`)."""
    known = _OURS.get(id(code))
    if known is None:
        if len(_OURS) > 4096:
            _OURS.clear()
        known = _OURS[id(code)] = (code, _between(os.path.abspath(code.co_filename)))
    return known[1]


def _between(path: str) -> bool:
    """Whether the file at ``path`` stands between the user's line and distcomm: distcomm's,
    a plugin package's (``distcomm_*``) or torch's."""
    if path.startswith(_PACKAGE) or os.path.basename(os.path.dirname(path)).startswith("distcomm_"):
        return True
    torch = sys.modules.get("torch")
    where = getattr(torch, "__file__", None)
    return where is not None and path.startswith(os.path.dirname(where) + os.sep)


def user_frame(skip: tuple[str, ...] = ()) -> FrameType | None:
    """The innermost frame of the calling thread outside distcomm, its plugins and torch (and
    outside the files ``skip``); None when every frame is theirs."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and (_ours(frame.f_code) or frame.f_code.co_filename in skip):
        frame = frame.f_back
    return frame


def user_site(depth: int = 1) -> tuple[CodeType, int] | None:
    """The code and instruction of :func:`user_frame` (no ``skip``), for a record made on every
    call (:func:`format_site` finds the line later): each code object's file is resolved once;
    None when every frame is distcomm's. ``depth``: the caller's frames known to be distcomm's,
    skipped without a look (Python makes a frame object for each frame looked at)."""
    frame: FrameType | None = sys._getframe(depth)
    while frame is not None:
        code = frame.f_code
        known = _OURS.get(id(code))  # _ours, inlined where it is known: the common case
        if not (known[1] if known is not None else _ours(code)):
            return code, frame.f_lasti
        frame = frame.f_back
    return None


def format_site(site: tuple[CodeType, int] | None) -> str | None:
    """``file:line in function`` of a :func:`user_site` (None for None)."""
    if site is None:
        return None
    code, instruction = site
    line = next((line for start, end, line in code.co_lines() if start <= instruction < end), None)
    return f"{code.co_filename}:{line} in {code.co_name}"


def call_site(skip: tuple[str, ...] = ()) -> str:
    """``file:line`` of :func:`user_frame` (``"?"`` where there is none): the user's call."""
    frame = user_frame(skip)
    if frame is None:
        return "?"
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"
