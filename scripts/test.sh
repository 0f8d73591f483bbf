#!/usr/bin/env bash
# Install everything the test suite needs into ./.venv, then run it. Extra arguments go to pytest.
# Used by the README's test command and by CI (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."

# Each stage says how long it took, and the run ends with a summary of them.
# Each stage also says how many Python processes of the test venv it started (see below).
started=$SECONDS stage_name="install" stage_start=$SECONDS timings="" processes_log="" counted=0
started_processes() {  # the processes logged so far
    [ -n "$processes_log" ] && [ -e "$processes_log" ] || { echo 0; return; }
    grep -c '^\["start"' "$processes_log" || true
}
stage() {
    local took=$((SECONDS - stage_start)) now
    now=$(started_processes)
    timings+="$(printf '  %-44s %5d s %7d' "$stage_name" "$took" "$((now - counted))")"$'\n'
    echo "scripts/test.sh: $stage_name took ${took} s"
    stage_name=$1 stage_start=$SECONDS counted=$now
}
summary() {
    stage "done"
    printf 'scripts/test.sh: stages\n  %-44s %7s %7s\n%s  %-44s %5d s %7d\n' "stage" "time" \
        "procs" "$timings" "total" "$((SECONDS - started))" "$counted"
    if [ "${#reports[@]}" -gt 0 ]; then
        mv "$processes_log" "$processes_log.done"  # the report's own start is not counted
        .venv/bin/python scripts/test_report.py "$processes_log.done" "${reports[@]}"
    fi
}

# pip byte-compiles what it installs (its default; about 15 s of CPU for torch): where
# PYTHONDONTWRITEBYTECODE is set, as on some CI machines, Python would otherwise compile torch
# again in every process that imports it (about 1.4 s of CPU each, hundreds of processes).
bash scripts/venv.sh

# The run writes the bytecode of what it imports from the checkout (distcomm, the backends, the
# tests; __pycache__ folders, ignored by git) and pytest its rewritten test modules: with
# PYTHONDONTWRITEBYTECODE set, every one of the run's thousand processes compiled them again
# (about 0.15 s of CPU a process, 1 s a pytest process).
unset PYTHONDONTWRITEBYTECODE
# The run's MPI jobs (MPICH) have more ranks than the machine has cores: a rank that waits gives
# its core up by sleeping (nanosleep), not by sched_yield while it spins. With 4 ranks and two
# busy processes on two cores, the MPI suite took 45 s instead of 30, and 66 s of CPU instead
# of 35 that the other tests could not use; on an idle machine it costs a few seconds.
export MPIR_CVAR_ENABLE_HEAVY_YIELD=${MPIR_CVAR_ENABLE_HEAVY_YIELD:-1}

# Temporary files of the run (pytest's tmp_path, torch's caches, MPICH's files in TMPDIR) go to
# one private directory, removed at the end: the run leaves nothing behind in /tmp.
scratch=$(mktemp -d "${TMPDIR:-/tmp}/distcomm-tests-XXXXXX")
export TMPDIR="$scratch"

# How many processes the run starts: a .pth hook, in the venv for this run only, logs every
# start of its Python (with the test running then) while $processes_log exists
# (scripts/test_report.py counts them, and the time of each test file from pytest's JUnit XML).
site_packages=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
hook="$site_packages/distcomm-test-processes-$$.pth"  # one per run: runs may nest
processes_log="$scratch/processes.log"
trap 'rm -rf "$scratch" "$hook"' EXIT
: > "$processes_log"
.venv/bin/python scripts/test_report.py --hook "$processes_log" "$scratch/process_hook.py" > "$hook"
reports=()
junit() {  # the JUnit XML of pytest stage $1, for the report
    reports+=("$scratch/junit-$1.xml")
    junit_xml="--junitxml=$scratch/junit-$1.xml"
}

# pytest exits 5 when it collected no test: a failure here.
check() {
    local status=$1 what=$2
    if [ "$status" -eq 5 ]; then
        echo "scripts/test.sh: $what collected no tests; that is a failure" >&2
        exit 1
    fi
    [ "$status" -eq 0 ] || exit "$status"
}

stage "pytest"
status=0
if [ "$#" -eq 0 ]; then
    # The whole suite, in two workers (pytest-xdist): the run is CPU-bound only part of the time
    # (tests that wait for a timeout, a rank that sleeps, apt, a launcher starting). It holds,
    # beside the tests of tests/ and of the backends and examples: the launchers (real srun and
    # sbatch jobs of a private one-node Slurm, two network namespaces; root only), the MPI suite
    # inside `mpirun -n 1|2|4 python -m pytest --with-mpi` jobs, the wheel job
    # (scripts/wheels.sh) and the API reference (scripts/docs.sh): tests/test_release.py and
    # backends/distcomm-mpi/tests/test_mpi_suite.py. Tests that must not run beside each other
    # share a worker (tests/support/scheduling.py); -rs says why a test skipped (not root).
    junit main
    .venv/bin/python -m pytest -n 2 --dist loadgroup -rs "$junit_xml" || status=$?
else
    junit main
    .venv/bin/python -m pytest "$junit_xml" "$@" || status=$?
fi
summary
check "$status" "pytest"
