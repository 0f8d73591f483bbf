"""``distcomm bench``: its options, and real runs under distcomm run, mpirun and torchrun (srun:
tests/launchers/test_slurm.py) whose JSON and PNG are checked (tests/support/bench_records.py for
the collectives; barrier and sendrecv, which that file does not know, here)."""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from bench_records import check_bench_json, check_png
from jobs import find_mpirun, run_job

from distcomm._bench.operations import OPERATIONS
from distcomm._bench.options import parse_ops, parse_size, parse_sizes
from distcomm.cli import main

OPS = ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all"]
OPS += ["gather", "scatter"]
OBJECT_OPS = ["all_gather_object", "broadcast_object", "gather_object", "scatter_object"]
#: barrier (one record, no size, no bandwidth) and sendrecv (a ping-pong, per message)
SYNC_OPS = ["barrier", "sendrecv"]
SIZES = [8, 65536]
QUICK = ["--sizes", "8,64K", "--iters", "3", "--warmup", "1", "--rounds", "2"]


def bench_command(out: Path, ops: list[str], *extra: str) -> list[str]:
    return [
        "bench",
        "--ops",
        ",".join(ops),
        *QUICK,
        "--json",
        str(out / "bench.json"),
        *extra,
    ]


def native_ops(doc_backend: str) -> set[str]:
    """The bench ops that the backend runs natively (those --compare raw can compare), from its
    capabilities, as distcomm info reports the backend."""
    from distcomm._plugins.loader import get_registry

    ops = get_registry().backends[doc_backend].capabilities.ops
    return {name for name, op in OPERATIONS.items() if op.capability in ops}


def split_sync_ops(path: Path) -> tuple[Path, dict[str, Any], list[dict[str, Any]]]:
    """bench.json's barrier and sendrecv records, taken out: the document with the others is
    written to collectives.json beside it (for check_bench_json). Returns (that file, the whole
    document, the records taken out)."""
    doc = json.loads(path.read_text())
    mine = [r for r in doc["records"] if r["op"] in SYNC_OPS]
    rest = {**doc, "records": [r for r in doc["records"] if r["op"] not in SYNC_OPS]}
    out = path.with_name("collectives.json")
    out.write_text(json.dumps(rest))
    return out, doc, mine


def check_sync_records(
    doc: dict[str, Any], records: list[dict[str, Any]], sizes: list[int], ops: list[str]
) -> set[str]:
    """barrier: one record per engine, size 0, bytes 0, no bandwidth; sendrecv: one per size
    and engine, bytes = size, busbw = algbw (factor 1); sane times (0 < min <= median <= max <
    1 s per call). With --compare raw, each op has a raw record or is in the header's
    ``no_raw_call``, not both. Returns the ops that had a raw call."""
    raw = {r["op"] for r in records if r["engine"] == "raw"}
    if "no_raw_call" in doc:
        assert raw.isdisjoint(doc["no_raw_call"]) and raw | set(doc["no_raw_call"]) >= set(ops)
    want = {("barrier", 0, "distcomm")} if "barrier" in ops else set()
    want |= {("sendrecv", size, "distcomm") for size in sizes if "sendrecv" in ops}
    want |= {(op, size, "raw") for op, size, _ in want if op in raw}
    assert {(r["op"], r["size"], r["engine"]) for r in records} == want
    for r in records:
        what = f"{r['op']} {r['size']} {r['engine']}"
        assert 0 < r["time_min_s"] <= r["time_s"] <= r["time_max_s"] < 1.0, what
        assert r["iters"] >= 1 and r["world_size"] == doc["world_size"], what
        if r["op"] == "barrier":
            assert r["bytes"] == 0 and r["algbw_GBps"] is None and r["busbw_GBps"] is None, what
            assert r["busbw_factor"] is None, what
        else:
            assert r["bytes"] == r["size"] and r["busbw_factor"] == 1.0, what
            assert math.isclose(r["algbw_GBps"], r["bytes"] / r["time_s"] / 1e9), what
            assert r["busbw_GBps"] == r["algbw_GBps"], what
    return raw


def check_sync_table(lines: list[str], no_raw: list[str]) -> None:
    """barrier's row shows size -, no bandwidth; an op without an engine call gets raw n/a."""
    rows = [line.split() for line in lines]
    rows = [row[2:] if row[:2] == ["[rank", "0]"] else row for row in rows]
    assert any(row[:3] == ["barrier", "-", "distcomm"] and row[-2:] == ["-", "-"] for row in rows)
    for op in no_raw:
        assert any(row[0] == op and "raw" in row and "n/a" in row for row in rows if row), op


@pytest.mark.parametrize(
    ("text", "sizes"),
    [
        ("8", [8]),
        ("8,64K,1M", [8, 65536, 2**20]),
        ("1m,8b,64KiB", [8, 65536, 2**20]),
        ("8:64", [8, 16, 32, 64]),
        ("8:100:4", [8, 32, 100]),
        ("8:64M:8", [8, 64, 512, 4096, 32768, 2**18, 2**21, 2**24, 2**26]),
    ],
)
def test_sizes_are_lists_or_ranges(text: str, sizes: list[int]) -> None:
    assert parse_sizes(text) == sizes


BAD_SIZES = ["0", "-8", "8X", "1.5M", "", "8:4", "8:64:1", "8:64:x", "1:2:3:4"]


@pytest.mark.parametrize("text", BAD_SIZES)
def test_a_bad_size_names_the_value_and_the_forms(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as error:
        parse_sizes(text)
    assert repr(text) in str(error.value) and "HINT" in str(error.value)


def test_ops_are_checked_against_the_table() -> None:
    assert parse_ops("all") == list(OPERATIONS)
    assert {*OPS, *OBJECT_OPS, *SYNC_OPS} == set(OPERATIONS), "every op is run by a test here"
    assert parse_ops("barrier") == ["barrier"] and parse_ops("sendrecv,barrier")[0] == "sendrecv"
    assert parse_ops("broadcast, all_reduce,broadcast") == ["broadcast", "all_reduce"]
    with pytest.raises(argparse.ArgumentTypeError, match=r"allreduce.*valid: all_reduce"):
        parse_ops("allreduce")
    assert parse_size("2G") == 2**31


def test_bad_options_exit_2_before_any_launch(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["bench", "--ops", "all_reduse"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "all_reduse" in err and "all_gather_object" in err and "HINT" in err
    assert "barrier" in err and "sendrecv" in err


def test_the_help_says_what_barrier_and_sendrecv_measure(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "barrier has no size" in out and "half a round trip" in out


class StubComm:
    """A world of 2 seen from rank 0, on a clock that each call moves: barrier 3 ms, send and
    recv 1 ms each. No engine call (``_native_call`` None)."""

    rank, backend, devices = 0, "stub", frozenset({"cpu"})

    def __init__(self, world_size: int = 2, p2p: bool = True) -> None:
        from distcomm.backend import Capabilities

        self.world_size, self.clock = world_size, 0.0
        self.capabilities = Capabilities(p2p=p2p)

    def barrier(self) -> None:
        self.clock += 0.003

    def send(self, x: Any, dst: int) -> None:
        assert dst == 1
        self.clock += 0.001

    def recv(self, x: Any, src: int) -> int:
        assert src == 1
        self.clock += 0.001
        return src

    def all_reduce(self, x: float, op: str) -> float:
        return x

    def all_gather_object(self, obj: Any) -> list[Any]:
        return [obj] * self.world_size

    def _native_call(self, op: str, args: tuple[Any, ...]) -> None:
        return None


def measure_on_stub(
    monkeypatch: pytest.MonkeyPatch, comm: StubComm, ops: list[str]
) -> tuple[list[dict[str, Any]], list[str]]:
    from types import SimpleNamespace

    from distcomm._bench import runner

    monkeypatch.setattr(runner, "device_clock", SimpleNamespace(now=lambda device: comm.clock))
    args = argparse.Namespace(ops=ops, sizes=[8, 64], iters=4, warmup=1, rounds=3)
    args.__dict__.update(compare="raw", device="cpu", quiet=True)
    return runner._measure(comm, args)


def test_barrier_is_one_call_and_sendrecv_half_a_round_trip(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """barrier: one record whatever --sizes says, its time per barrier; sendrecv: a round trip
    (send 1 ms + recv 1 ms on rank 0) counts as 2 messages, 1 ms each. Neither has an engine
    call here: both are listed for the table's raw n/a."""
    records, no_raw = measure_on_stub(monkeypatch, StubComm(), ["barrier", "sendrecv"])
    assert no_raw == ["barrier", "sendrecv"]
    assert [(r["op"], r["size"], r["bytes"]) for r in records] == [
        ("barrier", 0, 0),
        ("sendrecv", 8, 8),
        ("sendrecv", 64, 64),
    ]
    for r in records:
        expected = 0.003 if r["op"] == "barrier" else 0.001
        assert math.isclose(r["time_s"], expected) and r["iters"] == 4, r
    assert records[0]["algbw_GBps"] is None and records[0]["busbw_GBps"] is None
    assert math.isclose(records[2]["algbw_GBps"], 64 / 0.001 / 1e9)


@pytest.mark.parametrize(("world_size", "p2p"), [(1, True), (2, False)])
def test_sendrecv_is_left_out_without_a_pair_or_p2p(
    monkeypatch: pytest.MonkeyPatch, world_size: int, p2p: bool
) -> None:
    records, _ = measure_on_stub(monkeypatch, StubComm(world_size, p2p), ["sendrecv", "barrier"])
    assert [r["op"] for r in records] == ["barrier"]


def test_the_table_shows_no_size_for_barrier_and_raw_n_a(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from distcomm._bench.report import print_table

    times = {"time_s": 2e-5, "time_min_s": 1e-5, "time_max_s": 3e-5, "iters": 9}
    common = {"engine": "distcomm", "backend": "stub", "world_size": 2, **times}
    barrier = {"op": "barrier", "size": 0, "bytes": 0, "algbw_GBps": None, "busbw_GBps": None}
    p2p = {"op": "sendrecv", "size": 8, "bytes": 8, "algbw_GBps": 4e-4, "busbw_GBps": 4e-4}
    print_table([{**common, **barrier}, {**common, **p2p}], ["barrier", "sendrecv"])
    lines = capsys.readouterr().out.splitlines()
    check_sync_table(lines, ["barrier", "sendrecv"])
    assert any(line.split()[:3] == ["sendrecv", "8", "B"] for line in lines)
    assert any("half a ping-pong round trip" in line for line in lines)


def test_plot_without_matplotlib_fails_at_once_with_a_hint(tmp_path: Path) -> None:
    """A matplotlib that cannot be imported (shadowed here): every rank stops before any
    communication, saying how to install it."""
    fake = tmp_path / "shadow" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    env_path = os.pathsep.join([str(fake.parent), os.environ.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "distcomm", "bench", "--plot", str(tmp_path / "x.png")]
    done = run_job(["env", f"PYTHONPATH={env_path}", *command], timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    from distcomm._plugins.names import checkout

    # from this checkout, its path with the extra (tests/test_install_hints.py: both ways)
    assert f"HINT: pip install '{checkout()}[bench]'" in done.stderr or (
        "HINT: pip install '.[bench]'" in done.stderr
    ), done.stderr
    assert not (tmp_path / "x.png").exists()


def test_device_cuda_without_a_gpu_says_so(tmp_path: Path) -> None:
    """On a machine without CUDA, --device cuda stops at once with a hint; with one, it runs."""
    import torch

    command = [sys.executable, "-m", "distcomm", *bench_command(tmp_path, ["all_reduce"])]
    done = run_job([*command, "--device", "cuda"], timeout=120)
    if torch.cuda.is_available():
        assert done.returncode == 0, done.stdout + done.stderr
        check_bench_json(tmp_path / "bench.json", ["all_reduce"], SIZES, 1, set())
    else:
        assert done.returncode == 1, done.stdout + done.stderr
        assert "--device cuda: no CUDA device" in done.stderr and "HINT" in done.stderr
        assert "Traceback" not in done.stderr


def test_an_output_in_a_missing_folder_fails_before_the_run(tmp_path: Path) -> None:
    out = tmp_path / "no-such-folder" / "bench.json"
    command = [sys.executable, "-m", "distcomm", "bench", "--json", str(out)]
    done = run_job(command, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"--json {str(out)!r}: the folder" in done.stderr and "HINT" in done.stderr
    assert "op " not in done.stdout, "nothing was measured"


def test_a_world_of_one_runs_without_a_launcher(tmp_path: Path) -> None:
    """fakelink, a world of 1: barrier runs; sendrecv, which needs ranks 0 and 1, is left out
    with a note."""
    ops = ["all_reduce", *SYNC_OPS, *OBJECT_OPS]
    done = run_job([sys.executable, "-m", "distcomm", *bench_command(tmp_path, ops)], timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "sendrecv skipped: a ping-pong between ranks 0 and 1; here a world of 1" in done.stderr
    collectives, doc, mine = split_sync_ops(tmp_path / "bench.json")
    check_bench_json(collectives, ["all_reduce", *OBJECT_OPS], SIZES, 1, set())
    check_sync_records(doc, mine, SIZES, ["barrier"])


def test_under_distcomm_run_on_gloo_with_raw_and_a_plot(tmp_path: Path) -> None:
    ops = OPS + SYNC_OPS + OBJECT_OPS
    command = [sys.executable, "-m", "distcomm", "run", "-n", "2", "--backend", "gloo", "-m"]
    command += ["distcomm", *bench_command(tmp_path, ops, "--compare", "raw")]
    plot = ["--plot", str(tmp_path / "bench.png")]
    # MPLCONFIGDIR: matplotlib would otherwise leave its font cache in ~/.cache/matplotlib
    done = run_job(["env", f"MPLCONFIGDIR={tmp_path / 'mpl'}", *command, *plot], timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    collectives, doc, mine = split_sync_ops(tmp_path / "bench.json")
    sized = OPS + OBJECT_OPS
    check_bench_json(collectives, sized, SIZES, 2, native_ops("gloo") - set(SYNC_OPS))
    check_sync_records(doc, mine, SIZES, SYNC_OPS)
    assert doc["backend"] == "gloo" and doc["launcher"] == "env"
    # one node: distcomm's rows went through node memory, the raw rows through Gloo
    assert doc["node_memory"] is True
    assert any("go through node memory" in line for line in done.stdout.splitlines())
    check_png(tmp_path / "bench.png")
    lines = (done.stdout + done.stderr).splitlines()
    steps = (len(sized) + 1) * len(SIZES) + 1  # sendrecv at each size, barrier once
    progress = [line for line in lines if f"/{steps}]" in line]
    assert len(progress) == steps, "one progress line per step, on rank 0"
    assert all(line.startswith("[rank 0]") for line in progress), progress
    assert sum("raw/distcomm" in line for line in lines) == 1, "one table, on rank 0"
    check_sync_table([line for line in lines if line.startswith("[rank 0]")], doc["no_raw_call"])


def test_a_plot_drawn_while_rank_1_waits_leaves_no_warning(tmp_path: Path) -> None:
    """Rank 1 waits in finalize while rank 0 draws the plot (about a second of matplotlib):
    rank 1's "where are you?" questions to rank 0 end before rank 0's store goes, so torch
    prints no warning of a closed connection (it printed a C++ traceback)."""
    command = [sys.executable, "-m", "distcomm", "run", "-n", "2", "--backend", "gloo", "-m"]
    command += ["distcomm", "bench", "--ops", "all_reduce,broadcast", "--sizes", "8,64K"]
    command += ["--rounds", "2", "--quiet", "--plot", str(tmp_path / "bench.png")]
    done = run_job(["env", f"MPLCONFIGDIR={tmp_path / 'mpl'}", *command], timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "recvValue failed" not in done.stderr, done.stderr[-3000:]
    check_png(tmp_path / "bench.png")


def test_under_mpirun_on_mpi(tmp_path: Path) -> None:
    mpirun = find_mpirun()
    assert mpirun is not None, "mpirun not found (pip install mpich)"
    ops = ["all_reduce", "reduce", "all_gather", "gather", "scatter", "all_gather_object"]
    ops += ["broadcast_object"]
    distcomm = shutil.which("distcomm", path=os.path.dirname(sys.executable))
    assert distcomm is not None
    argv = bench_command(tmp_path, [*ops, *SYNC_OPS], "--compare", "raw")
    done = run_job([mpirun, "-n", "2", distcomm, *argv], timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    collectives, doc, mine = split_sync_ops(tmp_path / "bench.json")
    check_bench_json(collectives, ops, SIZES, 2, native_ops("mpi") & set(ops))
    check_sync_records(doc, mine, SIZES, SYNC_OPS)
    check_sync_table(done.stdout.splitlines(), doc["no_raw_call"])
    assert doc["backend"] == "mpi" and doc["node_memory"] is False  # MPI's shared memory


def test_barrier_alone_under_mpirun_with_a_plot(tmp_path: Path) -> None:
    """--ops barrier alone: one record per engine whatever --sizes says, a table row of size -,
    and a plot of its time alone (no bandwidth)."""
    mpirun = find_mpirun()
    assert mpirun is not None, "mpirun not found (pip install mpich)"
    argv = bench_command(tmp_path, ["barrier"], "--compare", "raw")
    argv += ["--plot", str(tmp_path / "bench.png")]
    command = [mpirun, "-n", "2", sys.executable, "-m", "distcomm", *argv]
    done = run_job(["env", f"MPLCONFIGDIR={tmp_path / 'mpl'}", *command], timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads((tmp_path / "bench.json").read_text())
    check_sync_records(doc, doc["records"], SIZES, ["barrier"])
    check_sync_table(done.stdout.splitlines(), doc["no_raw_call"])
    assert "[1/1] barrier: distcomm" in done.stderr
    check_png(tmp_path / "bench.png")


def test_under_torchrun(tmp_path: Path) -> None:
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    assert torchrun is not None, "torchrun not found (it comes with torch)"
    ops = ["all_reduce", "all_gather_object"]
    command = [torchrun, "--nproc-per-node", "2", "-m", "distcomm", *bench_command(tmp_path, ops)]
    # TMPDIR: torchrun leaves a torchelastic_* folder in the temporary directory
    done = run_job(["env", f"TMPDIR={tmp_path}", *command], timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    check_bench_json(tmp_path / "bench.json", ops, SIZES, 2, set())


def bench_on(
    monkeypatch: pytest.MonkeyPatch, devices: set[str], *argv: str
) -> tuple[int, list[str]]:
    """Run bench in a world of 1 whose backend (fakelink, selected automatically) says it moves
    ``devices``; return its status and the device it measured on (the measuring is left out)."""
    from distcomm._bench import runner
    from distcomm.fakelink import FakeLinkEngine

    monkeypatch.setattr(FakeLinkEngine, "devices", frozenset(devices))
    seen: list[str] = []

    def measure(comm: Any, args: argparse.Namespace) -> tuple[list[Any], list[str]]:
        seen.append(args.device)
        return [], []

    monkeypatch.setattr(runner, "_measure", measure)
    return main(["bench", "--quiet", *argv]), seen


def test_the_default_device_follows_the_selected_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """A backend that moves CUDA tensors only (nccl) gets CUDA buffers, one that moves the CPU's
    gets CPU buffers; an explicit --device wins over the default. No GPU in CI: the selected
    backend's ``devices`` is set, and torch is told CUDA is available for --device cuda."""
    import torch

    assert bench_on(monkeypatch, {"cuda"}) == (0, ["cuda"])
    assert bench_on(monkeypatch, {"cpu"}) == (0, ["cpu"])
    assert bench_on(monkeypatch, {"cpu", "cuda"}) == (0, ["cpu"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert bench_on(monkeypatch, {"cpu", "cuda"}, "--device", "cuda") == (0, ["cuda"])


def test_a_device_the_backend_does_not_move_names_the_choices(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--device cpu on a CUDA-only backend stops before any measuring, naming the value, what
    the backend moves and a hint (it used to fail inside the first collective)."""
    import distcomm

    assert bench_on(monkeypatch, {"cuda"}, "--device", "cpu") == (1, [])
    err = capsys.readouterr().err
    assert "--device cpu: backend 'fakelink' moves cuda tensors only; valid here: cuda." in err
    assert "HINT: drop --device" in err
    assert not distcomm.is_initialized()


@pytest.mark.parametrize("op", ["all_reduce", "barrier"])
def test_cuda_buffers_are_timed_to_the_end_of_the_device_work(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, op: str
) -> None:
    """Each timed block waits for the GPU before reading the clock, once after its barrier and
    once after its last call: on a GPU that needs 1 s per block, 4 calls take 0.25 s each.
    barrier, which has no buffer, waits for the device of --device cuda too.
    No GPU in CI: bench's CUDA buffers are CPU tensors the arrays layer reports on cuda:0, and
    torch.cuda.synchronize is a fake GPU on a fake clock (tests/support/fake_gpu.py)."""
    import torch
    from fake_gpu import FakeGpu

    from distcomm._bench import operations

    gpu = FakeGpu(monkeypatch, work=1.0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(operations, "_torch_maker", lambda device: gpu.tensor)
    out = tmp_path / "bench.json"
    argv = ["--ops", op, "--sizes", "64", "--iters", "4", "--warmup", "1"]
    assert main(["bench", *argv, "--rounds", "2", "--device", "cuda", "--json", str(out)]) == 0
    (record,) = json.loads(out.read_text())["records"]
    assert (record["time_s"], record["time_min_s"], record["time_max_s"]) == (0.25, 0.25, 0.25)
    assert gpu.synchronised() == ["cuda:0"] * 2 * 3, "two per block: the warm-up and 2 rounds"


def test_the_sides_take_turns_to_go_first() -> None:
    """The side timed second finds the buffers in the caches the first warmed: each round the
    order reverses, so that neither side has that advantage in every round."""
    from distcomm._bench import runner

    class OneRank:
        def barrier(self) -> None:
            pass

        def all_gather_object(self, obj: Any) -> list[Any]:
            return [obj]

    order: list[str] = []
    sides = {"distcomm": lambda: order.append("distcomm"), "raw": lambda: order.append("raw")}
    args = argparse.Namespace(warmup=0, iters=1, rounds=4)
    calls, times = runner._time(OneRank(), sides, args, "cpu")
    assert calls == 1 and {name: len(t) for name, t in times.items()} == {"distcomm": 4, "raw": 4}
    assert order == ["distcomm", "raw", "raw", "distcomm"] * 2, f"the order was {order}"
