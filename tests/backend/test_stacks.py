"""Tests of distcomm.backend.stacks: where a rank's thread is (what a timed-out rank shows of
the ranks that had not arrived) and how the answers of several ranks are written. The answers
travelling out of band on each backend: tests/processes/test_straggler_stacks.py, the torch
backend's test_torch_progress.py and the mpi suite."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kit_engines import Idle, over

import distcomm
from distcomm.backend import stacks
from distcomm.backend.communicator import BaseCommunicator
from distcomm.backend.work import EngineWork
from distcomm.environment import LaunchInfo
from distcomm.errors import DistTimeoutError
from distcomm.testing import run_threads


@pytest.fixture
def parked() -> Iterator[threading.Thread]:
    """A thread asleep in ``park_here``, released at the end of the test."""
    release = threading.Event()

    def park_here() -> None:
        release.wait(30)

    thread = threading.Thread(target=park_here, daemon=True)
    thread.start()
    yield thread
    release.set()
    thread.join(30)


def test_a_thread_shows_the_function_it_sleeps_in_and_the_line(parked: threading.Thread) -> None:
    text = stacks.where(thread=parked.ident)
    assert text.rstrip().endswith("release.wait(30)"), text
    assert "in park_here\n" in text
    assert "threading.py" not in text, "threading's bootstrap and Event.wait are not the program"


def test_without_arguments_it_is_the_main_thread() -> None:
    assert "in test_without_arguments_it_is_the_main_thread\n" in stacks.where()


def test_a_communicator_shows_the_thread_that_made_it(parked: threading.Thread) -> None:
    made: list[Any] = []

    def make() -> None:
        made.append(probed(Probe()))

    maker = threading.Thread(target=make)
    maker.start()
    maker.join()
    assert "thread has ended" in stacks.where(made[0])
    assert "in test_a_communicator_shows_the_thread_that_made_it" in stacks.where(probed(Probe()))


def test_a_thread_that_ended_says_so() -> None:
    done = threading.Thread(target=lambda: None)
    done.start()
    done.join()
    assert stacks.where(thread=done.ident).strip() == ("(no Python frame: the thread has ended)")


def test_a_call_into_distcomm_shows_as_its_first_frame() -> None:
    """A rank blocked in a collective: the program's line and the public call, not the
    fabric's wait loop; nor the runner (run_threads) around the program."""

    def rank() -> str:
        if distcomm.get_rank() == 1:
            for _ in range(200):  # until rank 0 is inside the barrier
                if not peer:  # rank 0 has not started yet
                    threading.Event().wait(0.01)
                    continue
                text = stacks.where(thread=peer[0])
                if "in barrier" in text:
                    distcomm.barrier()
                    return text
                threading.Event().wait(0.01)
            distcomm.barrier()
            return text
        peer.append(threading.get_ident())
        distcomm.barrier()
        return ""

    peer: list[int] = []
    text = run_threads(rank, 2, timeout=30)[1]
    lines = text.rstrip().splitlines()
    assert lines[-2].endswith("in barrier") and "collectives.py" in lines[-2], text
    assert lines[-3].strip() == "distcomm.barrier()", text
    assert "fabric" not in text and "testing/threads.py" not in text, text


def test_a_deep_stack_shows_its_innermost_frames() -> None:
    def down(n: int) -> str:
        return down(n - 1) if n else stacks.where()

    text = down(3 * stacks.MAX_FRAMES)
    repeated = sum(int(n) for n in re.findall(r"Previous line repeated (\d+) more times", text))
    assert text.count('  File "') + repeated == stacks.MAX_FRAMES, text
    assert re.fullmatch(r"  \.\.\. \d+ outer frame\(s\) not shown", text.splitlines()[0]), text
    assert text.rstrip().endswith("[Previous line repeated 9 more times]"), text


def test_a_stack_is_cut_to_the_longest_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stacks, "MAX_TEXT", 300)
    text = stacks.where()
    assert len(text) <= 300 and text.startswith("  ...\n")
    assert text.rstrip().endswith("text = stacks.where()"), "the innermost end is kept"


def test_identical_stacks_are_shown_once_and_silent_ranks_are_named() -> None:
    a, b = '  File "x.py", line 1, in f\n    f()\n', '  File "y.py", line 2, in g\n    g()\n'
    text = stacks.describe({1: a, 3: a, 4: b}, [1, 3, 4, 5, 6])
    assert text.splitlines() == [
        "Where the ranks that had not arrived are (Python stacks, innermost call last):",
        "  ranks 1, 3:",
        '    File "x.py", line 1, in f',
        "      f()",
        "  rank 4:",
        '    File "y.py", line 2, in g',
        "      g()",
        "  ranks 5, 6: no answer (the process is gone, or native code holds its Python "
        "interpreter)",
    ]
    assert stacks.describe({}, [2], "Where").splitlines() == [
        "Where (Python stacks, innermost call last):",
        "  rank 2: no answer (the process is gone, or native code holds its Python interpreter)",
    ]
    assert stacks.describe({1: a}, []) == ""


# -- in a timeout error ----------------------------------------------------------------------------
LAUNCH = LaunchInfo("env", 0, 2, 0, 2, 0, 1)


class Probe(Idle):
    """The engine of a 2-rank backend whose rank 1 never arrives and whose ``peer_stacks`` the
    test sets (``answer``: what it returns, or an exception it raises)."""

    def __init__(self, answer: Any = None) -> None:
        self.answer = answer

    def bind(self, comm: BaseCommunicator) -> None:
        self.comm = comm

    def barrier(self, async_op: bool) -> Any:
        return EngineWork(self.comm, Never())

    def peer_progress(self) -> dict[int, int]:
        return {1: 0}

    def peer_stacks(self, ranks: list[int]) -> Any:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


class Never:
    """A request that never completes."""

    def test(self) -> bool:
        return False


def probed(engine: Probe) -> BaseCommunicator:
    """Rank 0 of 2 over ``engine``, with a timeout of 0.05 s and no mismatch check."""
    comm = over(engine, backend="probe", launch=LAUNCH, timeout=0.05)
    comm.debug = "off"
    return comm


def timed_out(answer: Any) -> DistTimeoutError:
    with pytest.raises(DistTimeoutError) as info:
        probed(Probe(answer)).barrier()
    return info.value


def test_the_timeout_error_shows_the_answers_between_its_sentence_and_its_hint() -> None:
    error = timed_out({1: '  File "train.py", line 9, in load\n    sleep(60)\n', 7: "not asked"})
    assert error.stacks == {1: '  File "train.py", line 9, in load\n    sleep(60)\n'}
    lines = str(error).splitlines()
    assert lines[0].endswith("ranks that had not arrived: [1] (rank 1 has run no collective).")
    assert lines[1:5] == [
        "Where the ranks that had not arrived are (Python stacks, innermost call last):",
        "  rank 1:",
        '    File "train.py", line 9, in load',
        "      sleep(60)",
    ]
    assert lines[5].startswith("HINT: a rank is stuck")


def test_a_backend_that_cannot_ask_shows_no_stacks() -> None:
    error = timed_out(None)
    assert error.stacks == {} and "Where" not in str(error) and "\n" not in str(error)


def test_a_failed_question_is_said_never_guessed() -> None:
    error = timed_out(OSError("side channel closed"))
    assert error.stacks == {}
    assert "The stacks of the ranks that had not arrived are unknown (side channel closed)." in (
        str(error)
    )
    assert error.missing_ranks == (1,)


def test_a_rank_that_did_not_answer_is_named() -> None:
    error = timed_out({})
    assert "  rank 1: no answer" in str(error) and error.stacks == {}


def test_no_stacks_when_every_rank_had_arrived_and_no_claim_that_all_is_well() -> None:
    class Arrived(Probe):
        def peer_progress(self) -> dict[int, int]:
            return {1: 1}

    asked: list[list[int]] = []

    class Asked(Arrived):
        def peer_stacks(self, ranks: list[int]) -> Any:
            asked.append(ranks)  # for the histories (a mismatch); no stack is shown
            return {1: '  File "train.py", line 9, in step\n    barrier()\n'}

    with pytest.raises(DistTimeoutError) as info:
        probed(Asked()).barrier()
    message = str(info.value)
    assert asked == [[1]] and info.value.stacks == {} and "Where" not in message
    assert (
        "every rank had reached operation #1, yet it did not complete: the ranks called "
        "different collectives there, or the engine failed" in message
    ), message
    assert "had arrived" not in message
