"""``distcomm bench --plot FILE.png``: time per call and bus bandwidth against size (log axes),
one line per operation and engine, drawn from the records (the same as ``--json``'s). barrier,
which has no size, is a horizontal line across the time panel (a floor the others' small
messages can be read against) and is absent from the bandwidth panel.

Each operation has a colour of its own (and object collectives a square marker), the same in
every plot; the engine's own call (``--compare raw``) is the dashed line with hollow markers.
One legend, below both panels, names the operations and the two line styles."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from distcomm._bench.operations import OPERATIONS
from distcomm.errors import DistcommError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["draw", "plot", "require_matplotlib"]

#: tab20's strong colours, then its light ones: one colour per operation (14), by its place in
#: OPERATIONS, so that an operation reads alike in every plot.
_PALETTE = [*range(0, 20, 2), *range(1, 20, 2)]
#: The engine's line style and marker fill: distcomm's calls solid, the engine's own dashed.
_ENGINE_STYLES: dict[str, tuple[Any, Any]] = {"distcomm": ("-", "full"), "raw": ("--", "none")}
_ENGINE_LABELS = {"distcomm": "distcomm's call", "raw": "the engine's own call"}


def require_matplotlib() -> None:
    """Raise a clear error, before any communication, when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        from distcomm._plugins.names import extra_hint

        raise DistcommError(
            "distcomm bench --plot needs matplotlib, which is not installed. HINT: "
            f"{extra_hint('bench')}, or drop --plot (--json FILE keeps the numbers)."
        ) from exc


def plot(path: str, header: dict[str, Any], records: list[dict[str, Any]]) -> None:
    """Draw ``records`` to ``path`` (a PNG)."""
    draw(header, records).savefig(path, dpi=110)


def _op_style(op: str) -> dict[str, Any]:
    """The colour and marker of ``op``, whatever the other operations of the run."""
    from matplotlib import colormaps

    names = list(OPERATIONS)
    place = names.index(op) if op in names else len(names)
    marker = "s" if op in OPERATIONS and OPERATIONS[op].kind == "object" else "o"
    return {"color": colormaps["tab20"](_PALETTE[place % len(_PALETTE)]), "marker": marker}


def draw(header: dict[str, Any], records: list[dict[str, Any]]) -> Figure:
    """The figure of ``records`` (not attached to pyplot: nothing global, nothing to close)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    lines: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for record in records:
        lines.setdefault((record["op"], record["engine"]), []).append(record)
    figure = Figure(figsize=(13, 6.5))
    canvas: Any = FigureCanvasAgg(figure)  # figure.canvas: draws the PNG, measures the legend
    times, bandwidth = figure.subplots(1, 2)
    for (op, engine), points in lines.items():
        points.sort(key=lambda r: r["bytes"])
        linestyle, fill = _ENGINE_STYLES.get(engine, (":", "full"))
        style = {**_op_style(op), "linestyle": linestyle, "fillstyle": fill}
        style["label"] = f"{op} ({engine})"
        if points[0]["busbw_GBps"] is None:  # barrier: no size, no bandwidth
            del style["marker"], style["fillstyle"]
            times.axhline(points[0]["time_s"] * 1e6, linewidth=1, **style)
            continue
        sizes = [r["bytes"] for r in points]
        times.plot(sizes, [r["time_s"] * 1e6 for r in points], **style)
        bandwidth.plot(sizes, [max(r["busbw_GBps"], 1e-6) for r in points], **style)
    if all(r["busbw_GBps"] is None for r in records):  # barrier alone: no size to span
        times.set_xlim(1, 2**10)
        bandwidth.set_xlim(1, 2**10)
        bandwidth.set_ylim(1e-3, 1)
        bandwidth.text(32, 0.03, "barrier moves no data: no bandwidth", ha="center")
    _label_axes(times, bandwidth)
    handles = [_op_handle(op, records) for op in dict.fromkeys(op for op, _ in lines)]
    engines = list(dict.fromkeys(engine for _, engine in lines))
    if len(engines) > 1:
        for engine in engines:
            linestyle, fill = _ENGINE_STYLES.get(engine, (":", "full"))
            handles.append(
                Line2D(
                    [],
                    [],
                    color="0.3",
                    marker="o",
                    linestyle=linestyle,
                    fillstyle=fill,
                    label=_ENGINE_LABELS.get(engine, engine),
                )
            )
    figure.suptitle(
        f"distcomm bench: {header['backend']}, {header['world_size']} rank(s), "
        f"{header['device']}, launcher {header['launcher']}"
    )
    _legend_below(figure, handles, canvas.get_renderer())
    return figure


def _op_handle(op: str, records: list[dict[str, Any]]) -> Any:
    """The legend's entry for ``op``: its colour and marker (a level line for barrier)."""
    from matplotlib.lines import Line2D

    style = _op_style(op)
    if all(r["busbw_GBps"] is None for r in records if r["op"] == op):
        return Line2D([], [], color=style["color"], label=f"{op} (no size: a level)")
    return Line2D([], [], label=op, **style)


def _label_axes(times: Any, bandwidth: Any) -> None:
    from matplotlib.ticker import FuncFormatter

    from distcomm._measures import human_bytes

    sizes_as_text = FuncFormatter(lambda value, _: human_bytes(int(value)) if value >= 1 else "")
    for axes, label in ((times, "time per call (us)"), (bandwidth, "bus bandwidth (GB/s)")):
        axes.set_xscale("log", base=2)
        axes.xaxis.set_major_formatter(sizes_as_text)
        axes.set_yscale("log")
        axes.set_xlabel("message size")
        axes.set_ylabel(label)
        axes.grid(True, which="both", alpha=0.3)


def _legend_below(figure: Figure, handles: list[Any], renderer: Any) -> None:
    """One legend across the bottom of ``figure``, the panels laid out in the room above it."""
    legend = figure.legend(
        handles=handles,
        loc="lower center",
        ncol=min(len(handles), 6),
        fontsize=8,
        bbox_to_anchor=(0.5, 0.01),
        frameon=False,
    )
    height = legend.get_window_extent(renderer).height / figure.bbox.height
    figure.tight_layout(rect=(0, height + 0.02, 1, 1))
