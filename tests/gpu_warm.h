/* gpu_warm.h - the compile-only device of `make gpu-warm` (tests/gpu_check.c
   --warm and the demo's warm build, tests/gpu_warm_demo.c).

   The GPU check must compile nothing on the GPU machine: its cold JIT (every
   variant it loads, 1-2 s each, the sm_90a ones longer) would eat the
   budget of a short device run. So `make gpu-warm` runs the check's own
   stage code, unchanged, on a device that runs nothing: the mock driver of
   tests/mskv_mock_cuda.h (host memory, launches only counted) reporting an
   H100/H200 (compute capability 9.0, 132 SMs, 227 KiB of opt-in shared
   memory), with the real NVRTC put in the table. Every variant the stages
   ask for is then compiled by the same path a GPU run takes (the same -D
   options, the same target sm_90 / sm_90a, the same NVRTC version), so the
   disk cache gets exactly the keys the device run looks up; nothing has to
   list the variants, so nothing can drift from the launch code.

   The driver version the table reports is the one the NVRTC's CUDA major
   needs (a driver that loads what this NVRTC writes), so the loader takes
   this NVRTC whatever it compares. The warm cache serves a GPU machine whose
   run chooses the same NVRTC version (the key holds it): warm with the NVRTC
   that machine will load (MSKV_NVRTC_PATH picks one).

   Use: gpw_functions(why, cap) returns the table (NULL with why when no
   NVRTC loads); pass it as mskv_cuda_desc.functions with the self-test off
   (nothing runs, so it could only fail). With GPW_MOCK_NVRTC the mock's own
   NVRTC stays (the tests: a fake image per variant, keys all the same). */
#ifndef MSKV_GPU_WARM_H
#define MSKV_GPU_WARM_H
#include "mskv_mock_cuda.h"

static int gpw_driver_version = 12040;

static mskv_cu_result gpw_cuDriverGetVersion(int *v) { *v = gpw_driver_version; return 0; }
static mskv_cu_result gpw_cuDeviceGetAttribute(int *v, int a, mskv_cu_device d) {
    (void)d;
    *v = a == MSKV_CU_ATTR_CC_MAJOR ? 9 : a == MSKV_CU_ATTR_CC_MINOR ? 0 : a == MSKV_CU_ATTR_MULTIPROCESSOR_COUNT ? 132 :
         a == MSKV_CU_ATTR_MAX_SMEM_OPTIN ? 227 * 1024 : 0;
    return 0;
}
static mskv_cu_result gpw_cuDeviceGetName(char *name, int len, mskv_cu_device d) {
    (void)d;
    snprintf(name, (size_t)len, "compile-only sm_90 (gpu-warm)");
    return 0;
}

static const mskv_cuda_functions *gpw_functions(char *why, size_t cap) {
    static mskv_cuda_functions f;
    static int ready;
    int major = 0, minor = 0;
    if (ready) return &f;
    f = mmc_table();
#ifndef GPW_MOCK_NVRTC
    {
        mskv_cuda_functions nv;
        memset(&nv, 0, sizeof nv);
        if (mskv__cuda_load(0, 1, NULL, 0, &nv, why, cap) != MSKV_SUCCESS) return NULL;
#define GPW_NVRTC(ret, name, sym, params) f.name = nv.name;
        MSKV_CUDA_NVRTC_FUNCTIONS(GPW_NVRTC)
#undef GPW_NVRTC
    }
#else
    (void)why; (void)cap;
#endif
    if (f.nvrtcVersion(&major, &minor) == 0 && major * 1000 + minor * 10 > gpw_driver_version)
        gpw_driver_version = major * 1000 + minor * 10;
    f.cuDriverGetVersion = gpw_cuDriverGetVersion;
    f.cuDeviceGetAttribute = gpw_cuDeviceGetAttribute;
    f.cuDeviceGetName = gpw_cuDeviceGetName;
    ready = 1;
    return &f;
}
#endif
