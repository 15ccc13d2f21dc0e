#!/usr/bin/env bash
# Runs each test program given and adds up their "N passed, N failed, N skipped"
# lines into one closing line. A program that crashes or prints no totals
# counts as one failure. With no video test program (FFmpeg absent) that
# suite is reported as one skip, with the reason. A Windows program (*.exe)
# runs under wine (tests/wine.sh); without one (no mingw-w64), or where wine
# cannot run, that is one skip with the reason.
# With --build-status FILE first, a nonzero status in FILE (the build of the
# test programs failed) counts as one more failure.
set -u
passed=0; failed=0; skipped=0
have_video=0
have_windows=0
build_failed=0
if [ "${1:-}" = "--build-status" ]; then
  [ "$(cat "$2" 2>/dev/null || echo 1)" = 0 ] || build_failed=1
  shift 2
fi
for bin in "$@"; do
  run=("$bin")
  case "$bin" in
    *tests-video) have_video=1 ;;
    *.exe)
      have_windows=1
      if ! why=$(bash "$(dirname "$0")/wine.sh" --check 2>&1); then
        echo "skip [Windows tests under wine]: $why"
        skipped=$((skipped + 1)); continue
      fi
      run=(bash "$(dirname "$0")/wine.sh" "$bin") ;;
  esac
  echo "=== $bin"
  out=$(mktemp)
  "${run[@]}" 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  line=$(grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$out" | tail -n 1)
  rm -f "$out"
  if [ -z "$line" ]; then
    echo "!!! $bin exited with status $rc without a totals line"
    failed=$((failed + 1)); continue
  fi
  read -r p _ f _ s _ <<<"${line//,/}"
  passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
    echo "!!! $bin exited with status $rc"; failed=$((failed + 1))
  fi
done
if [ "$have_video" -eq 0 ]; then
  echo "skip [video round trip]: FFmpeg development libraries not found by pkg-config"
  skipped=$((skipped + 1))
fi
if [ "$have_windows" -eq 0 ]; then
  echo "skip [Windows tests under wine]: no Windows test program (mingw-w64 not found: Debian's gcc-mingw-w64-x86-64)"
  skipped=$((skipped + 1))
fi
if [ "$build_failed" -ne 0 ]; then
  echo "!!! building the test programs failed (see above): a program may be missing or out of date"
  failed=$((failed + 1))
fi
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
