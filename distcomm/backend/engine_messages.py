"""What an engine's error message says, read the same way everywhere: whether a peer process
went away (Gloo's, MPI's and the sockets' wordings), and the lines after its first (where NCCL
gives its reason), shown in distcomm's errors under "The engine said:".
"""

from __future__ import annotations

__all__ = ["ENGINE_LINES", "engine_said", "lost_peer"]

#: Engine messages that mean a peer process went away (gloo, MPI, sockets).
_LOST_PEER = (
    "connection closed",
    "connection reset",
    "connection refused",
    "broken pipe",
    "closed by peer",
    "socket closed",
    "end of file",
)


def lost_peer(message: str) -> bool:
    """Whether an engine's error message means that a peer process went away."""
    text = message.lower()
    return any(phrase in text for phrase in _LOST_PEER)


#: The most lines of an engine's message that an EngineError repeats after its first.
ENGINE_LINES = 12


def engine_said(exc: BaseException) -> str:
    """The lines of the engine's message after its first (NCCL's reason comes there: "Last
    error: Duplicate GPU detected ..."), indented, at most :data:`ENGINE_LINES`, without a
    C++ stack trace (torch's "Exception raised from ..."); "" if none."""
    text = str(exc).strip().split("Exception raised from ", 1)[0]
    rest = [line.strip() for line in text.splitlines()[1:] if line.strip()]
    if not rest:
        return ""
    more = len(rest) - ENGINE_LINES
    shown = rest[:ENGINE_LINES] + ([f"... ({more} more lines)"] if more > 0 else [])
    return "\nThe engine said:\n" + "\n".join(f"  {line}" for line in shown)
