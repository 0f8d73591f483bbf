#!/usr/bin/env bash
# Build and check every distribution of a release: the sdist and wheel of distcomm,
# distcomm-torch, distcomm-mpi, distcomm-linklink and the zmq example, with the standard front
# end (python -m build), into DIR (default: ./dist), then `twine check --strict` on them all.
#   bash scripts/release.sh [DIR]
# It builds from a copy of the working tree (tracked and untracked files, not the ignored ones),
# so the checkout is left as it was, and refuses versions that differ (tests/test_packaging.py
# checks the same, and that distcomm's extras pin that version).
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-dist}")
python=${PYTHON:-.venv/bin/python}
"$python" -m pip install -q --disable-pip-version-check build twine

versions=$("$python" - <<'PY'
import re
from pathlib import Path
files = ["distcomm/_version.py", "backends/distcomm-torch/distcomm_torch/__init__.py",
         "backends/distcomm-mpi/distcomm_mpi/__init__.py",
         "backends/distcomm-linklink/distcomm_linklink/__init__.py"]
print(" ".join(sorted({re.search(r'__version__ = "(.+)"', Path(f).read_text())[1] for f in files})))
PY
)
if [ "$(wc -w <<<"$versions")" -ne 1 ]; then
    echo "scripts/release.sh: the distributions' versions differ ($versions); make them one" >&2
    exit 1
fi

tree=$(mktemp -d "${TMPDIR:-/tmp}/distcomm-release-XXXXXX")
trap 'rm -rf "$tree"' EXIT
git ls-files -z --cached --others --exclude-standard \
    | tar --null --ignore-failed-read -T - -cf - 2>/dev/null | tar -xf - -C "$tree"
mkdir -p "$out"
for project in . backends/distcomm-torch backends/distcomm-mpi backends/distcomm-linklink \
    examples/distcomm-zmq; do
    echo "scripts/release.sh: building $project"
    "$python" -m build -q --sdist --wheel --outdir "$out" "$tree/$project" >/dev/null
done
"$python" -m twine check --strict "$out"/*
echo "scripts/release.sh: version $versions, in $out:"
ls -1 "$out"
