/* Layer groups: one arena, one page budget, a page table per group per
   request (full-attention layers in one group, chunk-window layers in
   another), each group planned, written and attended on its own; the
   whole-request calls (admit, offload, reload, export, import, fork) act on
   every group at once, all or nothing. */
#include <stdlib.h>
#include "mskv_test.h"
#include "../mstar_kv.h"
#include "mskv_test_util.h"

#define MTG_HEADS 2
#define MTG_QHEADS 4
#define MTG_DIM 8

/* groups of `layers` layers each (the store keeps that many pools) */
static mskv_arena *mtg_make(int32_t num_pages, int32_t page_size, int32_t groups, int32_t layers, mskv_retire_mode mode) {
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    memset(&d, 0, sizeof d);
    d.num_pages = num_pages; d.page_size = page_size; d.num_groups = groups;
    d.num_layers = layers; d.kv_heads = MTG_HEADS; d.head_dim = MTG_DIM; d.dtype = MSKV_DTYPE_F32;
    d.retire_mode = mode;
    if (mskv_arena_create(&d, &a) != MSKV_SUCCESS) return NULL;
    return a;
}

static float mtg_uniform(uint64_t *s) { return (float)((mtu_xorshift(s) >> 40) / (double)(1u << 24)) * 2.0f - 1.0f; }

static mskv_request_info mtg_info(mskv_arena *a, mskv_request r, int32_t g) {
    mskv_request_info i;
    memset(&i, 0, sizeof i);
    if (mskv_request_info_in_group(a, r, g, &i) != MSKV_SUCCESS) i.num_pages = -1;
    return i;
}

/* ---- the 4-layer model: layers 0 and 2 full attention (group 0), 1 and 3
   chunk-window (group 1, sink 1 chunk + the last 2 chunks) ---------------- */

#define MTG_LAYERS 4
#define MTG_CHUNK 8           /* tokens per chunk: 2 pages of 4 */
#define MTG_CHUNKS 20
#define MTG_TOKENS (MTG_CHUNK * MTG_CHUNKS)

static float mtg_k[MTG_LAYERS][MTG_TOKENS][MTG_HEADS][MTG_DIM];
static float mtg_v[MTG_LAYERS][MTG_TOKENS][MTG_HEADS][MTG_DIM];

/* Bidirectional attention over the visible positions [0, sink) + [from, end),
   straight from the test's own copy of every layer's K/V. */
static void mtg_reference(int layer, const float *q, int64_t nq, int64_t sink, int64_t from, int64_t end, float *o) {
    int64_t i, p;
    int h, d;
    double scale = 1.0 / sqrt((double)MTG_DIM);
    for (i = 0; i < nq; i++)
        for (h = 0; h < MTG_QHEADS; h++) {
            const float *qq = q + (i * MTG_QHEADS + h) * MTG_DIM;
            int kh = h / (MTG_QHEADS / MTG_HEADS);
            double m = -1e300, sum = 0.0, acc[MTG_DIM];
            for (d = 0; d < MTG_DIM; d++) acc[d] = 0.0;
            for (p = 0; p < end; p++) {
                double s = 0.0;
                if (p >= sink && p < from) continue;
                for (d = 0; d < MTG_DIM; d++) s += (double)qq[d] * mtg_k[layer][p][kh][d];
                s *= scale;
                if (s > m) {
                    double c = exp(m - s);
                    sum *= c;
                    for (d = 0; d < MTG_DIM; d++) acc[d] *= c;
                    m = s;
                }
                sum += exp(s - m);
                for (d = 0; d < MTG_DIM; d++) acc[d] += exp(s - m) * mtg_v[layer][p][kh][d];
            }
            for (d = 0; d < MTG_DIM; d++) o[(i * MTG_QHEADS + h) * MTG_DIM + d] = (float)(acc[d] / sum);
        }
}

/* The window start the chunk-window policy leaves once c tokens are committed
   (sink 1 chunk, window 2 chunks; chunks are whole pages here, so exact). */
static int64_t mtg_window_from(int64_t c) {
    int64_t raw = c - MTG_CHUNK - 2 * MTG_CHUNK;
    return MTG_CHUNK + (raw > 0 ? raw / MTG_CHUNK * MTG_CHUNK : 0);
}

TEST(layer_groups_keep_the_windowed_pages_flat_and_grow_the_full_ones_from_one_budget) {
    /* peak: full group 20 chunks x 2 pages, window group sink 2 + window 4 + the new chunk 2 */
    const int32_t num_pages = 1 + MTG_CHUNKS * 2 + 8;
    mskv_arena *a = mtg_make(num_pages, 4, 2, 2, MSKV_RETIRE_IMMEDIATE);
    mskv_request r;
    mskv_retention ret;
    mskv_plan plan[2];
    mskv_attn at;
    uint64_t seed = mt_seed(), s = seed | 1;
    static float q[MTG_CHUNK * MTG_QHEADS * MTG_DIM], o[MTG_CHUNK * MTG_QHEADS * MTG_DIM], want[MTG_CHUNK * MTG_QHEADS * MTG_DIM];
    uint8_t was_window[64];
    int32_t k, g, reused = 0, max_err_at = -1;
    double max_err = 0.0;
    ASSERT_TRUE(a != NULL);
    memset(was_window, 0, sizeof was_window);
    memset(&ret, 0, sizeof ret);
    ret.chunk_size = MTG_CHUNK; ret.sink_chunks = 1; ret.window_chunks = 2;
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_set_retention_in_group(a, r, 1, &ret));
    for (g = 0; g < 2; g++) ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(a, 1, MTG_CHUNK, num_pages, &plan[g]));
    memset(&at, 0, sizeof at);
    at.q_heads = MTG_QHEADS; at.mask = MSKV_MASK_NONE; at.q_dtype = MSKV_DTYPE_F32;
    for (k = 0; k < MTG_CHUNKS; k++) {
        mskv_segment seg;
        mskv_plan_desc pd;
        mskv_arena_stats st;
        mskv_request_info full, win;
        int64_t c = (int64_t)k * MTG_CHUNK, i, from = mtg_window_from(c);
        int layer;
        int32_t pages[64], n = 0;
        seg.request = r; seg.n_tokens = MTG_CHUNK;
        ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &seg, 1));
        EXPECT_TRUE(mtu_audit(a));
        memset(&pd, 0, sizeof pd);
        pd.pos_mode = MSKV_POS_1D;
        for (g = 0; g < 2; g++) {        /* one plan per group per step */
            pd.group = g;
            ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, &seg, 1, &pd, &plan[g]));
        }
        EXPECT_EQ(c + MTG_CHUNK, plan[0].kv_len[0]);
        EXPECT_EQ(MTG_CHUNK + (c + MTG_CHUNK - from), plan[1].kv_len[0]);
        for (layer = 0; layer < MTG_LAYERS; layer++) {
            int32_t gl = layer % 2, l = layer / 2;   /* the layer's group, and its index in the group */
            float err;
            for (i = 0; i < MTG_CHUNK; i++) {
                int h, d;
                for (h = 0; h < MTG_HEADS; h++)
                    for (d = 0; d < MTG_DIM; d++) {
                        mtg_k[layer][c + i][h][d] = mtg_uniform(&s);
                        mtg_v[layer][c + i][h][d] = mtg_uniform(&s);
                    }
            }
            for (i = 0; i < MTG_CHUNK * MTG_QHEADS * MTG_DIM; i++) q[i] = mtg_uniform(&s) * 2.0f;
            ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_write_kv(a, l, &plan[gl], &mtg_k[layer][c][0][0], &mtg_v[layer][c][0][0], MSKV_DTYPE_F32, NULL));
            ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_attention(NULL, a, l, &plan[gl], &at, q, o, NULL));
            mtg_reference(layer, q, MTG_CHUNK, MTG_CHUNK, gl == 0 ? MTG_CHUNK : from, c + MTG_CHUNK, want);
            for (i = 0; i < MTG_CHUNK * MTG_QHEADS * MTG_DIM; i++) {
                err = fabsf(o[i] - want[i]);
                if (err > max_err) { max_err = err; max_err_at = k * 10 + layer; }
            }
        }
        ASSERT_EQ(MSKV_SUCCESS, mskv_commit(a, &seg, 1));
        EXPECT_TRUE(mtu_audit(a));
        ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &st));
        if (k == MTG_CHUNKS - 1) EXPECT_EQ(0, st.free_pages);   /* the budget is exactly the peak */
        /* the window group's pages before publish releases some */
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_pages_in_group(a, r, 1, pages, 64, &n));
        for (i = 0; i < n; i++) was_window[pages[i]] = 1;
        ASSERT_EQ(MSKV_SUCCESS, mskv_publish(a, &seg, 1, NULL));
        EXPECT_TRUE(mtu_audit(a));
        full = mtg_info(a, r, 0);
        win = mtg_info(a, r, 1);
        EXPECT_EQ(2 * (k + 1), full.num_pages);                         /* the full layers grow */
        EXPECT_EQ(k < 2 ? 2 * (k + 1) : 6, win.num_pages);              /* the windowed ones stay flat */
        EXPECT_EQ(0, full.live_start);
        EXPECT_EQ(mtg_window_from(c + MTG_CHUNK), win.live_start);
    }
    {   /* pages the window group let go came back to the full group */
        int32_t pages[64], n = 0, i;
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_pages_in_group(a, r, 0, pages, 64, &n));
        for (i = 0; i < n; i++) reused += was_window[pages[i]];
    }
    printf("  seed %llu: worst |o - reference| %.3g (chunk*10+layer %d); full group reused %d pages first held by the window group\n",
           (unsigned long long)seed, max_err, (int)max_err_at, (int)reused);
    EXPECT_LE(max_err, 1e-5);
    EXPECT_GT(reused, 0);
    for (g = 0; g < 2; g++) mskv_plan_free(a, &plan[g]);
    mskv_arena_destroy(a);
}

TEST(layer_groups_out_of_pages_on_the_shared_budget_is_all_or_nothing_across_groups) {
    mskv_arena *a = mtg_make(1 + 3, 4, 2, 1, MSKV_RETIRE_IMMEDIATE);
    mskv_request r;
    mskv_segment seg;
    mskv_arena_stats st;
    mskv_request_info i0, i1;
    uint64_t d;
    int64_t need = 0;
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    seg.request = r; seg.n_tokens = 8;   /* 2 pages in each group: 4 > 3 */
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit_query(a, &seg, 1, &need));
    EXPECT_EQ(4, need);
    d = mskv_arena_digest(a);
    EXPECT_EQ(MSKV_ERROR_OUT_OF_PAGES, mskv_admit(a, &seg, 1));
    EXPECT_EQ_U64(d, mskv_arena_digest(a));
    i0 = mtg_info(a, r, 0);
    i1 = mtg_info(a, r, 1);
    EXPECT_EQ(0, i0.num_pages);   /* group 0 alone would have fit: it got nothing either */
    EXPECT_EQ(0, i1.num_pages);
    EXPECT_FALSE(i0.has_reservation);
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &st));
    EXPECT_EQ(3, st.free_pages);
    EXPECT_TRUE(mtu_audit(a));
    seg.n_tokens = 4;              /* one page in each group */
    EXPECT_EQ(MSKV_SUCCESS, mskv_admit(a, &seg, 1));
    EXPECT_EQ(1, mtg_info(a, r, 0).num_pages);
    EXPECT_EQ(1, mtg_info(a, r, 1).num_pages);
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

/* ---- byte patterns per (group, position) --------------------------------- */

static unsigned char mtg_byte(uint32_t tag, int32_t g, int64_t pos, int layer, int kind, size_t i) {
    uint32_t x = tag * 2654435761u ^ (uint32_t)g * 0x9E3779B9u ^ (uint32_t)pos * 40503u ^ (uint32_t)layer * 977u ^
                 (uint32_t)kind * 131u ^ (uint32_t)i * 7u;
    x ^= x >> 13;
    return (unsigned char)(x * 31u >> 3);
}

/* write (check: count mismatching tokens of) positions [from, to) of group g */
static int64_t mtg_bytes(mskv_arena *a, mskv_request r, int32_t g, uint32_t tag, int64_t from, int64_t to, int check) {
    mskv_store_info si;
    int64_t pos, slot, bad = 0;
    int layer, kind;
    size_t i;
    if (mskv_store_info_get(a, &si) != MSKV_SUCCESS) return -1;
    for (pos = from; pos < to; pos++) {
        int ok = 1;
        if (mskv_request_slot_in_group(a, r, g, pos, &slot) != MSKV_SUCCESS) { bad++; continue; }
        for (layer = 0; layer < si.num_layers; layer++)
            for (kind = 0; kind < 2; kind++) {
                unsigned char *p = (unsigned char *)mskv_store_pool(a, layer, kind) + (size_t)slot * si.slot_bytes;
                for (i = 0; i < si.slot_bytes; i++) {
                    unsigned char want = mtg_byte(tag, g, pos, layer, kind, i);
                    if (!check) p[i] = want;
                    else if (p[i] != want) ok = 0;
                }
            }
        bad += !ok;
    }
    return bad;
}

/* 27 tokens; group 0 protects 6 and releases [8, 20); group 1 protects 4 and
   releases [4, 12): different tables, windows and prefixes per group. */
static int mtg_shaped(mskv_arena *a, mskv_request *r, uint32_t tag) {
    if (mskv_request_add(a, r) != MSKV_SUCCESS || mtu_grow(a, *r, 27) != MSKV_SUCCESS) return 0;
    if (mtg_bytes(a, *r, 0, tag, 0, 27, 0) != 0 || mtg_bytes(a, *r, 1, tag, 0, 27, 0) != 0) return 0;
    if (mskv_request_protect_prefix_in_group(a, *r, 0, 6) != MSKV_SUCCESS) return 0;
    if (mskv_request_release_oldest_in_group(a, *r, 0, 12, NULL) != MSKV_SUCCESS) return 0;
    if (mskv_request_protect_prefix_in_group(a, *r, 1, 4) != MSKV_SUCCESS) return 0;
    return mskv_request_release_oldest_in_group(a, *r, 1, 8, NULL) == MSKV_SUCCESS;
}
static int64_t mtg_check_shaped(mskv_arena *a, mskv_request r, uint32_t tag) {
    return mtg_bytes(a, r, 0, tag, 0, 8, 1) + mtg_bytes(a, r, 0, tag, 20, 27, 1) +
           mtg_bytes(a, r, 1, tag, 0, 4, 1) + mtg_bytes(a, r, 1, tag, 12, 27, 1);
}
static int mtg_same(const mskv_request_info *x, const mskv_request_info *y) {
    return x->committed == y->committed && x->prefix_tokens == y->prefix_tokens && x->prefix_pages == y->prefix_pages &&
           x->live_start == y->live_start && x->num_pages == y->num_pages && x->kv_len == y->kv_len;
}
static void mtg_scribble(mskv_arena *a) {
    mskv_store_info si;
    int32_t l;
    if (mskv_store_info_get(a, &si) != MSKV_SUCCESS) return;
    for (l = 0; l < si.num_layers; l++) {
        memset(mskv_store_pool(a, l, 0), 0x5a, si.pool_bytes);
        memset(mskv_store_pool(a, l, 1), 0xa5, si.pool_bytes);
    }
}

TEST(layer_groups_offload_and_reload_carry_every_group_byte_exact) {
    mskv_arena *a = mtg_make(32, 4, 2, 2, MSKV_RETIRE_IMMEDIATE);
    mskv_request r;
    mskv_request_info b0, b1, a0, a1;
    mskv_arena_stats st;
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mtg_shaped(a, &r, 5));
    b0 = mtg_info(a, r, 0);
    b1 = mtg_info(a, r, 1);
    EXPECT_EQ(4, b0.num_pages);   /* 2 prefix + [20, 28) */
    EXPECT_EQ(5, b1.num_pages);   /* 1 prefix + [12, 28) */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_offload(a, r));
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_stats_get(a, &st));
    EXPECT_EQ(0, st.live_pages);
    EXPECT_EQ(9, st.offloaded_pages);
    EXPECT_EQ(31, st.free_pages);
    EXPECT_EQ(4, mtg_info(a, r, 0).num_pages);   /* info counts the host copy's pages */
    EXPECT_EQ(5, mtg_info(a, r, 1).num_pages);
    EXPECT_TRUE(mtu_audit(a));
    mtg_scribble(a);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(a, r));
    a0 = mtg_info(a, r, 0);
    a1 = mtg_info(a, r, 1);
    EXPECT_TRUE(mtg_same(&b0, &a0));
    EXPECT_TRUE(mtg_same(&b1, &a1));
    EXPECT_NE_U64(b0.prefix_epoch, a0.prefix_epoch);   /* reload moves every group's epoch */
    EXPECT_NE_U64(b1.prefix_epoch, a1.prefix_epoch);
    EXPECT_EQ(0, mtg_check_shaped(a, r, 5));
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

static unsigned char *mtg_export(mskv_arena *a, mskv_request r, size_t *size) {
    unsigned char *b;
    if (mskv_request_export(a, r, NULL, 0, size) != MSKV_SUCCESS) return NULL;
    b = (unsigned char *)malloc(*size);
    if (b && mskv_request_export(a, r, b, *size, size) != MSKV_SUCCESS) { free(b); b = NULL; }
    return b;
}

TEST(layer_groups_export_and_import_carry_every_group) {
    mskv_arena *a = mtg_make(32, 4, 2, 2, MSKV_RETIRE_IMMEDIATE), *b = mtg_make(40, 4, 2, 2, MSKV_RETIRE_IMMEDIATE);
    mskv_request r, x, filler;
    mskv_store_info si;
    unsigned char *blob;
    size_t size = 0;
    ASSERT_TRUE(a != NULL && b != NULL);
    ASSERT_TRUE(mtg_shaped(a, &r, 9));
    ASSERT_EQ(MSKV_SUCCESS, mskv_store_info_get(a, &si));
    blob = mtg_export(a, r, &size);
    ASSERT_TRUE(blob != NULL);
    /* version 2: the one-group header, the group count, one record per further group */
    EXPECT_EQ(5, (int)blob[8]);   /* layout 2, XXH64-signed */
    EXPECT_EQ((long long)(136 + 64 + 9 * 2 * 2 * si.page_bytes + 8), (long long)size);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(b, &filler));   /* other page ids in the other arena */
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(b, filler, 10));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_import(b, blob, size, &x));
    EXPECT_TRUE(mtu_audit(b));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_reload(b, x));
    {
        mskv_request_info p0 = mtg_info(a, r, 0), p1 = mtg_info(a, r, 1), q0 = mtg_info(b, x, 0), q1 = mtg_info(b, x, 1);
        EXPECT_TRUE(mtg_same(&p0, &q0));
        EXPECT_TRUE(mtg_same(&p1, &q1));
    }
    EXPECT_EQ(0, mtg_check_shaped(b, x, 9));
    EXPECT_TRUE(mtu_audit(b));
    free(blob);
    mskv_arena_destroy(a);
    mskv_arena_destroy(b);
}

TEST(layer_groups_blob_from_an_arena_with_another_group_count_is_BLOB_MISMATCH) {
    mskv_arena *two = mtg_make(32, 4, 2, 2, MSKV_RETIRE_IMMEDIATE), *one = mtg_make(32, 4, 1, 2, MSKV_RETIRE_IMMEDIATE);
    mskv_arena *three = mtg_make(32, 4, 3, 2, MSKV_RETIRE_IMMEDIATE);
    mskv_request r1, r2, x;
    unsigned char *b1, *b2;
    size_t n1 = 0, n2 = 0;
    uint64_t d;
    ASSERT_TRUE(two != NULL && one != NULL && three != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(one, &r1));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(one, r1, 9));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(two, &r2));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(two, r2, 9));
    b1 = mtg_export(one, r1, &n1);
    b2 = mtg_export(two, r2, &n2);
    ASSERT_TRUE(b1 != NULL && b2 != NULL);
    EXPECT_EQ(4, (int)b1[8]);   /* a one-group arena writes the version-1 layout it always did (as 4: XXH64) */
    d = mskv_arena_digest(two);
    EXPECT_EQ(MSKV_ERROR_BLOB_MISMATCH, mskv_request_import(two, b1, n1, &x));
    EXPECT_EQ_U64(d, mskv_arena_digest(two));
    d = mskv_arena_digest(one);
    EXPECT_EQ(MSKV_ERROR_BLOB_MISMATCH, mskv_request_import(one, b2, n2, &x));
    EXPECT_EQ_U64(d, mskv_arena_digest(one));
    d = mskv_arena_digest(three);
    EXPECT_EQ(MSKV_ERROR_BLOB_MISMATCH, mskv_request_import(three, b2, n2, &x));
    EXPECT_EQ_U64(d, mskv_arena_digest(three));
    free(b1);
    free(b2);
    mskv_arena_destroy(one);
    mskv_arena_destroy(two);
    mskv_arena_destroy(three);
}

/* A correctly signed version-2 blob whose further group describes a state no
   arena could have: refused as corrupt, nothing changes. */
TEST(layer_groups_import_refuses_a_signed_blob_with_an_impossible_group_state) {
    mskv_arena *a = mtg_make(32, 4, 2, 2, MSKV_RETIRE_IMMEDIATE);
    mskv_request r, x;
    unsigned char *blob;
    size_t size = 0;
    uint64_t d;
    int k;
    ASSERT_TRUE(a != NULL);
    ASSERT_TRUE(mtg_shaped(a, &r, 3));
    blob = mtg_export(a, r, &size);
    ASSERT_TRUE(blob != NULL);
    for (k = 0; k < 5; k++) {
        unsigned char *c = (unsigned char *)malloc(size);
        ASSERT_TRUE(c != NULL);
        memcpy(c, blob, size);
        if (k == 0) mtu_put32(c + 136 + 4, 3);          /* group 1's prefix pages do not cover its prefix */
        if (k == 1) mtu_put64(c + 136 + 24, 14);        /* its window starts inside a page */
        if (k == 2) mtu_put32(c + 136, 6);              /* its page count disagrees with its tokens */
        if (k == 3) mtu_put32(c + 128, 3);              /* three groups in a header of two */
        if (k == 4) mtu_put32(c + 136 + 12, 1);         /* a reserved field is set */
        mtu_blob_sign(c, size);
        d = mskv_arena_digest(a);
        EXPECT_EQ(MSKV_ERROR_BLOB_CORRUPT, mskv_request_import(a, c, size, &x));
        EXPECT_EQ_U64(d, mskv_arena_digest(a));
        free(c);
    }
    EXPECT_TRUE(mtu_audit(a));
    free(blob);
    mskv_arena_destroy(a);
}

TEST(layer_groups_fork_copies_each_groups_partial_last_page_all_or_nothing) {
    mskv_arena *a = mtg_make(1 + 4 + 1, 4, 2, 1, MSKV_RETIRE_IMMEDIATE);
    mskv_request p, c;
    int32_t pp[4], cp[4], n = 0, g;
    uint64_t d;
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &p));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, p, 6));          /* 2 pages per group, the second partial */
    ASSERT_TRUE(mtg_bytes(a, p, 0, 1, 0, 6, 0) == 0 && mtg_bytes(a, p, 1, 1, 0, 6, 0) == 0);
    /* one free page left: the fork needs two (a copy per group) */
    d = mskv_arena_digest(a);
    EXPECT_EQ(MSKV_ERROR_OUT_OF_PAGES, mskv_request_fork(a, p, &c));
    EXPECT_EQ_U64(d, mskv_arena_digest(a));
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
    a = mtg_make(1 + 4 + 2, 4, 2, 1, MSKV_RETIRE_IMMEDIATE);
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &p));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, p, 6));
    ASSERT_TRUE(mtg_bytes(a, p, 0, 1, 0, 6, 0) == 0 && mtg_bytes(a, p, 1, 1, 0, 6, 0) == 0);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_fork(a, p, &c));
    for (g = 0; g < 2; g++) {
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_pages_in_group(a, p, g, pp, 4, &n));
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_pages_in_group(a, c, g, cp, 4, &n));
        ASSERT_EQ(2, n);
        EXPECT_EQ(pp[0], cp[0]);    /* the full page is shared */
        EXPECT_NE(pp[1], cp[1]);    /* the partial one is the child's own copy */
        EXPECT_EQ(0, mtg_bytes(a, c, g, 1, 0, 6, 1));
    }
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

TEST(layer_groups_keyed_entry_holds_pages_in_every_group_and_cross_plans_read_the_groups_own) {
    mskv_arena *a = mtg_make(16, 4, 2, 1, MSKV_RETIRE_IMMEDIATE);
    mskv_request e, r;
    mskv_segment seg;
    mskv_plan plan;
    mskv_plan_desc pd;
    int32_t pages[4], n = 0, g, i;
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_keyed_create(a, 42, 5, &e));
    ASSERT_EQ(MSKV_SUCCESS, mskv_keyed_seal(a, e));
    EXPECT_EQ(2, mtg_info(a, e, 0).num_pages);
    EXPECT_EQ(2, mtg_info(a, e, 1).num_pages);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    seg.request = r; seg.n_tokens = 3;
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &seg, 1));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(a, 1, 8, 8, &plan));
    memset(&pd, 0, sizeof pd);
    pd.kind = MSKV_PLAN_CROSS; pd.cross = e;
    for (g = 0; g < 2; g++) {
        pd.group = g;
        ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, &seg, 1, &pd, &plan));
        ASSERT_EQ(MSKV_SUCCESS, mskv_request_pages_in_group(a, e, g, pages, 4, &n));
        ASSERT_EQ(n, plan.num_page_ids);
        for (i = 0; i < n; i++) EXPECT_EQ(pages[i], plan.kv_indices[i]);
        EXPECT_EQ(5, plan.kv_len[0]);
    }
    EXPECT_TRUE(mtu_audit(a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_keyed_remove(a, 42));
    EXPECT_TRUE(mtu_audit(a));
    mskv_plan_free(a, &plan);
    mskv_arena_destroy(a);
}

typedef struct mtg_events { int n; mskv_event e[64]; } mtg_events;
static void mtg_on_event(void *u, const mskv_event *e) {
    mtg_events *ev = (mtg_events *)u;
    if (ev->n < 64) ev->e[ev->n++] = *e;
}

TEST(layer_groups_page_events_name_the_group_whose_table_held_the_page) {
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    mtg_events ev;
    mskv_request r;
    mskv_segment seg;
    int32_t p0[4], p1[4], n = 0;
    memset(&d, 0, sizeof d);
    memset(&ev, 0, sizeof ev);
    d.num_pages = 16; d.page_size = 4; d.num_groups = 2;
    d.on_event = mtg_on_event; d.event_user = &ev;
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&d, &a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 4));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_pages_in_group(a, r, 0, p0, 4, &n));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_pages_in_group(a, r, 1, p1, 4, &n));
    seg.request = r; seg.n_tokens = 0;
    ASSERT_EQ(MSKV_SUCCESS, mskv_publish(a, &seg, 1, NULL));
    ASSERT_EQ(2, ev.n);
    EXPECT_EQ(MSKV_EVENT_PAGE_STORED, ev.e[0].type);
    EXPECT_EQ(0, ev.e[0].group);
    EXPECT_EQ(p0[0], ev.e[0].page);
    EXPECT_EQ(1, ev.e[1].group);
    EXPECT_EQ(p1[0], ev.e[1].page);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest_in_group(a, r, 1, 4, NULL));
    ASSERT_EQ(3, ev.n);
    EXPECT_EQ(MSKV_EVENT_PAGE_REMOVED, ev.e[2].type);
    EXPECT_EQ(1, ev.e[2].group);
    EXPECT_EQ(p1[0], ev.e[2].page);
    EXPECT_EQ(1, mtg_info(a, r, 0).num_pages);   /* group 0 kept its page */
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

TEST(admit_query_counts_the_pages_of_every_group) {
    mskv_arena *a = mtg_make(32, 4, 3, 1, MSKV_RETIRE_IMMEDIATE);
    mskv_request r;
    mskv_segment seg;
    int64_t need = -1;
    uint64_t d;
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 6));             /* 2 pages per group, the last one half full */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest_in_group(a, r, 2, 4, NULL));
    seg.request = r; seg.n_tokens = 5;                       /* tokens 6..10: one more page in each group */
    d = mskv_arena_digest(a);
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit_query(a, &seg, 1, &need));
    EXPECT_EQ(3, need);
    EXPECT_EQ_U64(d, mskv_arena_digest(a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_admit(a, &seg, 1));
    EXPECT_EQ(3, mtg_info(a, r, 0).num_pages);
    EXPECT_EQ(2, mtg_info(a, r, 2).num_pages);
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

TEST(layer_group_count_outside_1_to_MAX_GROUPS_is_refused) {
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    memset(&d, 0, sizeof d);
    d.num_pages = 8; d.page_size = 4;
    d.num_groups = -1;
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_arena_create(&d, &a));
    d.num_groups = MSKV_MAX_GROUPS + 1;
    EXPECT_EQ(MSKV_ERROR_INVALID_ARGUMENT, mskv_arena_create(&d, &a));
    EXPECT_TRUE(a == NULL);
    d.num_groups = MSKV_MAX_GROUPS;
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&d, &a));
    mskv_arena_destroy(a);
}
