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
    find pyproject.toml setup.py distcomm/backend/_pipeline/_planned_path.c constraints.txt \
        backends/*/pyproject.toml examples/plugin \
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
# The planned path's C extension (setup.py) is built with a C compiler and Python's headers;
# without them the install goes on without it (the Python runs every call), and under CI=true
# a test fails. Where they are missing, apt-get installs them (as root), as scripts/slurm.sh
# does Slurm.
if ! command -v cc >/dev/null || ! .venv/bin/python -c 'import os, sysconfig, sys
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends gcc libc6-dev python3-dev >/dev/null
    else
        echo "scripts/venv.sh: no C compiler or no Python.h: distcomm's compiled planned path" \
            "is not built (docs/install.md)" >&2
    fi
fi
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
# setuptools tells each editable install to beware of same-named folders in the working
# directory (an information note, not a problem here): silenced so the run prints only our own.
PYTHONWARNINGS="ignore:Editable installation" \
    .venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt \
    -e '.[test,docs]' -e ./backends/distcomm-torch -e ./backends/distcomm-mpi \
    -e ./backends/distcomm-linklink ./examples/plugin ./examples/distcomm-zmq
echo "$stamp" > .venv/.distcomm-installed
