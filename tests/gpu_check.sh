#!/bin/sh
# The GPU check: builds tests/gpu_check.c (needs only a C compiler and -ldl;
# the CUDA driver and NVRTC are loaded at run time) and runs it against the
# CPU backend. Exit 0 = passed, 1 = a mismatch or error, 77 = no usable GPU.
#   bash tests/gpu_check.sh [--quick]        (make gpu-check runs this)
# Hooks for the attention kernels: tests/gpu_check_attn.h (compiled in when it
# exists, see gpu_check.c) and bench/gpu_bench.c (built and run after the
# check when it exists). Kernels are cached in $MSKV_CACHE_DIR
# (default here: build/nvrtc-cache), so a second run compiles nothing.
set -eu
cd "$(dirname "$0")/.."
mkdir -p build
CC=${CC:-cc}
defs=""
if [ -f tests/gpu_check_attn.h ]; then defs="-DMSKV_GPU_CHECK_ATTN"; fi
$CC -std=c99 -O2 -g -Wall -Wextra -pedantic -Werror $defs -Itests tests/gpu_check.c -o build/gpu_check -ldl -lpthread -lm
export MSKV_CACHE_DIR="${MSKV_CACHE_DIR:-$PWD/build/nvrtc-cache}"
status=0
timeout 280 ./build/gpu_check "$@" || status=$?
if [ "$status" -eq 124 ]; then echo "gpu check: timed out after 280 s"; exit 1; fi
if [ "$status" -ne 0 ]; then exit "$status"; fi
if [ -f bench/gpu_bench.c ]; then
    $CC -std=c99 -O2 -g -Wall -Wextra -pedantic -Werror bench/gpu_bench.c -o build/gpu_bench -ldl -lpthread -lm
    timeout 200 ./build/gpu_bench || exit 1
fi
