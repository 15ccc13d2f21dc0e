/* gpu_check.c - the GPU check of mstar_kv: runs the device store and kernels
   of mstar_kv_cuda.h against the CPU backend of mstar_kv.h and prints a short
   summary. Run it with `make gpu-check` (or `bash tests/gpu_check.sh`) on a
   machine with an NVIDIA GPU; it needs only -ldl at build time.

   Stages (--stage NAME[,NAME...]; tests/gpu_check.sh runs each in its own
   process under its own budget, writing JSON lines to $GPU_CHECK_RESULTS):
     info        device, driver, the NVRTC chosen and why (mskv_cuda_info)
     mma         bench/gpu_bench.c's attention parity sweep (quick: no 16k-key
                 cases) on a context forced to mma.sync, prefill and decode
     sm90a       the same sweep's prefill cases on the sm_90a kernel (exit 77,
                 skip, off compute capability 9.0)
     selftest    one attention per path on default contexts (self-test on),
                 then mskv_cuda_info's self-test fields
     kvwrite     the store checks below
     figures     bench/gpu_bench.c's figures (both paths on 9.0)
   Store checks (kvwrite; gpc_run_store, also run by tests/test_cuda.c):
     kv_write    every dtype x head_dim x RoPE mode/style, odd page size:
                 bit-exact without RoPE; with it within 2 ulp of the pool dtype
                 plus the f32 angle error (pos * 4e-6 relative: the device
                 computes angles in f32, the CPU backend in double)
     offload     offload/reload/export/import round trips of some requests
                 while others keep writing (gather/scatter kernels, fences)
     graph       a captured step replayed with new plan contents and new K/V
     speed       offload/reload bandwidth and kv_write throughput (host-timed,
                 informative only)
   A sweep stops at its first failed call (on a GPU the context is then
   lost), not at a mismatch. Exit status of a stage: 0 passed, 1 a mismatch
   or error (also: a GPU without NVRTC, with the fix in the first line), 77
   skipped (no GPU; the reason in a "why: " line, as for every failure).

   --warm runs the stages on the compile-only device of tests/gpu_warm.h
   (make gpu-warm): every variant they load goes into the disk cache, and a
   GPU run then compiles nothing. Built with -DGPC_MOCK (build/gpu_check-mock)
   the stages run on the mock driver and GPU_CHECK_PLANT=crash:STAGE /
   hang:STAGE plants a fault or a hang: tests/test_gpu_check.sh.
   tests/test_cuda.c includes this file with MSKV_GPU_CHECK_NO_MAIN and runs
   gpc_run() through its mock driver, so the store checks' logic is tested on CI. */
#ifndef MSKV_GPU_CHECK_NO_MAIN
#if !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L   /* clock_gettime */
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>
#define MSTAR_KV_IMPLEMENTATION
#include "../mstar_kv.h"
#define MSTAR_KV_CUDA_IMPLEMENTATION
#include "../mstar_kv_cuda.h"
#endif

#if defined(__GNUC__) || defined(__clang__)
#define GPC_MAYBE_UNUSED __attribute__((unused))
#else
#define GPC_MAYBE_UNUSED
#endif

typedef struct gpc_ctx {
    mskv_cuda *cu;
    int quick;             /* fewer variants (the mock run in the tests) */
    int failures, checks;
    int stopped;           /* a call failed (not a mismatch): the sweep stops, the context may be gone */
    int small;             /* speed on a small store (gpu-warm: the mock's memory; the same variant) */
    int part, parts;       /* kv_write: only the cases with index % parts == part (gpu-warm's two
                              processes); offload/graph/speed with part 0. parts 0: every case */
    uint64_t rng;
    FILE *out;
    FILE *json;            /* figures as JSON lines too (NULL: none) */
} gpc_ctx;

static uint32_t gpc_rand(gpc_ctx *c) {
    c->rng ^= c->rng << 13; c->rng ^= c->rng >> 7; c->rng ^= c->rng << 17;
    return (uint32_t)(c->rng >> 11);
}
static float gpc_uniform(gpc_ctx *c) { return (float)(gpc_rand(c) % 40001u) / 10000.0f - 2.0f; }

static void gpc_fail(gpc_ctx *c, const char *fmt, const char *what, long long a, long long b) {
    c->failures++;
    if (c->failures <= 20) {
        fprintf(c->out, "  FAIL ");
        fprintf(c->out, fmt, what, a, b);
        fprintf(c->out, "\n");
    }
}

/* a CPU arena and a device arena with the same geometry, driven identically */
typedef struct gpc_pair {
    mskv_arena *cpu, *gpu;
    mskv_cuda_store *st;
    mskv_store_info info;
    mskv_plan pc, pg;      /* plan buffers for each arena */
} gpc_pair;

static mskv_result gpc_pair_open(gpc_ctx *c, gpc_pair *p, mskv_dtype dt, int32_t hd, int32_t page_size, int32_t pages) {
    mskv_cuda_store_desc sd;
    mskv_arena_desc ad;
    mskv_result r;
    memset(p, 0, sizeof *p);
    memset(&sd, 0, sizeof sd);
    sd.num_pages = pages; sd.page_size = page_size; sd.num_layers = 2; sd.kv_heads = 4; sd.head_dim = hd;
    sd.dtype = dt; sd.max_batch = 8; sd.max_tokens = 1024; sd.max_page_ids = pages;
    sd.staging_bytes = (size_t)3 * 2 * 2 * (size_t)page_size * 4 * (size_t)hd * mskv_dtype_size(dt); /* 3 pages per chunk */
    if ((r = mskv_cuda_store_create(c->cu, &sd, &p->st)) != MSKV_SUCCESS) return r;
    memset(&ad, 0, sizeof ad);
    if ((r = mskv_cuda_store_arena_desc(p->st, &ad)) != MSKV_SUCCESS) return r;
    if ((r = mskv_arena_create(&ad, &p->gpu)) != MSKV_SUCCESS) return r;
    if ((r = mskv_cuda_store_bind(p->st, p->gpu)) != MSKV_SUCCESS) return r;
    ad.store_ops = NULL;
    ad.retire_mode = MSKV_RETIRE_IMMEDIATE;
    if ((r = mskv_arena_create(&ad, &p->cpu)) != MSKV_SUCCESS) return r;
    if ((r = mskv_store_info_get(p->cpu, &p->info)) != MSKV_SUCCESS) return r;
    if ((r = mskv_plan_alloc(p->cpu, 8, 1024, pages, &p->pc)) != MSKV_SUCCESS) return r;
    return mskv_plan_alloc(p->gpu, 8, 1024, pages, &p->pg);
}

static void gpc_pair_close(gpc_pair *p) {
    if (p->cpu) { mskv_plan_free(p->cpu, &p->pc); mskv_arena_destroy(p->cpu); }
    if (p->gpu) { mskv_plan_free(p->gpu, &p->pg); mskv_arena_destroy(p->gpu); }
    if (p->st) mskv_cuda_store_destroy(p->st);
    memset(p, 0, sizeof *p);
}

/* random K and V rows [n][kv_heads][hd] in the pool dtype */
static void gpc_fill_rows(gpc_ctx *c, const mskv_store_info *si, int64_t n, void *k, void *v) {
    int64_t i, count = n * si->kv_heads * si->head_dim;
    for (i = 0; i < count; i++) {
        float a = gpc_uniform(c), b = gpc_uniform(c);
        if (si->dtype == MSKV_DTYPE_F32) { ((float *)k)[i] = a; ((float *)v)[i] = b; }
        else if (si->dtype == MSKV_DTYPE_F16) { ((uint16_t *)k)[i] = mskv_f32_to_f16(a); ((uint16_t *)v)[i] = mskv_f32_to_f16(b); }
        else { ((uint16_t *)k)[i] = mskv_f32_to_bf16(a); ((uint16_t *)v)[i] = mskv_f32_to_bf16(b); }
    }
}

static float gpc_el(mskv_dtype dt, const unsigned char *p) {
    uint16_t h;
    if (dt == MSKV_DTYPE_F32) { float f; memcpy(&f, p, 4); return f; }
    memcpy(&h, p, 2);
    return dt == MSKV_DTYPE_F16 ? mskv_f16_to_f32(h) : mskv_bf16_to_f32(h);
}

/* Compares every committed, unreleased token of req in both arenas (both
   resident). tol_ulp 0 = bit-exact. Returns mismatching elements. */
static long gpc_compare(gpc_ctx *c, gpc_pair *p, mskv_request rc, mskv_request rg, int64_t n_tokens, int tol_ulp,
                        const char *what) {
    const mskv_store_info *si = &p->info;
    size_t row = si->slot_bytes, es = si->elem_size;
    unsigned char *dev = (unsigned char *)malloc(si->pool_bytes);
    long bad = 0;
    int32_t l, kind;
    int64_t t;
    double eps = si->dtype == MSKV_DTYPE_F32 ? 1.0 / 8388608.0 : si->dtype == MSKV_DTYPE_F16 ? 1.0 / 1024.0 : 1.0 / 128.0;
    if (!dev) { gpc_fail(c, "%s: out of host memory %lld %lld", what, 0, 0); return 1; }
    for (l = 0; l < si->num_layers; l++)
        for (kind = 0; kind < 2; kind++) {
            const unsigned char *host = (const unsigned char *)mskv_store_pool(p->cpu, l, kind);
            mskv_result r = mskv_cuda_download(p->st, dev, mskv_cuda_store_pool(p->st, l, kind), si->pool_bytes);
            if (r != MSKV_SUCCESS) { gpc_fail(c, "%s: download failed %lld %lld", what, (long long)r, 0); bad++; continue; }
            for (t = 0; t < n_tokens; t++) {
                int64_t sc, sg;
                size_t e;
                mskv_result r1 = mskv_request_slot(p->cpu, rc, t, &sc), r2 = mskv_request_slot(p->gpu, rg, t, &sg);
                if (r1 != r2) { gpc_fail(c, "%s: slot lookups differ: %lld vs %lld", what, (long long)r1, (long long)r2); bad++; continue; }
                if (r1 != MSKV_SUCCESS) continue;   /* released in both */
                if (tol_ulp == 0) {
                    if (memcmp(host + (size_t)sc * row, dev + (size_t)sg * row, row) != 0) {
                        if (!bad) gpc_fail(c, "%s: token %lld layer/kind %lld differs", what, (long long)t, (long long)(l * 2 + kind));
                        bad++;
                    }
                    continue;
                }
                for (e = 0; e < row / es; e++) {
                    float x = gpc_el(si->dtype, host + (size_t)sc * row + e * es);
                    float y = gpc_el(si->dtype, dev + (size_t)sg * row + e * es);
                    /* a few ulp of the dtype, plus the angle: the device computes it in
                       f32 (pos * inv_freq), the CPU backend in double */
                    double mag = fabs((double)x) > 1.0 ? fabs((double)x) : 1.0;
                    double tol = (tol_ulp * eps + 4e-6 * (double)(1 + n_tokens)) * mag;
                    if (fabs((double)x - (double)y) > tol) {
                        if (!bad) gpc_fail(c, "%s: token %lld element %lld beyond tolerance", what, (long long)t, (long long)e);
                        bad++;
                    }
                }
            }
        }
    free(dev);
    c->checks++;
    return bad;
}

/* One step on both arenas: admit n tokens for each request, write random K/V
   into every layer (CPU backend / device kernel), commit, publish. */
static mskv_result gpc_step(gpc_ctx *c, gpc_pair *p, const mskv_request *rc, const mskv_request *rg, int32_t nreq,
                            int64_t n, const mskv_rope *rope) {
    mskv_segment sc[8], sg[8];
    mskv_plan_desc pd;
    mskv_cuda_dplan dp;
    const mskv_store_info *si = &p->info;
    size_t bytes = (size_t)n * (size_t)nreq * si->slot_bytes;
    void *k = malloc(bytes), *v = malloc(bytes);
    mskv_cu_ptr dk = 0, dv = 0;
    mskv_result r;
    int32_t i, l;
    for (i = 0; i < nreq; i++) { sc[i].request = rc[i]; sc[i].n_tokens = n; sg[i].request = rg[i]; sg[i].n_tokens = n; }
    memset(&pd, 0, sizeof pd);
    pd.pos_mode = rope ? rope->mode : MSKV_POS_NONE;
    pd.grid_h = 4; pd.grid_w = 5;
    if (!k || !v) { free(k); free(v); return MSKV_ERROR_OUT_OF_MEMORY; }
    r = mskv_admit(p->cpu, sc, nreq);
    if (r == MSKV_SUCCESS) r = mskv_admit(p->gpu, sg, nreq);
    if (r == MSKV_SUCCESS) r = mskv_plan_build(p->cpu, sc, nreq, &pd, &p->pc);
    if (r == MSKV_SUCCESS) r = mskv_plan_build(p->gpu, sg, nreq, &pd, &p->pg);
    if (r == MSKV_SUCCESS) r = mskv_cuda_plan_upload(p->st, &p->pg, pd.pos_mode, &dp);
    if (r == MSKV_SUCCESS) r = mskv_cuda_malloc(c->cu, bytes, &dk);
    if (r == MSKV_SUCCESS) r = mskv_cuda_malloc(c->cu, bytes, &dv);
    for (l = 0; l < si->num_layers && r == MSKV_SUCCESS; l++) {
        gpc_fill_rows(c, si, n * nreq, k, v);
        r = mskv_cpu_write_kv(p->cpu, l, &p->pc, k, v, si->dtype, rope);
        if (r == MSKV_SUCCESS) r = mskv_cuda_upload(p->st, dk, k, bytes);
        if (r == MSKV_SUCCESS) r = mskv_cuda_upload(p->st, dv, v, bytes);
        if (r == MSKV_SUCCESS) r = mskv_cuda_write_kv(p->st, l, &dp, dk, dv, rope);
    }
    /* the K/V buffers are reused by the next step: the kernels must be done */
    if (r == MSKV_SUCCESS) r = mskv_cuda_store_sync(p->st);
    mskv_cuda_free(c->cu, dk);
    mskv_cuda_free(c->cu, dv);
    free(k);
    free(v);
    if (r == MSKV_SUCCESS) r = mskv_commit(p->cpu, sc, nreq);
    if (r == MSKV_SUCCESS) r = mskv_commit(p->gpu, sg, nreq);
    if (r == MSKV_SUCCESS) r = mskv_publish(p->cpu, sc, nreq, NULL);
    if (r == MSKV_SUCCESS) r = mskv_cuda_publish(p->st, sg, nreq, NULL);
    return r;
}

#define GPC_TRY(c, call, what)                                                                   \
    do { mskv_result gpc__r = (call);                                                            \
         if (gpc__r != MSKV_SUCCESS) {                                                           \
             (c)->stopped = 1;                                                                   \
             gpc_fail((c), "%s: failed (%lld) %lld", what, (long long)gpc__r, 0);               \
             fprintf((c)->out, "       %s (%s)\n", mskv_result_string(gpc__r), mskv_cuda_last_error((c)->cu)); \
             goto done; } } while (0)

/* kv_write for one (dtype, head_dim, rope) */
static void gpc_kv_write_case(gpc_ctx *c, mskv_dtype dt, int32_t hd, const mskv_rope *rope, const char *name) {
    gpc_pair p;
    mskv_request rc[2], rg[2];
    int step;
    GPC_TRY(c, gpc_pair_open(c, &p, dt, hd, 7, 64), name);
    GPC_TRY(c, mskv_request_add(p.cpu, &rc[0]), name);
    GPC_TRY(c, mskv_request_add(p.cpu, &rc[1]), name);
    GPC_TRY(c, mskv_request_add(p.gpu, &rg[0]), name);
    GPC_TRY(c, mskv_request_add(p.gpu, &rg[1]), name);
    for (step = 0; step < 3; step++) GPC_TRY(c, gpc_step(c, &p, rc, rg, 2, 19, rope), name);
    gpc_compare(c, &p, rc[0], rg[0], 57, rope ? 2 : 0, name);
    gpc_compare(c, &p, rc[1], rg[1], 57, rope ? 2 : 0, name);
done:
    gpc_pair_close(&p);
}

static int gpc_check_kv_write(gpc_ctx *c) {
    static const int32_t dims[3] = { 64, 128, 256 };
    int before = c->failures, cases = 0, d, t, m;
    for (t = 0; t < 3 && !c->stopped; t++)
        for (d = 0; d < 3 && !c->stopped; d++)
            for (m = 0; m < 5 && !c->stopped; m++) {
                mskv_rope rope;
                char name[96];
                if (c->quick && (d != 1 || (m != 0 && m != 3))) continue;
                if (c->parts > 1 && (t * 15 + d * 5 + m) % c->parts != c->part) continue;
                memset(&rope, 0, sizeof rope);
                rope.mode = m >= 3 ? MSKV_POS_3D : MSKV_POS_1D;
                rope.style = (m == 2 || m == 4) ? MSKV_ROPE_INTERLEAVED : MSKV_ROPE_HALF;
                rope.theta = 10000.0f;
                snprintf(name, sizeof name, "kv_write dtype %d D %d rope %s", t, (int)dims[d],
                         m == 0 ? "none" : m == 1 ? "1-D half" : m == 2 ? "1-D interleaved" : m == 3 ? "3-D half" : "3-D interleaved");
                gpc_kv_write_case(c, (mskv_dtype)t, dims[d], m ? &rope : NULL, name);
                cases++;
            }
    fprintf(c->out, "kv_write      %3d cases   %s%s\n", cases, c->failures == before ? "ok" : "FAILED",
            c->stopped ? " (stopped at the first failed call)" : "");
    return c->failures - before;
}

/* Requests 0..3 keep writing; each round one of them is offloaded, another
   reloaded, one exported and imported back, with releases in between. */
static int gpc_check_offload(gpc_ctx *c) {
    gpc_pair p;
    mskv_request rc[4], rg[4];
    int before = c->failures, round, i, rounds = c->quick ? 4 : 24, moves = 0;
    int offl[4] = { 0, 0, 0, 0 };
    int64_t len = 0;
    memset(&p, 0, sizeof p);
    GPC_TRY(c, gpc_pair_open(c, &p, MSKV_DTYPE_BF16, 128, 16, 512), "offload setup");
    for (i = 0; i < 4; i++) {
        GPC_TRY(c, mskv_request_add(p.cpu, &rc[i]), "offload setup");
        GPC_TRY(c, mskv_request_add(p.gpu, &rg[i]), "offload setup");
    }
    for (round = 0; round < rounds; round++) {
        mskv_request wc[4], wg[4];
        int32_t nw = 0;
        int victim = round % 4, back = (round + 2) % 4;
        /* those resident keep writing */
        for (i = 0; i < 4; i++)
            if (!offl[i]) { wc[nw] = rc[i]; wg[nw] = rg[i]; nw++; }
        if (nw) GPC_TRY(c, gpc_step(c, &p, wc, wg, nw, 13, NULL), "offload: writes");
        if (!offl[victim]) {
            GPC_TRY(c, mskv_request_offload(p.cpu, rc[victim]), "offload (cpu)");
            GPC_TRY(c, mskv_request_offload(p.gpu, rg[victim]), "offload (gpu)");
            offl[victim] = 1;
            moves++;
        }
        if (offl[back]) {
            GPC_TRY(c, mskv_request_reload(p.cpu, rc[back]), "reload (cpu)");
            GPC_TRY(c, mskv_request_reload(p.gpu, rg[back]), "reload (gpu)");
            offl[back] = 0;
            moves++;
        }
        if (round % 5 == 4 && !offl[(round + 1) % 4]) {
            /* export a resident request, drop it, import it back */
            int j = (round + 1) % 4;
            size_t sc = 0, sg = 0;
            void *bc, *bg;
            GPC_TRY(c, mskv_request_export(p.cpu, rc[j], NULL, 0, &sc), "export (cpu)");
            GPC_TRY(c, mskv_request_export(p.gpu, rg[j], NULL, 0, &sg), "export (gpu)");
            bc = malloc(sc); bg = malloc(sg);
            if (bc && bg && mskv_request_export(p.cpu, rc[j], bc, sc, &sc) == MSKV_SUCCESS &&
                mskv_request_export(p.gpu, rg[j], bg, sg, &sg) == MSKV_SUCCESS &&
                mskv_request_remove(p.cpu, rc[j]) == MSKV_SUCCESS && mskv_request_remove(p.gpu, rg[j]) == MSKV_SUCCESS &&
                mskv_request_import(p.cpu, bc, sc, &rc[j]) == MSKV_SUCCESS &&
                mskv_request_import(p.gpu, bg, sg, &rg[j]) == MSKV_SUCCESS &&
                mskv_request_reload(p.cpu, rc[j]) == MSKV_SUCCESS && mskv_request_reload(p.gpu, rg[j]) == MSKV_SUCCESS) {
                /* sizes only: unused slots of a partial last page may hold different
                   stale bytes; the tokens are compared after the reload */
                if (sc != sg) gpc_fail(c, "%s: blob sizes differ (%lld vs %lld bytes)", "export", (long long)sc, (long long)sg);
                moves++;
            } else {
                gpc_fail(c, "%s: export/import round trip failed %lld %lld", "export", 0, 0);
            }
            free(bc); free(bg);
        }
        if (round % 7 == 6) {
            for (i = 0; i < 4; i++)
                if (!offl[i]) {
                    int64_t gone = 0;
                    GPC_TRY(c, mskv_request_release_oldest(p.cpu, rc[i], 20, &gone), "release (cpu)");
                    GPC_TRY(c, mskv_request_release_oldest(p.gpu, rg[i], 20, &gone), "release (gpu)");
                }
        }
    }
    for (i = 0; i < 4; i++)
        if (offl[i]) {
            GPC_TRY(c, mskv_request_reload(p.cpu, rc[i]), "reload (cpu)");
            GPC_TRY(c, mskv_request_reload(p.gpu, rg[i]), "reload (gpu)");
        }
    for (i = 0; i < 4; i++) {
        mskv_request_info info;
        GPC_TRY(c, mskv_request_info_get(p.gpu, rg[i], &info), "info");
        len = info.committed;
        gpc_compare(c, &p, rc[i], rg[i], len, 0, "offload round trips");
    }
    {
        char why[256] = "";
        if (mskv_arena_audit(p.gpu, why, sizeof why) != MSKV_SUCCESS) gpc_fail(c, "audit: %s %lld %lld", why, 0, 0);
    }
done:
    gpc_pair_close(&p);
    fprintf(c->out, "offload       %3d moves   %s\n", moves, c->failures == before ? "ok" : "FAILED");
    return c->failures - before;
}

/* A step captured once, replayed with new plans and new K/V. */
static int gpc_check_graph(gpc_ctx *c) {
    gpc_pair p;
    mskv_request rc, rg;
    mskv_segment sc, sg;
    mskv_plan_desc pd;
    mskv_cuda_dplan dp;
    mskv_cuda_graph *g = NULL;
    mskv_cu_ptr dk[2] = { 0, 0 }, dv[2] = { 0, 0 };
    void *k = NULL, *v = NULL;
    int before = c->failures, replay, replays = c->quick ? 2 : 6;
    int32_t l;
    const int64_t n = 24;
    size_t bytes;
    mskv_rope rope;
    memset(&p, 0, sizeof p);
    memset(&rope, 0, sizeof rope);
    rope.mode = MSKV_POS_1D;
    GPC_TRY(c, gpc_pair_open(c, &p, MSKV_DTYPE_F16, 128, 16, 128), "graph setup");
    bytes = (size_t)n * p.info.slot_bytes;
    k = malloc(bytes); v = malloc(bytes);
    GPC_TRY(c, k && v ? MSKV_SUCCESS : MSKV_ERROR_OUT_OF_MEMORY, "graph setup");
    GPC_TRY(c, mskv_request_add(p.cpu, &rc), "graph setup");
    GPC_TRY(c, mskv_request_add(p.gpu, &rg), "graph setup");
    for (l = 0; l < 2; l++) {
        GPC_TRY(c, mskv_cuda_malloc(c->cu, bytes, &dk[l]), "graph setup");
        GPC_TRY(c, mskv_cuda_malloc(c->cu, bytes, &dv[l]), "graph setup");
    }
    memset(&pd, 0, sizeof pd);
    pd.pos_mode = MSKV_POS_1D;
    sc.request = rc; sc.n_tokens = n; sg.request = rg; sg.n_tokens = n;
    for (replay = 0; replay <= replays; replay++) {
        GPC_TRY(c, mskv_admit(p.cpu, &sc, 1), "graph: admit");
        GPC_TRY(c, mskv_admit(p.gpu, &sg, 1), "graph: admit");
        GPC_TRY(c, mskv_plan_build(p.cpu, &sc, 1, &pd, &p.pc), "graph: plan");
        GPC_TRY(c, mskv_plan_build(p.gpu, &sg, 1, &pd, &p.pg), "graph: plan");
        GPC_TRY(c, mskv_cuda_plan_upload(p.st, &p.pg, MSKV_POS_1D, &dp), "graph: upload");
        for (l = 0; l < 2; l++) {
            gpc_fill_rows(c, &p.info, n, k, v);
            GPC_TRY(c, mskv_cpu_write_kv(p.cpu, l, &p.pc, k, v, p.info.dtype, &rope), "graph: cpu write");
            GPC_TRY(c, mskv_cuda_upload(p.st, dk[l], k, bytes), "graph: upload k");
            GPC_TRY(c, mskv_cuda_upload(p.st, dv[l], v, bytes), "graph: upload v");
        }
        if (replay == 0) {
            /* first step: run eagerly (compiles), then capture the same launches */
            for (l = 0; l < 2; l++) GPC_TRY(c, mskv_cuda_write_kv(p.st, l, &dp, dk[l], dv[l], &rope), "graph: write");
            GPC_TRY(c, mskv_cuda_capture_begin(p.st), "graph: capture");
            for (l = 0; l < 2; l++) GPC_TRY(c, mskv_cuda_write_kv(p.st, l, &dp, dk[l], dv[l], &rope), "graph: captured write");
            GPC_TRY(c, mskv_cuda_capture_end(p.st, &g), "graph: end capture");
        } else {
            GPC_TRY(c, mskv_cuda_graph_launch(p.st, g), "graph: launch");
        }
        GPC_TRY(c, mskv_cuda_store_sync(p.st), "graph: sync");
        GPC_TRY(c, mskv_commit(p.cpu, &sc, 1), "graph: commit");
        GPC_TRY(c, mskv_commit(p.gpu, &sg, 1), "graph: commit");
        GPC_TRY(c, mskv_publish(p.cpu, &sc, 1, NULL), "graph: publish");
        GPC_TRY(c, mskv_cuda_publish(p.st, &sg, 1, NULL), "graph: publish");
    }
    gpc_compare(c, &p, rc, rg, n * (replays + 1), 2, "graph replay");
done:
    if (g) mskv_cuda_graph_destroy(p.st, g);
    for (l = 0; l < 2; l++) { mskv_cuda_free(c->cu, dk[l]); mskv_cuda_free(c->cu, dv[l]); }
    free(k); free(v);
    gpc_pair_close(&p);
    fprintf(c->out, "graph replay  %3d replays %s\n", replays, c->failures == before ? "ok" : "FAILED");
    return c->failures - before;
}

#ifdef _WIN32
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#include <windows.h>   /* QueryPerformanceCounter: Windows has no clock_gettime */
static double gpc_now(void) {
    LARGE_INTEGER f, t;
    QueryPerformanceFrequency(&f);
    QueryPerformanceCounter(&t);
    return (double)t.QuadPart / (double)f.QuadPart;
}
#else
static double gpc_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
#endif

/* Offload/reload bandwidth and kv_write throughput on a larger store. */
static int gpc_speed(gpc_ctx *c) {
    mskv_cuda_store_desc sd;
    mskv_cuda_store *st = NULL;
    mskv_arena_desc ad;
    mskv_arena *a = NULL;
    mskv_request req;
    mskv_segment seg;
    mskv_plan plan;
    mskv_plan_desc pd;
    mskv_cuda_dplan dp;
    mskv_cu_ptr dk = 0, dv = 0;
    int before = c->failures, i, reps = c->quick || c->small ? 1 : 5;
    int64_t tokens = c->quick || c->small ? 256 : 32768;
    double t0, t_off = 0, t_rel = 0, t_kv = 0;
    size_t bytes = 0;
    memset(&sd, 0, sizeof sd);
    memset(&plan, 0, sizeof plan);
    sd.num_pages = (int32_t)(tokens / 16) + 8; sd.page_size = 16; sd.num_layers = 4; sd.kv_heads = 8; sd.head_dim = 128;
    sd.dtype = MSKV_DTYPE_BF16; sd.max_tokens = (int32_t)tokens; sd.max_page_ids = sd.num_pages; sd.staging_bytes = (size_t)64 << 20;
    GPC_TRY(c, mskv_cuda_store_create(c->cu, &sd, &st), "speed setup");
    memset(&ad, 0, sizeof ad);
    GPC_TRY(c, mskv_cuda_store_arena_desc(st, &ad), "speed setup");
    GPC_TRY(c, mskv_arena_create(&ad, &a), "speed setup");
    GPC_TRY(c, mskv_cuda_store_bind(st, a), "speed setup");
    GPC_TRY(c, mskv_request_add(a, &req), "speed setup");
    seg.request = req; seg.n_tokens = tokens;
    GPC_TRY(c, mskv_admit(a, &seg, 1), "speed setup");
    memset(&pd, 0, sizeof pd);
    GPC_TRY(c, mskv_plan_alloc(a, 1, (int32_t)tokens, sd.num_pages, &plan), "speed setup");
    GPC_TRY(c, mskv_plan_build(a, &seg, 1, &pd, &plan), "speed setup");
    GPC_TRY(c, mskv_cuda_plan_upload(st, &plan, MSKV_POS_NONE, &dp), "speed setup");
    bytes = (size_t)tokens * 8 * 128 * 2;
    GPC_TRY(c, mskv_cuda_malloc(c->cu, bytes, &dk), "speed setup");
    GPC_TRY(c, mskv_cuda_malloc(c->cu, bytes, &dv), "speed setup");
    GPC_TRY(c, mskv_cuda_write_kv(st, 0, &dp, dk, dv, NULL), "speed: warm-up");
    GPC_TRY(c, mskv_cuda_store_sync(st), "speed: warm-up");
    t0 = gpc_now();
    for (i = 0; i < reps * 4; i++) GPC_TRY(c, mskv_cuda_write_kv(st, i % 4, &dp, dk, dv, NULL), "speed: kv_write");
    GPC_TRY(c, mskv_cuda_store_sync(st), "speed: kv_write");
    t_kv = (gpc_now() - t0) / (reps * 4);
    GPC_TRY(c, mskv_commit(a, &seg, 1), "speed setup");
    GPC_TRY(c, mskv_cuda_publish(st, &seg, 1, NULL), "speed setup");
    for (i = 0; i < reps; i++) {
        t0 = gpc_now();
        GPC_TRY(c, mskv_request_offload(a, req), "speed: offload");
        t_off += gpc_now() - t0;
        GPC_TRY(c, mskv_cuda_publish(st, NULL, 0, NULL), "speed: publish");
        GPC_TRY(c, mskv_cuda_store_sync(st), "speed: sync");
        t0 = gpc_now();
        GPC_TRY(c, mskv_request_reload(a, req), "speed: reload");
        t_rel += gpc_now() - t0;
    }
    {
        double moved = (double)(tokens / 16) * 16.0 * 4 * 2 * 8 * 128 * 2;   /* pages x page bytes x layers x K,V */
        if (c->json) {
            fprintf(c->json, "{\"figure\":\"store_kv_write\",\"value\":%.6g,\"unit\":\"GB/s\",\"peer\":null,\"ratio\":null}\n"
                    "{\"figure\":\"offload\",\"value\":%.6g,\"unit\":\"GB/s\",\"peer\":null,\"ratio\":null}\n"
                    "{\"figure\":\"reload\",\"value\":%.6g,\"unit\":\"GB/s\",\"peer\":null,\"ratio\":null}\n",
                    t_kv > 0 ? 4.0 * (double)bytes / t_kv / 1e9 : 0.0, t_off > 0 ? moved * reps / t_off / 1e9 : 0.0,
                    t_rel > 0 ? moved * reps / t_rel / 1e9 : 0.0);
            fflush(c->json);
        }
        fprintf(c->out, "speed         kv_write %lld tokens x 8 heads x 128 bf16: %.1f us (%.0f GB/s); "
                "offload %.1f GB/s, reload %.1f GB/s (%.0f MiB)\n",
                (long long)tokens, t_kv * 1e6, t_kv > 0 ? 4.0 * (double)bytes / t_kv / 1e9 : 0.0,
                t_off > 0 ? moved * reps / t_off / 1e9 : 0.0, t_rel > 0 ? moved * reps / t_rel / 1e9 : 0.0,
                moved / 1048576.0);
    }
done:
    mskv_cuda_free(c->cu, dk);
    mskv_cuda_free(c->cu, dv);
    if (a) { mskv_plan_free(a, &plan); mskv_arena_destroy(a); }
    if (st) mskv_cuda_store_destroy(st);
    return c->failures - before;
}

/* Runs the store checks (kv_write, offload, graph, speed) on a context;
   returns the number of failures. After a failed call the later checks do
   not run (*stopped = 1; optional): on a GPU the context is then lost. The
   attention checks are bench/gpu_bench.c's, run as their own stages (see
   main below). json: figures as JSON lines too (NULL: none). quick 2: every
   case, the speed check on a small store (gpu-warm). part/parts: gpc_ctx's. */
static int gpc_run_store(mskv_cuda *cu, int quick, FILE *out, FILE *json, int *stopped, int part, int parts) {
    gpc_ctx c;
    mskv_cuda_info info;
    memset(&c, 0, sizeof c);
    c.cu = cu;
    c.quick = quick == 1;
    c.small = quick == 2;
    c.rng = 0x2545F4914F6CDD1Dull;
    c.out = out;
    c.json = json;
    c.part = part;
    c.parts = parts;
    if (mskv_cuda_info_get(cu, &info) == MSKV_SUCCESS)
        fprintf(out, "device        %s, sm_%d, %d SMs, driver %d, NVRTC %d\n", info.name, (int)info.arch,
                (int)info.multiprocessors, (int)info.driver_version, (int)info.nvrtc_version);
    gpc_check_kv_write(&c);
    if (!c.stopped && c.part == 0) gpc_check_offload(&c);
    if (!c.stopped && c.part == 0) gpc_check_graph(&c);
    if (!c.stopped && c.part == 0) gpc_speed(&c);
    fprintf(out, "attention     not here: bench/gpu_bench.c's parity sweep, stages mma and sm90a of tests/gpu_check.sh\n");
    if (mskv_cuda_info_get(cu, &info) == MSKV_SUCCESS)
        fprintf(out, "jit           %d compiled, %d from the disk cache\n", (int)info.compiles, (int)info.disk_hits);
    if (stopped) *stopped = c.stopped;
    return c.failures;
}

GPC_MAYBE_UNUSED static int gpc_run(mskv_cuda *cu, int quick, FILE *out) { return gpc_run_store(cu, quick, out, NULL, NULL, 0, 0); }

/* Without a context: exit 77 ("nothing to check") only when there is no GPU.
   A GPU the layer cannot use (no NVRTC, a context that fails) is a FAIL, the
   fix in its first line; why (what was tried) follows. gpus and
   driver_version come from mskv_cuda_probe_driver, nvrtc from loading NVRTC
   alone. */
static int gpc_no_context(FILE *out, const char *why, int gpus, int driver_version, int nvrtc) {
    if (gpus <= 0) {
        fprintf(out, "gpu check: no usable GPU: %s\n", why);
        return 77;
    }
    if (!nvrtc)
        fprintf(out, "gpu check: FAIL: %d GPU(s) but no NVRTC; fix: pip install %s (or point MSKV_NVRTC_PATH at a libnvrtc.so)\n",
                gpus, driver_version >= 13000 ? "nvidia-cuda-nvrtc" : "nvidia-cuda-nvrtc-cu12");
    else
        fprintf(out, "gpu check: FAIL: %d GPU(s) but no CUDA context could be made (see below)\n", gpus);
    fprintf(out, "  tried: %s\n", why);
    return 1;
}

#ifndef MSKV_GPU_CHECK_NO_MAIN
/* ---- the stages of tests/gpu_check.sh ------------------------------------------------------- */

/* bench/gpu_bench.c's attention parity sweep and figures, run by the stages below */
#define GB_EMBEDDED
#define GB_NO_MAIN
#include "../bench/gpu_bench.c"
#include "gpu_warm.h"
#ifdef GPC_MOCK
#include <signal.h>
#include <unistd.h>
#endif

/* the device table: NULL (the real driver and NVRTC), the compile-only
   device (--warm), or the mock driver (GPC_MOCK: the build tests/test_gpu_check.sh runs) */
static const mskv_cuda_functions *gpc_fn;
static int gpc_warm;
static FILE *gpc_json;
static int gpc_compiles, gpc_disk_hits;   /* over the contexts a stage closed (gpc_close) */
static int gpc_selftest_on;               /* gpc_open's contexts run the kernel self-test (the selftest stage) */
#ifdef GPC_MOCK
static const int gpc_mock = 1;
#else
static const int gpc_mock = 0;
#endif

/* mskv_cuda_info_get, the struct zeroed first (so a failure leaves zeros) */
static mskv_result gpc_info_get(mskv_cuda *cu, mskv_cuda_info *i) {
    memset(i, 0, sizeof *i);
    return mskv_cuda_info_get(cu, i);
}

/* destroys a stage's context, adding its JIT counts to the stage's */
static void gpc_close(mskv_cuda *cu) {
    mskv_cuda_info i;
    if (!cu) return;
    if (mskv_cuda_info_get(cu, &i) == MSKV_SUCCESS) { gpc_compiles += i.compiles; gpc_disk_hits += i.disk_hits; }
    mskv_cuda_destroy(cu);
}

static void gpc_log(void *u, mskv_log_level lvl, const char *m) {
    (void)u;
    if (lvl >= MSKV_LOG_WARN) fprintf(stderr, "%s\n", m);
}

/* JSON string body: quotes, backslashes and control characters escaped */
static void gpc_jstr(FILE *f, const char *s) {
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
        else if (ch == '\n') fputs("\\n", f);
        else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
        else fputc(ch, f);
    }
}

/* the stage's own results line: {"check":stage,"cases":..,"failed":..,"stopped":..} */
static void gpc_jcheck(const char *stage, int cases, int failed, int stopped) {
    if (!gpc_json) return;
    fprintf(gpc_json, "{\"check\":\"%s\",\"cases\":%d,\"failed\":%d,\"stopped\":%s}\n", stage, cases, failed,
            stopped ? "true" : "false");
    fflush(gpc_json);
}

/* A context on the stage's device: 0, or the stage's exit status (77 no
   GPU, 1 a GPU the layer cannot use) with the reason printed as "why: ..." */
static int gpc_open(int attn_path, mskv_cuda **out) {
    mskv_cuda_desc cd;
    char why[2048] = "";
    mskv_result r = MSKV_ERROR_CUDA_UNAVAILABLE;
    *out = NULL;
    memset(&cd, 0, sizeof cd);
    cd.log = gpc_log;
    cd.functions = gpc_fn;
    cd.attn_path = attn_path;
    /* The parity sweeps compare every case with the CPU themselves, and a
       variant failing its self-test would stop them at the call with
       MSKV_ERROR_CUDA instead of showing the mismatch: only the selftest
       stage runs it. The compile-only device and the mock run no kernel, so
       a known-answer test there could only fail. */
    cd.selftest = gpc_selftest_on && !gpc_warm && !gpc_mock ? MSKV_CUDA_SELFTEST_ON : MSKV_CUDA_SELFTEST_OFF;
    if (mskv_cuda_probe(&cd, why, sizeof why) != MSKV_SUCCESS || (r = mskv_cuda_create(&cd, out)) != MSKV_SUCCESS) {
        int32_t gpus = 0, version = 0;
        int nvrtc, rc;
        mskv_cuda_compile_info ci;
        mskv_cuda_image img;
        mskv_cuda_desc nd = cd;
        mskv_cuda_probe_driver(&cd, &gpus, &version, NULL, 0);
        /* NVRTC alone: a compile of an empty kernel loads it */
        memset(&ci, 0, sizeof ci);
        ci.arch = 80;
        nd.kernel_source = "extern \"C\" __global__ void mskv_nothing(void) {}\n";
        nd.disable_disk_cache = 1;
        nd.log = NULL;
        nvrtc = mskv_cuda_compile(&nd, &ci, &img) != MSKV_ERROR_CUDA_UNAVAILABLE;
        mskv_cuda_image_free(&nd, &img);
        if (r != MSKV_ERROR_CUDA_UNAVAILABLE && gpus > 0) {
            /* the probe passed, the context did not: the layer's reason (also logged above) */
            printf("gpu check: FAIL: mskv_cuda_create: %s\n", mskv_result_string(r));
            printf("why: mskv_cuda_create: %s (driver %d; the log above says why)\n", mskv_result_string(r), (int)version);
            return 1;
        }
        rc = gpc_no_context(stdout, why, gpus, version, nvrtc);
        if (rc == 77) printf("why: no usable GPU (%.300s)\n", why);
        else printf("why: %d GPU(s) the layer cannot use: %.300s\n", (int)gpus, why);
        return rc;
    }
    return 0;
}

static void gpc_print_info(mskv_cuda *cu) {
    mskv_cuda_info i;
    if (gpc_info_get(cu, &i) != MSKV_SUCCESS) return;
    printf("device        %s (device %d), compute capability %d.%d, %d SMs\n", i.name, (int)i.device, (int)i.cc_major,
           (int)i.cc_minor, (int)i.multiprocessors);
    printf("driver        %d\n", (int)i.driver_version);
    printf("nvrtc         %d, %s\n", (int)i.nvrtc_version, i.nvrtc_path[0] ? i.nvrtc_path : "(path not reported)");
    printf("nvrtc choice  %s\n", i.nvrtc_choice[0] ? i.nvrtc_choice : "(not reported)");
    printf("kernels       sm_%d%s; prefill attention: %s\n", (int)i.arch, i.ptx_fallback ? " as PTX (the driver finishes the JIT)" : " CUBIN",
           i.wgmma ? "sm_90a (wgmma)" : "mma.sync");
    if (gpc_json) {
        fprintf(gpc_json, "{\"info\":\"device\",\"name\":\"");
        gpc_jstr(gpc_json, i.name);
        fprintf(gpc_json, "\",\"cc\":\"%d.%d\",\"sms\":%d,\"arch\":%d,\"ptx_fallback\":%d,\"wgmma\":%d,\"driver\":%d,\"nvrtc\":%d,\"nvrtc_path\":\"",
                (int)i.cc_major, (int)i.cc_minor, (int)i.multiprocessors, (int)i.arch, (int)i.ptx_fallback, (int)i.wgmma,
                (int)i.driver_version, (int)i.nvrtc_version);
        gpc_jstr(gpc_json, i.nvrtc_path);
        fprintf(gpc_json, "\",\"nvrtc_choice\":\"");
        gpc_jstr(gpc_json, i.nvrtc_choice);
        fprintf(gpc_json, "\"}\n");
        fflush(gpc_json);
    }
}

static void gpc_print_selftests(const char *label, mskv_cuda *cu) {
    mskv_cuda_info i;
    if (gpc_info_get(cu, &i) != MSKV_SUCCESS) return;
    printf("selftest      [%s] %d passed, %d failed, %.2f ms\n", label, (int)i.selftests_passed, (int)i.selftests_failed,
           i.selftest_ms);
    if (i.selftest_report[0]) printf("%s%s", i.selftest_report, i.selftest_report[strlen(i.selftest_report) - 1] == '\n' ? "" : "\n");
    if (gpc_json) {
        fprintf(gpc_json, "{\"figure\":\"selftest_ms_%s\",\"value\":%.6g,\"unit\":\"ms\",\"peer\":null,\"ratio\":null}\n", label,
                i.selftest_ms);
        fprintf(gpc_json, "{\"info\":\"selftest\",\"path\":\"%s\",\"passed\":%d,\"failed\":%d,\"report\":\"", label,
                (int)i.selftests_passed, (int)i.selftests_failed);
        gpc_jstr(gpc_json, i.selftest_report);
        fprintf(gpc_json, "\"}\n");
        fflush(gpc_json);
    }
}

/* Each stage returns its exit status: 0 pass, 1 fail, 77 skip (the
   reason in a "why: " line). quick/mini: bench/gpu_bench.c's. */
typedef struct gpc_opts { int quick, mini, part, parts; const char *python; } gpc_opts;

static int gpc_stage_info(const gpc_opts *o) {
    mskv_cuda *cu;
    int rc = gpc_open(MSKV_CUDA_ATTN_AUTO, &cu);
    (void)o;
    if (rc) return rc;
    gpc_print_info(cu);
    gpc_close(cu);
    return 0;
}

/* mma.sync: every variant, prefill and decode, forced on compute capability 9.0 too */
static int gpc_stage_mma(const gpc_opts *o) {
    mskv_cuda *cu;
    int rc = gpc_open(MSKV_CUDA_ATTN_MMA, &cu);
    if (rc) return rc;
    rc = gb_check(cu, 1, o->mini, 0);
    gpc_jcheck("mma", gb_cases, gb_failed, gb_cuda_error);
    if (gb_cuda_error) printf("why: a call failed after %d cases (the rest of the sweep did not run)\n", gb_cases);
    else if (rc) printf("why: %d of %d cases mismatched\n", gb_failed, gb_cases);
    gpc_close(cu);
    return rc ? 1 : 0;
}

/* sm_90a: the prefill sweep on the default context (decode shapes stay on mma.sync) */
static int gpc_stage_sm90a(const gpc_opts *o) {
    mskv_cuda *cu;
    mskv_cuda_info i;
    int rc = gpc_open(MSKV_CUDA_ATTN_AUTO, &cu);
    if (rc) return rc;
    gpc_info_get(cu, &i);
    if (!i.wgmma) {
        printf("why: the sm_90a kernel runs on compute capability 9.0 only (this device: %d.%d%s)\n", (int)i.cc_major,
               (int)i.cc_minor, i.ptx_fallback ? ", PTX fallback" : "");
        gpc_close(cu);
        return 77;
    }
    rc = gb_check(cu, 1, o->mini, 1);
    gpc_jcheck("sm90a", gb_cases, gb_failed, gb_cuda_error);
    if (gb_cuda_error) printf("why: a call failed after %d cases (the rest of the sweep did not run)\n", gb_cases);
    else if (rc) printf("why: %d of %d cases mismatched\n", gb_failed, gb_cases);
    if (strcmp(gb_path(cu), "wgmma") != 0) {
        printf("FAIL path: the sm_90a kernel did not compile or load on this device (mma.sync ran instead)\n");
        printf("why: the sm_90a kernel did not compile or load (see the log above)\n");
        rc = 1;
    }
    gpc_close(cu);
    return rc ? 1 : 0;
}

/* One attention call per path (prefill and decode, bf16, head_dim 128) on
   contexts with the default desc (self-test on), so each variant's
   known-answer self-test runs as it loads; then what mskv_cuda_info says. */
static int gpc_stage_selftest(const gpc_opts *o) {
    mskv_cuda *cu[2] = { NULL, NULL };
    const char *label[2] = { "default", "mma" };
    int rc, k, failed = 0, n = 1;
    mskv_cuda_info i;
    gpc_selftest_on = 1;
    rc = gpc_open(MSKV_CUDA_ATTN_AUTO, &cu[0]);
    gpc_selftest_on = 0;
    if (rc != 0) return rc;
    gpc_info_get(cu[0], &i);
    if (i.wgmma) {
        label[0] = "sm90a";
        gpc_selftest_on = 1;
        rc = gpc_open(MSKV_CUDA_ATTN_MMA, &cu[1]);
        gpc_selftest_on = 0;
        if (rc != 0) { gpc_close(cu[0]); return rc; }
        n = 2;
    }
    for (k = 0; k < n; k++) {
        int32_t qo[2] = { 200, 1 }, kv[2] = { 300, 300 }, q;
        int32_t dim = o->mini ? 64 : 128;
        for (q = 0; q < 2; q++) {
            gb_problem p;
            mskv_result r = gb_problem_make(cu[k], &p, MSKV_DTYPE_BF16, 16, 2, 8, dim, 1, &qo[q], &kv[q], NULL, NULL, 1, 0);
            if (r == MSKV_SUCCESS) r = gb_attend(&p, MSKV_MASK_CAUSAL, 0);
            if (r == MSKV_SUCCESS) r = mskv_cuda_store_sync(p.st);
            if (r != MSKV_SUCCESS) {
                printf("FAIL selftest [%s]: %s attention: %s (%s)\n", label[k], q ? "decode" : "prefill", mskv_result_string(r),
                       mskv_cuda_last_error(cu[k]));
                failed++;
            }
            gb_problem_free(cu[k], &p);
        }
        gpc_print_selftests(label[k], cu[k]);
        gpc_info_get(cu[k], &i);
        failed += i.selftests_failed;
    }
    gpc_jcheck("selftest", 2 * n, failed, 0);
    if (failed) printf("why: %d self-test(s) or calls failed (the fallback is in the lines above)\n", failed);
    for (k = 0; k < n; k++) gpc_close(cu[k]);
    return failed ? 1 : 0;
}

/* kv_write / offload / graph and the store's speed: gpc_run_store */
static int gpc_stage_kvwrite(const gpc_opts *o) {
    mskv_cuda *cu;
    FILE *out = stdout;
    int rc = gpc_open(MSKV_CUDA_ATTN_AUTO, &cu), failures, stopped = 0;
    if (rc) return rc;
    /* on the compile-only device the comparisons mean nothing: their lines go nowhere */
    if (gpc_warm && (out = tmpfile()) == NULL) out = stdout;
    failures = gpc_run_store(cu, o->quick || o->mini ? 1 : gpc_warm ? 2 : 0, out, gpc_warm ? NULL : gpc_json, &stopped, o->part, o->parts);
    if (out != stdout) fclose(out);
    gpc_jcheck("kvwrite", 0, failures, stopped);
    if (gpc_warm) failures = stopped;   /* only a failed call (a compile) counts there */
    else if (failures) printf("why: %d failure(s)%s\n", failures, stopped ? ", stopped at the first failed call" : "");
    gpc_close(cu);
    return failures ? 1 : 0;
}

/* the figures: each path's Wan chunk TFLOP/s (beside SDPA), decode and
   kv_write against the device copy measured in the same run */
static int gpc_stage_figures(const gpc_opts *o) {
    mskv_cuda *cu, *mma = NULL;
    mskv_cuda_info i;
    int rc = gpc_open(MSKV_CUDA_ATTN_AUTO, &cu);
    if (rc) return rc;
    gpc_info_get(cu, &i);
    if (i.wgmma && (rc = gpc_open(MSKV_CUDA_ATTN_MMA, &mma)) != 0) { gpc_close(cu); return rc; }
    rc = gb_figures(cu, mma, o->python, o->quick, o->mini);
    if (rc) printf("why: a figure could not be measured (a call failed: see above)\n");
    if (mma) gpc_close(mma);
    gpc_close(cu);
    return rc ? 1 : 0;
}

static const struct { const char *name; int (*run)(const gpc_opts *); } gpc_stages[] = {
    { "info", gpc_stage_info }, { "mma", gpc_stage_mma }, { "sm90a", gpc_stage_sm90a }, { "selftest", gpc_stage_selftest },
    { "kvwrite", gpc_stage_kvwrite }, { "figures", gpc_stage_figures } };
#define GPC_NSTAGES ((int)(sizeof gpc_stages / sizeof gpc_stages[0]))

#ifdef GPC_MOCK
/* tests/test_gpu_check.sh: GPU_CHECK_PLANT=crash:STAGE or hang:STAGE plants a
   fault (SIGSEGV) or a hang in that stage, nogpu a machine without one (the
   mock build only) */
static void gpc_plant(const char *stage) {
    const char *p = getenv("GPU_CHECK_PLANT");
    if (!p) return;
    if (strcmp(p, "nogpu") == 0) { printf("why: no usable GPU (planted)\n"); exit(77); }
    if (strncmp(p, "crash:", 6) == 0 && strcmp(p + 6, stage) == 0) { printf("planted fault in %s\n", stage); raise(SIGSEGV); }
    if (strncmp(p, "hang:", 5) == 0 && strcmp(p + 5, stage) == 0) { printf("planted hang in %s\n", stage); for (;;) sleep(1); }
}
#endif

static int gpc_usage(const char *argv0) {
    fprintf(stderr, "usage: %s [--stage NAME[,NAME...]] [--warm] [--quick] [--mini] [--python PYTHON] [--part K/N]\n"
                    "  stages: info mma sm90a selftest kvwrite figures (tests/gpu_check.sh runs each in its own process)\n"
                    "  --warm: run them on a compile-only sm_90 device (real NVRTC, nothing launched) to fill the\n"
                    "          disk cache with every variant they load (make gpu-warm)\n"
                    "  --part K/N: kvwrite's K-th of N shares of its kv_write cases (gpu-warm's two processes)\n"
                    "  no --stage: kvwrite only (the store checks), as before\n", argv0);
    return 2;
}

int main(int argc, char **argv) {
    gpc_opts o;
    const char *stages = NULL, *results = getenv("GPU_CHECK_RESULTS");
    char why[1024] = "";
    int i, rc = 0, ran = 0;
    clock_t t0 = clock();
    time_t w0 = time(NULL);
    /* a stage killed by its budget loses nothing it printed */
    setvbuf(stdout, NULL, _IOLBF, 0);
    memset(&o, 0, sizeof o);
    o.python = "python3";
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) o.quick = 1;
        else if (!strcmp(argv[i], "--mini")) o.mini = 1;
        else if (!strcmp(argv[i], "--warm")) gpc_warm = 1;
        else if (!strcmp(argv[i], "--stage") && i + 1 < argc) stages = argv[++i];
        else if (!strcmp(argv[i], "--python") && i + 1 < argc) o.python = argv[++i];
        else if (!strcmp(argv[i], "--part") && i + 1 < argc &&
                 sscanf(argv[++i], "%d/%d", &o.part, &o.parts) == 2 && o.parts > 0 && o.part >= 0 && o.part < o.parts) {}
        else return gpc_usage(argv[0]);
    }
#ifdef GPC_MOCK
    gpc_fn = gpw_functions(why, sizeof why);   /* the mock device (its NVRTC too: -DGPW_MOCK_NVRTC) */
#endif
    if (gpc_warm) {
        if ((gpc_fn = gpw_functions(why, sizeof why)) == NULL) {
            printf("gpu warm: FAIL: no NVRTC to compile with: %s\n", why);
            return 1;
        }
        gb_compile_only = 1;
        if (!stages) stages = "mma,sm90a,selftest,kvwrite,figures";
    } else if (results && *results && (gpc_json = fopen(results, "a")) == NULL) {
        fprintf(stderr, "gpu check: cannot append to %s\n", results);
        return 1;
    }
    gb_json = gpc_json;
    if (!stages) stages = "kvwrite";
    while (*stages) {
        size_t n = strcspn(stages, ",");
        int k, found = 0;
        for (k = 0; k < GPC_NSTAGES; k++)
            if (strlen(gpc_stages[k].name) == n && strncmp(gpc_stages[k].name, stages, n) == 0) {
                int s;
                double ts = gb_now();
                found = 1;
#ifdef GPC_MOCK
                gpc_plant(gpc_stages[k].name);
#endif
                gpc_compiles = gpc_disk_hits = 0;
                s = gpc_stages[k].run(&o);
                printf("jit           %s: %d compiled, %d from the disk cache (%s)\n", gpc_stages[k].name, gpc_compiles,
                       gpc_disk_hits, getenv("MSKV_CACHE_DIR") ? getenv("MSKV_CACHE_DIR") : "the default cache directory");
                if (gpc_json) {
                    fprintf(gpc_json, "{\"jit\":\"%s\",\"compiles\":%d,\"disk_hits\":%d}\n", gpc_stages[k].name, gpc_compiles,
                            gpc_disk_hits);
                    fflush(gpc_json);
                }
                if (gpc_warm) {
                    printf("gpu warm: %-9s %s in %.1f s\n", gpc_stages[k].name, s == 0 ? "done" : s == 77 ? "skipped" : "FAILED",
                           gb_now() - ts);
                    if (s == 77) s = 0;
                }
                if (s && (rc == 0 || rc == 77)) rc = s;
                ran++;
            }
        if (!found) { fprintf(stderr, "gpu check: no stage \"%.*s\"\n", (int)n, stages); return gpc_usage(argv[0]); }
        stages += n;
        if (*stages == ',') stages++;
    }
    if (gpc_json) fclose(gpc_json);
    printf("gpu %s: %d stage%s, %s, %.1f s cpu, %ld s wall\n", gpc_warm ? "warm" : "check", ran, ran == 1 ? "" : "s",
           rc == 0 ? "passed" : rc == 77 ? "skipped" : "FAILED", (double)(clock() - t0) / CLOCKS_PER_SEC, (long)(time(NULL) - w0));
    return rc;
}
#endif
