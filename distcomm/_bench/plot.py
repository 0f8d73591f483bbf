"""``distcomm bench --plot FILE.png``: time per call and bus bandwidth against size (log axes),
one line per operation and engine, drawn from the records (the same as ``--json``'s). barrier,
which has no size, is a horizontal line across the time panel (a floor the others' small
messages can be read against) and is absent from the bandwidth panel."""

from __future__ import annotations

from typing import Any

from distcomm.errors import DistcommError

__all__ = ["plot", "require_matplotlib"]


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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    from distcomm._measures import human_bytes

    sizes_as_text = FuncFormatter(lambda value, _: human_bytes(int(value)) if value >= 1 else "")

    lines: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for record in records:
        lines.setdefault((record["op"], record["engine"]), []).append(record)
    figure, (times, bandwidth) = plt.subplots(1, 2, figsize=(13, 5.5))
    colors = plt.get_cmap("tab10")
    ops = list(dict.fromkeys(op for op, _ in lines))
    for (op, engine), points in lines.items():
        points.sort(key=lambda r: r["bytes"])
        style = {
            "color": colors(ops.index(op) % 10),
            "linestyle": "-" if engine == "distcomm" else "--",
            "label": f"{op} ({engine})",
        }
        if points[0]["busbw_GBps"] is None:  # barrier: no size, no bandwidth
            style["label"] = f"{op} ({engine}; no size)"
            times.axhline(points[0]["time_s"] * 1e6, linewidth=1, **style)
            continue
        style["marker"] = "o" if engine == "distcomm" else "x"
        sizes = [r["bytes"] for r in points]
        times.plot(sizes, [r["time_s"] * 1e6 for r in points], **style)
        bandwidth.plot(sizes, [max(r["busbw_GBps"], 1e-6) for r in points], **style)
    if all(r["busbw_GBps"] is None for r in records):  # barrier alone: no size to span
        times.set_xlim(1, 2**10)
        bandwidth.set_xlim(1, 2**10)
        bandwidth.set_ylim(1e-3, 1)
        bandwidth.text(32, 0.03, "barrier moves no data: no bandwidth", ha="center")
    for axes, label in ((times, "time per call (us)"), (bandwidth, "bus bandwidth (GB/s)")):
        axes.set_xscale("log", base=2)
        axes.xaxis.set_major_formatter(sizes_as_text)
        axes.set_yscale("log")
        axes.set_xlabel("message size")
        axes.set_ylabel(label)
        axes.grid(True, which="both", alpha=0.3)
    times.legend(fontsize=8)
    figure.suptitle(
        f"distcomm bench: {header['backend']}, {header['world_size']} rank(s), "
        f"{header['device']}, launcher {header['launcher']} (dashed: the engine's own call)"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
