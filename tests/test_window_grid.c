/* Token-exact windows over every small geometry (issue 21, item 1): page
   sizes 1-9 x chunks 1-9 x sinks 0-2 chunks x windows 0-3 chunks x reset at
   each boundary, 12 chunks each, against a token-level rolling cache written
   here: after n committed tokens the cache holds the sink [0, S) and the
   newest tokens its window keeps, and the open chunk sees those plus itself.
   Every plan a session builds, with a zero-initialised plan description and
   with none, must show exactly that set, whatever the page size; the pages
   held must stay within one page per partial edge of it. */
#include "mskv_test.h"
#include "../mstar_kv.h"
#include "mskv_test_util.h"

enum { MWG_CHUNKS = 12, MWG_MAXTOK = 9 * 13 + 9 };

/* The rolling cache's visible set for the open chunk, as flags per absolute
   position: what research code keeps (sink, then the window's newest
   committed chunks, or nothing past the sink with a reset), computed without
   the library. */
static int32_t mwg_model(int64_t chunk, int64_t sink_chunks, int64_t window_chunks, int reset, int64_t committed,
                         unsigned char *vis) {
    int64_t sink = sink_chunks * chunk, keep_from, t;
    int32_t n = 0;
    if (committed <= sink) {
        keep_from = 0;                       /* the sink is not complete: nothing has left */
    } else if (reset) {
        keep_from = committed;               /* everything past the sink went at the boundary */
    } else {
        keep_from = committed - window_chunks * chunk;   /* the newest window_chunks committed chunks */
        if (keep_from < sink) keep_from = sink;
    }
    for (t = 0; t < committed + chunk; t++) {
        vis[t] = (unsigned char)(t < sink || t >= keep_from);
        n += vis[t];
    }
    return n;
}

/* What the plan lets segment 0's queries see, as flags per absolute
   position (kpos(j) with the visibility bounds applied). */
static int mwg_plan_visible(const mskv_plan *p, unsigned char *vis, int64_t cap) {
    int32_t j, n = p->kv_len[0];
    int64_t se = p->vis_sink_end ? p->vis_sink_end[0] : 0, ws = p->vis_window_start ? p->vis_window_start[0] : 0;
    memset(vis, 0, (size_t)cap);
    for (j = 0; j < n; j++) {
        int64_t kp = j < p->kv_pos_split[0] ? j : (int64_t)j + p->kv_pos_shift[0];
        if (kp < 0 || kp >= cap) return 0;
        if (ws > se && kp >= se && kp < ws) continue;
        vis[kp] = 1;
    }
    return 1;
}

static void mwg_describe(char *buf, size_t cap, const unsigned char *vis, int64_t n) {
    int64_t t, lo = -1;
    size_t used = 0;
    buf[0] = 0;
    for (t = 0; t <= n && used + 24 < cap; t++) {
        int on = t < n && vis[t];
        if (on && lo < 0) lo = t;
        if (!on && lo >= 0) {
            used += (size_t)snprintf(buf + used, cap - used, "%s%lld..%lld", used ? " " : "", (long long)lo, (long long)(t - 1));
            lo = -1;
        }
    }
}

/* One configuration; returns 1 when every chunk's plan matched (else the
   first difference is reported). */
static int mwg_quiet;   /* after enough reported failures, only count */
static int mwg_run(int32_t P, int64_t C, int64_t S, int64_t W, int reset, int use_null_desc) {
    mskv_arena_desc ad;
    mskv_arena *a = NULL;
    mskv_request r;
    mskv_session ses;
    mskv_retention ret;
    mskv_plan p;
    mskv_plan_desc d;
    unsigned char want[MWG_MAXTOK + 1], got[MWG_MAXTOK + 1];
    int32_t k, ok = 1;
    mskv_result rc;
    memset(&ad, 0, sizeof ad);
    ad.num_pages = 64; ad.page_size = P;     /* bookkeeping only: no layers */
    memset(&ret, 0, sizeof ret);
    ret.chunk_size = C; ret.sink_chunks = S; ret.window_chunks = W; ret.reset_at_boundary = reset;
    if (mskv_arena_create(&ad, &a) != MSKV_SUCCESS) return 0;
    if ((rc = mskv_request_add(a, &r)) || (rc = mskv_session_init(&ses, a, r, &ret)) || (rc = mskv_plan_alloc(a, 1, (int32_t)C, 64, &p))) {
        mt_fail(__FILE__, __LINE__, "page %d chunk %d sink %d window %d reset %d: set-up failed: %s", (int)P, (int)C, (int)S, (int)W,
                reset, mskv_result_string(rc));
        mskv_arena_destroy(a);
        return 0;
    }
    for (k = 0; k < MWG_CHUNKS && ok; k++) {
        int64_t committed = (int64_t)k * C;
        int32_t pages_bound;
        mskv_request_info info;
        memset(&d, 0, sizeof d);             /* the default: no field set */
        if ((rc = mskv_session_begin_chunk(&ses, C)) || (rc = mskv_session_plan(&ses, use_null_desc ? NULL : &d, &p))) {
            mt_fail(__FILE__, __LINE__, "page %d chunk %d sink %d window %d reset %d: chunk %d: %s", (int)P, (int)C, (int)S, (int)W, reset,
                    (int)k, mskv_result_string(rc));
            ok = 0;
            break;
        }
        mwg_model(C, S, W, reset, committed, want);
        if (!mwg_plan_visible(&p, got, committed + C) || memcmp(want, got, (size_t)(committed + C)) != 0) {
            char ws[512], gs[512];
            mwg_describe(ws, sizeof ws, want, committed + C);
            mwg_describe(gs, sizeof gs, got, committed + C);
            if (!mwg_quiet) mt_fail(__FILE__, __LINE__, "page %d chunk %d sink %d window %d reset %d, %s desc: chunk %d: the plan shows %s, the rolling cache %s",
                    (int)P, (int)C, (int)S, (int)W, reset, use_null_desc ? "NULL" : "zeroed", (int)k, gs, ws);
            ok = 0;
        }
        /* pages stay whole: the visible runs' pages, one more per partial edge and per run */
        if (mskv_request_info_get(a, r, &info) != MSKV_SUCCESS) ok = 0;
        pages_bound = (int32_t)((S * C + P - 1) / P + ((reset ? 0 : W) * C + C + P - 1) / P + 2);
        if (ok && info.num_pages > pages_bound) {
            mt_fail(__FILE__, __LINE__, "page %d chunk %d sink %d window %d reset %d: chunk %d holds %d pages, more than %d", (int)P, (int)C, (int)S,
                    (int)W, reset, (int)k, (int)info.num_pages, (int)pages_bound);
            ok = 0;
        }
        if (ok && (rc = mskv_session_commit_chunk(&ses, NULL)) != MSKV_SUCCESS) {
            mt_fail(__FILE__, __LINE__, "page %d chunk %d: commit failed: %s", (int)P, (int)C, mskv_result_string(rc));
            ok = 0;
        }
    }
    if (ok && !mtu_audit(a)) ok = 0;
    mskv_plan_free(a, &p);
    mskv_arena_destroy(a);
    return ok;
}

TEST(default_plans_show_exactly_the_rolling_cache_window_at_every_page_size) {
    int32_t P, C, S, W, reset, configs = 0, bad = 0;
    for (P = 1; P <= 9; P++)
        for (C = 1; C <= 9; C++)
            for (S = 0; S <= 2; S++)
                for (W = 0; W <= 3; W++)
                    for (reset = 0; reset <= 1; reset++) {
                        if (reset && W == 0) continue;   /* a reset with no window is the same policy as window 0 */
                        configs++;
                        if (!mwg_run(P, C, S, W, reset, configs % 2) && ++bad >= 8) mwg_quiet = 1;
                    }
    mwg_quiet = 0;
    if (bad) mt_fail(__FILE__, __LINE__, "%d of %d configurations show other keys than the rolling cache (the first 8 above)", (int)bad, (int)configs);
    EXPECT_EQ(1701, configs);
}

/* The minimal case, spelled out: page 3, chunk 2, sink 2 chunks,
   window 1. At chunk 4 (8 committed) the rolling cache holds 0..3 and 6..7,
   and the chunk adds 8..9; tokens 4 and 5 were evicted. */
TEST(exact_window_minimal_case_hides_the_tail_of_the_sinks_last_page) {
    mskv_arena_desc ad;
    mskv_arena *a = NULL;
    mskv_request r;
    mskv_session ses;
    mskv_retention ret;
    mskv_plan p;
    unsigned char got[16];
    int32_t k;
    memset(&ad, 0, sizeof ad);
    ad.num_pages = 32; ad.page_size = 3;
    memset(&ret, 0, sizeof ret);
    ret.chunk_size = 2; ret.sink_chunks = 2; ret.window_chunks = 1;
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&ad, &a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mskv_session_init(&ses, a, r, &ret));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(a, 1, 2, 16, &p));
    for (k = 0; k < 4; k++) {
        ASSERT_EQ(MSKV_SUCCESS, mskv_session_begin_chunk(&ses, 2));
        ASSERT_EQ(MSKV_SUCCESS, mskv_session_commit_chunk(&ses, NULL));
    }
    ASSERT_EQ(MSKV_SUCCESS, mskv_session_begin_chunk(&ses, 2));
    ASSERT_EQ(MSKV_SUCCESS, mskv_session_plan(&ses, NULL, &p));
    ASSERT_TRUE(mwg_plan_visible(&p, got, 10));
    EXPECT_EQ(1, got[3]);
    EXPECT_EQ(0, got[4]);
    EXPECT_EQ(0, got[5]);
    EXPECT_EQ(1, got[6]);
    EXPECT_EQ(1, got[9]);
    EXPECT_EQ(4, p.vis_sink_end[0]);
    EXPECT_EQ(6, p.vis_window_start[0]);
    EXPECT_EQ(MSKV_PLAN_VISIBILITY, p.features & MSKV_PLAN_VISIBILITY);
    mskv_plan_free(a, &p);
    mskv_arena_destroy(a);
}

/* Caller-owned arrays without the bounds (written before they existed):
   the default plan builds while the window hides nothing and is refused,
   naming the case, once it would have to hide tokens its pages hold (it
   cannot say what the rolling cache holds); whole pages stay on request. */
TEST(exact_default_without_bound_arrays_builds_until_something_is_hidden) {
    mskv_arena_desc ad;
    mskv_arena *a = NULL;
    mskv_request r;
    mskv_session ses;
    mskv_retention ret;
    mskv_plan full, p;
    mskv_plan_desc d;
    unsigned char got[16];
    int32_t k;
    memset(&ad, 0, sizeof ad);
    ad.num_pages = 32; ad.page_size = 3;
    memset(&ret, 0, sizeof ret);
    ret.chunk_size = 2; ret.sink_chunks = 2; ret.window_chunks = 1;
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&ad, &a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mskv_session_init(&ses, a, r, &ret));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(a, 1, 2, 16, &full));
    p = full;                                  /* the same arrays, minus the bounds */
    p.vis_sink_end = NULL;
    p.vis_window_start = NULL;
    memset(&d, 0, sizeof d);
    for (k = 0; k < 4; k++) {
        ASSERT_EQ(MSKV_SUCCESS, mskv_session_begin_chunk(&ses, 2));
        EXPECT_EQ(MSKV_SUCCESS, mskv_session_plan(&ses, &d, &p));   /* chunks 0-3: nothing hidden yet */
        EXPECT_EQ(0u, p.features & MSKV_PLAN_VISIBILITY);
        ASSERT_EQ(MSKV_SUCCESS, mskv_session_commit_chunk(&ses, NULL));
    }
    ASSERT_EQ(MSKV_SUCCESS, mskv_session_begin_chunk(&ses, 2));
    p.kv_len[0] = -7;                          /* a refused build writes nothing */
    EXPECT_EQ(MSKV_ERROR_NULL_POINTER, mskv_session_plan(&ses, &d, &p));
    EXPECT_EQ(-7, p.kv_len[0]);
    d.visibility = MSKV_VIS_PAGES;             /* the opt-in: every token of the pages */
    ASSERT_EQ(MSKV_SUCCESS, mskv_session_plan(&ses, &d, &p));
    ASSERT_TRUE(mwg_plan_visible(&p, got, 10));
    EXPECT_EQ(1, got[4]);
    EXPECT_EQ(1, got[5]);
    EXPECT_EQ(10, p.kv_len[0]);
    mskv_plan_free(a, &full);
    mskv_arena_destroy(a);
}
