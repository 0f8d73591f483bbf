"""The conformance kit, run as a plugin author runs it: ``pytest --pyargs
distcomm.testing.conformance --distcomm-backend=NAME`` in thread-ranks, under ``distcomm run`` and
under ``mpirun``; a failing check ends the job at once; bad options are refused with a fix."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from jobs import dev_shm_names, run_job

from distcomm.backend.specs import Capabilities
from distcomm.testing.conformance import CHECKS, TOPICS, check
from distcomm.testing.conformance.kit import World, summary, title, topic_of
from distcomm.testing.pytest_plugin import KIT

PYTEST = ["-m", "pytest", "-p", "no:cacheprovider", "--pyargs", "distcomm.testing.conformance"]
#: The first check of each topic: a short run that still covers every topic.
ONE_PER_TOPIC = [next(name for name in CHECKS if topic_of(name) == topic) for topic in TOPICS]
FAILING = "zz_rank_1_disagrees"
FAILING_PLUGIN = f'''
import distcomm
from distcomm.testing.conformance import check


@check
def {FAILING}() -> None:
    """Rank 1 fails; the other ranks wait for it in a barrier."""
    if distcomm.get_rank() == 1:
        raise AssertionError("rank 1 disagrees")
    distcomm.barrier()
'''


def output(done: subprocess.CompletedProcess[str]) -> str:
    """A finished job's stdout and stderr together."""
    return done.stdout + done.stderr


def row(first: str, *counts: int, prefix: str = "") -> re.Pattern[str]:
    """A summary table's row: ``first`` then ``counts``, right-aligned, on a line of its own."""
    cells = "".join(rf" +{n}" for n in counts)
    return re.compile(rf"^{re.escape(prefix)}{first}{cells}$", re.MULTILINE)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_threads_mode_runs_one_test_per_check_in_suite_order(tmp_path: Path, ranks: int) -> None:
    command = [sys.executable, *PYTEST, "-v", "--distcomm-backend=fakelink"]
    done = run_job([*command, f"--distcomm-threads={ranks}"], cwd=tmp_path, timeout=100)
    text = output(done)
    assert done.returncode == 0, text
    assert re.findall(r"test_check\[(.+?)\] PASSED", text) == list(CHECKS)
    rank_s = "rank" if ranks == 1 else "ranks"
    assert f"distcomm conformance: fakelink, {ranks} {rank_s} (thread-ranks)" in text
    assert row("total", len(CHECKS), 0).search(text), text


@pytest.mark.timeout(120)
def test_under_distcomm_run_rank_0_alone_prints_the_summary(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "distcomm", "run", "-n", "2", *PYTEST]
    command += ["--distcomm-backend=gloo", f"--distcomm-checks={','.join(ONE_PER_TOPIC)}"]
    done = run_job(command, cwd=tmp_path, timeout=100)
    text = output(done)
    assert done.returncode == 0, text
    for rank in (0, 1):
        assert re.search(rf"^\[rank {rank}\] =* {len(ONE_PER_TOPIC)} passed", text, re.M), text
    titles = [line for line in text.splitlines() if "distcomm conformance:" in line]
    assert len(titles) == 1, text
    assert titles[0].startswith("[rank 0] ") and "gloo, 2 ranks (processes)" in titles[0]
    assert row("total", len(ONE_PER_TOPIC), 0, prefix="[rank 0] ").search(text), text
    assert "[rank 1] capability" not in text


@pytest.mark.timeout(120)
def test_under_mpirun_every_topic_passes(tmp_path: Path, mpirun: str) -> None:
    command = [mpirun, "-n", "2", sys.executable, *PYTEST, "--distcomm-backend=mpi"]
    command.append(f"--distcomm-checks={','.join(ONE_PER_TOPIC)}")
    done = run_job(command, cwd=tmp_path, timeout=100)
    text = output(done)
    assert done.returncode == 0, text
    assert text.count(f"{len(ONE_PER_TOPIC)} passed in ") == 2, text
    assert text.count("distcomm conformance: mpi, 2 ranks (processes)") == 1, text
    for topic in TOPICS:
        assert row(topic, 1, 0).search(text), text


@pytest.mark.timeout(120)
@pytest.mark.parametrize("launcher", ["distcomm run", "mpirun"])
def test_a_failing_check_ends_the_job_with_the_failing_ranks_report(
    tmp_path: Path, request: pytest.FixtureRequest, launcher: str
) -> None:
    """Rank 0 waits in the failed check's barrier: only ending the job lets the run finish
    (the operations' timeout, 60 s, is past the job's)."""
    (tmp_path / "failing_check.py").write_text(FAILING_PLUGIN)
    if launcher == "mpirun":
        request.getfixturevalue("aborted_mpich_job")
        start = [request.getfixturevalue("mpirun"), "-n", "2", sys.executable]
        backend = "mpi"
    else:
        start, backend = [sys.executable, "-m", "distcomm", "run", "-n", "2"], "gloo"
    command = [*start, *PYTEST, "-p", "failing_check", f"--distcomm-backend={backend}"]
    command += [f"--distcomm-checks=getters,barrier,{FAILING}", "--distcomm-timeout=60"]
    shm = dev_shm_names()
    done = run_job(command, cwd=tmp_path, timeout=50)
    text = output(done)
    assert done.returncode != 0, text
    assert not dev_shm_names() - shm  # on mpi, MPICH's segment is removed before MPI_Abort
    assert "[rank 1] distcomm: rank 1 of 2 failed " in text, text
    assert f"test_check[{FAILING}] (call); ending the whole job" in text, text
    assert f"AssertionError: conformance check '{FAILING}' failed on rank 1" in text
    assert "distcomm conformance:" not in text  # rank 0 did not get to its summary


@pytest.fixture
def failing_check() -> Iterator[str]:
    """Register the failing check in this process for the test, and remove it afterwards."""
    check(FAILING)(_fail_on_rank_1)
    try:
        yield FAILING
    finally:
        CHECKS.pop(FAILING, None)


def _fail_on_rank_1() -> None:
    """Rank 1 fails; the other ranks wait for it in a barrier."""
    import distcomm

    if distcomm.get_rank() == 1:
        raise AssertionError("rank 1 disagrees")
    distcomm.barrier()


def test_in_threads_mode_a_failure_fails_its_test_and_the_run_goes_on(
    pytester: pytest.Pytester, failing_check: str
) -> None:
    result = pytester.runpytest(
        *PYTEST[2:],
        "--distcomm-backend=fakelink",
        "--distcomm-threads=2",
        f"--distcomm-checks=getters,barrier,{failing_check}",
    )
    result.assert_outcomes(passed=2, failed=1)
    failure = f"conformance check '{failing_check}' failed on rank 1: AssertionError: rank 1"
    result.stdout.fnmatch_lines([f"E *{failure} disagrees"])
    assert row("total", 2, 1).search(result.stdout.str())


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (
            ["--distcomm-backend=glooo"],
            "BackendNotFoundError: unknown backend 'glooo'; valid: *HINT: did you mean 'gloo'?",
        ),
        (
            ["--distcomm-backend=gloo", "--distcomm-threads=2"],
            "InvalidArgumentError: "
            "--distcomm-threads runs thread-ranks*--distcomm-backend='gloo', valid: fakelink. "
            "HINT: drop --distcomm-threads*distcomm run -n 2 -m pytest*",
        ),
        (
            ["--distcomm-backend=fakelink", "--distcomm-threads=0"],
            "*--distcomm-threads=0 must be at least 1. HINT: *",
        ),
        (
            ["--distcomm-backend=fakelink", "--distcomm-checks=getters,barier"],
            "*no conformance check named 'barier'; valid: getters, *HINT: did you mean 'barrier'?",
        ),
        (
            ["--distcomm-threads=2"],
            "*--distcomm-threads is an option of the distcomm conformance"
            " kit, which needs --distcomm-backend=NAME. HINT: *",
        ),
        (
            ["--distcomm-backend=fakelink", "--distcomm-timeout=-1"],
            "*--distcomm-timeout=-1.0 must be a number of seconds > 0. HINT: *",
        ),
    ],
)
def test_bad_options_are_refused_naming_the_value_the_choices_and_a_fix(
    pytester: pytest.Pytester, options: list[str], expected: str
) -> None:
    result = pytester.runpytest(*PYTEST[2:], *options)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {expected}"])


def test_without_a_backend_every_check_is_skipped_with_the_reason(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CI", raising=False)  # distcomm's own conftest fails skips under CI=true
    result = pytester.runpytest(*PYTEST[2:], "-rs")
    result.assert_outcomes(skipped=len(CHECKS))
    result.stdout.fnmatch_lines(
        ["SKIPPED *the distcomm conformance kit runs only with --distcomm-backend=NAME*"]
    )


def test_the_kit_is_registered_only_when_asked_for(pytester: pytest.Pytester) -> None:
    plain = pytester.parseconfigure()
    assert KIT not in plain.stash
    assert plain.pluginmanager.get_plugin("distcomm-conformance-kit") is None
    config = pytester.parseconfigure("--distcomm-backend=FakeLink", "--distcomm-threads=3")
    kit = config.stash[KIT]
    assert config.pluginmanager.get_plugin("distcomm-conformance-kit") is kit
    assert (kit.options.backend, kit.options.threads) == ("fakelink", 3)
    assert kit.options.checks == tuple(CHECKS)


def test_the_plugin_and_the_kit_import_neither_torch_nor_mpi4py() -> None:
    code = (
        "import sys, distcomm.testing.pytest_plugin, distcomm.testing.conformance.kit; "
        "print('torch' in sys.modules, 'mpi4py' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["False", "False"], done.stderr


def test_the_summary_says_what_is_not_native_and_counts_checks_per_topic() -> None:
    capabilities = Capabilities(
        dtypes=frozenset({"int32", "int64", "float32", "float64"}),
        reduce_ops=frozenset({"SUM", "MIN", "MAX"}),
        any_source=False,
    )
    world = World("minimal", 3, 0, capabilities, threads=False)
    reduction = next(name for name in CHECKS if topic_of(name) == "reductions")
    lines = summary(world, {"getters": "passed", "barrier": "failed", reduction: "skipped"})
    assert title(world) == "distcomm conformance: minimal, 3 ranks (processes)"
    text = "\n".join(lines)
    assert re.search(
        r"^dtypes +all but bool, uint8, int8, int16, float16, bfloat16 \(bridged", text, re.M
    )
    assert re.search(
        r"^reduce_ops +all but PRODUCT, AVG, BAND, BOR, BXOR \(emulated\)$", text, re.M
    )
    assert re.search(r"^ops +all$", text, re.M) and re.search(r"^any_source +no$", text, re.M)
    assert re.search(r"^topic +passed +failed +skipped$", text, re.M)
    for topic, counts in [("arguments", (1, 0, 0)), ("reductions", (0, 0, 1))]:
        assert row(topic, *counts).search(text), text
    assert row("movement", 0, 1, 0).search(text) and row("total", 1, 1, 1).search(text)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("policy", ["off", "check"])
def test_the_kit_passes_whatever_distcomm_debug_says(
    policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each check pins the mismatch-check policy it needs (the default is covered everywhere)."""
    import distcomm
    from distcomm.testing import run_threads
    from distcomm.testing.conformance import run_all

    monkeypatch.setenv("DISTCOMM_DEBUG", policy)

    def body() -> str:
        debug = str(distcomm.get_communicator().debug)  # type: ignore[attr-defined]
        run_all()
        return debug

    assert run_threads(body, 3, timeout=180) == [policy] * 3


def test_the_docs_count_the_checks_of_each_topic() -> None:
    """The summaries shown in docs/testing.md and docs/plugins.md count what the kit holds."""
    counts = {topic: sum(topic_of(name) == topic for name in CHECKS) for topic in TOPICS}
    root = Path(__file__).resolve().parents[2] / "docs"
    for page in ("testing.md", "plugins.md"):
        text = (root / page).read_text()
        shown = dict(re.findall(r"^(?:\[rank 0\] )?(\w+) +(\d+) +0$", text, re.MULTILINE))
        for topic, count in counts.items():
            if topic in shown:
                assert int(shown[topic]) == count, f"{page}: {topic} {shown[topic]} != {count}"
        assert int(shown["total"]) == len(CHECKS), f"{page}: total {shown['total']}"
        assert f"{len(CHECKS)} passed in" in text, f"{page}: the pytest line"
        for shown_count in re.findall(r"(\d+)\s+passed\b", text):
            assert int(shown_count) == len(CHECKS), f"{page}: {shown_count} passed"
    for page in [root.parent / "README.md", *sorted(root.glob("*.md"))]:
        for shown_count in re.findall(r"(\d+)\s+(?:conformance\s+)?checks\b", page.read_text()):
            assert int(shown_count) == len(CHECKS), f"{page.name}: {shown_count} checks"
