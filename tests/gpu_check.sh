#!/usr/bin/env bash
# The GPU check: one prepared run that answers every question even when a
# stage faults, hangs or runs out of time. `make gpu-check` runs it.
#   bash tests/gpu_check.sh [--quick]
#
# Stages, in this order (the most valuable first, so a run that dies late
# has still answered them), each in its own process under its own budget
# (timeout), so a fault (a lost context, a SIGSEGV) or a hang in one cannot
# hide the others:
#   build     make build/gpu_check build/demo-gpu (nothing when they are current)
#   info      device, driver, the NVRTC chosen and why (mskv_cuda_info)
#   mma       mma.sync attention parity (forced: MSKV_CUDA_ATTN_MMA), every variant
#   sm90a     sm_90a (wgmma) prefill parity; skipped, with the reason, off compute capability 9.0
#   selftest  the known-answer self-tests of the variants one attention per path loads
#   kvwrite   kv_write (every dtype x head_dim x RoPE), offload round trips, graph replay, store speed
#   demo      demo/demo.c --backend cuda --check: kv, offload (latents bit-identical) and chained
#   figures   Wan chunk TFLOP/s per path (4,680 queries = 3 latent frames of 1,560 tokens, head_dim
#             128) beside PyTorch SDPA (bench/sdpa_peer.py, when torch imports); decode and kv_write
#             GB/s as a ratio of the device copy (cuMemcpyDtoD) measured in the same run
#   flashinfer FlashInfer's paged wrappers over mstar_kv's pages and token-exact plans against the
#             store's attention (python/tests/gpu_flashinfer_check.py); skipped when flashinfer or
#             torch does not import
# The stages are one program, build/gpu_check --stage NAME (tests/gpu_check.c:
# the store checks, and bench/gpu_bench.c's parity sweep and figures), and the
# demo; one binary keeps one build and one set of kernel variants to warm.
# A sweep stops at its first failed call (after a CUDA error the context is
# gone), never at a mismatch: mismatches are counted and the sweep goes on.
#
# Time: 405 s in all (GPU_CHECK_TOTAL: under the 420 s one device command may take), the stage budgets below (each
# GPU_CHECK_BUDGET_<stage> overrides one), a stage never past what is left.
# Nothing should compile on the GPU machine: run `make gpu-warm` first (no GPU
# needed; it fills build/nvrtc-cache, or $MSKV_CACHE_DIR, with every kernel
# variant these stages load for sm_90 and sm_90a, and builds the programs)
# and carry that cache directory (and build/gpu_check, build/demo-gpu) to the
# GPU machine; the "jit" lines then say 0 compiled. The cache serves an NVRTC
# of the version that warmed it (its key holds the version).
#
# Output is line-buffered (a budget that kills a stage loses nothing it
# printed), each stage's also in build/gpu-check/<stage>.log, and every
# verdict and figure goes as JSON lines to build/gpu-check/results.jsonl
# ($OUT/results.jsonl when OUT is set):
#   {"stage":..., "status":"pass|fail|skip|timeout|crash", "seconds":..., "why":...}
#   {"figure":..., "value":..., "unit":..., "peer":..., "ratio":...}
# (and the stage programs' own {"info":...}, {"check":...}, {"jit":...} lines).
# The end prints a table of the stages. Exit status: 0 every stage passed or
# was skipped for a reason, 1 a stage failed, timed out or crashed, 77 no GPU.
#
# For the tests (tests/test_gpu_check.sh, on the mock driver): GPU_CHECK_STAGE_CMD
# (the stage program, default build/gpu_check), GPU_CHECK_DEMO_CMD (the demo,
# default build/demo-gpu), GPU_CHECK_ARGS (more arguments to every stage),
# GPU_CHECK_NO_BUILD=1 (no build stage).
set -u
cd "$(dirname "$0")/.."
B=${B:-build}
if [ "${1:-}" = "--demo-stage" ]; then
    # the demo stage, in its own process: both modes pass --check, and offload
    # through the store's ops leaves the latents bit-identical
    demo=${GPU_CHECK_DEMO_CMD:-$B/demo-gpu}
    dir=$2
    for run in "kv:" "offload:--offload" "chained:--mode chained"; do
        name=${run%%:*}
        # shellcheck disable=SC2086
        $demo --backend cuda ${run#*:} --check -q -o "$dir/demo-$name.y4m" > "$dir/demo-$name.txt" 2>&1
        rc=$?
        if [ "$rc" -ne 0 ]; then
            cat "$dir/demo-$name.txt"
            echo "why: the demo ($name) exited with status $rc"
            [ "$rc" -gt 128 ] && exit "$rc"
            exit 1
        fi
        grep '^check:' "$dir/demo-$name.txt"
    done
    a=$(grep -o 'latent_hash=[0-9a-f]*' "$dir/demo-kv.txt"); b=$(grep -o 'latent_hash=[0-9a-f]*' "$dir/demo-offload.txt")
    if [ -z "$a" ] || [ "$a" != "$b" ]; then echo "why: offload changed the latents ($a vs $b)"; exit 1; fi
    echo "demo on the GPU: kv, offload and chained pass --check"
    exit 0
fi

quick=""
for a in "$@"; do
    case "$a" in
        --quick) quick="--quick" ;;
        *) echo "usage: bash tests/gpu_check.sh [--quick]"; exit 2 ;;
    esac
done
total=${GPU_CHECK_TOTAL:-405}
dir=${OUT:-$B/gpu-check}
mkdir -p "$dir"
results=$dir/results.jsonl
: > "$results"
export GPU_CHECK_RESULTS="$PWD/$results"
case "$results" in /*) export GPU_CHECK_RESULTS="$results" ;; esac
export MSKV_CACHE_DIR="${MSKV_CACHE_DIR:-$PWD/$B/nvrtc-cache}"
stage_cmd=${GPU_CHECK_STAGE_CMD:-$B/gpu_check}
extra=${GPU_CHECK_ARGS:-}
py=$B/venv/bin/python   # the flashinfer stage's interpreter (make python), else the system's
[ -x "$py" ] || py=python3
lb=""
command -v stdbuf > /dev/null 2>&1 && lb="stdbuf -oL -eL"

# default budgets (seconds): the sum is the total
budget_of() {
    local v def
    case "$1" in
        build) def=40 ;; info) def=20 ;; mma) def=75 ;; sm90a) def=75 ;; selftest) def=25 ;;
        kvwrite) def=55 ;; demo) def=40 ;; figures) def=55 ;; flashinfer) def=20 ;; *) def=20 ;;
    esac
    v=$(printenv "GPU_CHECK_BUDGET_$1" || true)
    echo "${v:-$def}"
}

start=$(date +%s.%N)
elapsed() { awk -v s="$start" -v n="$(date +%s.%N)" 'BEGIN { printf "%d", n - s }'; }
json_escape() { printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' | tr -d '\000-\037'; }
names=(); statuses=(); times=(); whys=()
verdict() {   # name status seconds why
    names+=("$1"); statuses+=("$2"); times+=("$3"); whys+=("$4")
    printf '{"stage":"%s","status":"%s","seconds":%s,"why":"%s"}\n' "$1" "$2" "$3" "$(json_escape "$4")" >> "$results"
    echo "=== $1: $2 (${3} s)${4:+: $4}"
}
no_gpu=""
# run_stage NAME COMMAND...: the command in its own process, under the stage's budget
run_stage() {
    local name=$1 budget left t0 t rc why status log
    shift
    log=$dir/$name.log
    budget=$(budget_of "$name")
    left=$((total - $(elapsed)))
    echo "=== $name (budget ${budget} s, ${left} s left of ${total})"
    if [ -n "$no_gpu" ] && [ "$name" != build ]; then verdict "$name" skip 0 "no GPU (see stage info)"; return; fi
    if [ "$left" -lt 3 ]; then verdict "$name" skip 0 "no time left of the ${total} s"; return; fi
    [ "$budget" -gt "$left" ] && budget=$left
    t0=$(date +%s.%N)
    # shellcheck disable=SC2086
    $lb timeout -k 5 "$budget" "$@" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    t=$(awk -v s="$t0" -v n="$(date +%s.%N)" 'BEGIN { printf "%.1f", n - s }')
    why=$(grep '^why: ' "$log" | tail -n 1 | cut -c6-)
    case "$rc" in
        0) status=pass ;;
        77) status=skip ;;
        124|137) status=timeout; why="over its ${budget} s budget${why:+ (last said: $why)}" ;;
        *) if [ "$rc" -gt 128 ]; then
               status=crash; why="killed by SIG$(kill -l $((rc - 128)) 2>/dev/null || echo $((rc - 128)))${why:+ ($why)}"
           else
               status=fail; [ -z "$why" ] && why="exit status $rc"
           fi ;;
    esac
    verdict "$name" "$status" "$t" "$why"
    if [ "$name" = info ] && [ "$status" = skip ]; then no_gpu=${why:-the info stage found none}; fi
}

echo "gpu check: ${total} s in all; results in $results; kernel cache $MSKV_CACHE_DIR"
if [ -z "${GPU_CHECK_NO_BUILD:-}" ] && [ -z "${GPU_CHECK_STAGE_CMD:-}" ]; then
    run_stage build make -s -j2 --no-print-directory "$B/gpu_check" "$B/demo-gpu"
fi
# shellcheck disable=SC2086
{
run_stage info     $stage_cmd --stage info $quick $extra
run_stage mma      $stage_cmd --stage mma $quick $extra
run_stage sm90a    $stage_cmd --stage sm90a $quick $extra
run_stage selftest $stage_cmd --stage selftest $quick $extra
run_stage kvwrite  $stage_cmd --stage kvwrite $quick $extra
run_stage demo     bash "$0" --demo-stage "$dir"
run_stage figures  $stage_cmd --stage figures $quick $extra
run_stage flashinfer "$py" python/tests/gpu_flashinfer_check.py
}

echo
echo "gpu check: $(elapsed) s of ${total}"
printf '  %-9s %-8s %7s  %s\n' stage status seconds why
bad=0
for i in "${!names[@]}"; do
    printf '  %-9s %-8s %7s  %s\n' "${names[$i]}" "${statuses[$i]}" "${times[$i]}" "${whys[$i]}"
    case "${statuses[$i]}" in fail|timeout|crash) bad=1 ;; esac
done
if [ "$bad" -ne 0 ]; then echo "gpu check: FAILED"; exit 1; fi
if [ -n "$no_gpu" ]; then echo "gpu check: no GPU, nothing checked"; exit 77; fi
echo "gpu check: passed"
