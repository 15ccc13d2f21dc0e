#!/usr/bin/env bash
# Runs a Windows test program (cross-compiled with mingw-w64) under wine:
# headless and quiet, in a throwaway prefix under build/ made on first use,
# and stops the wine server afterwards so that nothing is left running.
#   tests/wine.sh --check            exit 0 when wine runs programs here, else say why
#   tests/wine.sh PROGRAM.exe ARGS   run it; its exit status is the program's
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
export WINEPREFIX="${MSKV_WINEPREFIX:-$root/build/wine-prefix}"
export WINEDEBUG=-all                      # wine's own diagnostics would drown the test output
export WINEDLLOVERRIDES="mscoree,mshtml="  # no Mono or Gecko installer on first start
unset DISPLAY WAYLAND_DISPLAY              # console programs only: no window, no X server

wine=""
for c in /usr/lib/wine/wine64 wine64 wine; do
  if command -v "$c" >/dev/null 2>&1; then wine=$(command -v "$c"); break; fi
done
server=""
for c in /usr/lib/wine/wineserver64 wineserver64 wineserver; do
  if command -v "$c" >/dev/null 2>&1; then server=$(command -v "$c"); break; fi
done
if [ -z "$wine" ] || [ -z "$server" ]; then
  echo "wine not found (Debian: apt-get install wine64)"; exit 1
fi

stop_server() { "$server" -k >/dev/null 2>&1; "$server" -w >/dev/null 2>&1; }

# The first start builds the prefix (about 700 MB, several seconds); the
# server writes the registry when it exits, so wait for it.
if [ ! -f "$WINEPREFIX/system.reg" ]; then
  mkdir -p "$(dirname "$WINEPREFIX")"
  "$wine" wineboot --init >"$WINEPREFIX.log" 2>&1
  "$server" -w >/dev/null 2>&1
  if [ ! -f "$WINEPREFIX/system.reg" ]; then
    stop_server
    echo "wine could not create its prefix $WINEPREFIX: $(tail -n 1 "$WINEPREFIX.log" 2>/dev/null)"; exit 1
  fi
fi

if [ "${1:-}" = "--check" ]; then
  out=$("$wine" cmd.exe /c echo mskv-wine-ok 2>&1)
  # on success the server stays for the run that follows (it exits by itself 3 s after its last client)
  case "$out" in *mskv-wine-ok*) exit 0 ;; esac
  stop_server
  echo "wine cannot run a program here: $(printf '%s' "$out" | tail -n 1)"; exit 1
fi

# the C runtime writes text as CRLF: plain newlines for the totals line's readers
"$wine" "$@" 2>&1 | tr -d '\r'
rc=${PIPESTATUS[0]}
stop_server
exit $rc
