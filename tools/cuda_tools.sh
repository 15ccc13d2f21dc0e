#!/bin/sh
# Installs nvdisasm and cuobjdump (the PyPI packages nvidia-cuda-nvdisasm and
# nvidia-cuda-cuobjdump) into a venv under build/ when they are missing, and
# links them into build/cuda-tools/bin, where bench/kernel_stats.c looks
# first. Quiet and idempotent: a second run does nothing.
#   usage: sh tools/cuda_tools.sh      (make kernel-stats and make test run it)
# Exit 0 when both tools are there afterwards, 1 otherwise (with the reason).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
dir=$root/build/cuda-tools
if [ -x "$dir/bin/nvdisasm" ] && [ -x "$dir/bin/cuobjdump" ]; then exit 0; fi
py=$(command -v python3 || true)
[ -n "$py" ] || { echo "cuda_tools: python3 not found"; exit 1; }
mkdir -p "$dir/bin"
if [ ! -x "$dir/venv/bin/pip" ]; then
    "$py" -m venv "$dir/venv" >/dev/null 2>&1 || { rm -rf "$dir/venv"; echo "cuda_tools: python3 -m venv failed (Debian: apt-get install python3-venv)"; exit 1; }
fi
# the 13.x tools read every sm_XY that NVRTC 12/13 emits
"$dir/venv/bin/pip" install -q --disable-pip-version-check "nvidia-cuda-nvdisasm>=13,<14" "nvidia-cuda-cuobjdump>=13,<14" \
    || { echo "cuda_tools: pip could not install nvidia-cuda-nvdisasm / nvidia-cuda-cuobjdump"; exit 1; }
for t in nvdisasm cuobjdump; do
    p=$(find "$dir/venv" -type f -name "$t" -perm -u+x | head -n 1)
    [ -n "$p" ] || { echo "cuda_tools: $t is not in the installed package"; exit 1; }
    ln -sf "$p" "$dir/bin/$t"
done
exit 0
