/* // >>cpu backend (implementation) ---------------------------------------
   Inlined into mstar_kv.h's implementation section, after the core. Uses only
   the public API plus its own static mskv__cpu_* helpers.

   Attention is a flash-style loop: a work item is (segment, block of query
   rows, KV head); its rows are all (query token, q head of the GQA group)
   pairs, so every K/V row is converted once per key block and reused by
   every row. Scores Q.K^T come from a transposed K block (an axpy over keys,
   which vectorises without -ffast-math), the softmax is online (running max
   and sum per row), and P.V accumulates into an f32 row block. With 8 rows
   or fewer (decode), transposing K would cost more than the products: the
   scores are dot products over K rows instead, and one item takes several
   KV heads so that whole slot rows stream from memory in address order.
   With GCC/Clang the inner tiles use vector extensions (8 lanes with AVX,
   else 4), so the speed does not depend on the auto-vectoriser; elsewhere
   plain loops compute the same thing (MSKV_CPU_NO_SIMD forces them). */

#include <string.h>
#include <math.h>
#include <stdlib.h>
#ifndef MSKV_NO_THREADS
#include <pthread.h>
#endif

/* Standalone compiles of this section (the core normally defines these). */
#ifndef MSKV_MALLOC
#define MSKV_MALLOC(sz, u) ((void)(u), malloc(sz))
#define MSKV_REALLOC(p, sz, u) ((void)(u), realloc((p), (sz)))
#define MSKV_FREE(p, u) ((void)(u), free(p))
#endif

#ifndef MSKV_IMPL
#ifdef MSKV_STATIC
#define MSKV_IMPL static
#else
#define MSKV_IMPL
#endif
#endif

#ifdef __cplusplus
#define MSKV__CPU_RESTRICT __restrict
#else
#define MSKV__CPU_RESTRICT restrict
#endif

#define MSKV__CPU_MAX_DIM MSKV_CPU_MAX_HEAD_DIM
#define MSKV__CPU_KTILE 16      /* keys and dims are padded to this in the f32 tiles */
#define MSKV__CPU_SMALL_FLOPS 4.0e6 /* below this a call runs on the caller alone */

/* ---- allocation ---------------------------------------------------------- */

static void *mskv__cpu_alloc(const mskv_allocator *a, size_t n) {
    if (a && a->alloc) return a->alloc(a->user, n);
    return MSKV_MALLOC(n, a ? a->user : NULL);
}
static void mskv__cpu_free(const mskv_allocator *a, void *p) {
    if (!p) return;
    if (a && a->free) { a->free(a->user, p); return; }
    MSKV_FREE(p, a ? a->user : NULL);
}

/* ---- half <-> float -------------------------------------------------------- */

static uint32_t mskv__cpu_fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float mskv__cpu_bitsf(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

MSKV_IMPL uint16_t mskv_f32_to_f16(float f) {
    uint32_t x = mskv__cpu_fbits(f);
    uint32_t sign = (x >> 16) & 0x8000u, r, rem;
    x &= 0x7fffffffu;
    if (x >= 0x7f800000u) /* inf stays inf, NaN stays a (quiet) NaN */
        return (uint16_t)(sign | (x > 0x7f800000u ? 0x7e00u | ((x >> 13) & 0x3ffu) : 0x7c00u));
    if (x >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
    if (x < 0x38800000u) { /* below 2^-14: a half subnormal (or zero) */
        uint32_t e = x >> 23, m, shift, half;
        if (e < 102) return (uint16_t)sign; /* < 2^-25 (ties at 2^-25 go to even 0) */
        m = (x & 0x7fffffu) | 0x800000u;
        shift = 126 - e;  /* 14..24: units of 2^-24 */
        r = m >> shift;
        rem = m & ((1u << shift) - 1);
        half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    r = (x - 0x38000000u) >> 13; /* rebias 127 -> 15, keep 10 mantissa bits */
    rem = x & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1))) r++; /* a carry into the exponent is right */
    return (uint16_t)(sign | r);
}

MSKV_IMPL float mskv_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, em = h & 0x7fffu, u;
    /* Place the 15 bits in a float and multiply by 2^112: exact for normals
       and subnormals alike (the subnormal input becomes a float denormal). */
    u = mskv__cpu_fbits(mskv__cpu_bitsf(em << 13) * mskv__cpu_bitsf(0x77800000u));
    if (em >= 0x7c00u) u = 0x7f800000u | ((em & 0x3ffu) << 13);
    return mskv__cpu_bitsf(u | sign);
}

MSKV_IMPL uint16_t mskv_f32_to_bf16(float f) {
    uint32_t x = mskv__cpu_fbits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

MSKV_IMPL float mskv_bf16_to_f32(uint16_t h) { return mskv__cpu_bitsf((uint32_t)h << 16); }

/* Rows of n elements of dtype t to f32 and back. */
static void mskv__cpu_load(float *MSKV__CPU_RESTRICT dst, const void *src, mskv_dtype t, int64_t n) {
    int64_t i;
    if (t == MSKV_DTYPE_F32) {
        memcpy(dst, src, (size_t)n * 4);
    } else if (t == MSKV_DTYPE_BF16) {
        const uint16_t *s = (const uint16_t *)src;
        for (i = 0; i < n; i++) dst[i] = mskv__cpu_bitsf((uint32_t)s[i] << 16);
    } else {
        const uint16_t *s = (const uint16_t *)src;
        for (i = 0; i < n; i++) dst[i] = mskv_f16_to_f32(s[i]);
    }
}

static void mskv__cpu_store(void *dst, mskv_dtype t, const float *MSKV__CPU_RESTRICT src, int64_t n) {
    int64_t i;
    if (t == MSKV_DTYPE_F32) {
        memcpy(dst, src, (size_t)n * 4);
    } else if (t == MSKV_DTYPE_BF16) {
        uint16_t *d = (uint16_t *)dst;
        for (i = 0; i < n; i++) d[i] = mskv_f32_to_bf16(src[i]);
    } else {
        uint16_t *d = (uint16_t *)dst;
        for (i = 0; i < n; i++) d[i] = mskv_f32_to_f16(src[i]);
    }
}

static int mskv__cpu_dtype_ok(mskv_dtype t) {
    return t == MSKV_DTYPE_F32 || t == MSKV_DTYPE_F16 || t == MSKV_DTYPE_BF16;
}
static size_t mskv__cpu_esize(mskv_dtype t) { return t == MSKV_DTYPE_F32 ? 4u : 2u; }

/* ---- RoPE ------------------------------------------------------------------ */

typedef struct mskv__cpu_rope_parts {
    int32_t nparts, off[3], width[3];
    int interleaved;
    double log_theta;
} mskv__cpu_rope_parts;

static mskv_result mskv__cpu_rope_resolve(const mskv_rope *r, int32_t head_dim, mskv__cpu_rope_parts *out) {
    int32_t k, sum = 0;
    double theta;
    if (head_dim <= 0 || head_dim > MSKV__CPU_MAX_DIM) return MSKV_ERROR_INVALID_ARGUMENT;
    if (r->style != MSKV_ROPE_HALF && r->style != MSKV_ROPE_INTERLEAVED) return MSKV_ERROR_INVALID_ARGUMENT;
    if (!(r->theta >= 0.0f) || r->theta == INFINITY) return MSKV_ERROR_INVALID_ARGUMENT;
    theta = r->theta > 0.0f ? (double)r->theta : 10000.0;
    memset(out, 0, sizeof(*out));
    out->interleaved = r->style == MSKV_ROPE_INTERLEAVED;
    out->log_theta = log(theta);
    if (r->mode == MSKV_POS_1D) {
        out->nparts = 1;
        out->width[0] = r->dims[0] ? r->dims[0] : (head_dim & ~1);
    } else if (r->mode == MSKV_POS_3D) {
        out->nparts = 3;
        if (r->dims[0] == 0 && r->dims[1] == 0 && r->dims[2] == 0) {
            int32_t p = head_dim / 2;
            out->width[1] = out->width[2] = 2 * (p / 3);
            out->width[0] = 2 * (p - 2 * (p / 3));
        } else {
            for (k = 0; k < 3; k++) out->width[k] = r->dims[k];
        }
    } else {
        return MSKV_ERROR_INVALID_ARGUMENT;
    }
    for (k = 0; k < out->nparts; k++) {
        if (out->width[k] < 0 || (out->width[k] & 1)) return MSKV_ERROR_INVALID_ARGUMENT;
        out->off[k] = sum;
        sum += out->width[k];
        if (sum > head_dim) return MSKV_ERROR_INVALID_ARGUMENT;
    }
    return MSKV_SUCCESS;
}

/* cos/sin of every pair of one token (pairs ordered part by part). Angles in
   double: positions reach 10^5 and more, where a float angle loses radians. */
static void mskv__cpu_rope_angles(const mskv__cpu_rope_parts *rp, const int32_t *pos, float *c, float *s) {
    int32_t k, i, n = 0;
    for (k = 0; k < rp->nparts; k++) {
        int32_t w = rp->width[k];
        for (i = 0; i < w / 2; i++, n++) {
            double inv_freq = exp(-(double)(2 * i) / (double)w * rp->log_theta);
            double a = (double)pos[k] * inv_freq;
            c[n] = (float)cos(a);
            s[n] = (float)sin(a);
        }
    }
}

static void mskv__cpu_rope_row(const mskv__cpu_rope_parts *rp, float *x, const float *c, const float *s) {
    int32_t k, i, n = 0;
    for (k = 0; k < rp->nparts; k++) {
        int32_t w = rp->width[k], h = w / 2;
        float *p = x + rp->off[k];
        for (i = 0; i < h; i++, n++) {
            int32_t e0 = rp->interleaved ? 2 * i : i, e1 = rp->interleaved ? 2 * i + 1 : i + h;
            float a = p[e0], b = p[e1];
            p[e0] = a * c[n] - b * s[n];
            p[e1] = a * s[n] + b * c[n];
        }
    }
}

MSKV_IMPL mskv_result mskv_rope_apply(const mskv_rope *rope, void *x, mskv_dtype dtype, int64_t n,
                                     int32_t heads, int32_t head_dim, const int32_t *positions) {
    mskv__cpu_rope_parts rp;
    float row[MSKV__CPU_MAX_DIM], c[MSKV__CPU_MAX_DIM / 2], s[MSKV__CPU_MAX_DIM / 2];
    int64_t t;
    int32_t h, stride;
    size_t es;
    mskv_result res;
    if (!rope) return MSKV_ERROR_NULL_POINTER;
    if (n < 0 || heads <= 0 || !mskv__cpu_dtype_ok(dtype)) return MSKV_ERROR_INVALID_ARGUMENT;
    if ((res = mskv__cpu_rope_resolve(rope, head_dim, &rp)) != MSKV_SUCCESS) return res;
    if (n == 0) return MSKV_SUCCESS;
    if (!x || !positions) return MSKV_ERROR_NULL_POINTER;
    stride = rope->mode == MSKV_POS_3D ? 3 : 1;
    es = mskv__cpu_esize(dtype);
    for (t = 0; t < n; t++) {
        mskv__cpu_rope_angles(&rp, positions + t * stride, c, s);
        for (h = 0; h < heads; h++) {
            unsigned char *p = (unsigned char *)x + ((size_t)t * (size_t)heads + (size_t)h) * (size_t)head_dim * es;
            mskv__cpu_load(row, p, dtype, head_dim);
            mskv__cpu_rope_row(&rp, row, c, s);
            mskv__cpu_store(p, dtype, row, head_dim);
        }
    }
    return MSKV_SUCCESS;
}

/* ---- K/V write --------------------------------------------------------------- */

static mskv_result mskv__cpu_write_kv(void *k_pool, void *v_pool, mskv_dtype pool_t, int32_t num_pages,
                                      int32_t page_size, int32_t kv_heads, int32_t head_dim,
                                      const mskv_plan *plan, const void *k, const void *v,
                                      mskv_dtype src_t, const mskv_rope *rope) {
    mskv__cpu_rope_parts rp;
    float row[MSKV__CPU_MAX_DIM], c[MSKV__CPU_MAX_DIM / 2], s[MSKV__CPU_MAX_DIM / 2];
    int64_t t, n, slots;
    int32_t h, pstride = 1;
    size_t pes, ses, row_elems;
    mskv_result res;
    if (!plan) return MSKV_ERROR_NULL_POINTER;
    if (!mskv__cpu_dtype_ok(pool_t) || !mskv__cpu_dtype_ok(src_t)) return MSKV_ERROR_INVALID_ARGUMENT;
    if (num_pages < 1 || page_size < 1 || kv_heads < 1 || head_dim < 1 || head_dim > MSKV__CPU_MAX_DIM)
        return MSKV_ERROR_INVALID_ARGUMENT;
    if (plan->page_size != page_size || plan->total_q < 0) return MSKV_ERROR_INVALID_ARGUMENT;
    if (rope) {
        if ((res = mskv__cpu_rope_resolve(rope, head_dim, &rp)) != MSKV_SUCCESS) return res;
        pstride = rope->mode == MSKV_POS_3D ? 3 : 1;
    }
    n = plan->total_q;
    if (n == 0) return MSKV_SUCCESS;
    if (!k_pool || !v_pool || !k || !v || !plan->slot_mapping) return MSKV_ERROR_NULL_POINTER;
    if (rope && !plan->positions) return MSKV_ERROR_NULL_POINTER;
    slots = (int64_t)num_pages * page_size;
    /* Every slot is checked before any byte moves: a bad plan writes nothing. */
    for (t = 0; t < n; t++) {
        int64_t sl = plan->slot_mapping[t];
        if (sl < 0) continue;
        if (sl >= slots || sl < page_size) return MSKV_ERROR_OUT_OF_RANGE; /* past the pool, or the null page */
    }
    pes = mskv__cpu_esize(pool_t);
    ses = mskv__cpu_esize(src_t);
    row_elems = (size_t)kv_heads * (size_t)head_dim;
    for (t = 0; t < n; t++) {
        int64_t sl = plan->slot_mapping[t];
        const unsigned char *ks = (const unsigned char *)k + (size_t)t * row_elems * ses;
        const unsigned char *vs = (const unsigned char *)v + (size_t)t * row_elems * ses;
        unsigned char *kd, *vd;
        if (sl < 0) continue;
        kd = (unsigned char *)k_pool + (size_t)sl * row_elems * pes;
        vd = (unsigned char *)v_pool + (size_t)sl * row_elems * pes;
        if (rope) mskv__cpu_rope_angles(&rp, plan->positions + t * pstride, c, s);
        if (src_t == pool_t) {
            memcpy(vd, vs, row_elems * pes);
            if (!rope) memcpy(kd, ks, row_elems * pes);
        } else {
            for (h = 0; h < kv_heads; h++) {
                mskv__cpu_load(row, vs + (size_t)h * (size_t)head_dim * ses, src_t, head_dim);
                mskv__cpu_store(vd + (size_t)h * (size_t)head_dim * pes, pool_t, row, head_dim);
            }
        }
        if (rope || src_t != pool_t) {
            for (h = 0; h < kv_heads; h++) {
                mskv__cpu_load(row, ks + (size_t)h * (size_t)head_dim * ses, src_t, head_dim);
                if (rope) mskv__cpu_rope_row(&rp, row, c, s);
                mskv__cpu_store(kd + (size_t)h * (size_t)head_dim * pes, pool_t, row, head_dim);
            }
        }
    }
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_cpu_write_kv_pools(const mskv_pools *pools, const mskv_plan *plan, const void *k,
                                             const void *v, mskv_dtype src_dtype, const mskv_rope *rope) {
    if (!pools) return MSKV_ERROR_NULL_POINTER;
    /* the pools' memory is the caller's and writable; the struct is const for
       the attention call's sake */
    return mskv__cpu_write_kv((void *)(uintptr_t)pools->k, (void *)(uintptr_t)pools->v, pools->dtype,
                              pools->num_pages, pools->page_size, pools->kv_heads, pools->head_dim,
                              plan, k, v, src_dtype, rope);
}

MSKV_IMPL mskv_result mskv_cpu_write_kv(mskv_arena *arena, int32_t layer, const mskv_plan *plan, const void *k,
                                       const void *v, mskv_dtype src_dtype, const mskv_rope *rope) {
    mskv_store_info si;
    mskv_result res;
    void *kp, *vp;
    if (!arena || !plan) return MSKV_ERROR_NULL_POINTER;
    if ((res = mskv_store_info_get(arena, &si)) != MSKV_SUCCESS) return res;
    if (layer < 0 || layer >= si.num_layers) return MSKV_ERROR_OUT_OF_RANGE;
    kp = mskv_store_pool(arena, layer, 0);
    vp = mskv_store_pool(arena, layer, 1);
    if (!kp || !vp) return MSKV_ERROR_UNSUPPORTED; /* bookkeeping-only arena, or bytes live elsewhere */
    return mskv__cpu_write_kv(kp, vp, si.dtype, si.num_pages, si.page_size, si.kv_heads, si.head_dim,
                              plan, k, v, src_dtype, rope);
}

/* ---- LSE merge --------------------------------------------------------------- */

MSKV_IMPL mskv_result mskv_cpu_merge(int64_t n, int32_t heads, int32_t head_dim, const float *o_a,
                                    const float *lse_a, const float *o_b, const float *lse_b, float *o,
                                    float *lse) {
    int64_t r, rows;
    int32_t d;
    if (n < 0 || heads <= 0 || head_dim <= 0) return MSKV_ERROR_INVALID_ARGUMENT;
    if (n == 0) return MSKV_SUCCESS;
    if (!o_a || !lse_a || !o_b || !lse_b || !o || !lse) return MSKV_ERROR_NULL_POINTER;
    rows = n * heads;
    /* element by element, reading before writing: o and lse may alias a or b */
    for (r = 0; r < rows; r++) {
        const float *a = o_a + r * head_dim, *b = o_b + r * head_dim;
        float *dst = o + r * head_dim;
        float la = lse_a[r], lb = lse_b[r], m = la > lb ? la : lb, wa, wb, sum;
        if (m == -INFINITY) {
            for (d = 0; d < head_dim; d++) dst[d] = 0.0f;
            lse[r] = -INFINITY;
            continue;
        }
        wa = la == -INFINITY ? 0.0f : expf(la - m);
        wb = lb == -INFINITY ? 0.0f : expf(lb - m);
        sum = wa + wb;
        wa /= sum;
        wb /= sum;
        for (d = 0; d < head_dim; d++) {
            float x = wa != 0.0f ? wa * a[d] : 0.0f, y = wb != 0.0f ? wb * b[d] : 0.0f;
            dst[d] = x + y;
        }
        lse[r] = m + logf(sum);
    }
    return MSKV_SUCCESS;
}

/* ---- f32 tiles ------------------------------------------------------------------ */

#if defined(__GNUC__) && !defined(MSKV_CPU_NO_SIMD)
#define MSKV__CPU_SIMD 1
#if defined(__AVX__)
#define MSKV__CPU_VW 8
#else
#define MSKV__CPU_VW 4   /* wider vectors would change the call ABI without AVX */
#endif
typedef float mskv__cpu_vf __attribute__((vector_size(MSKV__CPU_VW * 4)));
typedef int32_t mskv__cpu_vi __attribute__((vector_size(MSKV__CPU_VW * 4)));
static inline mskv__cpu_vf mskv__cpu_vld(const float *p) { mskv__cpu_vf v; memcpy(&v, p, sizeof v); return v; }
static inline void mskv__cpu_vst(float *p, mskv__cpu_vf v) { memcpy(p, &v, sizeof v); }
static inline mskv__cpu_vf mskv__cpu_vset(float x) {
    mskv__cpu_vf v;
    int i;
    for (i = 0; i < MSKV__CPU_VW; i++) v[i] = x;
    return v;
}
#else
#define MSKV__CPU_SIMD 0
#endif

/* S[r][j] = sum_d Q[r][d] * Kt[d][j] for r < nrp (multiple of 4), j < kbp
   (multiple of 16), d < dp. Rows of Q have stride dp, Kt and S stride ks. */
static void mskv__cpu_qk(const float *MSKV__CPU_RESTRICT Q, const float *MSKV__CPU_RESTRICT Kt,
                         float *MSKV__CPU_RESTRICT S, int32_t nrp, int32_t kbp, int32_t dp, int32_t ks) {
    int32_t r, j, d;
#if MSKV__CPU_SIMD
    for (r = 0; r < nrp; r += 4) {
        const float *q0 = Q + (size_t)r * dp, *q1 = q0 + dp, *q2 = q1 + dp, *q3 = q2 + dp;
        for (j = 0; j < kbp; j += 2 * MSKV__CPU_VW) {
            mskv__cpu_vf a00 = mskv__cpu_vset(0.0f), a01 = a00, a10 = a00, a11 = a00;
            mskv__cpu_vf a20 = a00, a21 = a00, a30 = a00, a31 = a00;
            for (d = 0; d < dp; d++) {
                const float *kr = Kt + (size_t)d * ks + j;
                mskv__cpu_vf k0 = mskv__cpu_vld(kr), k1 = mskv__cpu_vld(kr + MSKV__CPU_VW);
                a00 += k0 * q0[d]; a01 += k1 * q0[d];
                a10 += k0 * q1[d]; a11 += k1 * q1[d];
                a20 += k0 * q2[d]; a21 += k1 * q2[d];
                a30 += k0 * q3[d]; a31 += k1 * q3[d];
            }
            mskv__cpu_vst(S + (size_t)(r + 0) * ks + j, a00); mskv__cpu_vst(S + (size_t)(r + 0) * ks + j + MSKV__CPU_VW, a01);
            mskv__cpu_vst(S + (size_t)(r + 1) * ks + j, a10); mskv__cpu_vst(S + (size_t)(r + 1) * ks + j + MSKV__CPU_VW, a11);
            mskv__cpu_vst(S + (size_t)(r + 2) * ks + j, a20); mskv__cpu_vst(S + (size_t)(r + 2) * ks + j + MSKV__CPU_VW, a21);
            mskv__cpu_vst(S + (size_t)(r + 3) * ks + j, a30); mskv__cpu_vst(S + (size_t)(r + 3) * ks + j + MSKV__CPU_VW, a31);
        }
    }
#else
    for (r = 0; r < nrp; r++) {
        float *srow = S + (size_t)r * ks;
        for (j = 0; j < kbp; j++) srow[j] = 0.0f;
        for (d = 0; d < dp; d++) {
            float q = Q[(size_t)r * dp + d];
            const float *kr = Kt + (size_t)d * ks;
            for (j = 0; j < kbp; j++) srow[j] += q * kr[j];
        }
    }
#endif
}

/* The same scores from K rows (krow[j], dp floats each) for j < kbe (even),
   r < nrp (multiple of 4): dot products along d. For a few rows (decode),
   where transposing K would cost more than the products themselves. */
static void mskv__cpu_qk_rows(const float *MSKV__CPU_RESTRICT Q, const float *const *MSKV__CPU_RESTRICT krow,
                              float *MSKV__CPU_RESTRICT S, int32_t nrp, int32_t kbe, int32_t dp, int32_t ks) {
    int32_t r, j, d;
#if MSKV__CPU_SIMD
    for (r = 0; r < nrp; r += 4) {
        const float *q0 = Q + (size_t)r * dp, *q1 = q0 + dp, *q2 = q1 + dp, *q3 = q2 + dp;
        for (j = 0; j < kbe; j += 2) {
            const float *k0 = krow[j], *k1 = krow[j + 1];
            mskv__cpu_vf a00 = mskv__cpu_vset(0.0f), a01 = a00, a10 = a00, a11 = a00;
            mskv__cpu_vf a20 = a00, a21 = a00, a30 = a00, a31 = a00;
            float t[8];
            int32_t i;
            for (d = 0; d < dp; d += MSKV__CPU_VW) {
                mskv__cpu_vf x0 = mskv__cpu_vld(k0 + d), x1 = mskv__cpu_vld(k1 + d), qv;
                qv = mskv__cpu_vld(q0 + d); a00 += x0 * qv; a01 += x1 * qv;
                qv = mskv__cpu_vld(q1 + d); a10 += x0 * qv; a11 += x1 * qv;
                qv = mskv__cpu_vld(q2 + d); a20 += x0 * qv; a21 += x1 * qv;
                qv = mskv__cpu_vld(q3 + d); a30 += x0 * qv; a31 += x1 * qv;
            }
            for (i = 0; i < 8; i++) t[i] = 0.0f;
            for (i = 0; i < MSKV__CPU_VW; i++) {
                t[0] += a00[i]; t[1] += a01[i]; t[2] += a10[i]; t[3] += a11[i];
                t[4] += a20[i]; t[5] += a21[i]; t[6] += a30[i]; t[7] += a31[i];
            }
            S[(size_t)(r + 0) * ks + j] = t[0]; S[(size_t)(r + 0) * ks + j + 1] = t[1];
            S[(size_t)(r + 1) * ks + j] = t[2]; S[(size_t)(r + 1) * ks + j + 1] = t[3];
            S[(size_t)(r + 2) * ks + j] = t[4]; S[(size_t)(r + 2) * ks + j + 1] = t[5];
            S[(size_t)(r + 3) * ks + j] = t[6]; S[(size_t)(r + 3) * ks + j + 1] = t[7];
        }
    }
#else
    for (r = 0; r < nrp; r++)
        for (j = 0; j < kbe; j++) {
            float acc = 0.0f;
            for (d = 0; d < dp; d++) acc += Q[(size_t)r * dp + d] * krow[j][d];
            S[(size_t)r * ks + j] = acc;
        }
#endif
}

/* O[r][:] = O[r][:] * alpha[r] + sum_{j < kb} P[r][j] * V_j[:], rows r < nrp
   (multiple of 4), dims < dp (multiple of 16). */
static void mskv__cpu_pv(float *MSKV__CPU_RESTRICT O, const float *MSKV__CPU_RESTRICT P,
                         const float *const *MSKV__CPU_RESTRICT vrow, const float *MSKV__CPU_RESTRICT alpha,
                         int32_t nrp, int32_t kb, int32_t dp, int32_t ks) {
    int32_t r, j, d;
#if MSKV__CPU_SIMD
    for (r = 0; r < nrp; r += 4) {
        const float *p0 = P + (size_t)r * ks, *p1 = p0 + ks, *p2 = p1 + ks, *p3 = p2 + ks;
        float *o0 = O + (size_t)r * dp, *o1 = o0 + dp, *o2 = o1 + dp, *o3 = o2 + dp;
        for (d = 0; d < dp; d += 2 * MSKV__CPU_VW) {
            mskv__cpu_vf a00 = mskv__cpu_vld(o0 + d) * alpha[r], a01 = mskv__cpu_vld(o0 + d + MSKV__CPU_VW) * alpha[r];
            mskv__cpu_vf a10 = mskv__cpu_vld(o1 + d) * alpha[r + 1], a11 = mskv__cpu_vld(o1 + d + MSKV__CPU_VW) * alpha[r + 1];
            mskv__cpu_vf a20 = mskv__cpu_vld(o2 + d) * alpha[r + 2], a21 = mskv__cpu_vld(o2 + d + MSKV__CPU_VW) * alpha[r + 2];
            mskv__cpu_vf a30 = mskv__cpu_vld(o3 + d) * alpha[r + 3], a31 = mskv__cpu_vld(o3 + d + MSKV__CPU_VW) * alpha[r + 3];
            for (j = 0; j < kb; j++) {
                const float *vr = vrow[j] + d;
                mskv__cpu_vf v0 = mskv__cpu_vld(vr), v1 = mskv__cpu_vld(vr + MSKV__CPU_VW);
                a00 += v0 * p0[j]; a01 += v1 * p0[j];
                a10 += v0 * p1[j]; a11 += v1 * p1[j];
                a20 += v0 * p2[j]; a21 += v1 * p2[j];
                a30 += v0 * p3[j]; a31 += v1 * p3[j];
            }
            mskv__cpu_vst(o0 + d, a00); mskv__cpu_vst(o0 + d + MSKV__CPU_VW, a01);
            mskv__cpu_vst(o1 + d, a10); mskv__cpu_vst(o1 + d + MSKV__CPU_VW, a11);
            mskv__cpu_vst(o2 + d, a20); mskv__cpu_vst(o2 + d + MSKV__CPU_VW, a21);
            mskv__cpu_vst(o3 + d, a30); mskv__cpu_vst(o3 + d + MSKV__CPU_VW, a31);
        }
    }
#else
    for (r = 0; r < nrp; r++) {
        float *orow = O + (size_t)r * dp;
        const float *prow = P + (size_t)r * ks;
        for (d = 0; d < dp; d++) orow[d] *= alpha[r];
        for (j = 0; j < kb; j++) {
            const float *vr = vrow[j];
            float p = prow[j];
            for (d = 0; d < dp; d++) orow[d] += p * vr[d];
        }
    }
#endif
}

/* p[j] = exp(s[j] - m) for j < n (multiple of 16), exactly 0 where s = -inf;
   returns the sum. s - m <= 0 always (m is the running max). */
static float mskv__cpu_exp_row(float *MSKV__CPU_RESTRICT s, float m, int32_t n) {
#if MSKV__CPU_SIMD
    /* e^x = 2^k * e^r, k = round(x / ln 2), |r| <= ln2/2, e^r by a degree-6
       polynomial (relative error ~1e-7); inputs under -87 give exactly 0 */
    const mskv__cpu_vf lo = mskv__cpu_vset(-87.0f), log2e = mskv__cpu_vset(1.44269504f);
    const mskv__cpu_vf magic = mskv__cpu_vset(12582912.0f); /* 1.5 * 2^23: rounds to an integer */
    const mskv__cpu_vf ln2hi = mskv__cpu_vset(0.693145752f), ln2lo = mskv__cpu_vset(1.42860677e-6f);
    mskv__cpu_vf acc = mskv__cpu_vset(0.0f);
    int32_t j, i;
    float sum = 0.0f;
    for (j = 0; j < n; j += MSKV__CPU_VW) {
        mskv__cpu_vf x = mskv__cpu_vld(s + j) - m, t, kf, r, p;
        mskv__cpu_vi keep = x > lo, ki;
        x = (mskv__cpu_vf)(((mskv__cpu_vi)x & keep) | ((mskv__cpu_vi)lo & ~keep));
        t = x * log2e + magic;
        kf = t - magic;
        r = x - kf * ln2hi - kf * ln2lo;
        p = ((((((r * (1.0f / 720) + (1.0f / 120)) * r + (1.0f / 24)) * r + (1.0f / 6)) * r + 0.5f) * r + 1.0f) * r + 1.0f);
        ki = ((mskv__cpu_vi)t - (mskv__cpu_vi)magic + 127) << 23;
        p = p * (mskv__cpu_vf)ki;
        p = (mskv__cpu_vf)((mskv__cpu_vi)p & keep);
        mskv__cpu_vst(s + j, p);
        acc += p;
    }
    for (i = 0; i < MSKV__CPU_VW; i++) sum += acc[i];
    return sum;
#else
    int32_t j;
    float sum = 0.0f;
    for (j = 0; j < n; j++) {
        s[j] = s[j] == -INFINITY ? 0.0f : expf(s[j] - m);
        sum += s[j];
    }
    return sum;
#endif
}

/* ---- thread pool --------------------------------------------------------------- */

/* A per-thread workspace: row tiles (Q, O: rows x MAX_DIM), key tiles
   (Kt: MAX_DIM x keys, V: keys x MAX_DIM), scores (rows x keys), row state. */
typedef struct mskv__cpu_ws {
    float *q, *o, *kt, *v, *s, *m, *l, *alpha;
    int64_t *qpos;
    size_t *el;          /* element offset of each key row of the block */
    const float **vrow, **krow;
    int32_t rows, keys;  /* tile capacities */
} mskv__cpu_ws;

/* Q and O hold rows * MAX_DIM floats: more rows at a smaller head_dim, up to
   MSKV__CPU_MAX_ROWS, for which the scores and row state are sized. */
#define MSKV__CPU_MAX_ROWS 64

static size_t mskv__cpu_ws_bytes(int32_t rows, int32_t keys) {
    size_t f = 2 * (size_t)rows * MSKV__CPU_MAX_DIM + 2 * (size_t)keys * MSKV__CPU_MAX_DIM +
               (size_t)MSKV__CPU_MAX_ROWS * (size_t)keys + 3 * (size_t)MSKV__CPU_MAX_ROWS;
    return f * 4 + (size_t)MSKV__CPU_MAX_ROWS * 8 + 2 * ((size_t)keys + 1) * sizeof(float *) + (size_t)keys * sizeof(size_t) + 64;
}

static void mskv__cpu_ws_carve(mskv__cpu_ws *w, void *mem, int32_t rows, int32_t keys) {
    unsigned char *p = (unsigned char *)mem;
    p += (64 - ((uintptr_t)p & 63)) & 63;  /* the tiles start on a cache line */
    w->rows = rows;
    w->keys = keys;
    w->q = (float *)(void *)p; p += (size_t)rows * MSKV__CPU_MAX_DIM * 4;
    w->o = (float *)(void *)p; p += (size_t)rows * MSKV__CPU_MAX_DIM * 4;
    w->kt = (float *)(void *)p; p += (size_t)keys * MSKV__CPU_MAX_DIM * 4;
    w->v = (float *)(void *)p; p += (size_t)keys * MSKV__CPU_MAX_DIM * 4;
    w->s = (float *)(void *)p; p += (size_t)MSKV__CPU_MAX_ROWS * (size_t)keys * 4;
    w->qpos = (int64_t *)(void *)p; p += (size_t)MSKV__CPU_MAX_ROWS * 8;
    w->m = (float *)(void *)p; p += (size_t)MSKV__CPU_MAX_ROWS * 4;
    w->l = (float *)(void *)p; p += (size_t)MSKV__CPU_MAX_ROWS * 4;
    w->alpha = (float *)(void *)p; p += (size_t)MSKV__CPU_MAX_ROWS * 4;
    w->vrow = (const float **)(void *)p; p += ((size_t)keys + 1) * sizeof(float *);
    w->krow = (const float **)(void *)p; p += ((size_t)keys + 1) * sizeof(float *);
    w->el = (size_t *)(void *)p;
}

typedef void (*mskv__cpu_task_fn)(void *ctx, mskv__cpu_ws *ws);

struct mskv_cpu {
    mskv_allocator allocator;
    int32_t num_threads;
    void *ws_mem;
    mskv__cpu_ws *ws;
#ifndef MSKV_NO_THREADS
    pthread_t *threads;
    int32_t started;
    pthread_mutex_t lock;
    pthread_mutex_t call_lock;  /* one call at a time per pool */
    pthread_cond_t wake, done;
    uint64_t generation;
    int32_t busy, shutdown;
    mskv__cpu_task_fn task;
    void *task_ctx;
#endif
};

#ifndef MSKV_NO_THREADS
typedef struct mskv__cpu_worker_arg { mskv_cpu *cpu; int32_t index; } mskv__cpu_worker_arg;

static void *mskv__cpu_worker(void *arg) {
    mskv_cpu *cpu = ((mskv__cpu_worker_arg *)arg)->cpu;
    int32_t index = ((mskv__cpu_worker_arg *)arg)->index;
    uint64_t seen = 0;
    for (;;) {
        mskv__cpu_task_fn fn;
        void *ctx;
        pthread_mutex_lock(&cpu->lock);
        while (!cpu->shutdown && cpu->generation == seen) pthread_cond_wait(&cpu->wake, &cpu->lock);
        if (cpu->shutdown) { pthread_mutex_unlock(&cpu->lock); break; }
        seen = cpu->generation;
        fn = cpu->task;
        ctx = cpu->task_ctx;
        pthread_mutex_unlock(&cpu->lock);
        fn(ctx, &cpu->ws[index]);
        pthread_mutex_lock(&cpu->lock);
        if (--cpu->busy == 0) pthread_cond_signal(&cpu->done);
        pthread_mutex_unlock(&cpu->lock);
    }
    return NULL;
}
#endif

static void mskv__cpu_teardown(mskv_cpu *cpu) {
#ifndef MSKV_NO_THREADS
    int32_t i;
    if (cpu->started > 0) {
        pthread_mutex_lock(&cpu->lock);
        cpu->shutdown = 1;
        pthread_cond_broadcast(&cpu->wake);
        pthread_mutex_unlock(&cpu->lock);
        for (i = 0; i < cpu->started; i++) pthread_join(cpu->threads[i], NULL);
    }
    if (cpu->threads) {
        pthread_cond_destroy(&cpu->wake);
        pthread_cond_destroy(&cpu->done);
        pthread_mutex_destroy(&cpu->lock);
        pthread_mutex_destroy(&cpu->call_lock);
        mskv__cpu_free(&cpu->allocator, cpu->threads);
    }
#endif
    mskv__cpu_free(&cpu->allocator, cpu->ws_mem);
    mskv__cpu_free(&cpu->allocator, cpu->ws);
}

MSKV_IMPL mskv_result mskv_cpu_create(const mskv_cpu_desc *desc, mskv_cpu **out) {
    static const int32_t ladder[4][2] = {{64, 64}, {32, 64}, {16, 32}, {8, 16}};
    mskv_cpu_desc d;
    mskv_cpu *cpu;
    size_t per = 0, stride;
    int32_t i, rows = 0, keys = 0;
    if (!out) return MSKV_ERROR_NULL_POINTER;
    *out = NULL;
    if (desc) d = *desc; else memset(&d, 0, sizeof d);
    if (d.num_threads < 0 || d.num_threads > 1024) return MSKV_ERROR_INVALID_ARGUMENT;
    if ((d.allocator.alloc || d.allocator.free) && !(d.allocator.alloc && d.allocator.free))
        return MSKV_ERROR_INVALID_ARGUMENT;
    if (d.num_threads == 0) d.num_threads = 1;
#ifdef MSKV_NO_THREADS
    d.num_threads = 1;
#endif
    /* the largest tiles the per-thread budget allows */
    for (i = 0; i < 4; i++) {
        per = mskv__cpu_ws_bytes(ladder[i][0], ladder[i][1]);
        if (d.workspace_bytes == 0 || per <= d.workspace_bytes) { rows = ladder[i][0]; keys = ladder[i][1]; break; }
    }
    if (!rows) return MSKV_ERROR_INVALID_ARGUMENT;
    stride = (per + 63) & ~(size_t)63;
    if (stride > SIZE_MAX / (size_t)d.num_threads) return MSKV_ERROR_OVERFLOW;
    cpu = (mskv_cpu *)mskv__cpu_alloc(&d.allocator, sizeof(mskv_cpu));
    if (!cpu) return MSKV_ERROR_OUT_OF_MEMORY;
    memset(cpu, 0, sizeof(*cpu));
    cpu->allocator = d.allocator;
    cpu->num_threads = d.num_threads;
    cpu->ws = (mskv__cpu_ws *)mskv__cpu_alloc(&d.allocator, sizeof(mskv__cpu_ws) * (size_t)d.num_threads);
    cpu->ws_mem = mskv__cpu_alloc(&d.allocator, stride * (size_t)d.num_threads);
    if (!cpu->ws || !cpu->ws_mem) { mskv__cpu_teardown(cpu); mskv__cpu_free(&d.allocator, cpu); return MSKV_ERROR_OUT_OF_MEMORY; }
    for (i = 0; i < d.num_threads; i++)
        mskv__cpu_ws_carve(&cpu->ws[i], (unsigned char *)cpu->ws_mem + stride * (size_t)i, rows, keys);
#ifndef MSKV_NO_THREADS
    if (d.num_threads > 1) {
        mskv__cpu_worker_arg *args;
        int ok = 1;
        cpu->threads = (pthread_t *)mskv__cpu_alloc(&d.allocator, (sizeof(pthread_t) + sizeof(*args)) * (size_t)d.num_threads);
        if (!cpu->threads) { mskv__cpu_teardown(cpu); mskv__cpu_free(&d.allocator, cpu); return MSKV_ERROR_OUT_OF_MEMORY; }
        args = (mskv__cpu_worker_arg *)(void *)(cpu->threads + d.num_threads);
        pthread_mutex_init(&cpu->lock, NULL);
        pthread_mutex_init(&cpu->call_lock, NULL);
        pthread_cond_init(&cpu->wake, NULL);
        pthread_cond_init(&cpu->done, NULL);
        /* thread 0 is the caller; workers 1..n-1 */
        for (i = 1; i < d.num_threads && ok; i++) {
            args[i].cpu = cpu;
            args[i].index = i;
            if (pthread_create(&cpu->threads[cpu->started], NULL, mskv__cpu_worker, &args[i]) != 0) ok = 0;
            else cpu->started++;
        }
        if (!ok) { mskv__cpu_teardown(cpu); mskv__cpu_free(&d.allocator, cpu); return MSKV_ERROR_THREAD; }
    }
#endif
    *out = cpu;
    return MSKV_SUCCESS;
}

MSKV_IMPL void mskv_cpu_destroy(mskv_cpu *cpu) {
    mskv_allocator a;
    if (!cpu) return;
    a = cpu->allocator;
    mskv__cpu_teardown(cpu);
    mskv__cpu_free(&a, cpu);
}

/* ---- paged attention ------------------------------------------------------------ */

typedef struct mskv__cpu_job {
    const mskv_pools *pools;
    const mskv_plan *plan;
    const void *q;
    void *o;
    float *lse;
    mskv_dtype qt;
    mskv_mask mask;
    int32_t q_heads, group, dim, dimp, window_left, rows;
    int32_t heads_cap;  /* most kv heads per item (few-row segments), so threads still get items */
    float scale;
    /* next work item, (segment, row block, kv head); taken under the pool lock */
    int32_t cur_b, cur_rb, cur_g;
#ifndef MSKV_NO_THREADS
    pthread_mutex_t *lock;
#endif
} mskv__cpu_job;

/* Absolute position of compacted index j (positions rise with j: shift >= 0). */
static int64_t mskv__cpu_kpos(int64_t j, int64_t split, int64_t shift) { return j < split ? j : j + shift; }

/* The first compacted index whose position is >= p (n when none). */
static int64_t mskv__cpu_first_at(int64_t p, int64_t split, int64_t shift, int64_t n) {
    int64_t j;
    if (p <= 0) return 0;
    if (p < split) return p < n ? p : n;
    j = p - shift > split ? p - shift : split;
    return j < n ? j : n;
}

static int32_t mskv__cpu_rows_of(const mskv__cpu_job *job, int32_t b) {
    return (job->plan->qo_indptr[b + 1] - job->plan->qo_indptr[b]) * job->group;
}

/* Takes the next item, (segment b, row block rb, kv heads [g, g + ng)); 0 when
   none is left. A segment with few rows per kv head (decode) takes several
   kv heads per item, so whole slot rows stream in one pass. */
static int mskv__cpu_next(mskv__cpu_job *job, int32_t *b, int32_t *rb, int32_t *g, int32_t *ng) {
    int ok = 0;
    int32_t kvh = job->pools->kv_heads;
#ifndef MSKV_NO_THREADS
    if (job->lock) pthread_mutex_lock(job->lock);
#endif
    while (job->cur_b < job->plan->batch) {
        int32_t rows = mskv__cpu_rows_of(job, job->cur_b), nrp = (rows + 3) & ~3, nrb, step = 1;
        if (nrp <= 8) {
            nrb = rows > 0;
            step = job->rows / (nrp > 0 ? nrp : 4);
            if (step > job->heads_cap) step = job->heads_cap;
            if (step < 1) step = 1;
        } else {
            nrb = (rows + job->rows - 1) / job->rows;
        }
        if (job->cur_rb >= nrb) { job->cur_b++; job->cur_rb = 0; job->cur_g = 0; continue; }
        *b = job->cur_b; *rb = job->cur_rb; *g = job->cur_g;
        *ng = kvh - job->cur_g < step ? kvh - job->cur_g : step;
        job->cur_g += *ng;
        if (job->cur_g == kvh) { job->cur_g = 0; job->cur_rb++; }
        ok = 1;
        break;
    }
#ifndef MSKV_NO_THREADS
    if (job->lock) pthread_mutex_unlock(job->lock);
#endif
    return ok;
}

/* One work item. Rows are (query i, q head hh of the group) in row-major
   order per kv head, so positions rise with the row; the ng kv heads' row
   sets follow each other (nrp rows each) in the tiles. */
static void mskv__cpu_item(const mskv__cpu_job *job, mskv__cpu_ws *ws, int32_t b, int32_t rb, int32_t g0, int32_t ng) {
    const mskv_plan *plan = job->plan;
    const mskv_pools *pools = job->pools;
    const int32_t D = job->dim, Dp = job->dimp, KS = ws->keys, P = pools->page_size;
    const int32_t kvh = pools->kv_heads, group = job->group;
    const size_t pes = mskv__cpu_esize(pools->dtype), qes = mskv__cpu_esize(job->qt);
    const int32_t qo0 = plan->qo_indptr[b], qo_len = plan->qo_indptr[b + 1] - qo0;
    int32_t KS_blk = KS;  /* keys per block (S and the tiles keep stride KS) */
    const int64_t kv_len = plan->kv_len[b];
    const int64_t split = plan->kv_pos_split ? plan->kv_pos_split[b] : kv_len;
    const int64_t shift = plan->kv_pos_shift ? plan->kv_pos_shift[b] : 0;
    const int32_t *pages = plan->kv_indices + plan->kv_indptr[b];
    const int direct = pools->dtype == MSKV_DTYPE_F32 && D == Dp; /* pool rows usable as they are */
    int32_t r0 = rb * job->rows, nr, nrp, r, d, gi, few_rows;
    int64_t lo = 0, hi = kv_len, j0;
    nr = qo_len * group - r0;
    if (nr > job->rows) nr = job->rows;
    nrp = (nr + 3) & ~3;
    few_rows = nrp <= 8;
    if (ng > 1) {
        /* several kv heads: K and V of all of them per block, in the tiles.
           fit >= 4 * keys / rows >= 4, since ng * nrp <= rows * MAX_DIM / Dp */
        int32_t fit = (int32_t)((size_t)ws->keys * MSKV__CPU_MAX_DIM / ((size_t)Dp * (size_t)ng)) & ~1;
        if (fit < KS) KS_blk = fit;
    }

    for (gi = 0; gi < ng; gi++)
        for (r = 0; r < nrp; r++) {
            int32_t R = gi * nrp + r;
            float *qr = ws->q + (size_t)R * Dp;
            if (r < nr) {
                int32_t t = r0 + r, i = t / group, head = (g0 + gi) * group + t % group;
                const unsigned char *src = (const unsigned char *)job->q + ((size_t)(qo0 + i) * (size_t)job->q_heads + (size_t)head) * (size_t)D * qes;
                mskv__cpu_load(qr, src, job->qt, D);
                for (d = 0; d < D; d++) qr[d] *= job->scale;
                ws->qpos[r] = mskv__cpu_kpos(kv_len - qo_len + i, split, shift);
            } else {
                for (d = 0; d < D; d++) qr[d] = 0.0f;
            }
            for (d = D; d < Dp; d++) qr[d] = 0.0f;
            for (d = 0; d < Dp; d++) ws->o[(size_t)R * Dp + d] = 0.0f;
            ws->m[R] = -INFINITY;
            ws->l[R] = 0.0f;
        }
    if (job->mask != MSKV_MASK_NONE) {
        hi = mskv__cpu_first_at(ws->qpos[nr - 1] + 1, split, shift, kv_len);
        if (job->mask == MSKV_MASK_WINDOW) lo = mskv__cpu_first_at(ws->qpos[0] - job->window_left, split, shift, kv_len);
    }

    for (j0 = lo; j0 < hi; j0 += KS_blk) {
        int32_t kb = (int32_t)(hi - j0 < KS_blk ? hi - j0 : KS_blk), kbp = (kb + MSKV__CPU_KTILE - 1) & ~(MSKV__CPU_KTILE - 1), jj;
        int64_t pi = j0 / P, off = j0 % P;
        /* element offset of each key's slot row (kv head 0) */
        for (jj = 0; jj < kb; jj++) {
            ws->el[jj] = ((size_t)pages[pi] * (size_t)P + (size_t)off) * (size_t)kvh * (size_t)D;
            if (++off == P) { off = 0; pi++; }
        }
#if defined(__GNUC__)
        /* The next block's rows are scattered over pages, which the hardware
           prefetcher does not follow: request them now (the item's kv heads
           are adjacent in a slot row), they arrive while this block computes. */
        for (jj = 0; jj < KS_blk && j0 + kb + jj < hi; jj++) {
            size_t el = (((size_t)pages[pi] * (size_t)P + (size_t)off) * (size_t)kvh + (size_t)g0) * (size_t)D, at;
            const char *kp = (const char *)pools->k + el * pes, *vp = (const char *)pools->v + el * pes;
            for (at = 0; at < (size_t)ng * (size_t)D * pes; at += 64) { __builtin_prefetch(kp + at); __builtin_prefetch(vp + at); }
            if (++off == P) { off = 0; pi++; }
        }
#endif
        if (ng > 1 && !direct) {
            /* all heads' rows of each slot in address order (one contiguous
               run per slot), so the hardware streams them */
            for (jj = 0; jj < kb; jj++)
                for (gi = 0; gi < ng; gi++) {
                    size_t el = ws->el[jj] + (size_t)(g0 + gi) * (size_t)D, at = ((size_t)gi * KS_blk + (size_t)jj) * Dp;
                    mskv__cpu_load(ws->kt + at, (const unsigned char *)pools->k + el * pes, pools->dtype, D);
                    mskv__cpu_load(ws->v + at, (const unsigned char *)pools->v + el * pes, pools->dtype, D);
                    for (d = D; d < Dp; d++) ws->kt[at + d] = ws->v[at + d] = 0.0f;
                }
        }
        for (gi = 0; gi < ng; gi++) {
            const size_t goff = (size_t)(g0 + gi) * (size_t)D;
            float *S = ws->s + (size_t)gi * nrp * KS, *M = ws->m + gi * nrp, *L = ws->l + gi * nrp;
            float *A = ws->alpha + gi * nrp;
            const float *Q = ws->q + (size_t)gi * nrp * Dp;
            /* gather the block: K transposed into kt[d][j] (or as rows, for few
               query rows), V as f32 rows (or the pool's own rows) */
            for (jj = 0; jj < kb; jj++) {
                size_t el = ws->el[jj] + goff;
                float *vtmp = ws->v + (size_t)jj * Dp;
                if (ng > 1 && !direct) { /* converted above */
                    ws->krow[jj] = ws->kt + ((size_t)gi * KS_blk + (size_t)jj) * Dp;
                    ws->vrow[jj] = ws->v + ((size_t)gi * KS_blk + (size_t)jj) * Dp;
                    continue;
                }
                if (few_rows) {
                    if (direct) {
                        ws->krow[jj] = (const float *)pools->k + el;
                    } else {
                        float *kr = ws->kt + (size_t)jj * Dp;
                        mskv__cpu_load(kr, (const unsigned char *)pools->k + el * pes, pools->dtype, D);
                        for (d = D; d < Dp; d++) kr[d] = 0.0f;
                        ws->krow[jj] = kr;
                    }
                } else {
                    mskv__cpu_load(vtmp, (const unsigned char *)pools->k + el * pes, pools->dtype, D);
                    for (d = 0; d < D; d++) ws->kt[(size_t)d * KS + jj] = vtmp[d];
                    for (d = D; d < Dp; d++) ws->kt[(size_t)d * KS + jj] = 0.0f;
                }
                if (direct) {
                    ws->vrow[jj] = (const float *)pools->v + el;
                } else {
                    mskv__cpu_load(vtmp, (const unsigned char *)pools->v + el * pes, pools->dtype, D);
                    for (d = D; d < Dp; d++) vtmp[d] = 0.0f;
                    ws->vrow[jj] = vtmp;
                }
            }
            if (few_rows) {
                /* an odd block computes one spare score, masked below like the padding */
                ws->krow[kb] = ws->krow[kb - 1];
                mskv__cpu_qk_rows(Q, ws->krow, S, nrp, (kb + 1) & ~1, Dp, KS);
            } else {
                for (d = 0; d < Dp; d++)
                    for (jj = kb; jj < kbp; jj++) ws->kt[(size_t)d * KS + jj] = 0.0f;
                mskv__cpu_qk(Q, ws->kt, S, nrp, kbp, Dp, KS);
            }

            /* online softmax: running max M and sum L per row; A rescales O */
            for (r = 0; r < nrp; r++) {
                float *srow = S + (size_t)r * KS, mx = -INFINITY, mnew, sum;
                int32_t a = 0, z = kb;
                if (r < nr && job->mask != MSKV_MASK_NONE) {
                    int64_t e = mskv__cpu_first_at(ws->qpos[r] + 1, split, shift, kv_len) - j0;
                    z = (int32_t)(e < 0 ? 0 : e > kb ? kb : e);
                    if (job->mask == MSKV_MASK_WINDOW) {
                        e = mskv__cpu_first_at(ws->qpos[r] - job->window_left, split, shift, kv_len) - j0;
                        a = (int32_t)(e < 0 ? 0 : e > kb ? kb : e);
                    }
                }
                if (r >= nr || a >= z) { /* nothing visible in this block */
                    for (jj = 0; jj < kbp; jj++) srow[jj] = 0.0f;
                    A[r] = 1.0f;
                    continue;
                }
                for (jj = 0; jj < a; jj++) srow[jj] = -INFINITY;
                for (jj = z; jj < kbp; jj++) srow[jj] = -INFINITY;
                for (jj = a; jj < z; jj++) mx = srow[jj] > mx ? srow[jj] : mx;
                mnew = M[r] > mx ? M[r] : mx;
                A[r] = M[r] == -INFINITY ? 0.0f : expf(M[r] - mnew);
                sum = mskv__cpu_exp_row(srow, mnew, kbp);
                L[r] = L[r] * A[r] + sum;
                M[r] = mnew;
            }

            mskv__cpu_pv(ws->o + (size_t)gi * nrp * Dp, S, ws->vrow, A, nrp, kb, Dp, KS);
        }
    }

    for (gi = 0; gi < ng; gi++)
        for (r = 0; r < nr; r++) {
            int32_t R = gi * nrp + r, t = r0 + r, i = t / group, head = (g0 + gi) * group + t % group;
            size_t row = (size_t)(qo0 + i) * (size_t)job->q_heads + (size_t)head;
            float *orow = ws->o + (size_t)R * Dp;
            if (ws->l[R] > 0.0f) {
                float inv = 1.0f / ws->l[R];
                for (d = 0; d < D; d++) orow[d] *= inv;
            } else {
                for (d = 0; d < D; d++) orow[d] = 0.0f;
            }
            mskv__cpu_store((unsigned char *)job->o + row * (size_t)D * qes, job->qt, orow, D);
            if (job->lse) job->lse[row] = ws->l[R] > 0.0f ? ws->m[R] + logf(ws->l[R]) : -INFINITY;
        }
}

static void mskv__cpu_attn_task(void *ctx, mskv__cpu_ws *ws) {
    mskv__cpu_job *job = (mskv__cpu_job *)ctx;
    int32_t b, rb, g, ng;
    while (mskv__cpu_next(job, &b, &rb, &g, &ng)) mskv__cpu_item(job, ws, b, rb, g, ng);
}

/* Checks the plan against the pools before anything is read or written. */
static mskv_result mskv__cpu_check_plan(const mskv_pools *pools, const mskv_plan *plan, const mskv_attn *attn, double *flops) {
    int32_t b, P = pools->page_size;
    int64_t work = 0;
    if (plan->batch < 0 || plan->total_q < 0) return MSKV_ERROR_INVALID_ARGUMENT;
    if (plan->page_size != P) return MSKV_ERROR_INVALID_ARGUMENT;
    if (plan->batch == 0) { *flops = 0; return plan->total_q == 0 ? MSKV_SUCCESS : MSKV_ERROR_INVALID_ARGUMENT; }
    if (!plan->qo_indptr || !plan->kv_indptr || !plan->kv_len || (!plan->kv_indices && plan->kv_indptr[plan->batch] > 0))
        return MSKV_ERROR_NULL_POINTER;
    if (plan->qo_indptr[0] != 0 || plan->kv_indptr[0] != 0 || plan->qo_indptr[plan->batch] != plan->total_q)
        return MSKV_ERROR_INVALID_ARGUMENT;
    for (b = 0; b < plan->batch; b++) {
        int32_t qo = plan->qo_indptr[b + 1] - plan->qo_indptr[b];
        int32_t np = plan->kv_indptr[b + 1] - plan->kv_indptr[b], i;
        int64_t kv = plan->kv_len[b], split, shift;
        if (qo < 0 || np < 0 || kv < 0) return MSKV_ERROR_INVALID_ARGUMENT;
        if (np == 0 ? kv != 0 : (kv <= (int64_t)(np - 1) * P || kv > (int64_t)np * P)) return MSKV_ERROR_INVALID_ARGUMENT;
        if (plan->kv_last_page_len && np > 0 && plan->kv_last_page_len[b] != kv - (int64_t)(np - 1) * P)
            return MSKV_ERROR_INVALID_ARGUMENT;
        split = plan->kv_pos_split ? plan->kv_pos_split[b] : kv;
        shift = plan->kv_pos_shift ? plan->kv_pos_shift[b] : 0;
        if (split < 0 || shift < 0) return MSKV_ERROR_INVALID_ARGUMENT;
        if (attn->mask != MSKV_MASK_NONE && qo > kv) return MSKV_ERROR_INVALID_ARGUMENT; /* queries without a position */
        for (i = plan->kv_indptr[b]; i < plan->kv_indptr[b + 1]; i++)
            if (plan->kv_indices[i] < 0 || plan->kv_indices[i] >= pools->num_pages) return MSKV_ERROR_OUT_OF_RANGE;
        work += (int64_t)qo * kv;
    }
    *flops = 4.0 * (double)work * (double)attn->q_heads * (double)pools->head_dim;
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_cpu_attention_pools(mskv_cpu *cpu, const mskv_pools *pools, const mskv_plan *plan,
                                              const mskv_attn *attn, const void *q, void *o, float *lse) {
    mskv__cpu_job job;
    mskv__cpu_ws stack_ws;
    double flops = 0;
    mskv_result res;
    int32_t rows_cap;
    if (!pools || !plan || !attn) return MSKV_ERROR_NULL_POINTER;
    if (!mskv__cpu_dtype_ok(pools->dtype) || !mskv__cpu_dtype_ok(attn->q_dtype)) return MSKV_ERROR_INVALID_ARGUMENT;
    if (pools->num_pages < 1 || pools->page_size < 1 || pools->kv_heads < 1 || pools->head_dim < 1 ||
        pools->head_dim > MSKV__CPU_MAX_DIM)
        return MSKV_ERROR_INVALID_ARGUMENT;
    if (attn->q_heads < 1 || attn->q_heads % pools->kv_heads != 0) return MSKV_ERROR_INVALID_ARGUMENT;
    if (attn->mask != MSKV_MASK_NONE && attn->mask != MSKV_MASK_CAUSAL && attn->mask != MSKV_MASK_WINDOW)
        return MSKV_ERROR_INVALID_ARGUMENT;
    if (attn->mask == MSKV_MASK_WINDOW && attn->window_left < 0) return MSKV_ERROR_INVALID_ARGUMENT;
    if (!(attn->scale >= 0.0f) || attn->scale == INFINITY) return MSKV_ERROR_INVALID_ARGUMENT;
    if ((res = mskv__cpu_check_plan(pools, plan, attn, &flops)) != MSKV_SUCCESS) return res;
    if (plan->total_q == 0) return MSKV_SUCCESS;
    if (!q || !o) return MSKV_ERROR_NULL_POINTER;
    if (plan->kv_indptr[plan->batch] > 0 && (!pools->k || !pools->v)) return MSKV_ERROR_NULL_POINTER;

    memset(&job, 0, sizeof job);
    job.pools = pools;
    job.plan = plan;
    job.q = q;
    job.o = o;
    job.lse = lse;
    job.qt = attn->q_dtype;
    job.mask = attn->mask;
    job.q_heads = attn->q_heads;
    job.group = attn->q_heads / pools->kv_heads;
    job.dim = pools->head_dim;
    job.dimp = (pools->head_dim + MSKV__CPU_KTILE - 1) & ~(MSKV__CPU_KTILE - 1);
    job.window_left = attn->window_left;
    job.scale = attn->scale > 0.0f ? attn->scale : 1.0f / sqrtf((float)pools->head_dim);

    if (!cpu) {
        /* no pool: small tiles on the stack (about 50 KB) */
        enum { ROWS = 8, KEYS = 16 };
        float q_t[ROWS * MSKV__CPU_MAX_DIM], o_t[ROWS * MSKV__CPU_MAX_DIM];
        float kt_t[KEYS * MSKV__CPU_MAX_DIM], v_t[KEYS * MSKV__CPU_MAX_DIM], s_t[ROWS * KEYS];
        float m_t[ROWS], l_t[ROWS], a_t[ROWS];
        int64_t qp_t[ROWS];
        const float *vr_t[KEYS + 1], *kr_t[KEYS + 1];
        size_t el_t[KEYS];
        stack_ws.q = q_t; stack_ws.o = o_t; stack_ws.kt = kt_t; stack_ws.v = v_t; stack_ws.s = s_t;
        stack_ws.m = m_t; stack_ws.l = l_t; stack_ws.alpha = a_t; stack_ws.qpos = qp_t; stack_ws.vrow = vr_t; stack_ws.krow = kr_t; stack_ws.el = el_t;
        stack_ws.rows = ROWS;
        stack_ws.keys = KEYS;
        job.rows = ROWS;
        job.heads_cap = pools->kv_heads;
        mskv__cpu_attn_task(&job, &stack_ws);
        return MSKV_SUCCESS;
    }

    /* rows per item: as many as the tile holds at this head_dim, at most 64 */
    rows_cap = cpu->ws[0].rows * MSKV__CPU_MAX_DIM / job.dimp;
    job.rows = rows_cap < MSKV__CPU_MAX_ROWS ? rows_cap & ~3 : MSKV__CPU_MAX_ROWS;
    /* grouping kv heads must still leave about 4 items per thread */
    job.heads_cap = (int32_t)((int64_t)plan->batch * pools->kv_heads / (4 * (int64_t)cpu->num_threads));
    if (job.heads_cap < 1) job.heads_cap = 1;
#ifndef MSKV_NO_THREADS
    if (cpu->num_threads > 1 && flops >= MSKV__CPU_SMALL_FLOPS) {
        pthread_mutex_lock(&cpu->call_lock);
        job.lock = &cpu->lock;
        pthread_mutex_lock(&cpu->lock);
        cpu->task = mskv__cpu_attn_task;
        cpu->task_ctx = &job;
        cpu->busy = cpu->started;
        cpu->generation++;
        pthread_cond_broadcast(&cpu->wake);
        pthread_mutex_unlock(&cpu->lock);
        mskv__cpu_attn_task(&job, &cpu->ws[0]);
        pthread_mutex_lock(&cpu->lock);
        while (cpu->busy > 0) pthread_cond_wait(&cpu->done, &cpu->lock);
        pthread_mutex_unlock(&cpu->lock);
        pthread_mutex_unlock(&cpu->call_lock);
        return MSKV_SUCCESS;
    }
    if (cpu->num_threads > 1) {
        /* the caller alone, but still one call at a time on workspace 0 */
        pthread_mutex_lock(&cpu->call_lock);
        mskv__cpu_attn_task(&job, &cpu->ws[0]);
        pthread_mutex_unlock(&cpu->call_lock);
        return MSKV_SUCCESS;
    }
#endif
    mskv__cpu_attn_task(&job, &cpu->ws[0]);
    return MSKV_SUCCESS;
}

MSKV_IMPL mskv_result mskv_cpu_attention(mskv_cpu *cpu, mskv_arena *arena, int32_t layer, const mskv_plan *plan,
                                        const mskv_attn *attn, const void *q, void *o, float *lse) {
    mskv_store_info si;
    mskv_pools pools;
    mskv_result res;
    if (!arena) return MSKV_ERROR_NULL_POINTER;
    if ((res = mskv_store_info_get(arena, &si)) != MSKV_SUCCESS) return res;
    if (layer < 0 || layer >= si.num_layers) return MSKV_ERROR_OUT_OF_RANGE;
    pools.k = mskv_store_pool(arena, layer, 0);
    pools.v = mskv_store_pool(arena, layer, 1);
    if (!pools.k || !pools.v) return MSKV_ERROR_UNSUPPORTED;
    pools.dtype = si.dtype;
    pools.num_pages = si.num_pages;
    pools.page_size = si.page_size;
    pools.kv_heads = si.kv_heads;
    pools.head_dim = si.head_dim;
    return mskv_cpu_attention_pools(cpu, &pools, plan, attn, q, o, lse);
}
