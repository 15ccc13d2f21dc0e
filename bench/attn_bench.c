/* attn_bench: GFLOP/s of the CPU backend's paged attention, on one thread and
   on all of them, against a naive triple loop (per query and head: every
   score, softmax, weighted sum of V) over the same pages, measured in the
   same run. Where the naive loop would take too long, it runs on the first
   rows only and its time is scaled by rows (the line says so).

   Build and run:  make bench   (or: cc -std=c99 -O3 -march=native bench/attn_bench.c -lpthread -lm)
   FLOPs count 4 * head_dim per (query head, visible key): Q.K and P.V.
   "cores busy" is process CPU time over wall time during the all-thread run:
   on a shared machine it shows how many cores the threads actually got. */
#define _POSIX_C_SOURCE 200809L
#define MSTAR_KV_IMPLEMENTATION
#include "../mstar_kv.h"
#include <stdio.h>
#include <time.h>
#include <unistd.h>

static double ab_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t ab_state = 0x243f6a8885a308d3ull;
static float ab_rand(void) { /* xorshift64*, uniform in [-1, 1) */
    ab_state ^= ab_state >> 12; ab_state ^= ab_state << 25; ab_state ^= ab_state >> 27;
    return (float)((ab_state * 0x2545f4914f6cdd1dull) >> 40) / 8388608.0f - 1.0f;
}

/* Processor time of the whole process (all threads): how many cores a run really got. */
static double ab_cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct ab_shape {
    const char *name;
    int32_t batch, qo, kv, q_heads, kv_heads, dim, page_size;
    mskv_dtype dtype;
    mskv_mask mask;
} ab_shape;

typedef struct ab_case {
    mskv_pools pools;
    mskv_plan plan;
    void *k, *v, *q;
    float *o, *lse;
    int32_t *qo_indptr, *kv_indptr, *indices, *last, *kv_len, *split, *shift;
} ab_case;

static int ab_setup(const ab_shape *s, ab_case *c) {
    int32_t pages_per = (s->kv + s->page_size - 1) / s->page_size, b, i;
    int64_t num_pages = (int64_t)s->batch * pages_per + 1, n, e;
    size_t es = mskv_dtype_size(s->dtype);
    memset(c, 0, sizeof(*c));
    n = num_pages * s->page_size * s->kv_heads * s->dim;
    c->k = malloc((size_t)n * es);
    c->v = malloc((size_t)n * es);
    e = (int64_t)s->batch * s->qo * s->q_heads * s->dim;
    c->q = malloc((size_t)e * es);
    c->o = (float *)malloc((size_t)e * 4);
    c->lse = (float *)malloc((size_t)s->batch * s->qo * s->q_heads * 4);
    c->qo_indptr = (int32_t *)malloc(sizeof(int32_t) * (size_t)(s->batch + 1));
    c->kv_indptr = (int32_t *)malloc(sizeof(int32_t) * (size_t)(s->batch + 1));
    c->indices = (int32_t *)malloc(sizeof(int32_t) * (size_t)(num_pages));
    c->last = (int32_t *)malloc(sizeof(int32_t) * (size_t)s->batch * 4);
    if (!c->k || !c->v || !c->q || !c->o || !c->lse || !c->qo_indptr || !c->kv_indptr || !c->indices || !c->last) return 0;
    c->kv_len = c->last + s->batch;
    c->split = c->kv_len + s->batch;
    c->shift = c->split + s->batch;
    for (i = 0; i < n; i++) {
        if (s->dtype == MSKV_DTYPE_F32) { ((float *)c->k)[i] = ab_rand(); ((float *)c->v)[i] = ab_rand(); }
        else if (s->dtype == MSKV_DTYPE_BF16) { ((uint16_t *)c->k)[i] = mskv_f32_to_bf16(ab_rand()); ((uint16_t *)c->v)[i] = mskv_f32_to_bf16(ab_rand()); }
        else { ((uint16_t *)c->k)[i] = mskv_f32_to_f16(ab_rand()); ((uint16_t *)c->v)[i] = mskv_f32_to_f16(ab_rand()); }
    }
    for (i = 0; i < e; i++) {
        float x = 2.0f * ab_rand();
        if (s->dtype == MSKV_DTYPE_F32) ((float *)c->q)[i] = x;
        else if (s->dtype == MSKV_DTYPE_BF16) ((uint16_t *)c->q)[i] = mskv_f32_to_bf16(x);
        else ((uint16_t *)c->q)[i] = mskv_f32_to_f16(x);
    }
    /* pages interleaved across sequences, as a busy arena hands them out */
    c->qo_indptr[0] = c->kv_indptr[0] = 0;
    for (b = 0; b < s->batch; b++) {
        for (i = 0; i < pages_per; i++) c->indices[b * pages_per + i] = 1 + i * s->batch + b;
        c->qo_indptr[b + 1] = c->qo_indptr[b] + s->qo;
        c->kv_indptr[b + 1] = c->kv_indptr[b] + pages_per;
        c->last[b] = s->kv - (pages_per - 1) * s->page_size;
        c->kv_len[b] = s->kv;
        c->split[b] = s->kv;
        c->shift[b] = 0;
    }
    c->plan.batch = s->batch;
    c->plan.total_q = s->batch * s->qo;
    c->plan.num_page_ids = s->batch * pages_per;
    c->plan.page_size = s->page_size;
    c->plan.qo_indptr = c->qo_indptr;
    c->plan.kv_indptr = c->kv_indptr;
    c->plan.kv_indices = c->indices;
    c->plan.kv_last_page_len = c->last;
    c->plan.kv_len = c->kv_len;
    c->plan.kv_pos_split = c->split;
    c->plan.kv_pos_shift = c->shift;
    c->pools.k = c->k; c->pools.v = c->v; c->pools.dtype = s->dtype;
    c->pools.num_pages = (int32_t)num_pages; c->pools.page_size = s->page_size;
    c->pools.kv_heads = s->kv_heads; c->pools.head_dim = s->dim;
    return 1;
}

static void ab_free(ab_case *c) {
    free(c->k); free(c->v); free(c->q); free(c->o); free(c->lse);
    free(c->qo_indptr); free(c->kv_indptr); free(c->indices); free(c->last);
}

static float ab_get(const void *p, mskv_dtype t, size_t i) {
    if (t == MSKV_DTYPE_F32) return ((const float *)p)[i];
    if (t == MSKV_DTYPE_BF16) return mskv_bf16_to_f32(((const uint16_t *)p)[i]);
    return mskv_f16_to_f32(((const uint16_t *)p)[i]);
}

/* The naive loop over the first `rows` (query, head) rows, in row-major order;
   bidirectional only (the shapes here are). Output f32 into out. */
static void ab_naive(const ab_shape *s, const ab_case *c, int64_t rows, float *out, float *scores) {
    int64_t r;
    int32_t D = s->dim, P = s->page_size, group = s->q_heads / s->kv_heads;
    float scale = 1.0f / sqrtf((float)D);
    for (r = 0; r < rows; r++) {
        int64_t tok = r / s->q_heads;
        int32_t h = (int32_t)(r % s->q_heads), b = (int32_t)(tok / s->qo), g = h / group, j, d;
        const int32_t *pages = c->indices + c->kv_indptr[b];
        float mx = -INFINITY, sum = 0.0f, *o = out + r * D;
        for (j = 0; j < s->kv; j++) {
            size_t el = (((size_t)pages[j / P] * P + (size_t)(j % P)) * (size_t)s->kv_heads + (size_t)g) * (size_t)D;
            float dot = 0.0f;
            for (d = 0; d < D; d++) dot += ab_get(c->q, s->dtype, (size_t)r * D + d) * ab_get(c->k, s->dtype, el + d);
            scores[j] = dot * scale;
            if (scores[j] > mx) mx = scores[j];
        }
        for (d = 0; d < D; d++) o[d] = 0.0f;
        for (j = 0; j < s->kv; j++) {
            size_t el = (((size_t)pages[j / P] * P + (size_t)(j % P)) * (size_t)s->kv_heads + (size_t)g) * (size_t)D;
            float p = expf(scores[j] - mx);
            sum += p;
            for (d = 0; d < D; d++) o[d] += p * ab_get(c->v, s->dtype, el + d);
        }
        for (d = 0; d < D; d++) o[d] /= sum;
    }
}

/* Best seconds per call over repeats lasting at least min_s in all. */
static double ab_time_attention(mskv_cpu *cpu, const ab_shape *s, ab_case *c, double min_s) {
    mskv_attn at;
    double best = 1e30, t0 = ab_now();
    int reps = 0;
    memset(&at, 0, sizeof at);
    at.q_heads = s->q_heads; at.mask = s->mask; at.q_dtype = s->dtype;
    while (reps < 2 || ab_now() - t0 < min_s) {
        double t = ab_now(), dt;
        mskv_result r = mskv_cpu_attention_pools(cpu, &c->pools, &c->plan, &at, c->q, c->o, c->lse);
        dt = ab_now() - t;
        if (r != MSKV_SUCCESS) { fprintf(stderr, "attention failed: %s\n", mskv_result_string(r)); return -1; }
        if (dt < best) best = dt;
        reps++;
    }
    return best;
}

int main(void) {
    static const ab_shape shapes[] = {
        {"video  d64   1 head,   720 q x 3840 k", 1, 720, 3840, 1, 1, 64, 16, MSKV_DTYPE_BF16, MSKV_MASK_NONE},
        {"video  d128  GQA 4:2, 1560 q x 4680 k", 1, 1560, 4680, 4, 2, 128, 40, MSKV_DTYPE_BF16, MSKV_MASK_NONE},
        {"decode d128  GQA 32:8, 64 seq x 1 q x 4096 k", 64, 1, 4096, 32, 8, 128, 16, MSKV_DTYPE_BF16, MSKV_MASK_NONE},
    };
    long nproc = sysconf(_SC_NPROCESSORS_ONLN);
    int32_t threads = nproc > 0 ? (int32_t)nproc : 1;
    size_t si;
    printf("attn_bench: paged attention, bf16 storage and Q/O, f32 accumulation; %d threads available\n", (int)threads);
    printf("%-46s %8s %10s %10s %10s\n", "shape", "threads", "ms/call", "GFLOP/s", "x naive");
    for (si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const ab_shape *s = &shapes[si];
        ab_case c;
        mskv_cpu *one = NULL, *all = NULL;
        mskv_cpu_desc cd;
        int64_t rows = (int64_t)s->batch * s->qo * s->q_heads, naive_rows;
        double flops = 4.0 * (double)rows * (double)s->kv * (double)s->dim, t_naive, t1, tn, maxdiff = 0;
        double cpu0, w0, util;
        float *naive_o, *scores;
        int64_t i;
        if (!ab_setup(s, &c)) { fprintf(stderr, "out of memory\n"); return 1; }
        memset(&cd, 0, sizeof cd);
        cd.num_threads = 1;
        if (mskv_cpu_create(&cd, &one) != MSKV_SUCCESS) return 1;
        cd.num_threads = threads;
        if (mskv_cpu_create(&cd, &all) != MSKV_SUCCESS) return 1;
        /* naive: about 1/16 of the rows at most, never fewer than q_heads */
        naive_rows = rows / 16 > s->q_heads ? rows / 16 : (rows < s->q_heads ? rows : s->q_heads);
        naive_o = (float *)malloc((size_t)naive_rows * (size_t)s->dim * 4);
        scores = (float *)malloc((size_t)s->kv * 4);
        if (!naive_o || !scores) return 1;
        {   /* best of repeats lasting at least half a second */
            double t0 = ab_now(), best = 1e30;
            int reps = 0;
            while (reps < 2 || ab_now() - t0 < 0.5) {
                double t = ab_now();
                ab_naive(s, &c, naive_rows, naive_o, scores);
                t = ab_now() - t;
                if (t < best) best = t;
                reps++;
            }
            t_naive = best * (double)rows / (double)naive_rows;
        }
        t1 = ab_time_attention(one, s, &c, 1.0);
        /* the all-thread run leaves its output in c.o: compare with the naive rows */
        cpu0 = ab_cpu_now();
        w0 = ab_now();
        tn = ab_time_attention(all, s, &c, 1.0);
        util = (ab_cpu_now() - cpu0) / (ab_now() - w0);
        if (t1 < 0 || tn < 0) return 1;
        for (i = 0; i < naive_rows * s->dim; i++) {
            double d = fabs((double)naive_o[i] - (double)ab_get(c.o, s->dtype, (size_t)i));
            if (d > maxdiff) maxdiff = d;
        }
        printf("%-46s %8s %10.1f %10.2f %10s   (naive timed on %lld of %lld rows, scaled)\n", s->name, "naive",
               t_naive * 1e3, flops / t_naive * 1e-9, "1.0", (long long)naive_rows, (long long)rows);
        printf("%-46s %8d %10.2f %10.2f %9.1fx\n", "", 1, t1 * 1e3, flops / t1 * 1e-9, t_naive / t1);
        printf("%-46s %8d %10.2f %10.2f %9.1fx   cores busy %.2f; max |blocked - naive| %.2g\n", "", (int)threads,
               tn * 1e3, flops / tn * 1e-9, t_naive / tn, util, maxdiff);
        if (threads > 1 && util < 0.75 * (double)threads)
            printf("%-46s %8s   (the threads got %.2f of %d cores: the machine is busy, the all-thread figure is low)\n", "",
                   "", util, (int)threads);
        free(naive_o); free(scores);
        mskv_cpu_destroy(one);
        mskv_cpu_destroy(all);
        ab_free(&c);
    }
    return 0;
}
