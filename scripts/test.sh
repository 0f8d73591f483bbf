#!/usr/bin/env bash
# Install everything the test suite needs into ./.venv, then run it. Extra arguments go to pytest.
# Used by the README's test command and by CI (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."

# Each stage says how long it took, and the run ends with a summary of them.
started=$SECONDS stage_name="install" stage_start=$SECONDS timings=""
stage() {
    local took=$((SECONDS - stage_start))
    timings+="$(printf '  %-44s %4d s' "$stage_name" "$took")"$'\n'
    echo "scripts/test.sh: $stage_name took ${took} s"
    stage_name=$1 stage_start=$SECONDS
}
summary() {
    stage "done"
    printf 'scripts/test.sh: stages\n%s  %-44s %4d s\n' "$timings" "total" "$((SECONDS - started))"
}

python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
# setuptools tells each editable install to beware of same-named folders in the working
# directory (an information note, not a problem here): silenced so the run prints only our own.
PYTHONWARNINGS="ignore:Editable installation" \
    .venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt \
    -e '.[test]' -e ./backends/distcomm-torch -e ./backends/distcomm-mpi \
    -e ./backends/distcomm-linklink ./examples/plugin ./examples/distcomm-zmq

# Temporary files of the run (pytest's tmp_path, torch's caches, MPICH's files in TMPDIR) go to
# one private directory, removed at the end: the run leaves nothing behind in /tmp.
scratch=$(mktemp -d "${TMPDIR:-/tmp}/distcomm-tests-XXXXXX")
trap 'rm -rf "$scratch"' EXIT
export TMPDIR="$scratch"

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
    # The launcher tests (real srun/sbatch jobs, two network namespaces) run on their own with
    # -v, so that the log names each one and says it passed (or why it skipped: not root).
    .venv/bin/python -m pytest --ignore=tests/launchers || status=$?
    check "$status" "pytest"
    stage "pytest tests/launchers"
    echo "scripts/test.sh: pytest -v tests/launchers (Slurm and several hosts; root only)"
    .venv/bin/python -m pytest -v -rs -p no:cacheprovider tests/launchers || status=$?
    check "$status" "pytest tests/launchers"
else
    .venv/bin/python -m pytest "$@" || status=$?
    check "$status" "pytest"
fi

# The MPI suite inside real MPI jobs (MPICH from PyPI): every rank runs every test, and
# distcomm's pytest plugin aborts the job as soon as one rank fails. Skipped when the caller
# chose its own pytest arguments.
if [ "$#" -eq 0 ]; then
    for n in 1 2 4; do
        stage "mpirun -n $n pytest --with-mpi"
        echo "scripts/test.sh: mpirun -n $n python -m pytest --with-mpi backends/distcomm-mpi/mpi_tests"
        status=0
        .venv/bin/mpirun -n "$n" .venv/bin/python -m pytest --with-mpi -q -p no:cacheprovider \
            --timeout=300 --timeout-method=thread backends/distcomm-mpi/mpi_tests || status=$?
        check "$status" "mpirun -n $n pytest"
    done

    # What a user of released packages gets: every distribution built, installed from its wheels
    # into a fresh venv outside the checkout, and run there (hello, the kit, bench --plot).
    stage "the wheel job"
    echo "scripts/test.sh: the wheel job (scripts/wheels.sh)"
    bash scripts/wheels.sh

    # The API reference, generated from the docstrings of every public module's __all__: a
    # warning (a docstring naming a parameter that does not exist, a broken link, a name of
    # __all__ the reference does not show) fails the run. Installs the docs extra if missing.
    stage "the API reference"
    echo "scripts/test.sh: the API reference (mkdocs build --strict)"
    bash scripts/docs.sh
fi
summary
