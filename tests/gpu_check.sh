#!/bin/sh
# The GPU check: builds tests/gpu_check.c (needs only a C compiler and -ldl;
# the CUDA driver and NVRTC are loaded at run time) and runs it against the
# CPU backend. Exit 0 = passed, 1 = a mismatch or error (or a GPU without
# NVRTC: the fix is printed), 77 = no GPU.
#   bash tests/gpu_check.sh [--quick]        (make gpu-check runs this)
# Then the demo on the GPU (both modes, --check). Hooks for the attention kernels: tests/gpu_check_attn.h (compiled in when it
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
# one budget for everything: the whole check stays under 5 minutes
start=$(date +%s)
budget=290
if [ -f bench/gpu_bench.c ]; then
    $CC -std=c99 -O2 -g -Wall -Wextra -pedantic -Werror bench/gpu_bench.c -o build/gpu_bench -ldl -lpthread -lm
fi
status=0
timeout "$budget" ./build/gpu_check "$@" || status=$?
if [ "$status" -eq 124 ]; then echo "gpu check: timed out after $budget s"; exit 1; fi
if [ "$status" -ne 0 ]; then exit "$status"; fi
# the demo on the device store: both modes pass --check, and offload through
# the store's ops leaves the latents bit-identical
$CC -std=c99 -O2 -Wall -Wextra -pedantic -Werror -DMSKV_DEMO_NO_FFMPEG demo/demo.c -o build/demo-gpu -ldl -lpthread -lm
for run in "kv:" "offload:--offload" "chained:--mode chained"; do
    name=${run%%:*}
    timeout 60 ./build/demo-gpu --backend cuda ${run#*:} --check -q -o build/demo-gpu.y4m > build/demo-gpu-$name.txt \
        || { cat build/demo-gpu-$name.txt; echo "demo on the GPU ($name): FAIL"; exit 1; }
    grep '^check:' build/demo-gpu-$name.txt
done
[ "$(grep -o 'latent_hash=[0-9a-f]*' build/demo-gpu-kv.txt)" = "$(grep -o 'latent_hash=[0-9a-f]*' build/demo-gpu-offload.txt)" ] \
    || { echo "demo on the GPU: offload changed the latents"; exit 1; }
echo "demo on the GPU: kv, offload and chained pass --check"
if [ -x build/gpu_bench ] && [ -f bench/gpu_bench.c ]; then
    left=$((budget - ($(date +%s) - start)))
    if [ "$left" -lt 10 ]; then echo "gpu check: no time left for bench/gpu_bench"; exit 1; fi
    status=0
    timeout "$left" ./build/gpu_bench || status=$?
    if [ "$status" -eq 124 ]; then echo "gpu check: bench/gpu_bench timed out ($left s left of $budget)"; exit 1; fi
    [ "$status" -eq 0 ] || exit 1
fi
echo "gpu check: done in $(($(date +%s) - start)) s"
