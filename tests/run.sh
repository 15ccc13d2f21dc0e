#!/usr/bin/env bash
# Runs each test program given and adds up their "N passed, N failed, N skipped"
# lines into one closing line. A program that crashes or prints no totals
# counts as one failure. With no video test program (FFmpeg absent) that
# suite is reported as one skip, with the reason. A Windows program (*.exe)
# runs under wine (tests/wine.sh); without one (no mingw-w64), or where wine
# cannot run, that is one skip with the reason.
#
#   bash tests/run.sh [-j N] [--build-status FILE] [--started EPOCH] [--build-cpu FILE] PROGRAM...
#
# -j N runs up to N programs at a time (default 1), started in the order
# given (put the long ones first). With one at a time a program's output
# streams as it runs; with more, each program's output is printed whole when
# it finishes, so it never interleaves with another's. Either way every
# program ends with a line giving its totals, its wall time and the CPU time
# it and its children used (on a machine busy with other work the wall time
# grows, the CPU time hardly), and the run ends with the times of all of
# them, then the totals line.
# With --build-status FILE, a nonzero status in FILE (the build of the test
# programs failed) counts as one more failure. With --started EPOCH (when
# the build began, in seconds), the last times line gives the whole time;
# --build-cpu FILE ("USER SYS" seconds of the build) adds the build's CPU.
set -u
jobs=1
build_failed=0
started=""
build_cpu=""
while [ $# -gt 0 ]; do
  case "$1" in
    -j) jobs=$2; shift 2 ;;
    -j*) jobs=${1#-j}; shift ;;
    --build-status) [ "$(cat "$2" 2>/dev/null || echo 1)" = 0 ] || build_failed=1; shift 2 ;;
    --started) started=$2; shift 2 ;;
    --build-cpu) build_cpu=$(awk '{ printf "%.1f", $1 + $2 }' "$2" 2>/dev/null); shift 2 ;;
    *) break ;;
  esac
done
case "$jobs" in ''|*[!0-9]*|0) echo "run.sh: -j expects a positive number, got '$jobs'"; exit 2 ;; esac

now() { if [ -n "${EPOCHREALTIME:-}" ]; then echo "${EPOCHREALTIME/,/.}"; else date +%s.%N; fi; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

here=$(dirname "$0")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
t_start=$(now)
passed=0; failed=0; skipped=0
have_video=0
have_windows=0
times=""
cpu_total=0
TIMEFORMAT='%U %S'   # what the time keyword reports: user and system CPU seconds

# one program: its output in $work/N.out, then "rc start end cpu" in $work/N.done
run_one() {
  local i=$1 bin=$2 t0 rc cpu
  local run=("$bin")
  case "$bin" in *.exe) run=(bash "$here/wine.sh" "$bin") ;; esac
  t0=$(now)
  if [ "$jobs" -eq 1 ]; then
    { time "${run[@]}" 2>&1 | tee "$work/$i.out"; rc=${PIPESTATUS[0]}; } 2> "$work/$i.cpu"
  else
    { time "${run[@]}" > "$work/$i.out" 2>&1; } 2> "$work/$i.cpu"
    rc=$?
  fi
  cpu=$(awk '{ printf "%.1f", $1 + $2 }' "$work/$i.cpu")
  echo "$rc $t0 $(now) ${cpu:-0}" > "$work/$i.done.tmp"
  mv "$work/$i.done.tmp" "$work/$i.done"
}

# reads a finished program's result, prints its closing line and adds it up
finish() {
  local i=$1 bin=$2 rc t0 t1 cpu line p f s dt
  read -r rc t0 t1 cpu < "$work/$i.done"
  dt=$(secs "$t0" "$t1")
  cpu_total=$(awk -v a="$cpu_total" -v b="$cpu" 'BEGIN { printf "%.1f", a + b }')
  if [ "$jobs" -gt 1 ]; then echo "=== $bin"; cat "$work/$i.out"; fi
  line=$(grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$work/$i.out" | tail -n 1)
  times="$times ${bin#"${B:-build}/"} ${dt}s (cpu ${cpu}s),"   # tests/fuzz/run.sh keeps its path
  if [ -z "$line" ]; then
    echo "!!! $bin exited with status $rc without a totals line (${dt} s, cpu ${cpu} s)"
    { echo "  $bin: exited with status $rc without a totals line; its last lines:"
      tail -n 8 "$work/$i.out" | sed 's/^/      /'; } >> "$work/failures"
    failed=$((failed + 1)); return
  fi
  read -r p _ f _ s _ <<<"${line//,/}"
  passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
  [ "$f" -eq 0 ] || failures "$bin" "$work/$i.out" >> "$work/failures"
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
    echo "!!! $bin exited with status $rc"; failed=$((failed + 1))
  fi
  echo "=== $bin: $line in ${dt} s (cpu ${cpu} s)"
}

# each failed test of a program with the last lines it printed, so that the
# end of a long log (all that a CI page may keep) says what failed and why
failures() {
  awk -v bin="$1" '
    /^\[ RUN  \]/ { n = 0; next }
    /^\[ FAIL \]/ {
      print "  " bin ": " $0
      for (k = (n > 8 ? n - 8 : 0); k < n; k++) print "      " buf[k % 8]
      n = 0; next
    }
    { buf[n % 8] = $0; n++ }' "$2"
}

# reports the programs that have finished; the others stay in "running"
reap() {
  local left=() r
  for r in "${running[@]+"${running[@]}"}"; do
    if [ -f "$work/${r%%:*}.done" ]; then finish "${r%%:*}" "${r#*:}"; else left+=("$r"); fi
  done
  [ "${#left[@]}" -lt "${#running[@]}" ] || sleep 0.2   # nothing finished yet
  running=("${left[@]+"${left[@]}"}")
}

running=()   # "index:program" of the programs started and not yet reported
n=0
for bin in "$@"; do
  case "$bin" in
    *tests-video) have_video=1 ;;
    *.exe)
      have_windows=1
      if ! why=$(bash "$here/wine.sh" --check 2>&1); then
        echo "skip [Windows tests under wine]: $why"
        skipped=$((skipped + 1)); continue
      fi ;;
  esac
  n=$((n + 1))
  if [ "$jobs" -eq 1 ]; then
    echo "=== $bin"
    run_one "$n" "$bin"
    finish "$n" "$bin"
    continue
  fi
  while [ "${#running[@]}" -ge "$jobs" ]; do
    wait -n 2>/dev/null || true
    reap
  done
  echo "--- started $bin"
  run_one "$n" "$bin" &
  running+=("$n:$bin")
done
while [ "${#running[@]}" -gt 0 ]; do
  wait -n 2>/dev/null || true
  reap
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
t_end=$(now)
if [ -s "$work/failures" ]; then
  echo "--- failed tests, each with the last lines it printed:"
  head -n 100 "$work/failures"
  total=$(wc -l < "$work/failures")
  [ "$total" -le 100 ] || echo "  ... $((total - 100)) more lines: each program's whole output is above"
fi
echo "--- wall time per program:${times%,}; all in $(secs "$t_start" "$t_end") s (cpu ${cpu_total} s), $jobs at a time"
if [ -n "$started" ]; then
  echo "--- build $(secs "$started" "$t_start") s${build_cpu:+ (cpu $build_cpu s)} + run $(secs "$t_start" "$t_end") s (cpu $cpu_total s) = $(secs "$started" "$t_end") s"
fi
if [ -n "$build_cpu" ]; then
  echo "--- CPU time, build and programs: $(awk -v a="$build_cpu" -v b="$cpu_total" 'BEGIN { printf "%.1f", a + b }') s ($(nproc 2>/dev/null || echo '?') cores here; load average now: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?'))"
fi
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
