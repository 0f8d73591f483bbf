"""``distcomm bench --plot``'s figure, drawn from made-up records of all 14 operations and both
engines (``--compare raw``): a legend clear of both panels and whole inside the figure, and a
line style of its own for each operation and engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from bench_records import check_png

from distcomm._bench.operations import OPERATIONS

HEADER = {"backend": "gloo", "world_size": 2, "device": "cpu", "launcher": "env"}
SIZES = [8, 1024, 65536, 1 << 20]


@pytest.fixture(autouse=True)
def _matplotlib(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """matplotlib, with its font cache in the test's folder (not ~/.cache/matplotlib)."""
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path_factory.getbasetemp() / "matplotlib"))
    pytest.importorskip("matplotlib")


def records(engines: tuple[str, ...]) -> list[dict[str, Any]]:
    """Records like --json's, of every operation bench knows."""
    made = []
    for place, op in enumerate(OPERATIONS):
        for engine in engines:
            for size in [0] if op == "barrier" else SIZES:
                time_s = (1e-5 + size * 1e-9) * (1 + place / 10)
                busbw = None if op == "barrier" else size / time_s / 1e9
                made.append({"op": op, "engine": engine, "bytes": size, "size": size})
                made[-1].update(time_s=time_s, busbw_GBps=busbw)
    return made


@pytest.mark.parametrize("engines", [("distcomm",), ("distcomm", "raw")])
def test_the_legend_is_clear_of_the_panels_and_inside_the_figure(engines: tuple[str, ...]) -> None:
    from distcomm._bench.plot import draw

    figure = draw(HEADER, records(engines))
    renderer = figure.canvas.get_renderer()
    figure.canvas.draw()
    (legend,) = figure.legends
    box = legend.get_window_extent(renderer)
    whole = figure.bbox
    assert whole.x0 <= box.x0 and box.x1 <= whole.x1 and whole.y0 <= box.y0 and box.y1 <= whole.y1
    for axes in figure.axes:
        panel = axes.get_tightbbox(renderer)  # with its tick labels and axis labels
        assert not box.overlaps(panel), (box, panel)
    texts = [text.get_text() for text in legend.get_texts()]
    assert all(any(text.startswith(op) for text in texts) for op in OPERATIONS), texts
    for text in legend.get_texts():
        extent = text.get_window_extent(renderer)
        assert whole.x0 <= extent.x0 and extent.x1 <= whole.x1, f"{text.get_text()!r} is cut off"


def test_each_operation_and_engine_has_a_line_style_of_its_own() -> None:
    from matplotlib.colors import to_hex

    from distcomm._bench.plot import draw

    figure = draw(HEADER, records(("distcomm", "raw")))
    styles: dict[str, tuple[Any, ...]] = {}
    colours: dict[str, str] = {}
    for axes in figure.axes:
        for line in axes.get_lines():
            op = line.get_label().split(" (")[0]
            style = (to_hex(line.get_color()), line.get_linestyle(), line.get_marker())
            assert styles.setdefault(line.get_label(), style) == style, "alike in both panels"
            assert colours.setdefault(op, style[0]) == style[0], f"{op}: one colour"
    assert len(styles) == 2 * len(OPERATIONS)
    assert len(set(styles.values())) == len(styles), styles
    assert len(set(colours.values())) == len(OPERATIONS), colours


def test_the_plot_is_written_as_a_png(tmp_path: Path) -> None:
    from distcomm._bench.plot import plot

    plot(str(tmp_path / "bench.png"), HEADER, records(("distcomm", "raw")))
    check_png(tmp_path / "bench.png")
