/* Token-exact windows for any page size (issue 12, item 8). Releases free
   whole pages, so a window edge inside a page used to leave up to
   page_size - 1 released tokens visible; the release point is now kept
   exactly and plans built with MSKV_VIS_EXACT carry it as visibility bounds
   the attention honours, while pages still go whole. The video test runs
   Wan's geometry (1,560-token frames, page size 16: 97.5 pages a frame)
   against a contiguous rolling cache written the way research code writes
   it (sink kept, the oldest tokens dropped exactly by copying). */
#include <stdlib.h>
#include "mskv_test.h"
#include "../mstar_kv.h"
#include "mskv_test_util.h"

/* ---- the release point -------------------------------------------------------------- */

static mskv_arena *mtx_arena(int32_t num_pages, int32_t page_size, int32_t layers, int32_t dim) {
    mskv_arena_desc d;
    mskv_arena *a = NULL;
    memset(&d, 0, sizeof d);
    d.num_pages = num_pages; d.page_size = page_size;
    d.num_layers = layers; d.kv_heads = layers ? 1 : 0; d.head_dim = dim; d.dtype = MSKV_DTYPE_F32;
    if (mskv_arena_create(&d, &a) != MSKV_SUCCESS) return NULL;
    return a;
}

static mskv_request_info mtx_info(mskv_arena *a, mskv_request r) {
    mskv_request_info i;
    memset(&i, 0, sizeof i);
    if (mskv_request_info_get(a, r, &i) != MSKV_SUCCESS) i.committed = -1;
    return i;
}

TEST(release_point_is_token_exact_while_pages_go_whole) {
    mskv_arena *a = mtx_arena(64, 16, 0, 0);
    mskv_request r;
    mskv_request_info i;
    int64_t released = 0;
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 200));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_protect_prefix(a, r, 20));
    EXPECT_EQ(0, mtx_info(a, r).release_point);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, r, 50, &released));   /* from 32: point 82 */
    i = mtx_info(a, r);
    EXPECT_EQ(48, released);
    EXPECT_EQ(80, i.live_start);
    EXPECT_EQ(82, i.release_point);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, r, 1, &released));   /* on from 82: point 83 */
    EXPECT_EQ(0, released);
    EXPECT_EQ(83, mtx_info(a, r).release_point);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, r, 0, &released));
    EXPECT_EQ(83, mtx_info(a, r).release_point);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, r, 16, &released));  /* point 99 */
    i = mtx_info(a, r);
    EXPECT_EQ(16, released);
    EXPECT_EQ(96, i.live_start);
    EXPECT_EQ(99, i.release_point);
    EXPECT_TRUE(mtu_audit(a));
    mskv_arena_destroy(a);
}

/* A release that frees no page still hides its tokens; a protect that moves
   the prefix while no page was released forgets it (the tokens it hid are
   protected or live again). */
TEST(release_point_inside_the_first_live_page_and_a_later_protect) {
    mskv_arena *a = mtx_arena(64, 16, 0, 0);
    mskv_request r;
    mskv_segment s;
    mskv_plan p;
    mskv_plan_desc d;
    ASSERT_TRUE(a != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 60));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_protect_prefix(a, r, 10));   /* prefix page [0, 16) */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, r, 5, NULL));
    EXPECT_EQ(16, mtx_info(a, r).live_start);
    EXPECT_EQ(21, mtx_info(a, r).release_point);
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(a, 1, 4, 8, &p));
    memset(&d, 0, sizeof d);
    d.visibility = MSKV_VIS_EXACT;
    s.request = r; s.n_tokens = 2;
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, &s, 1, &d, &p));
    EXPECT_EQ(10, p.vis_sink_end[0]);       /* hidden: [10, 21), the prefix page's tail too */
    EXPECT_EQ(21, p.vis_window_start[0]);
    EXPECT_EQ(MSKV_PLAN_VISIBILITY, p.features);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_protect_prefix(a, r, 40));
    EXPECT_EQ(0, mtx_info(a, r).release_point);
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_build(a, &s, 1, &d, &p));
    EXPECT_EQ(0, p.vis_sink_end[0]);        /* nothing hidden: the canonical (0, 0) */
    EXPECT_EQ(0, p.vis_window_start[0]);
    EXPECT_EQ(0u, p.features);
    EXPECT_TRUE(mtu_audit(a));
    mskv_plan_free(a, &p);
    mskv_arena_destroy(a);
}

/* Version 1 blobs say a page-aligned release point already; one inside a
   page needs version 3, and the round trip restores it. */
TEST(release_point_round_trips_through_export_and_import) {
    mskv_arena *a = mtx_arena(64, 8, 1, 4), *b = mtx_arena(64, 8, 1, 4);
    mskv_request r, x;
    unsigned char blob[4096];
    size_t size = 0;
    ASSERT_TRUE(a != NULL && b != NULL);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mtu_grow(a, r, 40));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, r, 16, NULL));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_export(a, r, blob, sizeof blob, &size));
    EXPECT_EQ(4, (int)blob[8]);   /* layout 1, XXH64-signed */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_import(b, blob, size, &x));
    EXPECT_EQ(16, mtx_info(b, x).release_point);
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_release_oldest(a, r, 3, NULL));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_export(a, r, blob, sizeof blob, &size));
    EXPECT_EQ(6, (int)blob[8]);   /* layout 3, XXH64-signed */
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_import(b, blob, size, &x));
    EXPECT_EQ(19, mtx_info(b, x).release_point);
    EXPECT_EQ(16, mtx_info(b, x).live_start);
    /* a release point the pages contradict is refused (signed, so only the content is wrong) */
    mtu_put64(blob + 136 + 8, 30);           /* group 0's release point, after the G field and pos_shift */
    mtu_blob_sign(blob, size);
    EXPECT_EQ(MSKV_ERROR_BLOB_CORRUPT, mskv_request_import(b, blob, size, &x));
    EXPECT_TRUE(mtu_audit(b));
    mskv_arena_destroy(a);
    mskv_arena_destroy(b);
}

/* ---- Wan's geometry against a rolling cache ------------------------------------------ */

enum {
    MTX_F = 1560,            /* tokens per latent frame (Wan 2.1 at 480p: 30 x 52) */
    MTX_P = 16,
    MTX_D = 16,              /* small head, one head: the test checks which keys, not arithmetic */
    MTX_BLOCK = 3 * MTX_F,   /* frames per block: 3 */
    MTX_BLOCKS = 5,
    MTX_STEPS = 3,           /* denoise steps per block */
    MTX_NQ = 16              /* queries attended per step (the block's last tokens; mask NONE: each sees the same keys) */
};

static float mtx_val(int kind, int64_t pos, int32_t step, int32_t d) {
    uint32_t x = (uint32_t)(pos * 2654435761u) ^ (uint32_t)(kind * 40503 + step * 7919 + d * 9973);
    x ^= x >> 15; x *= 0x2c1b3c6du; x ^= x >> 12; x ^= x >> 16;
    return (float)((int32_t)(x % 2001) - 1000) / 1000.0f;
}

/* The research-code cache: a contiguous buffer of the sink and the newest
   committed tokens; a commit appends the block, then drops the oldest
   tokens after the sink by copying the rest down. */
typedef struct mtx_roll {
    float *k, *v;
    int64_t *pos;
    int64_t n, sink, keep;   /* keep: committed tokens kept after the sink (window - block) */
} mtx_roll;

static void mtx_roll_commit(mtx_roll *c, const float *bk, const float *bv, int64_t first) {
    int64_t t, drop;
    for (t = 0; t < MTX_BLOCK; t++) {
        memcpy(c->k + (size_t)c->n * MTX_D, bk + (size_t)t * MTX_D, MTX_D * 4);
        memcpy(c->v + (size_t)c->n * MTX_D, bv + (size_t)t * MTX_D, MTX_D * 4);
        c->pos[c->n++] = first + t;
    }
    drop = c->n - c->sink - c->keep;
    if (drop <= 0) return;
    memmove(c->k + (size_t)c->sink * MTX_D, c->k + (size_t)(c->sink + drop) * MTX_D, (size_t)(c->n - c->sink - drop) * MTX_D * 4);
    memmove(c->v + (size_t)c->sink * MTX_D, c->v + (size_t)(c->sink + drop) * MTX_D, (size_t)(c->n - c->sink - drop) * MTX_D * 4);
    memmove(c->pos + c->sink, c->pos + c->sink + drop, (size_t)(c->n - c->sink - drop) * sizeof(int64_t));
    c->n -= drop;
}

/* Attention of the block's last MTX_NQ queries over the cache plus the
   block's K/V of this step, in double. */
static void mtx_roll_attend(const mtx_roll *c, const float *bk, const float *bv, const float *q, double *o) {
    int32_t i, d;
    int64_t t, n = c->n + MTX_BLOCK;
    double *w = (double *)malloc((size_t)n * sizeof(double));
    if (!w) return;
    for (i = 0; i < MTX_NQ; i++) {
        double mx = -INFINITY, sum = 0;
        for (t = 0; t < n; t++) {
            const float *kr = t < c->n ? c->k + (size_t)t * MTX_D : bk + (size_t)(t - c->n) * MTX_D;
            double dot = 0;
            for (d = 0; d < MTX_D; d++) dot += (double)q[i * MTX_D + d] * kr[d];
            w[t] = dot / 4.0;   /* 1/sqrt(16) */
            if (w[t] > mx) mx = w[t];
        }
        for (d = 0; d < MTX_D; d++) o[i * MTX_D + d] = 0;
        for (t = 0; t < n; t++) {
            const float *vr = t < c->n ? c->v + (size_t)t * MTX_D : bv + (size_t)(t - c->n) * MTX_D;
            double e = exp(w[t] - mx);
            sum += e;
            for (d = 0; d < MTX_D; d++) o[i * MTX_D + d] += e * vr[d];
        }
        for (d = 0; d < MTX_D; d++) o[i * MTX_D + d] /= sum;
    }
    free(w);
}

/* Runs the blocks through a session with window `frames` (the block
   included) and compares each denoise step with the rolling cache.
   Returns the largest difference; *pages_max gets the most pages held. */
static double mtx_video(mskv_cpu *cpu, int32_t frames, mskv_visibility vis, int32_t *pages_max, int *ok) {
    mskv_arena *a = mtx_arena(1024, MTX_P, 1, MTX_D);
    mskv_request r;
    mskv_session ses;
    mskv_retention ret;
    mskv_plan wp, ap;
    mskv_plan_desc d;
    mskv_segment s;
    mskv_attn at;
    mtx_roll c;
    float *bk = (float *)malloc((size_t)MTX_BLOCK * MTX_D * 4), *bv = (float *)malloc((size_t)MTX_BLOCK * MTX_D * 4);
    float q[MTX_NQ * MTX_D], o[MTX_NQ * MTX_D];
    double ro[MTX_NQ * MTX_D], worst = 0;
    int32_t b, st, t, dd;
    *ok = 0;
    *pages_max = 0;
    memset(&c, 0, sizeof c);
    c.sink = MTX_F;
    c.keep = (int64_t)(frames - 3) * MTX_F;
    c.k = (float *)malloc((size_t)(c.sink + c.keep + MTX_BLOCK) * MTX_D * 4);
    c.v = (float *)malloc((size_t)(c.sink + c.keep + MTX_BLOCK) * MTX_D * 4);
    c.pos = (int64_t *)malloc((size_t)(c.sink + c.keep + MTX_BLOCK) * sizeof(int64_t));
    if (!a || !bk || !bv || !c.k || !c.v || !c.pos) return -1;
    memset(&ret, 0, sizeof ret);
    ret.chunk_size = MTX_F;                  /* the retention's unit is a frame: 97.5 pages, no exact page fit */
    ret.sink_chunks = 1;
    ret.window_chunks = frames - 3;          /* committed frames kept; the open block adds 3 */
    memset(&at, 0, sizeof at);
    at.q_heads = 1; at.q_dtype = MSKV_DTYPE_F32;   /* mask NONE: the block attends bidirectionally */
    if (mskv_request_add(a, &r) || mskv_session_init(&ses, a, r, &ret) || mskv_plan_alloc(a, 1, MTX_BLOCK, 1024, &wp) ||
        mskv_plan_alloc(a, 1, MTX_NQ, 1024, &ap))
        return -1;
    for (b = 0; b < MTX_BLOCKS; b++) {
        int64_t first = (int64_t)b * MTX_BLOCK;
        if (mskv_session_begin_chunk(&ses, MTX_BLOCK) || mskv_session_plan(&ses, NULL, &wp)) return -1;
        for (st = 0; st < MTX_STEPS; st++) {
            for (t = 0; t < MTX_BLOCK; t++)
                for (dd = 0; dd < MTX_D; dd++) {
                    bk[t * MTX_D + dd] = mtx_val(0, first + t, st, dd);
                    bv[t * MTX_D + dd] = mtx_val(1, first + t, st, dd);
                }
            for (t = 0; t < MTX_NQ; t++)
                for (dd = 0; dd < MTX_D; dd++) q[t * MTX_D + dd] = 3.0f * mtx_val(2, first + MTX_BLOCK - MTX_NQ + t, st, dd);
            /* the library: scratch K/V of this step into the block's slots, attend */
            memset(&d, 0, sizeof d);
            d.visibility = vis;
            s.request = r; s.n_tokens = MTX_NQ;
            if (mskv_cpu_write_kv(a, 0, &wp, bk, bv, MSKV_DTYPE_F32, NULL) || mskv_plan_build(a, &s, 1, vis == MSKV_VIS_EXACT ? NULL : &d, &ap) ||   /* exact: the default, no desc */
                mskv_cpu_attention(cpu, a, 0, &ap, &at, q, o, NULL))
                return -1;
            mtx_roll_attend(&c, bk, bv, q, ro);
            for (t = 0; t < MTX_NQ * MTX_D; t++) {
                double e = fabs((double)o[t] - ro[t]);
                if (e > worst) worst = e;
            }
        }
        if (mskv_session_commit_chunk(&ses, NULL)) return -1;
        mtx_roll_commit(&c, bk, bv, first);
        if (mtx_info(a, r).num_pages > *pages_max) *pages_max = mtx_info(a, r).num_pages;
        if (!mtu_audit(a)) return -1;
    }
    mskv_plan_free(a, &wp);
    mskv_plan_free(a, &ap);
    mskv_arena_destroy(a);
    free(bk); free(bv); free(c.k); free(c.v); free(c.pos);
    *ok = 1;
    return worst;
}

/* Sink 1 frame, windows of 3k+1 and 3k+2 frames (k = 1, 2): the window's
   start falls inside a page every other block, and the sink ends inside
   one. With MSKV_VIS_EXACT every denoise step of every block agrees with the
   rolling cache to 1e-5 (f32); with whole-page visibility it does not (the
   extra keys change the output), while the pages held stay bounded. */
TEST(token_exact_windows_match_a_rolling_cache_for_wan_frames_on_16_token_pages) {
    static const int32_t windows[4] = {4, 5, 7, 8};
    mskv_cpu *cpu = NULL;
    int wi;
    ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_create(NULL, &cpu));
    for (wi = 0; wi < 4; wi++) {
        int32_t pages_exact = 0, pages_paged = 0, bound;
        int ok1 = 0, ok2 = 0;
        double exact = mtx_video(cpu, windows[wi], MSKV_VIS_EXACT, &pages_exact, &ok1);
        double paged = mtx_video(cpu, windows[wi], MSKV_VIS_PAGES, &pages_paged, &ok2);
        ASSERT_TRUE(ok1 && ok2);
        if (exact > 1e-5) mt_fail(__FILE__, __LINE__, "window %d frames: the exact plan differs from the rolling cache by %.3g", (int)windows[wi], exact);
        if (paged <= 1e-5) mt_fail(__FILE__, __LINE__, "window %d frames: whole-page visibility matched the rolling cache (%.3g): the test would not see a wrong window", (int)windows[wi], paged);
        /* the sink's pages, the window's and the open block's, each up to one page more for a partial edge */
        bound = (MTX_F + MTX_P - 1) / MTX_P + ((windows[wi] - 3) * MTX_F + MTX_BLOCK) / MTX_P + 3;
        EXPECT_LE(pages_exact, bound);
        EXPECT_EQ(pages_exact, pages_paged);   /* the same pages: only visibility differs */
    }
    mskv_cpu_destroy(cpu);
}
