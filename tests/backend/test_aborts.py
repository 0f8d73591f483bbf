"""Tests of distcomm.backend.aborts: the policies that end a job (DISTCOMM_ON_TIMEOUT,
DISTCOMM_ABORT_ON_EXCEPTION) and the end of a job on an uncaught exception."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import distcomm
from distcomm.backend import aborts
from distcomm.errors import InvalidArgumentError


def test_a_malformed_timeout_policy_is_refused_at_init(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTCOMM_ON_TIMEOUT", "explode")
    with pytest.raises(InvalidArgumentError, match="DISTCOMM_ON_TIMEOUT='explode'") as info:
        distcomm.init()
    assert "raise, abort" in str(info.value) and "HINT" in str(info.value)
    monkeypatch.setenv("DISTCOMM_ON_TIMEOUT", "raise")
    monkeypatch.setenv("DISTCOMM_ABORT_ON_EXCEPTION", "maybe")
    with pytest.raises(InvalidArgumentError, match="DISTCOMM_ABORT_ON_EXCEPTION='maybe'"):
        distcomm.init()


# -- a dying rank under an MPI launcher ---------------------------------------------------------
DYING = """
import sys
from distcomm.backend import aborts
aborts.abort_on_uncaught_exception(3, lambda: print("JOB ABORTED", flush=True), "the test's abort")
raise ValueError("rank 3 breaks")
"""


@pytest.mark.parametrize("setting", ["", "0"])
def test_an_uncaught_exception_ends_the_job_unless_disabled(setting: str) -> None:
    env = {"DISTCOMM_ABORT_ON_EXCEPTION": setting} if setting else {}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(DYING)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**_plain_env(), **env},
    )
    assert done.returncode == 1
    assert done.stderr.count("ValueError: rank 3 breaks") == 1, "the traceback prints once"
    if setting == "0":
        assert "JOB ABORTED" not in done.stdout and "distcomm:" not in done.stderr
    else:
        assert "JOB ABORTED" in done.stdout
        assert "distcomm: rank 3 died of an uncaught ValueError (traceback above)" in done.stderr
        assert "DISTCOMM_ABORT_ON_EXCEPTION=0" in done.stderr


def _plain_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("DISTCOMM_")}


def test_the_timeout_policy_reads_the_environment() -> None:
    assert aborts.on_timeout({}) == "raise"
    assert aborts.on_timeout({"DISTCOMM_ON_TIMEOUT": " Abort "}) == "abort"
    assert aborts.abort_on_exception({}) is True
    assert aborts.abort_on_exception({"DISTCOMM_ABORT_ON_EXCEPTION": "0"}) is False


# -- last words ------------------------------------------------------------------------------------
LAST_WORDS = """
from distcomm.backend import aborts
if {notice}:
    aborts.set_abort_notice(lambda: print("OTHERS TOLD", flush=True))
aborts.set_job_abort(lambda: print("JOB ABORTED", flush=True))
if {words}:
    aborts.add_last_words(lambda: 1 / 0)  # a failing one does not keep the job from ending
    aborts.add_last_words(lambda: print("LAST WORDS", flush=True))
aborts.abort_job("distcomm: the reason")
"""


@pytest.mark.parametrize(
    ("words", "notice", "said"),
    [
        (True, True, "LAST WORDS\nOTHERS TOLD\nJOB ABORTED\n"),
        (True, False, "LAST WORDS\nJOB ABORTED\n"),
        (False, True, "JOB ABORTED\n"),  # nothing to write anywhere: the job ends at once
    ],
)
def test_an_abort_runs_the_last_words_then_tells_the_others(
    words: bool, notice: bool, said: str
) -> None:
    code = textwrap.dedent(LAST_WORDS.format(words=words, notice=notice))
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=_plain_env()
    )
    assert done.returncode == 1 and done.stderr == "distcomm: the reason\n", done.stderr
    assert done.stdout == said
