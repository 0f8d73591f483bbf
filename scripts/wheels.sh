#!/usr/bin/env bash
# The wheel job: distcomm as a user of released packages gets it. Builds every distribution
# (scripts/release.sh), installs the wheels into a fresh venv outside the checkout
# (`pip install --no-index --find-links DIST 'distcomm[all]'`, after the third-party packages
# from the index), and runs there, from a folder outside the checkout: `distcomm info` (gloo
# and mpi available, no path of the checkout anywhere), examples/hello.py under `distcomm run
# -n 2` and `mpirun -n 2`, the conformance kit at 2 ranks on gloo and on mpi, and `distcomm
# bench --plot`. Run by the test suite (tests/test_release.py); on its own:
#   bash scripts/wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=$(mktemp -d "${TMPDIR:-/tmp}/distcomm-wheels-XXXXXX")
trap 'rm -rf "$work"' EXIT
step() { echo "scripts/wheels.sh: $*"; }

bash scripts/release.sh "$work/dist" >/dev/null
step "built $(ls "$work/dist" | wc -l) files; a fresh venv in $work/venv"
python3 -m venv "$work/venv"
bin=$work/venv/bin
"$bin/python" -m pip install -q --disable-pip-version-check -c constraints.txt \
    pluggy torch numpy mpi4py mpich tqdm matplotlib pytest pytest-timeout
"$bin/python" -m pip install -q --disable-pip-version-check --no-index \
    --find-links "$work/dist" 'distcomm[all]'

cd "$work"  # nothing below may see the checkout
cp "$root/examples/hello.py" .
"$bin/python" - "$root" <<'PY'
import sys, distcomm, distcomm_mpi, distcomm_torch
for module in (distcomm, distcomm_mpi, distcomm_torch):
    assert module.__file__.startswith(sys.prefix), f"{module.__name__} from {module.__file__}"
assert all(not p.startswith(sys.argv[1]) for p in sys.path), f"the checkout is on {sys.path}"
PY
step "distcomm info"
"$bin/distcomm" info | tee info.txt
for name in gloo mpi; do
    grep -Eq "^ +\*? *$name +distcomm-[a-z]+ +available:" info.txt \
        || { echo "scripts/wheels.sh: $name is not available" >&2; exit 1; }
done
if grep -Fq -e "$root" -e "./backends" info.txt; then
    echo "scripts/wheels.sh: distcomm info names the checkout" >&2
    exit 1
fi
step "hello under distcomm run -n 2, then mpirun -n 2"
"$bin/distcomm" run -n 2 hello.py | tee hello.txt
grep -q "2 ranks on gloo" hello.txt
"$bin/mpirun" -n 2 "$bin/python" hello.py | tee hello.txt
grep -q "2 ranks on mpi" hello.txt
kit=(-m pytest -q -p no:cacheprovider --timeout=300 --pyargs distcomm.testing.conformance)
passed() {  # the launcher's status says every rank passed; a skip is not a pass
    local log=$1
    tail -n 3 "$log"
    if ! grep -Eq '(^|\] )[0-9]+ passed in ' "$log" \
        || grep -Eq '[0-9]+ (skipped|failed|errors?)\b' "$log"; then
        echo "scripts/wheels.sh: the conformance kit did not pass on every rank" >&2
        exit 1
    fi
}
step "the conformance kit at 2 ranks on gloo"
"$bin/distcomm" run -n 2 --backend gloo "${kit[@]}" --distcomm-backend=gloo > kit.txt
passed kit.txt
step "the conformance kit at 2 ranks on mpi"
"$bin/mpirun" -n 2 "$bin/python" "${kit[@]}" --distcomm-backend=mpi > kit.txt
passed kit.txt
step "distcomm bench --plot"
"$bin/distcomm" run -n 2 -m distcomm bench --ops all_reduce,broadcast --sizes 8,64K \
    --rounds 2 --quiet --plot bench.png | tail -n 4
test -s bench.png
step "passed"
