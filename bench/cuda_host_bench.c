/* cuda_host_bench - the host CPU that mstar_kv_cuda.h's launch wrappers add
   to each call, with every driver and NVRTC function stubbed out (a stub
   returns at once; kernels are "compiled" into a fake image on first use),
   so what is timed is the wrapper alone: checks, variant lookup, geometry,
   argument marshalling. A real launch costs the driver a few microseconds
   more.

     attention   mskv_cuda_attention: decode 1 x 512 keys, decode 64 x 4096,
                 a video chunk 4680 x 32760 (bf16, head_dim 128, 32 q heads,
                 8 kv heads, pages of 16, causal), once with each kernel
                 forced (mma.sync: mskv_attn; wgmma: mskv_attn_sm90, as the
                 stubbed compute capability 9.0 device runs the chunk)
     write_kv    mskv_cuda_write_kv: one decode token; a 4680-token chunk
                 with 3-D RoPE
     graph       mskv_cuda_graph_launch of a captured step (write_kv +
                 decode attention)
     dense       mskv_cuda_attention_dense: the chunk's 4680 queries over a
                 1560-token prefix view (wgmma), the view's two layers in
                 turn, as a model's layer loop calls it

   Each line: ns per call (thread CPU time, best of 5 runs: the machine may
   be shared; wall time beside it), kernel launches per call, driver calls
   per call, heap allocations per call (through the context's allocator),
   and the target.

   Build and run:  make bench   (or: cc -std=c99 -O3 -march=native bench/cuda_host_bench.c -ldl -lpthread -lm)
   Options:        --calls N  calls per run (default 20000)
                   --runs N   runs per case (default 5)
                   --only S   only the cases whose name contains S
   For instruction counts (deterministic on a busy machine):
     valgrind --tool=callgrind --toggle-collect=chb_loop ./build/cuda_host_bench --runs 1 --calls 1000 --only NAME
   and divide the collected Ir by the calls. */
#define _POSIX_C_SOURCE 200809L  /* clock_gettime under -std=c99 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define MSTAR_KV_IMPLEMENTATION
#include "../mstar_kv.h"
#define MSTAR_KV_CUDA_IMPLEMENTATION
#include "../mstar_kv_cuda.h"

#if defined(__GNUC__)
#define CHB_NOINLINE __attribute__((noinline))
#else
#define CHB_NOINLINE
#endif

/* ---- the stubbed driver ------------------------------------------------------
   Device addresses come from a bump counter (nothing is ever dereferenced);
   pinned host memory is real (plan uploads write into it). */

static struct {
    long calls;          /* every driver / NVRTC call */
    long launches;       /* cuLaunchKernel */
    long allocs;         /* the context's allocator */
    mskv_cu_ptr next;    /* bump "device memory" */
    int capturing;
} chb;

static mskv_cu_result chb_cuInit(unsigned int f) { (void)f; chb.calls++; return 0; }
static mskv_cu_result chb_cuDriverGetVersion(int *v) { chb.calls++; *v = 13000; return 0; }
static mskv_cu_result chb_cuGetErrorString(mskv_cu_result e, const char **s) { (void)e; chb.calls++; *s = "stub"; return 0; }
static mskv_cu_result chb_cuDeviceGetCount(int *n) { chb.calls++; *n = 1; return 0; }
static mskv_cu_result chb_cuDeviceGet(mskv_cu_device *d, int i) { chb.calls++; *d = i; return 0; }
static mskv_cu_result chb_cuDeviceGetAttribute(int *v, int a, mskv_cu_device d) {
    (void)d;
    chb.calls++;
    *v = a == MSKV_CU_ATTR_CC_MAJOR ? 9 : a == MSKV_CU_ATTR_MULTIPROCESSOR_COUNT ? 132 :
         a == MSKV_CU_ATTR_MAX_SMEM_OPTIN ? 227 * 1024 : 0;
    return 0;
}
static mskv_cu_result chb_cuDeviceGetName(char *name, int len, mskv_cu_device d) {
    (void)d; chb.calls++; snprintf(name, (size_t)len, "stubbed driver"); return 0;
}
static mskv_cu_result chb_cuDevicePrimaryCtxRetain(mskv_cu_context *c, mskv_cu_device d) {
    (void)d; chb.calls++; *c = (mskv_cu_context)(void *)&chb; return 0;
}
static mskv_cu_result chb_cuDevicePrimaryCtxRelease(mskv_cu_device d) { (void)d; chb.calls++; return 0; }
static mskv_cu_result chb_cuCtxSetCurrent(mskv_cu_context c) { (void)c; chb.calls++; return 0; }
static mskv_cu_result chb_cuMemAlloc(mskv_cu_ptr *p, size_t n) {
    chb.calls++;
    if (!chb.next) chb.next = (mskv_cu_ptr)1 << 40;
    *p = chb.next;
    chb.next += (n + 255) & ~(mskv_cu_ptr)255;
    return 0;
}
static mskv_cu_result chb_cuMemFree(mskv_cu_ptr p) { (void)p; chb.calls++; return 0; }
static mskv_cu_result chb_cuMemAllocHost(void **p, size_t n) { chb.calls++; *p = calloc(1, n ? n : 1); return *p ? 0 : 2; }
static mskv_cu_result chb_cuMemFreeHost(void *p) { chb.calls++; free(p); return 0; }
static mskv_cu_result chb_cuMemcpyHtoDAsync(mskv_cu_ptr d, const void *s, size_t n, mskv_cu_stream st) {
    (void)d; (void)s; (void)n; (void)st; chb.calls++; return 0;
}
static mskv_cu_result chb_cuMemcpyDtoHAsync(void *d, mskv_cu_ptr s, size_t n, mskv_cu_stream st) {
    (void)d; (void)s; (void)n; (void)st; chb.calls++; return 0;
}
static mskv_cu_result chb_cuMemcpyDtoDAsync(mskv_cu_ptr d, mskv_cu_ptr s, size_t n, mskv_cu_stream st) {
    (void)d; (void)s; (void)n; (void)st; chb.calls++; return 0;
}
static mskv_cu_result chb_cuMemsetD8Async(mskv_cu_ptr d, unsigned char v, size_t n, mskv_cu_stream st) {
    (void)d; (void)v; (void)n; (void)st; chb.calls++; return 0;
}
static int chb_handle;   /* the address of something: a non-null handle */
static mskv_cu_result chb_cuStreamCreate(mskv_cu_stream *s, unsigned int f) { (void)f; chb.calls++; *s = (mskv_cu_stream)(void *)&chb_handle; return 0; }
static mskv_cu_result chb_cuStreamDestroy(mskv_cu_stream s) { (void)s; chb.calls++; return 0; }
static mskv_cu_result chb_cuStreamSynchronize(mskv_cu_stream s) { (void)s; chb.calls++; return 0; }
static mskv_cu_result chb_cuEventCreate(mskv_cu_event *e, unsigned int f) { (void)f; chb.calls++; *e = (mskv_cu_event)(void *)&chb_handle; return 0; }
static mskv_cu_result chb_cuEventRecord(mskv_cu_event e, mskv_cu_stream s) { (void)e; (void)s; chb.calls++; return 0; }
static mskv_cu_result chb_cuEventQuery(mskv_cu_event e) { (void)e; chb.calls++; return 0; }
static mskv_cu_result chb_cuEventSynchronize(mskv_cu_event e) { (void)e; chb.calls++; return 0; }
static mskv_cu_result chb_cuEventDestroy(mskv_cu_event e) { (void)e; chb.calls++; return 0; }
static mskv_cu_result chb_cuModuleLoadData(mskv_cu_module *m, const void *image) {
    (void)image; chb.calls++; *m = (mskv_cu_module)(void *)&chb_handle; return 0;
}
static mskv_cu_result chb_cuModuleUnload(mskv_cu_module m) { (void)m; chb.calls++; return 0; }
static mskv_cu_result chb_cuModuleGetFunction(mskv_cu_function *f, mskv_cu_module m, const char *name) {
    (void)m; (void)name; chb.calls++; *f = (mskv_cu_function)(void *)&chb_handle; return 0;
}
static mskv_cu_result chb_cuFuncSetAttribute(mskv_cu_function f, int a, int v) { (void)f; (void)a; (void)v; chb.calls++; return 0; }
static mskv_cu_result chb_cuOccupancyMaxActiveBlocksPerMultiprocessor(int *n, mskv_cu_function f, int b, size_t smem) {
    (void)f; (void)b; (void)smem; chb.calls++; *n = 2; return 0;
}
static mskv_cu_result chb_cuLaunchKernel(mskv_cu_function f, unsigned int gx, unsigned int gy, unsigned int gz,
                                         unsigned int bx, unsigned int by, unsigned int bz, unsigned int smem,
                                         mskv_cu_stream s, void **params, void **extra) {
    (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)smem; (void)s; (void)params; (void)extra;
    chb.calls++;
    chb.launches++;
    return 0;
}
static mskv_cu_result chb_cuStreamBeginCapture(mskv_cu_stream s, int mode) { (void)s; (void)mode; chb.calls++; chb.capturing = 1; return 0; }
static mskv_cu_result chb_cuStreamEndCapture(mskv_cu_stream s, mskv_cu_graph *g) {
    (void)s; chb.calls++; chb.capturing = 0; *g = (mskv_cu_graph)(void *)&chb_handle; return 0;
}
static mskv_cu_result chb_cuGraphInstantiateWithFlags(mskv_cu_graph_exec *e, mskv_cu_graph g, unsigned long long f) {
    (void)g; (void)f; chb.calls++; *e = (mskv_cu_graph_exec)(void *)&chb_handle; return 0;
}
static mskv_cu_result chb_cuGraphLaunch(mskv_cu_graph_exec e, mskv_cu_stream s) { (void)e; (void)s; chb.calls++; return 0; }
static mskv_cu_result chb_cuGraphExecDestroy(mskv_cu_graph_exec e) { (void)e; chb.calls++; return 0; }
static mskv_cu_result chb_cuGraphDestroy(mskv_cu_graph g) { (void)g; chb.calls++; return 0; }
static mskv_cu_result chb_cuTensorMapEncodeTiled(void *map, int dt, unsigned int rank, void *g, const unsigned long long *dims,
                                                 const unsigned long long *strides, const unsigned int *box,
                                                 const unsigned int *es, int il, int sw, int l2, int oob) {
    (void)dt; (void)rank; (void)g; (void)dims; (void)strides; (void)box; (void)es; (void)il; (void)sw; (void)l2; (void)oob;
    chb.calls++;
    memset(map, 0, 128);
    return 0;
}

static mskv_nvrtc_result chb_nvrtcVersion(int *a, int *b) { chb.calls++; *a = 13; *b = 0; return 0; }
static const char *chb_nvrtcGetErrorString(mskv_nvrtc_result r) { (void)r; chb.calls++; return "stub"; }
static mskv_nvrtc_result chb_nvrtcGetNumSupportedArchs(int *n) { chb.calls++; *n = 1; return 0; }
static mskv_nvrtc_result chb_nvrtcGetSupportedArchs(int *a) { chb.calls++; a[0] = 90; return 0; }
static mskv_nvrtc_result chb_nvrtcCreateProgram(mskv_nvrtc_program *p, const char *src, const char *name, int nh,
                                                const char *const *h, const char *const *in) {
    (void)src; (void)name; (void)nh; (void)h; (void)in; chb.calls++; *p = (mskv_nvrtc_program)(void *)&chb_handle; return 0;
}
static mskv_nvrtc_result chb_nvrtcDestroyProgram(mskv_nvrtc_program *p) { chb.calls++; *p = NULL; return 0; }
static mskv_nvrtc_result chb_nvrtcCompileProgram(mskv_nvrtc_program p, int n, const char *const *o) { (void)p; (void)n; (void)o; chb.calls++; return 0; }
static mskv_nvrtc_result chb_nvrtcGetProgramLogSize(mskv_nvrtc_program p, size_t *n) { (void)p; chb.calls++; *n = 1; return 0; }
static mskv_nvrtc_result chb_nvrtcGetProgramLog(mskv_nvrtc_program p, char *log) { (void)p; chb.calls++; log[0] = 0; return 0; }
static mskv_nvrtc_result chb_nvrtcGetPTXSize(mskv_nvrtc_program p, size_t *n) { (void)p; chb.calls++; *n = 8; return 0; }
static mskv_nvrtc_result chb_nvrtcGetPTX(mskv_nvrtc_program p, char *out) { (void)p; chb.calls++; memcpy(out, "stubptx", 8); return 0; }
static mskv_nvrtc_result chb_nvrtcGetCUBINSize(mskv_nvrtc_program p, size_t *n) { (void)p; chb.calls++; *n = 8; return 0; }
static mskv_nvrtc_result chb_nvrtcGetCUBIN(mskv_nvrtc_program p, char *out) { (void)p; chb.calls++; memcpy(out, "stubbin", 8); return 0; }

static mskv_cuda_functions chb_table(void) {
    mskv_cuda_functions f;
#define CHB_SET(ret, name, sym, params) f.name = chb_##name;
    MSKV_CUDA_DRIVER_FUNCTIONS(CHB_SET)
    MSKV_CUDA_NVRTC_FUNCTIONS(CHB_SET)
#undef CHB_SET
    return f;
}

static void *chb_alloc(void *u, size_t n) { (void)u; chb.allocs++; return malloc(n); }
static void *chb_realloc(void *u, void *p, size_t n) { (void)u; chb.allocs++; return realloc(p, n); }
static void chb_free(void *u, void *p) { (void)u; free(p); }

/* ---- timing ------------------------------------------------------------------- */

static double chb_clock(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int chb_calls = 20000, chb_runs = 5, chb_missed;
static const char *chb_only;

static void chb_need(mskv_result r, const char *what) {
    if (r != MSKV_SUCCESS) {
        fprintf(stderr, "cuda_host_bench: %s: %s\n", what, mskv_result_string(r));
        exit(1);
    }
}

/* ---- the problems ------------------------------------------------------------------ */

enum { CHB_LAYERS = 32, CHB_KVH = 8, CHB_QH = 32, CHB_D = 128, CHB_P = 16, CHB_PAGES = 40000 };

typedef struct chb_problem {
    mskv_plan plan;
    mskv_cuda_dplan dplan;
    int32_t *qo, *kvp, *ids, *last, *kvl, *split, *shift, *pos;
    int64_t *slots;
} chb_problem;

/* batch segments of qo queries over kv keys each */
static void chb_problem_make(mskv_cuda_store *st, chb_problem *p, int32_t batch, int32_t qo, int32_t kv, int pos3) {
    int32_t per = (kv + CHB_P - 1) / CHB_P, b, i, t = batch * qo;
    memset(p, 0, sizeof *p);
    p->qo = (int32_t *)calloc((size_t)batch + 1, 4);
    p->kvp = (int32_t *)calloc((size_t)batch + 1, 4);
    p->ids = (int32_t *)calloc((size_t)batch * (size_t)per, 4);
    p->last = (int32_t *)calloc((size_t)batch, 4);
    p->kvl = (int32_t *)calloc((size_t)batch, 4);
    p->split = (int32_t *)calloc((size_t)batch, 4);
    p->shift = (int32_t *)calloc((size_t)batch, 4);
    p->pos = (int32_t *)calloc((size_t)t * 3, 4);
    p->slots = (int64_t *)calloc((size_t)t, 8);
    for (b = 0; b < batch; b++) {
        p->qo[b + 1] = p->qo[b] + qo;
        p->kvp[b + 1] = p->kvp[b] + per;
        for (i = 0; i < per; i++) p->ids[b * per + i] = 1 + (b * per + i) % (CHB_PAGES - 1);
        p->kvl[b] = kv;
        p->last[b] = kv - (per - 1) * CHB_P;
        p->split[b] = 0;
        p->shift[b] = kv - qo;
        for (i = 0; i < qo; i++)
            p->slots[b * qo + i] = (int64_t)p->ids[b * per + (kv - qo + i) / CHB_P] * CHB_P + (kv - qo + i) % CHB_P;
    }
    for (i = 0; i < t * 3; i++) p->pos[i] = i % 97;
    p->plan.batch = batch; p->plan.total_q = t; p->plan.num_page_ids = batch * per; p->plan.page_size = CHB_P;
    p->plan.qo_indptr = p->qo; p->plan.kv_indptr = p->kvp; p->plan.kv_indices = p->ids;
    p->plan.kv_last_page_len = p->last; p->plan.kv_len = p->kvl; p->plan.kv_pos_split = p->split;
    p->plan.kv_pos_shift = p->shift; p->plan.slot_mapping = p->slots; p->plan.positions = p->pos;
    chb_need(mskv_cuda_plan_upload(st, &p->plan, pos3 ? MSKV_POS_3D : MSKV_POS_1D, &p->dplan), "plan_upload");
}

static void chb_problem_free(chb_problem *p) {
    free(p->qo); free(p->kvp); free(p->ids); free(p->last); free(p->kvl); free(p->split); free(p->shift);
    free(p->pos); free(p->slots);
}

enum { CHB_ATTENTION, CHB_WRITE_KV, CHB_GRAPH, CHB_DENSE };

typedef struct chb_case {
    int what;
    mskv_cuda_store *st;
    chb_problem *p;
    mskv_attn attn;
    mskv_rope rope;
    int use_rope;
    mskv_cuda_graph *graph;
    mskv_cu_ptr q, o, lse, k, v;
    const mskv_plan *plan;       /* CHB_DENSE: its plan, upload and the view's layers */
    const mskv_cuda_dplan *dplan;
    mskv_dense_kv kv[2];
} chb_case;

/* One call of the case's wrapper. */
static mskv_result chb_call(const chb_case *c, int i) {
    switch (c->what) {
    case CHB_ATTENTION:
        return mskv_cuda_attention(c->st, i % CHB_LAYERS, &c->p->plan, &c->p->dplan, &c->attn, c->q, c->o, c->lse);
    case CHB_WRITE_KV:
        return mskv_cuda_write_kv(c->st, i % CHB_LAYERS, &c->p->dplan, c->k, c->v, c->use_rope ? &c->rope : NULL);
    case CHB_DENSE:
        return mskv_cuda_attention_dense(c->st, &c->kv[i & 1], c->plan, c->dplan, &c->attn, c->q, c->o, c->lse);
    default:
        return mskv_cuda_graph_launch(c->st, c->graph);
    }
}

/* The timed loop, never inlined: callgrind collects it by name (the warm-up
   call that compiles the variant goes around it). */
static CHB_NOINLINE int chb_loop(const chb_case *c, int n) {
    int i, bad = 0;
    for (i = 0; i < n; i++) bad += chb_call(c, i) != MSKV_SUCCESS;
    return bad;
}

static void chb_time(const char *name, const chb_case *c, double target_ns) {
    double best_cpu = 1e300, best_wall = 1e300;
    long calls0, launches0, allocs0;
    int r, bad;
    if (chb_only && !strstr(name, chb_only)) return;
    if (chb_call(c, 0) != MSKV_SUCCESS) { fprintf(stderr, "cuda_host_bench: %s: the first call failed\n", name); exit(1); }
    calls0 = chb.calls; launches0 = chb.launches; allocs0 = chb.allocs;
    for (r = 0; r < chb_runs; r++) {
        double c0 = chb_clock(CLOCK_THREAD_CPUTIME_ID), w0 = chb_clock(CLOCK_MONOTONIC), cpu, wall;
        bad = chb_loop(c, chb_calls);
        cpu = (chb_clock(CLOCK_THREAD_CPUTIME_ID) - c0) / chb_calls;
        wall = (chb_clock(CLOCK_MONOTONIC) - w0) / chb_calls;
        if (bad) { fprintf(stderr, "cuda_host_bench: %s: %d calls failed\n", name, bad); exit(1); }
        if (cpu < best_cpu) best_cpu = cpu;
        if (wall < best_wall) best_wall = wall;
    }
    {
        double per = (double)chb_calls * chb_runs;
        int ok = best_cpu <= target_ns;
        if (!ok) chb_missed++;
        printf("  %-36s %8.1f ns (wall %8.1f)  launches %4.2f  driver calls %4.2f  allocs %4.2f  target <= %4.0f ns %s\n",
               name, best_cpu, best_wall, (double)(chb.launches - launches0) / per, (double)(chb.calls - calls0) / per,
               (double)(chb.allocs - allocs0) / per, target_ns, ok ? "ok" : "MISSED");
    }
}

static int chb_selftest_on;   /* the next chb_open's context runs the kernel self-test */

/* A context (its attention path forced, or AUTO) and a bf16 store on the stubbed driver. */
static void chb_open(mskv_cuda_functions *fn, mskv_cuda_attn_path path, mskv_cuda **cu, mskv_cuda_store **st) {
    mskv_cuda_desc cd;
    mskv_cuda_store_desc sd;
    memset(&cd, 0, sizeof cd);
    cd.functions = fn;
    /* the mock launches kernels without running them: the self-test would fail them */
    cd.selftest = chb_selftest_on ? MSKV_CUDA_SELFTEST_ON : MSKV_CUDA_SELFTEST_OFF;
    chb_selftest_on = 0;
    cd.disable_disk_cache = 1;
    cd.allocator.alloc = chb_alloc;
    cd.allocator.realloc = chb_realloc;
    cd.allocator.free = chb_free;
    cd.attn_path = path;
    chb_need(mskv_cuda_create(&cd, cu), "cuda_create");
    memset(&sd, 0, sizeof sd);
    sd.num_pages = CHB_PAGES; sd.page_size = CHB_P; sd.num_layers = CHB_LAYERS; sd.kv_heads = CHB_KVH;
    sd.head_dim = CHB_D; sd.dtype = MSKV_DTYPE_BF16;
    sd.max_batch = 64; sd.max_tokens = 4680; sd.max_page_ids = 64 * 256;
    chb_need(mskv_cuda_store_create(*cu, &sd, st), "store_create");
}

static void chb_buffers(mskv_cuda *cu, chb_case *c) {
    chb_need(mskv_cuda_malloc(cu, (size_t)4680 * CHB_QH * CHB_D * 2, &c->q), "malloc");
    chb_need(mskv_cuda_malloc(cu, (size_t)4680 * CHB_QH * CHB_D * 2, &c->o), "malloc");
    chb_need(mskv_cuda_malloc(cu, (size_t)4680 * CHB_QH * 4, &c->lse), "malloc");
    chb_need(mskv_cuda_malloc(cu, (size_t)4680 * CHB_KVH * CHB_D * 2, &c->k), "malloc");
    chb_need(mskv_cuda_malloc(cu, (size_t)4680 * CHB_KVH * CHB_D * 2, &c->v), "malloc");
    c->attn.q_heads = CHB_QH; c->attn.mask = MSKV_MASK_CAUSAL; c->attn.q_dtype = MSKV_DTYPE_BF16;
    c->rope.mode = MSKV_POS_3D; c->rope.style = MSKV_ROPE_HALF;
    c->rope.dims[0] = 44; c->rope.dims[1] = 42; c->rope.dims[2] = 42;
}

/* The three attention shapes with the path forced: mma.sync (mskv_attn) or
   wgmma (mskv_attn_sm90; the stub is a compute capability 9.0 device). */
static void chb_attention_cases(mskv_cuda_functions *fn, mskv_cuda_attn_path path) {
    static const char *const shapes[3] = { "decode 1 x 512", "decode 64 x 4096", "chunk 4680 x 32760" };
    mskv_cuda *cu = NULL;
    mskv_cuda_store *st = NULL;
    chb_problem p[3];
    chb_case c;
    char name[64];
    int i;
    chb_open(fn, path, &cu, &st);
    memset(&c, 0, sizeof c);
    c.st = st;
    c.what = CHB_ATTENTION;
    chb_buffers(cu, &c);
    chb_problem_make(st, &p[0], 1, 1, 512, 0);
    chb_problem_make(st, &p[1], 64, 1, 4096, 0);
    chb_problem_make(st, &p[2], 1, 4680, 32760, 1);
    for (i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "attention %s (%s)", shapes[i], path == MSKV_CUDA_ATTN_WGMMA ? "wgmma" : "mma.sync");
        c.p = &p[i];
        /* the upload the attention reads (the last one made is the chunk's) */
        chb_need(mskv_cuda_plan_upload(st, &p[i].plan, i == 2 ? MSKV_POS_3D : MSKV_POS_1D, &p[i].dplan), "plan_upload");
        chb_time(name, &c, 1000);
    }
    for (i = 0; i < 3; i++) chb_problem_free(&p[i]);
    mskv_cuda_store_destroy(st);
    mskv_cuda_destroy(cu);
}

/* The chunk's queries over a one-frame prefix view (a MSKV_PLAN_PREFIX
   plan's arrays, written here: 1560 keys, no pages, q_pos after the prefix). */
static void chb_dense_case(mskv_cuda_functions *fn) {
    static int32_t qo[2] = { 0, 4680 }, zero[2] = { 0, 0 }, kvl[1] = { 1560 }, split[1] = { 1560 }, qpos[4680];
    static int64_t tok[2] = { 0, 1560 };
    mskv_cuda *cu = NULL;
    mskv_cuda_store *st = NULL;
    mskv_plan plan;
    mskv_cuda_dplan dp;
    mskv_cu_ptr vk, vv;
    chb_case c;
    int i;
    if (chb_only && !strstr("attention dense prefix 4680 x 1560 (wgmma)", chb_only)) return;
    chb_open(fn, MSKV_CUDA_ATTN_WGMMA, &cu, &st);
    memset(&c, 0, sizeof c);
    c.st = st;
    c.what = CHB_DENSE;
    chb_buffers(cu, &c);
    for (i = 0; i < 4680; i++) qpos[i] = 1560 + i;
    memset(&plan, 0, sizeof plan);
    plan.batch = 1; plan.total_q = 4680; plan.page_size = CHB_P;
    plan.qo_indptr = qo; plan.kv_indptr = zero; plan.kv_last_page_len = zero; plan.kv_len = kvl;
    plan.kv_pos_split = split; plan.kv_pos_shift = zero; plan.kv_token_indptr = tok; plan.q_pos = qpos;
    plan.features = MSKV_PLAN_Q_POS;
    chb_need(mskv_cuda_plan_upload(st, &plan, MSKV_POS_NONE, &dp), "plan_upload");
    /* a view of 2 layers x 1560 tokens: layer l's K at vk + l * its bytes */
    chb_need(mskv_cuda_malloc(cu, (size_t)2 * 1560 * CHB_KVH * CHB_D * 2, &vk), "malloc");
    chb_need(mskv_cuda_malloc(cu, (size_t)2 * 1560 * CHB_KVH * CHB_D * 2, &vv), "malloc");
    for (i = 0; i < 2; i++) {
        c.kv[i].k = (const void *)(uintptr_t)(vk + (mskv_cu_ptr)i * 1560 * CHB_KVH * CHB_D * 2);
        c.kv[i].v = (const void *)(uintptr_t)(vv + (mskv_cu_ptr)i * 1560 * CHB_KVH * CHB_D * 2);
        c.kv[i].dtype = MSKV_DTYPE_BF16; c.kv[i].kv_heads = CHB_KVH; c.kv[i].head_dim = CHB_D; c.kv[i].tokens = 1560;
        c.kv[i].device = 1;
    }
    c.plan = &plan;
    c.dplan = &dp;
    chb_time("attention dense prefix 4680 x 1560 (wgmma)", &c, 1000);
    mskv_cuda_store_destroy(st);
    mskv_cuda_destroy(cu);
}

/* The kernel self-test's host side, once per variant: a fresh context's
   first attention call (which tests the variant it loads) less its second.
   The kernels do not run on the stubbed driver, so every verdict here is
   FAIL and the fallback is not taken into account; what it measures is the
   problem's set-up, the CPU reference and the comparison (the device's part
   is printed by the GPU check). Best of 5, wall time. */
static void chb_selftest_cost(mskv_cuda_functions *fn, mskv_cuda_attn_path path, const char *name) {
    double best = 1e30;
    int r;
    for (r = 0; r < 5; r++) {
        mskv_cuda *cu = NULL;
        mskv_cuda_store *st = NULL;
        chb_problem pr;
        chb_case c;
        double t0, t1, t2;
        chb_selftest_on = 1;
        chb_open(fn, path, &cu, &st);
        memset(&c, 0, sizeof c);
        c.st = st;
        chb_buffers(cu, &c);
        chb_problem_make(st, &pr, 1, 64, 512, 0);
        chb_need(mskv_cuda_plan_upload(st, &pr.plan, MSKV_POS_NONE, &pr.dplan), "plan_upload");
        t0 = chb_clock(CLOCK_MONOTONIC);
        mskv_cuda_attention(st, 0, &pr.plan, &pr.dplan, &c.attn, c.q, c.o, c.lse);   /* the self-test fails here */
        t1 = chb_clock(CLOCK_MONOTONIC);
        mskv_cuda_attention(st, 0, &pr.plan, &pr.dplan, &c.attn, c.q, c.o, c.lse);
        t2 = chb_clock(CLOCK_MONOTONIC);
        if ((t1 - t0) - (t2 - t1) < best) best = (t1 - t0) - (t2 - t1);
        chb_problem_free(&pr);
        mskv_cuda_store_destroy(st);
        mskv_cuda_destroy(cu);
    }
    printf("  %-36s %8.3f ms once per variant (host side)  target <= 5 ms %s\n", name, best / 1e6,
           best <= 5e6 ? "ok" : "MISSED");
    if (best > 5e6) chb_missed++;
}

int main(int argc, char **argv) {
    mskv_cuda_functions fn = chb_table();
    mskv_cuda *cu = NULL;
    mskv_cuda_store *st = NULL;
    chb_problem dec1, chunk;
    chb_case c;
    int i;
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--calls") && i + 1 < argc) chb_calls = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--runs") && i + 1 < argc) chb_runs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) chb_only = argv[++i];
        else { fprintf(stderr, "usage: %s [--calls N] [--runs N] [--only NAME]\n", argv[0]); return 2; }
    }
    if (chb_calls < 1 || chb_runs < 1) { fprintf(stderr, "cuda_host_bench: --calls and --runs need N >= 1\n"); return 2; }
    printf("mstar_kv cuda_host_bench: host ns per call with the driver stubbed (%d calls x %d runs, thread CPU time, best run)\n",
           chb_calls, chb_runs);
    chb_attention_cases(&fn, MSKV_CUDA_ATTN_MMA);
    chb_attention_cases(&fn, MSKV_CUDA_ATTN_WGMMA);
    chb_dense_case(&fn);
    if (!chb_only || strstr("self-test", chb_only)) {
        chb_selftest_cost(&fn, MSKV_CUDA_ATTN_MMA, "self-test mskv_attn bf16 d128");
        chb_selftest_cost(&fn, MSKV_CUDA_ATTN_WGMMA, "self-test mskv_attn_sm90 bf16 d128");
    }

    /* the rest on the default path (AUTO: decode runs mma.sync on 9.0) */
    chb_open(&fn, MSKV_CUDA_ATTN_AUTO, &cu, &st);
    memset(&c, 0, sizeof c);
    c.st = st;
    chb_buffers(cu, &c);
    chb_problem_make(st, &dec1, 1, 1, 512, 0);
    chb_problem_make(st, &chunk, 1, 4680, 32760, 1);
    c.p = &dec1;
    c.what = CHB_WRITE_KV;
    chb_need(mskv_cuda_plan_upload(st, &dec1.plan, MSKV_POS_1D, &dec1.dplan), "plan_upload");
    chb_time("write_kv decode 1 token", &c, 1000);
    c.p = &chunk;
    c.use_rope = 1;
    chb_need(mskv_cuda_plan_upload(st, &chunk.plan, MSKV_POS_3D, &chunk.dplan), "plan_upload");
    chb_time("write_kv chunk 4680, 3-D RoPE", &c, 1000);
    c.use_rope = 0;

    /* a decode step run once (kernels compiled, workspace sized), captured, then replayed */
    if (!chb_only || strstr("graph replay (write_kv + attention)", chb_only)) {
        c.p = &dec1;
        chb_need(mskv_cuda_plan_upload(st, &dec1.plan, MSKV_POS_1D, &dec1.dplan), "plan_upload");
        chb_need(mskv_cuda_write_kv(st, 0, &dec1.dplan, c.k, c.v, NULL), "write_kv");
        chb_need(mskv_cuda_attention(st, 0, &dec1.plan, &dec1.dplan, &c.attn, c.q, c.o, c.lse), "attention");
        chb_need(mskv_cuda_capture_begin(st), "capture_begin");
        chb_need(mskv_cuda_write_kv(st, 0, &dec1.dplan, c.k, c.v, NULL), "write_kv");
        chb_need(mskv_cuda_attention(st, 0, &dec1.plan, &dec1.dplan, &c.attn, c.q, c.o, c.lse), "attention");
        chb_need(mskv_cuda_capture_end(st, &c.graph), "capture_end");
        c.what = CHB_GRAPH;
        chb_time("graph replay (write_kv + attention)", &c, 500);
        mskv_cuda_graph_destroy(st, c.graph);
    }

    chb_problem_free(&dec1);
    chb_problem_free(&chunk);
    mskv_cuda_store_destroy(st);
    mskv_cuda_destroy(cu);
    printf("%d target(s) missed\n", chb_missed);
    return 0;
}
