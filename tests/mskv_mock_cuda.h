/* mskv_mock_cuda.h - a small mock CUDA driver + NVRTC table for tests that
   need a device store without a GPU (the fuzzers, the allocation-failure
   test). Device memory is host memory (so ASan sees every byte), copies are
   immediate, events are always complete, NVRTC "compiles" to a token image,
   and kernel launches only count: what these tests check is the host side.
   Single-threaded: its counters are plain globals.
   (tests/test_cuda.c keeps its own, richer mock: it emulates kernels.)

   Use: include after mstar_kv_cuda.h, call mmc_table() and pass the table as
   mskv_cuda_desc.functions; mmc.fail_alloc_at = N makes the N-th device or
   pinned allocation fail (mmc.fail_from = 1: that one and every later one),
   or mmc.hook decides (a test that counts host and device allocations as one). */
#ifndef MSKV_MOCK_CUDA_H
#define MSKV_MOCK_CUDA_H
#include <stdlib.h>
#include <string.h>
#include <stdio.h>

static struct mmc_state {
    long dev_live, host_live, streams, events, modules, progs, graphs, execs;
    long allocs, launches;
    long fail_alloc_at;   /* 1-based; 0 = never */
    int fail_from;
    int (*hook)(void);    /* non-NULL: returns 1 to fail this allocation (the counters above are not used) */
} mmc;

static inline void mmc_reset(void) { memset(&mmc, 0, sizeof mmc); }
static inline int mmc_nothing_live(void) {
    return mmc.dev_live == 0 && mmc.host_live == 0 && mmc.streams == 0 && mmc.events == 0 && mmc.modules == 0 &&
           mmc.progs == 0 && mmc.graphs == 0 && mmc.execs == 0;
}
static int mmc_alloc_fails(void) {
    if (mmc.hook) return mmc.hook();
    mmc.allocs++;
    return mmc.fail_alloc_at > 0 && (mmc.allocs == mmc.fail_alloc_at || (mmc.fail_from && mmc.allocs > mmc.fail_alloc_at));
}

static mskv_cu_result mmc_cuInit(unsigned int f) { (void)f; return 0; }
static mskv_cu_result mmc_cuDriverGetVersion(int *v) { *v = 12040; return 0; }
static mskv_cu_result mmc_cuGetErrorString(mskv_cu_result e, const char **s) { *s = e == 2 ? "mock: out of memory" : "mock: error"; return 0; }
static mskv_cu_result mmc_cuDeviceGetCount(int *n) { *n = 1; return 0; }
static mskv_cu_result mmc_cuDeviceGet(mskv_cu_device *d, int i) { *d = i; return 0; }
static mskv_cu_result mmc_cuDeviceGetAttribute(int *v, int a, mskv_cu_device d) {
    (void)d;
    *v = a == MSKV_CU_ATTR_CC_MAJOR ? 9 : a == MSKV_CU_ATTR_MULTIPROCESSOR_COUNT ? 16 :
         a == MSKV_CU_ATTR_MAX_SMEM_OPTIN ? 227 * 1024 : 0;   /* an H100's */
    return 0;
}
static mskv_cu_result mmc_cuDeviceGetName(char *name, int len, mskv_cu_device d) { (void)d; snprintf(name, (size_t)len, "mock"); return 0; }
static mskv_cu_result mmc_cuDevicePrimaryCtxRetain(mskv_cu_context *c, mskv_cu_device d) { (void)d; *c = (mskv_cu_context)(void *)&mmc; return 0; }
static mskv_cu_result mmc_cuDevicePrimaryCtxRelease(mskv_cu_device d) { (void)d; return 0; }
static mskv_cu_result mmc_cuCtxSetCurrent(mskv_cu_context c) { (void)c; return 0; }
static mskv_cu_result mmc_cuMemAlloc(mskv_cu_ptr *p, size_t n) {
    void *q;
    if (mmc_alloc_fails() || n > ((size_t)256 << 20)) return MSKV_CU_ERROR_OUT_OF_MEMORY;
    q = calloc(1, n);
    if (!q) return MSKV_CU_ERROR_OUT_OF_MEMORY;
    mmc.dev_live++;
    *p = (mskv_cu_ptr)(uintptr_t)q;
    return 0;
}
static mskv_cu_result mmc_cuMemFree(mskv_cu_ptr p) { if (p) { mmc.dev_live--; free((void *)(uintptr_t)p); } return 0; }
static mskv_cu_result mmc_cuMemAllocHost(void **p, size_t n) {
    if (mmc_alloc_fails() || n > ((size_t)256 << 20)) return MSKV_CU_ERROR_OUT_OF_MEMORY;
    *p = calloc(1, n);
    if (!*p) return MSKV_CU_ERROR_OUT_OF_MEMORY;
    mmc.host_live++;
    return 0;
}
static mskv_cu_result mmc_cuMemFreeHost(void *p) { if (p) { mmc.host_live--; free(p); } return 0; }
static mskv_cu_result mmc_cuMemcpyHtoDAsync(mskv_cu_ptr d, const void *s, size_t n, mskv_cu_stream st) { (void)st; memcpy((void *)(uintptr_t)d, s, n); return 0; }
static mskv_cu_result mmc_cuMemcpyDtoHAsync(void *d, mskv_cu_ptr s, size_t n, mskv_cu_stream st) { (void)st; memcpy(d, (const void *)(uintptr_t)s, n); return 0; }
static mskv_cu_result mmc_cuMemcpyDtoDAsync(mskv_cu_ptr d, mskv_cu_ptr s, size_t n, mskv_cu_stream st) {
    (void)st; memmove((void *)(uintptr_t)d, (const void *)(uintptr_t)s, n); return 0;
}
static mskv_cu_result mmc_cuMemsetD8Async(mskv_cu_ptr d, unsigned char v, size_t n, mskv_cu_stream st) { (void)st; memset((void *)(uintptr_t)d, v, n); return 0; }
static mskv_cu_result mmc_cuStreamCreate(mskv_cu_stream *s, unsigned int f) { (void)f; mmc.streams++; *s = (mskv_cu_stream)malloc(1); return 0; }
static mskv_cu_result mmc_cuStreamDestroy(mskv_cu_stream s) { mmc.streams--; free((void *)s); return 0; }
static mskv_cu_result mmc_cuStreamSynchronize(mskv_cu_stream s) { (void)s; return 0; }
static mskv_cu_result mmc_cuEventCreate(mskv_cu_event *e, unsigned int f) { (void)f; mmc.events++; *e = (mskv_cu_event)malloc(1); return 0; }
static mskv_cu_result mmc_cuEventRecord(mskv_cu_event e, mskv_cu_stream s) { (void)e; (void)s; return 0; }
static mskv_cu_result mmc_cuEventQuery(mskv_cu_event e) { (void)e; return 0; }
static mskv_cu_result mmc_cuEventSynchronize(mskv_cu_event e) { (void)e; return 0; }
static mskv_cu_result mmc_cuEventDestroy(mskv_cu_event e) { mmc.events--; free((void *)e); return 0; }
static mskv_cu_result mmc_cuModuleLoadData(mskv_cu_module *m, const void *image) { (void)image; mmc.modules++; *m = (mskv_cu_module)malloc(1); return 0; }
static mskv_cu_result mmc_cuModuleUnload(mskv_cu_module m) { mmc.modules--; free((void *)m); return 0; }
static mskv_cu_result mmc_cuModuleGetFunction(mskv_cu_function *f, mskv_cu_module m, const char *name) {
    (void)name; *f = (mskv_cu_function)(void *)m; return 0;
}
static mskv_cu_result mmc_cuFuncSetAttribute(mskv_cu_function f, int a, int v) { (void)f; (void)a; (void)v; return 0; }
static mskv_cu_result mmc_cuOccupancyMaxActiveBlocksPerMultiprocessor(int *n, mskv_cu_function f, int b, size_t smem) {
    (void)f; (void)b; (void)smem; *n = 2; return 0;
}
static mskv_cu_result mmc_cuLaunchKernel(mskv_cu_function f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                                         unsigned int by, unsigned int bz, unsigned int smem, mskv_cu_stream s, void **params,
                                         void **extra) {
    (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)smem; (void)s; (void)params; (void)extra;
    mmc.launches++;
    return 0;
}
static mskv_cu_result mmc_cuStreamBeginCapture(mskv_cu_stream s, int mode) { (void)s; (void)mode; return 0; }
static mskv_cu_result mmc_cuStreamEndCapture(mskv_cu_stream s, mskv_cu_graph *g) { (void)s; mmc.graphs++; *g = (mskv_cu_graph)malloc(1); return 0; }
static mskv_cu_result mmc_cuGraphInstantiateWithFlags(mskv_cu_graph_exec *e, mskv_cu_graph g, unsigned long long f) {
    (void)g; (void)f; mmc.execs++; *e = (mskv_cu_graph_exec)malloc(1); return 0;
}
static mskv_cu_result mmc_cuGraphLaunch(mskv_cu_graph_exec e, mskv_cu_stream s) { (void)e; (void)s; return 0; }
static mskv_cu_result mmc_cuGraphExecDestroy(mskv_cu_graph_exec e) { mmc.execs--; free((void *)e); return 0; }
static mskv_cu_result mmc_cuGraphDestroy(mskv_cu_graph g) { mmc.graphs--; free((void *)g); return 0; }
/* a tensor map is 128 opaque bytes: the mock accepts every one (the sm_90a
   kernel's TMA path) and writes a recognisable pattern */
static mskv_cu_result mmc_cuTensorMapEncodeTiled(void *map, int dt, unsigned int rank, void *g, const unsigned long long *dims,
                                                 const unsigned long long *strides, const unsigned int *box,
                                                 const unsigned int *es, int il, int sw, int l2, int oob) {
    (void)dt; (void)rank; (void)g; (void)dims; (void)strides; (void)box; (void)es; (void)il; (void)sw; (void)l2; (void)oob;
    memset(map, 0x7e, 128);
    return 0;
}

static const char mmc_image[] = "MOCK IMAGE";
static mskv_nvrtc_result mmc_nvrtcVersion(int *a, int *b) { *a = 12; *b = 4; return 0; }
static const char *mmc_nvrtcGetErrorString(mskv_nvrtc_result r) { (void)r; return "mock nvrtc error"; }
static mskv_nvrtc_result mmc_nvrtcGetNumSupportedArchs(int *n) { *n = 1; return 0; }
static mskv_nvrtc_result mmc_nvrtcGetSupportedArchs(int *a) { a[0] = 90; return 0; }
static mskv_nvrtc_result mmc_nvrtcCreateProgram(mskv_nvrtc_program *p, const char *src, const char *name, int nh,
                                                const char *const *h, const char *const *in) {
    (void)src; (void)name; (void)nh; (void)h; (void)in;
    mmc.progs++;
    *p = (mskv_nvrtc_program)malloc(1);
    return 0;
}
static mskv_nvrtc_result mmc_nvrtcDestroyProgram(mskv_nvrtc_program *p) { if (*p) { mmc.progs--; free((void *)*p); } *p = NULL; return 0; }
static mskv_nvrtc_result mmc_nvrtcCompileProgram(mskv_nvrtc_program p, int n, const char *const *o) { (void)p; (void)n; (void)o; return 0; }
static mskv_nvrtc_result mmc_nvrtcGetProgramLogSize(mskv_nvrtc_program p, size_t *n) { (void)p; *n = 1; return 0; }
static mskv_nvrtc_result mmc_nvrtcGetProgramLog(mskv_nvrtc_program p, char *log) { (void)p; log[0] = 0; return 0; }
static mskv_nvrtc_result mmc_nvrtcGetPTXSize(mskv_nvrtc_program p, size_t *n) { (void)p; *n = sizeof mmc_image; return 0; }
static mskv_nvrtc_result mmc_nvrtcGetPTX(mskv_nvrtc_program p, char *out) { (void)p; memcpy(out, mmc_image, sizeof mmc_image); return 0; }
static mskv_nvrtc_result mmc_nvrtcGetCUBINSize(mskv_nvrtc_program p, size_t *n) { (void)p; *n = sizeof mmc_image; return 0; }
static mskv_nvrtc_result mmc_nvrtcGetCUBIN(mskv_nvrtc_program p, char *out) { (void)p; memcpy(out, mmc_image, sizeof mmc_image); return 0; }

static inline mskv_cuda_functions mmc_table(void) {
    mskv_cuda_functions f;
#define MMC_SET(ret, name, sym, params) f.name = mmc_##name;
    MSKV_CUDA_DRIVER_FUNCTIONS(MMC_SET)
    MSKV_CUDA_NVRTC_FUNCTIONS(MMC_SET)
#undef MMC_SET
    return f;
}
#endif
