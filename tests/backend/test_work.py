"""Tests of distcomm.backend.work: a Work's finishing step and the buffers it owns."""

from __future__ import annotations

import gc
import weakref

import numpy as np

from distcomm.backend.work import CompletedWork, EngineWork


class _Pending:
    """An engine's request that finishes when the test says so."""

    engine_done = False

    def test(self) -> bool:
        return self.engine_done


def test_work_finishes_once_and_only_with_the_result_in_place() -> None:
    finished: list[object] = []
    request = _Pending()
    work = EngineWork(None, request, op="all_reduce", seq=3)
    work.then(lambda: finished.append(True))
    assert not work.is_completed() and not finished
    request.engine_done = True
    assert work.is_completed() and finished == [True]
    assert work.wait() and finished == [True], "the finish step runs once"
    done = CompletedWork()
    done.then(lambda: finished.append("now"))
    assert done.is_completed() and finished == [True, "now"], "a done Work finishes at once"


def test_work_owns_its_buffers_until_complete_then_lets_go() -> None:
    buffer = np.ones(4)
    ref = weakref.ref(buffer)
    request = _Pending()
    work = EngineWork(None, request, buffer, op="broadcast", seq=1)
    del buffer
    gc.collect()
    assert ref() is not None, "a pending Work keeps what the engine may still write"
    request.engine_done = True
    assert work.wait()
    gc.collect()
    assert ref() is None, "a completed Work lets its buffers go"
