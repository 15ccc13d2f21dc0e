/* Prefix views (issue 12, item 1): the dense fast path keyed by
   prefix_epoch. A request's protected prefix gathered into caller-owned
   contiguous K/V, attended densely (MSKV_PLAN_PREFIX, mskv_cpu_attention_dense),
   equal to the paged result; refused once the prefix changed (new length,
   reload onto other pages, import), equal again after a refresh in place;
   and the dense prefix plus the paged rest, merged by LSE, equal to the
   paged attention over the whole sequence. */
#include <stdlib.h>
#include "mskv_test.h"
#include "../mstar_kv.h"
#include "mskv_test_util.h"

enum { MTV_P = 16, MTV_LAYERS = 2, MTV_KVH = 2, MTV_D = 32, MTV_QH = 4, MTV_CAP = 256 };

static float mtv_val(int kind, int32_t layer, int64_t pos, int32_t h, int32_t d) {
    uint32_t x = (uint32_t)(pos * 2654435761u) ^ (uint32_t)(kind * 40503 + layer * 7919 + h * 131 + d * 9973);
    x ^= x >> 15; x *= 0x2c1b3c6du; x ^= x >> 12;
    return (float)((int32_t)(x % 2001) - 1000) / 1000.0f;
}

static mskv_arena *mtv_arena(int32_t num_pages) {
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    memset(&d, 0, sizeof d);
    d.num_pages = num_pages; d.page_size = MTV_P;
    d.num_layers = MTV_LAYERS; d.kv_heads = MTV_KVH; d.head_dim = MTV_D; d.dtype = MSKV_DTYPE_F32;
    if (mskv_arena_create(&d, &a) != MSKV_SUCCESS) return NULL;
    return a;
}

/* Admits n tokens, writes every layer's K/V (values by absolute position), commits. */
static int mtv_grow(mskv_arena *a, mskv_request r, int32_t n) {
    mskv_segment s;
    mskv_plan p;
    float *k = (float *)malloc((size_t)n * MTV_KVH * MTV_D * 4), *v = (float *)malloc((size_t)n * MTV_KVH * MTV_D * 4);
    int32_t l, t, h, d, ok = k && v;
    s.request = r; s.n_tokens = n;
    memset(&p, 0, sizeof p);
    ok = ok && mskv_admit(a, &s, 1) == MSKV_SUCCESS && mskv_plan_alloc(a, 1, n, 64, &p) == MSKV_SUCCESS &&
         mskv_plan_build(a, &s, 1, NULL, &p) == MSKV_SUCCESS;
    for (l = 0; ok && l < MTV_LAYERS; l++) {
        for (t = 0; t < n; t++)
            for (h = 0; h < MTV_KVH; h++)
                for (d = 0; d < MTV_D; d++) {
                    k[((size_t)t * MTV_KVH + h) * MTV_D + d] = mtv_val(0, l, p.q_pos[t], h, d);
                    v[((size_t)t * MTV_KVH + h) * MTV_D + d] = mtv_val(1, l, p.q_pos[t], h, d);
                }
        ok = mskv_cpu_write_kv(a, l, &p, k, v, MSKV_DTYPE_F32, NULL) == MSKV_SUCCESS;
    }
    ok = ok && mskv_commit(a, &s, 1) == MSKV_SUCCESS;
    mskv_plan_free(a, &p);
    free(k); free(v);
    return ok;
}

/* A view with buffers for MTV_CAP tokens. */
static int mtv_view(mskv_prefix_view *v, mskv_request r) {
    size_t bytes = (size_t)MTV_LAYERS * MTV_CAP * MTV_KVH * MTV_D * 4;
    memset(v, 0, sizeof *v);
    v->request = r;
    v->k = malloc(bytes);
    v->v = malloc(bytes);
    v->cap_tokens = MTV_CAP;
    return v->k && v->v;
}
static void mtv_view_free(mskv_prefix_view *v) { free(v->k); free(v->v); }

static mskv_attn mtv_attn(mskv_mask m) {
    mskv_attn at;
    memset(&at, 0, sizeof at);
    at.q_heads = MTV_QH; at.mask = m; at.q_dtype = MSKV_DTYPE_F32;
    return at;
}

typedef struct mtv_out { float o[8 * MTV_QH * MTV_D], lse[8 * MTV_QH]; } mtv_out;

/* The queries of one step: nq tokens at the tail of the request. */
static void mtv_queries(float *q, int32_t nq) {
    int32_t i;
    for (i = 0; i < nq * MTV_QH * MTV_D; i++) q[i] = mtv_val(2, 0, i, 0, 0) * 2.0f;
}

/* Paged attention over the prefix alone (caller bounds hide the rest):
   what the dense view must give. */
static mskv_result mtv_paged_prefix(mskv_arena *a, mskv_segment *s, int32_t layer, mskv_mask m, const float *q, mtv_out *out) {
    mskv_plan p;
    mskv_plan_desc d;
    mskv_request_info info;
    mskv_attn at = mtv_attn(m);
    int64_t se, ws = INT32_MAX;
    mskv_result r;
    memset(&d, 0, sizeof d);
    if ((r = mskv_request_info_get(a, s->request, &info)) != MSKV_SUCCESS) return r;
    se = info.prefix_tokens;
    d.visibility = MSKV_VIS_CALLER;
    d.vis_sink_end = &se;
    d.vis_window_start = &ws;
    if ((r = mskv_plan_alloc(a, 1, 8, 64, &p)) != MSKV_SUCCESS) return r;
    r = mskv_plan_build(a, s, 1, &d, &p);
    if (r == MSKV_SUCCESS) r = mskv_cpu_attention(NULL, a, layer, &p, &at, q, out->o, out->lse);
    mskv_plan_free(a, &p);
    return r;
}

/* The same through the view: a PREFIX plan over the view's dense K/V. */
static mskv_result mtv_dense_prefix(mskv_arena *a, mskv_segment *s, const mskv_prefix_view *v, int32_t layer, mskv_mask m,
                                    const float *q, mtv_out *out) {
    mskv_plan p;
    mskv_plan_desc d;
    mskv_dense_kv kv;
    mskv_attn at = mtv_attn(m);
    mskv_result r;
    memset(&d, 0, sizeof d);
    d.kind = MSKV_PLAN_PREFIX;
    if ((r = mskv_prefix_view_layer(v, a, layer, &kv)) != MSKV_SUCCESS) return r;
    if ((r = mskv_plan_alloc(a, 1, 8, 64, &p)) != MSKV_SUCCESS) return r;
    r = mskv_plan_build(a, s, 1, &d, &p);
    if (r == MSKV_SUCCESS) r = mskv_cpu_attention_dense(NULL, &kv, &p, &at, q, out->o, out->lse);
    mskv_plan_free(a, &p);
    return r;
}

/* Dense over the view and paged over the prefix are the same keys in the
   same blocks: the same bits. */
static int mtv_same(mskv_arena *a, mskv_segment *s, const mskv_prefix_view *v, const float *q, int line) {
    int32_t l, m;
    for (l = 0; l < MTV_LAYERS; l++)
        for (m = 0; m < 2; m++) {
            mtv_out x, y;
            mskv_result r1 = mtv_paged_prefix(a, s, l, (mskv_mask)m, q, &x), r2 = mtv_dense_prefix(a, s, v, l, (mskv_mask)m, q, &y);
            if (r1 != MSKV_SUCCESS || r2 != MSKV_SUCCESS) {
                mt_fail(__FILE__, line, "layer %d mask %d: paged %s, dense %s", (int)l, (int)m, mskv_result_string(r1), mskv_result_string(r2));
                return 0;
            }
            if (memcmp(x.o, y.o, (size_t)s->n_tokens * MTV_QH * MTV_D * 4) != 0 || memcmp(x.lse, y.lse, (size_t)s->n_tokens * MTV_QH * 4) != 0) {
                mt_fail(__FILE__, line, "layer %d mask %d: the dense view's result differs from the paged one", (int)l, (int)m);
                return 0;
            }
        }
    return 1;
}

TEST(prefix_view_attention_equals_paged_attention_exactly_and_stale_views_are_refused) {
    mskv_arena *a = mtv_arena(64);
    mskv_request r, x;
    mskv_segment s;
    mskv_prefix_view v;
    mskv_dense_kv kv;
    mtv_out out;
    float q[8 * MTV_QH * MTV_D];
    unsigned char *blob;
    size_t size = 0;
    uint64_t epoch;
    mskv_request filler;
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_TRUE(mtv_grow(a, r, 100));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_protect_prefix(a, r, 37));   /* mid-page */
    ASSERT_TRUE(mtv_view(&v, r));
    EXPECT_EQ(MSKV_ERROR_STALE_VIEW, mskv_prefix_view_check(a, &v));   /* never gathered */
    ASSERT_EQ(MSKV_SUCCESS, mskv_prefix_view_gather(a, &v));
    EXPECT_EQ(37, v.tokens);
    EXPECT_EQ(MSKV_SUCCESS, mskv_prefix_view_check(a, &v));
    mtv_queries(q, 8);
    s.request = r; s.n_tokens = 8;
    ASSERT_TRUE(mtv_grow(a, r, 8));                 /* the queries are the 8 newest tokens */
    EXPECT_TRUE(mtv_same(a, &s, &v, q, __LINE__));

    /* a new length: refused (by the check and by the attention), then refreshed in place */
    epoch = v.epoch;
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_protect_prefix(a, r, 70));
    EXPECT_EQ(MSKV_ERROR_STALE_VIEW, mskv_prefix_view_check(a, &v));
    ASSERT_EQ(MSKV_SUCCESS, mskv_prefix_view_layer(&v, a, 0, &kv));
    EXPECT_EQ(MSKV_ERROR_STALE_VIEW, mtv_dense_prefix(a, &s, &v, 0, MSKV_MASK_NONE, q, &out));
    ASSERT_EQ(MSKV_SUCCESS, mskv_prefix_view_gather(a, &v));
    EXPECT_NE_U64(epoch, v.epoch);
    EXPECT_EQ(70, v.tokens);
    EXPECT_TRUE(mtv_same(a, &s, &v, q, __LINE__));

    /* reloaded onto other pages */
    epoch = v.epoch;
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(a, r));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &filler));
    ASSERT_TRUE(mtv_grow(a, filler, 3 * MTV_P));   /* takes the pages r had first */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(a, r));
    EXPECT_EQ(MSKV_ERROR_STALE_VIEW, mskv_prefix_view_check(a, &v));
    EXPECT_EQ(MSKV_ERROR_STALE_VIEW, mtv_dense_prefix(a, &s, &v, 1, MSKV_MASK_CAUSAL, q, &out));
    ASSERT_EQ(MSKV_SUCCESS, mskv_prefix_view_gather(a, &v));
    EXPECT_NE_U64(epoch, v.epoch);
    EXPECT_TRUE(mtv_same(a, &s, &v, q, __LINE__));

    /* imported as another request: the view follows it, refused until refreshed */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_export(a, r, NULL, 0, &size));
    blob = (unsigned char *)malloc(size);
    ASSERT_TRUE(blob != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_export(a, r, blob, size, &size));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_remove(a, r));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_import(a, blob, size, &x));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(a, x));
    EXPECT_EQ(MSKV_ERROR_INVALID_HANDLE, mskv_prefix_view_check(a, &v));   /* the old request is gone */
    v.request = x;
    EXPECT_EQ(MSKV_ERROR_STALE_VIEW, mskv_prefix_view_check(a, &v));
    s.request = x;
    EXPECT_EQ(MSKV_ERROR_STALE_VIEW, mtv_dense_prefix(a, &s, &v, 0, MSKV_MASK_NONE, q, &out));
    ASSERT_EQ(MSKV_SUCCESS, mskv_prefix_view_gather(a, &v));
    EXPECT_TRUE(mtv_same(a, &s, &v, q, __LINE__));
    EXPECT_TRUE(mtu_audit(a));
    free(blob);
    mtv_view_free(&v);
    mskv_arena_destroy(a);
}

/* Dense prefix (PREFIX plan over the view) + the paged rest (SELF with
   exclude_prefix), merged by LSE, equal the paged attention over the whole
   sequence: with a protected prefix, and after a release, with token-exact
   visibility too. */
TEST(dense_prefix_and_paged_rest_merged_by_lse_equal_paged_attention_over_all) {
    mskv_arena *a = mtv_arena(64);
    mskv_request r;
    mskv_segment s;
    mskv_prefix_view v;
    float q[8 * MTV_QH * MTV_D];
    int step, m, vis;
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_TRUE(mtv_grow(a, r, 150));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_protect_prefix(a, r, 21));
    ASSERT_TRUE(mtv_view(&v, r));
    ASSERT_EQ(MSKV_SUCCESS, mskv_prefix_view_gather(a, &v));
    mtv_queries(q, 8);
    for (step = 0; step < 2; step++) {
        if (step == 1) ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, r, 45, NULL));   /* point 32 + 45: mid-page */
        s.request = r; s.n_tokens = 8;
        ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &s, 1));   /* the queries: 8 reserved tokens (their K/V: zeros) */
        for (vis = 0; vis < 2; vis++)
            for (m = 0; m < 3; m++) {
                mskv_plan whole, rest, pre;
                mskv_plan_desc d;
                mskv_dense_kv kv;
                mskv_attn at = mtv_attn((mskv_mask)m);
                float o[8 * MTV_QH * MTV_D], lse[8 * MTV_QH], od[8 * MTV_QH * MTV_D], ld[8 * MTV_QH], orr[8 * MTV_QH * MTV_D], lr[8 * MTV_QH];
                int32_t i;
                at.window_left = 60;
                ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(a, 1, 8, 64, &whole));
                ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(a, 1, 8, 64, &rest));
                ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(a, 1, 8, 64, &pre));
                memset(&d, 0, sizeof d);
                d.visibility = vis ? MSKV_VIS_EXACT : MSKV_VIS_PAGES;
                ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, &s, 1, &d, &whole));
                d.exclude_prefix = 1;
                ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, &s, 1, &d, &rest));
                EXPECT_TRUE((rest.features & MSKV_PLAN_VISIBILITY) != 0);
                memset(&d, 0, sizeof d);
                d.kind = MSKV_PLAN_PREFIX;
                ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, &s, 1, &d, &pre));
                EXPECT_EQ(21, pre.kv_len[0]);
                EXPECT_TRUE((pre.features & MSKV_PLAN_Q_POS) != 0);
                ASSERT_EQ(MSKV_SUCCESS, mskv_prefix_view_layer(&v, a, 1, &kv));
                ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_attention(NULL, a, 1, &whole, &at, q, o, lse));
                ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_attention(NULL, a, 1, &rest, &at, q, orr, lr));
                ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_attention_dense(NULL, &kv, &pre, &at, q, od, ld));
                ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_merge(8, MTV_QH, MTV_D, od, ld, orr, lr, od, ld));
                for (i = 0; i < 8 * MTV_QH * MTV_D; i++)
                    if (fabs((double)o[i] - (double)od[i]) > 1e-5) {
                        mt_fail(__FILE__, __LINE__, "step %d vis %d mask %d: o[%d] paged %.8g, dense + paged %.8g", step, vis, m, (int)i, (double)o[i], (double)od[i]);
                        break;
                    }
                for (i = 0; i < 8 * MTV_QH; i++) EXPECT_NEAR(lse[i], ld[i], 1e-5 * (fabs(lse[i]) > 1 ? fabs(lse[i]) : 1));
                mskv_plan_free(a, &whole);
                mskv_plan_free(a, &rest);
                mskv_plan_free(a, &pre);
            }
        ASSERT_EQ(MSKV_SUCCESS, mskv_commit(a, &s, 1));
    }
    EXPECT_TRUE(mtu_audit(a));
    mtv_view_free(&v);
    mskv_arena_destroy(a);
}

/* ---- a store that keeps its bytes elsewhere: the gather reads whole page records ---- */

typedef struct mtv_store { unsigned char *bytes; size_t record; int fail_after; int reads; } mtv_store;
static mskv_result mtv_read(void *u, const int32_t *pages, int32_t n, void *dst) {
    mtv_store *st = (mtv_store *)u;
    int32_t i;
    for (i = 0; i < n; i++) {
        if (st->fail_after >= 0 && st->reads >= st->fail_after) return MSKV_ERROR_IO;
        st->reads++;
        memcpy((unsigned char *)dst + (size_t)i * st->record, st->bytes + (size_t)pages[i] * st->record, st->record);
    }
    return MSKV_SUCCESS;
}
static mskv_result mtv_write(void *u, const int32_t *pages, int32_t n, const void *src) {
    mtv_store *st = (mtv_store *)u;
    int32_t i;
    for (i = 0; i < n; i++) memcpy(st->bytes + (size_t)pages[i] * st->record, (const unsigned char *)src + (size_t)i * st->record, st->record);
    return MSKV_SUCCESS;
}
static mskv_result mtv_copy(void *u, int32_t src, int32_t dst) {
    mtv_store *st = (mtv_store *)u;
    memcpy(st->bytes + (size_t)dst * st->record, st->bytes + (size_t)src * st->record, st->record);
    return MSKV_SUCCESS;
}

/* Page records ([layer][K, V][slot][head][dim]) with K = (page, slot, layer)
   coded into every element: the view must hold each token's row. */
TEST(prefix_view_gathers_through_store_ops_and_a_failed_read_leaves_it_stale) {
    enum { P = 4, L = 2, KVH = 1, D = 4, PAGES = 16 };
    mskv_store_ops ops;
    mtv_store st;
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    mskv_request r;
    mskv_prefix_view v;
    float k[L * 16 * D], vv[L * 16 * D];
    int32_t pages[8], n = 0, l, t, kind, e;
    int bad = 0;
    memset(&st, 0, sizeof st);
    st.record = (size_t)L * 2 * P * KVH * D * 4;
    st.bytes = (unsigned char *)calloc(PAGES, st.record);
    st.fail_after = -1;
    ASSERT_TRUE(st.bytes != NULL);
    memset(&ops, 0, sizeof ops);
    ops.user = &st; ops.read_pages = mtv_read; ops.write_pages = mtv_write; ops.copy_page = mtv_copy;
    memset(&d, 0, sizeof d);
    d.num_pages = PAGES; d.page_size = P; d.num_layers = L; d.kv_heads = KVH; d.head_dim = D; d.dtype = MSKV_DTYPE_F32;
    d.store_ops = &ops;
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&d, &a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 15));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_pages(a, r, pages, 8, &n));
    for (t = 0; t < n; t++)
        for (l = 0; l < L; l++)
            for (kind = 0; kind < 2; kind++)
                for (e = 0; e < P * D; e++)
                    ((float *)(st.bytes + (size_t)pages[t] * st.record))[(l * 2 + kind) * P * D + e] = (float)(t * P + e / D) * 10.0f + (float)l + 0.5f * (float)kind;
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_protect_prefix(a, r, 10));
    memset(&v, 0, sizeof v);
    v.request = r; v.k = k; v.v = vv; v.cap_tokens = 16;
    ASSERT_EQ(MSKV_SUCCESS, mskv_prefix_view_gather(a, &v));
    EXPECT_EQ(3, st.reads);   /* the three prefix pages, whole */
    for (l = 0; l < L; l++)
        for (t = 0; t < 10; t++)
            for (e = 0; e < D; e++) {
                bad += k[(l * 16 + t) * D + e] != (float)t * 10.0f + (float)l;
                bad += vv[(l * 16 + t) * D + e] != (float)t * 10.0f + (float)l + 0.5f;
            }
    EXPECT_EQ(0, bad);
    /* a read that fails half-way: the view says epoch 0, stale, not "the old prefix" */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_protect_prefix(a, r, 12));
    st.fail_after = st.reads + 1;
    EXPECT_EQ(MSKV_ERROR_IO, mskv_prefix_view_gather(a, &v));
    EXPECT_EQ_U64(0, v.epoch);
    EXPECT_EQ(MSKV_ERROR_STALE_VIEW, mskv_prefix_view_check(a, &v));
    st.fail_after = -1;
    EXPECT_EQ(MSKV_SUCCESS, mskv_prefix_view_gather(a, &v));
    EXPECT_EQ(MSKV_SUCCESS, mskv_prefix_view_check(a, &v));
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
    free(st.bytes);
}
