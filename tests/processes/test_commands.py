"""What ``distcomm run`` starts as each rank (distcomm._processes.commands): scripts and modules
run with distcomm's Python; a command, a module name, a program or another Python interpreter
given as the script is refused before anything starts, with the command that was meant."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from distcomm._processes.commands import rank_argv
from distcomm.cli import main
from distcomm.errors import InvalidArgumentError

BIN = os.path.dirname(sys.executable)


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In an empty folder, with distcomm's Python and its commands first on PATH."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", os.pathsep.join([BIN, os.environ.get("PATH", "")]))
    (tmp_path / "train.py").write_text("print('trained')\n")


def refusal(*command: str) -> str:
    with pytest.raises(InvalidArgumentError) as error:
        rank_argv(list(command), ["-n", "2"])
    return str(error.value)


@pytest.mark.parametrize(
    ("command", "argv"),
    [
        (["train.py", "--lr", "1"], ["train.py", "--lr", "1"]),
        (["-m", "pkg.train", "x"], ["-m", "pkg.train", "x"]),
        (["-mpkg.train", "x"], ["-m", "pkg.train", "x"]),
        ([sys.executable, "train.py", "-n", "5"], ["train.py", "-n", "5"]),
        ([sys.executable, "-m", "pytest", "-q"], ["-m", "pytest", "-q"]),
        ([sys.executable, "-u", "train.py"], ["-u", "train.py"]),
        ([os.path.basename(sys.executable), "train.py"], ["train.py"]),  # found on PATH
    ],
)
def test_scripts_and_modules_run_with_distcomms_python(command: list[str], argv: list[str]) -> None:
    """distcomm's own interpreter given first is dropped: it is what starts every rank."""
    assert rank_argv(command, ["-n", "2"]) == [sys.executable, *argv]


def test_a_python_command_says_to_use_minus_m() -> None:
    """The newcomer's `distcomm run -n 2 distcomm bench`: the command of an installed package."""
    assert shutil.which("distcomm") is not None, "the distcomm command is installed with distcomm"
    message = refusal("distcomm", "bench", "--ops", "all_reduce")
    assert "script 'distcomm' not found" in message
    assert f"'distcomm' is the command {os.path.join(BIN, 'distcomm')}" in message
    hint = "HINT: to run the command `distcomm bench --ops all_reduce`, use "
    assert hint + "`distcomm run -n 2 -m distcomm bench --ops all_reduce`." in message


def test_a_command_maps_to_the_module_that_runs_it() -> None:
    """pytest's command runs pytest's __main__; torchrun's, the module with its main guard."""
    message = refusal("pytest", "-q")
    assert "HINT: to run the command `pytest -q`, use `distcomm run -n 2 -m pytest -q`." in message
    if shutil.which("torchrun") is not None:
        assert "`distcomm run -n 2 -m torch.distributed.run x`" in refusal("torchrun", "x")


def test_a_module_name_says_to_use_minus_m() -> None:
    message = refusal("json.tool", "in.json")
    assert "script 'json.tool' not found" in message
    assert "'json.tool' is an importable module" in message
    assert "HINT: to run it, use `distcomm run -n 2 -m json.tool in.json`." in message


def test_a_program_on_path_is_not_a_python_script() -> None:
    message = refusal("ls", "-l")
    assert "script 'ls' not found" in message and "is the program" in message
    assert "HINT: give the Python script or module it runs" in message and "mpirun" in message


def test_a_missing_script_says_so() -> None:
    message = refusal("missing_script.py")
    assert "script 'missing_script.py' not found (in " in message
    assert "HINT: check the path, or use -m module for a module." in message


def test_another_python_is_refused_with_both_ways_out(tmp_path: Path) -> None:
    """A Python that is not distcomm's (here: a link to it from another folder, as /usr/bin/python3
    is to a virtual environment's) has other packages: refused, saying how to run either way."""
    other = tmp_path / "elsewhere" / "python3"
    other.parent.mkdir()
    other.symlink_to(sys.executable)
    message = refusal(str(other), "train.py", "--lr", "1")
    assert f"{str(other)!r} is a Python interpreter ({other}), not distcomm's" in message
    assert "HINT: to use distcomm's Python, drop it: `distcomm run -n 2 train.py --lr 1`" in message
    assert f"`{other} -m distcomm run -n 2 train.py --lr 1`" in message


def test_an_interpreter_with_nothing_after_it() -> None:
    message = refusal(sys.executable)
    assert "nothing to run after the interpreter" in message
    assert "HINT: distcomm run starts Python itself: `distcomm run -n 2 script.py`" in message


def test_a_binary_or_a_shell_script_is_not_a_python_script(tmp_path: Path) -> None:
    ls = shutil.which("ls")
    assert ls is not None
    assert f"{ls!r} is an executable program, not a Python script" in refusal(ls)
    shell = tmp_path / "train.sh"
    shell.write_text("#!/bin/sh\necho hi\n")
    message = refusal(str(shell))
    assert f"{str(shell)!r} is a script for '/bin/sh', not a Python script" in message
    assert "HINT: give the Python script it runs, `distcomm run -n 2 train.py`" in message


def test_the_command_line_refuses_before_starting_anything(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The launcher's options as given go into the HINT."""
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "-n", "2", "--backend", "gloo", "distcomm", "bench"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "usage: distcomm run -n N" in err
    assert "use `distcomm run -n 2 --backend gloo -m distcomm bench`." in err


def test_distcomms_python_given_first_runs_the_script(tmp_path: Path) -> None:
    """`distcomm run -n 2 python train.py`, as under mpirun: the ranks run train.py."""
    done = subprocess.run(
        [sys.executable, "-m", "distcomm", "run", "-n", "2", sys.executable, "train.py"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == ["[rank 0] trained", "[rank 1] trained"]
