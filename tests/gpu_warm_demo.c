/* gpu_warm_demo.c - demo/demo.c on the compile-only device of tests/gpu_warm.h,
   so `make gpu-warm` puts into the disk cache every variant the demo stage of
   tests/gpu_check.sh loads (that stage runs build/demo-gpu with --backend
   cuda; this is the same demo.c, its CUDA context on the compile-only table,
   its disk cache on, the self-test off). Nothing runs on the device, so the
   demo's own --check fails here: make gpu-warm ignores the exit status and
   reads only what was compiled. Build: the Makefile's build/demo-warm. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#define MSTAR_KV_IMPLEMENTATION
#include "../mstar_kv.h"
#define MSTAR_KV_CUDA_IMPLEMENTATION
#include "../mstar_kv_cuda.h"
#include "gpu_warm.h"

static const mskv_cuda_functions *gwd_functions(void) {
    char why[1024] = "";
    const mskv_cuda_functions *f = gpw_functions(why, sizeof why);
    if (!f) fprintf(stderr, "gpu warm (demo): no NVRTC to compile with: %s\n", why);
    return f;
}
static void gwd_hook(mskv_cuda_desc *cd) {
    cd->disable_disk_cache = 0;
    cd->selftest = MSKV_CUDA_SELFTEST_OFF;
}
#define DEMO_CUDA_FUNCTIONS gwd_functions()
#define DEMO_CUDA_DESC_HOOK gwd_hook
#include "../demo/demo.c"
