#!/usr/bin/env bash
# Install everything the test suite needs into ./.venv, then run it. Extra arguments go to pytest.
# Used by the README's test command and by CI (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
.venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt \
    -e '.[test]' -e ./backends/distcomm-torch -e ./backends/distcomm-mpi ./examples/plugin

status=0
.venv/bin/python -m pytest "$@" || status=$?
if [ "$status" -eq 5 ]; then
    echo "scripts/test.sh: pytest collected no tests; that is a failure" >&2
    exit 1
fi
exit "$status"
