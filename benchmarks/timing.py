"""What every benchmark here shares: interleaved rounds after a warm-up, and how results print.

The scripts import it as ``timing`` (their own folder is first on ``sys.path`` when run as
``python benchmarks/X.py``, under ``distcomm run`` or under ``mpirun``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def interleaved(
    sides: dict[str, Callable[[], object]],
    calls: int,
    rounds: int,
    sync: Callable[[], object] = lambda: None,
) -> dict[str, list[float]]:
    """Seconds per call of each side, one sample per round, the sides taking turns each round.

    A warm-up of ``calls // 10`` calls per side comes first; ``sync`` (a barrier in multi-rank
    benchmarks) runs before every timed block so that ranks start together.
    """

    def per_call(fn: Callable[[], object], count: int) -> float:
        sync()
        start = time.perf_counter()
        for _ in range(count):
            fn()
        return (time.perf_counter() - start) / count

    for fn in sides.values():
        per_call(fn, max(1, calls // 10))
    samples: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(rounds):
        for name, fn in sides.items():
            samples[name].append(per_call(fn, calls))
    return samples


def cell(values: list[float], digits: int = 1) -> str:
    """``median (min-max) unit`` in microseconds or milliseconds."""
    scale, unit = (1e6, "us") if statistics.median(values) < 1e-2 else (1e3, "ms")
    low, mid, high = min(values) * scale, statistics.median(values) * scale, max(values) * scale
    return f"{mid:.{digits}f} ({low:.{digits}f}-{high:.{digits}f}) {unit}"


def ratio(ours: list[float], theirs: list[float]) -> str:
    """The median (min-max) of the per-round ratios ``ours / theirs``."""
    ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
    return f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})"


def comparison_table(results: dict[str, dict[str, dict[str, list[float]]]]) -> list[str]:
    """The lines of a table of ``results`` (engine -> case -> implementation -> per-round
    seconds): each implementation's time per call, and its ratio over distcomm's."""
    lines = [
        f"{'engine':<6} {'case':<26} {'implementation':<18} {'per call: median (min-max)':>30} "
        f"{'other / distcomm':>22}"
    ]
    for engine, by_case in results.items():
        for case, sides in by_case.items():
            ours = sides["distcomm"]
            for name, samples in sides.items():
                versus = "" if name == "distcomm" else ratio(samples, ours)
                lines.append(f"{engine:<6} {case:<26} {name:<18} {cell(samples):>30} {versus:>22}")
    return lines
