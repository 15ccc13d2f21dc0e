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

/* ---- the unaligned loop, by default ----------------------------------------------
   40-token chunks on 16-token pages, sink 1 chunk, window 2 committed chunks,
   GQA 4:2, causal inside each chunk: a session, NULL plan descriptions and
   the CPU attention, with no visibility option anywhere, against a
   contiguous rolling cache (sink kept, the oldest tokens dropped exactly) in
   double. Whole pages attend over 168, then 176 keys where the cache has 160
   (40 + 80 + 40); the default must attend over exactly the cache's keys. */
enum { MWU_C = 40, MWU_P = 16, MWU_QH = 4, MWU_KVH = 2, MWU_D = 16, MWU_W = 2, MWU_CHUNKS = 12 };

static float mwu_val(int kind, int64_t pos, int32_t h, int32_t d) {
    uint32_t x = (uint32_t)(pos * 2654435761u) ^ (uint32_t)(kind * 40503 + h * 7919 + d * 9973);
    x ^= x >> 15; x *= 0x2c1b3c6du; x ^= x >> 12; x ^= x >> 16;
    return (float)((int32_t)(x % 2001) - 1000) / 1000.0f;
}

/* One chunk against the rolling cache [0, C) + [keep_from, first) + the chunk's
   own causal prefix; returns the largest difference and the keys the last
   query saw in *keys. */
static double mwu_chunk(const float *q, const float *o, int64_t first, int64_t keep_from, int32_t *keys) {
    double worst = 0;
    int32_t i, h, d;
    for (i = 0; i < MWU_C; i++)
        for (h = 0; h < MWU_QH; h++) {
            double w[MWU_C * (MWU_W + 2)], mx = -INFINITY, sum = 0, ref[MWU_D];
            int64_t pos[MWU_C * (MWU_W + 2)], t;
            int32_t n = 0, j, kh = h / (MWU_QH / MWU_KVH);
            for (t = 0; t <= first + i; t++)
                if (t < MWU_C || t >= keep_from) pos[n++] = t;
            for (j = 0; j < n; j++) {
                double dot = 0;
                for (d = 0; d < MWU_D; d++) dot += (double)q[(i * MWU_QH + h) * MWU_D + d] * mwu_val(0, pos[j], kh, d);
                w[j] = dot * 0.25;
                if (w[j] > mx) mx = w[j];
            }
            for (d = 0; d < MWU_D; d++) ref[d] = 0;
            for (j = 0; j < n; j++) {
                double e = exp(w[j] - mx);
                sum += e;
                for (d = 0; d < MWU_D; d++) ref[d] += e * mwu_val(1, pos[j], kh, d);
            }
            for (d = 0; d < MWU_D; d++) {
                double e = fabs(ref[d] / sum - o[(i * MWU_QH + h) * MWU_D + d]);
                if (e > worst) worst = e;
            }
            if (i == MWU_C - 1) *keys = n;
        }
    return worst;
}

TEST(unaligned_chunks_match_a_rolling_cache_by_default) {
    mskv_arena_desc ad;
    mskv_arena *a = NULL;
    mskv_cpu *cpu = NULL;
    mskv_request r;
    mskv_session ses;
    mskv_retention ret;
    mskv_plan p;
    mskv_attn at;
    static float k[MWU_C * MWU_KVH * MWU_D], v[MWU_C * MWU_KVH * MWU_D], q[MWU_C * MWU_QH * MWU_D], o[MWU_C * MWU_QH * MWU_D];
    int32_t c, t, h, d, keys = 0;
    double worst = 0;
    memset(&ad, 0, sizeof ad);
    ad.num_pages = 64; ad.page_size = MWU_P; ad.num_layers = 1; ad.kv_heads = MWU_KVH; ad.head_dim = MWU_D; ad.dtype = MSKV_DTYPE_F32;
    memset(&ret, 0, sizeof ret);
    ret.chunk_size = MWU_C; ret.sink_chunks = 1; ret.window_chunks = MWU_W;
    memset(&at, 0, sizeof at);
    at.q_heads = MWU_QH; at.q_dtype = MSKV_DTYPE_F32; at.mask = MSKV_MASK_CAUSAL;
    ASSERT_EQ(MSKV_SUCCESS, mskv_arena_create(&ad, &a));
    ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_create(NULL, &cpu));
    ASSERT_EQ(MSKV_SUCCESS, mskv_request_add(a, &r));
    ASSERT_EQ(MSKV_SUCCESS, mskv_session_init(&ses, a, r, &ret));
    ASSERT_EQ(MSKV_SUCCESS, mskv_plan_alloc(a, 1, MWU_C, 64, &p));
    for (c = 0; c < MWU_CHUNKS; c++) {
        int64_t first = (int64_t)c * MWU_C, keep_from = first - MWU_W * MWU_C;
        double e;
        if (keep_from < MWU_C) keep_from = MWU_C;
        for (t = 0; t < MWU_C; t++)
            for (h = 0; h < MWU_KVH; h++)
                for (d = 0; d < MWU_D; d++) {
                    k[(t * MWU_KVH + h) * MWU_D + d] = mwu_val(0, first + t, h, d);
                    v[(t * MWU_KVH + h) * MWU_D + d] = mwu_val(1, first + t, h, d);
                }
        for (t = 0; t < MWU_C * MWU_QH * MWU_D; t++) q[t] = 3.0f * mwu_val(2, first + t / (MWU_QH * MWU_D), t % (MWU_QH * MWU_D), 0);
        ASSERT_EQ(MSKV_SUCCESS, mskv_session_begin_chunk(&ses, MWU_C));
        ASSERT_EQ(MSKV_SUCCESS, mskv_session_plan(&ses, NULL, &p));     /* no option set */
        ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_write_kv(a, 0, &p, k, v, MSKV_DTYPE_F32, NULL));
        ASSERT_EQ(MSKV_SUCCESS, mskv_cpu_attention(cpu, a, 0, &p, &at, q, o, NULL));
        e = mwu_chunk(q, o, first, keep_from, &keys);
        if (e > worst) worst = e;
        if (e > 1e-5) mt_fail(__FILE__, __LINE__, "chunk %d: %.3g from the rolling cache (%d keys for the last query)", (int)c, e, (int)keys);
        if (c >= MWU_W + 1) EXPECT_EQ(MWU_C * (MWU_W + 2), keys);   /* 160: sink + window + the chunk */
        ASSERT_EQ(MSKV_SUCCESS, mskv_session_commit_chunk(&ses, NULL));
    }
    printf("  40-token chunks on 16-token pages, sink 1, window 2, by default: %d keys, worst %.3g\n", (int)keys, worst);
    EXPECT_TRUE(mtu_audit(a));
    mskv_plan_free(a, &p);
    mskv_cpu_destroy(cpu);
    mskv_arena_destroy(a);
}
