#!/usr/bin/env bash
# Runs every libFuzzer harness of tests/fuzz for FUZZ_SECONDS seconds each
# (default 20) over its committed corpus (tests/fuzz/corpus/NAME) plus, for
# the import harnesses (import, import_stream: the streamed import against the
# whole one), seeds freshly exported by the current library (build/gen-corpus)
# and the findings of earlier runs (tests/fuzz/regressions/NAME).
# Each harness first replays every committed finding of
# tests/fuzz/regressions/NAME once (a finding that crashes again fails at
# once), then fuzzes with a seed that changes per run, printed on its own
# line so a run can be repeated. New inputs go to a scratch directory, not
# the committed corpus. A crash, sanitizer report, broken check, leak,
# timeout or out-of-memory is a failure; its input is kept in
# build/fuzz-findings/ and copied into tests/fuzz/regressions/NAME/ (commit
# it: tests/test_fuzz_regressions.c replays every file there, and so does
# this script). Prints executions per harness and closes with
# "N passed, N failed, N skipped".
#   FUZZ_SECONDS=N  seconds per harness     B=DIR     the build directory
#   FUZZ_SEED=N     libFuzzer's seed for every harness (else a fresh one per harness, printed)
#   FUZZ_RUNS=N     stop after N executions instead of after FUZZ_SECONDS: with FUZZ_SEED,
#                   a run that repeats exactly (a time budget ends at a different execution)
#   FUZZ_ONLY=NAME  one harness
#   FUZZ_KEEP=DIR   keep the inputs found in DIR/NAME (to grow the committed corpus with -merge=1)
set -u
secs=${FUZZ_SECONDS:-20}
B=${B:-build}
here=$(cd "$(dirname "$0")" && pwd)
passed=0; failed=0
mkdir -p "$B/fuzz-findings"
for name in import import_stream ops plans arith; do
  [ -n "${FUZZ_ONLY:-}" ] && [ "$FUZZ_ONLY" != "$name" ] && continue
  bin=$B/fuzz-$name
  if [ ! -x "$bin" ]; then
    echo "FAIL fuzz-$name: $bin was not built"; failed=$((failed + 1)); continue
  fi
  work=$(mktemp -d); out=$(mktemp)
  if [ -n "${FUZZ_KEEP:-}" ]; then rmdir "$work"; work=$FUZZ_KEEP/$name; mkdir -p "$work"; fi
  dirs=("$work" "$here/corpus/$name")
  [ "$name" = import_stream ] && dirs+=("$here/corpus/import")   # every import seed is a stream seed, delivered in order
  if { [ "$name" = import ] || [ "$name" = import_stream ]; } && [ -x "$B/gen-corpus" ]; then
    mkdir -p "$work/seeds"
    if "$B/gen-corpus" "$work/seeds"; then dirs+=("$work/seeds"); else echo "note: gen-corpus failed; committed seeds only"; fi
  fi
  # the committed findings: each replayed once (files as arguments run once each), and seeds
  reg=$here/regressions/$name
  found=()
  if [ -d "$reg" ]; then
    for f in "$reg"/*; do [ -f "$f" ] && found+=("$f"); done
  fi
  if [ "${#found[@]}" -gt 0 ]; then
    if ! "$bin" -timeout=20 -rss_limit_mb=2048 "${found[@]}" >"$out" 2>&1; then
      echo "FAIL fuzz-$name: a committed finding of tests/fuzz/regressions/$name crashes again"
      grep -E 'Running: |FUZZ FINDING|ERROR: |runtime error|SUMMARY|^    #[0-9] ' "$out" | head -n 30
      failed=$((failed + 1))
      [ -n "${FUZZ_KEEP:-}" ] || rm -rf "$work"
      rm -f "$out"
      continue
    fi
    dirs+=("$reg")
  fi
  # a fresh seed per harness and run (libFuzzer's is 1 .. 2^32 - 1), unless FUZZ_SEED names one
  if [ -n "${FUZZ_SEED:-}" ]; then
    seed=$FUZZ_SEED
  else
    seed=$(( ( ( $(date +%s%N) / 1000 ) ^ ( $$ << 16 ) ^ RANDOM ) % 4294967295 + 1 ))
  fi
  echo "fuzz-$name: seed $seed (replay: FUZZ_SEED=$seed FUZZ_ONLY=$name make fuzz)"
  budget=(-max_total_time="$secs"); [ -n "${FUZZ_RUNS:-}" ] && budget=(-runs="$FUZZ_RUNS")
  art=$B/fuzz-findings/$name-$seed-$$/
  rm -rf "$art"; mkdir -p "$art"
  t0=$(date +%s.%N)
  "$bin" -seed="$seed" "${budget[@]}" -print_final_stats=1 -timeout=20 -rss_limit_mb=2048 \
         -artifact_prefix="$art" "${dirs[@]}" >"$out" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out" | tail -n 1)
  [ -n "$runs" ] || runs=$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' "$out" | tail -n 1)
  cov=$(grep -oE 'cov: [0-9]+' "$out" | tail -n 1)
  rate=$(awk -v r="${runs:-0}" -v a="$t0" -v b="$t1" 'BEGIN { d = b - a; printf "%.0f", (d > 0 ? r / d : 0) }')
  # what libFuzzer wrote for a failure (not slow-unit-*, which is no failure): kept as a regression
  kept=0
  for f in "$art"crash-* "$art"leak-* "$art"timeout-* "$art"oom-*; do
    [ -f "$f" ] || continue
    mkdir -p "$reg"
    cp "$f" "$reg/$(basename "$f")-seed$seed"
    echo "kept tests/fuzz/regressions/$name/$(basename "$f")-seed$seed (commit it: tests/test_fuzz_regressions.c replays it)"
    kept=$((kept + 1))
  done
  if [ "$rc" -eq 0 ] && [ -n "$runs" ] && [ "$kept" -eq 0 ]; then
    echo "ok   fuzz-$name: ${runs} executions in $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}') s (${rate}/s), ${cov:-cov: ?}, seed $seed, ${#found[@]} committed findings replayed"
    passed=$((passed + 1))
    rm -rf "$art"
  else
    echo "FAIL fuzz-$name (exit $rc, seed $seed, ${runs:-?} executions): the finding, then the input kept in $art and tests/fuzz/regressions/$name/"
    grep -E 'FUZZ FINDING|ERROR: |runtime error|SUMMARY|^    #[0-9] |Test unit written' "$out" | head -n 30
    failed=$((failed + 1))
  fi
  [ -n "${FUZZ_KEEP:-}" ] || rm -rf "$work"
  rm -f "$out"
done
echo "$passed passed, $failed failed, 0 skipped"
[ "$failed" -eq 0 ]
