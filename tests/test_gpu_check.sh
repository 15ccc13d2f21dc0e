#!/usr/bin/env bash
# The GPU check's logic without a GPU (make test runs it as build/tests-gpu-check):
# tests/gpu_check.sh driving the real stage program built on the mock driver
# (build/gpu_check-mock: tests/gpu_check.c with -DGPC_MOCK, launches only
# counted, so its parity stages mismatch, as a broken kernel would) and a
# stand-in demo. Checked: the stage order, the results file, a mismatch that
# fails a stage without stopping its sweep, a planted SIGSEGV (crash), a
# planted hang (timeout under its budget, the next stage still runs), the
# total budget, and gpu-warm: after `gpu_check --warm` every stage's run
# compiles nothing and reads its variants from the disk cache.
# Prints the common totals line "N passed, N failed, N skipped".
set -u
cd "$(dirname "$0")/.."
B=${B:-build}
mock=$PWD/$B/gpu_check-mock
passed=0; failed=0; skipped=0
ok() { passed=$((passed + 1)); echo "  ok   $1"; }
bad() { failed=$((failed + 1)); echo "  FAIL $1"; [ -n "${2:-}" ] && sed 's/^/       | /' "$2" | tail -n 30; }
expect() {   # name, then a command that must succeed; $log is shown on failure
    local name=$1; shift
    if "$@"; then ok "$name"; else bad "$name" "${log:-}"; fi
}
if [ ! -x "$mock" ]; then
    echo "  skip $mock is not built (make $B/gpu_check-mock)"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/mskv-gpu-check.XXXXXX")
trap 'rm -rf "$work"' EXIT
# a stand-in demo: passes --check, the same latents with and without --offload
cat > "$work/demo" <<'EOF'
#!/bin/sh
echo "check: ok (stand-in demo: $*)"
echo "latent_hash=0123abcd"
EOF
chmod +x "$work/demo"
export GPU_CHECK_STAGE_CMD="$mock" GPU_CHECK_DEMO_CMD="$work/demo" GPU_CHECK_ARGS="--mini" MSKV_CACHE_DIR="$work/cache"
unset GPU_CHECK_PLANT GPU_CHECK_TOTAL
# run_check NAME [VAR=VALUE...]: the script into $work/NAME (results, logs), its exit status in $rc
run_check() {
    local name=$1; shift
    mkdir -p "$work/$name"
    log=$work/$name/out.txt
    env "$@" OUT="$work/$name" bash tests/gpu_check.sh > "$log" 2>&1
    rc=$?
    res=$work/$name/results.jsonl
}
status_of() { grep -o "{\"stage\":\"$1\",\"status\":\"[a-z]*\"" "$res" | sed 's/.*"status":"//; s/"$//'; }
why_of() { grep "{\"stage\":\"$1\"," "$res" | sed 's/.*"why":"//; s/"}$//'; }
seconds_of() { grep "{\"stage\":\"$1\"," "$res" | sed 's/.*"seconds":\([0-9.]*\).*/\1/'; }

echo "gpu_check.sh on the mock driver"
t0=$(date +%s)
run_check plain
expect "stages run in order: info mma sm90a selftest kvwrite demo figures flashinfer" \
    test "$(grep -o '{"stage":"[a-z0-9]*"' "$res" | cut -d'"' -f4 | tr '\n' ' ')" = "info mma sm90a selftest kvwrite demo figures flashinfer "
expect "every stage verdict has status, seconds and why" \
    test "$(grep -c '^{"stage":"[a-z0-9]*","status":"\(pass\|fail\|skip\|timeout\|crash\)","seconds":[0-9.]*,"why":".*"}$' "$res")" = 8
expect "info passes and reports the device in the results" \
    sh -c "[ '$(status_of info)' = pass ] && grep -q '^{\"info\":\"device\",\"name\":\"compile-only sm_90 (gpu-warm)\"' '$res'"
expect "a mismatching parity sweep fails its stage and goes on (cases = failed > 0, not stopped)" \
    sh -c "[ '$(status_of mma)' = fail ] && grep -q '^{\"check\":\"mma\",\"cases\":\([1-9][0-9]*\),\"failed\":\1,\"stopped\":false}' '$res'"
expect "the why of a mismatch says how many" sh -c "why='$(why_of mma)'; case \"\$why\" in *' of '*' cases mismatched') exit 0;; esac; exit 1"
expect "sm90a runs on the mock (compute capability 9.0) and fails its mismatches" test "$(status_of sm90a)" = fail
expect "selftest prints the context's self-test fields" \
    sh -c "[ '$(status_of selftest)' = pass ] && grep -q '^selftest      \[sm90a\] [0-9]* passed, [0-9]* failed' '$log'"
expect "the demo stage passes with the stand-in demo" test "$(status_of demo)" = pass
expect "figures pass and go to the results: chunk per path, decode and kv_write against the copy" \
    sh -c "[ '$(status_of figures)' = pass ] && grep -q '^{\"figure\":\"chunk_wgmma_page16\",\"value\":[0-9.e+-]*,\"unit\":\"TFLOP/s\"' '$res' &&
           grep -q '^{\"figure\":\"chunk_mma_page16\"' '$res' && grep -q '^{\"figure\":\"copy_dtod\"' '$res' &&
           grep -q '^{\"figure\":\"decode_batch\",\"value\":[0-9.e+-]*,\"unit\":\"GB/s\",\"peer\":[0-9.e+-]*,\"ratio\":[0-9.e+-]*}' '$res' &&
           grep -q '^{\"figure\":\"kv_write_chunk\",.*\"ratio\":[0-9.e+-]*}' '$res'"
expect "a failed stage makes the exit status 1 and the summary table lists every stage" \
    sh -c "[ $rc = 1 ] && grep -q '^  mma       fail' '$log' && grep -q '^  figures   pass' '$log' && grep -q '^gpu check: FAILED' '$log'"
expect "no line points at the attention hook that never existed" sh -c "! grep -q 'gpu_check_attn' '$log' '$work/plain/kvwrite.log'"
expect "each stage's output is kept in its log" test -s "$work/plain/mma.log"
if command -v python3 > /dev/null 2>&1; then
    expect "every line of the results file is one JSON object" \
        python3 -c 'import json, sys; [json.loads(l) for l in open(sys.argv[1])]' "$res"
else
    skipped=$((skipped + 1)); echo "  skip the results file's JSON (no python3)"
fi

run_check crash GPU_CHECK_PLANT=crash:sm90a
expect "a planted SIGSEGV: crash, with the signal" sh -c "[ '$(status_of sm90a)' = crash ] && [ '$(why_of sm90a)' = 'killed by SIGSEGV' ]"
expect "the stages after the crash still run" sh -c "[ '$(status_of selftest)' = pass ] && [ '$(status_of figures)' = pass ]"
expect "what the crashed stage printed before it died is kept" grep -q '^planted fault in sm90a' "$work/crash/sm90a.log"

run_check hang GPU_CHECK_PLANT=hang:selftest GPU_CHECK_BUDGET_selftest=2
expect "a planted hang under a 2 s budget: timeout" sh -c "[ '$(status_of selftest)' = timeout ] && case '$(why_of selftest)' in 'over its 2 s budget'*) exit 0;; esac; exit 1"
expect "the hung stage is stopped at its budget" awk -v s="$(seconds_of selftest)" 'BEGIN { exit !(s >= 1.5 && s < 9) }'
expect "the stage after the hang still runs" sh -c "[ '$(status_of kvwrite)' = fail ] || [ '$(status_of kvwrite)' = pass ]"
expect "the hang's output before the budget is kept (line-buffered)" grep -q '^planted hang in selftest' "$work/hang/selftest.log"

run_check total GPU_CHECK_PLANT=hang:mma GPU_CHECK_TOTAL=4
expect "the total budget caps a stage's own" sh -c "[ '$(status_of mma)' = timeout ] && case '$(why_of mma)' in 'over its '[1-4]' s budget'*) exit 0;; esac; exit 1"
expect "stages with no time left are skipped, and say so" \
    sh -c "[ '$(status_of figures)' = skip ] && [ '$(why_of figures)' = 'no time left of the 4 s' ]"

run_check nogpu GPU_CHECK_PLANT=nogpu
expect "no GPU: info skips with the reason, every later stage skips, exit status 77" \
    sh -c "[ $rc = 77 ] && [ '$(status_of info)' = skip ] && [ '$(why_of info)' = 'no usable GPU (planted)' ] &&
           [ '$(status_of figures)' = skip ] && [ '$(grep -c '"status":"skip"' "$res")' = 8 ]"

# gpu-warm: the stages on the compile-only device fill the cache; then their runs compile nothing
rm -rf "$work/cache"
log=$work/warm.txt
"$mock" --warm --mini > "$log" 2>&1
expect "gpu_check --warm succeeds on the compile-only device" test $? = 0
expect "the warm step compiled the variants" sh -c "grep -q '^jit           mma: [1-9][0-9]* compiled' '$log' && ls '$work/cache' | grep -q 'cubin$'"
run_check warmed
log=$work/warmed/out.txt
for s in mma sm90a selftest kvwrite figures; do
    expect "after gpu-warm, stage $s compiles nothing and reads the cache" \
        grep -q "^{\"jit\":\"$s\",\"compiles\":0,\"disk_hits\":[1-9][0-9]*}" "$res"
done
rm -rf "$work/cache"
run_check cold
expect "without gpu-warm the same stages compile (the control)" grep -q '^{"jit":"mma","compiles":[1-9][0-9]*,' "$res"
log=$work/parts.txt
rm -rf "$work/cache"
{ "$mock" --warm --mini --stage kvwrite --part 0/2 && "$mock" --warm --mini --stage kvwrite --part 1/2; } > "$log" 2>&1
GPU_CHECK_RESULTS="$work/parts.jsonl" "$mock" --mini --stage kvwrite >> "$log" 2>&1
expect "gpu-warm's two shares of kv_write cover all of it" grep -q '^{"jit":"kvwrite","compiles":0,"disk_hits":[1-9]' "$work/parts.jsonl"
echo "  (${0##*/}: $(($(date +%s) - t0)) s)"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
