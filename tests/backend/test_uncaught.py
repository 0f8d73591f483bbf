"""Tests of distcomm.backend._uncaught: a rank's uncaught exception as its user reads it (the
frames inside distcomm left out, every line prefixed with the rank, one write per report)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import distcomm
from distcomm.backend import _uncaught


def raised_by_distcomm() -> BaseException:
    """A distcomm error raised deep inside distcomm, from this file's line."""
    try:
        distcomm.all_reduce(np.ones(2), op="bogus")  # a world of 1: refused before anything
    except distcomm.InvalidArgumentError as exc:
        return exc
    raise AssertionError("the bad op was accepted")


def test_a_distcomm_error_ends_at_the_users_call() -> None:
    text = _uncaught.format_exception(raised_by_distcomm())
    frames = [line for line in text.splitlines() if line.startswith("  File ")]
    assert frames[-1].startswith(f'  File "{__file__}"'), text
    assert not any("/distcomm/" in line for line in frames), text
    assert text.rstrip().splitlines()[-1].startswith("distcomm.errors.InvalidArgumentError")


def test_at_debug_level_every_frame_is_shown() -> None:
    logger = logging.getLogger("distcomm")
    level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        text = _uncaught.format_exception(raised_by_distcomm())
    finally:
        logger.setLevel(level)
    assert "/distcomm/_runtime/collectives.py" in text, text


def test_other_exceptions_keep_every_frame() -> None:
    """A bug of distcomm's own (not a distcomm error) shows where it is."""
    from distcomm._divergence import timeline

    try:
        timeline({})
    except KeyError as exc:
        text = _uncaught.format_exception(exc)
    assert "/distcomm/_divergence.py" in text, text


def test_a_report_is_one_write_with_every_line_prefixed(monkeypatch: pytest.MonkeyPatch) -> None:
    written: list[bytes] = []
    monkeypatch.setattr(_uncaught, "_rank", 3)
    monkeypatch.setattr(os, "write", lambda fd, data: written.append(bytes(data)) or len(data))
    _uncaught.write("Traceback (most recent call last):\n  File x\n\n[rank 3] already\nError")
    assert written == [
        b"[rank 3] Traceback (most recent call last):\n[rank 3]   File x\n\n"
        b"[rank 3] already\n[rank 3] Error\n"
    ]


UNCAUGHT = """
import numpy as np
import distcomm
from distcomm.backend import _uncaught
_uncaught.install(2)  # as init does in a world of several ranks
distcomm.all_reduce(np.ones(2), op="bogus")
"""


def test_an_uncaught_distcomm_error_prints_prefixed_and_trimmed() -> None:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(UNCAUGHT)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert lines and all(line.startswith("[rank 2] ") for line in lines), done.stderr
    assert lines[-1].startswith("[rank 2] distcomm.errors.InvalidArgumentError: unknown reduce")
    assert not any("/distcomm/" in line for line in lines), done.stderr


def test_a_bad_setting_read_by_init_ends_at_the_users_call() -> None:
    """A malformed DISTCOMM_* variable fails init before the launch is known: the traceback
    still ends at the program's line, with no frame of distcomm's."""
    env = {**os.environ, "DISTCOMM_DEBUG": "loud"}
    done = subprocess.run(
        [sys.executable, "-c", "import distcomm\ndistcomm.init()"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert lines[-1].startswith("distcomm.errors.InvalidArgumentError: DISTCOMM_DEBUG='loud'")
    assert '  File "<string>", line 2, in <module>' in lines, done.stderr
    assert not any("/distcomm/" in line for line in lines), done.stderr
