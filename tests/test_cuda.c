/* The GPU layer (mstar_kv_cuda.h) without a GPU: the embedded kernel copy,
   the loader on a machine without a driver, NVRTC compiles of every shipped
   variant (when libnvrtc is installed), the disk cache, and, through an
   injected mock driver/NVRTC table, the device store's failure paths. */
#if !defined(_WIN32) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L
#endif
#include <stdlib.h>
#include <time.h>
#ifndef _WIN32
#include <unistd.h>
#include <sys/types.h>
#include <sys/wait.h>
#endif
#include "mskv_test.h"
#include "mskv_test_util.h"
#include "../mstar_kv.h"
#include "../mstar_kv_cuda.h"

/* the driver library the loader tries first on this platform */
#ifdef _WIN32
#define TCU_DRIVER_NAME "nvcuda.dll"
#else
#define TCU_DRIVER_NAME "libcuda.so.1"
#endif
/* main.c: how many messages the GPU layer has formatted (its MSKV_CUDA_VSNPRINTF) */
#ifdef __cplusplus
extern "C"
#endif
long mtu_format_count(void);

/* ---- paths next to this file ------------------------------------------------ */

static void tcu_path(char *out, size_t cap, const char *rel) {
    const char *f = __FILE__, *slash = strrchr(f, '/');
    if (slash) snprintf(out, cap, "%.*s/%s", (int)(slash - f), f, rel);
    else snprintf(out, cap, "%s", rel);
}

static char *tcu_read(const char *path, size_t *size) {
    FILE *fp = fopen(path, "rb");
    char *buf;
    long n;
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    buf = (char *)malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, fp) != (size_t)n) { free(buf); buf = NULL; }
    fclose(fp);
    if (buf) { buf[n] = 0; *size = (size_t)n; }
    return buf;
}

/* ---- counting allocator -------------------------------------------------------- */

static long tcu_live_allocs, tcu_total_allocs;   /* live blocks; every alloc and realloc call */
static int tcu_refuse_allocs;                    /* set: every alloc and realloc fails */
static void *tcu_alloc(void *u, size_t n) {
    void *p = tcu_refuse_allocs ? NULL : malloc(n);
    (void)u;
    tcu_total_allocs++;
    if (p) tcu_live_allocs++;
    return p;
}
static void *tcu_realloc(void *u, void *p, size_t n) {
    void *q = tcu_refuse_allocs ? NULL : realloc(p, n);
    (void)u;
    tcu_total_allocs++;
    if (!p && q) tcu_live_allocs++;
    return q;
}
static void tcu_free(void *u, void *p) { (void)u; if (p) { tcu_live_allocs--; free(p); } }
static mskv_allocator tcu_allocator(void) {
    mskv_allocator a;
    a.user = NULL; a.alloc = tcu_alloc; a.realloc = tcu_realloc; a.free = tcu_free;
    return a;
}

/* ---- a logger that keeps the last error --------------------------------------- */

static char tcu_logged[8192];
static int tcu_corrupt_warnings;
static void tcu_log(void *u, mskv_log_level lvl, const char *m) {
    (void)u;
    if (lvl >= MSKV_LOG_WARN && strstr(m, "corrupt")) tcu_corrupt_warnings++;
    if (lvl >= MSKV_LOG_ERROR) snprintf(tcu_logged, sizeof tcu_logged, "%s", m);
}

/* ---- the mock driver and NVRTC ---------------------------------------------------
   Device memory is host memory; copies are immediate; kernels are emulated on
   the host from their parameters (so the argument marshalling is checked
   against the ABI of kernels.cu); a capture records launches and a graph
   replays them, reading the plan buffers afresh. Counters catch leaks, and
   fail_* fields make the n-th call of a function fail. Several devices
   (tcm.devices): each has its own primary context; cuCtxSetCurrent says
   which is current, and the copies, launches and events made then are that
   device's (fail_device and busy_device aim the faults at one of them). */

typedef struct tcm_module { int dtype, head_dim, rope, style, d0, d1, d2; } tcm_module;
/* kind 1 gather, 2 scatter, 3 kv_write; 4 and up (attention, merges, rope) are launched, not run */
typedef struct tcm_func { int kind; const tcm_module *m; unsigned int smem_allowed; } tcm_func;
typedef struct tcm_launch { const tcm_func *f; unsigned int grid[3]; unsigned char args[10][8]; } tcm_launch;
typedef struct tcm_graph { int n; tcm_launch l[64]; } tcm_graph;

static struct tcm_state {
    long dev_live, host_live, streams, events, modules, graphs, execs, ctx_refs, progs;
    long calls;                         /* every driver and NVRTC call */
    int fail_alloc_at, allocs;          /* n-th cuMemAlloc fails with out of memory (1-based; 0 never) */
    int fail_dtoh_at, dtohs;
    int fail_htod_at, htods;
    int fail_launch_at, launches;
    int fail_module_load;
    int compile_error, compiles;
    int event_busy;                     /* cuEventQuery answers NOT_READY */
    int event_syncs;
    int stream_syncs, stream_sync_fails; /* cuStreamSynchronize calls; fail them while set */
    int cc_major, cc_minor;             /* 0: 9.0 */
    int devices;                        /* 0: 1 */
    int current;                        /* the device of the current context */
    int fail_device;                    /* 1 + the device whose calls fail_dtoh/htod/launch_at count; 0: every device's */
    int busy_device;                    /* 1 + the device whose events answer NOT_READY; 0: none (event_busy: all) */
    int fail_record;                    /* cuEventRecord fails (on fail_device's device, or any) */
    char ctx[8];                        /* the devices' primary contexts: &ctx[device] */
    int sm90a;                          /* sm_90a images load, mskv_attn_sm90 exists and tensor maps are made
                                           (else none of them: the runtime falls back to mskv_attn) */
    int tmaps;                          /* tensor maps made */
    int attn_kind;                      /* the last attention launch: 4 mskv_attn, 8 mskv_attn_sm90 */
    uint64_t sm90_maps[2], sm90_pools[2];   /* its K and V maps' pool (as the mock encodes it) and pools */
    int sm90_tma;                       /* its use_tma */
    unsigned char *last_host;           /* the block of the last cuMemAllocHost */
    mskv_cu_stream launch_stream, copy_stream, synced_stream;   /* the last launch's, copy's, wait's */
    char last_target[64];               /* the --gpu-architecture option of the last compile */
    int capturing;
    int capture_unsupported;            /* cuStreamBeginCapture answers 900 (STREAM_CAPTURE_UNSUPPORTED) */
    unsigned int attn_smem_max;         /* the most dynamic shared memory an attention-side launch (kind 4+) asked */
    int smem_unallowed;                 /* such launches with more than cuFuncSetAttribute allowed their kernel */
    tcm_graph *capture;
    tcm_func funcs[64];
    int nfuncs;
} tcm;

static void tcm_reset(void) {
    memset(&tcm, 0, sizeof tcm);
}

static int tcm_count_fail(int *counter, int at) { return ++*counter == at; }
/* the same, counting only the calls on the device that fail_device names */
static int tcm_device_fail(int *counter, int at) {
    return (!tcm.fail_device || tcm.fail_device - 1 == tcm.current) && tcm_count_fail(counter, at);
}

static mskv_cu_result tcm_cuInit(unsigned int f) { tcm.calls++; (void)f; return 0; }
static mskv_cu_result tcm_cuDriverGetVersion(int *v) { tcm.calls++; *v = 13000; return 0; }
static mskv_cu_result tcm_cuGetErrorString(mskv_cu_result e, const char **s) {
    tcm.calls++;
    *s = e == 2 ? "mock: out of memory" : e == 200 ? "mock: invalid image" : e == 719 ? "mock: launch failed" : "mock: error";
    return 0;
}
static mskv_cu_result tcm_cuDeviceGetCount(int *n) { tcm.calls++; *n = tcm.devices ? tcm.devices : 1; return 0; }
static mskv_cu_result tcm_cuDeviceGet(mskv_cu_device *d, int i) { tcm.calls++; *d = i; return 0; }
static mskv_cu_result tcm_cuDeviceGetAttribute(int *v, int a, mskv_cu_device d) {
    tcm.calls++;
    (void)d;
    *v = a == MSKV_CU_ATTR_CC_MAJOR ? (tcm.cc_major ? tcm.cc_major : 9) : a == MSKV_CU_ATTR_CC_MINOR ? tcm.cc_minor : a == MSKV_CU_ATTR_MULTIPROCESSOR_COUNT ? 132 :
         a == MSKV_CU_ATTR_MAX_SMEM_OPTIN ? 227 * 1024 : 0;   /* an H100's */
    return 0;
}
static mskv_cu_result tcm_cuDeviceGetName(char *name, int len, mskv_cu_device d) { tcm.calls++; (void)d; snprintf(name, (size_t)len, "mock device"); return 0; }
static mskv_cu_result tcm_cuDevicePrimaryCtxRetain(mskv_cu_context *c, mskv_cu_device d) {
    tcm.calls++;
    tcm.ctx_refs++; *c = (mskv_cu_context)(void *)&tcm.ctx[d]; return 0;
}
static mskv_cu_result tcm_cuDevicePrimaryCtxRelease(mskv_cu_device d) { tcm.calls++; (void)d; tcm.ctx_refs--; return 0; }
static mskv_cu_result tcm_cuCtxSetCurrent(mskv_cu_context c) {
    tcm.calls++;
    if (c) tcm.current = (int)((const char *)(const void *)c - tcm.ctx);
    return 0;
}
static mskv_cu_result tcm_cuMemAlloc(mskv_cu_ptr *p, size_t n) {
    tcm.calls++;
    void *q;
    if (tcm_count_fail(&tcm.allocs, tcm.fail_alloc_at)) return MSKV_CU_ERROR_OUT_OF_MEMORY;
    q = calloc(1, n);
    if (!q) return MSKV_CU_ERROR_OUT_OF_MEMORY;
    tcm.dev_live++;
    *p = (mskv_cu_ptr)(uintptr_t)q;
    return 0;
}
static mskv_cu_result tcm_cuMemFree(mskv_cu_ptr p) { tcm.calls++; if (p) { tcm.dev_live--; free((void *)(uintptr_t)p); } return 0; }
static mskv_cu_result tcm_cuMemAllocHost(void **p, size_t n) {
    tcm.calls++;
    if (tcm_count_fail(&tcm.allocs, tcm.fail_alloc_at)) return MSKV_CU_ERROR_OUT_OF_MEMORY;
    *p = calloc(1, n);
    if (!*p) return MSKV_CU_ERROR_OUT_OF_MEMORY;
    tcm.host_live++;
    tcm.last_host = (unsigned char *)*p;
    return 0;
}
static mskv_cu_result tcm_cuMemFreeHost(void *p) { tcm.calls++; if (p) { tcm.host_live--; free(p); } return 0; }
static mskv_cu_result tcm_cuMemcpyHtoDAsync(mskv_cu_ptr d, const void *s, size_t n, mskv_cu_stream st) {
    tcm.calls++;
    tcm.copy_stream = st;
    if (tcm.capturing) return 900;      /* the runtime never captures copies */
    if (tcm_device_fail(&tcm.htods, tcm.fail_htod_at)) return 999;
    memcpy((void *)(uintptr_t)d, s, n);
    return 0;
}
static mskv_cu_result tcm_cuMemcpyDtoHAsync(void *d, mskv_cu_ptr s, size_t n, mskv_cu_stream st) {
    tcm.calls++;
    tcm.copy_stream = st;
    if (tcm.capturing) return 900;
    if (tcm_device_fail(&tcm.dtohs, tcm.fail_dtoh_at)) return 999;
    memcpy(d, (const void *)(uintptr_t)s, n);
    return 0;
}
static mskv_cu_result tcm_cuMemcpyDtoDAsync(mskv_cu_ptr d, mskv_cu_ptr s, size_t n, mskv_cu_stream st) {
    tcm.calls++;
    (void)st; memmove((void *)(uintptr_t)d, (const void *)(uintptr_t)s, n); return 0;
}
static mskv_cu_result tcm_cuMemsetD8Async(mskv_cu_ptr d, unsigned char v, size_t n, mskv_cu_stream st) {
    tcm.calls++;
    (void)st; memset((void *)(uintptr_t)d, v, n); return 0;
}
static mskv_cu_result tcm_cuStreamCreate(mskv_cu_stream *s, unsigned int f) {
    tcm.calls++;
    (void)f; tcm.streams++; *s = (mskv_cu_stream)malloc(1); return 0;
}
static mskv_cu_result tcm_cuStreamDestroy(mskv_cu_stream s) { tcm.calls++; tcm.streams--; free((void *)s); return 0; }
static mskv_cu_result tcm_cuStreamSynchronize(mskv_cu_stream s) {
    tcm.calls++;
    tcm.synced_stream = s;
    tcm.stream_syncs++;
    return tcm.capturing ? 901 : tcm.stream_sync_fails ? 999 : 0;
}
static mskv_cu_result tcm_cuEventCreate(mskv_cu_event *e, unsigned int f) {
    tcm.calls++;
    (void)f; tcm.events++; *e = (mskv_cu_event)malloc(1); *(char *)(void *)*e = (char)tcm.current; return 0;
}
static mskv_cu_result tcm_cuEventRecord(mskv_cu_event e, mskv_cu_stream s) {
    tcm.calls++;
    (void)e; (void)s;
    return tcm.fail_record && (!tcm.fail_device || tcm.fail_device - 1 == tcm.current) ? 999 : 0;
}
static mskv_cu_result tcm_cuEventQuery(mskv_cu_event e) {
    tcm.calls++;
    return tcm.event_busy || (tcm.busy_device && *(const char *)(const void *)e == tcm.busy_device - 1) ? MSKV_CU_ERROR_NOT_READY : 0;
}
static mskv_cu_result tcm_cuEventSynchronize(mskv_cu_event e) { tcm.calls++; (void)e; tcm.event_syncs++; return 0; }
static mskv_cu_result tcm_cuEventDestroy(mskv_cu_event e) { tcm.calls++; tcm.events--; free((void *)e); return 0; }

static int tcm_define(const char *image, const char *name) {
    const char *p = strstr(image, name);
    return p ? atoi(p + strlen(name) + 1) : 0;
}
static mskv_cu_result tcm_cuModuleLoadData(mskv_cu_module *m, const void *image) {
    tcm.calls++;
    const char *img = (const char *)image;
    tcm_module *mod;
    if (tcm.fail_module_load) return MSKV_CU_ERROR_INVALID_IMAGE;
    if (strncmp(img, "MOCKCUBIN sm_90\n", 16) != 0 && strncmp(img, "MOCKCUBIN compute_90\n", 21) != 0 &&
        !(tcm.sm90a && strncmp(img, "MOCKCUBIN sm_90a\n", 17) == 0))
        return MSKV_CU_ERROR_INVALID_IMAGE;
    mod = (tcm_module *)calloc(1, sizeof *mod);
    mod->dtype = tcm_define(img, "-DMSKV_DTYPE");
    mod->head_dim = tcm_define(img, "-DMSKV_HEAD_DIM");
    mod->rope = tcm_define(img, "-DMSKV_ROPE");
    mod->style = tcm_define(img, "-DMSKV_ROPE_STYLE");
    mod->d0 = tcm_define(img, "-DMSKV_ROPE_D0");
    mod->d1 = tcm_define(img, "-DMSKV_ROPE_D1");
    mod->d2 = tcm_define(img, "-DMSKV_ROPE_D2");
    tcm.modules++;
    *m = (mskv_cu_module)(void *)mod;
    return 0;
}
static mskv_cu_result tcm_cuModuleUnload(mskv_cu_module m) { tcm.calls++; tcm.modules--; free((void *)m); return 0; }
static mskv_cu_result tcm_cuModuleGetFunction(mskv_cu_function *f, mskv_cu_module m, const char *name) {
    tcm.calls++;
    int kind = !strcmp(name, "mskv_page_gather") ? 1 : !strcmp(name, "mskv_page_scatter") ? 2 :
               !strcmp(name, "mskv_kv_write") ? 3 : !strcmp(name, "mskv_attn") ? 4 :
               !strcmp(name, "mskv_lse_merge") ? 5 : !strcmp(name, "mskv_state_merge") ? 6 :
               !strcmp(name, "mskv_rope") ? 7 : tcm.sm90a && !strcmp(name, "mskv_attn_sm90") ? 8 : 0;
    if (!kind || tcm.nfuncs == 64) return MSKV_CU_ERROR_NOT_FOUND;
    tcm.funcs[tcm.nfuncs].kind = kind;
    tcm.funcs[tcm.nfuncs].m = (const tcm_module *)(const void *)m;
    *f = (mskv_cu_function)(void *)&tcm.funcs[tcm.nfuncs++];
    return 0;
}
static mskv_cu_result tcm_cuFuncSetAttribute(mskv_cu_function f, int a, int v) {
    tcm.calls++;
    if (a == MSKV_CU_FUNC_ATTR_MAX_DYNAMIC_SMEM && v >= 0) ((tcm_func *)(void *)f)->smem_allowed = (unsigned int)v;
    return 0;
}
static mskv_cu_result tcm_cuOccupancyMaxActiveBlocksPerMultiprocessor(int *n, mskv_cu_function f, int b, size_t smem) {
    tcm.calls++;
    (void)f; (void)b; (void)smem;
    *n = 2;
    return 0;
}

/* parameter sizes of each kernel, in ABI order */
static const int tcm_sizes[4][10] = {
    { 0 }, { 8, 8, 4, 8, 8, 8 }, { 8, 8, 4, 8, 8, 8 }, { 8, 8, 8, 4, 4, 8, 8, 8, 8, 4 } };
static uint64_t tcm_u64(const unsigned char *a) { uint64_t v; memcpy(&v, a, 8); return v; }
static int tcm_i32(const unsigned char *a) { int v; memcpy(&v, a, 4); return v; }

static void tcm_run(const tcm_launch *l) {
    const unsigned char (*a)[8] = l->args;
    if (l->f->kind == 1 || l->f->kind == 2) {
        unsigned char *pool = (unsigned char *)(uintptr_t)tcm_u64(a[0]);
        const int *pages = (const int *)(uintptr_t)tcm_u64(a[1]);
        int n = tcm_i32(a[2]), i;
        int64_t pb = (int64_t)tcm_u64(a[3]), stride = (int64_t)tcm_u64(a[5]);
        unsigned char *buf = (unsigned char *)(uintptr_t)tcm_u64(a[4]);
        for (i = 0; i < n && i < (int)l->grid[1]; i++) {
            if (l->f->kind == 1) memcpy(buf + i * stride, pool + (int64_t)pages[i] * pb, (size_t)pb);
            else memcpy(pool + (int64_t)pages[i] * pb, buf + i * stride, (size_t)pb);
        }
    } else {
        const tcm_module *m = l->f->m;
        mskv_pools pools;
        mskv_plan plan;
        mskv_rope rope;
        float theta;
        int n = tcm_i32(a[3]), kvh = tcm_i32(a[4]);
        memcpy(&theta, a[9], 4);
        memset(&pools, 0, sizeof pools);
        memset(&plan, 0, sizeof plan);
        memset(&rope, 0, sizeof rope);
        /* one-slot pages address exactly like the kernel: (slot * kv_heads + h) * D */
        pools.k = (void *)(uintptr_t)tcm_u64(a[5]);
        pools.v = (void *)(uintptr_t)tcm_u64(a[6]);
        pools.dtype = (mskv_dtype)m->dtype;
        pools.num_pages = (int32_t)tcm_u64(a[7]);
        pools.page_size = 1;
        pools.kv_heads = kvh;
        pools.head_dim = m->head_dim;
        plan.total_q = n;
        plan.page_size = 1;
        plan.slot_mapping = (int64_t *)(uintptr_t)tcm_u64(a[2]);
        plan.positions = (int32_t *)(uintptr_t)tcm_u64(a[8]);
        plan.cap_tokens = n;
        rope.mode = m->rope == 2 ? MSKV_POS_3D : MSKV_POS_1D;
        rope.style = m->style ? MSKV_ROPE_INTERLEAVED : MSKV_ROPE_HALF;
        rope.theta = theta;
        rope.dims[0] = m->d0; rope.dims[1] = m->d1; rope.dims[2] = m->d2;
        (void)mskv_cpu_write_kv_pools(&pools, &plan, (const void *)(uintptr_t)tcm_u64(a[0]),
                                      (const void *)(uintptr_t)tcm_u64(a[1]), (mskv_dtype)m->dtype,
                                      m->rope ? &rope : NULL);
    }
}

static mskv_cu_result tcm_cuLaunchKernel(mskv_cu_function f, unsigned int gx, unsigned int gy, unsigned int gz,
                                         unsigned int bx, unsigned int by, unsigned int bz, unsigned int smem,
                                         mskv_cu_stream s, void **params, void **extra) {
    tcm.calls++;
    tcm_launch l;
    const tcm_func *fn = (const tcm_func *)(const void *)f;
    int i;
    (void)gz; (void)bx; (void)by; (void)bz; (void)extra;
    tcm.launch_stream = s;
    if (tcm_device_fail(&tcm.launches, tcm.fail_launch_at)) return MSKV_CU_ERROR_LAUNCH_FAILED;
    /* every attention launch opts in to its dynamic shared memory, even at 48 KiB and below */
    if (fn->kind >= 4 && smem > tcm.attn_smem_max) tcm.attn_smem_max = smem;
    if (fn->kind >= 4 && smem > 0 && fn->smem_allowed < smem) tcm.smem_unallowed++;
    memset(&l, 0, sizeof l);
    l.f = fn;
    l.grid[0] = gx; l.grid[1] = gy; l.grid[2] = gz;
    if (fn->kind == 4) tcm.attn_kind = 4;
    if (fn->kind == 8) {
        /* the maps are passed by value: 128 bytes each */
        tcm.attn_kind = 8;
        memcpy(&tcm.sm90_maps[0], params[0], 8);
        memcpy(&tcm.sm90_maps[1], params[1], 8);
        memcpy(&tcm.sm90_tma, params[2], 4);
        memcpy(&tcm.sm90_pools[0], params[4], 8);
        memcpy(&tcm.sm90_pools[1], params[5], 8);
    }
    if (fn->kind > 3) return 0;
    for (i = 0; i < 10 && tcm_sizes[fn->kind][i]; i++) memcpy(l.args[i], params[i], (size_t)tcm_sizes[fn->kind][i]);
    if (tcm.capturing) {
        if (tcm.capture->n == 64) return 902;
        tcm.capture->l[tcm.capture->n++] = l;
        return 0;
    }
    tcm_run(&l);
    return 0;
}
static mskv_cu_result tcm_cuStreamBeginCapture(mskv_cu_stream s, int mode) {
    tcm.calls++;
    (void)s; (void)mode;
    if (tcm.capture_unsupported) return 900;
    tcm.capture = (tcm_graph *)calloc(1, sizeof(tcm_graph));
    tcm.capturing = 1;
    tcm.graphs++;
    return 0;
}
static mskv_cu_result tcm_cuStreamEndCapture(mskv_cu_stream s, mskv_cu_graph *g) {
    tcm.calls++;
    (void)s;
    tcm.capturing = 0;
    *g = (mskv_cu_graph)(void *)tcm.capture;
    tcm.capture = NULL;
    return 0;
}
static mskv_cu_result tcm_cuGraphInstantiateWithFlags(mskv_cu_graph_exec *e, mskv_cu_graph g, unsigned long long f) {
    tcm.calls++;
    tcm_graph *copy = (tcm_graph *)malloc(sizeof(tcm_graph));
    (void)f;
    memcpy(copy, (const void *)g, sizeof(tcm_graph));
    tcm.execs++;
    *e = (mskv_cu_graph_exec)(void *)copy;
    return 0;
}
static mskv_cu_result tcm_cuGraphLaunch(mskv_cu_graph_exec e, mskv_cu_stream s) {
    tcm.calls++;
    const tcm_graph *g = (const tcm_graph *)(const void *)e;
    int i;
    (void)s;
    for (i = 0; i < g->n; i++) tcm_run(&g->l[i]);
    return 0;
}
static mskv_cu_result tcm_cuGraphExecDestroy(mskv_cu_graph_exec e) { tcm.calls++; tcm.execs--; free((void *)e); return 0; }
static mskv_cu_result tcm_cuGraphDestroy(mskv_cu_graph g) { tcm.calls++; tcm.graphs--; free((void *)g); return 0; }
/* Without sm90a the mock device runs no TMA: any map it is asked for is
   refused. With it, a map holds the pool's address in its first 8 bytes. */
static mskv_cu_result tcm_cuTensorMapEncodeTiled(void *map, int dt, unsigned int rank, void *g, const unsigned long long *dims,
                                                 const unsigned long long *strides, const unsigned int *box,
                                                 const unsigned int *es, int il, int sw, int l2, int oob) {
    uint64_t addr = (uint64_t)(uintptr_t)g;
    tcm.calls++;
    (void)dt; (void)rank; (void)dims; (void)strides; (void)box; (void)es; (void)il; (void)sw; (void)l2; (void)oob;
    if (!tcm.sm90a) return 1;
    memset(map, 0, 128);
    memcpy(map, &addr, 8);
    tcm.tmaps++;
    return 0;
}

typedef struct tcm_prog { char *options; } tcm_prog;
static mskv_nvrtc_result tcm_nvrtcVersion(int *a, int *b) { tcm.calls++; *a = 13; *b = 0; return 0; }
static const char *tcm_nvrtcGetErrorString(mskv_nvrtc_result r) { return r == 6 ? "NVRTC_ERROR_COMPILATION" : "NVRTC_ERROR"; }
static mskv_nvrtc_result tcm_nvrtcGetNumSupportedArchs(int *n) { tcm.calls++; *n = 4; return 0; }
static mskv_nvrtc_result tcm_nvrtcGetSupportedArchs(int *a) { tcm.calls++; a[0] = 75; a[1] = 80; a[2] = 89; a[3] = 90; return 0; }
static mskv_nvrtc_result tcm_nvrtcCreateProgram(mskv_nvrtc_program *p, const char *src, const char *name, int nh,
                                                const char *const *h, const char *const *in) {
    tcm.calls++;
    tcm_prog *q = (tcm_prog *)calloc(1, sizeof *q);
    (void)src; (void)name; (void)nh; (void)h; (void)in;
    tcm.progs++;
    *p = (mskv_nvrtc_program)(void *)q;
    return 0;
}
static mskv_nvrtc_result tcm_nvrtcDestroyProgram(mskv_nvrtc_program *p) {
    tcm.calls++;
    tcm_prog *q = (tcm_prog *)(void *)*p;
    if (q) { free(q->options); free(q); tcm.progs--; }
    *p = NULL;
    return 0;
}
static mskv_nvrtc_result tcm_nvrtcCompileProgram(mskv_nvrtc_program p, int n, const char *const *opts) {
    tcm.calls++;
    tcm_prog *q = (tcm_prog *)(void *)p;
    size_t len = 64;
    int i;
    tcm.compiles++;
    for (i = 0; i < n; i++) len += strlen(opts[i]) + 1;
    q->options = (char *)calloc(1, len);
    /* the image names the arch and carries the defines, so the mock module knows its variant */
    snprintf(tcm.last_target, sizeof tcm.last_target, "%s", opts[0]);
    snprintf(q->options, len, "MOCKCUBIN %s\n", strstr(opts[0], "=") ? strstr(opts[0], "=") + 1 : opts[0]);
    for (i = 1; i < n; i++) { strcat(q->options, opts[i]); strcat(q->options, "\n"); }
    return tcm.compile_error ? MSKV_NVRTC_ERROR_COMPILATION : 0;
}
static const char *tcm_log_text(void) {
    return tcm.compile_error ? "kernels.cu(7): error: mock compile failure here\n"
                             : "ptxas info    : Used 20 registers\nptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n";
}
static mskv_nvrtc_result tcm_nvrtcGetProgramLogSize(mskv_nvrtc_program p, size_t *n) { tcm.calls++; (void)p; *n = strlen(tcm_log_text()) + 1; return 0; }
static mskv_nvrtc_result tcm_nvrtcGetProgramLog(mskv_nvrtc_program p, char *log) { tcm.calls++; (void)p; strcpy(log, tcm_log_text()); return 0; }
static mskv_nvrtc_result tcm_nvrtcGetPTXSize(mskv_nvrtc_program p, size_t *n) { tcm.calls++; *n = strlen(((tcm_prog *)(void *)p)->options) + 1; return 0; }
static mskv_nvrtc_result tcm_nvrtcGetPTX(mskv_nvrtc_program p, char *out) { tcm.calls++; strcpy(out, ((tcm_prog *)(void *)p)->options); return 0; }
static mskv_nvrtc_result tcm_nvrtcGetCUBINSize(mskv_nvrtc_program p, size_t *n) { tcm.calls++; *n = strlen(((tcm_prog *)(void *)p)->options) + 1; return 0; }
static mskv_nvrtc_result tcm_nvrtcGetCUBIN(mskv_nvrtc_program p, char *out) { tcm.calls++; strcpy(out, ((tcm_prog *)(void *)p)->options); return 0; }

static mskv_cuda_functions tcm_table(void) {
    mskv_cuda_functions f;
#define TCM_SET(ret, name, sym, params) f.name = tcm_##name;
    MSKV_CUDA_DRIVER_FUNCTIONS(TCM_SET)
    MSKV_CUDA_NVRTC_FUNCTIONS(TCM_SET)
#undef TCM_SET
    return f;
}

static int tcm_nothing_live(void) {
    return tcm.dev_live == 0 && tcm.host_live == 0 && tcm.streams == 0 && tcm.events == 0 && tcm.modules == 0 &&
           tcm.graphs == 0 && tcm.execs == 0 && tcm.ctx_refs == 0 && tcm.progs == 0;
}
#define TCU_EXPECT_NO_LEAKS()                                                                    \
    do {                                                                                         \
        EXPECT_EQ(0, tcm.dev_live); EXPECT_EQ(0, tcm.host_live); EXPECT_EQ(0, tcm.streams);    \
        EXPECT_EQ(0, tcm.events); EXPECT_EQ(0, tcm.modules); EXPECT_EQ(0, tcm.graphs);         \
        EXPECT_EQ(0, tcm.execs); EXPECT_EQ(0, tcm.ctx_refs); EXPECT_EQ(0, tcm.progs);          \
        EXPECT_EQ(0, tcu_live_allocs);                                                           \
    } while (0)

/* ---- a mock context + store + arena ---------------------------------------------- */

typedef struct tcu_rig {
    mskv_cuda_functions fn;
    mskv_cuda_desc cd;
    mskv_cuda *cu;
    mskv_cuda_store *st;
    mskv_arena *a;
    char cache[256];
} tcu_rig;

/* 2 layers x 2 heads x 64 dims f32, pages of 4 slots: one page of one layer is 2 KiB */
static mskv_cuda_store_desc tcu_store_desc(size_t staging) {
    mskv_cuda_store_desc sd;
    memset(&sd, 0, sizeof sd);
    sd.num_pages = 24; sd.page_size = 4; sd.num_layers = 2; sd.kv_heads = 2; sd.head_dim = 64;
    sd.dtype = MSKV_DTYPE_F32; sd.staging_bytes = staging;
    sd.max_batch = 4; sd.max_tokens = 64; sd.max_page_ids = 32; sd.plan_ring = 2;
    return sd;
}

static uint32_t tcu_next_debug;   /* the debug checks of the next rig's arena */
static int32_t tcu_next_groups;   /* the layer groups of the next rig's arena (0: one) */

static mskv_result tcu_rig_open2(tcu_rig *r, size_t staging, const char *cache_dir) {
    mskv_cuda_store_desc sd = tcu_store_desc(staging);
    mskv_arena_desc ad;
    mskv_result e;
    memset(r, 0, sizeof *r);
    tcm_reset();
    tcu_live_allocs = 0;
    tcu_logged[0] = 0;
    r->fn = tcm_table();
    r->cd.functions = &r->fn;
    r->cd.selftest = MSKV_CUDA_SELFTEST_OFF;   /* the mock launches kernels without running them */
    r->cd.disable_disk_cache = cache_dir ? 0 : 1;
    r->cd.cache_dir = cache_dir;
    r->cd.allocator = tcu_allocator();
    r->cd.log = tcu_log;
    if ((e = mskv_cuda_create(&r->cd, &r->cu)) != MSKV_SUCCESS) return e;
    if ((e = mskv_cuda_store_create(r->cu, &sd, &r->st)) != MSKV_SUCCESS) return e;
    memset(&ad, 0, sizeof ad);
    ad.allocator = tcu_allocator();
    if ((e = mskv_cuda_store_arena_desc(r->st, &ad)) != MSKV_SUCCESS) return e;
    ad.debug = tcu_next_debug;
    ad.num_groups = tcu_next_groups;
    tcu_next_debug = 0;
    tcu_next_groups = 0;
    if ((e = mskv_arena_create(&ad, &r->a)) != MSKV_SUCCESS) return e;
    return mskv_cuda_store_bind(r->st, r->a);
}

static mskv_result tcu_rig_open(tcu_rig *r, size_t staging) { return tcu_rig_open2(r, staging, NULL); }
static mskv_result tcu_rig_open_cached(tcu_rig *r, const char *cache_dir) { return tcu_rig_open2(r, 0, cache_dir); }

static void tcu_rig_close(tcu_rig *r) {
    if (r->a) mskv_arena_destroy(r->a);
    if (r->st) mskv_cuda_store_destroy(r->st);
    if (r->cu) mskv_cuda_destroy(r->cu);
    r->a = NULL; r->st = NULL; r->cu = NULL;
}

static int tcu_audit(mskv_arena *a) {
    char why[256] = "";
    if (mskv_arena_audit(a, why, sizeof why) != MSKV_SUCCESS) {
        mt_fail(__FILE__, __LINE__, "audit failed: %s", why);
        return 0;
    }
    return 1;
}

static float tcu_value(int64_t pos, int layer, int kind, int h, int d) {
    return (float)(pos * 1000 + layer * 100 + kind * 50 + h * 64 + d) * 0.25f;
}

/* A request of n tokens whose K/V went through mskv_cuda_write_kv (layer by layer). */
static mskv_result tcu_fill(tcu_rig *r, mskv_request *req, int64_t n) {
    mskv_segment seg;
    mskv_plan plan;
    mskv_plan_desc pd;
    mskv_cuda_dplan dp;
    mskv_result e;
    mskv_cu_ptr dk = 0, dv = 0;
    float *k, *v;
    int64_t t;
    int l, h, d;
    size_t bytes = (size_t)n * 2 * 64 * sizeof(float);
    if ((e = mskv_request_add(r->a, req)) != MSKV_SUCCESS) return e;
    seg.request = *req;
    seg.n_tokens = n;
    if ((e = mskv_admit(r->a, &seg, 1)) != MSKV_SUCCESS) return e;
    memset(&pd, 0, sizeof pd);
    memset(&plan, 0, sizeof plan);
    if ((e = mskv_plan_alloc(r->a, 4, 64, 32, &plan)) != MSKV_SUCCESS) return e;
    e = mskv_plan_build(r->a, &seg, 1, &pd, &plan);
    if (e == MSKV_SUCCESS) e = mskv_cuda_plan_upload(r->st, &plan, MSKV_POS_NONE, &dp);
    k = (float *)malloc(bytes);
    v = (float *)malloc(bytes);
    if (e == MSKV_SUCCESS) e = mskv_cuda_malloc(r->cu, bytes, &dk);
    if (e == MSKV_SUCCESS) e = mskv_cuda_malloc(r->cu, bytes, &dv);
    for (l = 0; l < 2 && e == MSKV_SUCCESS; l++) {
        for (t = 0; t < n; t++)
            for (h = 0; h < 2; h++)
                for (d = 0; d < 64; d++) {
                    k[(t * 2 + h) * 64 + d] = tcu_value(t, l, 0, h, d);
                    v[(t * 2 + h) * 64 + d] = tcu_value(t, l, 1, h, d);
                }
        e = mskv_cuda_upload(r->st, dk, k, bytes);
        if (e == MSKV_SUCCESS) e = mskv_cuda_upload(r->st, dv, v, bytes);
        if (e == MSKV_SUCCESS) e = mskv_cuda_write_kv(r->st, l, &dp, dk, dv, NULL);
    }
    mskv_cuda_free(r->cu, dk);
    mskv_cuda_free(r->cu, dv);
    free(k);
    free(v);
    mskv_plan_free(r->a, &plan);
    if (e != MSKV_SUCCESS) return e;
    if ((e = mskv_commit(r->a, &seg, 1)) != MSKV_SUCCESS) return e;
    return mskv_cuda_publish(r->st, &seg, 1, NULL);
}

/* Every token of a resident request holds tcu_value in the device pools. */
static int tcu_bytes_ok(tcu_rig *r, mskv_request req, int64_t n) {
    int64_t t, slot;
    int l, kind, h, d, bad = 0;
    for (t = 0; t < n; t++) {
        if (mskv_request_slot(r->a, req, t, &slot) != MSKV_SUCCESS) return 0;
        for (l = 0; l < 2; l++)
            for (kind = 0; kind < 2; kind++) {
                const float *pool = (const float *)(uintptr_t)mskv_cuda_store_pool(r->st, l, kind);
                for (h = 0; h < 2; h++)
                    for (d = 0; d < 64; d++)
                        if (pool[(slot * 2 + h) * 64 + d] != tcu_value(t, l, kind, h, d)) bad++;
            }
    }
    return bad == 0;
}

/* ---- tests that need no library ---------------------------------------------------- */

TEST(cuda_embedded_copy_equals_kernels_cu) {
    char path[512], *file, *embedded;
    size_t fsize = 0, esize = 0;
    tcu_path(path, sizeof path, "../kernels.cu");
    file = tcu_read(path, &fsize);
    if (!file) SKIP("kernels.cu not found at %s", path);
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_embedded_source(NULL, 0, &esize));
    embedded = (char *)malloc(esize + 1);
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_embedded_source(embedded, esize + 1, NULL));
    EXPECT_EQ(fsize, esize);
    if (fsize == esize && memcmp(file, embedded, fsize) != 0)
        mt_fail(__FILE__, __LINE__, "the embedded kernels.cu differs: run sh tools/embed_kernels.sh");
    else if (fsize != esize)
        mt_fail(__FILE__, __LINE__, "the embedded kernels.cu is stale: run sh tools/embed_kernels.sh");
    free(file);
    free(embedded);
}

TEST(cuda_without_driver_is_unavailable_and_cpu_backend_still_works) {
    mskv_cuda_desc cd;
    mskv_cuda *cu = (mskv_cuda *)&cd;
    mskv_arena_desc ad;
    mskv_arena *a = NULL;
    mskv_request req;
    mskv_segment seg;
    mskv_plan plan;
    mskv_plan_desc pd;
    char why[2048];
    float k[4 * 8], v[4 * 8];
    const float *pool;
    int64_t slot;
    int i;
    mskv_result r;
    memset(&cd, 0, sizeof cd);
    r = mskv_cuda_probe(&cd, why, sizeof why);
    if (r == MSKV_SUCCESS) SKIP("a CUDA driver, a device and NVRTC are present on this machine");
    EXPECT_EQ(MSKV_ERROR_CUDA_UNAVAILABLE, r);
    EXPECT_TRUE(strstr(why, TCU_DRIVER_NAME) != NULL || strstr(why, "NVRTC") != NULL);
    EXPECT_EQ(MSKV_ERROR_CUDA_UNAVAILABLE, mskv_cuda_create(&cd, &cu));
    EXPECT_TRUE(cu == NULL);
    /* the CPU backend in the same process */
    memset(&ad, 0, sizeof ad);
    ad.num_pages = 8; ad.page_size = 4; ad.num_layers = 1; ad.kv_heads = 2; ad.head_dim = 4;
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&ad, &a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &req));
    seg.request = req; seg.n_tokens = 4;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &seg, 1));
    memset(&pd, 0, sizeof pd);
    memset(&plan, 0, sizeof plan);
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(a, 1, 4, 4, &plan));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, &seg, 1, &pd, &plan));
    for (i = 0; i < 32; i++) { k[i] = (float)i; v[i] = (float)(100 + i); }
    EXPECT_EQ(MSKV_SUCCESS, mskv_cpu_write_kv(a, 0, &plan, k, v, MSKV_DTYPE_F32, NULL));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_slot(a, req, 2, &slot));
    pool = (const float *)mskv_store_pool(a, 0, 1);
    ASSERT_TRUE(pool != NULL);
    EXPECT_NEAR(100 + 2 * 8 + 5, pool[slot * 8 + 5], 0);
    mskv_plan_free(a, &plan);
    mskv_arena_destroy(a);
}

#ifndef MSKV_NO_THREADS
typedef struct tcu_probe_arg { mskv_result r; char why[1024]; } tcu_probe_arg;
static void tcu_probe_thread(void *p) {
    tcu_probe_arg *a = (tcu_probe_arg *)p;
    a->r = mskv_cuda_probe(NULL, a->why, sizeof a->why);
}

TEST(cuda_loader_is_initialised_once_from_many_threads) {
    mtu_thread *th[4];
    tcu_probe_arg args[4];
    int i, started = 0;
    for (i = 0; i < 4; i++)
        if ((th[i] = mtu_thread_start(tcu_probe_thread, &args[i])) != NULL) started++;
        else break;
    for (i = 0; i < started; i++) mtu_thread_join(th[i]);
    ASSERT_EQ(4, started);
    /* every thread sees the one outcome, with the same reason */
    for (i = 1; i < 4; i++) {
        EXPECT_EQ(args[0].r, args[i].r);
        EXPECT_STREQ(args[0].why, args[i].why);
    }
    EXPECT_TRUE(args[0].r == MSKV_SUCCESS || args[0].r == MSKV_ERROR_CUDA_UNAVAILABLE);
}
#endif

TEST(cuda_toolkit_stub_driver_is_unavailable) {
    static const char *const stubs[] = { "/usr/local/cuda/lib64/stubs/libcuda.so",
                                         "/usr/local/cuda/targets/x86_64-linux/lib/stubs/libcuda.so" };
    mskv_cuda_desc cd;
    mskv_cuda *cu = NULL;
    char why[2048];
    size_t i;
    FILE *fp = NULL;
#ifdef _WIN32
    SKIP("Windows: the toolkit ships its driver stub as an import library (cuda.lib), not as a DLL");
#endif
    for (i = 0; i < 2 && !fp; i++) fp = fopen(stubs[i], "rb");
    if (!fp) SKIP("no CUDA toolkit stub libcuda.so installed");
    fclose(fp);
    memset(&cd, 0, sizeof cd);
    cd.driver_path = stubs[i - 1];
    EXPECT_EQ(MSKV_ERROR_CUDA_UNAVAILABLE, mskv_cuda_probe(&cd, why, sizeof why));
    EXPECT_TRUE(strstr(why, "stub") != NULL);
    EXPECT_EQ(MSKV_ERROR_CUDA_UNAVAILABLE, mskv_cuda_create(&cd, &cu));
    EXPECT_TRUE(cu == NULL);
}

/* dlerror() already names the library ("x.so: cannot open shared object
   file: ..."): the reason says each name once, not "x.so: x.so: ...". */
TEST(cuda_unavailable_reason_names_each_library_once) {
    static const char path[] = "/nonexistent-mskv-dir/libcuda-missing.so.1";
    mskv_cuda_desc cd;
    char why[2048];
    const char *first;
    memset(&cd, 0, sizeof cd);
    cd.driver_path = path;
    EXPECT_EQ(MSKV_ERROR_CUDA_UNAVAILABLE, mskv_cuda_probe(&cd, why, sizeof why));
    first = strstr(why, path);
    ASSERT_TRUE(first != NULL);
    EXPECT_TRUE(strstr(first + 1, path) == NULL);
    if (strstr(first + 1, path)) printf("  reason: %s\n", why);
}

/* A library that loads but exports no cuInit is refused by name, and the
   probe says which library (the loader's open, lookup and close). */
TEST(cuda_driver_path_to_a_library_without_cuinit_is_unavailable_and_says_why) {
#ifdef _WIN32
    static const char *const lib = "C:\\windows\\system32\\kernel32.dll";   /* absolute: its own folder first */
#else
    static const char *const lib = "libm.so.6";
#endif
    mskv_cuda_desc cd;
    mskv_cuda *cu = NULL;
    char why[2048];
    memset(&cd, 0, sizeof cd);
    cd.driver_path = lib;
    EXPECT_EQ(MSKV_ERROR_CUDA_UNAVAILABLE, mskv_cuda_probe(&cd, why, sizeof why));
    EXPECT_TRUE(strstr(why, lib) != NULL && strstr(why, "not a CUDA driver (no cuInit)") != NULL);
    EXPECT_EQ(MSKV_ERROR_CUDA_UNAVAILABLE, mskv_cuda_create(&cd, &cu));
    EXPECT_TRUE(cu == NULL);
}

/* The attention kernel finds a key's page as (j * magic) >> shift: it must
   equal j / page_size for every index a sequence can have (j < 2^31). */
static int tcu_divides_exactly(int32_t ps, int64_t j) {
    uint32_t magic;
    int32_t shift;
    mskv_cuda_page_divisor(ps, &magic, &shift);
    return (int64_t)(((uint64_t)j * magic) >> shift) == j / ps;
}

TEST(cuda_page_divisor_divides_every_key_index_exactly) {
    static const int32_t big[] = { 1 << 20, (1 << 20) + 1, 1560, 2025, 4680, 65535, 1000003, 0x40000000, 0x7fffffff };
    int32_t ps;
    int64_t j, k;
    int bad = 0;
    for (ps = 1; ps <= 300 && bad < 5; ps++)
        for (j = 0; j < 5000; j++) bad += !tcu_divides_exactly(ps, j);
    for (ps = 1; ps <= 4096 && bad < 5; ps++)
        for (k = 0; k < 64; k++) {
            /* the top of the range and both sides of page boundaries near it */
            int64_t top = 0x7fffffff - k, edge = (top / ps) * ps;
            bad += !tcu_divides_exactly(ps, top);
            bad += !tcu_divides_exactly(ps, edge);
            if (edge > 0) bad += !tcu_divides_exactly(ps, edge - 1);
        }
    for (k = 0; k < (int64_t)(sizeof big / sizeof big[0]); k++)
        for (j = 0; j < 4096; j++) {
            bad += !tcu_divides_exactly(big[k], j * 524287 % 0x7fffffff);
            bad += !tcu_divides_exactly(big[k], 0x7fffffff - j);
        }
    EXPECT_EQ(0, bad);
}

TEST(cuda_spill_report_is_parsed_from_the_ptxas_log) {
    EXPECT_EQ(-1, mskv_cuda_log_spills("no report here"));
    EXPECT_EQ(0, mskv_cuda_log_spills("ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"));
    EXPECT_EQ(40, mskv_cuda_log_spills("a\n 8 bytes stack frame, 24 bytes spill stores, 16 bytes spill loads\n"
                                       " 0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"));
}

/* ---- NVRTC: every shipped variant, three archs, no spills ------------------------------ */

typedef struct tcu_variant { int dtype, head_dim, rope, style, warp_keys, d[3], src; } tcu_variant;   /* src: K/V source dtype + 1 (0: the pool's) */

/* What the runtime compiles: every dtype and head_dim with no RoPE (page
   copies, kv_write, prefill attention), each RoPE mode and style at the
   default part widths (kv_write, rope), and the decode attention layout for
   the 16-bit dtypes. Then each mode and style at widths of the caller's:
   1-D over half the head, 3-D parts that leave a tail unrotated; once per
   dtype, the head_dim turning with it (a width is a -D define: a variant of
   its own, compiled on first use). Last the converting K/V writes: every
   other source dtype into each pool dtype, the head_dim turning, and RoPE on
   the way in from f32 sources into the 16-bit pools. */
static int tcu_variants(tcu_variant *out, int cap) {
    int n = 0, dt, hd, rope, style;
    static const int dims[3] = { 64, 128, 256 };
    memset(out, 0, (size_t)cap * sizeof *out);
    for (dt = 0; dt < 3; dt++)
        for (hd = 0; hd < 3; hd++) {
            for (rope = 0; rope < 3; rope++)
                for (style = 0; style < (rope ? 2 : 1); style++)
                    if (n < cap) { out[n].dtype = dt; out[n].head_dim = dims[hd]; out[n].rope = rope; out[n].style = style; n++; }
            if (dt != 0 && n < cap) { out[n].dtype = dt; out[n].head_dim = dims[hd]; out[n].warp_keys = 1; n++; }
        }
    for (dt = 0; dt < 3; dt++)
        for (rope = 1; rope < 3; rope++)
            for (style = 0; style < 2; style++) {
                int D = dims[(dt + rope + style) % 3];
                if (n == cap) return n;
                out[n].dtype = dt; out[n].head_dim = D; out[n].rope = rope; out[n].style = style;
                if (rope == 1) out[n].d[0] = D / 2;
                else { out[n].d[0] = D / 4; out[n].d[1] = D / 4 - 2 * (D / 64); out[n].d[2] = out[n].d[1]; }
                n++;
            }
    for (dt = 0; dt < 3; dt++)
        for (rope = 0; rope < 3; rope++)
            if (rope != dt && n < cap) { out[n].dtype = dt; out[n].head_dim = dims[(dt + rope) % 3]; out[n].src = rope + 1; n++; }
    for (dt = 1; dt < 3; dt++)
        if (n < cap) { out[n].dtype = dt; out[n].head_dim = 128; out[n].rope = 1; out[n].src = 1; n++; }
    return n;
}

/* The sweep below varies these defines; a define kernels.cu adds later must
   be added to the sweep (and to this list) or this test fails. */
TEST(cuda_variant_sweep_covers_every_define_of_kernels_cu) {
    static const char *const known[] = { "MSKV_DTYPE", "MSKV_HEAD_DIM", "MSKV_ROPE", "MSKV_ROPE_STYLE",
                                         "MSKV_ROPE_D0", "MSKV_ROPE_D1", "MSKV_ROPE_D2", "MSKV_ATTN_WARP_KEYS",
                                         "MSKV_SRC_DTYPE",
                                         /* not variant switches: the emulation guard */
                                         "MSKV_EMU_H", "MSKV_GPU" };
    int32_t n = 0, i, seen = 0;
    const char *const *lines = mskv_cuda_embedded_lines(&n);
    for (i = 0; i < n; i++) {
        char name[64];
        size_t j, len = 0;
        const char *p = strstr(lines[i], "#ifndef MSKV_");
        int found = 0;
        if (!p || p != lines[i]) continue;
        p += 8;
        while (p[len] && (p[len] == '_' || (p[len] >= 'A' && p[len] <= 'Z') || (p[len] >= '0' && p[len] <= '9')) && len < 63) len++;
        memcpy(name, p, len);
        name[len] = 0;
        for (j = 0; j < sizeof known / sizeof known[0]; j++) found |= strcmp(known[j], name) == 0;
        if (!found) mt_fail(__FILE__, __LINE__, "kernels.cu line %d defines %s, which the NVRTC sweep does not vary", (int)i + 1, name);
        seen++;
    }
    EXPECT_LE(9, seen);
}

/* One compile of the sweep and what came of it. */
typedef struct tcu_sweep_job {
    tcu_variant v;
    int arch;
    mskv_result r;
    int is_ptx, elf, from_disk;
    int64_t spills;
    char log[2048];                 /* NVRTC's log when the compile failed */
} tcu_sweep_job;

typedef struct tcu_sweep {
    const mskv_cuda_desc *cd;
    tcu_sweep_job *jobs;
    int n, next;
    mtu_mutex *mu;
} tcu_sweep;

static void tcu_sweep_one(const mskv_cuda_desc *cd, tcu_sweep_job *j) {
    char o[10][48];
    const char *opts[10];
    mskv_cuda_compile_info ci;
    mskv_cuda_image img;
    int k;
    snprintf(o[0], 48, "-DMSKV_DTYPE=%d", j->v.dtype);
    snprintf(o[1], 48, "-DMSKV_HEAD_DIM=%d", j->v.head_dim);
    snprintf(o[2], 48, "-DMSKV_ROPE=%d", j->v.rope);
    snprintf(o[3], 48, "-DMSKV_ROPE_STYLE=%d", j->v.style);
    snprintf(o[4], 48, "-DMSKV_ATTN_WARP_KEYS=%d", j->v.warp_keys);
    snprintf(o[5], 48, "--ptxas-options=-v");
    snprintf(o[6], 48, "-DMSKV_SRC_DTYPE=%d", j->v.src ? j->v.src - 1 : j->v.dtype);
    snprintf(o[7], 48, "-DMSKV_ROPE_D0=%d", j->v.d[0]);
    snprintf(o[8], 48, "-DMSKV_ROPE_D1=%d", j->v.d[1]);
    snprintf(o[9], 48, "-DMSKV_ROPE_D2=%d", j->v.d[2]);
    for (k = 0; k < 10; k++) opts[k] = o[k];
    memset(&ci, 0, sizeof ci);
    ci.arch = j->arch;
    ci.options = opts;
    ci.num_options = j->v.d[0] ? 10 : 7;   /* default widths: the defines' own defaults */
    j->r = mskv_cuda_compile(cd, &ci, &img);
    if (j->r != MSKV_SUCCESS) {
        snprintf(j->log, sizeof j->log, "%s", img.log ? img.log : "");
    } else {
        j->is_ptx = img.is_ptx;
        j->elf = img.size > 4 && memcmp(img.data, "\177ELF", 4) == 0;
        j->spills = mskv_cuda_log_spills(img.log);
        j->from_disk = img.from_disk;
    }
    mskv_cuda_image_free(cd, &img);
}

/* A worker: takes the next job until none is left. */
static void tcu_sweep_worker(void *arg) {
    tcu_sweep *s = (tcu_sweep *)arg;
    for (;;) {
        int i;
        mtu_mutex_lock(s->mu);
        i = s->next++;
        mtu_mutex_unlock(s->mu);
        if (i >= s->n) return;
        tcu_sweep_one(s->cd, &s->jobs[i]);
    }
}

/* The compiles run on two threads (NVRTC compiles programs concurrently):
   on a fresh clone they are minutes of CPU, the longest part of make test,
   and a second core is there once the other test programs are done. In
   make test every variant compiles for sm_90 (the GPU the project's check
   runs on) and a quarter of them, drawn from the printed seed, for sm_80
   and sm_89 each, so that successive runs cover every pair; make sweep
   (MSKV_TEST_SWEEP=full) compiles every variant for all three. */
TEST(cuda_every_shipped_variant_compiles_to_cubin_without_spills) {
    static const int archs[3] = { 80, 89, 90 };
    static tcu_sweep_job jobs[96 * 3];
    tcu_variant vs[96];
    int nv = tcu_variants(vs, 96), i, a, n = 0, compiled = 0, cached = 0, started = 0, full;
    uint64_t draw = mt_seed() | 1;
    const char *mode = getenv("MSKV_TEST_SWEEP");
    mskv_cuda_desc cd;
    tcu_sweep sweep;
    mtu_thread *th[2];
    char cache[512], why[2048];
    clock_t t0 = clock();
    time_t w0 = time(NULL);
#ifdef MSKV_TEST_NO_NVRTC_SWEEP
    /* minutes of NVRTC when the cache is cold (a fresh clone, CI), the same
       work whichever compiler built this program, and two builds running at
       once would both do it */
    SKIP("NVRTC compiles kernels.cu the same for every build of the tests: make test sweeps once, in build/tests-gcc-c99");
#endif
    memset(&cd, 0, sizeof cd);
    tcu_path(cache, sizeof cache, "../build/nvrtc-cache");
    cd.cache_dir = cache;   /* no logger: the jobs keep what they need, and tcu_log's buffers are not for threads */
    {
        /* libnvrtc alone is enough: probe it through a compile of nothing */
        mskv_cuda_compile_info ci;
        mskv_cuda_image img;
        const char *src = "extern \"C\" __global__ void mskv_probe(void) {}\n";
        mskv_cuda_desc pd = cd;
        mskv_result r;
        memset(&ci, 0, sizeof ci);
        ci.arch = 80;
        pd.kernel_source = src;
        pd.disable_disk_cache = 1;
        r = mskv_cuda_compile(&pd, &ci, &img);
        mskv_cuda_image_free(&pd, &img);
        if (r == MSKV_ERROR_CUDA_UNAVAILABLE) {
            why[0] = 0;
            mskv_cuda_probe(&pd, why, sizeof why);
            SKIP("libnvrtc is not installed: %.300s", why);
        }
        ASSERT_EQ(MSKV_SUCCESS, r);
    }
    full = mode && strcmp(mode, "full") == 0;
    memset(jobs, 0, sizeof jobs);
    for (i = 0; i < nv; i++)
        for (a = 0; a < 3; a++) {
            uint64_t x = mtu_xorshift(&draw);
            if (!full && archs[a] != 90 && (x >> 32) % 4 != 0) continue;
            jobs[n].v = vs[i]; jobs[n].arch = archs[a]; n++;
        }
    memset(&sweep, 0, sizeof sweep);
    sweep.cd = &cd;
    sweep.jobs = jobs;
    sweep.n = n;
    sweep.mu = mtu_mutex_new();
    ASSERT_TRUE(sweep.mu != NULL);
    for (i = 0; i < 2; i++)
        if ((th[started] = mtu_thread_start(tcu_sweep_worker, &sweep)) != NULL) started++;
    if (started == 0) tcu_sweep_worker(&sweep);   /* no thread: all of it here */
    for (i = 0; i < started; i++) mtu_thread_join(th[i]);
    mtu_mutex_free(sweep.mu);
    for (i = 0; i < n; i++) {
        const tcu_sweep_job *j = &jobs[i];
        if (j->r != MSKV_SUCCESS) {
            mt_fail(__FILE__, __LINE__, "sm_%d dtype %d (source %d) D %d rope %d/%d widths %d,%d,%d warp_keys %d: %s\n%.2000s",
                    j->arch, j->v.dtype, j->v.src - 1, j->v.head_dim, j->v.rope, j->v.style, j->v.d[0], j->v.d[1], j->v.d[2],
                    j->v.warp_keys, mskv_result_string(j->r), j->log);
            continue;
        }
        EXPECT_FALSE(j->is_ptx);
        EXPECT_TRUE(j->elf);
        if (j->spills != 0)
            mt_fail(__FILE__, __LINE__, "sm_%d dtype %d D %d rope %d/%d widths %d,%d,%d warp_keys %d: %s (%lld bytes)",
                    j->arch, j->v.dtype, j->v.head_dim, j->v.rope, j->v.style, j->v.d[0], j->v.d[1], j->v.d[2],
                    j->v.warp_keys, j->spills < 0 ? "no ptxas report in the log" : "register spills", (long long)j->spills);
        if (j->from_disk) cached++; else compiled++;
    }
    printf("  %d variants, %s: %d compiles, %d compiled, %d from the cache (%s), %d threads, %.1f s cpu, ~%ld s wall\n", nv,
           full ? "every one for sm_80, sm_89 and sm_90 (MSKV_TEST_SWEEP=full)"
                : "every one for sm_90 and a quarter drawn from the seed for sm_80 and sm_89 (make sweep compiles all)",
           n, compiled, cached, cache, started ? started : 1, (double)(clock() - t0) / CLOCKS_PER_SEC, (long)(time(NULL) - w0));
    EXPECT_GE(n, nv);  /* at least every variant once */
}

/* The sm_90a kernel (mskv_attn_sm90) as the runtime compiles it on
   compute capability 9.0: the arch-specific target, f16/bf16 x head_dim
   64/128/256. It must compile with wgmma kept in flight (ptxas does not
   serialise it), setmaxnreg honoured (C7508: ignored) and no spills. The
   options are bench/kernel_stats.c's, so the two share cache entries. */
TEST(cuda_every_sm90a_variant_compiles_with_wgmma_setmaxnreg_and_no_spills) {
    static const int dims[3] = { 64, 128, 256 };
    mskv_cuda_desc cd;
    char cache[512];
    int dt, d, probe_done = 0;
    memset(&cd, 0, sizeof cd);
    tcu_path(cache, sizeof cache, "../build/nvrtc-cache");
    cd.cache_dir = cache;
    cd.log = tcu_log;
    for (dt = 1; dt <= 2; dt++)
        for (d = 0; d < 3; d++) {
            char o[9][48];
            const char *opts[9];
            mskv_cuda_compile_info ci;
            mskv_cuda_image img;
            mskv_result r;
            int64_t spills;
            int i;
            snprintf(o[0], 48, "-DMSKV_ATTN_WARP_KEYS=0");
            snprintf(o[1], 48, "-DMSKV_DTYPE=%d", dt);
            snprintf(o[2], 48, "-DMSKV_HEAD_DIM=%d", dims[d]);
            snprintf(o[3], 48, "-DMSKV_ROPE=0");
            snprintf(o[4], 48, "-DMSKV_ROPE_D0=0");
            snprintf(o[5], 48, "-DMSKV_ROPE_D1=0");
            snprintf(o[6], 48, "-DMSKV_ROPE_D2=0");
            snprintf(o[7], 48, "-DMSKV_ROPE_STYLE=0");
            snprintf(o[8], 48, "--ptxas-options=-v");
            for (i = 0; i < 9; i++) opts[i] = o[i];
            memset(&ci, 0, sizeof ci);
            ci.arch = 90;
            ci.arch_specific = 1;
            ci.options = opts;
            ci.num_options = 9;
            r = mskv_cuda_compile(&cd, &ci, &img);
            if (r == MSKV_ERROR_CUDA_UNAVAILABLE && !probe_done) {
                char why[1024] = "";
                mskv_cuda_image_free(&cd, &img);
                mskv_cuda_probe(&cd, why, sizeof why);
                SKIP("libnvrtc is not installed: %.300s", why);
            }
            probe_done = 1;
            if (r != MSKV_SUCCESS) {
                mt_fail(__FILE__, __LINE__, "sm_90a dtype %d D %d: %s\n%.2000s", dt, dims[d], mskv_result_string(r),
                        img.log ? img.log : "");
                mskv_cuda_image_free(&cd, &img);
                continue;
            }
            EXPECT_TRUE(img.size > 4 && memcmp(img.data, "\177ELF", 4) == 0);
            spills = mskv_cuda_log_spills(img.log);
            if (spills != 0)
                mt_fail(__FILE__, __LINE__, "sm_90a dtype %d D %d: %s (%lld bytes)", dt, dims[d],
                        spills < 0 ? "no ptxas report in the log" : "register spills", (long long)spills);
            /* a cached image keeps its compile's log, so these hold on a warm start too */
            if (img.log && (strstr(img.log, "C7508") || strstr(img.log, "setmaxnreg") || strstr(img.log, "serialized") ||
                            strstr(img.log, "Performance Loss")))
                mt_fail(__FILE__, __LINE__, "sm_90a dtype %d D %d: ptxas warns:\n%.2000s", dt, dims[d], img.log);
            mskv_cuda_image_free(&cd, &img);
        }
}

/* ---- the disk cache (mock NVRTC: fast and deterministic) ---------------------------------- */

static void tcu_cache_dir(char *out, size_t cap, const char *what) {
    char base[400];
    tcu_path(base, sizeof base, "../build");
    snprintf(out, cap, "%s/test-cuda-%s-%lu", base, what, mtu_pid());
}

static void tcu_rm_dir(const char *dir) {
    if (mtu_rm_dir(dir) != 0) mt_fail(__FILE__, __LINE__, "could not remove %s", dir);
}

/* Keeps the first n bytes of a file. */
static int tcu_truncate(const char *path, long n) {
    size_t size = 0;
    char *buf = tcu_read(path, &size);
    FILE *fp;
    int ok;
    if (!buf || (size_t)n > size) { free(buf); return 0; }
    fp = fopen(path, "wb");
    ok = fp && fwrite(buf, 1, (size_t)n, fp) == (size_t)n;
    if (fp && fclose(fp) != 0) ok = 0;
    free(buf);
    return ok;
}

/* ---- finding NVRTC where PyPI's wheels put it ---------------------------------------------------
   The loader runs once per process, so each layout is tried by a fresh
   build/nvrtc-find (the Python-environment variables cleared but the one
   under test), over a stand-in libnvrtc linked where the wheel puts its
   library: nvidia-cuda-nvrtc-cu12 at nvidia/cuda_nvrtc/lib/libnvrtc.so.12,
   nvidia-cuda-nvrtc 13.x at nvidia/cu13/lib/libnvrtc.so.13 (their contents,
   listed from the wheels). The environment's wheel comes before a system
   libnvrtc, so these pass on a machine that has one too. */

#ifndef _WIN32
/* <root>/<site>/<wheel> -> build/<lib> (a stand-in of tests/fake_nvrtc.c) */
static int tcu_fake_wheel_of(const char *root, const char *site, const char *wheel, const char *lib) {
    char fake_rel[512], cwd[512], fake[1100], link[900], cmd[1000], rel[128];
    snprintf(rel, sizeof rel, "../build/%s", lib);
    tcu_path(fake_rel, sizeof fake_rel, rel);
    if (access(fake_rel, R_OK) != 0 || !getcwd(cwd, sizeof cwd)) {
        mt_fail(__FILE__, __LINE__, "%s is missing: make builds it with the tests", fake_rel);
        return 0;
    }
    /* the link's target is read from the link's directory: make it absolute */
    if (fake_rel[0] == '/') snprintf(fake, sizeof fake, "%s", fake_rel);
    else snprintf(fake, sizeof fake, "%s/%s", cwd, fake_rel);
    snprintf(link, sizeof link, "%s/%s/%s", root, site, wheel);
    snprintf(cmd, sizeof cmd, "mkdir -p \"$(dirname '%s')\"", link);
    if (system(cmd) != 0 || symlink(fake, link) != 0) {
        mt_fail(__FILE__, __LINE__, "could not link %s", link);
        return 0;
    }
    return 1;
}

/* <root>/<site>/<wheel> -> build/fake-nvrtc/libnvrtc.so (NVRTC 12.34) */
static int tcu_fake_wheel(const char *root, const char *site, const char *wheel) {
    return tcu_fake_wheel_of(root, site, wheel, "fake-nvrtc/libnvrtc.so");
}

/* The output of build/nvrtc-find with only name=value of the search's environment set. */
static int tcu_find_nvrtc(const char *name, const char *value, char *out, size_t cap) {
    char prog[512], cmd[1400];
    FILE *p;
    size_t n;
    tcu_path(prog, sizeof prog, "../build/nvrtc-find");
    if (access(prog, X_OK) != 0) {
        mt_fail(__FILE__, __LINE__, "%s is missing: make builds it with the tests", prog);
        return 0;
    }
    snprintf(cmd, sizeof cmd, "env -u MSKV_NVRTC_PATH -u VIRTUAL_ENV -u CONDA_PREFIX -u PYTHONPATH %s='%s' '%s' 2>&1",
             name, value, prog);
    p = popen(cmd, "r");
    if (!p) return 0;
    n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    pclose(p);
    return 1;
}

static void tcu_expect_fake_nvrtc(const char *name, const char *value) {
    char out[2048];
    if (!tcu_find_nvrtc(name, value, out, sizeof out)) return;
    if (!strstr(out, "fake libnvrtc of the mstar_kv loader tests"))
        mt_fail(__FILE__, __LINE__, "with %s=%s the wheel's NVRTC was not loaded:\n%s", name, value, out);
}

TEST(cuda_nvrtc_is_found_in_the_cu12_wheel_of_a_virtualenv) {
    char root[512];
    tcu_cache_dir(root, sizeof root, "venv");
    if (tcu_fake_wheel(root, "lib/python3.11/site-packages", "nvidia/cuda_nvrtc/lib/libnvrtc.so.12"))
        tcu_expect_fake_nvrtc("VIRTUAL_ENV", root);
    tcu_rm_dir(root);
}

TEST(cuda_nvrtc_is_found_in_the_cu13_wheel_of_a_conda_environment) {
    char root[512];
    tcu_cache_dir(root, sizeof root, "conda");
    if (tcu_fake_wheel(root, "lib/python3.12/site-packages", "nvidia/cu13/lib/libnvrtc.so.13"))
        tcu_expect_fake_nvrtc("CONDA_PREFIX", root);
    tcu_rm_dir(root);
}

TEST(cuda_nvrtc_is_found_in_a_wheel_on_the_pythonpath) {
    char root[512], path[1200];
    tcu_cache_dir(root, sizeof root, "pythonpath");
    if (tcu_fake_wheel(root, "site", "nvidia/cu13/lib/libnvrtc.so.13")) {
        snprintf(path, sizeof path, "%s/elsewhere:%s/site", root, root);
        tcu_expect_fake_nvrtc("PYTHONPATH", path);
    }
    tcu_rm_dir(root);
}

/* ---- an NVRTC the driver can take ----------------------------------------------------------------
   A CUBIN (or PTX) from an NVRTC newer than the driver does not load there
   (CUDA 13's cubins carry an ELF ABI that drivers before R580 reject), so
   the loader picks the newest NVRTC whose CUDA major is not above the
   driver's. Each case is a fresh build/nvrtc-find over the stand-in driver
   of tests/fake_cuda.c (build/fake-cuda/libcuda.so.1, found through
   LD_LIBRARY_PATH as a real driver is, or named by driver_path; its version
   set by MSKV_FAKE_DRIVER_VERSION) and a virtualenv holding the cu13 wheel
   (a stand-in NVRTC 13.0), the cu12 wheel (12.34), or both. The system's
   own NVRTC (13 on these machines) is found too, after the venv's. */

#define TCU_CU13 "nvidia/cu13/lib/libnvrtc.so.13"
#define TCU_CU12 "nvidia/cuda_nvrtc/lib/libnvrtc.so.12"
#define TCU_SITE "lib/python3.11/site-packages"

/* a venv under build/ with the wheels asked for; 0 when it could not be made */
static int tcu_nvrtc_venv(char *root, size_t cap, const char *what, int cu13, int cu12) {
    tcu_cache_dir(root, cap, what);
    if (cu13 && !tcu_fake_wheel_of(root, TCU_SITE, TCU_CU13, "fake-nvrtc13/libnvrtc.so")) return 0;
    if (cu12 && !tcu_fake_wheel_of(root, TCU_SITE, TCU_CU12, "fake-nvrtc/libnvrtc.so")) return 0;
    return 1;
}

/* build/nvrtc-find ARGS with driver version `driver`, VIRTUAL_ENV=venv and
   extra ("NAME=value ..." or ""); its output in out */
static int tcu_nvrtc_run(int driver, const char *venv, const char *extra, const char *args, char *out, size_t cap) {
    char prog[512], fakecuda[512], cmd[2600];
    FILE *p;
    size_t n;
    tcu_path(prog, sizeof prog, "../build/nvrtc-find");
    tcu_path(fakecuda, sizeof fakecuda, "../build/fake-cuda");
    if (access(prog, X_OK) != 0 || access(fakecuda, R_OK) != 0) {
        mt_fail(__FILE__, __LINE__, "%s or %s is missing: make builds them with the tests", prog, fakecuda);
        return 0;
    }
    snprintf(cmd, sizeof cmd,
             "env -u MSKV_NVRTC_PATH -u CONDA_PREFIX -u PYTHONPATH MSKV_FAKE_DRIVER_VERSION=%d VIRTUAL_ENV='%s' "
             "LD_LIBRARY_PATH='%s' %s '%s' %s 2>&1", driver, venv, fakecuda, extra, prog, args);
    p = popen(cmd, "r");
    if (!p) return 0;
    n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    pclose(p);
    return 1;
}

/* the value of "name: value" in out (to the line's end), "" when absent */
static const char *tcu_field(const char *out, const char *name, char *buf, size_t cap) {
    char key[64];
    const char *at;
    size_t n;
    snprintf(key, sizeof key, "\n%s: ", name);
    buf[0] = 0;
    at = strstr(out, key);
    if (!at) return buf;
    at += strlen(key);
    n = strcspn(at, "\n");
    if (n >= cap) n = cap - 1;
    memcpy(buf, at, n);
    buf[n] = 0;
    return buf;
}

TEST(cuda_nvrtc_for_a_cuda_12_driver_is_12_when_13_and_12_are_both_present) {
    char root[512], out[8192], f[1024], want[1100];
    if (tcu_nvrtc_venv(root, sizeof root, "pick12", 1, 1) && tcu_nvrtc_run(12040, root, "", "create", out, sizeof out)) {
        if (!strstr(out, "\ncreate: success")) mt_fail(__FILE__, __LINE__, "create failed:\n%s", out);
        EXPECT_STREQ("12340", tcu_field(out, "nvrtc_version", f, sizeof f));
        snprintf(want, sizeof want, "%s/%s/%s", root, TCU_SITE, TCU_CU12);
        EXPECT_STREQ(want, tcu_field(out, "nvrtc_path", f, sizeof f));
        /* the choice says why, and names the NVRTC it passed over */
        tcu_field(out, "nvrtc_choice", f, sizeof f);
        EXPECT_TRUE(strstr(f, "not newer than the CUDA 12 driver") != NULL);
        EXPECT_TRUE(strstr(f, "passed over (too new): NVRTC 13.0") != NULL && strstr(f, TCU_CU13) != NULL);
        /* and the log line of the context says the same */
        EXPECT_TRUE(strstr(out, "log: mstar_kv cuda: mock") != NULL && strstr(out, "NVRTC 12340 (") != NULL);
    }
    tcu_rm_dir(root);
}

TEST(cuda_nvrtc_for_a_cuda_13_driver_is_13) {
    char root[512], out[8192], f[1024], want[1100];
    if (tcu_nvrtc_venv(root, sizeof root, "pick13", 1, 1) && tcu_nvrtc_run(13000, root, "", "create", out, sizeof out)) {
        if (!strstr(out, "\ncreate: success")) mt_fail(__FILE__, __LINE__, "create failed:\n%s", out);
        EXPECT_STREQ("13000", tcu_field(out, "nvrtc_version", f, sizeof f));
        snprintf(want, sizeof want, "%s/%s/%s", root, TCU_SITE, TCU_CU13);   /* the venv's, before the system's */
        EXPECT_STREQ(want, tcu_field(out, "nvrtc_path", f, sizeof f));
        EXPECT_TRUE(strstr(tcu_field(out, "nvrtc_choice", f, sizeof f), "passed over") == NULL);
    }
    tcu_rm_dir(root);
}

/* Only NVRTC 13 around a CUDA 12 driver: create fails, UNSUPPORTED, and
   says both versions and both fixes. (A machine whose system has an NVRTC
   12 or 11 too gets that one: then it must be that one, not the venv's.) */
TEST(cuda_nvrtc_13_alone_with_a_cuda_12_driver_is_refused_with_both_fixes) {
    char root[512], out[8192], f[1024], want[1100];
    if (tcu_nvrtc_venv(root, sizeof root, "only13", 1, 0) && tcu_nvrtc_run(12040, root, "", "create", out, sizeof out)) {
        if (strstr(out, "\ncreate: success")) {
            snprintf(want, sizeof want, "%s/%s/%s", root, TCU_SITE, TCU_CU13);
            EXPECT_TRUE(strtol(tcu_field(out, "nvrtc_version", f, sizeof f), NULL, 10) / 1000 <= 12);
            EXPECT_TRUE(strcmp(want, tcu_field(out, "nvrtc_path", f, sizeof f)) != 0);
        } else {
            if (!strstr(out, "\ncreate: unsupported")) mt_fail(__FILE__, __LINE__, "not UNSUPPORTED:\n%s", out);
            EXPECT_TRUE(strstr(out, "log: mstar_kv cuda unsupported: no NVRTC fits the CUDA 12 driver") != NULL);
            EXPECT_TRUE(strstr(out, "NVRTC 13.0 at ") != NULL && strstr(out, TCU_CU13) != NULL);
            EXPECT_TRUE(strstr(out, "a driver for CUDA 13 or newer (R580 or newer)") != NULL);
            EXPECT_TRUE(strstr(out, "pip install nvidia-cuda-nvrtc-cu12") != NULL);
        }
    }
    tcu_rm_dir(root);
}

/* MSKV_NVRTC_PATH names NVRTC 13 for a CUDA 12 driver: the error at
   create (through driver_path here), not the venv's NVRTC 12 in its place
   and not a module that fails to load later */
TEST(cuda_nvrtc_path_naming_a_too_new_nvrtc_is_an_error_at_create) {
    char root[512], out[8192], extra[700], fake13[512], args[700];
    tcu_path(fake13, sizeof fake13, "../build/fake-nvrtc13/libnvrtc.so");
    tcu_path(args, sizeof args, "../build/fake-cuda/libcuda.so.1");
    snprintf(extra, sizeof extra, "MSKV_NVRTC_PATH='%s'", fake13);
    {
        char a2[800];
        snprintf(a2, sizeof a2, "create '%s'", args);
        if (tcu_nvrtc_venv(root, sizeof root, "envpath", 0, 1) && tcu_nvrtc_run(12040, root, extra, a2, out, sizeof out)) {
            if (!strstr(out, "\ncreate: unsupported")) mt_fail(__FILE__, __LINE__, "not UNSUPPORTED:\n%s", out);
            EXPECT_TRUE(strstr(out, "(MSKV_NVRTC_PATH) is NVRTC 13.0, newer than the CUDA 12 driver") != NULL);
            EXPECT_TRUE(strstr(out, "pip install nvidia-cuda-nvrtc-cu12") != NULL);
            EXPECT_TRUE(strstr(out, "nvrtc_path: ") == NULL);
        }
    }
    tcu_rm_dir(root);
}

/* The disk cache keys on NVRTC's version: what NVRTC 13 compiled (a
   compile without a driver takes the first NVRTC found: the venv's 13) is
   not what a CUDA 12 driver's context is served (its NVRTC 12 compiles
   afresh under another key), and a CUDA 13 driver's context gets it. */
TEST(cuda_cache_filled_by_nvrtc_13_is_not_served_to_a_cuda_12_driver) {
    char root[512], cache[600], out[8192], out13[8192], args[700];
    const char *first, *second, *again;
    if (!tcu_nvrtc_venv(root, sizeof root, "cache13", 1, 1)) { tcu_rm_dir(root); return; }
    snprintf(cache, sizeof cache, "%s/cache", root);
    snprintf(args, sizeof args, "compile-create '%s'", cache);
    if (tcu_nvrtc_run(12040, root, "", args, out, sizeof out)) {
        first = strstr(out, "compile: key ");
        second = first ? strstr(first + 1, "compile: key ") : NULL;
        if (!first || !second) mt_fail(__FILE__, __LINE__, "two compiles expected:\n%s", out);
        else {
            EXPECT_TRUE(strncmp(first, second, 29) != 0);                 /* another key */
            EXPECT_TRUE(strstr(first, "from_disk 0\n// fake libnvrtc of the mstar_kv loader tests\n// version 13.0") == first + 30);
            EXPECT_TRUE(strstr(second, "from_disk 0\n// fake libnvrtc of the mstar_kv loader tests\n// version 12.34") == second + 30);
            snprintf(args, sizeof args, "create-compile '%s'", cache);
            if (tcu_nvrtc_run(13000, root, "", args, out13, sizeof out13)) {
                again = strstr(out13, "compile: key ");
                EXPECT_TRUE(again && strncmp(again, first, 29) == 0 && strncmp(again + 29, " from_disk 1", 12) == 0);
            }
        }
    }
    tcu_rm_dir(root);
}
#else
/* These tests load stand-in NVRTC libraries from the Linux wheels' layouts (dlopen of .so files); the
   Windows layouts are searched too, and tests/test_nvrtc_wheels.c checks their candidate paths there */
#define TCU_WHEEL_SKIP SKIP("these load stand-in .so libraries from the Linux wheel layouts; the Windows layouts' paths are checked by tests/test_nvrtc_wheels.c")
TEST(cuda_nvrtc_is_found_in_the_cu12_wheel_of_a_virtualenv) { TCU_WHEEL_SKIP; }
TEST(cuda_nvrtc_is_found_in_the_cu13_wheel_of_a_conda_environment) { TCU_WHEEL_SKIP; }
TEST(cuda_nvrtc_is_found_in_a_wheel_on_the_pythonpath) { TCU_WHEEL_SKIP; }
#define TCU_PICK_SKIP SKIP("the NVRTC choice is tested with stand-in shared libraries on POSIX (the rule is the same code on Windows)")
TEST(cuda_nvrtc_for_a_cuda_12_driver_is_12_when_13_and_12_are_both_present) { TCU_PICK_SKIP; }
TEST(cuda_nvrtc_for_a_cuda_13_driver_is_13) { TCU_PICK_SKIP; }
TEST(cuda_nvrtc_13_alone_with_a_cuda_12_driver_is_refused_with_both_fixes) { TCU_PICK_SKIP; }
TEST(cuda_nvrtc_path_naming_a_too_new_nvrtc_is_an_error_at_create) { TCU_PICK_SKIP; }
TEST(cuda_cache_filled_by_nvrtc_13_is_not_served_to_a_cuda_12_driver) { TCU_PICK_SKIP; }
#endif

/* An injected table is held to the same rule as the loader's choice: its
   NVRTC may not be newer than its driver. */
static mskv_cu_result tcu_driver_12_4(int *v) { *v = 12040; return 0; }
static mskv_nvrtc_result tcu_nvrtc_12_8(int *a, int *b) { *a = 12; *b = 8; return 0; }
TEST(cuda_injected_nvrtc_newer_than_its_driver_is_refused) {
    mskv_cuda_functions fn = tcm_table();
    mskv_cuda_desc cd;
    mskv_cuda_info info;
    mskv_cuda *cu = NULL;
    tcm_reset();
    memset(&cd, 0, sizeof cd);
    fn.cuDriverGetVersion = tcu_driver_12_4;         /* the table's NVRTC is 13.0 */
    cd.functions = &fn;
    cd.selftest = MSKV_CUDA_SELFTEST_OFF;   /* the mock launches kernels without running them */
    cd.disable_disk_cache = 1;
    cd.log = tcu_log;
    tcu_logged[0] = 0;
    EXPECT_EQ(MSKV_ERROR_UNSUPPORTED, mskv_cuda_create(&cd, &cu));
    EXPECT_TRUE(cu == NULL);
    EXPECT_TRUE(strstr(tcu_logged, "NVRTC 13.0 (injected) is newer than the driver (CUDA 12.4)") != NULL);
    EXPECT_TRUE(strstr(tcu_logged, "R580") != NULL && strstr(tcu_logged, "nvidia-cuda-nvrtc-cu12") != NULL);
    /* an NVRTC 12.8 with the same driver is taken: a newer minor loads (the ABI is the major's) */
    fn.nvrtcVersion = tcu_nvrtc_12_8;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_create(&cd, &cu));
    mskv_cuda_info_get(cu, &info);
    EXPECT_EQ(12080, info.nvrtc_version);
    EXPECT_STREQ("injected", info.nvrtc_path);
    EXPECT_STREQ("NVRTC 12.8 of the injected table", info.nvrtc_choice);
    mskv_cuda_destroy(cu);
}

static mskv_result tcu_compile_mock(mskv_cuda_desc *cd, mskv_cuda_image *img) {
    static const char *const opts[2] = { "-DMSKV_DTYPE=1", "-DMSKV_HEAD_DIM=128" };
    mskv_cuda_compile_info ci;
    memset(&ci, 0, sizeof ci);
    ci.arch = 90;
    ci.options = opts;
    ci.num_options = 2;
    return mskv_cuda_compile(cd, &ci, img);
}

/* A cache directory too long for its entries' paths turns the disk cache
   off (compiling still works) rather than reading or writing a cut path. */
TEST(cuda_disk_cache_with_a_too_long_directory_is_off_not_truncated) {
    mskv_cuda_functions fn = tcm_table();
    mskv_cuda_desc cd;
    mskv_cuda_image a;
    char dir[700];
    memset(dir, 'd', sizeof dir - 1);
    dir[0] = '/';
    dir[sizeof dir - 1] = 0;
    tcm_reset();
    memset(&cd, 0, sizeof cd);
    cd.functions = &fn;
    cd.selftest = MSKV_CUDA_SELFTEST_OFF;   /* the mock launches kernels without running them */
    cd.cache_dir = dir;
    ASSERT_EQ(MSKV_SUCCESS, tcu_compile_mock(&cd, &a));
    EXPECT_FALSE(a.from_disk);
    EXPECT_STREQ("", a.path);
    mskv_cuda_image_free(&cd, &a);
    ASSERT_EQ(MSKV_SUCCESS, tcu_compile_mock(&cd, &a));
    EXPECT_EQ(2, tcm.compiles);                 /* nothing was cached */
    mskv_cuda_image_free(&cd, &a);
}

TEST(cuda_disk_cache_miss_compiles_then_hit_reads_without_compiling) {
    mskv_cuda_functions fn = tcm_table();
    mskv_cuda_desc cd;
    mskv_cuda_image a, b;
    char dir[512];
    tcm_reset();
    memset(&cd, 0, sizeof cd);
    tcu_cache_dir(dir, sizeof dir, "hit");
    cd.functions = &fn;
    cd.selftest = MSKV_CUDA_SELFTEST_OFF;   /* the mock launches kernels without running them */
    cd.cache_dir = dir;
    ASSERT_EQ(MSKV_SUCCESS, tcu_compile_mock(&cd, &a));
    EXPECT_EQ(1, tcm.compiles);
    EXPECT_FALSE(a.from_disk);
    ASSERT_EQ(MSKV_SUCCESS, tcu_compile_mock(&cd, &b));
    EXPECT_EQ(1, tcm.compiles);
    EXPECT_TRUE(b.from_disk);
    EXPECT_EQ_U64(a.key, b.key);
    EXPECT_EQ(a.size, b.size);
    EXPECT_TRUE(a.size == b.size && memcmp(a.data, b.data, a.size) == 0);
    EXPECT_STREQ(a.log, b.log);
    mskv_cuda_image_free(&cd, &a);
    mskv_cuda_image_free(&cd, &b);
    /* another option, another entry */
    {
        static const char *const other[1] = { "-DMSKV_DTYPE=2" };
        mskv_cuda_compile_info ci;
        memset(&ci, 0, sizeof ci);
        ci.arch = 90; ci.options = other; ci.num_options = 1;
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_compile(&cd, &ci, &a));
        EXPECT_FALSE(a.from_disk);
        EXPECT_EQ(2, tcm.compiles);
        mskv_cuda_image_free(&cd, &a);
    }
    EXPECT_EQ(0, tcm.progs);
    tcu_rm_dir(dir);
}

TEST(cuda_corrupt_cache_entry_is_detected_and_rebuilt) {
    mskv_cuda_functions fn = tcm_table();
    mskv_cuda_desc cd;
    mskv_cuda_image a;
    char dir[512], path[600];
    FILE *fp;
    long size;
    int round;
    tcm_reset();
    memset(&cd, 0, sizeof cd);
    tcu_cache_dir(dir, sizeof dir, "corrupt");
    cd.functions = &fn;
    cd.selftest = MSKV_CUDA_SELFTEST_OFF;   /* the mock launches kernels without running them */
    cd.cache_dir = dir;
    cd.log = tcu_log;
    ASSERT_EQ(MSKV_SUCCESS, tcu_compile_mock(&cd, &a));
    snprintf(path, sizeof path, "%s", a.path);
    mskv_cuda_image_free(&cd, &a);
    for (round = 0; round < 2; round++) {
        int before = tcm.compiles;
        tcu_corrupt_warnings = 0;
        fp = fopen(path, "r+b");
        ASSERT_TRUE(fp != NULL);
        fseek(fp, 0, SEEK_END);
        size = ftell(fp);
        if (round == 0) {           /* one flipped byte in the image */
            int c;
            fseek(fp, size - 20, SEEK_SET);
            c = fgetc(fp);
            fseek(fp, size - 20, SEEK_SET);
            fputc(c ^ 0x40, fp);
            fclose(fp);
        } else {                    /* a truncated file */
            fclose(fp);
            ASSERT_TRUE(tcu_truncate(path, size / 2));
        }
        ASSERT_EQ(MSKV_SUCCESS, tcu_compile_mock(&cd, &a));
        EXPECT_FALSE(a.from_disk);
        EXPECT_EQ(before + 1, tcm.compiles);
        EXPECT_EQ(1, tcu_corrupt_warnings);
        mskv_cuda_image_free(&cd, &a);
        ASSERT_EQ(MSKV_SUCCESS, tcu_compile_mock(&cd, &a));  /* rebuilt: a hit again */
        EXPECT_TRUE(a.from_disk);
        mskv_cuda_image_free(&cd, &a);
    }
    tcu_rm_dir(dir);
}

TEST(cuda_two_processes_writing_one_cache_entry_do_not_corrupt_it) {
#ifdef _WIN32
    SKIP("needs fork(); the same entry written by two threads at once is checked on every platform");
#else
    mskv_cuda_functions fn = tcm_table();
    mskv_cuda_desc cd;
    mskv_cuda_image ref;
    char dir[512], path[600];
    pid_t kids[2];
    int i, status, bad = 0;
    tcm_reset();
    memset(&cd, 0, sizeof cd);
    tcu_cache_dir(dir, sizeof dir, "race");
    cd.functions = &fn;
    cd.selftest = MSKV_CUDA_SELFTEST_OFF;   /* the mock launches kernels without running them */
    cd.cache_dir = dir;
    cd.log = tcu_log;
    ASSERT_EQ(MSKV_SUCCESS, tcu_compile_mock(&cd, &ref));
    snprintf(path, sizeof path, "%s", ref.path);
    fflush(stdout);
    for (i = 0; i < 2; i++) {
        kids[i] = fork();
        ASSERT_TRUE(kids[i] >= 0);
        if (kids[i] == 0) {
            /* each writer removes the entry now and then, so both keep rewriting it
               while the other reads; a reader must only ever see a whole, valid file */
            int round, errors = 0;
            tcu_corrupt_warnings = 0;
            for (round = 0; round < 150; round++) {
                mskv_cuda_image img;
                if (round % 3 == i) unlink(path);
                if (tcu_compile_mock(&cd, &img) != MSKV_SUCCESS || img.size != ref.size ||
                    memcmp(img.data, ref.data, ref.size) != 0) errors++;
                mskv_cuda_image_free(&cd, &img);
            }
            _exit(errors || tcu_corrupt_warnings ? 1 : 0);
        }
    }
    for (i = 0; i < 2; i++) {
        if (waitpid(kids[i], &status, 0) != kids[i] || !WIFEXITED(status) || WEXITSTATUS(status) != 0) bad++;
    }
    EXPECT_EQ(0, bad);
    {
        mskv_cuda_image img;
        int before = tcm.compiles;
        ASSERT_EQ(MSKV_SUCCESS, tcu_compile_mock(&cd, &img));
        EXPECT_TRUE(img.from_disk);
        EXPECT_EQ(before, tcm.compiles);
        mskv_cuda_image_free(&cd, &img);
    }
    EXPECT_EQ(0, mtu_dir_count(dir, ".tmp."));   /* no temp file left behind */
    mskv_cuda_image_free(&cd, &ref);
    tcu_rm_dir(dir);
#endif
}

/* The mock NVRTC without the mock's counters: safe to call from several threads. */
static mskv_nvrtc_result tcu_mt_create(mskv_nvrtc_program *p, const char *src, const char *name, int nh,
                                       const char *const *h, const char *const *in) {
    (void)src; (void)name; (void)nh; (void)h; (void)in;
    *p = (mskv_nvrtc_program)calloc(1, sizeof(tcm_prog));
    return *p ? 0 : 1;
}
static mskv_nvrtc_result tcu_mt_destroy(mskv_nvrtc_program *p) {
    tcm_prog *q = (tcm_prog *)(void *)*p;
    if (q) { free(q->options); free(q); }
    *p = NULL;
    return 0;
}
static mskv_nvrtc_result tcu_mt_compile(mskv_nvrtc_program p, int n, const char *const *opts) {
    tcm_prog *q = (tcm_prog *)(void *)p;
    size_t len = 16;
    int i;
    for (i = 0; i < n; i++) len += strlen(opts[i]) + 1;
    q->options = (char *)calloc(1, len);
    if (!q->options) return 1;
    strcpy(q->options, "MOCKCUBIN\n");
    for (i = 0; i < n; i++) { strcat(q->options, opts[i]); strcat(q->options, "\n"); }
    return 0;
}

typedef struct tcu_writer {
    mskv_cuda_desc cd;
    const mskv_cuda_image *ref;
    const char *path;
    int index, errors;
} tcu_writer;

static void tcu_writer_run(void *arg) {
    tcu_writer *w = (tcu_writer *)arg;
    int round;
    for (round = 0; round < 150; round++) {
        mskv_cuda_image img;
        if (round % 3 == w->index) remove(w->path);
        if (tcu_compile_mock(&w->cd, &img) != MSKV_SUCCESS || img.size != w->ref->size ||
            memcmp(img.data, w->ref->data, w->ref->size) != 0) w->errors++;
        mskv_cuda_image_free(&w->cd, &img);
    }
}

static int tcu_warned_corrupt;
static void tcu_count_corrupt(void *u, mskv_log_level lvl, const char *m) {
    (void)u;
    if (lvl >= MSKV_LOG_WARN && strstr(m, "corrupt")) tcu_warned_corrupt = 1;  /* any writer: a flag, not a count */
}

/* Two threads of one process share the pid in their temp names, and on
   Windows a reader holds the entry open while the other thread renames a new
   one over it: every read still gets a whole, valid entry. */
TEST(cuda_two_threads_writing_one_cache_entry_do_not_corrupt_it) {
    mskv_cuda_functions fn = tcm_table();
    mskv_cuda_desc cd;
    mskv_cuda_image ref;
    tcu_writer w[2];
    mtu_thread *th[2];
    char dir[512], path[600];
    int i, started = 0;
    fn.nvrtcCreateProgram = tcu_mt_create;
    fn.nvrtcDestroyProgram = tcu_mt_destroy;
    fn.nvrtcCompileProgram = tcu_mt_compile;
    memset(&cd, 0, sizeof cd);
    tcu_cache_dir(dir, sizeof dir, "threads");
    cd.functions = &fn;
    cd.selftest = MSKV_CUDA_SELFTEST_OFF;   /* the mock launches kernels without running them */
    cd.cache_dir = dir;
    cd.log = tcu_count_corrupt;
    tcu_warned_corrupt = 0;
    ASSERT_EQ(MSKV_SUCCESS, tcu_compile_mock(&cd, &ref));
    snprintf(path, sizeof path, "%s", ref.path);
    for (i = 0; i < 2; i++) {
        w[i].cd = cd; w[i].ref = &ref; w[i].path = path; w[i].index = i; w[i].errors = 0;
        if ((th[i] = mtu_thread_start(tcu_writer_run, &w[i])) == NULL) break;
        started++;
    }
    for (i = 0; i < started; i++) mtu_thread_join(th[i]);
    ASSERT_EQ(2, started);
    EXPECT_EQ(0, w[0].errors);
    EXPECT_EQ(0, w[1].errors);
    EXPECT_EQ(0, tcu_warned_corrupt);
    EXPECT_EQ(0, mtu_dir_count(dir, ".tmp."));   /* no temp file left behind */
    mskv_cuda_image_free(&cd, &ref);
    tcu_rm_dir(dir);
}

/* Saves an environment variable for tcu_env_restore. */
typedef struct tcu_env { const char *name; char value[1024]; int set; } tcu_env;
static void tcu_env_save(tcu_env *e, const char *name) {
    const char *v = getenv(name);
    e->name = name;
    e->set = v != NULL;
    snprintf(e->value, sizeof e->value, "%s", v ? v : "");
}
static void tcu_env_restore(const tcu_env *e) { mtu_setenv(e->name, e->set ? e->value : NULL); }

/* With no cache_dir and no $MSKV_CACHE_DIR, entries go to the platform's
   per-user cache: %LOCALAPPDATA%\mstar_kv on Windows, $XDG_CACHE_HOME/mstar_kv
   elsewhere (the directory is created). */
TEST(cuda_disk_cache_defaults_to_the_platform_user_cache_directory) {
    mskv_cuda_functions fn = tcm_table();
    mskv_cuda_desc cd;
    mskv_cuda_image a, b;
    tcu_env saved[2];
    char base[512], want[700];
#ifdef _WIN32
    const char *var = "LOCALAPPDATA";
#else
    const char *var = "XDG_CACHE_HOME";
#endif
    tcm_reset();
    tcu_env_save(&saved[0], "MSKV_CACHE_DIR");
    tcu_env_save(&saved[1], var);
    tcu_cache_dir(base, sizeof base, "default");
    ASSERT_EQ(0, mtu_setenv("MSKV_CACHE_DIR", NULL));
    ASSERT_EQ(0, mtu_setenv(var, base));
    memset(&cd, 0, sizeof cd);
    cd.functions = &fn;
    cd.selftest = MSKV_CUDA_SELFTEST_OFF;   /* the mock launches kernels without running them */
    EXPECT_EQ(MSKV_SUCCESS, tcu_compile_mock(&cd, &a));
    EXPECT_EQ(MSKV_SUCCESS, tcu_compile_mock(&cd, &b));
    tcu_env_restore(&saved[0]);
    tcu_env_restore(&saved[1]);
#ifdef _WIN32
    snprintf(want, sizeof want, "%s\\mstar_kv\\%016llx.cubin", base, (unsigned long long)a.key);
#else
    snprintf(want, sizeof want, "%s/mstar_kv/%016llx.cubin", base, (unsigned long long)a.key);
#endif
    EXPECT_STREQ(want, a.path);
    EXPECT_FALSE(a.from_disk);
    EXPECT_TRUE(b.from_disk);                  /* written there, read back from there */
    EXPECT_EQ(1, tcm.compiles);
    mskv_cuda_image_free(&cd, &a);
    mskv_cuda_image_free(&cd, &b);
#ifdef _WIN32
    snprintf(want, sizeof want, "%s\\mstar_kv", base);
#else
    snprintf(want, sizeof want, "%s/mstar_kv", base);
#endif
    tcu_rm_dir(want);
    tcu_rm_dir(base);
}


/* The driver is looked for under its platform name, and the reason says what
   the system loader answered. */
TEST(cuda_unavailable_reason_names_the_platform_driver_and_the_loaders_answer) {
#ifdef _WIN32
    const char *code = "(Windows error 126)";      /* ERROR_MOD_NOT_FOUND */
#else
    const char *code = "cannot open shared object file";
#endif
    mskv_cuda_desc cd;
    char why[4096];
    memset(&cd, 0, sizeof cd);
    if (mskv_cuda_probe(&cd, why, sizeof why) == MSKV_SUCCESS) SKIP("a CUDA driver, a device and NVRTC are present on this machine");
    if (!strstr(why, "(no CUDA driver)")) SKIP("a CUDA driver loads here: %.200s", why);
    EXPECT_TRUE(strstr(why, TCU_DRIVER_NAME) == why);          /* tried first */
    EXPECT_TRUE(strstr(why, code) != NULL);
}

/* NVRTC is looked for under every ABI name (newest first, through the
   system's own search), then in the toolkit's folders: on Windows
   %CUDA_PATH%\bin\x64 (CUDA 13) before %CUDA_PATH%\bin. */
TEST(cuda_nvrtc_is_looked_for_under_every_abi_name_then_in_the_toolkit_folders) {
#ifdef _WIN32
    static const char *const want[] = {
        "nvrtc64_130_0.dll", "nvrtc64_120_0.dll", "nvrtc64_112_0.dll",
        "C:\\cuda\\bin\\x64\\nvrtc64_130_0.dll", "C:\\cuda\\bin\\x64\\nvrtc64_120_0.dll",
        "C:\\cuda\\bin\\x64\\nvrtc64_112_0.dll", "C:\\cuda\\bin\\nvrtc64_130_0.dll",
        "C:\\cuda\\bin\\nvrtc64_120_0.dll", "C:\\cuda\\bin\\nvrtc64_112_0.dll" };
#else
    static const char *const want[] = {
        "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so",
        "/usr/local/cuda/lib64/libnvrtc.so.13", "/usr/local/cuda/lib64/libnvrtc.so.12",
        "/usr/local/cuda/lib64/libnvrtc.so.11.2", "/usr/local/cuda/lib64/libnvrtc.so" };
#endif
    char paths[12][512];
    tcu_env saved;
    int i, n;
    tcu_env_save(&saved, "CUDA_PATH");
    mtu_setenv("CUDA_PATH", "C:\\cuda");
    n = mtu_nvrtc_candidates(paths, 12);
    tcu_env_restore(&saved);
    ASSERT_EQ((int)(sizeof want / sizeof want[0]), n);
    for (i = 0; i < n; i++) EXPECT_STREQ(want[i], paths[i]);
}

TEST(cuda_warm_start_compiles_nothing) {
    char dir[512];
    int run;
    mskv_cuda_info info[2];
    tcu_cache_dir(dir, sizeof dir, "warm");
    for (run = 0; run < 2; run++) {
        tcu_rig r;
        mskv_request req;
        ASSERT_EQ(MSKV_SUCCESS, tcu_rig_open_cached(&r, dir));
        ASSERT_EQ(MSKV_SUCCESS, tcu_fill(&r, &req, 5));
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(r.a, req));
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_info_get(r.cu, &info[run]));
        tcu_rig_close(&r);
        TCU_EXPECT_NO_LEAKS();
    }
    EXPECT_EQ(1, info[0].compiles);
    EXPECT_EQ(0, info[0].disk_hits);
    EXPECT_EQ(0, info[1].compiles);
    EXPECT_EQ(1, info[1].disk_hits);
    tcu_rm_dir(dir);
}

/* ---- the device store through the mock ---------------------------------------------------- */

TEST(cuda_compile_error_log_reaches_logger_and_caller) {
    tcu_rig r;
    mskv_cuda_image img;
    mskv_request req;
    ASSERT_EQ(MSKV_SUCCESS, tcu_rig_open(&r, 0));
    tcm.compile_error = 1;
    EXPECT_EQ(MSKV_ERROR_NVRTC, tcu_fill(&r, &req, 6));
    EXPECT_TRUE(strstr(tcu_logged, "mock compile failure here") != NULL);
    EXPECT_TRUE(strstr(mskv_cuda_last_error(r.cu), "mock compile failure here") != NULL);
    EXPECT_EQ(MSKV_ERROR_NVRTC, tcu_compile_mock(&r.cd, &img));
    EXPECT_TRUE(img.log != NULL && strstr(img.log, "kernels.cu(7): error") != NULL);
    mskv_cuda_image_free(&r.cd, &img);
    EXPECT_TRUE(tcu_audit(r.a));
    tcu_rig_close(&r);
    TCU_EXPECT_NO_LEAKS();
}

TEST(cuda_device_newer_than_nvrtc_gets_ptx_for_the_newest_known_arch) {
    mskv_cuda_functions fn;
    mskv_cuda_desc cd;
    mskv_cuda *cu = NULL;
    mskv_cuda_info info;
    mskv_cuda_store *st = NULL;
    mskv_cuda_store_desc sd = tcu_store_desc(0);
    mskv_cuda_dplan dp;
    mskv_plan plan;
    int64_t slots[1] = { 5 };
    mskv_cu_ptr k = 0;
    tcm_reset();
    tcm.cc_major = 12;                  /* the mock NVRTC knows up to sm_90 */
    fn = tcm_table();
    memset(&cd, 0, sizeof cd);
    cd.functions = &fn;
    cd.selftest = MSKV_CUDA_SELFTEST_OFF;   /* the mock launches kernels without running them */
    cd.disable_disk_cache = 1;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_create(&cd, &cu));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_info_get(cu, &info));
    EXPECT_EQ(12, info.cc_major);
    EXPECT_EQ(90, info.arch);
    EXPECT_EQ(1, info.ptx_fallback);
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_store_create(cu, &sd, &st));
    memset(&plan, 0, sizeof plan);
    plan.total_q = 1;
    plan.slot_mapping = slots;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(st, &plan, MSKV_POS_NONE, &dp));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(cu, 2 * 64 * 4, &k));
    EXPECT_EQ(MSKV_SUCCESS, mskv_cuda_write_kv(st, 0, &dp, k, k, NULL));
    EXPECT_STREQ("--gpu-architecture=compute_90", tcm.last_target);
    mskv_cuda_free(cu, k);
    mskv_cuda_store_destroy(st);
    mskv_cuda_destroy(cu);
    EXPECT_TRUE(tcm_nothing_live());
}

TEST(cuda_store_out_of_device_memory_fails_cleanly_at_every_allocation) {
    mskv_cuda_functions fn;
    mskv_cuda_desc cd;
    mskv_cuda *cu = NULL;
    mskv_cuda_store *st = NULL;
    mskv_cuda_store_desc sd = tcu_store_desc(0);
    int total, k;
    tcm_reset();
    tcu_live_allocs = 0;
    fn = tcm_table();
    memset(&cd, 0, sizeof cd);
    cd.functions = &fn;
    cd.selftest = MSKV_CUDA_SELFTEST_OFF;   /* the mock launches kernels without running them */
    cd.disable_disk_cache = 1;
    cd.allocator = tcu_allocator();
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_create(&cd, &cu));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_store_create(cu, &sd, &st));
    total = tcm.allocs;
    mskv_cuda_store_destroy(st);
    EXPECT_TRUE(total >= 5);
    for (k = 1; k <= total; k++) {
        long dev = tcm.dev_live, host = tcm.host_live, ev = tcm.events, streams = tcm.streams, allocs = tcu_live_allocs;
        tcm.allocs = 0;
        tcm.fail_alloc_at = k;
        st = (mskv_cuda_store *)&cd;
        EXPECT_EQ(MSKV_ERROR_OUT_OF_MEMORY, mskv_cuda_store_create(cu, &sd, &st));
        EXPECT_TRUE(st == NULL);
        EXPECT_EQ(dev, tcm.dev_live);
        EXPECT_EQ(host, tcm.host_live);
        EXPECT_EQ(ev, tcm.events);
        EXPECT_EQ(streams, tcm.streams);
        EXPECT_EQ(allocs, tcu_live_allocs);
        EXPECT_TRUE(strstr(mskv_cuda_last_error(cu), "out of memory") != NULL);
    }
    tcm.fail_alloc_at = 0;
    mskv_cuda_destroy(cu);
    TCU_EXPECT_NO_LEAKS();
}

TEST(cuda_store_rejects_sizes_past_what_kernels_can_index) {
    mskv_cuda_functions fn = tcm_table();
    mskv_cuda_desc cd;
    mskv_cuda *cu = NULL;
    mskv_cuda_store *st = NULL;
    mskv_cuda_store_desc sd = tcu_store_desc(0);
    tcm_reset();
    memset(&cd, 0, sizeof cd);
    cd.functions = &fn;
    cd.selftest = MSKV_CUDA_SELFTEST_OFF;   /* the mock launches kernels without running them */
    cd.disable_disk_cache = 1;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_create(&cd, &cu));
    sd.num_pages = 0x7fffffff; sd.page_size = 0x7fffffff; sd.kv_heads = 1 << 20; sd.head_dim = 256;
    EXPECT_EQ(MSKV_ERROR_OVERFLOW, mskv_cuda_store_create(cu, &sd, &st));
    EXPECT_EQ(0, tcm.allocs);
    mskv_cuda_destroy(cu);
    EXPECT_TRUE(tcm_nothing_live());
}

TEST(cuda_offload_and_reload_round_trip_restores_bytes) {
    tcu_rig r;
    mskv_request req;
    mskv_request_info info;
    int32_t l, kind;
    ASSERT_EQ(MSKV_SUCCESS, tcu_rig_open(&r, 5000));   /* 2 pages per staging chunk */
    ASSERT_EQ(MSKV_SUCCESS, tcu_fill(&r, &req, 18));
    EXPECT_TRUE(tcu_bytes_ok(&r, req, 18));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(r.a, req));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_info_get(r.a, req, &info));
    EXPECT_EQ(MSKV_OFFLOADED, info.location);
    /* garbage over every device page, so the reload must really copy */
    for (l = 0; l < 2; l++)
        for (kind = 0; kind < 2; kind++)
            memset((void *)(uintptr_t)mskv_cuda_store_pool(r.st, l, kind), 0xAB, (size_t)24 * 4 * 2 * 64 * 4);
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_publish(r.st, NULL, 0, NULL));   /* the freed pages retire */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(r.a, req));
    EXPECT_TRUE(tcu_bytes_ok(&r, req, 18));
    EXPECT_TRUE(tcu_audit(r.a));
    tcu_rig_close(&r);
    TCU_EXPECT_NO_LEAKS();
}

/* Offloaded requests' host copies are pinned (one DMA fills them), the
   arena keeps a reloaded one for the next offload, and everything is freed
   with the arena. */
TEST(cuda_offload_lands_in_pinned_host_memory_reused_across_round_trips) {
    tcu_rig r;
    mskv_request req;
    int host_before, k;
    ASSERT_EQ(MSKV_SUCCESS, tcu_rig_open(&r, 0));
    ASSERT_EQ(MSKV_SUCCESS, tcu_fill(&r, &req, 18));
    host_before = tcm.host_live;
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(r.a, req));
    EXPECT_EQ(host_before + 1, tcm.host_live);          /* the host copy is pinned */
    for (k = 0; k < 3; k++) {
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_publish(r.st, NULL, 0, NULL));
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_retire(r.st, 1));
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(r.a, req));
        EXPECT_TRUE(tcu_bytes_ok(&r, req, 18));
        EXPECT_EQ(host_before + 1, tcm.host_live);      /* kept for the next offload */
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(r.a, req));
        EXPECT_EQ(host_before + 1, tcm.host_live);      /* the same buffer again */
    }
    EXPECT_TRUE(tcu_audit(r.a));
    tcu_rig_close(&r);
    TCU_EXPECT_NO_LEAKS();
}

TEST(cuda_copy_failing_halfway_through_offload_keeps_request_resident) {
    tcu_rig r;
    mskv_request req;
    mskv_request_info info;
    mskv_arena_stats s0, s1;
    ASSERT_EQ(MSKV_SUCCESS, tcu_rig_open(&r, 5000));   /* 5 pages -> 3 chunks */
    ASSERT_EQ(MSKV_SUCCESS, tcu_fill(&r, &req, 18));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(r.a, &s0));
    tcm.dtohs = 0;
    tcm.fail_dtoh_at = 2;
    EXPECT_EQ(MSKV_ERROR_CUDA, mskv_request_offload(r.a, req));
    EXPECT_EQ(2, tcm.dtohs);
    tcm.fail_dtoh_at = 0;
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_info_get(r.a, req, &info));
    EXPECT_EQ(MSKV_RESIDENT, info.location);
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(r.a, &s1));
    EXPECT_EQ(s0.free_pages, s1.free_pages);
    EXPECT_EQ(s0.live_pages, s1.live_pages);
    EXPECT_EQ(s0.offloaded_pages, s1.offloaded_pages);
    EXPECT_TRUE(tcu_audit(r.a));
    EXPECT_TRUE(tcu_bytes_ok(&r, req, 18));
    /* and a retry succeeds */
    EXPECT_EQ(MSKV_SUCCESS, mskv_request_offload(r.a, req));
    EXPECT_EQ(MSKV_SUCCESS, mskv_request_reload(r.a, req));
    EXPECT_TRUE(tcu_bytes_ok(&r, req, 18));
    tcu_rig_close(&r);
    TCU_EXPECT_NO_LEAKS();
}

TEST(cuda_module_load_failure_is_an_error_and_changes_nothing) {
    tcu_rig r;
    mskv_request req;
    mskv_request_info info;
    uint64_t digest;
    ASSERT_EQ(MSKV_SUCCESS, tcu_rig_open(&r, 0));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(r.a, &req));
    tcm.fail_module_load = 1;
    {
        mskv_segment seg;
        seg.request = req; seg.n_tokens = 5;
        ASSERT_EQ(MSKV_SUCCESS, mskv_admit(r.a, &seg, 1));
        ASSERT_EQ(MSKV_SUCCESS, mskv_commit(r.a, &seg, 1));
    }
    digest = mskv_arena_digest(r.a);
    EXPECT_EQ(MSKV_ERROR_CUDA, mskv_request_offload(r.a, req));
    EXPECT_TRUE(strstr(mskv_cuda_last_error(r.cu), "cuModuleLoadData") != NULL);
    EXPECT_EQ_U64(digest, mskv_arena_digest(r.a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_info_get(r.a, req, &info));
    EXPECT_EQ(MSKV_RESIDENT, info.location);
    EXPECT_EQ(0, tcm.modules);
    EXPECT_TRUE(tcu_audit(r.a));
    tcm.fail_module_load = 0;
    EXPECT_EQ(MSKV_SUCCESS, mskv_request_offload(r.a, req));
    EXPECT_EQ(1, tcm.modules);
    tcu_rig_close(&r);
    TCU_EXPECT_NO_LEAKS();
}

TEST(cuda_failed_launch_during_reload_keeps_request_offloaded) {
    tcu_rig r;
    mskv_request req;
    mskv_request_info info;
    mskv_arena_stats s0, s1;
    ASSERT_EQ(MSKV_SUCCESS, tcu_rig_open(&r, 5000));
    ASSERT_EQ(MSKV_SUCCESS, tcu_fill(&r, &req, 18));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(r.a, req));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_store_sync(r.st));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(r.a, &s0));
    tcm.launches = 0;
    tcm.fail_launch_at = 3;     /* in the second chunk's scatters */
    EXPECT_EQ(MSKV_ERROR_CUDA, mskv_request_reload(r.a, req));
    EXPECT_TRUE(strstr(mskv_cuda_last_error(r.cu), "cuLaunchKernel") != NULL);
    tcm.fail_launch_at = 0;
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_info_get(r.a, req, &info));
    EXPECT_EQ(MSKV_OFFLOADED, info.location);
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(r.a, &s1));
    EXPECT_EQ(s0.free_pages, s1.free_pages);
    EXPECT_EQ(s0.offloaded_pages, s1.offloaded_pages);
    EXPECT_TRUE(tcu_audit(r.a));
    /* the host copy is intact: the next reload restores every byte */
    EXPECT_EQ(MSKV_SUCCESS, mskv_request_reload(r.a, req));
    EXPECT_TRUE(tcu_bytes_ok(&r, req, 18));
    tcu_rig_close(&r);
    TCU_EXPECT_NO_LEAKS();
}

TEST(cuda_pages_freed_in_a_step_wait_for_its_event) {
    tcu_rig r;
    mskv_request req;
    mskv_segment seg;
    mskv_arena_stats s;
    uint64_t step = 0;
    ASSERT_EQ(MSKV_SUCCESS, tcu_rig_open(&r, 0));
    ASSERT_EQ(MSKV_SUCCESS, tcu_fill(&r, &req, 12));
    tcm.event_busy = 1;                     /* the GPU is still running this step */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_remove(r.a, req));
    seg.request = req; seg.n_tokens = 0;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_publish(r.st, NULL, 0, &step));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(r.a, &s));
    EXPECT_EQ(3, s.pending_pages);
    EXPECT_EQ(MSKV_SUCCESS, mskv_cuda_retire(r.st, 0));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(r.a, &s));
    EXPECT_EQ(3, s.pending_pages);
    tcm.event_busy = 0;                     /* its event completed */
    EXPECT_EQ(MSKV_SUCCESS, mskv_cuda_retire(r.st, 0));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(r.a, &s));
    EXPECT_EQ(0, s.pending_pages);
    EXPECT_EQ_U64(step, s.completed_step);
    EXPECT_TRUE(tcu_audit(r.a));
    (void)seg;
    tcu_rig_close(&r);
    TCU_EXPECT_NO_LEAKS();
}

/* mskv_arena_flush reaches the device store through its flush op: the
   stream is synchronised first, then every pending page is free, even those
   of steps whose events were never recorded or have not answered yet. */
TEST(cuda_arena_flush_waits_for_the_store_stream_then_frees_every_pending_page) {
    tcu_rig r;
    mskv_request a, b;
    mskv_arena_stats s;
    uint64_t digest;
    int syncs;
    ASSERT_EQ(MSKV_SUCCESS, tcu_rig_open(&r, 0));
    ASSERT_EQ(MSKV_SUCCESS, tcu_fill(&r, &a, 12));
    ASSERT_EQ(MSKV_SUCCESS, tcu_fill(&r, &b, 8));
    tcm.event_busy = 1;                     /* the GPU is still running */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_remove(r.a, a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_publish(r.st, NULL, 0, NULL));   /* a recorded, unfinished fence */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_remove(r.a, b));               /* freed in the current step */
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(r.a, &s));
    EXPECT_EQ(5, s.pending_pages);
    /* a failed wait frees nothing */
    tcm.stream_sync_fails = 1;
    digest = mskv_arena_digest(r.a);
    EXPECT_EQ(MSKV_ERROR_CUDA, mskv_arena_flush(r.a));
    EXPECT_EQ_U64(digest, mskv_arena_digest(r.a));
    tcm.stream_sync_fails = 0;
    syncs = tcm.stream_syncs;
    EXPECT_EQ(MSKV_SUCCESS, mskv_arena_flush(r.a));
    EXPECT_EQ(syncs + 1, tcm.stream_syncs);
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(r.a, &s));
    EXPECT_EQ(0, s.pending_pages);
    EXPECT_EQ(23, s.free_pages);
    EXPECT_TRUE(tcu_audit(r.a));
    /* the late event of the recorded fence retires nothing twice */
    tcm.event_busy = 0;
    EXPECT_EQ(MSKV_SUCCESS, mskv_cuda_retire(r.st, 0));
    EXPECT_TRUE(tcu_audit(r.a));
    tcu_rig_close(&r);
    TCU_EXPECT_NO_LEAKS();
}

TEST(cuda_plan_ring_buffer_is_reused_only_after_its_event) {
    tcu_rig r;
    mskv_plan plan;
    mskv_cuda_dplan dp1, dp2;
    int64_t slots[3] = { 4, 5, 6 };
    ASSERT_EQ(MSKV_SUCCESS, tcu_rig_open(&r, 0));   /* a ring of 2 */
    memset(&plan, 0, sizeof plan);
    plan.total_q = 3;
    plan.slot_mapping = slots;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(r.st, &plan, MSKV_POS_NONE, &dp1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(r.st, &plan, MSKV_POS_NONE, &dp2));
    EXPECT_EQ(0, tcm.event_syncs);
    slots[1] = 9;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(r.st, &plan, MSKV_POS_NONE, &dp2));
    EXPECT_EQ(1, tcm.event_syncs);
    /* fixed addresses, new contents */
    EXPECT_EQ_U64(dp1.slot_mapping, dp2.slot_mapping);
    EXPECT_EQ(9, ((const int64_t *)(uintptr_t)dp2.slot_mapping)[1]);
    plan.total_q = 65;
    EXPECT_EQ(MSKV_ERROR_CAPACITY, mskv_cuda_plan_upload(r.st, &plan, MSKV_POS_NONE, &dp2));
    tcu_rig_close(&r);
    TCU_EXPECT_NO_LEAKS();
}

/* The kernels trust the plan, so its upload refuses what the CPU backend
   refuses: a slot in the null page or past the pools, a page id outside
   [1, num_pages), another page size. Nothing is copied then. */
TEST(cuda_plan_upload_refuses_null_page_slots_and_foreign_page_ids) {
    tcu_rig r;
    mskv_plan plan;
    mskv_cuda_dplan dp;
    int64_t slots[3] = { 4, -1, 95 };       /* 24 pages x 4 slots: 95 is the last slot */
    int32_t qo[2] = { 0, 3 }, kvp[2] = { 0, 2 }, ids[2] = { 1, 23 };
    ASSERT_EQ(MSKV_SUCCESS, tcu_rig_open(&r, 0));
    memset(&plan, 0, sizeof plan);
    plan.batch = 1; plan.total_q = 3; plan.num_page_ids = 2; plan.page_size = 4;
    plan.qo_indptr = qo; plan.kv_indptr = kvp; plan.kv_indices = ids; plan.slot_mapping = slots;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(r.st, &plan, MSKV_POS_NONE, &dp));   /* -1 is padding */
    slots[0] = 3;                            /* the null page */
    EXPECT_EQ(MSKV_ERROR_OUT_OF_RANGE, mskv_cuda_plan_upload(r.st, &plan, MSKV_POS_NONE, &dp));
    slots[0] = 96;                           /* past the pools */
    EXPECT_EQ(MSKV_ERROR_OUT_OF_RANGE, mskv_cuda_plan_upload(r.st, &plan, MSKV_POS_NONE, &dp));
    slots[0] = 4;
    ids[1] = 24;
    EXPECT_EQ(MSKV_ERROR_OUT_OF_RANGE, mskv_cuda_plan_upload(r.st, &plan, MSKV_POS_NONE, &dp));
    ids[1] = 0;
    EXPECT_EQ(MSKV_ERROR_OUT_OF_RANGE, mskv_cuda_plan_upload(r.st, &plan, MSKV_POS_NONE, &dp));
    ids[1] = 23;
    plan.page_size = 8;
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_plan_upload(r.st, &plan, MSKV_POS_NONE, &dp));
    plan.page_size = 4;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(r.st, &plan, MSKV_POS_NONE, &dp));
    tcu_rig_close(&r);
    TCU_EXPECT_NO_LEAKS();
}

TEST(cuda_captured_graph_replays_with_new_plan_contents) {
    tcu_rig r;
    mskv_plan plan;
    mskv_cuda_dplan dp;
    mskv_cuda_graph *g = NULL;
    mskv_cu_ptr dk = 0, dv = 0;
    int64_t slots[2] = { 4, 5 };
    float k[2 * 2 * 64], v[2 * 2 * 64];
    const float *kpool;
    int i;
    ASSERT_EQ(MSKV_SUCCESS, tcu_rig_open(&r, 0));
    for (i = 0; i < 256; i++) { k[i] = (float)(i + 1); v[i] = -(float)(i + 1); }
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(r.cu, sizeof k, &dk));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(r.cu, sizeof v, &dv));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_upload(r.st, dk, k, sizeof k));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_upload(r.st, dv, v, sizeof v));
    memset(&plan, 0, sizeof plan);
    plan.total_q = 2;
    plan.slot_mapping = slots;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(r.st, &plan, MSKV_POS_NONE, &dp));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_write_kv(r.st, 1, &dp, dk, dv, NULL));   /* compiles before capture */
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_capture_begin(r.st));
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_cuda_plan_upload(r.st, &plan, MSKV_POS_NONE, &dp));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_write_kv(r.st, 1, &dp, dk, dv, NULL));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_capture_end(r.st, &g));
    slots[0] = 40; slots[1] = 41;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(r.st, &plan, MSKV_POS_NONE, &dp));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_graph_launch(r.st, g));
    kpool = (const float *)(uintptr_t)mskv_cuda_store_pool(r.st, 1, 0);
    {
        int bad = 0;
        for (i = 0; i < 256; i++) bad += k[i] != kpool[40 * 128 + i];
        EXPECT_EQ(0, bad);
    }
    /* a plan of another shape: the token count is a launch argument and the
       grid was sized at capture, so replaying would write stale slots */
    plan.total_q = 1;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(r.st, &plan, MSKV_POS_NONE, &dp));
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_graph_launch(r.st, g));
    EXPECT_TRUE(strstr(mskv_cuda_last_error(r.cu), "capture again") != NULL);
    plan.total_q = 2;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(r.st, &plan, MSKV_POS_NONE, &dp));
    EXPECT_EQ(MSKV_SUCCESS, mskv_cuda_graph_launch(r.st, g));
    mskv_cuda_graph_destroy(r.st, g);
    mskv_cuda_free(r.cu, dk);
    mskv_cuda_free(r.cu, dv);
    tcu_rig_close(&r);
    TCU_EXPECT_NO_LEAKS();
}

/* A plan uploaded without a slot mapping (or without positions) leaves
   nothing for K/V write to use: refused, not the previous plan's slots. */
TEST(cuda_write_kv_refuses_a_plan_uploaded_without_slots_or_positions) {
    tcu_rig r;
    mskv_plan plan;
    mskv_cuda_dplan dp;
    mskv_cu_ptr dk = 0;
    mskv_rope rope;
    int64_t slots[2] = { 4, 5 };
    ASSERT_EQ(MSKV_SUCCESS, tcu_rig_open(&r, 0));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(r.cu, 2 * 2 * 64 * 4, &dk));
    memset(&plan, 0, sizeof plan);
    plan.total_q = 2;
    plan.slot_mapping = slots;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(r.st, &plan, MSKV_POS_NONE, &dp));
    plan.slot_mapping = NULL;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(r.st, &plan, MSKV_POS_NONE, &dp));
    EXPECT_EQ(MSKV_ERROR_NULL_POINTER, mskv_cuda_write_kv(r.st, 0, &dp, dk, dk, NULL));
    plan.slot_mapping = slots;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(r.st, &plan, MSKV_POS_NONE, &dp));
    memset(&rope, 0, sizeof rope);
    rope.mode = MSKV_POS_1D;
    dp.pos_mode = MSKV_POS_1D;                 /* claims positions it does not have */
    EXPECT_EQ(MSKV_ERROR_NULL_POINTER, mskv_cuda_write_kv(r.st, 0, &dp, dk, dk, &rope));
    mskv_cuda_free(r.cu, dk);
    tcu_rig_close(&r);
    TCU_EXPECT_NO_LEAKS();
}

/* RoPE parts become -D defines the kernel trusts: widths the CPU refuses
   (odd, negative, wider than the head) are refused before any compile. */
TEST(cuda_rope_paths_refuse_widths_the_cpu_refuses) {
    tcu_rig r;
    mskv_plan plan;
    mskv_cuda_dplan dp;
    mskv_cu_ptr dk = 0;
    mskv_rope rope;
    int64_t slots[1] = { 4 };
    int32_t pos[3] = { 0, 0, 0 };
    int i;
    ASSERT_EQ(MSKV_SUCCESS, tcu_rig_open(&r, 0));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(r.cu, 2 * 64 * 4, &dk));
    memset(&plan, 0, sizeof plan);
    plan.total_q = 1;
    plan.slot_mapping = slots;
    plan.positions = pos;
    for (i = 0; i < 4; i++) {
        memset(&rope, 0, sizeof rope);
        rope.mode = i < 2 ? MSKV_POS_1D : MSKV_POS_3D;
        if (i == 0) rope.dims[0] = 128;                  /* head_dim is 64 */
        if (i == 1) rope.dims[0] = 7;                    /* odd */
        if (i == 2) { rope.dims[0] = -6; }               /* negative */
        if (i == 3) { rope.dims[0] = 32; rope.dims[1] = 32; rope.dims[2] = 2; } /* 66 > 64 */
        ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(r.st, &plan, rope.mode, &dp));
        EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_write_kv(r.st, 0, &dp, dk, dk, &rope));
        EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_rope(r.st, &rope, dk, 1, 2, dk));
        {   /* the CPU refuses the same rope */
            float row[64];
            memset(row, 0, sizeof row);
            EXPECT_NE(MSKV_SUCCESS, mskv_rope_apply(&rope, row, MSKV_DTYPE_F32, 1, 1, 64, pos));
        }
    }
    mskv_cuda_free(r.cu, dk);
    tcu_rig_close(&r);
    TCU_EXPECT_NO_LEAKS();
}

/* A framework runs its kernels on its own stream (PyTorch: the current
   stream): after mskv_cuda_store_set_stream the store's launches and copies
   go there, offloads included; NULL gives the store its own stream back, and
   the caller's stream is never destroyed by the store. */
TEST(cuda_store_runs_on_the_callers_stream_after_set_stream) {
    tcu_rig r;
    mskv_request req;
    mskv_cu_stream own, theirs = NULL;
    ASSERT_EQ(MSKV_SUCCESS, tcu_rig_open(&r, 0));
    own = mskv_cuda_store_stream(r.st);
    ASSERT_EQ(0, r.fn.cuStreamCreate(&theirs, 0));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_store_set_stream(r.st, theirs));
    EXPECT_TRUE(mskv_cuda_store_stream(r.st) == theirs);
    ASSERT_EQ(MSKV_SUCCESS, tcu_fill(&r, &req, 9));
    EXPECT_TRUE(tcm.launch_stream == theirs);          /* K/V write */
    EXPECT_TRUE(tcm.copy_stream == theirs);            /* plan upload */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(r.a, req));
    EXPECT_TRUE(tcm.launch_stream == theirs);          /* page gather */
    EXPECT_TRUE(tcm.copy_stream == theirs);            /* the DMA to the host copy */
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_publish(r.st, NULL, 0, NULL));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(r.a, req));
    EXPECT_TRUE(tcu_bytes_ok(&r, req, 9));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_store_set_stream(r.st, NULL));
    EXPECT_TRUE(mskv_cuda_store_stream(r.st) == own);
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_store_set_stream(r.st, MSKV_CU_STREAM_LEGACY));
    EXPECT_TRUE(mskv_cuda_store_stream(r.st) == MSKV_CU_STREAM_LEGACY);
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_store_set_stream(r.st, NULL));
    tcu_rig_close(&r);
    EXPECT_EQ(1, tcm.streams);                         /* theirs is still alive */
    r.fn.cuStreamDestroy(theirs);
    TCU_EXPECT_NO_LEAKS();
}

/* Work queued on the old stream (kernels writing pages) must be done before
   the new stream touches the same pages: the switch waits for it. */
TEST(cuda_set_stream_waits_for_the_previous_stream_first) {
    tcu_rig r;
    mskv_cu_stream own, theirs = NULL;
    ASSERT_EQ(MSKV_SUCCESS, tcu_rig_open(&r, 0));
    own = mskv_cuda_store_stream(r.st);
    ASSERT_EQ(0, r.fn.cuStreamCreate(&theirs, 0));
    tcm.synced_stream = NULL;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_store_set_stream(r.st, theirs));
    EXPECT_TRUE(tcm.synced_stream == own);
    tcm.synced_stream = NULL;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_store_set_stream(r.st, theirs));   /* the same: nothing to wait for */
    EXPECT_TRUE(tcm.synced_stream == NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_store_set_stream(r.st, NULL));
    EXPECT_TRUE(tcm.synced_stream == theirs);
    tcu_rig_close(&r);
    r.fn.cuStreamDestroy(theirs);
    TCU_EXPECT_NO_LEAKS();
}

/* The legacy default stream cannot be captured: BAD_STATE with the reason
   before the driver is asked (which would answer with a generic error), and
   a driver that refuses another stream for that reason (900,
   STREAM_CAPTURE_UNSUPPORTED) is BAD_STATE too; the store is not capturing
   after either, and captures once on a stream of its own. */
TEST(cuda_capture_on_the_legacy_stream_is_bad_state_with_the_reason) {
    tcu_rig r;
    mskv_cuda_graph *g = NULL;
    ASSERT_EQ(MSKV_SUCCESS, tcu_rig_open(&r, 0));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_store_set_stream(r.st, MSKV_CU_STREAM_LEGACY));
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_cuda_capture_begin(r.st));
    EXPECT_TRUE(strstr(mskv_cuda_last_error(r.cu), "legacy default stream, which CUDA cannot capture") != NULL);
    EXPECT_EQ(0, tcm.capturing);                              /* the driver was not asked */
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_cuda_capture_end(r.st, &g));   /* nothing was begun */
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_store_set_stream(r.st, NULL));
    tcm.capture_unsupported = 1;
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_cuda_capture_begin(r.st));
    EXPECT_TRUE(strstr(mskv_cuda_last_error(r.cu), "CUDA error 900") != NULL);
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_cuda_capture_end(r.st, &g));
    tcm.capture_unsupported = 0;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_capture_begin(r.st));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_capture_end(r.st, &g));
    mskv_cuda_graph_destroy(r.st, g);
    tcu_rig_close(&r);
    TCU_EXPECT_NO_LEAKS();
}

TEST(cuda_set_stream_is_refused_while_capturing) {
    tcu_rig r;
    mskv_cu_stream own, theirs = NULL;
    mskv_cuda_graph *g = NULL;
    ASSERT_EQ(MSKV_SUCCESS, tcu_rig_open(&r, 0));
    own = mskv_cuda_store_stream(r.st);
    ASSERT_EQ(0, r.fn.cuStreamCreate(&theirs, 0));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_capture_begin(r.st));
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_cuda_store_set_stream(r.st, theirs));
    EXPECT_TRUE(mskv_cuda_store_stream(r.st) == own);
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_capture_end(r.st, &g));
    mskv_cuda_graph_destroy(r.st, g);
    EXPECT_EQ(MSKV_ERROR_NULL_POINTER, mskv_cuda_store_set_stream(NULL, theirs));
    tcu_rig_close(&r);
    r.fn.cuStreamDestroy(theirs);
    TCU_EXPECT_NO_LEAKS();
}

/* A store over 4 pools (2 layers, K and V) the caller allocated. */
static mskv_result tcu_rig_open_adopted(tcu_rig *r, mskv_cu_ptr pools[4]) {
    mskv_cuda_store_desc sd = tcu_store_desc(0);
    mskv_arena_desc ad;
    mskv_result e;
    size_t pool_bytes = (size_t)24 * 4 * 2 * 64 * 4;
    int i;
    memset(r, 0, sizeof *r);
    tcm_reset();
    tcu_live_allocs = 0;
    r->fn = tcm_table();
    r->cd.functions = &r->fn;
    r->cd.selftest = MSKV_CUDA_SELFTEST_OFF;   /* the mock launches kernels without running them */
    r->cd.disable_disk_cache = 1;
    r->cd.allocator = tcu_allocator();
    if ((e = mskv_cuda_create(&r->cd, &r->cu)) != MSKV_SUCCESS) return e;
    for (i = 0; i < 4; i++) {
        if ((e = mskv_cuda_malloc(r->cu, pool_bytes, &pools[i])) != MSKV_SUCCESS) return e;
        memset((void *)(uintptr_t)pools[i], 0xAB, pool_bytes);
    }
    sd.pools = pools;
    if ((e = mskv_cuda_store_create(r->cu, &sd, &r->st)) != MSKV_SUCCESS) return e;
    memset(&ad, 0, sizeof ad);
    ad.allocator = tcu_allocator();
    if ((e = mskv_cuda_store_arena_desc(r->st, &ad)) != MSKV_SUCCESS) return e;
    if ((e = mskv_arena_create(&ad, &r->a)) != MSKV_SUCCESS) return e;
    return mskv_cuda_store_bind(r->st, r->a);
}

/* So a model keeps its K/V in its own tensors: the store adopts the pools,
   zeroes them, writes and offloads through them, and leaves them to the
   caller when it is destroyed. */
TEST(cuda_store_adopts_caller_pools_and_leaves_them_to_the_caller) {
    tcu_rig r;
    mskv_cu_ptr pools[4];
    mskv_request req;
    long dev_before;
    int i;
    ASSERT_EQ(MSKV_SUCCESS, tcu_rig_open_adopted(&r, pools));
    for (i = 0; i < 4; i++) {
        EXPECT_TRUE(mskv_cuda_store_pool(r.st, i / 2, i % 2) == pools[i]);
        EXPECT_EQ(0, ((const unsigned char *)(uintptr_t)pools[i])[100]);   /* zeroed on create */
    }
    ASSERT_EQ(MSKV_SUCCESS, tcu_fill(&r, &req, 18));
    EXPECT_TRUE(tcu_bytes_ok(&r, req, 18));                  /* written into the caller's memory */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(r.a, req));
    for (i = 0; i < 4; i++) memset((void *)(uintptr_t)pools[i], 0xAB, (size_t)24 * 4 * 2 * 64 * 4);
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_publish(r.st, NULL, 0, NULL));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(r.a, req));
    EXPECT_TRUE(tcu_bytes_ok(&r, req, 18));
    EXPECT_TRUE(tcu_audit(r.a));
    mskv_arena_destroy(r.a);
    dev_before = tcm.dev_live;
    mskv_cuda_store_destroy(r.st);
    EXPECT_EQ(4, tcm.dev_live);                              /* only the caller's pools are left */
    EXPECT_TRUE(dev_before > 4);
    for (i = 0; i < 4; i++) mskv_cuda_free(r.cu, pools[i]);
    mskv_cuda_destroy(r.cu);
    TCU_EXPECT_NO_LEAKS();
}

TEST(cuda_store_refuses_missing_or_misaligned_adopted_pools) {
    mskv_cuda_functions fn = tcm_table();
    mskv_cuda_desc cd;
    mskv_cuda *cu = NULL;
    mskv_cuda_store *st = NULL;
    mskv_cuda_store_desc sd = tcu_store_desc(0);
    mskv_cu_ptr pools[4];
    int i;
    tcm_reset();
    memset(&cd, 0, sizeof cd);
    cd.functions = &fn;
    cd.selftest = MSKV_CUDA_SELFTEST_OFF;   /* the mock launches kernels without running them */
    cd.disable_disk_cache = 1;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_create(&cd, &cu));
    for (i = 0; i < 4; i++) ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(cu, (size_t)24 * 4 * 2 * 64 * 4 + 16, &pools[i]));
    sd.pools = pools;
    tcm.allocs = 0;
    pools[3] += 4;                                           /* not 16-byte aligned */
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_store_create(cu, &sd, &st));
    pools[3] -= 4;
    {
        mskv_cu_ptr keep = pools[1];
        pools[1] = 0;                                        /* a missing pool */
        EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_store_create(cu, &sd, &st));
        pools[1] = keep;
    }
    EXPECT_TRUE(st == NULL);
    EXPECT_EQ(0, tcm.allocs);                                /* refused before allocating anything */
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_store_create(cu, &sd, &st));
    mskv_cuda_store_destroy(st);
    for (i = 0; i < 4; i++) mskv_cuda_free(cu, pools[i]);
    mskv_cuda_destroy(cu);
    EXPECT_TRUE(tcm_nothing_live());
}

/* ---- the per-call launch path ---------------------------------------------------------------
   Once a wrapper's kernel is loaded, a call checks its arguments, looks the
   function up by an integer key in the store's cache and writes the
   parameter values: no allocation, no formatted string, no driver call but
   cuCtxSetCurrent and the launches. So on each attention path of the mock
   compute capability 9.0 device: AUTO (prefill on the sm_90a kernel, decode
   on mma.sync), AUTO after the sm_90a kernel failed to load (mma.sync from
   then on), mma.sync forced, wgmma forced (decode too). */

typedef struct tcu_hot {
    tcu_rig r;
    mskv_plan dec, pre;                 /* 1 query over 8000 keys (split: two launches); 64 over 200 */
    int32_t dqo[2], dkvp[2], dlast[1], dkvl[1], dsplit[1], dshift[1];
    int32_t pqo[2], pkvp[2], plast[1], pkvl[1], psplit[1], pshift[1], pos[64 * 3];
    int32_t ids[500];
    int64_t slots[64];
    mskv_cuda_dplan dp;
    mskv_attn attn;
    mskv_rope rope3;
    mskv_cu_ptr q, o, lse, k, v, part;
} tcu_hot;

enum { TCU_ATTN_DECODE, TCU_ATTN_PREFILL, TCU_WRITE_KV, TCU_WRITE_KV_ROPE, TCU_MERGE, TCU_ROPE, TCU_HOT_CASES };
static const char *const tcu_hot_names[TCU_HOT_CASES] = { "attention (decode, split)", "attention (prefill)",
                                                          "write_kv", "write_kv (3-D RoPE)", "merge", "rope" };
static const int tcu_hot_launches[TCU_HOT_CASES] = { 2, 1, 1, 1, 1, 1 };

typedef struct tcu_hot_path {
    mskv_cuda_attn_path path;
    int sm90a;                          /* the mock loads the sm_90a module */
    int decode_kind, prefill_kind;      /* the attention kernel each case launches (tcm_func kinds) */
    const char *name;
} tcu_hot_path;
#define TCU_HOT_PATHS 4
static const tcu_hot_path tcu_hot_paths[TCU_HOT_PATHS] = {
    { MSKV_CUDA_ATTN_AUTO, 1, 4, 8, "auto" },
    { MSKV_CUDA_ATTN_AUTO, 0, 4, 4, "auto, sm_90a module fails to load" },
    { MSKV_CUDA_ATTN_MMA, 1, 4, 4, "mma.sync forced" },
    { MSKV_CUDA_ATTN_WGMMA, 1, 8, 8, "wgmma forced" },
};

/* A bf16 store of head_dim 128 (attention tiles above 48 KiB of shared memory) on the mock. */
static int32_t tcu_hot_head_dim;   /* the next hot rig's head_dim (0: 128; its buffers are sized for 128) */
static mskv_result tcu_hot_open_path(tcu_hot *h, const tcu_hot_path *path) {
    mskv_cuda_store_desc sd;
    mskv_result e;
    int i;
    memset(h, 0, sizeof *h);
    tcm_reset();
    tcm.sm90a = path->sm90a;
    tcu_live_allocs = 0;
    h->r.fn = tcm_table();
    h->r.cd.functions = &h->r.fn;
    h->r.cd.selftest = MSKV_CUDA_SELFTEST_OFF;   /* the mock launches kernels without running them */
    h->r.cd.attn_path = path->path;
    h->r.cd.disable_disk_cache = 1;
    h->r.cd.allocator = tcu_allocator();
    h->r.cd.log = tcu_log;
    if ((e = mskv_cuda_create(&h->r.cd, &h->r.cu)) != MSKV_SUCCESS) return e;
    memset(&sd, 0, sizeof sd);
    sd.num_pages = 504; sd.page_size = 16; sd.num_layers = 2; sd.kv_heads = 2;
    sd.head_dim = tcu_hot_head_dim ? tcu_hot_head_dim : 128;
    tcu_hot_head_dim = 0;
    sd.dtype = MSKV_DTYPE_BF16; sd.max_batch = 4; sd.max_tokens = 64; sd.max_page_ids = 500; sd.plan_ring = 2;
    if ((e = mskv_cuda_store_create(h->r.cu, &sd, &h->r.st)) != MSKV_SUCCESS) return e;
    for (i = 0; i < 500; i++) h->ids[i] = i + 1;
    h->dqo[1] = 1; h->dkvp[1] = 500; h->dlast[0] = 16; h->dkvl[0] = 8000; h->dshift[0] = 7999;
    h->pqo[1] = 64; h->pkvp[1] = 13; h->plast[0] = 8; h->pkvl[0] = 200; h->pshift[0] = 136;
    for (i = 0; i < 64; i++) h->slots[i] = 16 + 136 + i;
    for (i = 0; i < 64 * 3; i++) h->pos[i] = i % 7;
    h->dec.batch = 1; h->dec.total_q = 1; h->dec.num_page_ids = 500; h->dec.page_size = 16;
    h->dec.qo_indptr = h->dqo; h->dec.kv_indptr = h->dkvp; h->dec.kv_indices = h->ids; h->dec.kv_last_page_len = h->dlast;
    h->dec.kv_len = h->dkvl; h->dec.kv_pos_split = h->dsplit; h->dec.kv_pos_shift = h->dshift;
    h->pre = h->dec;
    h->pre.total_q = 64; h->pre.num_page_ids = 13;
    h->pre.qo_indptr = h->pqo; h->pre.kv_indptr = h->pkvp; h->pre.kv_last_page_len = h->plast;
    h->pre.kv_len = h->pkvl; h->pre.kv_pos_split = h->psplit; h->pre.kv_pos_shift = h->pshift;
    h->pre.slot_mapping = h->slots; h->pre.positions = h->pos;
    h->attn.q_heads = 4; h->attn.mask = MSKV_MASK_CAUSAL; h->attn.q_dtype = MSKV_DTYPE_BF16;
    h->rope3.mode = MSKV_POS_3D; h->rope3.dims[0] = 44; h->rope3.dims[1] = 42; h->rope3.dims[2] = 42;
#define TCU_HOT_MALLOC(p, n) if ((e = mskv_cuda_malloc(h->r.cu, (n), &(p))) != MSKV_SUCCESS) return e
    TCU_HOT_MALLOC(h->q, 64 * 4 * 128 * 2);
    TCU_HOT_MALLOC(h->o, 64 * 4 * 128 * 2);
    TCU_HOT_MALLOC(h->lse, 64 * 4 * 4);
    TCU_HOT_MALLOC(h->k, 64 * 2 * 128 * 2);
    TCU_HOT_MALLOC(h->v, 64 * 2 * 128 * 2);
    TCU_HOT_MALLOC(h->part, 4 * 2 * (4 * 128 + 4) * 4);
#undef TCU_HOT_MALLOC
    return MSKV_SUCCESS;
}

static mskv_result tcu_hot_open(tcu_hot *h) { return tcu_hot_open_path(h, &tcu_hot_paths[1]); }

static void tcu_hot_close(tcu_hot *h) {
    mskv_cuda_free(h->r.cu, h->q); mskv_cuda_free(h->r.cu, h->o); mskv_cuda_free(h->r.cu, h->lse);
    mskv_cuda_free(h->r.cu, h->k); mskv_cuda_free(h->r.cu, h->v); mskv_cuda_free(h->r.cu, h->part);
    tcu_rig_close(&h->r);
}

/* Uploads the plan a case reads (outside the counted calls). */
static mskv_result tcu_hot_prepare(tcu_hot *h, int which) {
    if (which == TCU_ATTN_DECODE) return mskv_cuda_plan_upload(h->r.st, &h->dec, MSKV_POS_NONE, &h->dp);
    return mskv_cuda_plan_upload(h->r.st, &h->pre, MSKV_POS_3D, &h->dp);
}

static mskv_result tcu_hot_call(tcu_hot *h, int which, int i) {
    mskv_cuda_store *st = h->r.st;
    mskv_cu_ptr lse_b = h->part + 4 * 2 * 4 * 128 * 4;
    switch (which) {
    case TCU_ATTN_DECODE: return mskv_cuda_attention(st, i & 1, &h->dec, &h->dp, &h->attn, h->q, h->o, h->lse);
    case TCU_ATTN_PREFILL: return mskv_cuda_attention(st, i & 1, &h->pre, &h->dp, &h->attn, h->q, h->o, h->lse);
    case TCU_WRITE_KV: return mskv_cuda_write_kv(st, i & 1, &h->dp, h->k, h->v, NULL);
    case TCU_WRITE_KV_ROPE: return mskv_cuda_write_kv(st, i & 1, &h->dp, h->k, h->v, &h->rope3);
    case TCU_MERGE: return mskv_cuda_merge(st, 4, 2, 128, h->part, lse_b, h->part + 4 * 2 * 128 * 4, lse_b + 32, h->part, lse_b);
    default: return mskv_cuda_rope(st, &h->rope3, h->k, 64, 2, h->dp.positions);
    }
}

typedef struct tcu_counts { long allocs, formats, driver, launches; } tcu_counts;
static tcu_counts tcu_counts_now(void) {
    tcu_counts c;
    c.allocs = tcu_total_allocs; c.formats = mtu_format_count(); c.driver = tcm.calls; c.launches = tcm.launches;
    return c;
}

/* What 20 calls of a case cost once its first call has loaded the kernel;
   *first: what that first call cost. */
static int tcu_hot_measure(tcu_hot *h, int which, tcu_counts *first, tcu_counts *steady) {
    tcu_counts c0, c1, c2;
    int i, bad = 0;
    if (tcu_hot_prepare(h, which) != MSKV_SUCCESS) return 0;
    c0 = tcu_counts_now();
    bad += tcu_hot_call(h, which, 0) != MSKV_SUCCESS;
    c1 = tcu_counts_now();
    for (i = 1; i <= 20; i++) bad += tcu_hot_call(h, which, i) != MSKV_SUCCESS;
    c2 = tcu_counts_now();
    first->allocs = c1.allocs - c0.allocs; first->formats = c1.formats - c0.formats;
    first->driver = c1.driver - c0.driver; first->launches = c1.launches - c0.launches;
    steady->allocs = c2.allocs - c1.allocs; steady->formats = c2.formats - c1.formats;
    steady->driver = c2.driver - c1.driver; steady->launches = c2.launches - c1.launches;
    if (bad) mt_fail(__FILE__, __LINE__, "%s: %d calls failed: %s", tcu_hot_names[which], bad, mskv_cuda_last_error(h->r.cu));
    return bad == 0;
}

/* The attention kernel case w launched (its first call and the 20 after it). */
static void tcu_hot_expect_kernel(const tcu_hot_path *p, int w) {
    int want = w == TCU_ATTN_DECODE ? p->decode_kind : p->prefill_kind;
    if ((w == TCU_ATTN_DECODE || w == TCU_ATTN_PREFILL) && tcm.attn_kind != want)
        mt_fail(__FILE__, __LINE__, "%s, %s: launched %s", p->name, tcu_hot_names[w],
                tcm.attn_kind == 8 ? "mskv_attn_sm90" : tcm.attn_kind == 4 ? "mskv_attn" : "no attention kernel");
}

TEST(cuda_launch_wrappers_allocate_nothing_once_their_kernel_is_loaded) {
    tcu_hot h;
    tcu_counts first, steady;
    int w, p;
    for (p = 0; p < TCU_HOT_PATHS; p++) {
        ASSERT_EQ(MSKV_SUCCESS, tcu_hot_open_path(&h, &tcu_hot_paths[p]));
        for (w = 0; w < TCU_HOT_CASES; w++) {
            if (!tcu_hot_measure(&h, w, &first, &steady)) continue;
            tcu_hot_expect_kernel(&tcu_hot_paths[p], w);
            if (steady.allocs != 0)
                mt_fail(__FILE__, __LINE__, "%s, %s: %ld allocations in 20 calls", tcu_hot_paths[p].name, tcu_hot_names[w],
                        steady.allocs);
        }
        tcu_hot_close(&h);
        TCU_EXPECT_NO_LEAKS();
    }
}

TEST(cuda_launch_wrappers_format_no_string_once_their_kernel_is_loaded) {
    tcu_hot h;
    tcu_counts first, steady;
    int w, p;
    for (p = 0; p < TCU_HOT_PATHS; p++) {
        ASSERT_EQ(MSKV_SUCCESS, tcu_hot_open_path(&h, &tcu_hot_paths[p]));
        for (w = 0; w < TCU_HOT_CASES; w++) {
            if (!tcu_hot_measure(&h, w, &first, &steady)) continue;
            tcu_hot_expect_kernel(&tcu_hot_paths[p], w);
            /* the counter counts: a first compile builds its option strings */
            if (w == TCU_ATTN_DECODE) EXPECT_GT(first.formats, 0);
            if (steady.formats != 0)
                mt_fail(__FILE__, __LINE__, "%s, %s: %ld strings formatted in 20 calls", tcu_hot_paths[p].name,
                        tcu_hot_names[w], steady.formats);
        }
        tcu_hot_close(&h);
        TCU_EXPECT_NO_LEAKS();
    }
}

TEST(cuda_launch_wrappers_call_the_driver_only_to_launch) {
    tcu_hot h;
    tcu_counts first, steady;
    int w, p;
    for (p = 0; p < TCU_HOT_PATHS; p++) {
        ASSERT_EQ(MSKV_SUCCESS, tcu_hot_open_path(&h, &tcu_hot_paths[p]));
        for (w = 0; w < TCU_HOT_CASES; w++) {
            if (!tcu_hot_measure(&h, w, &first, &steady)) continue;
            tcu_hot_expect_kernel(&tcu_hot_paths[p], w);
            if (steady.launches != 20 * tcu_hot_launches[w])
                mt_fail(__FILE__, __LINE__, "%s, %s: %ld launches in 20 calls, expected %d", tcu_hot_paths[p].name,
                        tcu_hot_names[w], steady.launches, 20 * tcu_hot_launches[w]);
            /* each call: cuCtxSetCurrent, then its launches */
            if (steady.driver != steady.launches + 20)
                mt_fail(__FILE__, __LINE__, "%s, %s: %ld driver calls for %ld launches in 20 calls", tcu_hot_paths[p].name,
                        tcu_hot_names[w], steady.driver, steady.launches);
        }
        tcu_hot_close(&h);
        TCU_EXPECT_NO_LEAKS();
    }
}

/* The sm_90a kernel gets each pool's map by value: made once per store for
   every layer on its first call, then the layer's K and V maps each call. */
TEST(cuda_sm90a_tensor_maps_are_made_once_per_store_and_passed_per_layer) {
    tcu_hot h;
    int i, bad = 0;
    ASSERT_EQ(MSKV_SUCCESS, tcu_hot_open_path(&h, &tcu_hot_paths[0]));
    ASSERT_EQ(MSKV_SUCCESS, tcu_hot_prepare(&h, TCU_ATTN_PREFILL));
    EXPECT_EQ(0, tcm.tmaps);   /* not at store creation */
    for (i = 0; i < 6; i++) {
        int layer = i & 1;
        tcm.attn_kind = 0;
        bad += tcu_hot_call(&h, TCU_ATTN_PREFILL, i) != MSKV_SUCCESS;
        bad += tcm.attn_kind != 8;
        bad += tcm.sm90_tma != 1;   /* pages of 16 keys: whole pages per 128-key tile */
        bad += tcm.sm90_maps[0] != (uint64_t)mskv_cuda_store_pool(h.r.st, layer, 0);
        bad += tcm.sm90_maps[1] != (uint64_t)mskv_cuda_store_pool(h.r.st, layer, 1);
        bad += tcm.sm90_pools[0] != (uint64_t)mskv_cuda_store_pool(h.r.st, layer, 0);
    }
    EXPECT_EQ(0, bad);
    EXPECT_EQ(2 * 2, tcm.tmaps);   /* 2 layers x K and V */
    tcu_hot_close(&h);
    TCU_EXPECT_NO_LEAKS();
}

/* Out of memory while the sm_90a module is made is that call's error, not a
   reason to give the kernel up for the context's life: the next call, with
   memory, runs it. */
TEST(cuda_attention_out_of_memory_while_the_sm90a_kernel_loads_keeps_the_sm90a_path) {
    tcu_hot h;
    mskv_cuda_info info;
    long launches;
    ASSERT_EQ(MSKV_SUCCESS, tcu_hot_open_path(&h, &tcu_hot_paths[0]));
    ASSERT_EQ(MSKV_SUCCESS, tcu_hot_prepare(&h, TCU_ATTN_PREFILL));
    launches = tcm.launches;
    tcu_refuse_allocs = 1;
    EXPECT_EQ(MSKV_ERROR_OUT_OF_MEMORY, tcu_hot_call(&h, TCU_ATTN_PREFILL, 0));
    tcu_refuse_allocs = 0;
    EXPECT_EQ(launches, (long)tcm.launches);
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_info_get(h.r.cu, &info));
    EXPECT_EQ(1, info.wgmma);
    tcm.attn_kind = 0;
    EXPECT_EQ(MSKV_SUCCESS, tcu_hot_call(&h, TCU_ATTN_PREFILL, 1));
    EXPECT_EQ(8, tcm.attn_kind);
    tcu_hot_close(&h);
    TCU_EXPECT_NO_LEAKS();
}

/* The stale-plan checks in the wrappers (the host plan, and the uploaded
   one) cost no allocation, no string, no message and no driver call, also
   when another request lost pages since the build (the check then looks
   at each of the plan's requests). */
/* The mma.sync kernel at head_dim 64 uses exactly 48 KiB of dynamic shared
   memory, what a kernel gets without opting in: it opts in all the same
   (cuFuncSetAttribute), as every attention launch does, prefill and decode. */
TEST(cuda_attention_at_48_kib_of_shared_memory_still_sets_the_opt_in) {
    tcu_hot h;
    int which;
    for (which = TCU_ATTN_DECODE; which <= TCU_ATTN_PREFILL; which++) {
        tcu_hot_head_dim = 64;
        ASSERT_EQ(MSKV_SUCCESS, tcu_hot_open_path(&h, &tcu_hot_paths[2]));   /* mma.sync forced */
        ASSERT_EQ(MSKV_SUCCESS, tcu_hot_prepare(&h, which));
        ASSERT_EQ(MSKV_SUCCESS, tcu_hot_call(&h, which, 0));
        EXPECT_EQ(4, tcm.attn_kind);
        if (which == TCU_ATTN_PREFILL) EXPECT_EQ(49152, (int)tcm.attn_smem_max);
        else EXPECT_TRUE(tcm.attn_smem_max > 0);
        EXPECT_EQ(0, tcm.smem_unallowed);
        tcu_hot_close(&h);
        TCU_EXPECT_NO_LEAKS();
    }
}

static long tcu_arena_logs;
static void tcu_count_log(void *u, mskv_log_level level, const char *msg) { (void)u; (void)level; (void)msg; tcu_arena_logs++; }

TEST(cuda_launch_wrappers_check_an_arena_plan_without_allocating_formatting_or_calling_the_driver) {
    tcu_hot h;
    mskv_arena_desc ad;
    mskv_request r, other;
    mskv_segment seg;
    mskv_plan plan;
    tcu_counts c0, c1;
    long logs;
    int i, bad = 0;
    ASSERT_EQ(MSKV_SUCCESS, tcu_hot_open(&h));
    memset(&ad, 0, sizeof ad);
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_store_arena_desc(h.r.st, &ad));
    ad.allocator = tcu_allocator();
    ad.log = tcu_count_log;
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&ad, &h.r.a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_store_bind(h.r.st, h.r.a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(h.r.a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(h.r.a, r, 136));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(h.r.a, &other));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(h.r.a, other, 32));
    seg.request = r; seg.n_tokens = 64;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(h.r.a, &seg, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(h.r.a, 1, 64, 500, &plan));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(h.r.a, &seg, 1, NULL, &plan));
    ASSERT_TRUE(plan.generation != 0);
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(h.r.st, &plan, MSKV_POS_NONE, &h.dp));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(h.r.a, other, 16, NULL));   /* the generation moves */
    /* first calls load the kernels */
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_write_kv(h.r.st, 0, &h.dp, h.k, h.v, NULL));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_attention(h.r.st, 0, &plan, &h.dp, &h.attn, h.q, h.o, h.lse));
    c0 = tcu_counts_now();
    logs = tcu_arena_logs;
    for (i = 0; i < 20; i++) {
        bad += mskv_cuda_write_kv(h.r.st, i & 1, &h.dp, h.k, h.v, NULL) != MSKV_SUCCESS;
        bad += mskv_cuda_attention(h.r.st, i & 1, &plan, &h.dp, &h.attn, h.q, h.o, h.lse) != MSKV_SUCCESS;
    }
    c1 = tcu_counts_now();
    EXPECT_EQ(0, bad);
    EXPECT_EQ(0, (int)(c1.allocs - c0.allocs));
    EXPECT_EQ(0, (int)(c1.formats - c0.formats));
    EXPECT_EQ(0, (int)(tcu_arena_logs - logs));
    EXPECT_EQ(40, (int)(c1.launches - c0.launches));
    EXPECT_EQ(40 + 40, (int)(c1.driver - c0.driver));   /* each call: cuCtxSetCurrent, then its launch */
    EXPECT_TRUE(tcm.attn_smem_max > 0);
    EXPECT_EQ(0, tcm.smem_unallowed);                  /* the opt-in was set, once, for every size */
    mskv_plan_free(h.r.a, &plan);
    tcu_hot_close(&h);
    TCU_EXPECT_NO_LEAKS();
}

/* The kernel reads K and V rows as 16-byte vectors: a misaligned source
   would fault on the device and leave the context unusable, so the wrapper
   refuses it, says why, and launches nothing. */
TEST(cuda_write_kv_refuses_k_or_v_not_16_byte_aligned) {
    tcu_rig r;
    mskv_plan plan;
    mskv_cuda_dplan dp;
    mskv_cu_ptr dk = 0, dv = 0;
    int64_t slots[2] = { 4, 5 };
    long launches;
    ASSERT_EQ(MSKV_SUCCESS, tcu_rig_open(&r, 0));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(r.cu, 2 * 2 * 64 * 4 + 16, &dk));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(r.cu, 2 * 2 * 64 * 4 + 16, &dv));
    memset(&plan, 0, sizeof plan);
    plan.total_q = 2;
    plan.slot_mapping = slots;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(r.st, &plan, MSKV_POS_NONE, &dp));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_write_kv(r.st, 0, &dp, dk, dv, NULL));
    launches = tcm.launches;
    tcu_logged[0] = 0;
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_write_kv(r.st, 0, &dp, dk + 4, dv, NULL));
    EXPECT_TRUE(strstr(tcu_logged, "16-byte aligned") != NULL);
    EXPECT_TRUE(strstr(mskv_cuda_last_error(r.cu), "16-byte aligned") != NULL);
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_write_kv(r.st, 0, &dp, dk, dv + 8, NULL));
    EXPECT_EQ(launches, tcm.launches);
    EXPECT_EQ(MSKV_SUCCESS, mskv_cuda_write_kv(r.st, 0, &dp, dk + 16, dv + 16, NULL));
    mskv_cuda_free(r.cu, dk);
    mskv_cuda_free(r.cu, dv);
    tcu_rig_close(&r);
    TCU_EXPECT_NO_LEAKS();
}

TEST(cuda_export_import_works_for_a_device_resident_request) {
    tcu_rig r;
    mskv_request req, copy;
    void *blob;
    size_t size = 0;
    ASSERT_EQ(MSKV_SUCCESS, tcu_rig_open(&r, 0));
    ASSERT_EQ(MSKV_SUCCESS, tcu_fill(&r, &req, 10));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_export(r.a, req, NULL, 0, &size));
    blob = malloc(size);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_export(r.a, req, blob, size, &size));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_import(r.a, blob, size, &copy));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(r.a, copy));
    EXPECT_TRUE(tcu_bytes_ok(&r, copy, 10));
    EXPECT_TRUE(tcu_bytes_ok(&r, req, 10));
    EXPECT_TRUE(tcu_audit(r.a));
    free(blob);
    tcu_rig_close(&r);
    TCU_EXPECT_NO_LEAKS();
}

/* ---- the GPU check's own logic, through the mock ------------------------------------------- */

#define MSKV_GPU_CHECK_NO_MAIN
#include "gpu_check.c"

TEST(cuda_gpu_check_logic_passes_on_the_mock_device) {
    mskv_cuda_functions fn;
    mskv_cuda_desc cd;
    mskv_cuda *cu = NULL;
    FILE *sink = tmpfile();
    int failures;
    tcm_reset();
    tcu_live_allocs = 0;
    fn = tcm_table();
    memset(&cd, 0, sizeof cd);
    cd.functions = &fn;
    cd.selftest = MSKV_CUDA_SELFTEST_OFF;   /* the mock launches kernels without running them */
    cd.disable_disk_cache = 1;
    cd.allocator = tcu_allocator();
    ASSERT_TRUE(sink != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_create(&cd, &cu));
    failures = gpc_run(cu, 1, sink);
    if (failures) {
        char line[256];
        rewind(sink);
        while (fgets(line, sizeof line, sink)) printf("    | %s", line);
    }
    EXPECT_EQ(0, failures);
    mskv_cuda_destroy(cu);
    fclose(sink);
    EXPECT_TRUE(tcm_nothing_live());
}

/* Without NVRTC a GPU cannot run the kernels: the check fails (not "no GPU",
   which exits 77 and reads as nothing to check) and its first line is the
   fix, the wheel matching the driver's CUDA major version. */
TEST(cuda_gpu_check_fails_with_the_fix_when_a_gpu_has_no_nvrtc) {
    static const struct { int driver; const char *wheel; } cases[2] = {
        { 12080, "pip install nvidia-cuda-nvrtc-cu12 " }, { 13000, "pip install nvidia-cuda-nvrtc " } };
    int i;
    for (i = 0; i < 2; i++) {
        FILE *sink = tmpfile();
        char line[512] = "";
        ASSERT_TRUE(sink != NULL);
        EXPECT_EQ(1, gpc_no_context(sink, "libnvrtc.so.13: not found", 1, cases[i].driver, 0));
        rewind(sink);
        EXPECT_TRUE(fgets(line, sizeof line, sink) != NULL);
        EXPECT_TRUE(strncmp(line, "gpu check: FAIL", 15) == 0);
        if (!strstr(line, cases[i].wheel))
            mt_fail(__FILE__, __LINE__, "driver %d: the first line does not say \"%s\": %s", cases[i].driver, cases[i].wheel, line);
        fclose(sink);
    }
}

TEST(cuda_gpu_check_exits_77_only_without_a_gpu) {
    FILE *sink = tmpfile();
    ASSERT_TRUE(sink != NULL);
    EXPECT_EQ(77, gpc_no_context(sink, "libcuda.so.1: not found", 0, 0, 0));
    EXPECT_EQ(77, gpc_no_context(sink, "libcuda.so.1: not found", 0, 0, 1));
    EXPECT_EQ(1, gpc_no_context(sink, "cuDevicePrimaryCtxRetain failed", 2, 13000, 1));
    fclose(sink);
}

TEST(cuda_probe_driver_counts_devices_without_nvrtc) {
    mskv_cuda_functions fn = tcm_table();
    mskv_cuda_desc cd;
    int32_t devices = -1, version = -1;
    char why[1024];
    tcm_reset();
    memset(&cd, 0, sizeof cd);
    cd.functions = &fn;
    cd.selftest = MSKV_CUDA_SELFTEST_OFF;   /* the mock launches kernels without running them */
    EXPECT_EQ(MSKV_SUCCESS, mskv_cuda_probe_driver(&cd, &devices, &version, why, sizeof why));
    EXPECT_EQ(1, devices);
    EXPECT_EQ(13000, version);
    EXPECT_EQ(0, tcm.compiles);
    /* a library that is no driver */
    memset(&cd, 0, sizeof cd);
#ifdef _WIN32
    cd.driver_path = "kernel32.dll";
#else
    cd.driver_path = "libc.so.6";
#endif
    EXPECT_EQ(MSKV_ERROR_CUDA_UNAVAILABLE, mskv_cuda_probe_driver(&cd, &devices, &version, why, sizeof why));
    EXPECT_EQ(0, devices);
    EXPECT_TRUE(strstr(why, "not a CUDA driver") != NULL);
}

/* ---- hardening (issue 9): host-side checks of the store and the plan upload -------- */

/* The staging page count was narrowed from size_t to int32: 2^32 + 2
   pages' worth of staging became 2 pages (3 copies for a 5-page request)
   instead of every page of the store (one copy). */
TEST(cuda_store_staging_past_int32_pages_is_clamped_not_truncated) {
    tcu_rig r;
    mskv_request req;
    int before;
    ASSERT_EQ(MSKV_SUCCESS, tcu_rig_open(&r, (((size_t)1 << 32) + 2) * 8192));   /* 8 KiB: one page of every layer */
    ASSERT_EQ(MSKV_SUCCESS, tcu_fill(&r, &req, 18));
    before = tcm.dtohs;
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(r.a, req));
    EXPECT_EQ(before + 1, tcm.dtohs);   /* 5 pages, one chunk */
    tcu_rig_close(&r);
    TCU_EXPECT_NO_LEAKS();
}

/* The uploaded buffers are what a captured graph replays with, unchecked:
   upload refuses indptrs that do not add up (they index q, o and the page
   ids) and a kv_len past its pages, and a pos_mode it does not know. */
TEST(cuda_plan_upload_refuses_a_table_that_a_replay_would_overrun) {
    tcu_rig r;
    mskv_plan plan;
    mskv_cuda_dplan dp;
    int64_t slots[3] = { 4, 5, 6 };
    int32_t qo[3] = { 0, 1, 3 }, kvp[3] = { 0, 1, 2 }, ids[2] = { 1, 2 }, len[2] = { 4, 3 };
    ASSERT_EQ(MSKV_SUCCESS, tcu_rig_open(&r, 0));
    memset(&plan, 0, sizeof plan);
    plan.batch = 2; plan.total_q = 3; plan.num_page_ids = 2; plan.page_size = 4;
    plan.qo_indptr = qo; plan.kv_indptr = kvp; plan.kv_indices = ids; plan.kv_len = len; plan.slot_mapping = slots;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(r.st, &plan, MSKV_POS_NONE, &dp));
    qo[2] = 5;                                       /* past total_q */
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_plan_upload(r.st, &plan, MSKV_POS_NONE, &dp));
    qo[1] = -2147483647; qo[2] = 3;                  /* decreasing; the difference overflowed an int */
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_plan_upload(r.st, &plan, MSKV_POS_NONE, &dp));
    qo[1] = 1;
    kvp[2] = 3;                                      /* past num_page_ids */
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_plan_upload(r.st, &plan, MSKV_POS_NONE, &dp));
    kvp[2] = 2;
    len[1] = 5;                                      /* one page holds 4 */
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_plan_upload(r.st, &plan, MSKV_POS_NONE, &dp));
    len[1] = 3;
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_plan_upload(r.st, &plan, (mskv_pos_mode)7, &dp));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(r.st, &plan, MSKV_POS_NONE, &dp));
    tcu_rig_close(&r);
    TCU_EXPECT_NO_LEAKS();
}

/* An arena-built plan is checked against the store's bound arena at upload,
   and the uploaded one again by every launch that reads it: pages released
   (or aborted, offloaded, removed) after the build make it STALE_PLAN;
   tokens only added keep it valid. */
TEST(cuda_wrappers_refuse_a_plan_whose_pages_changed_since_it_was_built) {
    tcu_rig r;
    mskv_request req, other;
    mskv_segment seg;
    mskv_plan plan;
    mskv_cuda_dplan dp;
    mskv_cu_ptr buf = 0;
    ASSERT_EQ(MSKV_SUCCESS, tcu_rig_open(&r, 0));
    ASSERT_EQ(MSKV_SUCCESS, tcu_fill(&r, &req, 10));
    ASSERT_EQ(MSKV_SUCCESS, tcu_fill(&r, &other, 10));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(r.cu, 64 * 2 * 64 * 4 * 2, &buf));
    seg.request = req; seg.n_tokens = 3;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(r.a, &seg, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(r.a, 4, 64, 32, &plan));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(r.a, &seg, 1, NULL, &plan));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(r.st, &plan, MSKV_POS_NONE, &dp));
    EXPECT_EQ(MSKV_SUCCESS, mskv_cuda_write_kv(r.st, 0, &dp, buf, buf, NULL));
    /* another request losing pages changes nothing for this plan */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(r.a, other, 8, NULL));
    EXPECT_EQ(MSKV_SUCCESS, mskv_cuda_write_kv(r.st, 0, &dp, buf, buf, NULL));
    /* the plan's own reservation aborted: its last page goes */
    ASSERT_EQ(MSKV_SUCCESS, mskv_abort(r.a, &seg, 1));
    EXPECT_EQ(MSKV_ERROR_STALE_PLAN, mskv_cuda_write_kv(r.st, 0, &dp, buf, buf, NULL));
    EXPECT_EQ(MSKV_ERROR_STALE_PLAN, mskv_cuda_plan_upload(r.st, &plan, MSKV_POS_NONE, &dp));
    /* a fresh plan after growth only: valid, and stays valid while the request grows */
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(r.a, &seg, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(r.a, &seg, 1, NULL, &plan));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(r.st, &plan, MSKV_POS_NONE, &dp));
    ASSERT_EQ(MSKV_SUCCESS, mskv_commit(r.a, &seg, 1));
    seg.n_tokens = 7;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(r.a, &seg, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_commit(r.a, &seg, 1));
    EXPECT_EQ(MSKV_SUCCESS, mskv_cuda_write_kv(r.st, 0, &dp, buf, buf, NULL));
    /* released, then offloaded, then removed: stale each time */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(r.a, req, 4, NULL));
    EXPECT_EQ(MSKV_ERROR_STALE_PLAN, mskv_cuda_write_kv(r.st, 0, &dp, buf, buf, NULL));
    seg.n_tokens = 1;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(r.a, &seg, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(r.a, &seg, 1, NULL, &plan));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(r.st, &plan, MSKV_POS_NONE, &dp));
    ASSERT_EQ(MSKV_SUCCESS, mskv_commit(r.a, &seg, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(r.a, req));
    EXPECT_EQ(MSKV_ERROR_STALE_PLAN, mskv_cuda_write_kv(r.st, 0, &dp, buf, buf, NULL));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_remove(r.a, req));
    EXPECT_EQ(MSKV_ERROR_STALE_PLAN, mskv_cuda_write_kv(r.st, 0, &dp, buf, buf, NULL));
    EXPECT_TRUE(tcu_audit(r.a));
    mskv_cuda_free(r.cu, buf);
    mskv_plan_free(r.a, &plan);
    tcu_rig_close(&r);
    TCU_EXPECT_NO_LEAKS();
}

/* The uploaded plan is checked against the tables of its own layer group:
   pages leaving another group's table leave it valid, its group's make it
   STALE_PLAN. */
TEST(cuda_uploaded_plan_of_a_layer_group_goes_stale_with_that_groups_table_only) {
    tcu_rig r;
    mskv_request req;
    mskv_segment seg;
    mskv_plan plan;
    mskv_plan_desc pd;
    mskv_cuda_dplan dp;
    mskv_cu_ptr buf = 0;
    tcu_next_groups = 2;
    ASSERT_EQ(MSKV_SUCCESS, tcu_rig_open(&r, 0));
    ASSERT_EQ(MSKV_SUCCESS, tcu_fill(&r, &req, 10));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(r.cu, 64 * 2 * 64 * 4 * 2, &buf));
    seg.request = req; seg.n_tokens = 3;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(r.a, &seg, 1));
    memset(&pd, 0, sizeof pd);
    pd.group = 1;
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(r.a, 4, 64, 32, &plan));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(r.a, &seg, 1, &pd, &plan));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(r.st, &plan, MSKV_POS_NONE, &dp));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest_in_group(r.a, req, 0, 4, NULL));
    EXPECT_EQ(MSKV_SUCCESS, mskv_cuda_write_kv(r.st, 0, &dp, buf, buf, NULL));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest_in_group(r.a, req, 1, 4, NULL));
    EXPECT_EQ(MSKV_ERROR_STALE_PLAN, mskv_cuda_write_kv(r.st, 0, &dp, buf, buf, NULL));
    EXPECT_EQ(MSKV_ERROR_STALE_PLAN, mskv_cuda_plan_upload(r.st, &plan, MSKV_POS_NONE, &dp));
    EXPECT_TRUE(tcu_audit(r.a));
    mskv_cuda_free(r.cu, buf);
    mskv_plan_free(r.a, &plan);
    tcu_rig_close(&r);
    TCU_EXPECT_NO_LEAKS();
}

/* A graph replays whatever was uploaded last: a stale upload is refused. */
TEST(cuda_graph_replay_refuses_a_stale_uploaded_plan) {
    tcu_rig r;
    mskv_request req;
    mskv_segment seg;
    mskv_plan plan;
    mskv_cuda_dplan dp;
    mskv_cuda_graph *g = NULL;
    mskv_cu_ptr buf = 0;
    ASSERT_EQ(MSKV_SUCCESS, tcu_rig_open(&r, 0));
    ASSERT_EQ(MSKV_SUCCESS, tcu_fill(&r, &req, 10));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(r.cu, 64 * 2 * 64 * 4 * 2, &buf));
    seg.request = req; seg.n_tokens = 3;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(r.a, &seg, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(r.a, 4, 64, 32, &plan));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(r.a, &seg, 1, NULL, &plan));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(r.st, &plan, MSKV_POS_NONE, &dp));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_write_kv(r.st, 0, &dp, buf, buf, NULL));   /* compiles the variant first */
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_capture_begin(r.st));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_write_kv(r.st, 0, &dp, buf, buf, NULL));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_capture_end(r.st, &g));
    EXPECT_EQ(MSKV_SUCCESS, mskv_cuda_graph_launch(r.st, g));
    ASSERT_EQ(MSKV_SUCCESS, mskv_abort(r.a, &seg, 1));
    EXPECT_EQ(MSKV_ERROR_STALE_PLAN, mskv_cuda_graph_launch(r.st, g));
    mskv_cuda_graph_destroy(r.st, g);
    mskv_cuda_free(r.cu, buf);
    mskv_plan_free(r.a, &plan);
    tcu_rig_close(&r);
    TCU_EXPECT_NO_LEAKS();
}

/* The captured attention launches read q_pos and the visibility bounds as
   the plan uploaded at capture asked (plan.features): a replay whose upload
   asks for more, or lacks arrays the capture reads (the device buffers
   would hold an older plan's), needs a new capture. */
TEST(cuda_graph_replay_refuses_a_plan_whose_features_the_capture_did_not_read) {
    tcu_rig r;
    mskv_request req;
    mskv_segment seg;
    mskv_plan plan;
    mskv_cuda_dplan dp;
    mskv_cuda_graph *g = NULL;
    mskv_cu_ptr buf = 0;
    int32_t *se, *ws;
    ASSERT_EQ(MSKV_SUCCESS, tcu_rig_open(&r, 0));
    ASSERT_EQ(MSKV_SUCCESS, tcu_fill(&r, &req, 10));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(r.cu, 64 * 2 * 64 * 4 * 2, &buf));
    seg.request = req; seg.n_tokens = 3;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(r.a, &seg, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(r.a, 4, 64, 32, &plan));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(r.a, &seg, 1, NULL, &plan));
    se = plan.vis_sink_end; ws = plan.vis_window_start;
    ASSERT_TRUE(se != NULL && ws != NULL && plan.features == 0);
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(r.st, &plan, MSKV_POS_NONE, &dp));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_write_kv(r.st, 0, &dp, buf, buf, NULL));   /* compiles the variant first */
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_capture_begin(r.st));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_write_kv(r.st, 0, &dp, buf, buf, NULL));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_capture_end(r.st, &g));
    se[0] = 2; ws[0] = 5; plan.features = MSKV_PLAN_VISIBILITY;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(r.st, &plan, MSKV_POS_NONE, &dp));
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_graph_launch(r.st, g));
    EXPECT_TRUE(strstr(mskv_cuda_last_error(r.cu), "capture again") != NULL);
    se[0] = 0; ws[0] = 0; plan.features = 0;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(r.st, &plan, MSKV_POS_NONE, &dp));
    EXPECT_EQ(MSKV_SUCCESS, mskv_cuda_graph_launch(r.st, g));
    mskv_cuda_graph_destroy(r.st, g);
    /* captured with the bounds: a later plan may leave them at their defaults, not go without them */
    se[0] = 2; ws[0] = 5; plan.features = MSKV_PLAN_VISIBILITY;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(r.st, &plan, MSKV_POS_NONE, &dp));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_capture_begin(r.st));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_write_kv(r.st, 0, &dp, buf, buf, NULL));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_capture_end(r.st, &g));
    se[0] = 0; ws[0] = 0; plan.features = 0;
    plan.vis_sink_end = NULL; plan.vis_window_start = NULL;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(r.st, &plan, MSKV_POS_NONE, &dp));
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_graph_launch(r.st, g));
    plan.vis_sink_end = se; plan.vis_window_start = ws;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(r.st, &plan, MSKV_POS_NONE, &dp));
    EXPECT_EQ(MSKV_SUCCESS, mskv_cuda_graph_launch(r.st, g));
    mskv_cuda_graph_destroy(r.st, g);
    mskv_cuda_free(r.cu, buf);
    mskv_plan_free(r.a, &plan);
    tcu_rig_close(&r);
    TCU_EXPECT_NO_LEAKS();
}

/* A plan's arena is the one to check it against: a store bound to none
   cannot, and refuses an arena-built plan (a caller-made one is fine). */
TEST(cuda_unbound_store_refuses_an_arena_built_plan) {
    tcu_rig r;
    mskv_cuda_store *loose = NULL;
    mskv_cuda_store_desc sd = tcu_store_desc(0);
    mskv_request req;
    mskv_segment seg;
    mskv_plan plan;
    mskv_cuda_dplan dp;
    ASSERT_EQ(MSKV_SUCCESS, tcu_rig_open(&r, 0));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_store_create(r.cu, &sd, &loose));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(r.a, &req));
    seg.request = req; seg.n_tokens = 3;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(r.a, &seg, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(r.a, 4, 64, 32, &plan));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(r.a, &seg, 1, NULL, &plan));
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_cuda_plan_upload(loose, &plan, MSKV_POS_NONE, &dp));
    plan.generation = 0;
    EXPECT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(loose, &plan, MSKV_POS_NONE, &dp));
    mskv_plan_free(r.a, &plan);
    mskv_cuda_store_destroy(loose);
    tcu_rig_close(&r);
    TCU_EXPECT_NO_LEAKS();
}

/* The attention wrapper checks the host plan it is given and the uploaded
   plan the kernel reads (a bf16 store: attention runs on tensor cores). */
TEST(cuda_attention_refuses_a_stale_host_plan_or_a_stale_upload) {
    tcu_rig r;
    mskv_cuda_store *st = NULL;
    mskv_cuda_store_desc sd = tcu_store_desc(0);
    mskv_arena_desc ad;
    mskv_arena *a = NULL;
    mskv_request req, other;
    mskv_segment seg, so;
    mskv_plan plan, fresh;
    mskv_cuda_dplan dp, dfresh;
    mskv_attn at;
    ASSERT_EQ(MSKV_SUCCESS, tcu_rig_open(&r, 0));
    sd.dtype = MSKV_DTYPE_BF16;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_store_create(r.cu, &sd, &st));
    memset(&ad, 0, sizeof ad);
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_store_arena_desc(st, &ad));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&ad, &a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_store_bind(st, a));
    memset(&at, 0, sizeof at);
    at.q_heads = 2; at.q_dtype = MSKV_DTYPE_BF16;
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &req));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &other));
    seg.request = req; seg.n_tokens = 6;
    so.request = other; so.n_tokens = 6;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &seg, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &so, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(a, 4, 64, 32, &plan));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(a, 4, 64, 32, &fresh));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, &seg, 1, NULL, &plan));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(st, &plan, MSKV_POS_NONE, &dp));
    ASSERT_EQ(MSKV_SUCCESS, mskv_abort(a, &seg, 1));
    /* the host plan is stale */
    EXPECT_EQ(MSKV_ERROR_STALE_PLAN, mskv_cuda_attention(st, 0, &plan, &dp, &at, 16, 16, 0));
    /* a fresh host plan of the same shape (another request), over the stale upload */
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, &so, 1, NULL, &fresh));
    EXPECT_EQ(MSKV_SUCCESS, mskv_plan_check(a, &fresh));
    EXPECT_EQ(MSKV_ERROR_STALE_PLAN, mskv_cuda_attention(st, 0, &fresh, &dp, &at, 16, 16, 0));
    /* uploaded, it passes the checks (whether the mock driver then has an attention kernel is another matter) */
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_plan_upload(st, &fresh, MSKV_POS_NONE, &dfresh));
    EXPECT_NE(MSKV_ERROR_STALE_PLAN, mskv_cuda_attention(st, 0, &fresh, &dfresh, &at, 16, 16, 0));
    mskv_plan_free(a, &plan);
    mskv_plan_free(a, &fresh);
    mskv_arena_destroy(a);
    mskv_cuda_store_destroy(st);
    tcu_rig_close(&r);
    TCU_EXPECT_NO_LEAKS();
}

/* ---- debug mode on the device store ---- */

/* every byte of device page p, every layer and kind, equals v */
static int tcu_device_page_is(tcu_rig *r, int32_t p, unsigned char v) {
    int l, kind;
    size_t k, pb = (size_t)4 * 2 * 64 * 4;
    for (l = 0; l < 2; l++)
        for (kind = 0; kind < 2; kind++) {
            const unsigned char *b = (const unsigned char *)(uintptr_t)mskv_cuda_store_pool(r->st, l, kind) + (size_t)p * pb;
            for (k = 0; k < pb; k++)
                if (b[k] != v) return 0;
        }
    return 1;
}

/* Freed device pages are poisoned by the store's fill (memsets on its
   stream) once their fence retired, and the byte audit reads them back
   through the store: a write into one is caught. */
TEST(cuda_freed_device_pages_are_poisoned_after_their_fence_and_a_write_into_one_is_caught) {
    tcu_rig r;
    mskv_request req;
    int32_t pages[8], n = 0;
    char why[256];
    tcu_next_debug = MSKV_DEBUG_ALL;
    ASSERT_EQ(MSKV_SUCCESS, tcu_rig_open(&r, 0));
    EXPECT_TRUE(tcu_device_page_is(&r, 20, MSKV_POISON_BYTE));   /* free since creation */
    EXPECT_TRUE(tcu_device_page_is(&r, 0, 0));                   /* the null page */
    ASSERT_EQ(MSKV_SUCCESS, tcu_fill(&r, &req, 18));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_pages(r.a, req, pages, 8, &n));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(r.a, req, 8, NULL));
    EXPECT_FALSE(tcu_device_page_is(&r, pages[0], MSKV_POISON_BYTE));   /* pending: kernels may still read it */
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_publish(r.st, NULL, 0, NULL));     /* the fence completes and retires */
    EXPECT_TRUE(tcu_device_page_is(&r, pages[0], MSKV_POISON_BYTE));
    EXPECT_TRUE(tcu_device_page_is(&r, pages[1], MSKV_POISON_BYTE));
    EXPECT_EQ(MSKV_SUCCESS, mskv_arena_audit_bytes(r.a, why, sizeof why));
    ((unsigned char *)(uintptr_t)mskv_cuda_store_pool(r.st, 1, 1))[(size_t)pages[1] * 2048 + 5] = 0;   /* a stray write */
    why[0] = 0;
    EXPECT_EQ(MSKV_ERROR_AUDIT_FAILED, mskv_arena_audit_bytes(r.a, why, sizeof why));
    EXPECT_TRUE(strstr(why, "written after it was freed") != NULL);
    tcu_rig_close(&r);
    TCU_EXPECT_NO_LEAKS();
}

/* The pinned host copy of an offloaded request carries a checksum per page:
   a changed byte makes reload refuse it and change nothing. */
TEST(cuda_corrupted_pinned_host_copy_is_refused_at_reload) {
    tcu_rig r;
    mskv_request req;
    unsigned char *copy;
    uint64_t before;
    tcu_next_debug = MSKV_DEBUG_CHECKSUMS;
    ASSERT_EQ(MSKV_SUCCESS, tcu_rig_open(&r, 0));
    ASSERT_EQ(MSKV_SUCCESS, tcu_fill(&r, &req, 18));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(r.a, req));
    copy = tcm.last_host + 16;   /* the pinned allocator keeps its size in front */
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_publish(r.st, NULL, 0, NULL));
    copy[8192 * 3 + 100] ^= 0x40;
    before = mskv_arena_digest(r.a);
    EXPECT_EQ(MSKV_ERROR_HOST_COPY_CORRUPT, mskv_request_reload(r.a, req));
    EXPECT_EQ_U64(before, mskv_arena_digest(r.a));
    copy[8192 * 3 + 100] ^= 0x40;
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(r.a, req));
    EXPECT_TRUE(tcu_bytes_ok(&r, req, 18));
    EXPECT_TRUE(tcu_audit(r.a));
    tcu_rig_close(&r);
    TCU_EXPECT_NO_LEAKS();
}

/* ---- head shards: one arena over two mock devices ------------------------------------ */

/* The rig's geometry (2 KV heads) split over two devices, one head each:
   device s holds global head s. */
typedef struct tsh_rig {
    mskv_cuda_functions fn;
    mskv_cuda *cu[2];
    mskv_cuda_shards *sh;
    mskv_arena *a;
} tsh_rig;

static mskv_result tsh_open(tsh_rig *r, size_t staging) {
    mskv_cuda_shard_desc d;
    mskv_cuda_desc cd;
    mskv_arena_desc ad;
    mskv_result e;
    int s;
    memset(r, 0, sizeof *r);
    tcm_reset();
    tcm.devices = 2;
    tcu_live_allocs = 0;
    r->fn = tcm_table();
    memset(&cd, 0, sizeof cd);
    cd.functions = &r->fn;
    cd.selftest = MSKV_CUDA_SELFTEST_OFF;   /* the mock launches kernels without running them */
    cd.disable_disk_cache = 1;
    cd.allocator = tcu_allocator();
    cd.log = tcu_log;
    for (s = 0; s < 2; s++) {
        cd.device = s;
        if ((e = mskv_cuda_create(&cd, &r->cu[s])) != MSKV_SUCCESS) return e;
    }
    memset(&d, 0, sizeof d);
    d.num_shards = 2;
    d.devices = r->cu;
    d.store = tcu_store_desc(staging);
    if ((e = mskv_cuda_shards_create(&d, &r->sh)) != MSKV_SUCCESS) return e;
    memset(&ad, 0, sizeof ad);
    ad.allocator = tcu_allocator();
    if ((e = mskv_cuda_shards_arena_desc(r->sh, &ad)) != MSKV_SUCCESS) return e;
    ad.debug = tcu_next_debug;
    tcu_next_debug = 0;
    if ((e = mskv_arena_create(&ad, &r->a)) != MSKV_SUCCESS) return e;
    return mskv_cuda_shards_bind(r->sh, r->a);
}

static void tsh_close(tsh_rig *r) {
    if (r->a) mskv_arena_destroy(r->a);
    if (r->sh) mskv_cuda_shards_destroy(r->sh);
    if (r->cu[0]) mskv_cuda_destroy(r->cu[0]);
    if (r->cu[1]) mskv_cuda_destroy(r->cu[1]);
    memset(r, 0, sizeof *r);
}

/* tcu_fill through the shards: one plan on both devices, each device's
   write_kv with its own head's slice of k and v. */
static mskv_result tsh_fill(tsh_rig *r, mskv_request *req, int64_t n) {
    mskv_segment seg;
    mskv_plan plan;
    mskv_plan_desc pd;
    mskv_cuda_dplan dp[2];
    mskv_result e;
    size_t bytes = (size_t)n * 64 * sizeof(float);
    float *k = (float *)malloc(bytes), *v = (float *)malloc(bytes);
    int64_t t;
    int l, s, d;
    if ((e = mskv_request_add(r->a, req)) != MSKV_SUCCESS) return e;
    seg.request = *req;
    seg.n_tokens = n;
    if ((e = mskv_admit(r->a, &seg, 1)) != MSKV_SUCCESS) return e;
    memset(&pd, 0, sizeof pd);
    memset(&plan, 0, sizeof plan);
    if ((e = mskv_plan_alloc(r->a, 4, 64, 32, &plan)) != MSKV_SUCCESS) return e;
    e = mskv_plan_build(r->a, &seg, 1, &pd, &plan);
    if (e == MSKV_SUCCESS) e = mskv_cuda_shards_plan_upload(r->sh, &plan, MSKV_POS_NONE, dp);
    for (s = 0; s < 2 && e == MSKV_SUCCESS; s++) {
        mskv_cuda_store *st = mskv_cuda_shards_store(r->sh, s);
        mskv_cu_ptr dk = 0, dv = 0;
        e = mskv_cuda_malloc(r->cu[s], bytes, &dk);
        if (e == MSKV_SUCCESS) e = mskv_cuda_malloc(r->cu[s], bytes, &dv);
        for (l = 0; l < 2 && e == MSKV_SUCCESS; l++) {
            for (t = 0; t < n; t++)
                for (d = 0; d < 64; d++) {
                    k[t * 64 + d] = tcu_value(t, l, 0, s, d);
                    v[t * 64 + d] = tcu_value(t, l, 1, s, d);
                }
            e = mskv_cuda_upload(st, dk, k, bytes);
            if (e == MSKV_SUCCESS) e = mskv_cuda_upload(st, dv, v, bytes);
            if (e == MSKV_SUCCESS) e = mskv_cuda_shards_write_kv(r->sh, s, l, &dp[s], dk, dv, NULL);
        }
        mskv_cuda_free(r->cu[s], dk);
        mskv_cuda_free(r->cu[s], dv);
    }
    free(k);
    free(v);
    mskv_plan_free(r->a, &plan);
    if (e != MSKV_SUCCESS) return e;
    if ((e = mskv_commit(r->a, &seg, 1)) != MSKV_SUCCESS) return e;
    return mskv_cuda_shards_publish(r->sh, &seg, 1, NULL);
}

/* Every token of a resident request holds tcu_value on both devices, each
   device its own head. */
static int tsh_bytes_ok(tsh_rig *r, mskv_request req, int64_t n) {
    int64_t t, slot;
    int s, l, kind, d, bad = 0;
    for (t = 0; t < n; t++) {
        if (mskv_request_slot(r->a, req, t, &slot) != MSKV_SUCCESS) return 0;
        for (s = 0; s < 2; s++)
            for (l = 0; l < 2; l++)
                for (kind = 0; kind < 2; kind++) {
                    const float *pool = (const float *)(uintptr_t)mskv_cuda_store_pool(mskv_cuda_shards_store(r->sh, s), l, kind);
                    for (d = 0; d < 64; d++)
                        if (pool[slot * 64 + d] != tcu_value(t, l, kind, s, d)) bad++;
                }
    }
    return bad == 0;
}

static void tsh_scribble(tsh_rig *r) {
    int s, l, kind;
    for (s = 0; s < 2; s++)
        for (l = 0; l < 2; l++)
            for (kind = 0; kind < 2; kind++)
                memset((void *)(uintptr_t)mskv_cuda_store_pool(mskv_cuda_shards_store(r->sh, s), l, kind), 0xAB,
                       (size_t)24 * 4 * 64 * 4);
}

TEST(cuda_shards_put_each_devices_heads_on_that_device) {
    tsh_rig r;
    mskv_request req;
    ASSERT_EQ(MSKV_SUCCESS, tsh_open(&r, 0));
    EXPECT_EQ(2, mskv_cuda_shards_count(r.sh));
    EXPECT_TRUE(mskv_cuda_shards_store(r.sh, 2) == NULL);
    ASSERT_EQ(MSKV_SUCCESS, tsh_fill(&r, &req, 18));
    EXPECT_TRUE(tsh_bytes_ok(&r, req, 18));
    EXPECT_TRUE(tcu_audit(r.a));
    tsh_close(&r);
    TCU_EXPECT_NO_LEAKS();
}

TEST(cuda_shards_offload_and_reload_round_trip_restores_every_devices_bytes) {
    tsh_rig r;
    mskv_request req;
    mskv_request_info info;
    ASSERT_EQ(MSKV_SUCCESS, tsh_open(&r, 3000));   /* 2 pages per staging chunk: 3 rounds */
    ASSERT_EQ(MSKV_SUCCESS, tsh_fill(&r, &req, 18));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(r.a, req));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_info_get(r.a, req, &info));
    EXPECT_EQ(MSKV_OFFLOADED, info.location);
    tsh_scribble(&r);   /* the reload must really copy, on both devices */
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_shards_publish(r.sh, NULL, 0, NULL));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(r.a, req));
    EXPECT_TRUE(tsh_bytes_ok(&r, req, 18));
    EXPECT_TRUE(tcu_audit(r.a));
    tsh_close(&r);
    TCU_EXPECT_NO_LEAKS();
}

/* The host copy keeps the arena's layout with every head, so an export from
   two devices is byte for byte the export of the same request on one, and
   each imports into the other. */
TEST(cuda_shards_export_equals_the_unsharded_export_and_imports_either_way) {
    tsh_rig r;
    tcu_rig u;
    mskv_request a, b, back, there;
    size_t na = 0, nb = 0, cap = (size_t)1 << 20;
    unsigned char *ba = (unsigned char *)malloc(cap), *bb = (unsigned char *)malloc(cap);
    ASSERT_EQ(MSKV_SUCCESS, tcu_rig_open(&u, 0));
    ASSERT_EQ(MSKV_SUCCESS, tcu_fill(&u, &b, 18));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_export(u.a, b, bb, cap, &nb));
    tcu_rig_close(&u);
    ASSERT_EQ(MSKV_SUCCESS, tsh_open(&r, 3000));
    ASSERT_EQ(MSKV_SUCCESS, tsh_fill(&r, &a, 18));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_export(r.a, a, ba, cap, &na));
    ASSERT_EQ((long long)nb, (long long)na);
    EXPECT_EQ(0, memcmp(ba, bb, na));
    /* the unsharded blob into the sharded arena: both devices get their heads */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_import(r.a, bb, nb, &back));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(r.a, back));
    EXPECT_TRUE(tsh_bytes_ok(&r, back, 18));
    EXPECT_TRUE(tcu_audit(r.a));
    tsh_close(&r);
    /* and the sharded blob into an unsharded arena */
    ASSERT_EQ(MSKV_SUCCESS, tcu_rig_open(&u, 0));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_import(u.a, ba, na, &there));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(u.a, there));
    EXPECT_TRUE(tcu_bytes_ok(&u, there, 18));
    EXPECT_TRUE(tcu_audit(u.a));
    tcu_rig_close(&u);
    free(ba);
    free(bb);
    TCU_EXPECT_NO_LEAKS();
}

/* A copy failing on device 1 of 2 in the middle of an offload: the request
   stays resident with every device's bytes, nothing moved in the arena, and
   the next offload works. */
TEST(cuda_shards_copy_failing_on_one_device_mid_offload_changes_nothing_anywhere) {
    tsh_rig r;
    mskv_request req;
    mskv_request_info info;
    mskv_arena_stats s0, s1;
    uint64_t before;
    ASSERT_EQ(MSKV_SUCCESS, tsh_open(&r, 3000));   /* 2 pages a round: the failure is in round 2 of 3 */
    ASSERT_EQ(MSKV_SUCCESS, tsh_fill(&r, &req, 18));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(r.a, &s0));
    before = mskv_arena_digest(r.a);
    tcm.dtohs = 0;
    tcm.fail_device = 2;
    tcm.fail_dtoh_at = 2;
    EXPECT_EQ(MSKV_ERROR_CUDA, mskv_request_offload(r.a, req));
    EXPECT_EQ(2, tcm.dtohs);   /* it did fail on device 1, in the second round */
    tcm.fail_dtoh_at = 0;
    tcm.fail_device = 0;
    EXPECT_EQ_U64(before, mskv_arena_digest(r.a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_info_get(r.a, req, &info));
    EXPECT_EQ(MSKV_RESIDENT, info.location);
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(r.a, &s1));
    EXPECT_EQ(s0.free_pages, s1.free_pages);
    EXPECT_EQ(s0.live_pages, s1.live_pages);
    EXPECT_TRUE(tsh_bytes_ok(&r, req, 18));
    EXPECT_TRUE(tcu_audit(r.a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(r.a, req));
    tsh_scribble(&r);
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_shards_publish(r.sh, NULL, 0, NULL));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(r.a, req));
    EXPECT_TRUE(tsh_bytes_ok(&r, req, 18));
    tsh_close(&r);
    TCU_EXPECT_NO_LEAKS();
}

/* The same for the way back: a reload whose copy fails on device 1 leaves
   the request offloaded with its host copy, and a retry restores it. */
TEST(cuda_shards_copy_failing_on_one_device_mid_reload_keeps_the_request_offloaded) {
    tsh_rig r;
    mskv_request req;
    mskv_request_info info;
    ASSERT_EQ(MSKV_SUCCESS, tsh_open(&r, 3000));
    ASSERT_EQ(MSKV_SUCCESS, tsh_fill(&r, &req, 18));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(r.a, req));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_shards_publish(r.sh, NULL, 0, NULL));
    tsh_scribble(&r);
    tcm.htods = 0;
    tcm.fail_device = 2;
    tcm.fail_htod_at = 4;   /* round 2's staging copy on device 1 (ids, then staging, per round) */
    EXPECT_EQ(MSKV_ERROR_CUDA, mskv_request_reload(r.a, req));
    tcm.fail_htod_at = 0;
    tcm.fail_device = 0;
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_info_get(r.a, req, &info));
    EXPECT_EQ(MSKV_OFFLOADED, info.location);
    EXPECT_TRUE(tcu_audit(r.a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_shards_publish(r.sh, NULL, 0, NULL));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(r.a, req));
    EXPECT_TRUE(tsh_bytes_ok(&r, req, 18));
    EXPECT_TRUE(tcu_audit(r.a));
    tsh_close(&r);
    TCU_EXPECT_NO_LEAKS();
}

/* Pages freed in a step come back only when both devices finished it: the
   second device's event held not ready keeps them pending. */
TEST(cuda_shards_fence_retires_only_after_every_devices_event_completed) {
    tsh_rig r;
    mskv_request req;
    mskv_arena_stats s;
    uint64_t step = 0;
    ASSERT_EQ(MSKV_SUCCESS, tsh_open(&r, 0));
    ASSERT_EQ(MSKV_SUCCESS, tsh_fill(&r, &req, 12));
    tcm.busy_device = 2;                    /* device 1 still runs the step */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_remove(r.a, req));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_shards_publish(r.sh, NULL, 0, &step));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(r.a, &s));
    EXPECT_EQ(3, s.pending_pages);
    EXPECT_EQ(MSKV_SUCCESS, mskv_cuda_shards_retire(r.sh, 0));
    EXPECT_EQ(MSKV_SUCCESS, mskv_cuda_retire(mskv_cuda_shards_store(r.sh, 0), 0));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(r.a, &s));
    EXPECT_EQ(3, s.pending_pages);          /* device 0 alone is not enough */
    tcm.busy_device = 0;
    EXPECT_EQ(MSKV_SUCCESS, mskv_cuda_shards_retire(r.sh, 0));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(r.a, &s));
    EXPECT_EQ(0, s.pending_pages);
    EXPECT_EQ_U64(step, s.completed_step);
    EXPECT_TRUE(tcu_audit(r.a));
    tsh_close(&r);
    TCU_EXPECT_NO_LEAKS();
}

/* An upload that failed on one device leaves no device launching: the
   other devices hold the new plan, the failed one the old. */
TEST(cuda_shards_launch_nothing_after_a_plan_upload_failed_on_one_device) {
    tsh_rig r;
    mskv_request req;
    mskv_segment seg;
    mskv_plan plan;
    mskv_plan_desc pd;
    mskv_cuda_dplan dp[2];
    ASSERT_EQ(MSKV_SUCCESS, tsh_open(&r, 0));
    ASSERT_EQ(MSKV_SUCCESS, tsh_fill(&r, &req, 8));
    seg.request = req; seg.n_tokens = 4;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(r.a, &seg, 1));
    memset(&pd, 0, sizeof pd);
    memset(&plan, 0, sizeof plan);
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(r.a, 4, 64, 32, &plan));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(r.a, &seg, 1, &pd, &plan));
    tcm.htods = 0;
    tcm.fail_device = 2;
    tcm.fail_htod_at = 1;
    EXPECT_EQ(MSKV_ERROR_CUDA, mskv_cuda_shards_plan_upload(r.sh, &plan, MSKV_POS_NONE, dp));
    tcm.fail_htod_at = 0;
    tcm.fail_device = 0;
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_cuda_shards_write_kv(r.sh, 0, 0, &dp[0], 16, 16, NULL));
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_cuda_shards_write_kv(r.sh, 1, 0, &dp[1], 16, 16, NULL));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_shards_plan_upload(r.sh, &plan, MSKV_POS_NONE, dp));
    EXPECT_EQ(MSKV_ERROR_OUT_OF_RANGE, mskv_cuda_shards_write_kv(r.sh, 2, 0, &dp[0], 16, 16, NULL));
    mskv_plan_free(r.a, &plan);
    tsh_close(&r);
    TCU_EXPECT_NO_LEAKS();
}

/* A plan whose pages changed since it was built is refused on every device,
   as on one. */
TEST(cuda_shards_refuse_a_stale_plan_on_every_device) {
    tsh_rig r;
    mskv_request req;
    mskv_segment seg;
    mskv_plan plan;
    mskv_cuda_dplan dp[2];
    mskv_cu_ptr buf[2] = { 0, 0 };
    int s;
    ASSERT_EQ(MSKV_SUCCESS, tsh_open(&r, 0));
    ASSERT_EQ(MSKV_SUCCESS, tsh_fill(&r, &req, 10));
    for (s = 0; s < 2; s++) ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_malloc(r.cu[s], 64 * 64 * 4, &buf[s]));
    seg.request = req; seg.n_tokens = 3;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(r.a, &seg, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(r.a, 4, 64, 32, &plan));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(r.a, &seg, 1, NULL, &plan));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_shards_plan_upload(r.sh, &plan, MSKV_POS_NONE, dp));
    for (s = 0; s < 2; s++) EXPECT_EQ(MSKV_SUCCESS, mskv_cuda_shards_write_kv(r.sh, s, 0, &dp[s], buf[s], buf[s], NULL));
    ASSERT_EQ(MSKV_SUCCESS, mskv_abort(r.a, &seg, 1));   /* its last page goes */
    for (s = 0; s < 2; s++) EXPECT_EQ(MSKV_ERROR_STALE_PLAN, mskv_cuda_shards_write_kv(r.sh, s, 0, &dp[s], buf[s], buf[s], NULL));
    EXPECT_EQ(MSKV_ERROR_STALE_PLAN, mskv_cuda_shards_plan_upload(r.sh, &plan, MSKV_POS_NONE, dp));
    for (s = 0; s < 2; s++) mskv_cuda_free(r.cu[s], buf[s]);
    mskv_plan_free(r.a, &plan);
    tsh_close(&r);
    TCU_EXPECT_NO_LEAKS();
}

/* With MSKV_DEBUG_POISON a page that becomes free is poisoned on every
   device, and a write into it on either device is caught. */
TEST(cuda_shards_poison_freed_pages_on_every_device) {
    tsh_rig r;
    mskv_request req;
    int64_t slot;
    char why[256] = "";
    int s;
    tcu_next_debug = MSKV_DEBUG_POISON;
    ASSERT_EQ(MSKV_SUCCESS, tsh_open(&r, 0));
    ASSERT_EQ(MSKV_SUCCESS, tsh_fill(&r, &req, 8));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_slot(r.a, req, 0, &slot));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_remove(r.a, req));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_shards_publish(r.sh, NULL, 0, NULL));
    for (s = 0; s < 2; s++) {
        const unsigned char *k = (const unsigned char *)(uintptr_t)mskv_cuda_store_pool(mskv_cuda_shards_store(r.sh, s), 1, 1);
        EXPECT_EQ(MSKV_POISON_BYTE, k[slot * 64 * 4 + 5]);
    }
    EXPECT_EQ(MSKV_SUCCESS, mskv_arena_audit_bytes(r.a, why, sizeof why));
    ((unsigned char *)(uintptr_t)mskv_cuda_store_pool(mskv_cuda_shards_store(r.sh, 1), 0, 0))[slot * 64 * 4] = 0;
    EXPECT_EQ(MSKV_ERROR_AUDIT_FAILED, mskv_arena_audit_bytes(r.a, why, sizeof why));
    tsh_close(&r);
    TCU_EXPECT_NO_LEAKS();
}

TEST(cuda_shards_refuse_heads_that_do_not_divide_and_a_shard_alone) {
    tsh_rig r;
    mskv_cuda_shard_desc d;
    mskv_cuda_shards *sh = NULL;
    mskv_attn at;
    mskv_cuda_dplan dp[2];
    mskv_plan plan;
    ASSERT_EQ(MSKV_SUCCESS, tsh_open(&r, 0));
    memset(&d, 0, sizeof d);
    d.num_shards = 2;
    d.devices = r.cu;
    d.store = tcu_store_desc(0);
    d.store.kv_heads = 3;   /* a GQA group would straddle the devices */
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_shards_create(&d, &sh));
    d.store.kv_heads = 2;
    d.num_shards = 0;
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_shards_create(&d, &sh));
    d.num_shards = MSKV_CUDA_MAX_SHARDS + 1;
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_shards_create(&d, &sh));
    EXPECT_TRUE(sh == NULL);
    /* q heads too: each device gets whole groups */
    memset(&plan, 0, sizeof plan);
    memset(&at, 0, sizeof at);
    ASSERT_EQ(MSKV_SUCCESS, mskv_cuda_shards_plan_upload(r.sh, &plan, MSKV_POS_NONE, dp));
    at.q_heads = 3;
    at.q_dtype = MSKV_DTYPE_F32;
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cuda_shards_attention(r.sh, 0, 0, &plan, &dp[0], &at, 16, 16, 0));
    /* a shard's store is not an arena's store of its own */
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_cuda_store_bind(mskv_cuda_shards_store(r.sh, 0), r.a));
    EXPECT_EQ(MSKV_ERROR_BAD_STATE, mskv_cuda_publish(mskv_cuda_shards_store(r.sh, 1), NULL, 0, NULL));
    tsh_close(&r);
    TCU_EXPECT_NO_LEAKS();
}

/* A device whose fence event cannot be recorded is waited for instead; the
   step's pages still wait for the other device's event. */
TEST(cuda_shards_publish_without_an_event_on_one_device_waits_for_it_and_the_others_events) {
    tsh_rig r;
    mskv_request req;
    mskv_arena_stats s;
    uint64_t step = 0;
    int syncs;
    ASSERT_EQ(MSKV_SUCCESS, tsh_open(&r, 0));
    ASSERT_EQ(MSKV_SUCCESS, tsh_fill(&r, &req, 12));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_remove(r.a, req));
    tcm.busy_device = 1;                    /* device 0 still runs the step */
    tcm.fail_device = 2;
    tcm.fail_record = 1;                    /* device 1 gets no event */
    syncs = tcm.stream_syncs;
    EXPECT_EQ(MSKV_ERROR_CUDA, mskv_cuda_shards_publish(r.sh, NULL, 0, &step));
    tcm.fail_record = 0;
    tcm.fail_device = 0;
    EXPECT_EQ(syncs + 1, tcm.stream_syncs);   /* device 1's stream was waited for */
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(r.a, &s));
    EXPECT_EQ(3, s.pending_pages);
    tcm.busy_device = 0;
    EXPECT_EQ(MSKV_SUCCESS, mskv_cuda_shards_retire(r.sh, 0));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(r.a, &s));
    EXPECT_EQ(0, s.pending_pages);
    EXPECT_EQ_U64(step, s.completed_step);
    EXPECT_TRUE(tcu_audit(r.a));
    tsh_close(&r);
    TCU_EXPECT_NO_LEAKS();
}

/* The pages live behind store ops: streamed export is refused, the whole
   blob (mskv_request_export) is the way out. */
TEST(cuda_shards_arena_refuses_streamed_export_and_exports_whole_blobs) {
    tsh_rig r;
    mskv_request req;
    unsigned char hdr[4096], blob[65536];
    size_t n = 0;
    mskv_blob_layout lay;
    ASSERT_EQ(MSKV_SUCCESS, tsh_open(&r, 0));
    ASSERT_EQ(MSKV_SUCCESS, tsh_fill(&r, &req, 6));
    EXPECT_EQ(MSKV_ERROR_UNSUPPORTED, mskv_request_export_begin(r.a, req, hdr, sizeof hdr, &lay));
    EXPECT_EQ(MSKV_SUCCESS, mskv_request_export(r.a, req, blob, sizeof blob, &n));
    EXPECT_TRUE(tcu_audit(r.a));
    tsh_close(&r);
    TCU_EXPECT_NO_LEAKS();
}
