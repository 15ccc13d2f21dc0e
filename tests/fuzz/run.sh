#!/usr/bin/env bash
# Runs every libFuzzer harness of tests/fuzz for FUZZ_SECONDS seconds each
# (default 20) over its committed corpus (tests/fuzz/corpus/NAME) plus, for
# the import harnesses (import, import_stream: the streamed import against the
# whole one), seeds freshly exported by the current library (build/gen-corpus). New inputs go to a scratch directory, not the
# committed corpus. A crash, sanitizer report or broken check is a failure;
# its input is kept in build/fuzz-findings/. Prints executions per second
# per harness and closes with "N passed, N failed, N skipped".
#   FUZZ_SECONDS=N  seconds per harness     B=DIR     the build directory
#   FUZZ_SEED=N     libFuzzer's seed (else its own, printed)
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
  seed_arg=(); [ -n "${FUZZ_SEED:-}" ] && seed_arg=(-seed="$FUZZ_SEED")
  t0=$(date +%s.%N)
  "$bin" "${seed_arg[@]}" -max_total_time="$secs" -print_final_stats=1 -timeout=20 -rss_limit_mb=2048 \
         -artifact_prefix="$B/fuzz-findings/$name-" "${dirs[@]}" >"$out" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out" | tail -n 1)
  seed=$(sed -n 's/^INFO: Seed: *//p' "$out" | head -n 1)
  cov=$(grep -oE 'cov: [0-9]+' "$out" | tail -n 1)
  rate=$(awk -v r="${runs:-0}" -v a="$t0" -v b="$t1" 'BEGIN { d = b - a; printf "%.0f", (d > 0 ? r / d : 0) }')
  if [ "$rc" -eq 0 ] && [ -n "$runs" ]; then
    echo "ok   fuzz-$name: ${runs} executions in $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}') s (${rate}/s), ${cov:-cov: ?}, seed ${seed:-?}"
    passed=$((passed + 1))
  else
    echo "FAIL fuzz-$name (exit $rc, seed ${seed:-?}): the finding, then the input kept in $B/fuzz-findings/"
    grep -E 'FUZZ FINDING|ERROR: |runtime error|SUMMARY|^    #[0-9] |Test unit written' "$out" | head -n 30
    failed=$((failed + 1))
  fi
  [ -n "${FUZZ_KEEP:-}" ] || rm -rf "$work"
  rm -f "$out"
done
echo "$passed passed, $failed failed, 0 skipped"
[ "$failed" -eq 0 ]
