"""Tests of distcomm.backend.monitor: the thread that ticks watched communicators."""

from __future__ import annotations

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
