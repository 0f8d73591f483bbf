#!/usr/bin/env bash
# Everything that needs a GPU, in one command: bash scripts/gpu-check.sh (after the README's
# install; it uses ./.venv). On a machine without a GPU it says so and exits 0. On a GPU machine
# it runs each part, prints a summary table, and exits 1 if a part failed:
#   - a world of 1 that really calls NCCL (the world-of-1 shortcut off)
#   - the conformance kit on nccl at 2 ranks up to the GPUs' count (at most 4)
#   - more ranks than GPUs: refused at init with the reason
#   - CUDA tensors on gloo, and on mpi when mpi4py's MPI is CUDA-aware
#   - distcomm bench --device cuda
#   - DDP on nccl
#   - a skipped collective (DistTimeoutError), a mismatched one, a tagged message on nccl
#   - groups on nccl: split, new_group, a group of a group
#   - the CUDA-only tests of backends/distcomm-torch
# Each part has a time limit (GPU_CHECK_LIMIT seconds, default 300); its output goes to
# $GPU_CHECK_LOGS (default: a temporary folder, removed unless a part failed).
set -uo pipefail
cd "$(dirname "$0")/.."

py=.venv/bin/python
run=(.venv/bin/python -m distcomm run)
limit=${GPU_CHECK_LIMIT:-300}
logs=${GPU_CHECK_LOGS:-$(mktemp -d "${TMPDIR:-/tmp}/gpu-check-XXXXXX")}
mkdir -p "$logs"
names=() results=() seconds=()

gpus=$("$py" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>/dev/null || echo 0)

summary() {
    printf '\n%-44s %-28s %s\n' "part" "result" "seconds"
    for i in "${!names[@]}"; do
        printf '%-44s %-28s %s\n' "${names[$i]}" "${results[$i]}" "${seconds[$i]}"
    done
}

record() { names+=("$1"); results+=("$2"); seconds+=("$3"); }

# part NAME EXPECT COMMAND...: run COMMAND; it passes when it exits 0 and its output contains
# EXPECT (a grep -E pattern; "" for none).
part() {
    local name=$1 expect=$2
    shift 2
    local log="$logs/$(echo "$name" | tr -c 'a-zA-Z0-9' '-').log" start=$SECONDS status=0
    echo "gpu-check: $name: $*"
    timeout -k 10 "$limit" "$@" >"$log" 2>&1 || status=$?
    if [ "$status" -eq 0 ] && { [ -z "$expect" ] || grep -Eq "$expect" "$log"; }; then
        record "$name" "passed" $((SECONDS - start))
    else
        record "$name" "FAILED (exit $status; $log)" $((SECONDS - start))
        tail -20 "$log" | sed 's/^/    /'
    fi
}

skip() { record "$1" "skipped ($2)" 0; }

every=("nccl: a world of 1 calling NCCL" "nccl: conformance kit, 2+ ranks" \
    "nccl: more ranks than GPUs refused" "gloo: CUDA tensors" "mpi: CUDA tensors" \
    "bench --device cuda" "nccl: DDP" "nccl: a skipped collective" \
    "nccl: a mismatched collective" "nccl: a tagged message" "pytest: CUDA-only tests" \
    "nccl: groups (split, a group of a group)")

if [ "$gpus" -eq 0 ]; then
    for name in "${every[@]}"; do skip "$name" "no GPU"; done
    summary
    echo
    echo "gpu-check: no GPU: skipped (torch sees no CUDA device on this machine)"
    rm -rf "$logs"
    exit 0
fi

echo "gpu-check: $gpus GPU(s) visible; logs in $logs"
part "${every[0]}" "^ok: a world of 1" "$py" scripts/gpu_check.py world-of-one
most=$((gpus < 4 ? gpus : 4))
if [ "$most" -ge 2 ]; then
    for n in $(seq 2 "$most"); do
        part "nccl: conformance kit, $n ranks" "passed" "${run[@]}" -n "$n" -m pytest -q \
            -p no:cacheprovider --pyargs distcomm.testing.conformance --distcomm-backend=nccl
    done
    part "${every[3]}" "ok: gloo moved" "${run[@]}" -n 2 --backend gloo scripts/gpu_check.py gloo-cuda
    part "${every[6]}" "ok: DDP" "${run[@]}" -n 2 --backend nccl scripts/gpu_check.py ddp
    part "${every[7]}" "DistTimeoutError after" "${run[@]}" -n 2 --backend nccl scripts/gpu_check.py timeout
    part "${every[8]}" "ok: rank 0: " "${run[@]}" -n 2 --backend nccl scripts/gpu_check.py mismatch
    part "${every[9]}" "ok: rank 0: " "${run[@]}" -n 2 --backend nccl scripts/gpu_check.py tags
    part "${every[11]}" "ok: rank 0: " "${run[@]}" -n "$most" --backend nccl scripts/gpu_check.py groups
else
    for i in 1 6 7 8 9 11; do skip "${every[$i]}" "needs 2 GPUs"; done
    # two ranks share the one GPU: gloo stages through host memory, so they may
    part "${every[3]}" "ok: gloo moved" "${run[@]}" -n 2 --backend gloo scripts/gpu_check.py gloo-cuda
fi
part "${every[2]}" "NCCL needs one GPU per rank" bash -c \
    "! ${run[*]} -n $((gpus + 1)) --backend nccl scripts/gpu_check.py init"
if "$py" -c 'from mpi4py import MPI; import sys; sys.exit(0 if MPI.Query_cuda_support() else 1)' 2>/dev/null; then
    part "${every[4]}" "ok: gloo moved" .venv/bin/mpirun -n 2 "$py" scripts/gpu_check.py gloo-cuda
else
    skip "${every[4]}" "MPI is not CUDA-aware"
fi
part "${every[5]}" "all_reduce" "${run[@]}" -n "$((most < 2 ? 1 : 2))" -m distcomm bench \
    --device cuda --sizes 8,1M --rounds 3 --quiet
part "${every[10]}" "passed" "$py" -m pytest -q -p no:cacheprovider backends/distcomm-torch/tests \
    -k "nccl or cuda or gpu"

summary
failed=0
for r in "${results[@]}"; do [[ "$r" == FAILED* ]] && failed=1; done
[ "$failed" -eq 0 ] && rm -rf "$logs"
exit "$failed"
