"""Tests of distcomm._processes.tracebacks: which lines of a rank's output a Ctrl-C explains."""

from __future__ import annotations

import pytest

from distcomm._processes.tracebacks import START, starts, without_interrupts

INTERRUPTED = [
    START,
    '  File "loop.py", line 8, in <module>',
    "    time.sleep(1)",
    "KeyboardInterrupt",
]
FAILED = [START, '  File "loop.py", line 9, in <module>', "    1 / 0", "ZeroDivisionError: x"]
#: An interrupt while handling an engine's error: one chain, ending in KeyboardInterrupt.
CHAINED = [
    START,
    '  File "comm.py", line 99, in _block',
    "    self._work.wait()",
    "RuntimeError: Connection closed by peer [127.0.0.1]:50864.",
    "",
    "During handling of the above exception, another exception occurred:",
    "",
    START,
    '  File "comm.py", line 103, in _block',
    '    if "timed out" in str(exc).lower():',
    "                      ^^^^^^^^",
    "KeyboardInterrupt",
]
#: An error raised while handling an interrupt: not explained by the Ctrl-C.
CAUSED = [
    *INTERRUPTED,
    "",
    "The above exception was the direct cause of the following exception:",
    "",
    *FAILED,
]
#: An interrupt while Python waited for the rank's threads at exit.
AT_EXIT = [
    "Exception ignored in: <module 'threading' from '/usr/lib/python3.11/threading.py'>",
    START,
    '  File "/usr/lib/python3.11/threading.py", line 1590, in _shutdown',
    "    lock.acquire()",
    "KeyboardInterrupt: ",
]


@pytest.mark.parametrize(
    ("lines", "kept"),
    [
        (INTERRUPTED, []),
        (CHAINED, []),
        (FAILED, FAILED),
        (CAUSED, CAUSED),
        ([*INTERRUPTED, "", CHAINED[5], "", *INTERRUPTED], []),
        (["saving", *INTERRUPTED, "saved"], ["saving", "saved"]),
        ([*FAILED, "", *INTERRUPTED], [*FAILED, ""]),  # two tracebacks, not one chain
        ([*INTERRUPTED[:-1], "KeyboardInterrupt: stop"], []),
        ([START, "KeyboardInterrupt"], [START, "KeyboardInterrupt"]),  # no frame: no traceback
        (["KeyboardInterrupt"], ["KeyboardInterrupt"]),
        (AT_EXIT, []),
        (
            ["Exception ignored in: <function f>", *FAILED],
            ["Exception ignored in: <function f>", *FAILED],
        ),
        ([*INTERRUPTED[:-1], "KeyboardInterrupted"], [*INTERRUPTED[:-1], "KeyboardInterrupted"]),
    ],
    ids=[
        "interrupt",
        "interrupt-while-handling",
        "error",
        "error-from-interrupt",
        "interrupt-from-interrupt",
        "lines-around",
        "error-then-interrupt",
        "with-a-message",
        "no-frame",
        "a-line",
        "interrupt-at-exit",
        "error-at-exit",
        "another-name",
    ],
)
def test_only_tracebacks_that_end_in_an_interrupt_are_dropped(
    lines: list[str], kept: list[str]
) -> None:
    assert without_interrupts(lines) == kept
    prefixed = [f"[rank 3] {line}\n" for line in lines]
    assert without_interrupts(prefixed, "[rank 3] ") == [f"[rank 3] {line}\n" for line in kept]


@pytest.mark.parametrize(
    ("text", "starts_one"),
    [
        (START, True),
        ("Exception ignored in: <function f>", True),
        ("Traceback", False),
        ("", False),
    ],
)
def test_where_a_traceback_starts(text: str, starts_one: bool) -> None:
    assert starts(text) is starts_one
