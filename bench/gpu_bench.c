/* gpu_bench: the GPU kernels' figures, each printed beside its peer measured
   in the same run, and (--check) their correctness against the CPU backend.

   Figures (one line each):
     copy      device copy bandwidth, cuMemcpyDtoD (bytes read + written / s): the peer of every GB/s figure
     chunk     video chunk attention: bf16, head_dim 128, 12 heads, 4,680 queries x 32,760 keys,
               non-causal, page size 16 and 40: TFLOP/s, and the ratio to PyTorch's
               scaled_dot_product_attention on the same shape with contiguous K/V (bench/sdpa_peer.py,
               fastest backend); targets >= 300 TFLOP/s and >= 0.8x
     decode    64 requests x 4,096 keys, 32 q / 8 kv heads, head_dim 128, page 16: K/V bytes read / s
               as a fraction of copy bandwidth (target >= 80%); one request of 65,536 keys (split-KV,
               target >= 60%)
     kv_write  a 4,680-token chunk (12 kv heads, head_dim 128, bf16): bytes read + written / s as a
               fraction of copy bandwidth (target >= 75%)
     latency   one small decode call (1 request, 1 query, 512 keys), launched and synchronised one at
               a time (target <= 10 us)
   FLOPs count 4 * head_dim per (query head, key) pair: Q.K and P.V.
   On compute capability 9.0 the prefill check and the chunk figure run for
   both kernels: the sm_90a one (mskv_attn_sm90, wgmma; goals >= 550 TFLOP/s
   and >= 1.0x SDPA) on the default context, mskv_attn (mma.sync) on a second
   context forced to it. Lines say which ran ([wgmma], [mma.sync]); a 9.0
   device where the sm_90a kernel did not compile or load fails the run.

   --check: every attention variant (bf16/f16, head_dim 64/128/256, prefill and decode layouts,
   split-KV) against mskv_cpu_attention_pools over page sizes {1, 16, 40, 64}, GQA {1, 4, 6, 8},
   kv lengths {0, P-1, P, P+1, 16384}, masks none/causal/window, shuffled page tables, unused pages
   filled with NaN; and two identical runs must give bit-identical bytes. Exit status 1 on a mismatch.

   With no option it runs the check without its 16k-key cases, then the
   figures; --check: the whole check only; --figures: the figures only.
   Exit status 1 on a mismatch or an error. tests/gpu_check.sh runs the
   same check and figures as separate stages of build/gpu_check
   (tests/gpu_check.c includes this file), each in its own process.

   Build (no CUDA needed to build; without a GPU it says so and exits 0):
       cc -std=c99 -O2 -Wall -Wextra -pedantic -Werror bench/gpu_bench.c -o build/gpu_bench -ldl -lpthread -lm
   Run: build/gpu_bench [--check | --figures] [--quick] [--mini] [--python python3]
   (--quick: fewer iterations, no 16k-key check cases; --mini: shapes and the
   check cut down to what tests/emu_cuda.cpp runs on the emulated device) */
#ifndef MSKV_GPU_BENCH_C
#define MSKV_GPU_BENCH_C   /* tests/gpu_check.c includes it too (its stages), and may be included beside this */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
/* GB_EMBEDDED: a test program that already holds both implementations
   includes this file (with GB_NO_MAIN) to run the check on an emulated device */
#ifndef GB_EMBEDDED
#define MSTAR_KV_IMPLEMENTATION
#endif
#include "../mstar_kv.h"
#ifndef GB_EMBEDDED
#define MSTAR_KV_CUDA_IMPLEMENTATION
#endif
#include "../mstar_kv_cuda.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__GNUC__) || defined(__clang__)
#define GB_MAYBE_UNUSED __attribute__((unused))
#else
#define GB_MAYBE_UNUSED
#endif

static double gb_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t gb_state = 0x9e3779b97f4a7c15ull;
static uint64_t gb_next(void) {
    gb_state ^= gb_state >> 12; gb_state ^= gb_state << 25; gb_state ^= gb_state >> 27;
    return gb_state * 0x2545f4914f6cdd1dull;
}
static float gb_rand(void) { return (float)(gb_next() >> 40) / 8388608.0f - 1.0f; }

static uint16_t gb_half(mskv_dtype t, float x) { return t == MSKV_DTYPE_F16 ? mskv_f32_to_f16(x) : mskv_f32_to_bf16(x); }
static float gb_float(mskv_dtype t, uint16_t h) { return t == MSKV_DTYPE_F16 ? mskv_f16_to_f32(h) : mskv_bf16_to_f32(h); }

/* Set by tests/gpu_check.c (its stages and its warm step):
     gb_json          every figure also as a JSON line here (NULL: none)
     gb_compile_only  gpu_check --warm: the device runs nothing (a compile-only
                      table), so the check skips the CPU oracle and its
                      comparisons, and the figures their peers: the same
                      launches, hence the same kernel variants, are asked for
   gb_check leaves its counts in gb_cases / gb_failed, and gb_cuda_error = 1
   when it stopped at a call that failed (not a mismatch: those go on). */
static FILE *gb_json;
static int gb_compile_only, gb_cases, gb_failed, gb_cuda_error;

/* {"figure":name,"value":v,"unit":u,"peer":p,"ratio":r} (peer/ratio null when 0) */
static void gb_figure(const char *name, double value, const char *unit, double peer, double ratio) {
    char ps[48] = "null", rs[48] = "null";
    if (!gb_json) return;
    if (peer > 0) snprintf(ps, sizeof(ps), "%.6g", peer);
    if (ratio > 0) snprintf(rs, sizeof(rs), "%.6g", ratio);
    fprintf(gb_json, "{\"figure\":\"%s\",\"value\":%.6g,\"unit\":\"%s\",\"peer\":%s,\"ratio\":%s}\n", name, value, unit, ps, rs);
    fflush(gb_json);
}

static int gb_fail(mskv_cuda *cu, const char *what, mskv_result r) {
    fprintf(stderr, "gpu_bench: %s: %s (%s)\n", what, mskv_result_string(r), cu ? mskv_cuda_last_error(cu) : "");
    return 1;
}

/* A problem on the device: a store of one layer, pools filled (NaN bytes
   where no token lives), a plan (host and device), q, o, lse. */
typedef struct gb_problem {
    mskv_cuda_store *st;
    mskv_dtype dtype;
    int32_t page_size, kv_heads, q_heads, head_dim, num_pages;
    mskv_plan plan;
    mskv_cuda_dplan dplan;
    int32_t *arrays;           /* plan storage */
    uint16_t *hk, *hv, *hq;    /* host copies (for the oracle) */
    size_t pool_elems, q_elems;
    mskv_cu_ptr q, o, lse;
} gb_problem;

static void gb_problem_free(mskv_cuda *cu, gb_problem *p) {
    if (p->st) mskv_cuda_store_destroy(p->st);
    if (p->q) mskv_cuda_free(cu, p->q);
    if (p->o) mskv_cuda_free(cu, p->o);
    if (p->lse) mskv_cuda_free(cu, p->lse);
    free(p->arrays); free(p->hk); free(p->hv); free(p->hq);
    memset(p, 0, sizeof(*p));
}

/* segments b: qo[b] queries over kv[b] keys; pages handed out shuffled
   (shuffle != 0) or in order; positions split/shift as given (NULL: none). */
static mskv_result gb_problem_make(mskv_cuda *cu, gb_problem *p, mskv_dtype dtype, int32_t page_size, int32_t kv_heads,
                                   int32_t q_heads, int32_t head_dim, int32_t batch, const int32_t *qo, const int32_t *kv,
                                   const int32_t *split, const int32_t *shift, int shuffle, int keep_host) {
    mskv_cuda_store_desc sd;
    mskv_result r;
    int32_t b, n_ids = 0, total_q = 0, i, *ids;
    size_t slot_elems, n;
    memset(p, 0, sizeof(*p));
    for (b = 0; b < batch; b++) { n_ids += (kv[b] + page_size - 1) / page_size; total_q += qo[b]; }
    p->dtype = dtype; p->page_size = page_size; p->kv_heads = kv_heads; p->q_heads = q_heads; p->head_dim = head_dim;
    p->num_pages = n_ids + 3;  /* the null page and two spare pages stay NaN */
    memset(&sd, 0, sizeof(sd));
    sd.num_pages = p->num_pages; sd.page_size = page_size; sd.num_layers = 1; sd.kv_heads = kv_heads;
    sd.head_dim = head_dim; sd.dtype = dtype;
    sd.max_batch = batch > 64 ? batch : 64;
    sd.max_tokens = total_q > 16384 ? total_q : 16384;
    sd.max_page_ids = n_ids > 65536 ? n_ids : 65536;
    sd.staging_bytes = (size_t)1 << 20;  /* no offload here: keep the pinned staging small */
    if ((r = mskv_cuda_store_create(cu, &sd, &p->st)) != MSKV_SUCCESS) return r;
    p->arrays = (int32_t *)calloc((size_t)(6 * batch + 4 + n_ids + p->num_pages), sizeof(int32_t));
    if (!p->arrays) return MSKV_ERROR_OUT_OF_MEMORY;
    p->plan.batch = batch; p->plan.total_q = total_q; p->plan.num_page_ids = n_ids; p->plan.page_size = page_size;
    p->plan.qo_indptr = p->arrays;
    p->plan.kv_indptr = p->plan.qo_indptr + batch + 1;
    p->plan.kv_last_page_len = p->plan.kv_indptr + batch + 1;
    p->plan.kv_len = p->plan.kv_last_page_len + batch;
    p->plan.kv_pos_split = p->plan.kv_len + batch;
    p->plan.kv_pos_shift = p->plan.kv_pos_split + batch;
    p->plan.kv_indices = p->plan.kv_pos_shift + batch;
    ids = p->plan.kv_indices + n_ids;
    for (i = 1; i < p->num_pages; i++) ids[i - 1] = i;
    if (shuffle)
        for (i = p->num_pages - 2; i > 0; i--) {
            int32_t j = (int32_t)(gb_next() % (uint64_t)(i + 1)), t = ids[i];
            ids[i] = ids[j]; ids[j] = t;
        }
    for (i = 0; i < n_ids; i++) p->plan.kv_indices[i] = ids[i];
    for (b = 0; b < batch; b++) {
        int32_t np = (kv[b] + page_size - 1) / page_size;
        p->plan.qo_indptr[b + 1] = p->plan.qo_indptr[b] + qo[b];
        p->plan.kv_indptr[b + 1] = p->plan.kv_indptr[b] + np;
        p->plan.kv_last_page_len[b] = np ? kv[b] - (np - 1) * page_size : 0;
        p->plan.kv_len[b] = kv[b];
        p->plan.kv_pos_split[b] = split ? split[b] : kv[b];
        p->plan.kv_pos_shift[b] = shift ? shift[b] : 0;
    }
    slot_elems = (size_t)kv_heads * (size_t)head_dim;
    p->pool_elems = (size_t)p->num_pages * (size_t)page_size * slot_elems;
    p->q_elems = (size_t)total_q * (size_t)q_heads * (size_t)head_dim;
    p->hk = (uint16_t *)malloc(p->pool_elems * 2);
    p->hv = (uint16_t *)malloc(p->pool_elems * 2);
    p->hq = (uint16_t *)malloc(p->q_elems * 2 + 2);
    if (!p->hk || !p->hv || !p->hq) return MSKV_ERROR_OUT_OF_MEMORY;
    memset(p->hk, 0xff, p->pool_elems * 2);
    memset(p->hv, 0xff, p->pool_elems * 2);
    for (b = 0; b < batch; b++) {
        int64_t j;
        for (j = 0; j < kv[b]; j++) {
            size_t slot = (size_t)p->plan.kv_indices[p->plan.kv_indptr[b] + j / page_size] * (size_t)page_size + (size_t)(j % page_size), e;
            for (e = 0; e < slot_elems; e++) {
                p->hk[slot * slot_elems + e] = gb_half(dtype, gb_rand());
                p->hv[slot * slot_elems + e] = gb_half(dtype, gb_rand());
            }
        }
    }
    for (n = 0; n < p->q_elems; n++) p->hq[n] = gb_half(dtype, 2.0f * gb_rand());
    if ((r = mskv_cuda_upload(p->st, mskv_cuda_store_pool(p->st, 0, 0), p->hk, p->pool_elems * 2)) != MSKV_SUCCESS) return r;
    if ((r = mskv_cuda_upload(p->st, mskv_cuda_store_pool(p->st, 0, 1), p->hv, p->pool_elems * 2)) != MSKV_SUCCESS) return r;
    if ((r = mskv_cuda_malloc(cu, p->q_elems * 2 + 16, &p->q)) != MSKV_SUCCESS) return r;
    if ((r = mskv_cuda_malloc(cu, p->q_elems * 2 + 16, &p->o)) != MSKV_SUCCESS) return r;
    if ((r = mskv_cuda_malloc(cu, (size_t)total_q * (size_t)q_heads * 4 + 16, &p->lse)) != MSKV_SUCCESS) return r;
    if (p->q_elems && (r = mskv_cuda_upload(p->st, p->q, p->hq, p->q_elems * 2)) != MSKV_SUCCESS) return r;
    if ((r = mskv_cuda_plan_upload(p->st, &p->plan, MSKV_POS_NONE, &p->dplan)) != MSKV_SUCCESS) return r;
    if (!keep_host) { free(p->hk); free(p->hv); free(p->hq); p->hk = p->hv = p->hq = NULL; }
    return MSKV_SUCCESS;
}

static mskv_result gb_attend(gb_problem *p, mskv_mask mask, int32_t window_left) {
    mskv_attn at;
    memset(&at, 0, sizeof(at));
    at.q_heads = p->q_heads; at.mask = mask; at.window_left = window_left; at.q_dtype = p->dtype;
    return mskv_cuda_attention(p->st, 0, &p->plan, &p->dplan, &at, p->q, p->o, p->lse);
}

/* seconds per call: warm up, then `iters` calls back to back */
static double gb_time_attend(gb_problem *p, int iters) {
    double t0;
    int i;
    if (gb_attend(p, MSKV_MASK_NONE, 0) != MSKV_SUCCESS || mskv_cuda_store_sync(p->st) != MSKV_SUCCESS) return -1;
    t0 = gb_now();
    for (i = 0; i < iters; i++)
        if (gb_attend(p, MSKV_MASK_NONE, 0) != MSKV_SUCCESS) return -1;
    if (mskv_cuda_store_sync(p->st) != MSKV_SUCCESS) return -1;
    return (gb_now() - t0) / iters;
}

/* >>figures ------------------------------------------------------------- */

/* The shapes of the figures; --mini shrinks them to what an emulated device
   runs (the code path is the same, the numbers mean nothing there). */
typedef struct gb_shapes {
    size_t copy_bytes;
    int32_t chunk_q, chunk_k, chunk_heads, dim;
    int32_t dec_batch, dec_keys, dec_long_keys, dec_q_heads, dec_kv_heads;
    int32_t write_tokens, write_heads, lat_keys;
    int iters_chunk, iters_dec, iters_write, iters_lat;
} gb_shapes;

static gb_shapes gb_shapes_of(int quick, int mini) {
    gb_shapes s;
    s.copy_bytes = mini ? (size_t)1 << 20 : (size_t)1 << 30;
    s.chunk_q = mini ? 70 : 4680; s.chunk_k = mini ? 300 : 32760; s.chunk_heads = mini ? 2 : 12;
    s.dim = mini ? 64 : 128;
    s.dec_batch = mini ? 3 : 64; s.dec_keys = mini ? 100 : 4096; s.dec_long_keys = mini ? 1500 : 65536;
    s.dec_q_heads = mini ? 8 : 32; s.dec_kv_heads = mini ? 2 : 8;
    s.write_tokens = mini ? 50 : 4680; s.write_heads = mini ? 2 : 12; s.lat_keys = mini ? 64 : 512;
    s.iters_chunk = mini ? 1 : quick ? 3 : 20;
    s.iters_dec = mini ? 1 : quick ? 10 : 100;
    s.iters_write = mini ? 1 : quick ? 10 : 100;
    s.iters_lat = mini ? 2 : quick ? 50 : 500;
    if (gb_compile_only && !mini) {
        /* the warm step: the figures' dtype, head_dim and head counts (what
           selects a variant), with allocations a compile-only device holds */
        s.copy_bytes = (size_t)1 << 20; s.dec_keys = 512; s.dec_long_keys = 16384;
        s.iters_chunk = s.iters_dec = s.iters_write = s.iters_lat = 1;
    }
    return s;
}

/* bytes read + written per second by cuMemcpyDtoD (0 on failure) */
static double gb_copy_bandwidth(mskv_cuda *cu, mskv_cuda_store *st, size_t bytes) {
    mskv_cu_ptr a = 0, b = 0;
    double t0, t = 0;
    int i;
    if (mskv_cuda_malloc(cu, bytes, &a) != MSKV_SUCCESS || mskv_cuda_malloc(cu, bytes, &b) != MSKV_SUCCESS) goto done;
    /* the driver table of the context: the public API has no raw device-to-device copy */
    if (cu->fn.cuMemcpyDtoDAsync(b, a, bytes, mskv_cuda_store_stream(st)) != MSKV_CU_SUCCESS) goto done;
    mskv_cuda_store_sync(st);
    t0 = gb_now();
    for (i = 0; i < 10; i++) cu->fn.cuMemcpyDtoDAsync(b, a, bytes, mskv_cuda_store_stream(st));
    mskv_cuda_store_sync(st);
    t = (gb_now() - t0) / 10;
done:
    if (a) mskv_cuda_free(cu, a);
    if (b) mskv_cuda_free(cu, b);
    return t > 0 ? 2.0 * (double)bytes / t : 0;
}

/* PyTorch SDPA TFLOP/s on the same shape, from bench/sdpa_peer.py; 0 when unavailable */
static double gb_sdpa_peer(const char *python, int nq, int nk, int heads, int dim) {
    char cmd[512], line[256];
    double tf = 0;
    FILE *f;
    snprintf(cmd, sizeof(cmd), "%s bench/sdpa_peer.py --q %d --k %d --heads %d --dim %d 2>&1", python, nq, nk, heads, dim);
    f = popen(cmd, "r");
    if (!f) return 0;
    while (fgets(line, sizeof(line), f)) {
        if (sscanf(line, "sdpa_tflops %lf", &tf) == 1) continue;
        fprintf(stderr, "  sdpa_peer: %s", line);
    }
    pclose(f);
    return tf;
}

/* Which kernel served prefill on this context (asked after it ran: a
   failed sm_90a compile turns AUTO to mma.sync). */
static const char *gb_path(mskv_cuda *cu) {
    mskv_cuda_info info;
    memset(&info, 0, sizeof(info));
    return mskv_cuda_info_get(cu, &info) == MSKV_SUCCESS && info.wgmma ? "wgmma" : "mma.sync";
}

/* chunk attention, video shape, non-causal, pages of 16 and 40 keys; peer: SDPA TFLOP/s (0: none) */
static int gb_chunk(mskv_cuda *cu, const gb_shapes *sh, double peer, int mini) {
    const int32_t page_sizes[2] = {16, 40};
    gb_problem p;
    mskv_result r;
    int32_t qo[1], kv[1];
    int ps;
    memset(&p, 0, sizeof(p));
    for (ps = 0; ps < 2; ps++) {
        double flops = 4.0 * sh->chunk_q * (double)sh->chunk_k * sh->chunk_heads * sh->dim, tf, t;
        const char *path, *goals;
        qo[0] = sh->chunk_q; kv[0] = sh->chunk_k;
        if ((r = gb_problem_make(cu, &p, MSKV_DTYPE_BF16, page_sizes[ps], sh->chunk_heads, sh->chunk_heads, sh->dim, 1, qo, kv,
                                 NULL, NULL, 1, 0)) != MSKV_SUCCESS)
            return gb_fail(cu, "chunk setup", r);
        t = gb_time_attend(&p, sh->iters_chunk);
        if (t < 0) return gb_fail(cu, "chunk attention", MSKV_ERROR_CUDA);
        tf = flops / t / 1e12;
        path = gb_path(cu);
        goals = strcmp(path, "wgmma") == 0 ? ">= 550, >= 1.0x" : ">= 300, >= 0.8x";
        if (peer > 0)
            printf("chunk     [%s] %d x %d keys, page %d: %.1f TFLOP/s (%.3f ms); SDPA %.1f TFLOP/s; ratio %.2fx (targets %s)\n",
                   path, sh->chunk_q, sh->chunk_k, page_sizes[ps], tf, t * 1e3, peer, tf / peer, goals);
        else
            printf("chunk     [%s] %d x %d keys, page %d: %.1f TFLOP/s (%.3f ms); SDPA peer unavailable%s (target >= %d)\n",
                   path, sh->chunk_q, sh->chunk_k, page_sizes[ps], tf, t * 1e3, mini ? " (--mini)" : " (see stderr)",
                   strcmp(path, "wgmma") == 0 ? 550 : 300);
        {
            char name[64];
            snprintf(name, sizeof(name), "chunk_%s_page%d", strcmp(path, "wgmma") == 0 ? "wgmma" : "mma", (int)page_sizes[ps]);
            gb_figure(name, tf, "TFLOP/s", peer, peer > 0 ? tf / peer : 0);
        }
        gb_problem_free(cu, &p);
    }
    return 0;
}

/* mma: a context forced to mma.sync on a device that runs the sm_90a kernel
   (its chunk figure beside the other path's), NULL when there is none */
static int gb_figures(mskv_cuda *cu, mskv_cuda *mma, const char *python, int quick, int mini) {
    const gb_shapes sh = gb_shapes_of(quick, mini);
    gb_problem p;
    mskv_result r;
    double copy, t;
    int32_t qo[64], kv[64], i;
    memset(&p, 0, sizeof(p));
    /* copy bandwidth (needs a store for its stream) */
    {
        int32_t one = 1;
        if ((r = gb_problem_make(cu, &p, MSKV_DTYPE_BF16, 16, 1, 1, sh.dim, 1, &one, &one, NULL, NULL, 0, 0)) != MSKV_SUCCESS)
            return gb_fail(cu, "setup", r);
        copy = gb_copy_bandwidth(cu, p.st, sh.copy_bytes);
        gb_problem_free(cu, &p);
        if (copy <= 0 && gb_compile_only) copy = 1;   /* nothing ran: no figure to mean anything */
        if (copy <= 0) { fprintf(stderr, "gpu_bench: copy bandwidth could not be measured\n"); return 1; }
        printf("copy      %.1f GB/s (cuMemcpyDtoD, bytes read + written)\n", copy / 1e9);
        gb_figure("copy_dtod", copy / 1e9, "GB/s", 0, 0);
    }
    /* chunk attention, video shape, non-causal: each path beside PyTorch SDPA */
    {
        double peer = mini || gb_compile_only ? 0 : gb_sdpa_peer(python, sh.chunk_q, sh.chunk_k, sh.chunk_heads, sh.dim);
        if (gb_chunk(cu, &sh, peer, mini) != 0) return 1;
        if (mma && gb_chunk(mma, &sh, peer, mini) != 0) return 1;
    }
    /* decode: a batch, then one long request (split-KV) */
    for (i = 0; i < 2; i++) {
        int32_t batch = i == 0 ? sh.dec_batch : 1, keys = i == 0 ? sh.dec_keys : sh.dec_long_keys, b;
        double bytes = 2.0 * batch * (double)keys * sh.dec_kv_heads * sh.dim * 2.0;  /* K and V */
        for (b = 0; b < batch; b++) { qo[b] = 1; kv[b] = keys; }
        if ((r = gb_problem_make(cu, &p, MSKV_DTYPE_BF16, 16, sh.dec_kv_heads, sh.dec_q_heads, sh.dim, batch, qo, kv,
                                 NULL, NULL, 1, 0)) != MSKV_SUCCESS)
            return gb_fail(cu, "decode setup", r);
        t = gb_time_attend(&p, sh.iters_dec);
        if (t < 0) return gb_fail(cu, "decode attention", MSKV_ERROR_CUDA);
        printf("decode    %d x %d keys: %.1f GB/s of K/V (%.1f us), %.0f%% of copy bandwidth (target >= %d%%)\n",
               batch, keys, bytes / t / 1e9, t * 1e6, 100.0 * bytes / t / copy, i == 0 ? 80 : 60);
        gb_figure(i == 0 ? "decode_batch" : "decode_long", bytes / t / 1e9, "GB/s", copy / 1e9, bytes / t / copy);
        gb_problem_free(cu, &p);
    }
    /* K/V write of a chunk */
    {
        const int32_t n = sh.write_tokens, heads = sh.write_heads, dim = sh.dim;
        size_t row_bytes = (size_t)heads * dim * 2, src_bytes = (size_t)n * row_bytes;
        int64_t *slots = (int64_t *)malloc((size_t)n * 8);
        mskv_cu_ptr dk = 0, dv = 0;
        mskv_cuda_dplan dp;
        mskv_plan plan;
        int it;
        qo[0] = 1; kv[0] = n + 16;
        if (!slots) return 1;
        if ((r = gb_problem_make(cu, &p, MSKV_DTYPE_BF16, 16, heads, heads, dim, 1, qo, kv, NULL, NULL, 1, 0)) != MSKV_SUCCESS)
            return gb_fail(cu, "kv_write setup", r);
        for (i = 0; i < n; i++) slots[i] = (int64_t)p.plan.kv_indices[i / 16] * 16 + i % 16;
        memset(&plan, 0, sizeof(plan));
        plan.total_q = n; plan.page_size = 16; plan.slot_mapping = slots;
        if ((r = mskv_cuda_malloc(cu, src_bytes, &dk)) != MSKV_SUCCESS || (r = mskv_cuda_malloc(cu, src_bytes, &dv)) != MSKV_SUCCESS ||
            (r = mskv_cuda_plan_upload(p.st, &plan, MSKV_POS_NONE, &dp)) != MSKV_SUCCESS ||
            (r = mskv_cuda_write_kv(p.st, 0, &dp, dk, dv, NULL)) != MSKV_SUCCESS)
            return gb_fail(cu, "kv_write setup", r);
        mskv_cuda_store_sync(p.st);
        t = gb_now();
        for (it = 0; it < sh.iters_write; it++) mskv_cuda_write_kv(p.st, 0, &dp, dk, dv, NULL);
        mskv_cuda_store_sync(p.st);
        t = (gb_now() - t) / sh.iters_write;
        printf("kv_write  %d tokens: %.1f GB/s (%.1f us), %.0f%% of copy bandwidth (target >= 75%%)\n",
               n, 4.0 * (double)src_bytes / t / 1e9, t * 1e6, 100.0 * 4.0 * (double)src_bytes / t / copy);
        gb_figure("kv_write_chunk", 4.0 * (double)src_bytes / t / 1e9, "GB/s", copy / 1e9, 4.0 * (double)src_bytes / t / copy);
        mskv_cuda_free(cu, dk); mskv_cuda_free(cu, dv); free(slots);
        gb_problem_free(cu, &p);
    }
    /* latency of a small decode call, synchronised one at a time */
    {
        int it;
        double best = 1e9;
        qo[0] = 1; kv[0] = sh.lat_keys;
        if ((r = gb_problem_make(cu, &p, MSKV_DTYPE_BF16, 16, sh.dec_kv_heads, sh.dec_q_heads, sh.dim, 1, qo, kv, NULL, NULL, 1, 0)) != MSKV_SUCCESS)
            return gb_fail(cu, "latency setup", r);
        if ((r = gb_attend(&p, MSKV_MASK_NONE, 0)) != MSKV_SUCCESS) return gb_fail(cu, "latency", r);
        mskv_cuda_store_sync(p.st);
        t = gb_now();
        for (it = 0; it < sh.iters_lat; it++) {
            double t1 = gb_now();
            gb_attend(&p, MSKV_MASK_NONE, 0);
            mskv_cuda_store_sync(p.st);
            t1 = gb_now() - t1;
            if (t1 < best) best = t1;
        }
        t = (gb_now() - t) / sh.iters_lat;
        printf("latency   decode 1 x %d keys: %.1f us mean, %.1f us best, launch + sync (target <= 10 us)\n",
               sh.lat_keys, t * 1e6, best * 1e6);
        gb_figure("decode_latency", t * 1e6, "us", 0, 0);
        gb_problem_free(cu, &p);
    }
    return 0;
}

/* >>check --------------------------------------------------------------- */

/* The same problem as dense K/V (mskv_cuda_attention_dense): every
   segment's keys gathered into one device buffer, rows one after another,
   under the plan without its page table. The same keys in the same tiles:
   o and lse bit-identical to the paged run's (o1, l1). The paged plan is
   uploaded again after. Returns 1 when identical, 0 when not, -1 when a
   call failed. */
static int gb_dense_same(mskv_cuda *cu, gb_problem *p, mskv_mask mask, int32_t window_left, const uint16_t *o1,
                         const float *l1, size_t n, size_t rows, const char *what) {
    const size_t slot = (size_t)p->kv_heads * (size_t)p->head_dim;
    const int32_t batch = p->plan.batch, P = p->page_size;
    int64_t *tok = (int64_t *)calloc((size_t)batch + 1, sizeof(int64_t));
    int32_t *zero = (int32_t *)calloc((size_t)batch + 1, sizeof(int32_t));
    uint16_t *hk = NULL, *hv = NULL, *o2 = (uint16_t *)malloc(n * 2 + 2);
    float *l2 = (float *)malloc(rows * 4 + 4);
    mskv_cu_ptr dk = 0, dv = 0;
    mskv_plan dense = p->plan;
    mskv_cuda_dplan dp;
    mskv_dense_kv kv;
    mskv_attn at;
    mskv_result r = MSKV_ERROR_OUT_OF_MEMORY;
    int32_t b, j, ok = 0;
    if (!tok || !zero || !o2 || !l2) goto done;
    for (b = 0; b < batch; b++) tok[b + 1] = tok[b] + p->plan.kv_len[b];
    hk = (uint16_t *)malloc((size_t)tok[batch] * slot * 2 + 16);
    hv = (uint16_t *)malloc((size_t)tok[batch] * slot * 2 + 16);
    if (!hk || !hv) goto done;
    for (b = 0; b < batch; b++)
        for (j = 0; j < p->plan.kv_len[b]; j++) {
            size_t at_slot = (size_t)p->plan.kv_indices[p->plan.kv_indptr[b] + j / P] * (size_t)P + (size_t)(j % P);
            memcpy(hk + (size_t)(tok[b] + j) * slot, p->hk + at_slot * slot, slot * 2);
            memcpy(hv + (size_t)(tok[b] + j) * slot, p->hv + at_slot * slot, slot * 2);
        }
    dense.num_page_ids = 0; dense.kv_indptr = zero; dense.kv_indices = NULL; dense.kv_last_page_len = zero;
    dense.kv_token_indptr = tok;
    memset(&kv, 0, sizeof kv);
    kv.dtype = p->dtype; kv.kv_heads = p->kv_heads; kv.head_dim = p->head_dim; kv.tokens = tok[batch]; kv.device = 1;
    memset(&at, 0, sizeof(at));
    at.q_heads = p->q_heads; at.mask = mask; at.window_left = window_left; at.q_dtype = p->dtype;
    if ((r = mskv_cuda_malloc(cu, (size_t)tok[batch] * slot * 2 + 16, &dk)) != MSKV_SUCCESS ||
        (r = mskv_cuda_malloc(cu, (size_t)tok[batch] * slot * 2 + 16, &dv)) != MSKV_SUCCESS ||
        (tok[batch] && (r = mskv_cuda_upload(p->st, dk, hk, (size_t)tok[batch] * slot * 2)) != MSKV_SUCCESS) ||
        (tok[batch] && (r = mskv_cuda_upload(p->st, dv, hv, (size_t)tok[batch] * slot * 2)) != MSKV_SUCCESS))
        goto done;
    kv.k = (const void *)(uintptr_t)dk; kv.v = (const void *)(uintptr_t)dv;
    if ((r = mskv_cuda_plan_upload(p->st, &dense, MSKV_POS_NONE, &dp)) != MSKV_SUCCESS ||
        (r = mskv_cuda_attention_dense(p->st, &kv, &dense, &dp, &at, p->q, p->o, p->lse)) != MSKV_SUCCESS ||
        (r = mskv_cuda_download(p->st, o2, p->o, n * 2)) != MSKV_SUCCESS ||
        (r = mskv_cuda_download(p->st, l2, p->lse, rows * 4)) != MSKV_SUCCESS)
        goto done;
    ok = gb_compile_only || (memcmp(o1, o2, n * 2) == 0 && memcmp(l1, l2, rows * 4) == 0);
    if (!ok) printf("FAIL %s: dense K/V (mskv_cuda_attention_dense) differs from the paged run\n", what);
done:
    if (r != MSKV_SUCCESS) { gb_fail(cu, what, r); ok = -1; }
    if (mskv_cuda_plan_upload(p->st, &p->plan, MSKV_POS_NONE, &p->dplan) != MSKV_SUCCESS) ok = -1;
    if (dk) mskv_cuda_free(cu, dk);
    if (dv) mskv_cuda_free(cu, dv);
    free(tok); free(zero); free(hk); free(hv); free(o2); free(l2);
    return ok;
}

/* One case on the device and on the CPU backend; returns 1 when they agree
   and two device runs are bit-identical, 0 on a mismatch, -1 when a call
   failed (the sweep stops there: after a CUDA error the context is gone). */
static int gb_check_case(mskv_cuda *cu, mskv_cpu *cpu, mskv_dtype dtype, int32_t dim, int32_t P, int32_t kv_heads,
                         int32_t group, int32_t batch, const int32_t *qo, const int32_t *kv, const int32_t *split,
                         const int32_t *shift, mskv_mask mask, int32_t window_left, const char *what) {
    gb_problem p;
    mskv_pools pools;
    mskv_attn at;
    mskv_result r;
    uint16_t *o1 = NULL, *o2 = NULL, *ref = NULL;
    float *l1 = NULL, *l2 = NULL, *lref = NULL;
    size_t n, rows, i;
    double oe = 0, le = 0, tol = dtype == MSKV_DTYPE_F16 ? 4e-3 : 2.5e-2;
    int ok = 0;
    if ((r = gb_problem_make(cu, &p, dtype, P, kv_heads, kv_heads * group, dim, batch, qo, kv, split, shift, 1, 1)) != MSKV_SUCCESS) {
        gb_fail(cu, what, r);
        gb_problem_free(cu, &p);
        return -1;
    }
    n = p.q_elems; rows = (size_t)p.plan.total_q * (size_t)p.q_heads;
    o1 = (uint16_t *)malloc(n * 2 + 2); o2 = (uint16_t *)malloc(n * 2 + 2); ref = (uint16_t *)malloc(n * 2 + 2);
    l1 = (float *)malloc(rows * 4 + 4); l2 = (float *)malloc(rows * 4 + 4); lref = (float *)malloc(rows * 4 + 4);
    ok = -1;   /* until the calls below succeed */
    if (!o1 || !o2 || !ref || !l1 || !l2 || !lref) goto done;
    pools.k = p.hk; pools.v = p.hv; pools.dtype = dtype; pools.num_pages = p.num_pages; pools.page_size = P;
    pools.kv_heads = kv_heads; pools.head_dim = dim;
    memset(&at, 0, sizeof(at));
    at.q_heads = p.q_heads; at.mask = mask; at.window_left = window_left; at.q_dtype = dtype;
    if (!gb_compile_only && (r = mskv_cpu_attention_pools(cpu, &pools, &p.plan, &at, p.hq, ref, lref)) != MSKV_SUCCESS) {
        gb_fail(NULL, "cpu oracle", r);
        goto done;
    }
    if ((r = gb_attend(&p, mask, window_left)) != MSKV_SUCCESS ||
        (r = mskv_cuda_download(p.st, o1, p.o, n * 2)) != MSKV_SUCCESS ||
        (r = mskv_cuda_download(p.st, l1, p.lse, rows * 4)) != MSKV_SUCCESS ||
        (r = gb_attend(&p, mask, window_left)) != MSKV_SUCCESS ||
        (r = mskv_cuda_download(p.st, o2, p.o, n * 2)) != MSKV_SUCCESS ||
        (r = mskv_cuda_download(p.st, l2, p.lse, rows * 4)) != MSKV_SUCCESS) { gb_fail(cu, what, r); goto done; }
    ok = 0;
    if (!gb_compile_only && (memcmp(o1, o2, n * 2) != 0 || memcmp(l1, l2, rows * 4) != 0)) {
        printf("FAIL %s: two identical runs differ\n", what);
        goto done;
    }
    if ((ok = gb_dense_same(cu, &p, mask, window_left, o1, l1, n, rows, what)) != 1) goto done;
    if (gb_compile_only) goto done;   /* ok: nothing ran to compare */
    for (i = 0; i < rows; i++) {
        size_t d;
        if (isinf(lref[i])) { if (!(isinf(l1[i]) && l1[i] < 0)) le = 1e9; }
        else le = fmax(le, isfinite(l1[i]) ? fabs((double)l1[i] - lref[i]) : 1e9);
        for (d = 0; d < (size_t)dim; d++) {
            double a = gb_float(dtype, o1[i * dim + d]), b = gb_float(dtype, ref[i * dim + d]);
            oe = fmax(oe, isfinite(a) ? fabs(a - b) : 1e9);
        }
    }
    ok = oe <= tol && le <= 2e-3;
    if (!ok) printf("FAIL %s: o err %.3g (tol %.3g), lse err %.3g\n", what, oe, tol, le);
done:
    free(o1); free(o2); free(ref); free(l1); free(l2); free(lref);
    gb_problem_free(cu, &p);
    return ok;
}

/* mini: the sweep cut to bf16, head_dim 64, page sizes 1 and 16, GQA 1 and 4,
   short sequences (what an emulated device runs in a second or two) */
static int gb_check(mskv_cuda *cu, int quick, int mini, int prefill_only) {
    const int32_t Ps[4] = {1, 16, 40, 64}, groups[4] = {1, 4, 6, 8}, dims[3] = {64, 128, 256};
    const mskv_dtype dtypes[2] = {MSKV_DTYPE_BF16, MSKV_DTYPE_F16};
    const int n_dtypes = mini ? 1 : 2, n_dims = mini ? 1 : 3, n_ps = mini ? 2 : 4, n_groups = mini ? 2 : 4;
    mskv_cpu *cpu = NULL;
    mskv_cpu_desc cd;
    int cases = 0, failed = 0, stop = 0, di, ti, pi, gi, li, m, qi, rc;
    memset(&cd, 0, sizeof(cd));
    cd.num_threads = 8;
    if (mskv_cpu_create(&cd, &cpu) != MSKV_SUCCESS) cpu = NULL;
    for (ti = 0; ti < n_dtypes && !stop; ti++)
        for (di = 0; di < n_dims && !stop; di++)
            for (pi = 0; pi < n_ps && !stop; pi++)
                for (gi = 0; gi < n_groups && !stop; gi++) {
                    const int32_t P = Ps[pi], lens[5] = {0, P - 1, P, P + 1, 16384};
                    for (li = 0; li < 5 && !stop; li++) {
                        int32_t kv = lens[li];
                        if ((quick || mini) && li == 4) continue;
                        for (m = 0; m < 3 && !stop; m++)
                            for (qi = 0; qi < 2 && !stop; qi++) {  /* decode (1 query) and prefill (up to 300 queries) */
                                char what[160];
                                int32_t qcap = mini ? 24 : li == 4 ? 64 : 300;  /* the CPU oracle's time at 16k keys */
                                int32_t qo = qi == 0 ? 1 : (kv < qcap ? kv : qcap), split = kv / 3, shift = m ? 1000 : 0;
                                if (kv == 0 && m) continue;      /* masked queries need a position */
                                if (kv == 0) qo = qi == 0 ? 1 : 7;
                                if (di == 2 && li == 4 && qi == 1) continue;  /* keep the 256 sweep short */
                                if (prefill_only && qi == 0) continue;
                                snprintf(what, sizeof(what), "%s d%d P=%d gqa %d kv %d mask %d qo %d",
                                         ti ? "f16" : "bf16", dims[di], P, groups[gi], kv, m, qo);
                                cases++;
                                rc = gb_check_case(cu, cpu, dtypes[ti], dims[di], P, 2, groups[gi], 1, &qo, &kv, &split, &shift,
                                                   (mskv_mask)m, 37, what);
                                if (rc != 1) failed++;
                                if (rc < 0) stop = 1;   /* a failed call, not a mismatch: stop here */
                            }
                    }
                }
    /* a batch of uneven segments (split-KV decides per batch) */
    if (!prefill_only && !stop) {
        int32_t qo[5] = {1, 1, 1, 1, 1}, kv[5] = {16384, 1, 2, 4095, 700}, split[5] = {100, 1, 1, 4000, 699}, shift[5] = {7, 0, 0, 3, 9};
        if (mini) { kv[0] = 300; kv[3] = 95; split[3] = 90; }
        cases++;
        rc = gb_check_case(cu, cpu, MSKV_DTYPE_BF16, mini ? 64 : 128, 16, mini ? 2 : 8, 4, 5, qo, kv, split, shift,
                           MSKV_MASK_CAUSAL, 0, "bf16 decode batch");
        if (rc != 1) failed++;
        if (rc < 0) stop = 1;
    }
    if (cpu) mskv_cpu_destroy(cpu);
    printf("check     [%s%s] %d cases, %d failed%s (attention vs CPU backend, bit-identical reruns, dense K/V = paged)\n", gb_path(cu),
           prefill_only ? ", prefill" : " prefill, mma.sync decode", cases, failed,
           stop ? "; stopped at the first failed call" : "");
    gb_cases = cases; gb_failed = failed; gb_cuda_error = stop;
    return failed ? 1 : 0;
}

/* fn: an injected driver/NVRTC table (tests), NULL = the real libraries */
GB_MAYBE_UNUSED static int gb_main(int argc, char **argv, const mskv_cuda_functions *fn) {
    mskv_cuda_desc desc;
    mskv_cuda *cu = NULL, *mma = NULL;
    mskv_cuda_info info;
    mskv_result r;
    char why[1024];
    const char *python = "python3";
    int check = 0, quick = 0, mini = 0, i, rc;
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--check")) check = 1;
        else if (!strcmp(argv[i], "--figures")) check = 2;
        else if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--mini")) mini = 1;
        else if (!strcmp(argv[i], "--python") && i + 1 < argc) python = argv[++i];
        else { fprintf(stderr, "usage: %s [--check | --figures] [--quick] [--mini] [--python python3]\n", argv[0]); return 2; }
    }
    memset(&desc, 0, sizeof(desc));
    desc.functions = fn;
    desc.disable_disk_cache = fn != NULL;
    /* the sweep checks every case against the CPU itself: a variant's
       self-test failing would stop it at that call (MSKV_ERROR_CUDA) and
       hide the mismatch it reports (the GPU check's selftest stage runs it) */
    desc.selftest = MSKV_CUDA_SELFTEST_OFF;
    if (mskv_cuda_probe(&desc, why, sizeof(why)) != MSKV_SUCCESS) {
        printf("gpu_bench: no usable GPU, nothing measured (%s)\n", why);
        return 0;
    }
    if ((r = mskv_cuda_create(&desc, &cu)) != MSKV_SUCCESS) return gb_fail(NULL, "mskv_cuda_create", r);
    mskv_cuda_info_get(cu, &info);
    printf("device    %s, sm_%d, %d SMs, driver %d, NVRTC %d\n", info.name, info.arch, info.multiprocessors,
           info.driver_version, info.nvrtc_version);
    /* default (what tests/gpu_check.sh runs): the quick correctness sweep, then the figures;
       where the sm_90a kernel runs (compute capability 9.0), the mma.sync kernel too, forced
       on a second context: its prefill check and its chunk figure */
    rc = 0;
    if (info.wgmma) {
        mskv_cuda_desc md = desc;
        md.attn_path = MSKV_CUDA_ATTN_MMA;
        if ((r = mskv_cuda_create(&md, &mma)) != MSKV_SUCCESS) { mskv_cuda_destroy(cu); return gb_fail(NULL, "mskv_cuda_create (mma.sync)", r); }
    }
    if (check != 2) {
        double t0 = gb_now();
        rc = gb_check(cu, quick || !check, mini, 0);
        if (mma && gb_check(mma, quick || !check, mini, 1) != 0) rc = 1;
        printf("check     took %.1f s\n", gb_now() - t0);
    }
    if (check != 1 && gb_figures(cu, mma, python, quick, mini) != 0) rc = 1;
    if (info.wgmma && strcmp(gb_path(cu), "wgmma") != 0) {
        /* compute capability 9.0 should run the sm_90a kernel: its failure is in the log */
        printf("FAIL path: the sm_90a kernel did not compile or load on this device (mma.sync ran instead)\n");
        rc = 1;
    }
    if (mma) mskv_cuda_destroy(mma);
    mskv_cuda_destroy(cu);
    return rc;
}

#ifndef GB_NO_MAIN
int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);   /* a timeout loses nothing printed */
    return gb_main(argc, argv, NULL);
}
#endif
#endif /* MSKV_GPU_BENCH_C */
