"""Python tracebacks in a rank's output, as ``distcomm run`` sees them: where one starts, and
which ones a Ctrl-C explains.

After a Ctrl-C, every rank that was interrupted prints a ``KeyboardInterrupt`` traceback; the
launcher says "interrupted" once instead (:mod:`distcomm._processes.supervisor`), and drops
those tracebacks with :func:`without_interrupts`, keeping everything else the rank wrote.
"""

from __future__ import annotations

__all__ = ["START", "starts", "without_interrupts"]

#: The first line of a traceback.
START = "Traceback (most recent call last):"
#: The line before the traceback of an exception Python could not raise (at shutdown, say).
_IGNORED = "Exception ignored in"
#: The lines between two tracebacks of one chain (an exception raised while handling another).
_CHAINED = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)


def starts(text: str) -> bool:
    """Whether ``text`` (a line) begins a traceback, or a report of an exception Python could
    not raise ("Exception ignored in: ...", a traceback follows)."""
    return text.startswith((START, _IGNORED))


def without_interrupts(lines: list[str], prefix: str = "") -> list[str]:
    """``lines`` without the tracebacks that end in ``KeyboardInterrupt``.

    A traceback chain (the tracebacks of exceptions raised while handling others) is dropped
    whole when its last exception is a ``KeyboardInterrupt``: the rank was interrupted; so is
    the "Exception ignored in: ..." line before one (an interrupt at shutdown). Other
    tracebacks, and lines that are no traceback, are kept.

    Args:
        lines: a rank's output, one line each (with or without the newline).
        prefix: what every line starts with (``"[rank N] "``), if anything.
    """
    texts = [line.removeprefix(prefix).rstrip("\r\n") for line in lines]
    keep = [True] * len(lines)
    start: int | None = None  # where the chain being read began
    for i, text in enumerate(texts):
        if text == START:
            chained = i >= 3 and texts[i - 1] == "" and texts[i - 2] in _CHAINED
            if not chained or start is None:
                start = i - 1 if i and texts[i - 1].startswith(_IGNORED) else i
        elif start is not None and _interrupt(text) and texts[i - 1][:1].isspace():
            if texts[i + 1 : i + 3] in [["", chain] for chain in _CHAINED]:
                continue  # the chain goes on: its last exception decides
            keep[start : i + 1] = [False] * (i + 1 - start)
            start = None
    return [line for line, kept in zip(lines, keep, strict=True) if kept]


def _interrupt(text: str) -> bool:
    """Whether ``text`` is the last line of a ``KeyboardInterrupt`` traceback."""
    return text == "KeyboardInterrupt" or text.startswith("KeyboardInterrupt:")
