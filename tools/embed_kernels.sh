#!/bin/sh
# Regenerates the embedded copy of kernels.cu inside mstar_kv_cuda.h: the
# lines between "/* >>kernels-begin */" and "/* >>kernels-end */" (the fenced
# block at the end of the header, after all of its code) become one C string
# literal per source line (C99 only promises 4095-character literals).
# Deterministic: same kernels.cu, same output. POSIX sh + awk, C locale.
#   usage: sh tools/embed_kernels.sh [kernels.cu [mstar_kv_cuda.h]]
#   --check: exit 1 (and change nothing) when the embedded copy is stale.
set -eu
check=0
if [ "${1:-}" = "--check" ]; then check=1; shift; fi
root=$(cd "$(dirname "$0")/.." && pwd)
src=${1:-$root/kernels.cu}
hdr=${2:-$root/mstar_kv_cuda.h}
[ -f "$src" ] || { echo "embed_kernels: $src not found" >&2; exit 2; }
[ -f "$hdr" ] || { echo "embed_kernels: $hdr not found" >&2; exit 2; }
LC_ALL=C
export LC_ALL
tmp=$(mktemp "${hdr}.XXXXXX")
trap 'rm -f "$tmp"' EXIT
# od turns every byte of the source into a decimal number, so awk never has
# to read a raw byte (NUL, a missing final newline, non-ASCII are all exact).
od -An -v -tu1 "$src" | awk -v hdr="$hdr" '
function flush_line(   s) {
    s = "    \"" cur "\","
    body[nb++] = s
    cur = ""; open = 0
}
BEGIN {
    for (i = 32; i < 127; i++) chr[i] = sprintf("%c", i)
    chr[34] = "\\\""; chr[92] = "\\\\"
    chr[63] = "?"     # trigraphs handled below
    cur = ""; open = 0; nb = 0; prevq = 0
}
{
    for (f = 1; f <= NF; f++) {
        b = $f + 0
        open = 1
        if (b == 10) { cur = cur "\\n"; flush_line(); prevq = 0; continue }
        if (b == 9) { cur = cur "\\t"; prevq = 0; continue }
        if (b == 63) {
            # "??" would start a trigraph in C99: escape the second one
            if (prevq) cur = cur "\\?"; else { cur = cur "?"; prevq = 1 }
            continue
        }
        prevq = 0
        if (b >= 32 && b < 127) cur = cur chr[b]
        else cur = cur sprintf("\\%03o", b)
    }
}
END {
    if (open) flush_line()
    if (nb == 0) body[nb++] = "    \"\","
    state = 0
    while ((getline line < hdr) > 0) {
        if (state == 0) {
            print line
            if (line ~ /^\/\* >>kernels-begin \*\/$/) {
                state = 1
                print "static const char *const mskv__cuda_kernel_lines[] = {"
                for (i = 0; i < nb; i++) print body[i]
                print "};"
            }
        } else if (state == 1) {
            if (line ~ /^\/\* >>kernels-end \*\/$/) { print line; state = 2 }
        } else print line
    }
    if (state != 2) { print "embed_kernels: markers not found in " hdr > "/dev/stderr"; exit 3 }
}' > "$tmp"
if [ "$check" = 1 ]; then
    if cmp -s "$tmp" "$hdr"; then exit 0; fi
    echo "embed_kernels: the copy of $src in $hdr is stale; run sh tools/embed_kernels.sh" >&2
    exit 1
fi
if cmp -s "$tmp" "$hdr"; then exit 0; fi
cat "$tmp" > "$hdr"
