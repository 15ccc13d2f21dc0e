/* The CPU backend: half conversions, RoPE, K/V write, paged attention and
   the LSE merge, each against a separate dense reference in double precision
   that gathers K/V by absolute position (not through the page table). The
   attention tests run once more on every instruction-set path this machine
   has (the per-path tests at the end). */
#if !defined(_WIN32) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L  /* setenv */
#endif
#include <stdlib.h>
#include "mskv_test.h"
#include "mskv_test_util.h"
#include "../mstar_kv.h"

#define TCPU_LONG 2048 /* the longest sequence of the sweeps (cheap enough under ASan too) */

/* ---- helpers ---------------------------------------------------------------- */

static uint64_t tcpu_rng_state;
static void tcpu_srand(uint64_t s) { tcpu_rng_state = s ^ 0x9e3779b97f4a7c15ull; }
static uint64_t tcpu_rand(void) { /* splitmix64 */
    uint64_t z = (tcpu_rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double tcpu_uniform(double lo, double hi) { return lo + (hi - lo) * (double)(tcpu_rand() >> 11) / 9007199254740992.0; }

static size_t tcpu_esize(mskv_dtype t) { return t == MSKV_DTYPE_F32 ? 4 : 2; }

/* The value dtype t stores for x, and the element i of a buffer of dtype t. */
static double tcpu_round(mskv_dtype t, double x) {
    if (t == MSKV_DTYPE_F16) return mskv_f16_to_f32(mskv_f32_to_f16((float)x));
    if (t == MSKV_DTYPE_BF16) return mskv_bf16_to_f32(mskv_f32_to_bf16((float)x));
    return (float)x;
}
static void tcpu_put(void *buf, mskv_dtype t, size_t i, double x) {
    if (t == MSKV_DTYPE_F32) ((float *)buf)[i] = (float)x;
    else if (t == MSKV_DTYPE_F16) ((uint16_t *)buf)[i] = mskv_f32_to_f16((float)x);
    else ((uint16_t *)buf)[i] = mskv_f32_to_bf16((float)x);
}
static double tcpu_get(const void *buf, mskv_dtype t, size_t i) {
    if (t == MSKV_DTYPE_F32) return ((const float *)buf)[i];
    if (t == MSKV_DTYPE_F16) return mskv_f16_to_f32(((const uint16_t *)buf)[i]);
    return mskv_bf16_to_f32(((const uint16_t *)buf)[i]);
}
static double tcpu_tol(mskv_dtype t) { return t == MSKV_DTYPE_F32 ? 1e-5 : t == MSKV_DTYPE_F16 ? 1e-3 : 1e-2; }

/* ---- the instruction-set path under test ---------------------------------------- */

/* AUTO, except while the per-path runs at the end of this file repeat the
   attention tests on one path: every pool the tests create takes tcpu_isa,
   and a test's NULL pool becomes tcpu_small, a one-thread pool with the
   smallest tiles on that path (a NULL pool itself always runs AUTO). */
static mskv_cpu_isa tcpu_isa = MSKV_CPU_ISA_AUTO;
static mskv_cpu *tcpu_small = NULL;
static mskv_cpu *tcpu_pool(mskv_cpu *cpu) { return cpu ? cpu : tcpu_small; }
static mskv_result tcpu_create(const mskv_cpu_desc *cd, mskv_cpu **out) {
    mskv_cpu_desc d;
    if (cd) d = *cd; else memset(&d, 0, sizeof d);
    d.isa = tcpu_isa;
    return mskv_cpu_create(&d, out);
}

/* ---- a hand-built paged fixture ------------------------------------------------- */

typedef struct tcpu_seq { int32_t qo, kv, split, shift; } tcpu_seq;

#define TCPU_MAX_SEQS 16

/* Pools, a plan over them, and the same K/V densely by absolute position. */
typedef struct tcpu_fix {
    int32_t P, kvh, D, num_pages, batch;
    mskv_dtype dt;
    void *k, *v;               /* pools [num_pages][P][kvh][D] */
    double *kd, *vd;           /* per sequence [abs pos][kvh][D], rounded to dt */
    int64_t dense_at[TCPU_MAX_SEQS];
    tcpu_seq seq[TCPU_MAX_SEQS];
    mskv_plan plan;
    int32_t qo_indptr[TCPU_MAX_SEQS + 1], kv_indptr[TCPU_MAX_SEQS + 1], last[TCPU_MAX_SEQS], kv_len[TCPU_MAX_SEQS];
    int32_t split[TCPU_MAX_SEQS], shift[TCPU_MAX_SEQS];
    int32_t *indices;
    /* optional plan arrays (tcpu_fix_qpos, tcpu_fix_bounds): explicit query positions, visibility bounds */
    int32_t *qpos;
    int32_t vse[TCPU_MAX_SEQS], vws[TCPU_MAX_SEQS];
    int64_t tok[TCPU_MAX_SEQS + 1];  /* kv_token_indptr: the dense form's rows (tcpu_dense) */
} tcpu_fix;

static int64_t tcpu_kpos(const tcpu_seq *s, int64_t j) { return j < s->split ? j : j + s->shift; }

/* shuffle: the page table is a random permutation of the pool (fragmented);
   else pages are handed out in order. Unused slots hold NaN when nan_fill. */
static int tcpu_fix_init(tcpu_fix *f, int32_t P, int32_t kvh, int32_t D, mskv_dtype dt, const tcpu_seq *seqs,
                         int32_t batch, int shuffle, int nan_fill, int32_t spare_pages, uint64_t seed) {
    int32_t b, i, total_pages = 0, at = 0, *perm;
    int64_t dense_rows = 0, j;
    size_t e;
    size_t es = tcpu_esize(dt), row = (size_t)kvh * (size_t)D, pool_elems;
    memset(f, 0, sizeof(*f));
    f->P = P; f->kvh = kvh; f->D = D; f->dt = dt; f->batch = batch;
    for (b = 0; b < batch; b++) {
        f->seq[b] = seqs[b];
        total_pages += (seqs[b].kv + P - 1) / P;
        f->dense_at[b] = dense_rows;
        dense_rows += seqs[b].kv + seqs[b].shift;
    }
    f->num_pages = total_pages + 1 + spare_pages;
    pool_elems = (size_t)f->num_pages * (size_t)P * row;
    f->k = malloc(pool_elems * es);
    f->v = malloc(pool_elems * es);
    f->kd = (double *)malloc(((size_t)dense_rows * row + 1) * sizeof(double));
    f->vd = (double *)malloc(((size_t)dense_rows * row + 1) * sizeof(double));
    f->indices = (int32_t *)malloc(((size_t)total_pages + 1) * sizeof(int32_t));
    perm = (int32_t *)malloc((size_t)f->num_pages * sizeof(int32_t));
    if (!f->k || !f->v || !f->kd || !f->vd || !f->indices || !perm) { free(perm); return 0; }
    for (e = 0; e < pool_elems; e++) {
        tcpu_put(f->k, dt, e, nan_fill ? NAN : 0.0);
        tcpu_put(f->v, dt, e, nan_fill ? NAN : 0.0);
    }
    /* dense data first, from its own seed, so page placement does not change it */
    tcpu_srand(seed);
    for (j = 0; j < dense_rows * (int64_t)row; j++) {
        f->kd[j] = tcpu_round(dt, tcpu_uniform(-1.0, 1.0));
        f->vd[j] = tcpu_round(dt, tcpu_uniform(-1.0, 1.0));
    }
    for (i = 0; i < f->num_pages - 1; i++) perm[i] = i + 1;
    tcpu_srand(seed * 31 + 7);
    if (shuffle)
        for (i = f->num_pages - 2; i > 0; i--) {
            int32_t r = (int32_t)(tcpu_rand() % (uint64_t)(i + 1)), t = perm[i];
            perm[i] = perm[r]; perm[r] = t;
        }
    f->qo_indptr[0] = f->kv_indptr[0] = 0;
    for (b = 0; b < batch; b++) {
        const tcpu_seq *s = &f->seq[b];
        int32_t np = (s->kv + P - 1) / P;
        for (i = 0; i < np; i++) f->indices[f->kv_indptr[b] + i] = perm[at++];
        f->kv_indptr[b + 1] = f->kv_indptr[b] + np;
        f->qo_indptr[b + 1] = f->qo_indptr[b] + s->qo;
        f->last[b] = np ? s->kv - (np - 1) * P : 0;
        f->kv_len[b] = s->kv;
        f->split[b] = s->split;
        f->shift[b] = s->shift;
        for (j = 0; j < s->kv; j++) {
            int64_t slot = (int64_t)f->indices[f->kv_indptr[b] + j / P] * P + j % P;
            const double *kr = f->kd + (size_t)(f->dense_at[b] + tcpu_kpos(s, j)) * row;
            const double *vr = f->vd + (size_t)(f->dense_at[b] + tcpu_kpos(s, j)) * row;
            for (i = 0; i < (int32_t)row; i++) {
                tcpu_put(f->k, dt, (size_t)slot * row + (size_t)i, kr[i]);
                tcpu_put(f->v, dt, (size_t)slot * row + (size_t)i, vr[i]);
            }
        }
    }
    free(perm);
    f->plan.batch = batch;
    f->plan.total_q = f->qo_indptr[batch];
    f->plan.num_page_ids = total_pages;
    f->plan.page_size = P;
    f->plan.qo_indptr = f->qo_indptr;
    f->plan.kv_indptr = f->kv_indptr;
    f->plan.kv_indices = f->indices;
    f->plan.kv_last_page_len = f->last;
    f->plan.kv_len = f->kv_len;
    f->plan.kv_pos_split = f->split;
    f->plan.kv_pos_shift = f->shift;
    return 1;
}

static void tcpu_fix_free(tcpu_fix *f) {
    free(f->k); free(f->v); free(f->kd); free(f->vd); free(f->indices); free(f->qpos);
}

/* Gives the plan explicit query positions (all at the tail rule's; the test edits them). */
static int tcpu_fix_qpos(tcpu_fix *f) {
    int32_t b, i;
    f->qpos = (int32_t *)malloc(((size_t)f->plan.total_q + 1) * sizeof(int32_t));
    if (!f->qpos) return 0;
    for (b = 0; b < f->batch; b++)
        for (i = 0; i < f->seq[b].qo; i++)
            f->qpos[f->qo_indptr[b] + i] = (int32_t)tcpu_kpos(&f->seq[b], (int64_t)f->seq[b].kv - f->seq[b].qo + i);
    f->plan.q_pos = f->qpos;
    f->plan.features |= MSKV_PLAN_Q_POS;
    return 1;
}

/* Gives the plan visibility bounds: sequence b sees positions p < se[b] and p >= ws[b]. */
static void tcpu_fix_bounds(tcpu_fix *f, const int32_t *se, const int32_t *ws) {
    int32_t b;
    for (b = 0; b < f->batch; b++) { f->vse[b] = se[b]; f->vws[b] = ws[b]; }
    f->plan.vis_sink_end = f->vse;
    f->plan.vis_window_start = f->vws;
    f->plan.features |= MSKV_PLAN_VISIBILITY;
}

static mskv_pools tcpu_pools(const tcpu_fix *f) {
    mskv_pools p;
    p.k = f->k; p.v = f->v; p.dtype = f->dt;
    p.num_pages = f->num_pages; p.page_size = f->P; p.kv_heads = f->kvh; p.head_dim = f->D;
    return p;
}

/* Random queries [total_q][qh][D] in dtype qt (amplitude 2 so softmax is peaked). */
static void *tcpu_queries(const tcpu_fix *f, int32_t qh, mskv_dtype qt, uint64_t seed) {
    size_t n = (size_t)f->plan.total_q * (size_t)qh * (size_t)f->D, i;
    void *q = malloc(n * tcpu_esize(qt) + 4);
    if (!q) return NULL;
    tcpu_srand(seed ^ 0x51ull);
    for (i = 0; i < n; i++) tcpu_put(q, qt, i, tcpu_uniform(-2.0, 2.0));
    return q;
}

/* Whether the query at qp sees the key at pos (absolute positions), as the
   mskv_plan comment defines it: the plan's bounds, then the mask. */
static int tcpu_sees(const tcpu_fix *f, const mskv_attn *at, int32_t b, int64_t qp, int64_t pos) {
    if (f->plan.vis_sink_end && !(pos < f->plan.vis_sink_end[b] || pos >= f->plan.vis_window_start[b])) return 0;
    if (at->mask != MSKV_MASK_NONE && pos > qp) return 0;
    if (at->mask == MSKV_MASK_WINDOW && qp - pos > at->window_left) return 0;
    return 1;
}

/* The dense reference: for each query, keys are the present absolute
   positions [0, split) and [split + shift, kv + shift), read from kd/vd;
   queries at the plan's q_pos when it has them, else the tail's. */
static void tcpu_reference(const tcpu_fix *f, const mskv_attn *at, const void *q, double *o, double *lse) {
    int32_t b, i, h, d, D = f->D, group = at->q_heads / f->kvh;
    double scale = at->scale > 0 ? at->scale : 1.0 / sqrt((double)D);
    size_t row = (size_t)f->kvh * (size_t)D;
    int32_t maxkv = 0;
    double *w;
    for (b = 0; b < f->batch; b++) maxkv = f->seq[b].kv > maxkv ? f->seq[b].kv : maxkv;
    w = (double *)malloc(((size_t)maxkv + 1) * sizeof(double));
    if (!w) return;
    for (b = 0; b < f->batch; b++) {
        const tcpu_seq *s = &f->seq[b];
        int32_t split = s->split < s->kv ? s->split : s->kv;
        for (i = 0; i < s->qo; i++) {
            int64_t qp = f->plan.q_pos ? f->plan.q_pos[f->qo_indptr[b] + i] : tcpu_kpos(s, (int64_t)s->kv - s->qo + i);
            for (h = 0; h < at->q_heads; h++) {
                size_t qrow = ((size_t)(f->qo_indptr[b] + i) * (size_t)at->q_heads + (size_t)h);
                double mx = -INFINITY, sum = 0;
                int32_t n = 0, t, g = h / group;
                int64_t pos;
                /* visible positions, in order */
                for (t = 0; t < 2; t++) {
                    int64_t p0 = t == 0 ? 0 : (int64_t)split + s->shift, p1 = t == 0 ? split : (int64_t)s->kv + s->shift;
                    for (pos = p0; pos < p1; pos++) {
                        const double *kr = f->kd + (size_t)(f->dense_at[b] + pos) * row + (size_t)g * D;
                        double dot = 0;
                        if (!tcpu_sees(f, at, b, qp, pos)) continue;
                        for (d = 0; d < D; d++) dot += tcpu_get(q, at->q_dtype, qrow * (size_t)D + (size_t)d) * kr[d];
                        w[n] = dot * scale;
                        if (w[n] > mx) mx = w[n];
                        n++;
                    }
                }
                for (d = 0; d < D; d++) o[qrow * (size_t)D + (size_t)d] = 0;
                if (n == 0) { lse[qrow] = -INFINITY; continue; }
                n = 0;
                for (t = 0; t < 2; t++) {
                    int64_t p0 = t == 0 ? 0 : (int64_t)split + s->shift, p1 = t == 0 ? split : (int64_t)s->kv + s->shift;
                    for (pos = p0; pos < p1; pos++) {
                        const double *vr = f->vd + (size_t)(f->dense_at[b] + pos) * row + (size_t)g * D;
                        double e;
                        if (!tcpu_sees(f, at, b, qp, pos)) continue;
                        e = exp(w[n++] - mx);
                        sum += e;
                        for (d = 0; d < D; d++) o[qrow * (size_t)D + (size_t)d] += e * vr[d];
                    }
                }
                for (d = 0; d < D; d++) o[qrow * (size_t)D + (size_t)d] /= sum;
                lse[qrow] = mx + log(sum);
            }
        }
    }
    free(w);
}

/* |x - ref| <= tol * max(1, |ref|) everywhere; reports the first miss. */
static int tcpu_close(const char *what, const void *o, mskv_dtype ot, const float *lse, const double *ro,
                      const double *rlse, size_t rows, int32_t D, double tol, int line) {
    size_t r, i;
    for (r = 0; r < rows; r++) {
        if (lse) {
            double a = lse[r], e = rlse[r];
            int ok = (e == -INFINITY) ? (a == -INFINITY) : fabs(a - e) <= tol * (fabs(e) > 1 ? fabs(e) : 1);
            if (!ok) {
                mt_fail(__FILE__, line, "%s (%s path): lse row %zu: expected %.9g, got %.9g", what, mskv_cpu_isa_name(tcpu_isa), r, e, a);
                return 0;
            }
        }
        for (i = 0; i < (size_t)D; i++) {
            double a = tcpu_get(o, ot, r * (size_t)D + i), e = ro[r * (size_t)D + i];
            if (!(fabs(a - e) <= tol * (fabs(e) > 1 ? fabs(e) : 1))) {
                mt_fail(__FILE__, line, "%s (%s path): o row %zu dim %zu: expected %.9g, got %.9g", what, mskv_cpu_isa_name(tcpu_isa), r, i, e, a);
                return 0;
            }
        }
    }
    return 1;
}

/* Runs attention on the fixture and compares with the reference. */
static int tcpu_check_case(const char *what, mskv_cpu *cpu, const tcpu_fix *f, const mskv_attn *at, uint64_t seed, int line) {
    size_t rows = (size_t)f->plan.total_q * (size_t)at->q_heads, n = rows * (size_t)f->D;
    void *q = tcpu_queries(f, at->q_heads, at->q_dtype, seed);
    void *o = malloc(n * tcpu_esize(at->q_dtype) + 4);
    float *lse = (float *)malloc(rows * sizeof(float) + 4);
    double *ro = (double *)malloc(n * sizeof(double) + 8), *rl = (double *)malloc(rows * sizeof(double) + 8);
    mskv_pools pools = tcpu_pools(f);
    mskv_result res;
    int ok = 0;
    if (q && o && lse && ro && rl) {
        res = mskv_cpu_attention_pools(tcpu_pool(cpu), &pools, &f->plan, at, q, o, lse);
        if (res != MSKV_SUCCESS) {
            mt_fail(__FILE__, line, "%s: attention returned %d (%s)", what, (int)res, mskv_result_string(res));
        } else {
            tcpu_reference(f, at, q, ro, rl);
            ok = tcpu_close(what, o, at->q_dtype, lse, ro, rl, rows, f->D, tcpu_tol(f->dt) > tcpu_tol(at->q_dtype) ? tcpu_tol(f->dt) : tcpu_tol(at->q_dtype), line);
        }
    } else {
        mt_fail(__FILE__, line, "%s: out of memory", what);
    }
    free(q); free(o); free(lse); free(ro); free(rl);
    return ok;
}

static mskv_attn tcpu_attn(int32_t qh, mskv_mask mask, int32_t wl, mskv_dtype qt) {
    mskv_attn a;
    memset(&a, 0, sizeof a);
    a.q_heads = qh; a.mask = mask; a.window_left = wl; a.q_dtype = qt;
    return a;
}

static const char *tcpu_mask_name(mskv_mask m) { return m == MSKV_MASK_NONE ? "none" : m == MSKV_MASK_CAUSAL ? "causal" : "window"; }

/* ---- conversions ---------------------------------------------------------------- */

static double tcpu_f16_value(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e ? ldexp(1.0 + m / 1024.0, e - 15) : ldexp((double)m, -24);
    return (h & 0x8000) ? -v : v;
}

/* Every rounding boundary of f16: for each pair of neighbours (subnormals
   included) the float just below their midpoint rounds down, just above
   rounds up, and the midpoint itself goes to the even one. */
TEST(f16_conversion_rounds_every_midpoint_to_nearest_even) {
    uint32_t h;
    int bad = 0;
    for (h = 0; h < 0x7bff; h++) {
        int sgn;
        for (sgn = 0; sgn < 2; sgn++) {
            uint16_t lo = (uint16_t)(h | (sgn ? 0x8000u : 0u)), hi = (uint16_t)((h + 1) | (sgn ? 0x8000u : 0u));
            float mid = (float)((tcpu_f16_value(lo) + tcpu_f16_value(hi)) / 2);  /* exact: 12 significant bits */
            float toward0 = nextafterf(mid, 0.0f), away = nextafterf(mid, sgn ? -INFINITY : INFINITY);
            uint16_t even = (h & 1) ? hi : lo;
            if (h == 0 && sgn == 0 && mskv_f32_to_f16(nextafterf(0.0f, 1.0f)) != 0) bad++;  /* tiniest float: 0 */
            bad += mskv_f32_to_f16(toward0) != lo;
            bad += mskv_f32_to_f16(away) != hi;
            bad += mskv_f32_to_f16(mid) != even;
        }
    }
    EXPECT_EQ(0, bad);
}

TEST(f16_conversion_rounds_to_nearest_even) {
    EXPECT_EQ(0x3c00, mskv_f32_to_f16(1.0f));
    EXPECT_EQ(0xc000, mskv_f32_to_f16(-2.0f));
    EXPECT_EQ(0x8000, mskv_f32_to_f16(-0.0f));
    EXPECT_EQ(0x7bff, mskv_f32_to_f16(65504.0f));
    EXPECT_EQ(0x7bff, mskv_f32_to_f16(65519.0f));
    EXPECT_EQ(0x7c00, mskv_f32_to_f16(65520.0f));           /* the tie rounds up to inf */
    EXPECT_EQ(0x7c00, mskv_f32_to_f16(INFINITY));
    EXPECT_EQ(0x3c00, mskv_f32_to_f16(1.0f + 1.0f / 2048)); /* tie: even mantissa stays */
    EXPECT_EQ(0x3c02, mskv_f32_to_f16(1.0f + 3.0f / 2048)); /* tie: odd mantissa rounds up */
    EXPECT_EQ(0x0001, mskv_f32_to_f16(ldexpf(1.0f, -24)));  /* smallest subnormal */
    EXPECT_EQ(0x0000, mskv_f32_to_f16(ldexpf(1.0f, -25)));  /* tie to even zero */
    EXPECT_EQ(0x0002, mskv_f32_to_f16(ldexpf(3.0f, -25)));  /* 1.5 units: tie to even 2 */
    EXPECT_EQ(0x0400, mskv_f32_to_f16(ldexpf(1.0f, -14)));  /* smallest normal */
    EXPECT_EQ(0x0400, mskv_f32_to_f16(ldexpf(1023.75f, -24))); /* rounds up across into the normals */
    EXPECT_TRUE((mskv_f32_to_f16(NAN) & 0x7fff) > 0x7c00);
}

TEST(f16_every_value_round_trips) {
    uint32_t h, bad = 0;
    for (h = 0; h < 0x10000; h++) {
        float f = mskv_f16_to_f32((uint16_t)h);
        if ((h & 0x7fff) > 0x7c00) { if (!isnan(f)) bad++; continue; }
        if (mskv_f32_to_f16(f) != h) bad++;
    }
    EXPECT_EQ(0, bad);
    EXPECT_NEAR(ldexp(1.0, -24), mskv_f16_to_f32(1), 0);
    EXPECT_NEAR(65504.0, mskv_f16_to_f32(0x7bff), 0);
}

TEST(bf16_conversion_rounds_to_nearest_even) {
    uint32_t h, bad = 0;
    EXPECT_EQ(0x3f80, mskv_f32_to_bf16(1.0f));
    EXPECT_EQ(0x3f80, mskv_f32_to_bf16(1.0f + 1.0f / 256)); /* tie, even stays */
    EXPECT_EQ(0x3f82, mskv_f32_to_bf16(1.0f + 3.0f / 256)); /* tie, odd rounds up */
    EXPECT_EQ(0x3f81, mskv_f32_to_bf16(1.0f + 1.0f / 256 + 1.0f / 65536));
    EXPECT_EQ(0x7f80, mskv_f32_to_bf16(INFINITY));
    EXPECT_TRUE(isnan(mskv_bf16_to_f32(mskv_f32_to_bf16(NAN))));
    for (h = 0; h < 0x10000; h++) {
        float f = mskv_bf16_to_f32((uint16_t)h);
        if ((h & 0x7fff) > 0x7f80) continue;
        if (mskv_f32_to_bf16(f) != h) bad++;
    }
    EXPECT_EQ(0, bad);
}

/* ---- RoPE ----------------------------------------------------------------------- */

/* The formula, written out: part k of width w at offset off, pair i turns by
   pos_k * theta^(-2i/w). */
static void tcpu_rope_direct(double *x, int32_t D, const int32_t *pos, int nparts, const int32_t *width, int interleaved, double theta) {
    int k, i, off = 0;
    (void)D;
    for (k = 0; k < nparts; k++) {
        int w = width[k];
        for (i = 0; i < w / 2; i++) {
            double ang = pos[k] * pow(theta, -2.0 * i / w), c = cos(ang), s = sin(ang);
            int e0 = off + (interleaved ? 2 * i : i), e1 = off + (interleaved ? 2 * i + 1 : i + w / 2);
            double a = x[e0], b = x[e1];
            x[e0] = a * c - b * s;
            x[e1] = a * s + b * c;
        }
        off += w;
    }
}

TEST(rope_matches_direct_formula) {
    /* (mode, style, theta, dims, expected widths) */
    struct { mskv_pos_mode mode; mskv_rope_style style; float theta; int32_t dims[3]; int32_t D; int np; int32_t w[3]; } cs[] = {
        {MSKV_POS_1D, MSKV_ROPE_HALF, 0, {0, 0, 0}, 64, 1, {64, 0, 0}},
        {MSKV_POS_1D, MSKV_ROPE_INTERLEAVED, 500000.0f, {0, 0, 0}, 128, 1, {128, 0, 0}},
        {MSKV_POS_1D, MSKV_ROPE_HALF, 10000.0f, {32, 0, 0}, 64, 1, {32, 0, 0}},
        {MSKV_POS_3D, MSKV_ROPE_HALF, 0, {0, 0, 0}, 128, 3, {44, 42, 42}},
        {MSKV_POS_3D, MSKV_ROPE_INTERLEAVED, 0, {0, 0, 0}, 64, 3, {24, 20, 20}},
        {MSKV_POS_3D, MSKV_ROPE_HALF, 256.0f, {16, 24, 16}, 64, 3, {16, 24, 16}},
    };
    int c, n = 5, heads = 3;
    uint64_t seed = mt_seed();
    for (c = 0; c < (int)(sizeof cs / sizeof cs[0]); c++) {
        mskv_rope r;
        int32_t D = cs[c].D, pos[15], t, h, d;
        float x[5 * 3 * 128];
        double ref[128];
        memset(&r, 0, sizeof r);
        r.mode = cs[c].mode; r.style = cs[c].style; r.theta = cs[c].theta;
        memcpy(r.dims, cs[c].dims, sizeof r.dims);
        tcpu_srand(seed + (uint64_t)c);
        for (t = 0; t < 15; t++) pos[t] = (int32_t)(tcpu_rand() % 5000);
        for (t = 0; t < n * heads * D; t++) x[t] = (float)tcpu_uniform(-1, 1);
        {
            float orig[5 * 3 * 128];
            memcpy(orig, x, sizeof(float) * (size_t)(n * heads * D));
            ASSERT_EQ(MSKV_SUCCESS, mskv_rope_apply(&r, x, MSKV_DTYPE_F32, n, heads, D, pos));
            for (t = 0; t < n; t++)
                for (h = 0; h < heads; h++) {
                    const int32_t *p = pos + (cs[c].mode == MSKV_POS_3D ? 3 * t : t);
                    for (d = 0; d < D; d++) ref[d] = orig[(t * heads + h) * D + d];
                    tcpu_rope_direct(ref, D, p, cs[c].np, cs[c].w, cs[c].style == MSKV_ROPE_INTERLEAVED, cs[c].theta > 0 ? cs[c].theta : 10000.0);
                    for (d = 0; d < D; d++)
                        if (fabs(ref[d] - x[(t * heads + h) * D + d]) > 1e-5) {
                            mt_fail(__FILE__, __LINE__, "case %d token %d head %d dim %d: expected %.8f got %.8f", c, t, h, d,
                                    ref[d], (double)x[(t * heads + h) * D + d]);
                            return;
                        }
                }
        }
    }
}

static double tcpu_dot_f(const float *a, const float *b, int n) {
    double s = 0;
    int i;
    for (i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

TEST(rope_dot_product_depends_only_on_position_difference) {
    mskv_rope r;
    float q[128], k[128], qa[128], ka[128], qb[128], kb[128];
    int32_t i, axis, D = 128;
    uint64_t seed = mt_seed();
    tcpu_srand(seed);
    for (i = 0; i < D; i++) { q[i] = (float)tcpu_uniform(-1, 1); k[i] = (float)tcpu_uniform(-1, 1); }
    memset(&r, 0, sizeof r);
    /* 1-D, both styles: (m, n) and (m + t, n + t) give the same q.k */
    for (i = 0; i < 2; i++) {
        int32_t pq = 37, pk = 5, pq2 = 37 + 1000, pk2 = 5 + 1000;
        r.mode = MSKV_POS_1D;
        r.style = i ? MSKV_ROPE_INTERLEAVED : MSKV_ROPE_HALF;
        memcpy(qa, q, sizeof q); memcpy(ka, k, sizeof k); memcpy(qb, q, sizeof q); memcpy(kb, k, sizeof k);
        ASSERT_EQ(MSKV_SUCCESS, mskv_rope_apply(&r, qa, MSKV_DTYPE_F32, 1, 1, D, &pq));
        ASSERT_EQ(MSKV_SUCCESS, mskv_rope_apply(&r, ka, MSKV_DTYPE_F32, 1, 1, D, &pk));
        ASSERT_EQ(MSKV_SUCCESS, mskv_rope_apply(&r, qb, MSKV_DTYPE_F32, 1, 1, D, &pq2));
        ASSERT_EQ(MSKV_SUCCESS, mskv_rope_apply(&r, kb, MSKV_DTYPE_F32, 1, 1, D, &pk2));
        EXPECT_NEAR(tcpu_dot_f(qa, ka, D), tcpu_dot_f(qb, kb, D), 1e-4);
        /* and other differences give other products (one nearby difference can
           match by chance for random q and k; several in a row cannot) */
        {
            double worst = 0;
            for (pk2 = 6 + 1000; pk2 <= 9 + 1000; pk2++) {
                double dev;
                memcpy(kb, k, sizeof k);
                ASSERT_EQ(MSKV_SUCCESS, mskv_rope_apply(&r, kb, MSKV_DTYPE_F32, 1, 1, D, &pk2));
                dev = fabs(tcpu_dot_f(qa, ka, D) - tcpu_dot_f(qb, kb, D));
                if (dev > worst) worst = dev;
            }
            EXPECT_TRUE(worst > 1e-2);
        }
    }
    /* 3-D: a shift along one axis for both leaves q.k unchanged, per axis */
    r.mode = MSKV_POS_3D;
    r.style = MSKV_ROPE_HALF;
    for (axis = 0; axis < 3; axis++) {
        int32_t pq[3] = {4, 7, 9}, pk[3] = {2, 3, 11}, pq2[3], pk2[3];
        memcpy(pq2, pq, sizeof pq); memcpy(pk2, pk, sizeof pk);
        pq2[axis] += 23; pk2[axis] += 23;
        memcpy(qa, q, sizeof q); memcpy(ka, k, sizeof k); memcpy(qb, q, sizeof q); memcpy(kb, k, sizeof k);
        ASSERT_EQ(MSKV_SUCCESS, mskv_rope_apply(&r, qa, MSKV_DTYPE_F32, 1, 1, D, pq));
        ASSERT_EQ(MSKV_SUCCESS, mskv_rope_apply(&r, ka, MSKV_DTYPE_F32, 1, 1, D, pk));
        ASSERT_EQ(MSKV_SUCCESS, mskv_rope_apply(&r, qb, MSKV_DTYPE_F32, 1, 1, D, pq2));
        ASSERT_EQ(MSKV_SUCCESS, mskv_rope_apply(&r, kb, MSKV_DTYPE_F32, 1, 1, D, pk2));
        EXPECT_NEAR(tcpu_dot_f(qa, ka, D), tcpu_dot_f(qb, kb, D), 1e-4);
        /* shifting only q along this axis changes it: each axis is really rotated */
        memcpy(qb, q, sizeof q);
        ASSERT_EQ(MSKV_SUCCESS, mskv_rope_apply(&r, qb, MSKV_DTYPE_F32, 1, 1, D, pq2));
        EXPECT_TRUE(fabs(tcpu_dot_f(qa, ka, D) - tcpu_dot_f(qb, ka, D)) > 1e-3);
    }
}

TEST(rope_rejects_odd_or_oversized_parts) {
    mskv_rope r;
    float x[64] = {0};
    int32_t pos[3] = {1, 2, 3};
    memset(&r, 0, sizeof r);
    r.mode = MSKV_POS_3D;
    r.dims[0] = 30; r.dims[1] = 20; r.dims[2] = 20; /* 70 > 64 */
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_rope_apply(&r, x, MSKV_DTYPE_F32, 1, 1, 64, pos));
    r.dims[0] = 21; r.dims[1] = 20; r.dims[2] = 20;
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_rope_apply(&r, x, MSKV_DTYPE_F32, 1, 1, 64, pos));
    r.mode = MSKV_POS_NONE;
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_rope_apply(&r, x, MSKV_DTYPE_F32, 1, 1, 64, pos));
    r.mode = MSKV_POS_1D;
    r.dims[0] = 0;
    EXPECT_EQ(MSKV_ERROR_NULL_POINTER, mskv_rope_apply(&r, x, MSKV_DTYPE_F32, 1, 1, 64, NULL));
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_rope_apply(&r, x, MSKV_DTYPE_F32, 1, 1, MSKV_CPU_MAX_HEAD_DIM + 2, pos));
}

/* ---- K/V write ------------------------------------------------------------------- */

/* A pool of 6 pages of 4 slots, 2 kv heads, dim 8, and a plan of n slots. */
typedef struct tcpu_wfix {
    float k[6 * 4 * 2 * 8], v[6 * 4 * 2 * 8];
    int64_t slots[8];
    int32_t positions[24];
    mskv_plan plan;
    mskv_pools pools;
} tcpu_wfix;

static void tcpu_wfix_init(tcpu_wfix *w, const int64_t *slots, int32_t n) {
    int32_t i;
    memset(w, 0, sizeof(*w));
    for (i = 0; i < 6 * 4 * 2 * 8; i++) { w->k[i] = -7.0f; w->v[i] = -9.0f; }
    memcpy(w->slots, slots, (size_t)n * sizeof(int64_t));
    for (i = 0; i < 3 * n; i++) w->positions[i] = 100 + 3 * i;
    w->plan.total_q = n;
    w->plan.page_size = 4;
    w->plan.slot_mapping = w->slots;
    w->plan.positions = w->positions;
    w->pools.k = w->k; w->pools.v = w->v; w->pools.dtype = MSKV_DTYPE_F32;
    w->pools.num_pages = 6; w->pools.page_size = 4; w->pools.kv_heads = 2; w->pools.head_dim = 8;
}

TEST(write_kv_scatters_rows_through_slot_mapping_and_skips_padding) {
    static const int64_t slots[5] = {9, -1, 4, 23, 15};
    tcpu_wfix w;
    float k[5 * 16], v[5 * 16];
    int32_t i, s, e;
    tcpu_wfix_init(&w, slots, 5);
    for (i = 0; i < 5 * 16; i++) { k[i] = (float)i; v[i] = (float)(1000 + i); }
    ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_write_kv_pools(&w.pools, &w.plan, k, v, MSKV_DTYPE_F32, NULL));
    for (s = 0; s < 24; s++) {
        int32_t src = -1;
        for (i = 0; i < 5; i++) if (slots[i] == s) src = i;
        for (e = 0; e < 16; e++) {
            float ek = src < 0 ? -7.0f : k[src * 16 + e], ev = src < 0 ? -9.0f : v[src * 16 + e];
            if (w.k[s * 16 + e] != ek || w.v[s * 16 + e] != ev) {
                mt_fail(__FILE__, __LINE__, "slot %d elem %d: expected k %g v %g, got k %g v %g", s, e, (double)ek,
                        (double)ev, (double)w.k[s * 16 + e], (double)w.v[s * 16 + e]);
                return;
            }
        }
    }
}

TEST(write_kv_converts_between_dtypes) {
    static const int64_t slots[2] = {5, 18};
    uint16_t k[2 * 16], v[2 * 16];
    tcpu_wfix w;
    int32_t i, e;
    tcpu_wfix_init(&w, slots, 2);
    for (i = 0; i < 2 * 16; i++) { k[i] = mskv_f32_to_bf16(0.25f * (float)i - 3.0f); v[i] = mskv_f32_to_bf16((float)i); }
    ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_write_kv_pools(&w.pools, &w.plan, k, v, MSKV_DTYPE_BF16, NULL));
    for (i = 0; i < 2; i++)
        for (e = 0; e < 16; e++) {
            EXPECT_NEAR(mskv_bf16_to_f32(k[i * 16 + e]), w.k[slots[i] * 16 + e], 0);
            EXPECT_NEAR(mskv_bf16_to_f32(v[i * 16 + e]), w.v[slots[i] * 16 + e], 0);
        }
}

TEST(write_kv_applies_rope_to_k_only) {
    static const int64_t slots[3] = {4, 11, 22};
    tcpu_wfix w;
    float k[3 * 16], v[3 * 16], kr[3 * 16];
    mskv_rope r;
    int32_t i, e;
    tcpu_wfix_init(&w, slots, 3);
    tcpu_srand(mt_seed());
    for (i = 0; i < 3 * 16; i++) { k[i] = (float)tcpu_uniform(-1, 1); v[i] = (float)tcpu_uniform(-1, 1); }
    memset(&r, 0, sizeof r);
    r.mode = MSKV_POS_1D;
    r.style = MSKV_ROPE_INTERLEAVED;
    memcpy(kr, k, sizeof k);
    ASSERT_EQ(MSKV_SUCCESS, mskv_rope_apply(&r, kr, MSKV_DTYPE_F32, 3, 2, 8, w.positions));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_write_kv_pools(&w.pools, &w.plan, k, v, MSKV_DTYPE_F32, &r));
    for (i = 0; i < 3; i++)
        for (e = 0; e < 16; e++) {
            EXPECT_NEAR(kr[i * 16 + e], w.k[slots[i] * 16 + e], 0);
            EXPECT_NEAR(v[i * 16 + e], w.v[slots[i] * 16 + e], 0);
        }
    EXPECT_TRUE(fabs(kr[16] - k[16]) > 1e-6); /* the rotation did something */
    /* 3-D: positions [n][3] from the plan */
    r.mode = MSKV_POS_3D;
    r.style = MSKV_ROPE_HALF;
    memcpy(kr, k, sizeof k);
    ASSERT_EQ(MSKV_SUCCESS, mskv_rope_apply(&r, kr, MSKV_DTYPE_F32, 3, 2, 8, w.positions));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_write_kv_pools(&w.pools, &w.plan, k, v, MSKV_DTYPE_F32, &r));
    for (i = 0; i < 3; i++)
        for (e = 0; e < 16; e++) EXPECT_NEAR(kr[i * 16 + e], w.k[slots[i] * 16 + e], 0);
}

static mskv_result tcpu_no_read(void *u, const int32_t *p, int32_t n, void *dst) { (void)u; (void)p; (void)n; (void)dst; return MSKV_ERROR_UNSUPPORTED; }
static mskv_result tcpu_no_write(void *u, const int32_t *p, int32_t n, const void *src) { (void)u; (void)p; (void)n; (void)src; return MSKV_ERROR_UNSUPPORTED; }
static mskv_result tcpu_no_copy(void *u, int32_t s, int32_t d) { (void)u; (void)s; (void)d; return MSKV_ERROR_UNSUPPORTED; }
static const mskv_store_ops tcpu_elsewhere = {NULL, tcpu_no_read, tcpu_no_write, tcpu_no_copy, NULL, NULL};  /* no flush, no fill_pages */

TEST(write_kv_through_an_arena_checks_the_layer_and_the_store) {
    mskv_arena_desc ad;
    mskv_arena *a = NULL;
    static const int64_t slots[1] = {16};
    tcpu_wfix w;
    float k[16] = {0}, v[16] = {0};
    memset(&ad, 0, sizeof ad);
    ad.num_pages = 6; ad.page_size = 4; ad.num_layers = 2; ad.kv_heads = 2; ad.head_dim = 8;
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&ad, &a));
    tcpu_wfix_init(&w, slots, 1);
    EXPECT_EQ(MSKV_SUCCESS, mskv_cpu_write_kv(a, 1, &w.plan, k, v, MSKV_DTYPE_F32, NULL));
    EXPECT_EQ(MSKV_ERROR_OUT_OF_RANGE, mskv_cpu_write_kv(a, 2, &w.plan, k, v, MSKV_DTYPE_F32, NULL));
    EXPECT_EQ(MSKV_ERROR_OUT_OF_RANGE, mskv_cpu_write_kv(a, -1, &w.plan, k, v, MSKV_DTYPE_F32, NULL));
    mskv_arena_destroy(a);
    ad.store_ops = &tcpu_elsewhere; /* the bytes live elsewhere (a GPU): no host pools */
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&ad, &a));
    EXPECT_EQ(MSKV_ERROR_UNSUPPORTED, mskv_cpu_write_kv(a, 0, &w.plan, k, v, MSKV_DTYPE_F32, NULL));
    mskv_arena_destroy(a);
    ad.store_ops = NULL;
    ad.num_layers = 0; /* bookkeeping only: there is no layer 0 */
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&ad, &a));
    EXPECT_EQ(MSKV_ERROR_OUT_OF_RANGE, mskv_cpu_write_kv(a, 0, &w.plan, k, v, MSKV_DTYPE_F32, NULL));
    mskv_arena_destroy(a);
}

TEST(write_kv_rejects_a_bad_slot_and_writes_nothing) {
    static const int64_t null_page[3] = {5, 2, 9};  /* slot 2 lies in the null page 0 */
    static const int64_t past_end[3] = {5, 9, 24};  /* 6 pages * 4 slots = 24 slots */
    tcpu_wfix w;
    float k[3 * 16] = {1}, v[3 * 16] = {2}, before[6 * 4 * 2 * 8];
    tcpu_wfix_init(&w, null_page, 3);
    memcpy(before, w.k, sizeof before);
    EXPECT_EQ(MSKV_ERROR_OUT_OF_RANGE, mskv_cpu_write_kv_pools(&w.pools, &w.plan, k, v, MSKV_DTYPE_F32, NULL));
    EXPECT_TRUE(memcmp(before, w.k, sizeof before) == 0);
    tcpu_wfix_init(&w, past_end, 3);
    EXPECT_EQ(MSKV_ERROR_OUT_OF_RANGE, mskv_cpu_write_kv_pools(&w.pools, &w.plan, k, v, MSKV_DTYPE_F32, NULL));
    EXPECT_TRUE(memcmp(before, w.k, sizeof before) == 0);
    w.plan.page_size = 8; /* a plan for another geometry */
    w.slots[2] = 10;
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cpu_write_kv_pools(&w.pools, &w.plan, k, v, MSKV_DTYPE_F32, NULL));
    EXPECT_TRUE(memcmp(before, w.k, sizeof before) == 0);
}

/* ---- attention -------------------------------------------------------------------- */

TEST(attention_matches_reference_for_every_page_size_and_length) {
    static const int32_t Ps[5] = {1, 3, 16, 40, 64};
    int pi, mi;
    uint64_t seed = mt_seed();
    mskv_cpu *cpu = NULL;
    ASSERT_EQ(MSKV_SUCCESS, tcpu_create(NULL, &cpu));
    for (pi = 0; pi < 5; pi++) {
        int32_t P = Ps[pi];
        /* kv lengths 0, 1, P-1, P, P+1, 97, 2048 in one batch; two of them with
           released positions (split/shift), queries are each sequence's tail */
        tcpu_seq seqs[7];
        int32_t lens[7], b;
        lens[0] = 0; lens[1] = 1; lens[2] = P - 1; lens[3] = P; lens[4] = P + 1; lens[5] = 97; lens[6] = TCPU_LONG;
        for (b = 0; b < 7; b++) {
            seqs[b].kv = lens[b];
            seqs[b].qo = lens[b] < 5 ? lens[b] : 5;
            seqs[b].split = lens[b];
            seqs[b].shift = 0;
        }
        seqs[4].split = P; seqs[4].shift = 3 * P;      /* one prefix page, then a jump */
        seqs[5].split = 2 * P < 97 ? 2 * P : 40; seqs[5].shift = 50;
        for (mi = 0; mi < 3; mi++) {
            tcpu_fix f;
            mskv_attn at = tcpu_attn(4, (mskv_mask)mi, 7, MSKV_DTYPE_F32);
            char what[96];
            ASSERT_TRUE(tcpu_fix_init(&f, P, 2, 64, MSKV_DTYPE_F32, seqs, 7, 1, 1, 2, seed + (uint64_t)P));
            snprintf(what, sizeof what, "page size %d mask %s", P, tcpu_mask_name(at.mask));
            tcpu_check_case(what, mi == 1 ? NULL : cpu, &f, &at, seed + (uint64_t)mi, __LINE__);
            tcpu_fix_free(&f);
        }
    }
    mskv_cpu_destroy(cpu);
}

TEST(attention_supports_every_gqa_ratio_and_head_dim) {
    static const int32_t ratios[6] = {1, 2, 3, 4, 6, 8};
    static const int32_t dims[2] = {64, 128};
    tcpu_seq seqs[2] = {{9, 97, 97, 0}, {3, 40, 16, 20}};
    uint64_t seed = mt_seed();
    int ri, di, mi;
    for (di = 0; di < 2; di++)
        for (ri = 0; ri < 6; ri++)
            for (mi = 0; mi < 3; mi++) {
                tcpu_fix f;
                mskv_attn at = tcpu_attn(2 * ratios[ri], (mskv_mask)mi, 30, MSKV_DTYPE_F32);
                char what[96];
                ASSERT_TRUE(tcpu_fix_init(&f, 16, 2, dims[di], MSKV_DTYPE_F32, seqs, 2, 1, 1, 1, seed + (uint64_t)ri));
                snprintf(what, sizeof what, "ratio %d dim %d mask %s", ratios[ri], dims[di], tcpu_mask_name(at.mask));
                tcpu_check_case(what, NULL, &f, &at, seed, __LINE__);
                tcpu_fix_free(&f);
            }
}

TEST(attention_matches_reference_in_f16_and_bf16) {
    static const mskv_dtype types[3] = {MSKV_DTYPE_F32, MSKV_DTYPE_F16, MSKV_DTYPE_BF16};
    tcpu_seq seqs[4] = {{1, 1, 1, 0}, {6, 17, 17, 0}, {7, 97, 32, 9}, {0, 5, 5, 0}};
    uint64_t seed = mt_seed();
    int si, qi, mi;
    mskv_cpu *cpu = NULL;
    ASSERT_EQ(MSKV_SUCCESS, tcpu_create(NULL, &cpu));
    for (si = 0; si < 3; si++)
        for (qi = 0; qi < 3; qi++)
            for (mi = 0; mi < 3; mi++) {
                tcpu_fix f;
                mskv_attn at = tcpu_attn(6, (mskv_mask)mi, 20, types[qi]);
                char what[96];
                if (si == 0 && qi == 0) continue; /* the f32 sweeps cover it */
                ASSERT_TRUE(tcpu_fix_init(&f, 16, 3, 64, types[si], seqs, 4, 1, 1, 1, seed + (uint64_t)(si * 3 + qi)));
                snprintf(what, sizeof what, "storage %d q %d mask %s", (int)types[si], (int)types[qi], tcpu_mask_name(at.mask));
                tcpu_check_case(what, cpu, &f, &at, seed, __LINE__);
                tcpu_fix_free(&f);
            }
    mskv_cpu_destroy(cpu);
}

TEST(attention_matches_reference_over_long_sequences) {
    uint64_t seed = mt_seed();
    mskv_cpu *cpu = NULL;
    mskv_cpu_desc cd;
    tcpu_fix f;
    tcpu_seq s1[1] = {{8, TCPU_LONG, TCPU_LONG, 0}};
    tcpu_seq s2[2] = {{4, TCPU_LONG, 64, 300}, {3, 130, 130, 0}};
    mskv_attn at;
    memset(&cd, 0, sizeof cd);
    cd.num_threads = 2;
    ASSERT_EQ(MSKV_SUCCESS, tcpu_create(&cd, &cpu));
    ASSERT_TRUE(tcpu_fix_init(&f, 16, 2, 128, MSKV_DTYPE_F32, s1, 1, 1, 0, 0, seed));
    at = tcpu_attn(4, MSKV_MASK_CAUSAL, 0, MSKV_DTYPE_F32);
    tcpu_check_case("f32 causal dim 128", cpu, &f, &at, seed, __LINE__);
    tcpu_fix_free(&f);
    ASSERT_TRUE(tcpu_fix_init(&f, 40, 1, 64, MSKV_DTYPE_BF16, s1, 1, 1, 0, 0, seed + 1));
    at = tcpu_attn(3, MSKV_MASK_NONE, 0, MSKV_DTYPE_BF16);
    tcpu_check_case("bf16 bidirectional", cpu, &f, &at, seed, __LINE__);
    tcpu_fix_free(&f);
    ASSERT_TRUE(tcpu_fix_init(&f, 64, 2, 64, MSKV_DTYPE_F16, s2, 2, 1, 0, 0, seed + 2));
    at = tcpu_attn(4, MSKV_MASK_WINDOW, 500, MSKV_DTYPE_F32);
    tcpu_check_case("f16 window with released positions", cpu, &f, &at, seed, __LINE__);
    tcpu_fix_free(&f);
    mskv_cpu_destroy(cpu);
}

TEST(decode_batches_of_one_query_per_sequence_match_reference) {
    /* one query per sequence, several kv heads: the backend groups kv heads per item */
    tcpu_seq seqs[6] = {{1, 1, 1, 0}, {1, 300, 300, 0}, {1, 77, 32, 5}, {1, 16, 16, 0}, {1, 1000, 1000, 0}, {1, 129, 129, 0}};
    static const mskv_dtype types[3] = {MSKV_DTYPE_F32, MSKV_DTYPE_F16, MSKV_DTYPE_BF16};
    uint64_t seed = mt_seed();
    mskv_cpu *cpu = NULL;
    mskv_cpu_desc cd;
    int ti, ci;
    memset(&cd, 0, sizeof cd);
    cd.num_threads = 2;
    ASSERT_EQ(MSKV_SUCCESS, tcpu_create(&cd, &cpu));
    for (ti = 0; ti < 3; ti++)
        for (ci = 0; ci < 2; ci++) {
            tcpu_fix f;
            mskv_attn at = tcpu_attn(16, ci ? MSKV_MASK_CAUSAL : MSKV_MASK_NONE, 0, types[ti]);
            char what[64];
            ASSERT_TRUE(tcpu_fix_init(&f, 16, 4, 128, types[ti], seqs, 6, 1, 1, 1, seed + (uint64_t)ti));
            snprintf(what, sizeof what, "dtype %d %s", (int)types[ti], ci ? "pool" : "no pool");
            tcpu_check_case(what, ci ? cpu : NULL, &f, &at, seed, __LINE__);
            tcpu_fix_free(&f);
        }
    mskv_cpu_destroy(cpu);
}

/* 16-bit K/V are read where they lie in the pool (converted in registers,
   nothing past a row's head_dim read): every odd page size and a head_dim
   that is not a multiple of the vector width (72, 80, 100: tails of 8, 16
   and 4 elements), decode rows (groups of 1 and 4) and many-row segments
   (the transposed tiles, several per item), with and without a pool. */
TEST(sixteen_bit_pools_match_reference_for_odd_pages_head_dims_and_groups) {
    static const int32_t Ps[4] = {1, 3, 7, 16}, dims[4] = {72, 80, 100, 128}, ratios[2] = {1, 4};
    static const mskv_dtype types[2] = {MSKV_DTYPE_F16, MSKV_DTYPE_BF16};
    tcpu_seq seqs[4] = {{1, 200, 200, 0}, {1, 37, 20, 7}, {45, 300, 300, 0}, {1, 1, 1, 0}};
    uint64_t seed = mt_seed();
    mskv_cpu *cpu = NULL;
    mskv_cpu_desc cd;
    int pi, di, ti, ri;
    memset(&cd, 0, sizeof cd);
    cd.num_threads = 2;
    ASSERT_EQ(MSKV_SUCCESS, tcpu_create(&cd, &cpu));
    for (ti = 0; ti < 2; ti++)
        for (pi = 0; pi < 4; pi++)
            for (di = 0; di < 4; di++)
                for (ri = 0; ri < 2; ri++) {
                    tcpu_fix f;
                    mskv_mask mask = (mskv_mask)((pi + di + ri) % 3);
                    mskv_attn at = tcpu_attn(2 * ratios[ri], mask, 50, types[ti]);
                    char what[112];
                    ASSERT_TRUE(tcpu_fix_init(&f, Ps[pi], 2, dims[di], types[ti], seqs, 4, 1, 1, 1,
                                              seed + (uint64_t)(((ti * 4 + pi) * 4 + di) * 2 + ri)));
                    snprintf(what, sizeof what, "%s pool, page size %d, head_dim %d, group %d, mask %s, %s",
                             ti ? "bf16" : "f16", (int)Ps[pi], (int)dims[di], (int)ratios[ri], tcpu_mask_name(mask),
                             (di + ri) & 1 ? "2-thread pool" : "small pool");
                    tcpu_check_case(what, (di + ri) & 1 ? cpu : NULL, &f, &at, seed, __LINE__);
                    tcpu_fix_free(&f);
                }
    mskv_cpu_destroy(cpu);
}

TEST(attention_applies_a_custom_scale) {
    tcpu_seq seqs[1] = {{4, 50, 50, 0}};
    tcpu_fix f;
    mskv_attn at = tcpu_attn(2, MSKV_MASK_CAUSAL, 0, MSKV_DTYPE_F32);
    at.scale = 0.37f;
    ASSERT_TRUE(tcpu_fix_init(&f, 16, 1, 64, MSKV_DTYPE_F32, seqs, 1, 0, 1, 0, mt_seed()));
    tcpu_check_case("scale 0.37", NULL, &f, &at, mt_seed(), __LINE__);
    tcpu_fix_free(&f);
}

/* Runs attention into fresh buffers; returns o (f32) and lse, caller frees. */
static int tcpu_run(mskv_cpu *cpu, const tcpu_fix *f, const mskv_attn *at, const void *q, float **o, float **lse) {
    size_t rows = (size_t)f->plan.total_q * (size_t)at->q_heads;
    mskv_pools pools = tcpu_pools(f);
    *o = (float *)malloc(rows * (size_t)f->D * sizeof(float) + 4);
    *lse = (float *)malloc(rows * sizeof(float) + 4);
    if (!*o || !*lse) return 0;
    return mskv_cpu_attention_pools(tcpu_pool(cpu), &pools, &f->plan, at, q, *o, *lse) == MSKV_SUCCESS;
}

TEST(shuffled_page_table_gives_the_same_result_as_contiguous) {
    tcpu_seq seqs[3] = {{5, 200, 200, 0}, {2, 33, 16, 7}, {1, 64, 64, 0}};
    uint64_t seed = mt_seed();
    tcpu_fix a, b;
    mskv_attn at = tcpu_attn(4, MSKV_MASK_CAUSAL, 0, MSKV_DTYPE_F32);
    float *oa = NULL, *la = NULL, *ob = NULL, *lb = NULL;
    void *q;
    size_t rows;
    ASSERT_TRUE(tcpu_fix_init(&a, 16, 2, 64, MSKV_DTYPE_F32, seqs, 3, 0, 1, 4, seed));
    ASSERT_TRUE(tcpu_fix_init(&b, 16, 2, 64, MSKV_DTYPE_F32, seqs, 3, 1, 1, 4, seed));
    rows = (size_t)a.plan.total_q * 4;
    EXPECT_TRUE(memcmp(a.indices, b.indices, (size_t)a.plan.num_page_ids * 4) != 0); /* really another table */
    q = tcpu_queries(&a, 4, MSKV_DTYPE_F32, seed);
    ASSERT_TRUE(q != NULL);
    EXPECT_TRUE(tcpu_run(NULL, &a, &at, q, &oa, &la));
    EXPECT_TRUE(tcpu_run(NULL, &b, &at, q, &ob, &lb));
    /* the same keys in the same order: bit-identical */
    EXPECT_TRUE(memcmp(oa, ob, rows * 64 * sizeof(float)) == 0);
    EXPECT_TRUE(memcmp(la, lb, rows * sizeof(float)) == 0);
    free(q); free(oa); free(la); free(ob); free(lb);
    tcpu_fix_free(&a); tcpu_fix_free(&b);
}

TEST(unused_pages_filled_with_nan_change_no_output) {
    tcpu_seq seqs[2] = {{3, 45, 45, 0}, {2, 17, 17, 0}};
    uint64_t seed = mt_seed();
    tcpu_fix a, b;
    mskv_attn at = tcpu_attn(2, MSKV_MASK_NONE, 0, MSKV_DTYPE_F32);
    float *oa = NULL, *la = NULL, *ob = NULL, *lb = NULL;
    void *q;
    size_t rows, i;
    int nans = 0;
    /* same table and data; every slot outside it (spare pages, the null page,
       the tails of last pages) zero in one and NaN in the other */
    ASSERT_TRUE(tcpu_fix_init(&a, 16, 1, 64, MSKV_DTYPE_F32, seqs, 2, 1, 0, 5, seed));
    ASSERT_TRUE(tcpu_fix_init(&b, 16, 1, 64, MSKV_DTYPE_F32, seqs, 2, 1, 1, 5, seed));
    rows = (size_t)a.plan.total_q * 2;
    q = tcpu_queries(&a, 2, MSKV_DTYPE_F32, seed);
    ASSERT_TRUE(q != NULL);
    EXPECT_TRUE(tcpu_run(NULL, &a, &at, q, &oa, &la));
    EXPECT_TRUE(tcpu_run(NULL, &b, &at, q, &ob, &lb));
    for (i = 0; i < rows * 64; i++) nans += isnan(ob[i]) != 0;
    EXPECT_EQ(0, nans);
    EXPECT_TRUE(memcmp(oa, ob, rows * 64 * sizeof(float)) == 0);
    EXPECT_TRUE(memcmp(la, lb, rows * sizeof(float)) == 0);
    free(q); free(oa); free(la); free(ob); free(lb);
    tcpu_fix_free(&a); tcpu_fix_free(&b);
}

TEST(a_query_that_sees_no_key_gets_zero_output_and_minus_infinite_lse) {
    /* a cross plan against an empty entry: queries, no keys */
    tcpu_seq seqs[2] = {{3, 0, 0, 0}, {2, 20, 20, 0}};
    tcpu_fix f;
    mskv_attn at = tcpu_attn(2, MSKV_MASK_NONE, 0, MSKV_DTYPE_F32);
    float *o = NULL, *lse = NULL;
    void *q;
    int i;
    ASSERT_TRUE(tcpu_fix_init(&f, 16, 1, 64, MSKV_DTYPE_F32, seqs, 2, 1, 1, 1, mt_seed()));
    q = tcpu_queries(&f, 2, MSKV_DTYPE_F32, mt_seed());
    ASSERT_TRUE(q != NULL);
    EXPECT_TRUE(tcpu_run(NULL, &f, &at, q, &o, &lse));
    for (i = 0; i < 3 * 2 * 64; i++)
        if (o[i] != 0.0f) { mt_fail(__FILE__, __LINE__, "o[%d] = %g, expected 0", i, (double)o[i]); break; }
    for (i = 0; i < 3 * 2; i++) EXPECT_TRUE(lse[i] == -INFINITY);
    for (i = 3 * 2; i < 5 * 2; i++) EXPECT_TRUE(isfinite(lse[i]));
    free(q); free(o); free(lse);
    tcpu_fix_free(&f);
}

TEST(splitting_keys_and_merging_by_lse_equals_attention_over_all_keys) {
    /* keys of one sequence: pages [0, 3) in part A, [3, 7) in part B */
    tcpu_seq all[1] = {{6, 100, 100, 0}};
    uint64_t seed = mt_seed();
    tcpu_fix f;
    mskv_attn at = tcpu_attn(4, MSKV_MASK_NONE, 0, MSKV_DTYPE_F32);
    mskv_plan pa, pb;
    int32_t ia[2], ib[2], la_[1], lb_[1], kva[1], kvb[1], sa[1], sb[1], sh[1] = {0};
    float *o = NULL, *lse = NULL, *oa, *lsa, *ob, *lsb;
    mskv_pools pools;
    void *q;
    size_t rows = 6 * 4, n = rows * 64, i;
    ASSERT_TRUE(tcpu_fix_init(&f, 16, 2, 64, MSKV_DTYPE_F32, all, 1, 1, 1, 1, seed));
    q = tcpu_queries(&f, 4, MSKV_DTYPE_F32, seed);
    ASSERT_TRUE(q != NULL);
    EXPECT_TRUE(tcpu_run(NULL, &f, &at, q, &o, &lse));
    pa = f.plan; pb = f.plan;
    ia[0] = 0; ia[1] = 3; ib[0] = 0; ib[1] = 4;
    la_[0] = 16; lb_[0] = 100 - 6 * 16; kva[0] = 48; kvb[0] = 52; sa[0] = 48; sb[0] = 52;
    pa.kv_indptr = ia; pa.kv_last_page_len = la_; pa.kv_len = kva; pa.kv_pos_split = sa; pa.kv_pos_shift = sh;
    pb.kv_indptr = ib; pb.kv_last_page_len = lb_; pb.kv_len = kvb; pb.kv_pos_split = sb; pb.kv_pos_shift = sh;
    pb.kv_indices = f.indices + 3;
    oa = (float *)malloc(n * 4); ob = (float *)malloc(n * 4); lsa = (float *)malloc(rows * 4); lsb = (float *)malloc(rows * 4);
    ASSERT_TRUE(oa && ob && lsa && lsb);
    pools = tcpu_pools(&f);
    EXPECT_EQ(MSKV_SUCCESS, mskv_cpu_attention_pools(tcpu_pool(NULL), &pools, &pa, &at, q, oa, lsa));
    EXPECT_EQ(MSKV_SUCCESS, mskv_cpu_attention_pools(tcpu_pool(NULL), &pools, &pb, &at, q, ob, lsb));
    /* merged in place into part A */
    EXPECT_EQ(MSKV_SUCCESS, mskv_cpu_merge(6, 4, 64, oa, lsa, ob, lsb, oa, lsa));
    for (i = 0; i < n; i++)
        if (fabs(oa[i] - o[i]) > 1e-5) { mt_fail(__FILE__, __LINE__, "o[%zu]: expected %.8g got %.8g", i, (double)o[i], (double)oa[i]); break; }
    for (i = 0; i < rows; i++) EXPECT_NEAR(lse[i], lsa[i], 1e-5 * (fabs(lse[i]) > 1 ? fabs(lse[i]) : 1));
    free(q); free(o); free(lse); free(oa); free(ob); free(lsa); free(lsb);
    tcpu_fix_free(&f);
}

/* ---- explicit query positions, visibility bounds, dense K/V ------------------------ */

/* The fixture's keys as dense K/V: sequence b's kv_len rows one after
   another in compacted order, packed [row][kv_head][dim] or head-major
   [kv_head][row][dim]; the plan gets kv_token_indptr over them. */
static int tcpu_dense(tcpu_fix *f, int head_major, mskv_dense_kv *kv, void **kbuf, void **vbuf) {
    size_t es = tcpu_esize(f->dt), row = (size_t)f->kvh * (size_t)f->D, total;
    int32_t b, h, d;
    int64_t j;
    f->tok[0] = 0;
    for (b = 0; b < f->batch; b++) f->tok[b + 1] = f->tok[b] + f->seq[b].kv;
    total = (size_t)f->tok[f->batch];
    *kbuf = malloc(total * row * es + 4);
    *vbuf = malloc(total * row * es + 4);
    if (!*kbuf || !*vbuf) return 0;
    for (b = 0; b < f->batch; b++)
        for (j = 0; j < f->seq[b].kv; j++) {
            size_t src = (size_t)(f->dense_at[b] + tcpu_kpos(&f->seq[b], j)) * row, t = (size_t)(f->tok[b] + j);
            for (h = 0; h < f->kvh; h++)
                for (d = 0; d < f->D; d++) {
                    size_t at = head_major ? ((size_t)h * total + t) * (size_t)f->D + (size_t)d : (t * (size_t)f->kvh + (size_t)h) * (size_t)f->D + (size_t)d;
                    tcpu_put(*kbuf, f->dt, at, f->kd[src + (size_t)h * f->D + (size_t)d]);
                    tcpu_put(*vbuf, f->dt, at, f->vd[src + (size_t)h * f->D + (size_t)d]);
                }
        }
    memset(kv, 0, sizeof *kv);
    kv->k = *kbuf; kv->v = *vbuf; kv->dtype = f->dt; kv->kv_heads = f->kvh; kv->head_dim = f->D;
    kv->tokens = (int64_t)total;
    kv->token_stride = head_major ? f->D : 0;
    kv->head_stride = head_major ? (int64_t)total * f->D : 0;
    f->plan.kv_token_indptr = f->tok;
    return 1;
}

/* The largest absolute key position of the fixture, plus one. */
static int64_t tcpu_end(const tcpu_fix *f, int32_t b) { return (int64_t)f->seq[b].kv + (f->seq[b].kv > f->seq[b].split ? f->seq[b].shift : 0); }

/* Causal and window masks compare key positions with the plan's q_pos, not
   with the tail of the sequence: queries before, inside and past the keys,
   in any order, and more queries than keys. */
TEST(attention_masks_use_the_plans_explicit_query_positions) {
    static const int32_t Ps[3] = {1, 16, 40};
    tcpu_seq seqs[4] = {{6, 97, 97, 0}, {5, 300, 80, 100}, {1, 2048, 2048, 0}, {8, 5, 5, 0}};
    uint64_t seed = mt_seed();
    int pi, mi;
    mskv_cpu *cpu = NULL;
    ASSERT_EQ(MSKV_SUCCESS, tcpu_create(NULL, &cpu));
    for (pi = 0; pi < 3; pi++)
        for (mi = 1; mi < 3; mi++) {
            tcpu_fix f;
            mskv_attn at = tcpu_attn(4, (mskv_mask)mi, 20, MSKV_DTYPE_F32);
            int32_t b, i;
            char what[96];
            ASSERT_TRUE(tcpu_fix_init(&f, Ps[pi], 2, 64, MSKV_DTYPE_F32, seqs, 4, 1, 1, 1, seed + (uint64_t)pi));
            ASSERT_TRUE(tcpu_fix_qpos(&f));
            tcpu_srand(seed * 7 + (uint64_t)(pi * 3 + mi));
            for (b = 0; b < 4; b++)
                for (i = 0; i < seqs[b].qo; i++)
                    f.qpos[f.qo_indptr[b] + i] = (int32_t)(tcpu_rand() % (uint64_t)(tcpu_end(&f, b) + 10)) - 5;
            snprintf(what, sizeof what, "page size %d mask %s, explicit query positions", Ps[pi], tcpu_mask_name(at.mask));
            tcpu_check_case(what, pi == 1 ? NULL : cpu, &f, &at, seed + (uint64_t)mi, __LINE__);
            tcpu_fix_free(&f);
        }
    mskv_cpu_destroy(cpu);
}

/* A key at position p is visible iff p < vis_sink_end or p >= vis_window_start,
   whatever the page size: bounds inside pages, on page edges, around a
   released gap (split/shift), past the end, and ones that hide nothing. */
TEST(visibility_bounds_hide_keys_token_exactly_for_every_page_size) {
    static const int32_t Ps[4] = {1, 3, 16, 40};
    tcpu_seq seqs[6] = {{5, 97, 97, 0}, {3, 300, 80, 100}, {1, 2000, 2000, 0}, {7, 64, 64, 0}, {4, 50, 50, 0}, {2, 130, 40, 21}};
    uint64_t seed = mt_seed();
    int pi, mi;
    mskv_cpu *cpu = NULL;
    ASSERT_EQ(MSKV_SUCCESS, tcpu_create(NULL, &cpu));
    for (pi = 0; pi < 4; pi++)
        for (mi = 0; mi < 3; mi++) {
            tcpu_fix f;
            mskv_attn at = tcpu_attn(4, (mskv_mask)mi, 30, MSKV_DTYPE_F32);
            int32_t se[6], ws[6], b;
            char what[96];
            ASSERT_TRUE(tcpu_fix_init(&f, Ps[pi], 2, 64, MSKV_DTYPE_F32, seqs, 6, 1, 1, 1, seed + (uint64_t)pi));
            tcpu_srand(seed * 13 + (uint64_t)(pi * 3 + mi));
            for (b = 0; b < 6; b++) {
                int64_t end = tcpu_end(&f, b);
                se[b] = (int32_t)(tcpu_rand() % (uint64_t)end);
                ws[b] = se[b] + (int32_t)(tcpu_rand() % (uint64_t)(end - se[b] + 1));
            }
            se[3] = 20; ws[3] = 20;        /* an empty hole: everything visible */
            se[4] = 0; ws[4] = 45;         /* only the last 5 keys */
            se[5] = 17; ws[5] = 1000;      /* the sink alone, inside the first page */
            tcpu_fix_bounds(&f, se, ws);
            if (mi == 1) {                 /* with explicit query positions as well */
                ASSERT_TRUE(tcpu_fix_qpos(&f));
                f.qpos[0] = se[0] > 0 ? se[0] - 1 : 0;
            }
            snprintf(what, sizeof what, "page size %d mask %s, visibility bounds", Ps[pi], tcpu_mask_name(at.mask));
            tcpu_check_case(what, pi == 2 ? NULL : cpu, &f, &at, seed + (uint64_t)mi, __LINE__);
            tcpu_fix_free(&f);
        }
    mskv_cpu_destroy(cpu);
}

/* Hidden keys are not read: NaN in every slot the bounds hide changes no
   output (the paths that split long decode sequences into chunks too). */
TEST(keys_hidden_by_visibility_bounds_are_never_read) {
    tcpu_seq seqs[3] = {{1, 8000, 8000, 0}, {9, 333, 333, 0}, {64, 500, 200, 37}};
    int32_t se[3] = {1003, 5, 150}, ws[3] = {7001, 301, 420};
    uint64_t seed = mt_seed();
    mskv_cpu_desc cd;
    mskv_cpu *cpu = NULL;
    tcpu_fix f;
    mskv_attn at = tcpu_attn(8, MSKV_MASK_NONE, 0, MSKV_DTYPE_F32);
    int32_t b, h, d;
    int64_t j;
    memset(&cd, 0, sizeof cd);
    cd.num_threads = 2;
    ASSERT_EQ(MSKV_SUCCESS, tcpu_create(&cd, &cpu));
    ASSERT_TRUE(tcpu_fix_init(&f, 16, 2, 64, MSKV_DTYPE_F32, seqs, 3, 1, 1, 0, seed));
    tcpu_fix_bounds(&f, se, ws);
    for (b = 0; b < 3; b++)
        for (j = 0; j < seqs[b].kv; j++) {
            int64_t pos = tcpu_kpos(&seqs[b], j), slot = (int64_t)f.indices[f.kv_indptr[b] + j / 16] * 16 + j % 16;
            if (pos < se[b] || pos >= ws[b]) continue;
            for (h = 0; h < 2; h++)
                for (d = 0; d < 64; d++) {
                    tcpu_put(f.k, f.dt, ((size_t)slot * 2 + (size_t)h) * 64 + (size_t)d, NAN);
                    tcpu_put(f.v, f.dt, ((size_t)slot * 2 + (size_t)h) * 64 + (size_t)d, NAN);
                }
        }
    tcpu_check_case("NaN in hidden keys, pool", cpu, &f, &at, seed, __LINE__);
    tcpu_check_case("NaN in hidden keys, no pool", NULL, &f, &at, seed, __LINE__);
    tcpu_fix_free(&f);
    mskv_cpu_destroy(cpu);
}

/* Keys split at an arbitrary point s into two plans, each attended causally
   with the queries' true positions, merged by LSE, give the causal result
   over all keys: part A ends at s, mid-page, before its queries (q_pos says
   where they are); part B starts on the page holding s and hides what lies
   before it (a visibility bound). The same with dense slices [0, s) and
   [s, n). Without q_pos part A would put its queries at its own tail. */
TEST(causal_split_at_any_point_merges_to_the_unsplit_result) {
    enum { P = 16, QO = 6, KV = 1000, QH = 4, D = 64 };
    tcpu_seq all[1] = {{QO, KV, KV, 0}};
    uint64_t seed = mt_seed();
    tcpu_fix f;
    mskv_attn at = tcpu_attn(QH, MSKV_MASK_CAUSAL, 0, MSKV_DTYPE_F32);
    mskv_pools pools;
    mskv_dense_kv dkv;
    void *q, *kb = NULL, *vb = NULL;
    float *o = NULL, *lse = NULL, *oa, *ob, *la, *lb;
    size_t rows = QO * QH, n = rows * D, i;
    int32_t s, t, qp[QO], ia[2], ib[2], lasta[1], lastb[1], kva[1], kvb[1], spa[1], spb[1], sha[1], shb[1], se[1], ws[1];
    int64_t toka[2], tokb[2];
    int differs = 0;
    tcpu_srand(seed);
    s = 1 + (int32_t)(tcpu_rand() % (KV - 2));
    if (s % P == 0) s++;                     /* mid-page */
    ASSERT_TRUE(tcpu_fix_init(&f, P, 2, D, MSKV_DTYPE_F32, all, 1, 1, 1, 1, seed));
    q = tcpu_queries(&f, QH, MSKV_DTYPE_F32, seed);
    oa = (float *)malloc(n * 4); ob = (float *)malloc(n * 4); la = (float *)malloc(rows * 4); lb = (float *)malloc(rows * 4);
    ASSERT_TRUE(q && oa && ob && la && lb);
    EXPECT_TRUE(tcpu_run(NULL, &f, &at, q, &o, &lse));
    pools = tcpu_pools(&f);
    for (t = 0; t < QO; t++) qp[t] = KV - QO + t;
    for (t = 0; t < 2; t++) {
        mskv_plan pa = f.plan, pb = f.plan;
        pa.q_pos = qp; pa.features = MSKV_PLAN_Q_POS;
        pb.q_pos = qp; pb.features = MSKV_PLAN_VISIBILITY;
        kva[0] = s; spa[0] = s; sha[0] = 0;
        kvb[0] = KV - s / P * P; spb[0] = 0; shb[0] = s / P * P;
        se[0] = 0; ws[0] = s;
        pa.kv_len = kva; pa.kv_pos_split = spa; pa.kv_pos_shift = sha;
        pb.kv_len = kvb; pb.kv_pos_split = spb; pb.kv_pos_shift = shb;
        pb.vis_sink_end = se; pb.vis_window_start = ws;
        if (t == 0) {   /* paged: A the first pages, B from the page holding s */
            ia[0] = 0; ia[1] = (s + P - 1) / P; ib[0] = 0; ib[1] = (KV + P - 1) / P - s / P;
            lasta[0] = s - (ia[1] - 1) * P; lastb[0] = kvb[0] - (ib[1] - 1) * P;
            pa.kv_indptr = ia; pa.kv_last_page_len = lasta; pa.num_page_ids = ia[1];
            pb.kv_indptr = ib; pb.kv_last_page_len = lastb; pb.num_page_ids = ib[1];
            pb.kv_indices = f.indices + s / P;
            EXPECT_EQ(MSKV_SUCCESS, mskv_cpu_attention_pools(tcpu_pool(NULL), &pools, &pa, &at, q, oa, la));
            EXPECT_EQ(MSKV_SUCCESS, mskv_cpu_attention_pools(tcpu_pool(NULL), &pools, &pb, &at, q, ob, lb));
        } else {        /* dense: rows [0, s) and [s, KV) of one buffer */
            ASSERT_TRUE(tcpu_dense(&f, 0, &dkv, &kb, &vb));
            kvb[0] = KV - s; shb[0] = s;
            toka[0] = 0; toka[1] = s; tokb[0] = s; tokb[1] = KV;
            pa.kv_token_indptr = toka; pb.kv_token_indptr = tokb;
            pb.vis_sink_end = pb.vis_window_start = NULL; pb.features = 0;
            EXPECT_EQ(MSKV_SUCCESS, mskv_cpu_attention_dense(tcpu_pool(NULL), &dkv, &pa, &at, q, oa, la));
            EXPECT_EQ(MSKV_SUCCESS, mskv_cpu_attention_dense(tcpu_pool(NULL), &dkv, &pb, &at, q, ob, lb));
        }
        EXPECT_EQ(MSKV_SUCCESS, mskv_cpu_merge(QO, QH, D, oa, la, ob, lb, oa, la));
        for (i = 0; i < n; i++)
            if (fabs(oa[i] - o[i]) > 1e-5) { mt_fail(__FILE__, __LINE__, "%s split at %d: o[%zu]: expected %.8g got %.8g", t ? "dense" : "paged", (int)s, i, (double)o[i], (double)oa[i]); break; }
        for (i = 0; i < rows; i++) EXPECT_NEAR(lse[i], la[i], 1e-5 * (fabs(lse[i]) > 1 ? fabs(lse[i]) : 1));
    }
    /* the test can fail: part A at its tail's positions sees other keys */
    if (s >= QO) {
        mskv_plan pa = f.plan;
        kva[0] = s; spa[0] = s; sha[0] = 0;
        pa.kv_len = kva; pa.kv_pos_split = spa; pa.kv_pos_shift = sha; pa.kv_token_indptr = toka;
        EXPECT_EQ(MSKV_SUCCESS, mskv_cpu_attention_dense(tcpu_pool(NULL), &dkv, &pa, &at, q, oa, la));
        pa.q_pos = qp; pa.features = MSKV_PLAN_Q_POS;
        EXPECT_EQ(MSKV_SUCCESS, mskv_cpu_attention_dense(tcpu_pool(NULL), &dkv, &pa, &at, q, ob, lb));
        for (i = 0; i < n; i++) differs |= oa[i] != ob[i];
        EXPECT_TRUE(differs);
    }
    free(q); free(o); free(lse); free(oa); free(ob); free(la); free(lb); free(kb); free(vb);
    tcpu_fix_free(&f);
}

/* Dense K/V in the caller's layout (packed, head-major) gives what the
   paged form of the same keys gives: masks, split/shift positions, GQA,
   bf16, with and without a pool. */
TEST(dense_attention_matches_reference_in_packed_and_head_major_layouts) {
    tcpu_seq seqs[4] = {{5, 97, 97, 0}, {3, 300, 80, 100}, {1, 1500, 1500, 0}, {40, 40, 40, 0}};
    uint64_t seed = mt_seed();
    mskv_cpu *cpu = NULL;
    int layout, mi, dti;
    ASSERT_EQ(MSKV_SUCCESS, tcpu_create(NULL, &cpu));
    for (dti = 0; dti < 2; dti++)
        for (layout = 0; layout < 2; layout++)
            for (mi = 0; mi < 3; mi++) {
                mskv_dtype dt = dti ? MSKV_DTYPE_BF16 : MSKV_DTYPE_F32;
                tcpu_fix f;
                mskv_attn at = tcpu_attn(6, (mskv_mask)mi, 25, dt);
                mskv_dense_kv kv;
                void *kb = NULL, *vb = NULL, *q, *o;
                float *lse;
                double *ro, *rl;
                size_t rows, n;
                char what[96];
                ASSERT_TRUE(tcpu_fix_init(&f, 16, 3, 64, dt, seqs, 4, 1, 1, 0, seed + (uint64_t)dti));
                ASSERT_TRUE(tcpu_dense(&f, layout, &kv, &kb, &vb));
                rows = (size_t)f.plan.total_q * 6; n = rows * 64;
                q = tcpu_queries(&f, 6, dt, seed);
                o = malloc(n * 4); lse = (float *)malloc(rows * 4);
                ro = (double *)malloc(n * 8); rl = (double *)malloc(rows * 8);
                ASSERT_TRUE(q && o && lse && ro && rl);
                snprintf(what, sizeof what, "dense %s %s mask %s", dti ? "bf16" : "f32", layout ? "head-major" : "packed", tcpu_mask_name(at.mask));
                EXPECT_EQ(MSKV_SUCCESS, mskv_cpu_attention_dense(tcpu_pool(mi == 1 ? NULL : cpu), &kv, &f.plan, &at, q, o, lse));
                tcpu_reference(&f, &at, q, ro, rl);
                tcpu_close(what, o, dt, lse, ro, rl, rows, 64, tcpu_tol(dt), __LINE__);
                free(kb); free(vb); free(q); free(o); free(lse); free(ro); free(rl);
                tcpu_fix_free(&f);
            }
    mskv_cpu_destroy(cpu);
}

TEST(dense_attention_rejects_bad_arguments_and_writes_nothing) {
    tcpu_seq seqs[2] = {{2, 20, 20, 0}, {1, 7, 7, 0}};
    uint64_t seed = mt_seed();
    tcpu_fix f;
    mskv_dense_kv kv, bad;
    mskv_attn at = tcpu_attn(2, MSKV_MASK_CAUSAL, 0, MSKV_DTYPE_F32);
    void *kb = NULL, *vb = NULL, *q;
    float o[3 * 2 * 8], lse[3 * 2];
    int64_t tok[3];
    size_t i;
    int ok = 1;
    ASSERT_TRUE(tcpu_fix_init(&f, 4, 1, 8, MSKV_DTYPE_F32, seqs, 2, 0, 0, 0, seed));
    ASSERT_TRUE(tcpu_dense(&f, 0, &kv, &kb, &vb));
    q = tcpu_queries(&f, 2, MSKV_DTYPE_F32, seed);
    ASSERT_TRUE(q != NULL);
    for (i = 0; i < sizeof o / sizeof o[0]; i++) o[i] = 7.0f;
    EXPECT_EQ(MSKV_ERROR_NULL_POINTER, mskv_cpu_attention_dense(NULL, NULL, &f.plan, &at, q, o, lse));
    EXPECT_EQ(MSKV_ERROR_NULL_POINTER, mskv_cpu_attention_dense(NULL, &kv, NULL, &at, q, o, lse));
    EXPECT_EQ(MSKV_ERROR_NULL_POINTER, mskv_cpu_attention_dense(NULL, &kv, &f.plan, NULL, q, o, lse));
    EXPECT_EQ(MSKV_ERROR_NULL_POINTER, mskv_cpu_attention_dense(NULL, &kv, &f.plan, &at, NULL, o, lse));
    bad = kv; bad.tokens = 26;       /* the plan reads 27 rows */
    EXPECT_EQ(MSKV_ERROR_OUT_OF_RANGE, mskv_cpu_attention_dense(NULL, &bad, &f.plan, &at, q, o, lse));
    bad = kv; bad.dtype = (mskv_dtype)9;
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cpu_attention_dense(NULL, &bad, &f.plan, &at, q, o, lse));
    bad = kv; bad.token_stride = -1;
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cpu_attention_dense(NULL, &bad, &f.plan, &at, q, o, lse));
    bad = kv; bad.kv_heads = 3;      /* 2 q heads are no multiple */
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cpu_attention_dense(NULL, &bad, &f.plan, &at, q, o, lse));
    f.plan.kv_token_indptr = NULL;
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cpu_attention_dense(NULL, &kv, &f.plan, &at, q, o, lse));
    tok[0] = 0; tok[1] = 19; tok[2] = 26;   /* not kv_len apart */
    f.plan.kv_token_indptr = tok;
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cpu_attention_dense(NULL, &kv, &f.plan, &at, q, o, lse));
    for (i = 0; i < sizeof o / sizeof o[0]; i++) ok &= o[i] == 7.0f;
    EXPECT_TRUE(ok);
    free(q); free(kb); free(vb);
    tcpu_fix_free(&f);
}

TEST(merging_with_an_empty_part_is_neutral) {
    float oa[2 * 8], la[2], oe[2 * 8], le[2] = {-INFINITY, -INFINITY}, o[2 * 8], l[2];
    int i;
    for (i = 0; i < 16; i++) { oa[i] = (float)i * 0.5f - 3.0f; oe[i] = NAN; } /* an empty part's o is never read */
    la[0] = 1.5f; la[1] = -20.0f;
    EXPECT_EQ(MSKV_SUCCESS, mskv_cpu_merge(1, 2, 8, oa, la, oe, le, o, l));
    EXPECT_TRUE(memcmp(oa, o, sizeof o) == 0);
    EXPECT_NEAR(la[0], l[0], 0);
    EXPECT_NEAR(la[1], l[1], 0);
    EXPECT_EQ(MSKV_SUCCESS, mskv_cpu_merge(1, 2, 8, oe, le, oa, la, o, l));
    EXPECT_TRUE(memcmp(oa, o, sizeof o) == 0);
    EXPECT_EQ(MSKV_SUCCESS, mskv_cpu_merge(1, 2, 8, oe, le, oe, le, o, l));
    for (i = 0; i < 16; i++) EXPECT_TRUE(o[i] == 0.0f);
    EXPECT_TRUE(l[0] == -INFINITY && l[1] == -INFINITY);
}

TEST(threaded_attention_is_bit_identical_to_one_thread) {
    tcpu_seq seqs[3] = {{64, 512, 512, 0}, {1, 300, 300, 0}, {40, 200, 64, 10}};
    uint64_t seed = mt_seed();
    tcpu_fix f;
    mskv_attn at = tcpu_attn(8, MSKV_MASK_CAUSAL, 0, MSKV_DTYPE_F32);
    mskv_cpu *one = NULL, *three = NULL;
    mskv_cpu_desc cd;
    float *o1 = NULL, *l1 = NULL, *o3 = NULL, *l3 = NULL;
    void *q;
    size_t rows;
    memset(&cd, 0, sizeof cd);
    ASSERT_EQ(MSKV_SUCCESS, tcpu_create(&cd, &one));
    cd.num_threads = 3;
    ASSERT_EQ(MSKV_SUCCESS, tcpu_create(&cd, &three));
    ASSERT_TRUE(tcpu_fix_init(&f, 16, 2, 64, MSKV_DTYPE_F32, seqs, 3, 1, 1, 0, seed));
    rows = (size_t)f.plan.total_q * 8;
    q = tcpu_queries(&f, 8, MSKV_DTYPE_F32, seed);
    ASSERT_TRUE(q != NULL);
    EXPECT_TRUE(tcpu_run(one, &f, &at, q, &o1, &l1));
    EXPECT_TRUE(tcpu_run(three, &f, &at, q, &o3, &l3));
    EXPECT_TRUE(memcmp(o1, o3, rows * 64 * sizeof(float)) == 0);
    EXPECT_TRUE(memcmp(l1, l3, rows * sizeof(float)) == 0);
    /* and a second call on the same pool reuses its threads */
    free(o3); free(l3);
    EXPECT_TRUE(tcpu_run(three, &f, &at, q, &o3, &l3));
    EXPECT_TRUE(memcmp(o1, o3, rows * 64 * sizeof(float)) == 0);
    free(q); free(o1); free(l1); free(o3); free(l3);
    tcpu_fix_free(&f);
    mskv_cpu_destroy(one);
    mskv_cpu_destroy(three);
}

static size_t tcpu_largest_alloc;
static void *tcpu_alloc_sized(void *u, size_t n) { (void)u; if (n > tcpu_largest_alloc) tcpu_largest_alloc = n; return malloc(n); }
static void *tcpu_realloc_sized(void *u, void *p, size_t n) { (void)u; if (n > tcpu_largest_alloc) tcpu_largest_alloc = n; return realloc(p, n); }
static void tcpu_free_sized(void *u, void *p) { (void)u; free(p); }

/* A many-row item covers several row tiles, each key block converted once
   for all of them; how many depends on the thread count (enough items to
   balance), and a row's result must not: one thread (few items of several
   tiles) against 16 (an item per tile) gives the same bits, and matches the
   oracle. Masked segments whose tiles start at different keys, a run split
   by released positions, and a last tile of 8 rows (the few-row kernels). */
TEST(many_row_items_of_several_tiles_give_the_same_bits_as_one_tile_each) {
    tcpu_seq seqs[3] = {{200, 700, 700, 0}, {150, 400, 120, 30}, {36, 100, 100, 0}};
    static const mskv_mask masks[2] = {MSKV_MASK_CAUSAL, MSKV_MASK_WINDOW};
    uint64_t seed = mt_seed();
    mskv_cpu *one = NULL, *many = NULL;
    mskv_cpu_desc cd;
    mskv_cpu_info i1, im;
    int mi;
    memset(&cd, 0, sizeof cd);
    ASSERT_EQ(MSKV_SUCCESS, tcpu_create(&cd, &one));
    cd.num_threads = 16;
    ASSERT_EQ(MSKV_SUCCESS, tcpu_create(&cd, &many));
    for (mi = 0; mi < 2; mi++) {
        tcpu_fix f;
        mskv_attn at = tcpu_attn(4, masks[mi], 90, MSKV_DTYPE_BF16);
        float *o1 = NULL, *l1 = NULL, *om = NULL, *lm = NULL;
        size_t rows;
        void *q;
        ASSERT_TRUE(tcpu_fix_init(&f, 7, 2, 64, MSKV_DTYPE_BF16, seqs, 3, 1, 1, 0, seed + (uint64_t)mi));
        rows = (size_t)f.plan.total_q * 4;
        q = tcpu_queries(&f, 4, MSKV_DTYPE_BF16, seed);
        ASSERT_TRUE(q != NULL);
        EXPECT_TRUE(tcpu_run(one, &f, &at, q, &o1, &l1));
        ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_info_get(one, &i1));
        EXPECT_TRUE(tcpu_run(many, &f, &at, q, &om, &lm));
        ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_info_get(many, &im));
        /* the one-thread call grouped tiles into fewer items */
        EXPECT_LT((long long)i1.last_call_items, (long long)im.last_call_items);
        EXPECT_TRUE(o1 && om && memcmp(o1, om, rows * 64 * tcpu_esize(at.q_dtype)) == 0);  /* o holds bf16 */
        EXPECT_TRUE(l1 && lm && memcmp(l1, lm, rows * sizeof(float)) == 0);
        tcpu_check_case(tcpu_mask_name(at.mask), one, &f, &at, seed, __LINE__);
        free(q); free(o1); free(l1); free(om); free(lm);
        tcpu_fix_free(&f);
    }
    mskv_cpu_destroy(one);
    mskv_cpu_destroy(many);
}

TEST(a_small_workspace_budget_picks_smaller_tiles) {
    tcpu_seq seqs[1] = {{20, 150, 150, 0}};
    tcpu_fix f;
    mskv_attn at = tcpu_attn(2, MSKV_MASK_WINDOW, 60, MSKV_DTYPE_F32);
    mskv_cpu_desc cd;
    mskv_cpu *cpu = NULL;
    memset(&cd, 0, sizeof cd);
    cd.workspace_bytes = 1000;
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cpu_create(&cd, &cpu));
    EXPECT_TRUE(cpu == NULL);
    cd.workspace_bytes = 100000;
    cd.allocator.alloc = tcpu_alloc_sized;
    cd.allocator.realloc = tcpu_realloc_sized;
    cd.allocator.free = tcpu_free_sized;
    tcpu_largest_alloc = 0;
    ASSERT_EQ(MSKV_SUCCESS, tcpu_create(&cd, &cpu));
    /* one thread: its workspace is the largest block, within the budget (rounded to 64 bytes) */
    EXPECT_LE((long long)tcpu_largest_alloc, 100000 + 64);
    EXPECT_GT((long long)tcpu_largest_alloc, 10000);
    ASSERT_TRUE(tcpu_fix_init(&f, 16, 1, 128, MSKV_DTYPE_F32, seqs, 1, 1, 1, 0, mt_seed()));
    tcpu_check_case("100 KB workspace", cpu, &f, &at, mt_seed(), __LINE__);
    tcpu_fix_free(&f);
    mskv_cpu_destroy(cpu);
}

/* Counts the calls to a run-time allocator, to show the attention call makes none. */
typedef struct tcpu_counter { int allocs, frees; } tcpu_counter;
static void *tcpu_alloc(void *u, size_t n) { ((tcpu_counter *)u)->allocs++; return malloc(n); }
static void *tcpu_realloc(void *u, void *p, size_t n) { ((tcpu_counter *)u)->allocs++; return realloc(p, n); }
static void tcpu_freefn(void *u, void *p) { ((tcpu_counter *)u)->frees++; free(p); }

TEST(attention_allocates_nothing_after_create) {
    tcpu_seq seqs[1] = {{32, 300, 300, 0}};
    tcpu_counter cnt = {0, 0};
    tcpu_fix f;
    mskv_attn at = tcpu_attn(4, MSKV_MASK_NONE, 0, MSKV_DTYPE_F32);
    mskv_cpu_desc cd;
    mskv_cpu *cpu = NULL;
    int after_create;
    memset(&cd, 0, sizeof cd);
    cd.num_threads = 2;
    cd.allocator.user = &cnt;
    cd.allocator.alloc = tcpu_alloc;
    cd.allocator.realloc = tcpu_realloc;
    cd.allocator.free = tcpu_freefn;
    ASSERT_EQ(MSKV_SUCCESS, tcpu_create(&cd, &cpu));
    after_create = cnt.allocs;
    EXPECT_GT(after_create, 0);
    ASSERT_TRUE(tcpu_fix_init(&f, 16, 1, 64, MSKV_DTYPE_F32, seqs, 1, 1, 1, 0, mt_seed()));
    tcpu_check_case("counted allocator", cpu, &f, &at, mt_seed(), __LINE__);
    EXPECT_EQ(after_create, cnt.allocs);
    tcpu_fix_free(&f);
    mskv_cpu_destroy(cpu);
    EXPECT_EQ(cnt.allocs, cnt.frees);
}

TEST(attention_rejects_bad_arguments_and_writes_nothing) {
    tcpu_seq seqs[2] = {{3, 20, 20, 0}, {2, 5, 5, 0}};
    tcpu_fix f;
    mskv_attn at = tcpu_attn(4, MSKV_MASK_CAUSAL, 0, MSKV_DTYPE_F32), bad;
    mskv_pools pools, bp;
    mskv_plan plan;
    float o[5 * 4 * 64], lse[5 * 4], q[5 * 4 * 64] = {0};
    int32_t saved, qo_bad[3] = {0, 3, 10};
    size_t i;
    ASSERT_TRUE(tcpu_fix_init(&f, 16, 2, 64, MSKV_DTYPE_F32, seqs, 2, 1, 1, 0, mt_seed()));
    pools = tcpu_pools(&f);
    for (i = 0; i < sizeof o / sizeof o[0]; i++) o[i] = 42.0f;
    for (i = 0; i < sizeof lse / sizeof lse[0]; i++) lse[i] = 42.0f;
#define TCPU_REJECTS(code, P, PL, A)                                                          \
    do {                                                                                      \
        EXPECT_EQ(code, mskv_cpu_attention_pools(NULL, P, PL, A, q, o, lse));                 \
        for (i = 0; i < sizeof o / sizeof o[0]; i++) if (o[i] != 42.0f) break;                \
        EXPECT_EQ(sizeof o / sizeof o[0], i);                                                 \
    } while (0)
    TCPU_REJECTS(MSKV_ERROR_NULL_POINTER, NULL, &f.plan, &at);
    TCPU_REJECTS(MSKV_ERROR_NULL_POINTER, &pools, NULL, &at);
    TCPU_REJECTS(MSKV_ERROR_NULL_POINTER, &pools, &f.plan, (const mskv_attn *)NULL);
    EXPECT_EQ(MSKV_ERROR_NULL_POINTER, mskv_cpu_attention_pools(NULL, &pools, &f.plan, &at, NULL, o, lse));
    bad = at; bad.q_heads = 3;                       /* not a multiple of 2 kv heads */
    TCPU_REJECTS(MSKV_ERROR_INVALID_ARGUMENT, &pools, &f.plan, &bad);
    bad = at; bad.q_dtype = (mskv_dtype)7;
    TCPU_REJECTS(MSKV_ERROR_INVALID_ARGUMENT, &pools, &f.plan, &bad);
    bad = at; bad.mask = (mskv_mask)9;
    TCPU_REJECTS(MSKV_ERROR_INVALID_ARGUMENT, &pools, &f.plan, &bad);
    bad = at; bad.mask = MSKV_MASK_WINDOW; bad.window_left = -1;
    TCPU_REJECTS(MSKV_ERROR_INVALID_ARGUMENT, &pools, &f.plan, &bad);
    bp = pools; bp.head_dim = 0;
    TCPU_REJECTS(MSKV_ERROR_INVALID_ARGUMENT, &bp, &f.plan, &at);
    bp = pools; bp.head_dim = MSKV_CPU_MAX_HEAD_DIM + 16;
    TCPU_REJECTS(MSKV_ERROR_INVALID_ARGUMENT, &bp, &f.plan, &at);
    bp = pools; bp.dtype = (mskv_dtype)5;
    TCPU_REJECTS(MSKV_ERROR_INVALID_ARGUMENT, &bp, &f.plan, &at);
    bp = pools; bp.page_size = 8;                    /* plan built for another page size */
    TCPU_REJECTS(MSKV_ERROR_INVALID_ARGUMENT, &bp, &f.plan, &at);
    saved = f.indices[1]; f.indices[1] = f.num_pages; /* a page outside the pool */
    TCPU_REJECTS(MSKV_ERROR_OUT_OF_RANGE, &pools, &f.plan, &at);
    f.indices[1] = saved;
    saved = f.kv_len[0]; f.kv_len[0] = 40;          /* more tokens than its pages hold */
    TCPU_REJECTS(MSKV_ERROR_INVALID_ARGUMENT, &pools, &f.plan, &at);
    f.kv_len[0] = saved;
    plan = f.plan; plan.qo_indptr = qo_bad; plan.total_q = 10; /* causal queries past the sequence */
    TCPU_REJECTS(MSKV_ERROR_INVALID_ARGUMENT, &pools, &plan, &at);
#undef TCPU_REJECTS
    EXPECT_EQ(MSKV_SUCCESS, mskv_cpu_attention_pools(NULL, &pools, &f.plan, &at, q, o, lse)); /* the fixture itself is fine */
    tcpu_fix_free(&f);
}

/* ---- through the arena ------------------------------------------------------------- */

/* K/V of absolute position p, head h, dim d: a fixed function, so the
   reference can regenerate any position without a page table. */
static float tcpu_kv_at(int kind, int64_t p, int32_t h, int32_t d) {
    uint64_t s = ((uint64_t)p * 1315423911u) ^ ((uint64_t)h << 40) ^ ((uint64_t)d << 20) ^ (uint64_t)kind << 60;
    s ^= s >> 29; s *= 0xbf58476d1ce4e5b9ull; s ^= s >> 32;
    return (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* Writes a step's K/V through the plan (rows keyed by plan positions). */
static mskv_result tcpu_write_step(mskv_arena *a, const mskv_plan *plan, int32_t kvh, int32_t D) {
    int32_t t, h, d;
    size_t n = (size_t)plan->total_q * (size_t)kvh * (size_t)D;
    float *k = (float *)malloc(n * 4 + 4), *v = (float *)malloc(n * 4 + 4);
    mskv_result r;
    if (!k || !v) { free(k); free(v); return MSKV_ERROR_OUT_OF_MEMORY; }
    for (t = 0; t < plan->total_q; t++)
        for (h = 0; h < kvh; h++)
            for (d = 0; d < D; d++) {
                k[((size_t)t * kvh + h) * D + d] = tcpu_kv_at(0, plan->positions[t], h, d);
                v[((size_t)t * kvh + h) * D + d] = tcpu_kv_at(1, plan->positions[t], h, d);
            }
    r = mskv_cpu_write_kv(a, 0, plan, k, v, MSKV_DTYPE_F32, NULL);
    free(k); free(v);
    return r;
}

TEST(after_release_with_a_protected_prefix_attention_sees_prefix_and_survivors) {
    enum { P = 16, KVH = 2, D = 64, QH = 4, FIRST = 100, PREFIX = 20, RELEASE = 50, NEW = 8 };
    mskv_arena_desc ad;
    mskv_arena *a = NULL;
    mskv_request req;
    mskv_segment seg;
    mskv_plan_desc pd;
    mskv_plan plan;
    mskv_request_info info;
    mskv_attn at = tcpu_attn(QH, MSKV_MASK_CAUSAL, 0, MSKV_DTYPE_F32);
    int64_t released = 0, kept[256], pos;
    int32_t nkept = 0, i, h, d, j;
    float q[NEW * QH * D], o[NEW * QH * D], lse[NEW * QH];
    memset(&ad, 0, sizeof ad);
    ad.num_pages = 32; ad.page_size = P; ad.num_layers = 1; ad.kv_heads = KVH; ad.head_dim = D; ad.dtype = MSKV_DTYPE_F32;
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&ad, &a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &req));
    memset(&pd, 0, sizeof pd);
    pd.kind = MSKV_PLAN_SELF;
    pd.pos_mode = MSKV_POS_1D;
    memset(&plan, 0, sizeof plan);
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(a, 4, 256, 64, &plan));
    /* step 1: 100 tokens written and committed */
    seg.request = req; seg.n_tokens = FIRST;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &seg, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, &seg, 1, &pd, &plan));
    ASSERT_EQ(MSKV_SUCCESS, tcpu_write_step(a, &plan, KVH, D));
    ASSERT_EQ(MSKV_SUCCESS, mskv_commit(a, &seg, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_publish(a, &seg, 1, NULL));
    /* protect 20 tokens (pages 0-1 whole: positions 0..31), release 50 live tokens
       from position 32: the release point is 82, so pages [32,48) [48,64)
       [64,80) go and [80,96) stays */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_protect_prefix(a, req, PREFIX));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, req, RELEASE, &released));
    EXPECT_EQ(48, released);
    /* step 2: 8 new tokens attend causally */
    seg.n_tokens = NEW;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &seg, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, &seg, 1, &pd, &plan));
    ASSERT_EQ(MSKV_SUCCESS, tcpu_write_step(a, &plan, KVH, D));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_info_get(a, req, &info));
    EXPECT_EQ(2, info.prefix_pages);
    EXPECT_EQ(80, info.live_start);
    /* the pages hold [0, 32) and [80, ...); the default (exact) plan shows the
       protected 20 and the tokens from the release point on, as a rolling cache would */
    EXPECT_EQ(32 + FIRST + NEW - 80, plan.kv_len[0]);
    EXPECT_EQ(PREFIX, plan.vis_sink_end[0]);
    EXPECT_EQ(32 + RELEASE, plan.vis_window_start[0]);   /* released from 32 on */
    for (pos = 0; pos < PREFIX; pos++) kept[nkept++] = pos;
    for (pos = 32 + RELEASE; pos < FIRST + NEW; pos++) kept[nkept++] = pos;
    for (i = 0; i < NEW; i++) EXPECT_EQ(FIRST + i, plan.positions[i]);
    tcpu_srand(mt_seed());
    for (i = 0; i < NEW * QH * D; i++) q[i] = (float)tcpu_uniform(-2, 2);
    ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_attention(NULL, a, 0, &plan, &at, q, o, lse));
    /* the reference: causal over exactly the kept positions */
    for (i = 0; i < NEW; i++)
        for (h = 0; h < QH; h++) {
            double w[256], mx = -INFINITY, sum = 0, ref[D];
            int64_t qp = FIRST + i;
            int32_t n = 0;
            for (j = 0; j < nkept; j++) {
                double dot = 0;
                if (kept[j] > qp) continue;
                for (d = 0; d < D; d++) dot += (double)q[(i * QH + h) * D + d] * tcpu_kv_at(0, kept[j], h / (QH / KVH), d);
                w[n] = dot / sqrt((double)D);
                if (w[n] > mx) mx = w[n];
                n++;
            }
            for (d = 0; d < D; d++) ref[d] = 0;
            n = 0;
            for (j = 0; j < nkept; j++) {
                double e;
                if (kept[j] > qp) continue;
                e = exp(w[n++] - mx);
                sum += e;
                for (d = 0; d < D; d++) ref[d] += e * tcpu_kv_at(1, kept[j], h / (QH / KVH), d);
            }
            for (d = 0; d < D; d++)
                if (fabs(ref[d] / sum - o[(i * QH + h) * D + d]) > 1e-5) {
                    mt_fail(__FILE__, __LINE__, "query %d head %d dim %d: expected %.8g got %.8g", i, h, d, ref[d] / sum,
                            (double)o[(i * QH + h) * D + d]);
                    i = NEW; h = QH;
                    break;
                }
            if (i < NEW) EXPECT_NEAR(mx + log(sum), lse[i * QH + h], 1e-5 * fabs(mx + log(sum)) + 1e-5);
        }
    EXPECT_EQ(MSKV_SUCCESS, mskv_commit(a, &seg, 1));
    mskv_plan_free(a, &plan);
    mskv_arena_destroy(a);
}

/* ---- one mskv_cpu, several callers ---- */

#ifndef MSKV_NO_THREADS
typedef struct tcpu_caller {
    mskv_cpu *cpu;
    const tcpu_fix *f;
    const mskv_attn *at;
    const void *q;
    const float *want;
    int mismatches;
} tcpu_caller;

static void tcpu_caller_run(void *arg) {
    tcpu_caller *c = (tcpu_caller *)arg;
    size_t n = (size_t)c->f->plan.total_q * (size_t)c->at->q_heads * (size_t)c->f->D;
    int it;
    for (it = 0; it < 20; it++) {
        float *o = NULL, *lse = NULL;
        if (!tcpu_run(c->cpu, c->f, c->at, c->q, &o, &lse) || memcmp(o, c->want, n * sizeof(float)) != 0)
            c->mismatches++;
        free(o);
        free(lse);
    }
}

/* A single-threaded mskv_cpu has one workspace: two callers at once take
   turns on it and each gets exactly its serial result. */
TEST(one_thread_cpu_serialises_concurrent_callers) {
    tcpu_seq seqs[2] = {{64, 300, 300, 0}, {32, 129, 129, 0}};
    uint64_t seed = mt_seed();
    tcpu_fix fa, fb;
    mskv_attn at = tcpu_attn(2, MSKV_MASK_CAUSAL, 0, MSKV_DTYPE_F32);
    mskv_cpu_desc cd;
    mskv_cpu *cpu = NULL;
    void *qa, *qb;
    float *wa = NULL, *wb = NULL, *la = NULL, *lb = NULL;
    tcpu_caller ca, cb;
    mtu_thread *ta, *tb;
    memset(&cd, 0, sizeof cd);   /* one thread: the caller's */
    ASSERT_EQ(MSKV_SUCCESS, tcpu_create(&cd, &cpu));
    ASSERT_TRUE(tcpu_fix_init(&fa, 16, 1, 64, MSKV_DTYPE_F32, seqs, 1, 0, 0, 0, seed));
    ASSERT_TRUE(tcpu_fix_init(&fb, 16, 1, 64, MSKV_DTYPE_F32, seqs + 1, 1, 1, 0, 0, seed + 1));
    qa = tcpu_queries(&fa, 2, MSKV_DTYPE_F32, seed + 2);
    qb = tcpu_queries(&fb, 2, MSKV_DTYPE_F32, seed + 3);
    ASSERT_TRUE(qa && qb);
    ASSERT_TRUE(tcpu_run(cpu, &fa, &at, qa, &wa, &la));
    ASSERT_TRUE(tcpu_run(cpu, &fb, &at, qb, &wb, &lb));
    ca.cpu = cpu; ca.f = &fa; ca.at = &at; ca.q = qa; ca.want = wa; ca.mismatches = 0;
    cb.cpu = cpu; cb.f = &fb; cb.at = &at; cb.q = qb; cb.want = wb; cb.mismatches = 0;
    ta = mtu_thread_start(tcpu_caller_run, &ca);
    ASSERT_TRUE(ta != NULL);
    tb = mtu_thread_start(tcpu_caller_run, &cb);
    if (!tb) mtu_thread_join(ta);
    ASSERT_TRUE(tb != NULL);
    mtu_thread_join(ta);
    mtu_thread_join(tb);
    EXPECT_EQ(0, ca.mismatches);
    EXPECT_EQ(0, cb.mismatches);
    free(qa); free(qb); free(wa); free(wb); free(la); free(lb);
    tcpu_fix_free(&fa);
    tcpu_fix_free(&fb);
    mskv_cpu_destroy(cpu);
}
#endif

/* ---- instruction-set paths --------------------------------------------------------- */

#define TCPU_NPATHS 7
static const mskv_cpu_isa tcpu_paths[TCPU_NPATHS] = {MSKV_CPU_ISA_PORTABLE, MSKV_CPU_ISA_AVX2, MSKV_CPU_ISA_AVX512, MSKV_CPU_ISA_NEON,
                                                     MSKV_CPU_ISA_AVX512_BF16, MSKV_CPU_ISA_BF16_EMU, MSKV_CPU_ISA_AMX_BF16};

/* Keeps the last message a pool's logger received. */
static char tcpu_logged[256];
static void tcpu_log(void *u, mskv_log_level level, const char *msg) {
    (void)u; (void)level;
    snprintf(tcpu_logged, sizeof tcpu_logged, "%s", msg);
}

TEST(cpu_info_names_the_path_in_use) {
    mskv_cpu_desc cd;
    mskv_cpu *cpu = NULL;
    mskv_cpu_info info;
    int i;
    memset(&cd, 0, sizeof cd);
    cd.num_threads = 2;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_create(&cd, &cpu));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_info_get(cpu, &info));
    EXPECT_TRUE(info.isa != MSKV_CPU_ISA_AUTO);  /* AUTO resolves to a real path */
    EXPECT_TRUE(mskv_cpu_isa_available(info.isa));
#ifndef MSKV_NO_THREADS
    EXPECT_EQ(2, info.num_threads);
#endif
    EXPECT_GT((long long)info.workspace_bytes, 0);
    EXPECT_EQ(MSKV_ERROR_NULL_POINTER, mskv_cpu_info_get(NULL, &info));
    EXPECT_EQ(MSKV_ERROR_NULL_POINTER, mskv_cpu_info_get(cpu, NULL));
    mskv_cpu_destroy(cpu);
    for (i = 0; i < TCPU_NPATHS; i++) {
        if (!mskv_cpu_isa_available(tcpu_paths[i])) continue;
        cd.isa = tcpu_paths[i];
        ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_create(&cd, &cpu));
        ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_info_get(cpu, &info));
        EXPECT_EQ((int)tcpu_paths[i], (int)info.isa);
        mskv_cpu_destroy(cpu);
    }
    EXPECT_TRUE(mskv_cpu_isa_available(MSKV_CPU_ISA_PORTABLE));  /* everywhere */
    EXPECT_TRUE(strcmp(mskv_cpu_isa_name(MSKV_CPU_ISA_AVX512), "avx512") == 0);
    EXPECT_TRUE(strcmp(mskv_cpu_isa_name(MSKV_CPU_ISA_PORTABLE), "portable") == 0);
    EXPECT_TRUE(strcmp(mskv_cpu_isa_name(MSKV_CPU_ISA_AVX512_BF16), "avx512_bf16") == 0);
    EXPECT_TRUE(strcmp(mskv_cpu_isa_name(MSKV_CPU_ISA_BF16_EMU), "bf16_emu") == 0);
    EXPECT_TRUE(mskv_cpu_isa_available(MSKV_CPU_ISA_BF16_EMU));  /* plain C: everywhere */
    EXPECT_TRUE(strcmp(mskv_cpu_isa_name(MSKV_CPU_ISA_AMX_BF16), "amx_bf16") == 0);
    EXPECT_TRUE(strcmp(mskv_cpu_isa_name((mskv_cpu_isa)8), "unknown") == 0);
}

TEST(cpu_create_refuses_a_path_this_machine_lacks_and_logs_why) {
    mskv_cpu_desc cd;
    mskv_cpu *cpu = (mskv_cpu *)&cd;
    int i, lacking = -1;
    for (i = 1; i < TCPU_NPATHS; i++)
        if (!mskv_cpu_isa_available(tcpu_paths[i])) lacking = i;
    if (lacking < 0) SKIP("this machine runs every path (an x86 lacks NEON and an arm64 AVX2: not expected here)");
    memset(&cd, 0, sizeof cd);
    cd.isa = tcpu_paths[lacking];
    cd.log = tcpu_log;
    tcpu_logged[0] = 0;
    EXPECT_EQ(MSKV_ERROR_UNSUPPORTED, mskv_cpu_create(&cd, &cpu));
    EXPECT_TRUE(cpu == NULL);
    EXPECT_TRUE(strstr(tcpu_logged, mskv_cpu_isa_name(tcpu_paths[lacking])) != NULL);
    cd.isa = (mskv_cpu_isa)(MSKV_CPU_ISA_AMX_BF16 + 1);
    tcpu_logged[0] = 0;
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_cpu_create(&cd, &cpu));
    EXPECT_TRUE(cpu == NULL);
    EXPECT_TRUE(strstr(tcpu_logged, "desc->isa = 8") != NULL);  /* the field and its value */
}

#if !defined(_WIN32)
/* Sets (value) or removes (NULL) MSKV_CPU_ISA. */
static void tcpu_setenv(const char *value) {
    if (value) setenv("MSKV_CPU_ISA", value, 1);
    else unsetenv("MSKV_CPU_ISA");
}

/* The isa a default pool runs with MSKV_CPU_ISA set to value; what was logged in tcpu_logged. */
static mskv_cpu_isa tcpu_isa_with_env(const char *value) {
    mskv_cpu_desc cd;
    mskv_cpu *cpu = NULL;
    mskv_cpu_info info;
    memset(&cd, 0, sizeof cd);
    cd.log = tcpu_log;
    tcpu_logged[0] = 0;
    tcpu_setenv(value);
    if (mskv_cpu_create(&cd, &cpu) != MSKV_SUCCESS) return MSKV_CPU_ISA_AUTO;
    mskv_cpu_info_get(cpu, &info);
    mskv_cpu_destroy(cpu);
    return info.isa;
}

TEST(mskv_cpu_isa_in_the_environment_forces_a_path_and_a_bad_value_is_logged_and_ignored) {
    const char *old = getenv("MSKV_CPU_ISA");
    char saved[64] = {0};
    mskv_cpu_isa best;
    int i;
    if (old) snprintf(saved, sizeof saved, "%s", old);
    best = tcpu_isa_with_env(NULL);
    EXPECT_EQ(0, (int)strlen(tcpu_logged));
    EXPECT_EQ((int)MSKV_CPU_ISA_PORTABLE, (int)tcpu_isa_with_env("portable"));
    EXPECT_EQ((int)best, (int)tcpu_isa_with_env("auto"));
    EXPECT_EQ((int)best, (int)tcpu_isa_with_env("sse9"));
    EXPECT_TRUE(strstr(tcpu_logged, "sse9") != NULL);
    for (i = 1; i < TCPU_NPATHS; i++) {
        const char *name = mskv_cpu_isa_name(tcpu_paths[i]);
        if (mskv_cpu_isa_available(tcpu_paths[i])) {
            EXPECT_EQ((int)tcpu_paths[i], (int)tcpu_isa_with_env(name));
        } else {
            EXPECT_EQ((int)best, (int)tcpu_isa_with_env(name));
            EXPECT_TRUE(strstr(tcpu_logged, name) != NULL);
        }
    }
    tcpu_setenv(old ? saved : NULL);
}
#endif

/* One decode query per kv head group over a long sequence: its keys go to
   several items (8 chunks of at least 512 keys), merged by LSE. */
TEST(one_long_decode_sequence_splits_its_keys_into_chunks_and_matches_reference) {
    tcpu_seq seqs[1] = {{1, 5000, 5000, 0}};
    static const mskv_mask masks[3] = {MSKV_MASK_NONE, MSKV_MASK_CAUSAL, MSKV_MASK_WINDOW};
    uint64_t seed = mt_seed();
    mskv_cpu_desc cd;
    mskv_cpu *cpu = NULL;
    mskv_cpu_info info;
    int mi;
    memset(&cd, 0, sizeof cd);
    cd.num_threads = 2;
    ASSERT_EQ(MSKV_SUCCESS, tcpu_create(&cd, &cpu));
    for (mi = 0; mi < 3; mi++) {
        tcpu_fix f;
        mskv_attn at = tcpu_attn(4, masks[mi], 1500, MSKV_DTYPE_F32);  /* the window leaves chunks empty */
        char what[64];
        ASSERT_TRUE(tcpu_fix_init(&f, 16, 1, 128, mi == 2 ? MSKV_DTYPE_F16 : MSKV_DTYPE_F32, seqs, 1, 1, 1, 1, seed + (uint64_t)mi));
        snprintf(what, sizeof what, "one sequence, mask %s", tcpu_mask_name(at.mask));
        tcpu_check_case(what, cpu, &f, &at, seed, __LINE__);
        ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_info_get(cpu, &info));
        EXPECT_EQ(8, (long long)info.last_call_items);
        tcpu_fix_free(&f);
    }
    mskv_cpu_destroy(cpu);
}

TEST(split_decode_gives_the_same_bits_on_any_number_of_threads) {
    tcpu_seq seqs[2] = {{1, 3000, 3000, 0}, {2, 1200, 600, 40}};
    uint64_t seed = mt_seed();
    tcpu_fix f;
    mskv_attn at = tcpu_attn(8, MSKV_MASK_CAUSAL, 0, MSKV_DTYPE_F32);
    mskv_cpu_desc cd;
    mskv_cpu *cpus[3] = {NULL, NULL, NULL};
    float *o[3] = {NULL, NULL, NULL}, *l[3] = {NULL, NULL, NULL};
    mskv_cpu_info info;
    void *q;
    size_t rows;
    int i;
    memset(&cd, 0, sizeof cd);
    ASSERT_TRUE(tcpu_fix_init(&f, 16, 2, 64, MSKV_DTYPE_F32, seqs, 2, 1, 1, 0, seed));
    rows = (size_t)f.plan.total_q * 8;
    q = tcpu_queries(&f, 8, MSKV_DTYPE_F32, seed);
    ASSERT_TRUE(q != NULL);
    for (i = 0; i < 3; i++) {
        cd.num_threads = i + 1;
        ASSERT_EQ(MSKV_SUCCESS, tcpu_create(&cd, &cpus[i]));
        EXPECT_TRUE(tcpu_run(cpus[i], &f, &at, q, &o[i], &l[i]));
        ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_info_get(cpus[i], &info));
        EXPECT_EQ(2 * 6 + 2 * 3, (long long)info.last_call_items);  /* 6 and 3 chunks, per kv head */
    }
    for (i = 1; i < 3; i++) {
        EXPECT_TRUE(memcmp(o[0], o[i], rows * 64 * sizeof(float)) == 0);
        EXPECT_TRUE(memcmp(l[0], l[i], rows * sizeof(float)) == 0);
    }
    for (i = 0; i < 3; i++) { free(o[i]); free(l[i]); mskv_cpu_destroy(cpus[i]); }
    free(q);
    tcpu_fix_free(&f);
}

TEST(a_decode_batch_of_64_or_more_kv_head_units_runs_whole_sequences) {
    tcpu_seq seqs[TCPU_MAX_SEQS];
    uint64_t seed = mt_seed();
    tcpu_fix f;
    mskv_attn at = tcpu_attn(16, MSKV_MASK_NONE, 0, MSKV_DTYPE_F32);
    mskv_cpu_desc cd;
    mskv_cpu *cpu = NULL;
    mskv_cpu_info info;
    int b;
    for (b = 0; b < TCPU_MAX_SEQS; b++) { seqs[b].qo = 1; seqs[b].kv = 600 + 7 * b; seqs[b].split = seqs[b].kv; seqs[b].shift = 0; }
    memset(&cd, 0, sizeof cd);
    cd.num_threads = 1;  /* one thread: kv heads are grouped per item as far as the tiles allow */
    ASSERT_EQ(MSKV_SUCCESS, tcpu_create(&cd, &cpu));
    ASSERT_TRUE(tcpu_fix_init(&f, 16, 4, 64, MSKV_DTYPE_BF16, seqs, TCPU_MAX_SEQS, 1, 1, 0, seed)); /* 16 x 4 = 64 units */
    tcpu_check_case("64 units", cpu, &f, &at, seed, __LINE__);
    ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_info_get(cpu, &info));
    EXPECT_LE((long long)info.last_call_items, TCPU_MAX_SEQS * 4);  /* no sequence was cut */
    tcpu_fix_free(&f);
    mskv_cpu_destroy(cpu);
}

/* XINUSE (xgetbv with ecx = 1): the register state components not in their
   initial configuration; bit 2 is the upper halves of YMM0-15, bit 6 those
   of ZMM0-15. 0 when the CPU cannot say. */
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#define TCPU_XINUSE 1
static int tcpu_xinuse(uint64_t *out) {
    unsigned a = 0, b = 0, c = 0, d = 0, lo, hi;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return 0;   /* OSXSAVE */
    __cpuid_count(0xd, 1, a, b, c, d);
    if (!(a & 4u)) return 0;                                                /* XGETBV with ecx = 1 */
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(1));
    *out = (uint64_t)hi << 32 | lo;
    return 1;
}
#endif

/* Regression: the AVX paths returned with the vector registers' upper halves
   dirty (GCC puts no vzeroupper at the end of target-attributed functions),
   which made the caller's SSE code after each call several times slower. */
TEST(attention_on_an_avx_path_returns_with_the_upper_vector_halves_clear) {
#ifdef TCPU_XINUSE
    static const mskv_cpu_isa isas[4] = {MSKV_CPU_ISA_AVX2, MSKV_CPU_ISA_AVX512, MSKV_CPU_ISA_AVX512_BF16, MSKV_CPU_ISA_AMX_BF16};
    tcpu_seq seqs[2] = {{9, 97, 97, 0}, {1, 700, 700, 0}};
    uint64_t seed = mt_seed(), state = 0;
    int i, ran = 0;
    __asm__ volatile("vzeroupper");
    if (!tcpu_xinuse(&state)) SKIP("this CPU cannot report which register state is in use (no XGETBV with ecx = 1)");
    if (state & 0x44u) SKIP("this CPU reports the upper vector halves in use even right after vzeroupper (XINUSE 0x%llx)", (unsigned long long)state);
    for (i = 0; i < 4; i++) {
        mskv_cpu_desc cd;
        mskv_cpu *cpu = NULL;
        tcpu_fix f;
        mskv_attn at = tcpu_attn(4, MSKV_MASK_CAUSAL, 0, MSKV_DTYPE_BF16);
        float *o = NULL, *lse = NULL;
        void *q;
        if (!mskv_cpu_isa_available(isas[i])) continue;
        memset(&cd, 0, sizeof cd);
        cd.isa = isas[i];
        ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_create(&cd, &cpu));
        ASSERT_TRUE(tcpu_fix_init(&f, 16, 2, 64, MSKV_DTYPE_BF16, seqs, 2, 1, 0, 0, seed));
        q = tcpu_queries(&f, 4, MSKV_DTYPE_BF16, seed);
        ASSERT_TRUE(q != NULL);
        EXPECT_TRUE(tcpu_run(cpu, &f, &at, q, &o, &lse));
        ASSERT_TRUE(tcpu_xinuse(&state));
        if (state & 0x44u) mt_fail(__FILE__, __LINE__, "%s path: XINUSE 0x%llx after the call: upper vector halves left dirty", mskv_cpu_isa_name(isas[i]), (unsigned long long)state);
        /* the AMX path gives its tiles back (tilerelease): no tile configuration or data in use */
        if (state & 0x60000u) mt_fail(__FILE__, __LINE__, "%s path: XINUSE 0x%llx after the call: tile state left in use", mskv_cpu_isa_name(isas[i]), (unsigned long long)state);
        ran++;
        free(q); free(o); free(lse);
        tcpu_fix_free(&f);
        mskv_cpu_destroy(cpu);
    }
    if (!ran) SKIP("no AVX path runs here");
#else
    SKIP("an x86 check (xgetbv), built here without GCC or Clang on x86");
#endif
}

/* The attention tests above, on one path: every pool they create runs it. */
static void tcpu_suite_on(mskv_cpu_isa isa) {
    mskv_cpu_desc cd;
    memset(&cd, 0, sizeof cd);
    cd.workspace_bytes = 100000;  /* small tiles, like a NULL pool's */
    tcpu_isa = isa;
    if (tcpu_create(&cd, &tcpu_small) != MSKV_SUCCESS) {
        mt_fail(__FILE__, __LINE__, "cannot create a pool on the %s path", mskv_cpu_isa_name(isa));
        tcpu_isa = MSKV_CPU_ISA_AUTO;
        return;
    }
    attention_matches_reference_for_every_page_size_and_length();
    attention_supports_every_gqa_ratio_and_head_dim();
    attention_matches_reference_in_f16_and_bf16();
    attention_matches_reference_over_long_sequences();
    decode_batches_of_one_query_per_sequence_match_reference();
    sixteen_bit_pools_match_reference_for_odd_pages_head_dims_and_groups();
    attention_applies_a_custom_scale();
    shuffled_page_table_gives_the_same_result_as_contiguous();
    unused_pages_filled_with_nan_change_no_output();
    a_query_that_sees_no_key_gets_zero_output_and_minus_infinite_lse();
    splitting_keys_and_merging_by_lse_equals_attention_over_all_keys();
    attention_masks_use_the_plans_explicit_query_positions();
    visibility_bounds_hide_keys_token_exactly_for_every_page_size();
    keys_hidden_by_visibility_bounds_are_never_read();
    causal_split_at_any_point_merges_to_the_unsplit_result();
    dense_attention_matches_reference_in_packed_and_head_major_layouts();
    threaded_attention_is_bit_identical_to_one_thread();
    many_row_items_of_several_tiles_give_the_same_bits_as_one_tile_each();
    a_small_workspace_budget_picks_smaller_tiles();
    one_long_decode_sequence_splits_its_keys_into_chunks_and_matches_reference();
    split_decode_gives_the_same_bits_on_any_number_of_threads();
    a_decode_batch_of_64_or_more_kv_head_units_runs_whole_sequences();
    mskv_cpu_destroy(tcpu_small);
    tcpu_small = NULL;
    tcpu_isa = MSKV_CPU_ISA_AUTO;
}

TEST(portable_path_passes_the_attention_tests) { tcpu_suite_on(MSKV_CPU_ISA_PORTABLE); }

TEST(avx2_path_passes_the_attention_tests) {
    if (!mskv_cpu_isa_available(MSKV_CPU_ISA_AVX2))
        SKIP("the AVX2 path cannot run here: this CPU lacks AVX2, FMA or F16C, or the build has no x86 kernels (not x86, or MSKV_CPU_NO_SIMD)");
    tcpu_suite_on(MSKV_CPU_ISA_AVX2);
}

TEST(avx512_path_passes_the_attention_tests) {
    if (!mskv_cpu_isa_available(MSKV_CPU_ISA_AVX512))
        SKIP("the AVX-512 path cannot run here: this CPU lacks AVX-512 F, or the build has no x86 kernels (not x86, or MSKV_CPU_NO_SIMD)");
    tcpu_suite_on(MSKV_CPU_ISA_AVX512);
}

TEST(bf16_emulation_path_passes_the_attention_tests) { tcpu_suite_on(MSKV_CPU_ISA_BF16_EMU); }

TEST(avx512_bf16_path_passes_the_attention_tests) {
    if (!mskv_cpu_isa_available(MSKV_CPU_ISA_AVX512_BF16))
        SKIP("the AVX512_BF16 path cannot run here: this CPU lacks AVX-512 F, BW or AVX512_BF16, or the build has no x86 kernels (not x86 with GCC or Clang, or MSKV_CPU_NO_SIMD)");
    tcpu_suite_on(MSKV_CPU_ISA_AVX512_BF16);
}

TEST(amx_bf16_path_passes_the_attention_tests) {
    if (!mskv_cpu_isa_available(MSKV_CPU_ISA_AMX_BF16))
        SKIP("the AMX-BF16 path cannot run here: this CPU lacks AVX-512 BW, AMX-TILE or AMX-BF16, the kernel did not lend the tile registers (Linux 5.16 on), or the build has none (x86-64 Linux with GCC 11 / Clang 12 on, not MSKV_CPU_NO_SIMD or MSKV_CPU_NO_AMX)");
    tcpu_suite_on(MSKV_CPU_ISA_AMX_BF16);
}

TEST(neon_path_passes_the_attention_tests) {
    if (!mskv_cpu_isa_available(MSKV_CPU_ISA_NEON))
        SKIP("the NEON path cannot run here: not an arm64 build (or MSKV_CPU_NO_SIMD)");
    tcpu_suite_on(MSKV_CPU_ISA_NEON);
}

/* ---- bf16 arithmetic (the bf16_emu and avx512_bf16 paths) ---------------------------- */

static uint32_t tcpu_fbits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }

/* The bf16 paths' scores follow vdpbf16ps as Intel describes it: per pair,
   the odd element's product is added first, then the even one's, each
   rounded to nearest even; denormal inputs count as zero and denormal
   results are flushed; Q is rounded to bf16 first. With one key the softmax
   is exactly 1 and lse is the score itself, so each of the 16 query heads
   (a video-sized row block: the wide kernels) reads out one case exactly.
   K = [2^-12, 1, 2^-12, 2^100]; the portable f32 path is the control. */
TEST(bf16_paths_add_each_pair_odd_element_first_and_treat_denormals_as_zero) {
    static const mskv_cpu_isa isas[4] = {MSKV_CPU_ISA_PORTABLE, MSKV_CPU_ISA_BF16_EMU, MSKV_CPU_ISA_AVX512_BF16, MSKV_CPU_ISA_AMX_BF16};
    /* q per case, and the score a bf16 path / the f32 path must give */
    const float t12 = ldexpf(1.0f, -12), t24 = ldexpf(1.0f, -24);
    const float qs[6][4] = {
        {t12, 1.0f, -4096.0f, ldexpf(1.0f, -124)}, /* terms 2^-24, 1, -1, 2^-24: odd first gives 1, 1, 0, 0 */
        {0.0f, 1.0f + ldexpf(1.0f, -10), 0.0f, 0.0f}, /* q rounds to 1 in bf16 */
        {ldexpf(1.0f, -120), 0.0f, 0.0f, 0.0f},    /* a product of 2^-132 (first pair): a denormal result */
        {0.0f, 0.0f, ldexpf(1.0f, -120), 0.0f},    /* the same as the last step of the last pair */
        {0.0f, 0.0f, 0.0f, ldexpf(1.0f, -130)},    /* a denormal input (times 2^100 = 2^-30) */
        {0.0f, 2.0f, 3.0f, 0.0f}};                 /* plain: 2 + 3 * 2^-12, exact */
    const float want_bf16[6] = {0.0f, 1.0f, 0.0f, 0.0f, 0.0f, 2.0f + 3.0f * t12};
    const float want_f32[6] = {t24, 1.0f + ldexpf(1.0f, -10), ldexpf(1.0f, -132), ldexpf(1.0f, -132), ldexpf(1.0f, -30), 2.0f + 3.0f * t12};
    const float kv[2][4] = {{t12, 1.0f, t12, ldexpf(1.0f, 100)}, {1.0f, 2.0f, 3.0f, 4.0f}};
    tcpu_seq seqs[1] = {{1, 1, 1, 0}};
    uint64_t seed = mt_seed();
    float q[16 * 4];
    int i, h, d, ran = 0;
    for (h = 0; h < 16; h++)
        for (d = 0; d < 4; d++) q[h * 4 + d] = qs[h < 6 ? h : 5][d];
    for (i = 0; i < 4; i++) {
        mskv_cpu_desc cd;
        mskv_cpu *cpu = NULL;
        tcpu_fix f;
        mskv_attn at = tcpu_attn(16, MSKV_MASK_NONE, 0, MSKV_DTYPE_F32);
        mskv_pools pools;
        float o[16 * 4], lse[16];
        size_t slot;
        if (!mskv_cpu_isa_available(isas[i])) continue;
        memset(&cd, 0, sizeof cd);
        cd.isa = isas[i];
        ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_create(&cd, &cpu));
        ASSERT_TRUE(tcpu_fix_init(&f, 16, 1, 4, MSKV_DTYPE_BF16, seqs, 1, 0, 0, 0, seed));
        slot = (size_t)f.indices[0] * 16 * 4;  /* the one key: slot 0 of its page */
        for (d = 0; d < 4; d++) {
            ((uint16_t *)f.k)[slot + d] = mskv_f32_to_bf16(kv[0][d]);
            ((uint16_t *)f.v)[slot + d] = mskv_f32_to_bf16(kv[1][d]);
        }
        at.scale = 1.0f;
        pools = tcpu_pools(&f);
        ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_attention_pools(cpu, &pools, &f.plan, &at, q, o, lse));
        for (h = 0; h < 16; h++) {
            float want = i == 0 ? want_f32[h < 6 ? h : 5] : want_bf16[h < 6 ? h : 5], w32 = want_f32[h < 6 ? h : 5];
            if (i >= 2) {
                /* the instructions themselves (vdpbf16ps, TDPBF16PS): the emulation's bits are Intel's description of
                   the first; the hardware must be within bf16 rounding of the f32 score */
                if (!(fabsf(lse[h] - w32) <= ldexpf(1.0f, -8) * fabsf(w32) + ldexpf(1.0f, -20)))
                    mt_fail(__FILE__, __LINE__, "%s path, head %d: score %.9g, f32 %.9g (emulation %.9g)", mskv_cpu_isa_name(isas[i]), h,
                            lse[h], w32, want);
                else if (memcmp(&lse[h], &want, sizeof want) != 0)
                    printf("  note: %s head %d gives %.9g (bits 0x%08x) where the emulation gives %.9g\n", mskv_cpu_isa_name(isas[i]), h,
                           lse[h], (unsigned)tcpu_fbits(lse[h]), want);
            } else if (memcmp(&lse[h], &want, sizeof want) != 0)
                mt_fail(__FILE__, __LINE__, "%s path, head %d: score %.9g (bits 0x%08x), expected %.9g", mskv_cpu_isa_name(isas[i]), h,
                        lse[h], (unsigned)tcpu_fbits(lse[h]), want);
            for (d = 0; d < 4; d++) EXPECT_TRUE(o[h * 4 + d] == kv[1][d]);  /* the one value, P = 1 */
        }
        ran += i > 0;
        tcpu_fix_free(&f);
        mskv_cpu_destroy(cpu);
    }
    EXPECT_GT(ran, 0);  /* bf16_emu runs everywhere */
}

/* One call of each of two pools x and y on the same fixture (2 kv heads,
   pages of 16, the given segments, head_dim D, pool dtype pt, f32 Q, 4 q
   heads, causal): the largest error of each against the float64 reference
   (relative above 1; x's includes lse), and whether their O and lse bits
   agree. */
typedef struct tcpu_pair { double err_x, err_y; int same_o, same_lse; } tcpu_pair;
static tcpu_pair tcpu_compare_paths(mskv_cpu *x, mskv_cpu *y, int32_t D, mskv_dtype pt, const tcpu_seq *seqs, uint64_t seed) {
    tcpu_pair out = {1e30, 1e30, 0, 0};
    tcpu_fix f;
    mskv_attn at = tcpu_attn(4, MSKV_MASK_CAUSAL, 0, MSKV_DTYPE_F32);
    float *ox = NULL, *lx = NULL, *oy = NULL, *ly = NULL;
    double *ro, *rl;
    size_t rows, n, i;
    void *q;
    if (!tcpu_fix_init(&f, 16, 2, D, pt, seqs, 2, 1, 1, 2, seed)) { mt_fail(__FILE__, __LINE__, "fixture"); return out; }
    rows = (size_t)f.plan.total_q * 4;
    n = rows * (size_t)D;
    q = tcpu_queries(&f, 4, MSKV_DTYPE_F32, seed + 7);
    ro = (double *)malloc(n * sizeof(double) + 8);
    rl = (double *)malloc(rows * sizeof(double) + 8);
    if (q && ro && rl && tcpu_run(x, &f, &at, q, &ox, &lx) && tcpu_run(y, &f, &at, q, &oy, &ly)) {
        tcpu_reference(&f, &at, q, ro, rl);
        out.err_x = out.err_y = 0;
        for (i = 0; i < n; i++) {
            double sc = fabs(ro[i]) > 1 ? fabs(ro[i]) : 1, ex = fabs(ox[i] - ro[i]) / sc, ey = fabs(oy[i] - ro[i]) / sc;
            out.err_x = ex > out.err_x ? ex : out.err_x;
            out.err_y = ey > out.err_y ? ey : out.err_y;
        }
        for (i = 0; i < rows; i++) {
            double ex = fabs(lx[i] - rl[i]) / (fabs(rl[i]) > 1 ? fabs(rl[i]) : 1);
            out.err_x = ex > out.err_x ? ex : out.err_x;
        }
        out.same_o = memcmp(ox, oy, n * sizeof(float)) == 0;
        out.same_lse = memcmp(lx, ly, rows * sizeof(float)) == 0;
    } else {
        mt_fail(__FILE__, __LINE__, "the calls or their buffers failed");
    }
    free(q); free(ro); free(rl); free(ox); free(lx); free(oy); free(ly);
    tcpu_fix_free(&f);
    return out;
}

/* The AMX path on a bf16 video call: within the bf16 tolerance of the float64
   reference, not the AVX-512 path's bits (the tiles ran), and on an f32 pool
   exactly the AVX-512 path's bits (nothing else changes). Rows enough for
   several tiles of an item and a partial last one, head dims that fill the
   tiles (128, 64) and that leave them padded (63, 40, 8), an odd last key
   block (301 keys) and a causal mask. */
TEST(amx_bf16_path_stays_within_the_bf16_tolerance_and_changes_only_bf16_pools) {
    static const int32_t dims[5] = {128, 64, 63, 40, 8};
    static const mskv_dtype pts[2] = {MSKV_DTYPE_BF16, MSKV_DTYPE_F32};
    tcpu_seq seqs[2] = {{300, 301, 301, 0}, {24, 150, 90, 20}};
    uint64_t seed = mt_seed();  /* printed by the harness */
    mskv_cpu_desc cd;
    mskv_cpu *amx = NULL, *ref = NULL;
    int di, pi;
    if (!mskv_cpu_isa_available(MSKV_CPU_ISA_AMX_BF16))
        SKIP("the AMX-BF16 path cannot run here (this CPU, kernel or build lacks it; see amx_bf16_path_passes_the_attention_tests)");
    memset(&cd, 0, sizeof cd);
    cd.num_threads = 2;
    cd.isa = MSKV_CPU_ISA_AMX_BF16;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_create(&cd, &amx));
    cd.isa = MSKV_CPU_ISA_AVX512;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_create(&cd, &ref));
    for (di = 0; di < 5; di++)
        for (pi = 0; pi < 2; pi++) {
            tcpu_pair c = tcpu_compare_paths(amx, ref, dims[di], pts[pi], seqs, seed + (uint64_t)(di * 2 + pi));
            printf("  %s pool, head_dim %d: max error vs float64, amx_bf16 %.3g, avx512 %.3g\n",
                   pts[pi] == MSKV_DTYPE_BF16 ? "bf16" : "f32", (int)dims[di], c.err_x, c.err_y);
            if (pts[pi] == MSKV_DTYPE_BF16) {
                EXPECT_TRUE(c.err_x <= tcpu_tol(MSKV_DTYPE_BF16));
                EXPECT_FALSE(c.same_o);  /* Q and P rounded: the tile products ran */
            } else {
                EXPECT_TRUE(c.same_o);
                EXPECT_TRUE(c.same_lse);
            }
        }
    mskv_cpu_destroy(amx);
    mskv_cpu_destroy(ref);
}

/* A bf16 video call on bf16_emu: within the bf16 tolerance of the float64
   reference (1e-2 relative: Q and P rounded to bf16 add at most 2^-9 relative
   each to a product whose K or V is already bf16, far under it), not the
   portable path's bits (the bf16 arithmetic ran), and on an f32 pool exactly
   the portable path's bits (nothing changes outside bf16 pools). An odd
   head_dim (63) and an odd last key block (301 keys) take the padded pairs. */
TEST(bf16_emulation_rounds_q_and_p_on_bf16_pools_only_and_stays_within_the_bf16_tolerance) {
    static const int32_t dims[2] = {64, 63};
    static const mskv_dtype pts[2] = {MSKV_DTYPE_BF16, MSKV_DTYPE_F32};
    tcpu_seq seqs[2] = {{40, 301, 301, 0}, {24, 150, 90, 20}};
    uint64_t seed = mt_seed();  /* printed by the harness */
    mskv_cpu_desc cd;
    mskv_cpu *emu = NULL, *port = NULL;
    int di, pi;
    memset(&cd, 0, sizeof cd);
    cd.num_threads = 2;
    cd.isa = MSKV_CPU_ISA_BF16_EMU;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_create(&cd, &emu));
    cd.isa = MSKV_CPU_ISA_PORTABLE;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_create(&cd, &port));
    for (di = 0; di < 2; di++)
        for (pi = 0; pi < 2; pi++) {
            tcpu_pair c = tcpu_compare_paths(emu, port, dims[di], pts[pi], seqs, seed + (uint64_t)(di * 2 + pi));
            printf("  %s pool, head_dim %d: max error vs float64, bf16_emu %.3g, portable %.3g\n",
                   pts[pi] == MSKV_DTYPE_BF16 ? "bf16" : "f32", (int)dims[di], c.err_x, c.err_y);
            if (pts[pi] == MSKV_DTYPE_BF16) {
                EXPECT_TRUE(c.err_x <= tcpu_tol(MSKV_DTYPE_BF16));
                EXPECT_FALSE(c.same_o);
                EXPECT_TRUE(c.err_x > c.err_y);  /* Q and P rounded: a larger error than f32 products */
            } else {
                EXPECT_TRUE(c.same_o);
                EXPECT_TRUE(c.same_lse);
            }
        }
    mskv_cpu_destroy(emu);
    mskv_cpu_destroy(port);
}
