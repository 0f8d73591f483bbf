#!/usr/bin/env bash
# Make ./.venv (with $PYTHON, default python3) if it is not there, and install into it what the
# test suite needs: distcomm with its test and docs extras, the three backends (editable), the
# example plugin and the zmq example, pinned by constraints.txt. Used by scripts/test.sh and
# scripts/stress.sh.
#
# What it installed is stamped in .venv (a hash of the packaging files, the two examples' files
# and the Python version): when nothing of it changed, nothing is installed again, so that a
# run inside a running suite (a docs block runs `bash scripts/test.sh tests/environment`) never
# rewrites the packages the suite's other processes are importing.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv

inputs() {
    find pyproject.toml constraints.txt backends/*/pyproject.toml examples/plugin \
        examples/distcomm-zmq -type f -not -path '*/build/*' -not -path '*.egg-info/*' \
        -not -path '*/__pycache__/*' | LC_ALL=C sort | xargs sha256sum
    .venv/bin/python --version
}
stamp=$(inputs | sha256sum | cut -d' ' -f1)
if [ "$(cat .venv/.distcomm-installed 2>/dev/null)" = "$stamp" ]; then
    echo "scripts/venv.sh: .venv is up to date (nothing installed)"
    exit 0
fi
rm -f .venv/.distcomm-installed
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
# setuptools tells each editable install to beware of same-named folders in the working
# directory (an information note, not a problem here): silenced so the run prints only our own.
PYTHONWARNINGS="ignore:Editable installation" \
    .venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt \
    -e '.[test,docs]' -e ./backends/distcomm-torch -e ./backends/distcomm-mpi \
    -e ./backends/distcomm-linklink ./examples/plugin ./examples/distcomm-zmq
echo "$stamp" > .venv/.distcomm-installed
