"""Tests of distcomm.backend.monitor: the thread that ticks watched communicators."""

from __future__ import annotations

import threading
import time

from distcomm.backend import monitor


def test_the_monitor_survives_a_failing_tick_and_stops_ticking_when_asked() -> None:
    ticks: list[float] = []

    class Watched:
        monitor_interval = 0.02

        def monitor_tick(self, now: float) -> None:
            ticks.append(now)
            if len(ticks) == 1:
                raise RuntimeError("a bad tick")

    watched = Watched()
    monitor.watch(watched)
    try:
        deadline = time.monotonic() + 5
        while len(ticks) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(ticks) >= 3, "the thread stopped after a failing tick"
    finally:
        monitor.unwatch(watched)
    seen = len(ticks)
    time.sleep(0.2)
    assert len(ticks) <= seen + 1


def test_the_exit_stops_and_joins_helpers_and_waits_no_longer_than_its_limit() -> None:
    """At exit (``monitor.stop``) a helper that looks at ``stopping()`` ends and is joined; one
    stuck in an engine's call holds the exit a few seconds at most (``_JOIN_LIMIT``)."""
    steps: list[int] = []
    stuck = threading.Event()

    def polite() -> None:
        while not monitor.stopping():
            steps.append(1)
            time.sleep(0.01)

    saved = monitor._JOIN_LIMIT
    monitor._JOIN_LIMIT = 0.5
    try:
        first = monitor.helper(polite, "distcomm-test-polite")
        second = monitor.helper(lambda: stuck.wait(30), "distcomm-test-stuck")
        assert first.daemon and second.daemon
        time.sleep(0.1)
        start = time.monotonic()
        monitor.stop()
        waited = time.monotonic() - start
        assert not first.is_alive(), "a helper that looks at stopping() outlived the exit"
        assert second.is_alive() and 0.4 < waited < 2.0, f"the exit waited {waited:.2f} s"
    finally:
        monitor._JOIN_LIMIT = saved
        monitor._stopping.clear()  # this test process goes on
        stuck.set()
        second.join(10)
