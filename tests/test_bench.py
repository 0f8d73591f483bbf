"""``distcomm bench``: its options, and real runs under distcomm run, mpirun and torchrun (srun:
tests/launchers/test_slurm.py) whose JSON and PNG are checked (tests/support/bench_records.py)."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

import pytest
from bench_records import check_bench_json, check_png
from jobs import find_mpirun, run_job

from distcomm._bench.operations import OPERATIONS
from distcomm._bench.options import parse_ops, parse_size, parse_sizes
from distcomm.cli import main

OPS = ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all"]
OPS += ["gather", "scatter"]
OBJECT_OPS = ["all_gather_object", "broadcast_object", "gather_object", "scatter_object"]
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
    assert "pip install 'distcomm[bench]'" in done.stderr
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
    done = run_job(
        [sys.executable, "-m", "distcomm", *bench_command(tmp_path, ["all_reduce", *OBJECT_OPS])],
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    check_bench_json(tmp_path / "bench.json", ["all_reduce", *OBJECT_OPS], SIZES, 1, set())


def test_under_distcomm_run_on_gloo_with_raw_and_a_plot(tmp_path: Path) -> None:
    ops = OPS + OBJECT_OPS
    command = [sys.executable, "-m", "distcomm", "run", "-n", "2", "--backend", "gloo", "-m"]
    command += ["distcomm", *bench_command(tmp_path, ops, "--compare", "raw")]
    plot = ["--plot", str(tmp_path / "bench.png")]
    # MPLCONFIGDIR: matplotlib would otherwise leave its font cache in ~/.cache/matplotlib
    done = run_job(["env", f"MPLCONFIGDIR={tmp_path / 'mpl'}", *command, *plot], timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = check_bench_json(tmp_path / "bench.json", ops, SIZES, 2, native_ops("gloo"))
    assert doc["backend"] == "gloo" and doc["launcher"] == "env"
    check_png(tmp_path / "bench.png")
    lines = (done.stdout + done.stderr).splitlines()
    progress = [line for line in lines if f"/{len(ops) * len(SIZES)}]" in line]
    assert len(progress) == len(ops) * len(SIZES), "one progress line per step, on rank 0"
    assert all(line.startswith("[rank 0]") for line in progress), progress
    assert sum("raw/distcomm" in line for line in lines) == 1, "one table, on rank 0"


def test_under_mpirun_on_mpi(tmp_path: Path) -> None:
    mpirun = find_mpirun()
    assert mpirun is not None, "mpirun not found (pip install mpich)"
    ops = ["all_reduce", "reduce", "all_gather", "gather", "scatter", "all_gather_object"]
    ops += ["broadcast_object"]
    distcomm = shutil.which("distcomm", path=os.path.dirname(sys.executable))
    assert distcomm is not None
    command = [mpirun, "-n", "2", distcomm, *bench_command(tmp_path, ops, "--compare", "raw")]
    done = run_job(command, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = check_bench_json(tmp_path / "bench.json", ops, SIZES, 2, native_ops("mpi") & set(ops))
    assert doc["backend"] == "mpi"


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
    from distcomm.fakelink import FakeLinkCommunicator

    monkeypatch.setattr(FakeLinkCommunicator, "devices", frozenset(devices))
    seen: list[str] = []
    monkeypatch.setattr(runner, "_measure", lambda comm, args: seen.append(args.device) or [])
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


def test_cuda_buffers_are_timed_to_the_end_of_the_device_work(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Each timed block waits for the GPU before reading the clock, once after its barrier and
    once after its last call: on a GPU that needs 1 s per block, 4 calls take 0.25 s each.
    No GPU in CI: bench's CUDA buffers are CPU tensors the arrays layer reports on cuda:0, and
    torch.cuda.synchronize is a fake GPU on a fake clock (tests/support/fake_gpu.py)."""
    import json

    import torch
    from fake_gpu import FakeGpu

    from distcomm._bench import operations

    gpu = FakeGpu(monkeypatch, work=1.0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(operations, "_torch_maker", lambda device: gpu.tensor)
    out = tmp_path / "bench.json"
    argv = ["--ops", "all_reduce", "--sizes", "64", "--iters", "4", "--warmup", "1"]
    assert main(["bench", *argv, "--rounds", "2", "--device", "cuda", "--json", str(out)]) == 0
    (record,) = json.loads(out.read_text())["records"]
    assert (record["time_s"], record["time_min_s"], record["time_max_s"]) == (0.25, 0.25, 0.25)
    assert gpu.synchronised() == ["cuda:0"] * 2 * 3, "two per block: the warm-up and 2 rounds"
