/* A stand-in libcuda for the loader tests (tests/test_cuda.c): the mock
   driver of mskv_mock_cuda.h behind the real library's entry points, so the
   layer's own loader (dlopen, cuGetProcAddress_v2) opens it like a driver.
   MSKV_FAKE_DRIVER_VERSION sets what cuDriverGetVersion reports (1000*major
   + 10*minor; default 12040, a CUDA 12.4 driver). Built by make as
   build/fake-cuda/libcuda.so.1, the name the loader asks for first. */
#include <stdlib.h>
#include <string.h>
#include "../mstar_kv.h"
#include "../mstar_kv_cuda.h"
#include "mskv_mock_cuda.h"

int cuInit(unsigned int flags) { return mmc_cuInit(flags); }

int cuDriverGetVersion(int *v) {
    const char *e = getenv("MSKV_FAKE_DRIVER_VERSION");
    *v = e && *e ? atoi(e) : 12040;
    return 0;
}

int cuGetErrorString(int e, const char **s) { return mmc_cuGetErrorString(e, s); }

/* every driver function of the layer's table by its name; 500 = CUDA_ERROR_NOT_FOUND */
int cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags, int *status) {
    mskv_cuda_functions t = mmc_table();
    (void)version; (void)flags;
    if (status) *status = 0;
    t.cuDriverGetVersion = cuDriverGetVersion;
#define FAKE_PROC(ret, name, sym, params) \
    if (strcmp(symbol, #name) == 0) { memcpy(pfn, &t.name, sizeof(void *)); return 0; }
    MSKV_CUDA_DRIVER_FUNCTIONS(FAKE_PROC)
#undef FAKE_PROC
    *pfn = NULL;
    return 500;
}
