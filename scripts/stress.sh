#!/usr/bin/env bash
# The stress run, not part of CI: the tests marked `stress` (they repeat a whole job to estimate
# a failure rate: restarted jobs under distcomm run and torchrun) as many times as they ask (10),
# where the normal run repeats them 3 times. Run it before resolving an issue that touches what
# they repeat (restarts, the rendezvous, process start and stop). Extra arguments go to pytest.
#   bash scripts/stress.sh [-k torchrun]
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
bash scripts/venv.sh
unset PYTHONDONTWRITEBYTECODE  # as scripts/test.sh: compile the checkout once, not per process
scratch=$(mktemp -d "${TMPDIR:-/tmp}/distcomm-stress-XXXXXX")
trap 'rm -rf "$scratch"' EXIT
export TMPDIR="$scratch"
status=0
.venv/bin/python -m pytest -p no:cacheprovider -v -m stress --stress "$@" || status=$?
echo "scripts/stress.sh: took $((SECONDS - started)) s"
if [ "$status" -eq 5 ]; then
    echo "scripts/stress.sh: no test collected; that is a failure" >&2
    exit 1
fi
exit "$status"
