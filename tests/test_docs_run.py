"""Every command and program that README.md and docs/*.md show runs, and prints what they show.

The blocks are collected from the markdown (tests/support/doc_blocks.py says how a doc marks a
block that cannot run here, visibly, with its reason, and how it says to run one: a launcher,
variables, the exit status it shows). Each runs from the checkout's root, with the test
environment's ``bin`` first on PATH (its ``distcomm``, ``mpirun``) and no launcher variables
inherited, and must leave no file behind in the checkout. A block writes its own files under
``$TMPDIR`` (``${TMPDIR:-/tmp}`` in a shell, ``tempfile.gettempdir()`` in Python), never to a
fixed path in /tmp: the check gives each page a ``TMPDIR`` of its own, shared by its blocks and
removed afterwards, and shows that folder to the comparison as ``/tmp``. A block that runs
exactly what tests of the suite run names them (``same-as``): where this session ran them (the
blocks run last), their passing stands for the block, which does not run again; where it did
not (the docs check run alone), the block runs. The API reference's examples have their own
test (test_docs_examples.py).
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from doc_blocks import ROOT, RUNNABLE, Block, blocks, commands, docs, same_as, shown_in
from scheduling import wait_for_outcomes

ALL = [b for path in docs() for b in blocks(path) if b.lang in RUNNABLE]
RUN = [b for b in ALL if b.skip is None]
MARKED = [b for b in ALL if b.skip is not None]
BIN = Path(sys.executable).parent
_INHERITED = ("DISTCOMM_", "MASTER_", "OMPI_", "PMI_", "PMIX_", "SLURM_", "TORCHELASTIC_")
_LAUNCH = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK")


#: A fixed path in /tmp (not ``${TMPDIR:-/tmp}/...``): what a block must not write to.
_FIXED_TMP = re.compile(r"(?<![-:])/tmp/")


def test_the_docs_show_blocks_to_run_and_say_why_others_do_not_run() -> None:
    print(f"docs check: {len(RUN)} blocks run, {len(MARKED)} marked not to run")
    assert len(RUN) >= 80, f"only {len(RUN)} runnable blocks found in the docs"
    for block in MARKED:
        assert len(block.skip or "") >= 12, f"{block.name}: the marker gives no reason"
    known = {"launch", "env", "status", "timeout", "compare", "cwd", "same-as"}
    unknown = {k for b in ALL for k in b.options} - known
    assert not unknown, f"unknown docs-check directives: {unknown}"


def test_no_block_writes_to_a_fixed_path_in_tmp() -> None:
    """Files a block makes go under $TMPDIR, so that the check (and a user running the tests)
    leaves /tmp as it was; output a doc shows may still say /tmp."""
    fixed = []
    for block in RUN:
        code = [c for c, _ in commands(block.text)] if block.lang == "console" else [block.text]
        fixed += [
            f"{block.name}: {line.strip()}"
            for c in code
            for line in c.splitlines()
            if _FIXED_TMP.search(line)
        ]
    assert not fixed, (
        "blocks naming a fixed path in /tmp (use ${TMPDIR:-/tmp}/... or "
        "tempfile.gettempdir()):\n" + "\n".join(fixed)
    )


def test_a_block_that_names_tests_names_tests_that_exist() -> None:
    """``same-as`` names folders, files or tests (``file::name``) that are there."""
    missing = [
        f"{block.name}: {target}"
        for block in RUN
        for target in same_as(block)
        if not _exists(target)
    ]
    assert not missing, "same-as names no test:\n" + "\n".join(missing)


def _exists(target: str) -> bool:
    path, _, name = target.partition("::")
    if not (ROOT / path).exists():
        return False
    if not name:
        return True
    tree = ast.parse((ROOT / path).read_text())
    return any(isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body)


_PAGE_TMP: dict[Path, Path] = {}


@pytest.fixture
def page_tmp(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The TMPDIR of the block's page: one per page, so that a page's later blocks find what
    its earlier ones wrote there (a plugin module, a venv)."""
    block: Block = request.node.callspec.params["block"]
    if block.path not in _PAGE_TMP:
        _PAGE_TMP[block.path] = tmp_path_factory.mktemp(f"tmp-{block.path.stem}", numbered=True)
    return _PAGE_TMP[block.path]


def _environment(block: Block, tmp_path: Path, page_tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_INHERITED) and k not in _LAUNCH}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["TMPDIR"] = str(page_tmp)
    env["PYTEST_ADDOPTS"] = "-p no:cacheprovider"  # a block's pytest leaves no .pytest_cache
    env["MPLCONFIGDIR"] = str(tmp_path / "matplotlib")
    env["PYTHONUNBUFFERED"] = "1"
    for item in shlex.split(block.options.get("env", "")):
        name, _, value = item.partition("=")
        env[name] = value
    return env


def _untracked() -> set[str]:
    """The checkout's untracked files, and its ignored ones by folder (``build/``, a cache)."""
    done = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all", "--ignored=matching"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    return {line[3:] for line in done.stdout.splitlines() if line.startswith(("??", "!!"))}


def _copy(tmp_path: Path) -> Path:
    """A copy of the checkout's files (tracked and untracked, not the ignored ones: no .venv),
    for a block that sets a checkout up (``cwd=copy``: the README's first command)."""
    copy = tmp_path / "checkout"
    copy.mkdir()
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        cwd=ROOT,
        check=True,
    ).stdout
    files = [f for f in listed.decode().split("\0") if f and (ROOT / f).is_file()]
    packed = subprocess.run(
        ["tar", "-cf", "-", "-T", "-"],
        input="\n".join(files).encode(),
        capture_output=True,
        cwd=ROOT,
        check=True,
    ).stdout
    subprocess.run(["tar", "-xf", "-"], input=packed, cwd=copy, check=True)
    return copy


def _run(
    argv: list[str] | str, block: Block, env: dict[str, str], cwd: Path = ROOT
) -> tuple[int, str]:
    try:
        done = subprocess.run(
            argv,
            shell=isinstance(argv, str),
            executable="/bin/bash" if isinstance(argv, str) else None,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,  # in the order a terminal shows them
            text=True,
            cwd=cwd,
            env=env,
            timeout=float(block.options.get("timeout", 180)),
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        pytest.fail(f"{block.name}: still running after {exc.timeout} s:\n{out[-3000:]}")
    return done.returncode, _as_tmp(done.stdout, env["TMPDIR"], cwd)


def _as_tmp(output: str, tmp: str, cwd: Path) -> str:
    """``output`` with the page's TMPDIR shown as /tmp, however a program wrote its path
    (pytest writes a path relative to the working directory when that is shorter)."""
    real = os.path.realpath(tmp)
    forms = {real, tmp, os.path.relpath(real, cwd), os.path.relpath(tmp, cwd)}
    for form in sorted(forms, key=len, reverse=True):
        output = output.replace(form, "/tmp")
    return output


def _check(block: Block, what: str, status: int, output: str, shown: str | None) -> None:
    want = int(block.options.get("status", 0))
    assert status == want, (
        f"{block.name}: {what} exited {status} (the doc expects {want}):\n{output[-4000:]}"
    )
    if shown and block.options.get("compare") != "no":
        missing = shown_in(shown, output)
        assert missing is None, (
            f"{block.name}: {what} did not print the line the doc shows:\n  {missing!r}\n"
            f"it printed:\n{output[-4000:]}"
        )


def _launcher(launch: str) -> list[str]:
    argv = shlex.split(launch)
    if argv[0] == "distcomm":
        return [sys.executable, "-m", "distcomm", *argv[1:]]
    if argv[0] == "mpirun":
        return [str(BIN / "mpirun"), *argv[1:], sys.executable]
    raise AssertionError(f"unknown launch {launch!r} (distcomm run ... or mpirun ...)")


def _ran_by_its_tests(block: Block, outcomes_of: Callable[[str], dict[str, str] | None]) -> bool:
    """Whether the tests the block names (``same-as``) ran in this session and passed: then
    the block, which runs exactly what they run, need not run again. False when this session
    did not collect them (the block then runs); a failure when they failed or were skipped."""
    targets = same_as(block)
    # Under pytest-xdist a test the block names may still run on another worker: wait for it
    found = {target: wait_for_outcomes(lambda t=target: outcomes_of(t), 600) for target in targets}
    if not targets or any(outcomes is None for outcomes in found.values()):
        return False
    bad = {
        test: outcome
        for outcomes in found.values()
        for test, outcome in (outcomes or {}).items()
        if outcome != "passed"
    }
    if any(outcome == "not run" for outcome in bad.values()):
        return False  # they did not run in time (another order): the block runs now
    assert not bad, f"{block.name}: the tests that run this block did not pass: {bad}"
    return True


@pytest.mark.timeout(900)
@pytest.mark.parametrize("block", RUN, ids=[b.name for b in RUN])
def test_a_block_runs_as_the_doc_shows(
    block: Block,
    tmp_path: Path,
    page_tmp: Path,
    outcomes_of: Callable[[str], dict[str, str] | None],
) -> None:
    if _ran_by_its_tests(block, outcomes_of):
        return
    env = _environment(block, tmp_path, page_tmp)
    before = _untracked()
    cwd = _copy(tmp_path) if block.options.get("cwd") == "copy" else ROOT
    if block.lang == "python":
        script = tmp_path / "block.py"
        script.write_text(block.text)
        launch = block.options.get("launch")
        argv = [*_launcher(launch), str(script)] if launch else [sys.executable, str(script)]
        status, output = _run(argv, block, env, cwd)
        _check(block, "the program", status, output, block.shown)
    elif block.lang == "bash":
        status, output = _run(f"set -euo pipefail\n{block.text}", block, env, cwd)
        _check(block, "the script", status, output, None)
    else:
        pairs = commands(block.text)
        assert pairs, f"{block.name}: a console block without a `$ ` command"
        for command, shown in pairs:
            status, output = _run(command, block, env, cwd)
            _check(block, f"`{command}`", status, output, shown)
    left = _untracked() - before
    assert not left, f"{block.name}: left files in the checkout: {sorted(left)}"


def test_blocks_are_found_in_list_items_with_their_marker_and_output(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "1. Run this:\n\n"
        "   <!-- docs-check: status=1 -->\n"
        "   ```console\n"
        "   $ distcomm infos\n"
        "   usage: ...\n"
        "   ```\n\n"
        "2. And this, which cannot run here:\n\n"
        "   *Not run by the docs check: it needs two hosts\n"
        "   and a GPU on each.*\n\n"
        "   ```python\n"
        "   import distcomm\n"
        "   ```\n"
        "   ```text\n"
        "   42\n"
        "   ```\n"
    )
    console, python, text = blocks(page)
    assert (console.lang, console.line, console.options) == ("console", 4, {"status": "1"})
    assert commands(console.text) == [("distcomm infos", "usage: ...")], console.text
    assert python.skip == "it needs two hosts and a GPU on each.", python.skip
    assert python.text == "import distcomm\n" and python.shown == "42\n", python
    assert text.lang == "text"
